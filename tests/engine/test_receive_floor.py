"""No message lands behind the receive floor, however long its send waits on a lock.

Receives start their walk of the ready index at postbox.receive_floor, which
must lie at or before every message a committed or running send can still
leave. A send that waits on a lock before it writes (here: the queue's lock,
held as a purge holds it) used to read its clock first; a floor computed during
the wait then passed it, and the message committed behind the floor, where a
waiting receiver did not look until the next safety poll.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import pytest
from support import create_database, drop_database

# A send that waits longer than this is past what the floor's own margin covers.
PAST_THE_MARGIN = "1.2 seconds"


@pytest.fixture
async def own_database(admin_url: str) -> AsyncIterator[str]:
    url = await asyncio.to_thread(create_database, admin_url, "postbox_floor")
    yield url
    await asyncio.to_thread(drop_database, admin_url, url)


async def _wait_for(conn: asyncpg.Connection, query: str, *args, timeout: float = 15.0):
    """The value of `query` once it is not NULL; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (value := await conn.fetchval(query, *args)) is None:
        assert time.monotonic() < deadline, f"not after {timeout} s: {query}"
        await asyncio.sleep(0.05)
    return value


BLOCKED_LONG_ENOUGH = f"""
SELECT xact_start FROM pg_stat_clear_snapshot(), pg_stat_activity
WHERE pid = $1 AND wait_event_type = 'Lock' AND now() - xact_start > interval '{PAST_THE_MARGIN}'
"""


async def _hold_queue_lock(conn: asyncpg.Connection, queue: str) -> asyncpg.transaction.Transaction:
    transaction = conn.transaction()
    await transaction.start()
    # The engine's queue lock, as a purge or drop holds it: alone.
    await conn.execute(
        "SELECT postbox._lock_queue(q, true) FROM postbox.queues q WHERE q.name = $1", queue
    )
    return transaction


async def test_a_send_that_waits_on_a_lock_stamps_its_message_past_the_floor(own_database):
    """The send waits on the queue's lock for longer than the floor's margin; a floor
    computed meanwhile passes the send's start, and the message, stamped by the clock
    once the send holds the messages table, lands at or past it all the same."""
    conns = [await asyncpg.connect(own_database) for _ in range(3)]
    observer, holder, sender = conns
    try:
        from postbox_server.db.migrate import migrate

        await migrate(observer)
        await observer.execute("SELECT postbox.create_queue('waits')")
        held = await _hold_queue_lock(holder, "waits")
        send = asyncio.create_task(sender.fetchval("SELECT postbox.send('waits', 'late')"))
        started: datetime = await _wait_for(observer, BLOCKED_LONG_ENOUGH, sender.get_server_pid())
        floor = await observer.fetchval("SELECT postbox.receive_floor('waits')")
        await held.rollback()
        await send
        visible_at = await observer.fetchval("SELECT visible_at FROM postbox.messages")
        assert started < floor <= visible_at, "the message landed behind the floor"
    finally:
        for conn in conns:
            await conn.close()
