"""While a transaction pins the xmin horizon, every row version the traffic leaves behind
stays in the table and its indexes. Receives skip the dead front of the ready index
(postbox.receive_floor), the floor never hides a message, and receipts reach their rows
by primary key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from support import create_database, drop_database

from postbox_server.db.engine import Engine
from postbox_server.db.migrate import migrate
from postbox_server.services.receive.scan_floors import ScanFloors

# Index entries the current transaction has read from the ready index so far.
VISITED = "SELECT pg_stat_get_xact_tuples_returned('postbox.messages_ready_idx'::regclass)"
# Rows and index entries the current transaction has read from messages, by any path.
READ = """
SELECT sum(pg_stat_get_xact_tuples_returned(c.oid))
FROM pg_class c WHERE c.oid = 'postbox.messages'::regclass
   OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'postbox.messages'::regclass)
"""
FLOOR = "SELECT postbox.receive_floor($1)"
RECEIVE = "SELECT message_id, receipt FROM postbox.receive($1, 1, NULL, $2)"


@pytest.fixture
async def engine_url(admin_url: str) -> AsyncIterator[str]:
    """A database of its own with the engine installed: pinning its horizon disturbs
    no other test."""
    url = await asyncio.to_thread(create_database, admin_url, "postbox_floor")
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
        yield url
    finally:
        await conn.close()
        await asyncio.to_thread(drop_database, admin_url, url)


@pytest.fixture
async def conn(engine_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(engine_url)
    yield conn
    await conn.close()


@contextlib.asynccontextmanager
async def pinning(url: str) -> AsyncIterator[None]:
    """An open transaction holding the xmin horizon: nothing deleted meanwhile can be
    vacuumed or even marked dead in the index."""
    pin = await asyncpg.connect(url)
    try:
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.fetchval("SELECT txid_current()")
        yield
    finally:
        await pin.close()


@pytest.fixture
async def pinned(engine_url: str) -> AsyncIterator[None]:
    async with pinning(engine_url):
        yield


async def churn(conn: asyncpg.Connection, queue: str, rounds: int) -> None:
    """Sends, receives and deletes 1,000 messages per round."""
    for _ in range(rounds):
        await conn.execute(
            "SELECT postbox.send_batch($1, array_fill('x'::bytea, ARRAY[1000]))", queue
        )
        receipts = await conn.fetch("SELECT receipt FROM postbox.receive($1, 1000)", queue)
        outcomes = await conn.fetch(
            "SELECT outcome FROM postbox.delete_batch($1, $2)", queue, [r[0] for r in receipts]
        )
        assert {o[0] for o in outcomes} == {"ok"}


async def visiting(
    conn: asyncpg.Connection, sql: str, *args: object, reads: str = VISITED
) -> tuple[list, int]:
    """Runs sql in a transaction that is then rolled back: its rows, and how many
    ready-index entries (or what `reads` counts) it read."""
    await conn.execute("BEGIN")
    try:
        before = await conn.fetchval(reads)
        rows = await conn.fetch(sql, *args)
        return rows, await conn.fetchval(reads) - before
    finally:
        await conn.execute("ROLLBACK")


async def test_a_receive_from_the_floor_skips_what_was_deleted_under_a_pinned_horizon(conn, pinned):
    await conn.execute("SELECT postbox.create_queue('churned')")
    await churn(conn, "churned", 5)
    await asyncio.sleep(1.1)  # the floor stays a second behind now
    waiting = await conn.fetchval("SELECT postbox.send('churned', 'waiting')")
    floor = await conn.fetchval(FLOOR, "churned")

    rows, from_front = await visiting(conn, RECEIVE, "churned", None)
    assert [r["message_id"] for r in rows] == [waiting]
    assert from_front >= 5000, "the pinned horizon should have kept the deleted rows"

    rows, from_floor = await visiting(conn, RECEIVE, "churned", floor)
    assert [r["message_id"] for r in rows] == [waiting]
    assert from_floor <= 2

    rows, walked = await visiting(conn, "SELECT postbox.next_visible_at('churned', $1)", floor)
    assert rows[0][0] is not None
    assert walked <= 2
    _, walked = await visiting(conn, "SELECT postbox.next_visible_at('churned')")
    assert walked >= 5000


async def test_the_floor_is_never_past_a_message_of_the_queue(conn):
    await conn.execute("SELECT postbox.create_queue('kinds')")
    for sql in (
        "SELECT postbox.send('kinds', 'delayed', delay => '5 min')",
        "SELECT postbox.send('kinds', 'in flight')",
    ):
        await conn.execute(sql)
    await conn.fetch("SELECT * FROM postbox.receive('kinds', 1, '2 s')")
    await asyncio.sleep(1.1)
    await conn.execute("SELECT postbox.send('kinds', 'ready')")
    floor = await conn.fetchval(FLOOR, "kinds")
    earliest = await conn.fetchval(
        "SELECT min(visible_at) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id"
        " WHERE q.name = 'kinds'"
    )
    assert floor <= earliest
    await asyncio.sleep(1.5)  # the in-flight message's timeout runs out
    got = await conn.fetch("SELECT body FROM postbox.receive('kinds', 10, NULL, $1)", floor)
    assert sorted(bytes(r["body"]) for r in got) == [b"in flight", b"ready"]


async def test_a_transaction_still_writing_holds_the_floor_back(conn, engine_url):
    await conn.execute("SELECT postbox.create_queue('slow_writer')")
    writer = await asyncpg.connect(engine_url)
    try:
        await writer.execute("BEGIN")
        late = await writer.fetchval("SELECT postbox.send('slow_writer', 'late')")
        await asyncio.sleep(1.2)  # its visibility time is now more than a second ago
        floor = await conn.fetchval(FLOOR, "slow_writer")
        await writer.execute("COMMIT")
    finally:
        await writer.close()
    got = await conn.fetch(RECEIVE, "slow_writer", floor)
    assert [r["message_id"] for r in got] == [late]


async def test_a_transaction_older_than_the_floor_that_writes_after_it_is_seen(conn, engine_url):
    """Its message's visibility time comes from the clock when it is written, not from
    when its transaction began."""
    await conn.execute("SELECT postbox.create_queue('old_transaction')")
    writer = await asyncpg.connect(engine_url)
    try:
        await writer.execute("BEGIN")
        await writer.execute("SELECT 1")
        await asyncio.sleep(1.2)
        floor = await conn.fetchval(FLOOR, "old_transaction")
        assert floor > await writer.fetchval("SELECT now()")
        late = await writer.fetchval("SELECT postbox.send('old_transaction', 'late')")
        await writer.execute("COMMIT")
    finally:
        await writer.close()
    got = await conn.fetch(RECEIVE, "old_transaction", floor)
    assert [r["message_id"] for r in got] == [late]


# This session's floor of a queue, as postbox._session_floor keeps it:
# "<floor> <computed at>" in microseconds, or NULL.
SESSION_FLOOR = """
SELECT nullif(current_setting('postbox.floor_' || (SELECT id FROM postbox.queues WHERE name = $1),
                              true), '')
"""
SQL_RECEIVE = "SELECT message_id FROM postbox.receive($1, 1)"


async def _twice_on_one_floor(conn: asyncpg.Connection, queue: str) -> tuple[list, list, int, int]:
    """Two receives without scan_from in one transaction (rolled back): their rows and the
    ready-index entries each read. Tried again when the session computed its floor anew
    for the second (a second passed between them on a loaded machine)."""
    for _ in range(10):
        await conn.execute("BEGIN")
        try:
            start = await conn.fetchval(VISITED)
            first = await conn.fetch(SQL_RECEIVE, queue)
            middle, kept = await conn.fetchval(VISITED), await conn.fetchval(SESSION_FLOOR, queue)
            second = await conn.fetch(SQL_RECEIVE, queue)
            end = await conn.fetchval(VISITED)
            if await conn.fetchval(SESSION_FLOOR, queue) == kept:
                return first, second, middle - start, end - middle
        finally:
            await conn.execute("ROLLBACK")
    raise AssertionError("every second receive computed the floor again")


async def test_receives_through_sql_start_at_their_sessions_floor(conn, pinned):
    await conn.execute("SELECT postbox.create_queue('by_sql')")
    await churn(conn, "by_sql", 5)
    churned = await conn.fetchval("SELECT clock_timestamp()")
    # A floor stays a second behind the clock: the churn must be further behind.
    await conn.execute("SELECT pg_sleep_until($1::timestamptz + interval '1.1 s')", churned)
    sent = [await conn.fetchval("SELECT postbox.send('by_sql', $1)", body) for body in (b"a", b"b")]
    first, second, walked_first, walked_second = await _twice_on_one_floor(conn, "by_sql")
    assert [r["message_id"] for r in first + second] == sent
    assert walked_first >= 5000, "the first receive finds the floor past the dead front"
    assert walked_second <= 3, "the second starts at the floor the first kept"


async def test_a_sessions_floor_does_not_hide_a_send_in_flight_when_it_was_kept(conn, engine_url):
    """A send more than the floor's second old, still uncommitted when a receive keeps
    the session's floor, is received on that floor once it commits."""
    writer = await asyncpg.connect(engine_url)
    try:
        for attempt in range(10):  # again when a second passed between the two receives
            queue = f"kept_floor_{attempt}"
            await conn.execute("SELECT postbox.create_queue($1)", queue)
            await writer.execute("BEGIN")
            late = await writer.fetchval("SELECT postbox.send($1, 'late')", queue)
            sent_at = await writer.fetchval(
                "SELECT visible_at FROM postbox.messages WHERE id = $1", late
            )
            await conn.execute("SELECT pg_sleep_until($1::timestamptz + interval '1.1 s')", sent_at)
            assert await conn.fetch(SQL_RECEIVE, queue) == []  # keeps the floor
            kept = await conn.fetchval(SESSION_FLOOR, queue)
            await writer.execute("COMMIT")
            got = await conn.fetch(SQL_RECEIVE, queue)
            if await conn.fetchval(SESSION_FLOOR, queue) == kept:
                break
        else:
            raise AssertionError("every second receive computed the floor again")
    finally:
        await writer.close()
    assert kept is not None
    assert [r["message_id"] for r in got] == [late]


async def test_no_floor_is_computed_in_a_repeatable_read_transaction(conn):
    await conn.execute("SELECT postbox.create_queue('repeatable')")
    sent = await conn.fetchval("SELECT postbox.send('repeatable', 'x')")
    await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        got = await conn.fetch(SQL_RECEIVE, "repeatable")
        assert await conn.fetchval(SESSION_FLOOR, "repeatable") is None
    finally:
        await conn.execute("ROLLBACK")
    assert [r["message_id"] for r in got] == [sent]


async def test_scan_floors_are_computed_in_the_background_and_refreshed(engine_url):
    engine = await Engine.connect(engine_url, pool_size=2)
    try:
        await engine.create_queue("floored", {})
        floors = ScanFloors(engine.receive_floor)
        assert floors.get("floored") is None  # unknown yet: receives walk from the front
        first = await _until_changed(floors, "floored", None)
        await asyncio.sleep(1.1)
        floors.get("floored")  # old now: asks again, answers the old one meanwhile
        assert await _until_changed(floors, "floored", first) > first
        assert floors.get("no_such_queue") is None
        await asyncio.sleep(0.2)
        assert floors.get("no_such_queue") is None  # the error left no floor behind
    finally:
        await engine.close()


async def _until_changed(floors: ScanFloors, queue: str, old: datetime | None) -> datetime:
    for _ in range(100):
        floor = floors.get(queue)
        if floor is not None and floor != old:
            return floor
        await asyncio.sleep(0.02)
    raise AssertionError(f"the floor of {queue} stayed {old}")


async def test_receipts_reach_their_rows_by_primary_key(conn, engine_url):
    """However the statements were planned: here, while the table was nearly empty, as a
    server's long-lived connections plan them."""
    # An ANALYZE by autovacuum in the middle (a loaded machine sets when) would plan them
    # afresh, on the churned table's statistics: not the case this test is about.
    await conn.execute("ALTER TABLE postbox.messages SET (autovacuum_enabled = false)")
    await conn.execute("SELECT postbox.create_queue('receipts')")
    operations = [
        ("SELECT * FROM postbox.delete_batch('receipts', $1)", ()),
        (
            "SELECT * FROM postbox.change_visibility_batch('receipts', $1, $2)",
            ([timedelta(0)] * 2,),
        ),
        ("SELECT * FROM postbox.nack_batch('receipts', $1)", ()),
        ("SELECT postbox.release('receipts', $1)", ()),
    ]

    async def run(sql: str, extra: tuple) -> tuple[list, int]:
        await conn.execute(
            "SELECT postbox.send_batch('receipts', array_fill('x'::bytea, ARRAY[2]))"
        )
        rows = await conn.fetch("SELECT message_id, receipt FROM postbox.receive('receipts', 2)")
        stale = f"{rows[1]['message_id']}:{uuid4()}"
        result, read = await visiting(conn, sql, [rows[0]["receipt"], stale], *extra, reads=READ)
        await conn.execute("SELECT postbox.purge_queue('receipts')")
        return result, read

    for sql, extra in operations:
        for _ in range(8):  # past the first calls, which plan afresh each time
            await run(sql, extra)
    async with pinning(engine_url):
        await churn(conn, "receipts", 5)
        for sql, extra in operations:
            result, read = await run(sql, extra)
            assert read <= 8, f"{sql} read {read} rows and index entries of messages"
            if "release" not in sql:
                assert [r["outcome"] for r in result] == ["ok", "stale"], sql


@pytest.mark.parametrize("scan_from", [None, "1 hour"])
async def test_a_priority_receive_reads_the_priority_index_not_the_queue(conn, scan_from):
    """With a range on visible_at the planner once thought the ready index would give a
    few rows, fetched every visible message and sorted them by priority."""
    await conn.execute("SELECT postbox.create_queue('ranked')")
    for _ in range(5):
        await conn.execute(
            "SELECT postbox.send_batch('ranked', array_fill('x'::bytea, ARRAY[1000]), "
            "priorities => (SELECT array_agg(i % 10) FROM generate_series(1, 1000) AS i))"
        )
    floor = (
        None if scan_from is None else await conn.fetchval(f"SELECT now() - interval '{scan_from}'")
    )
    rows, read = await visiting(
        conn, "SELECT priority FROM postbox.receive('ranked', 10, NULL, $1)", floor, reads=READ
    )
    assert [r["priority"] for r in rows] == [9] * 10
    assert read <= 50, f"receive read {read} rows and index entries of messages"


GROUP_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended('g', id)) FROM postbox.queues WHERE name = $1"
)
DEPTH_LOCK = "SELECT pg_advisory_xact_lock(1886350199, id) FROM postbox.queues WHERE name = $1"


async def until_waiting_on_a_lock(conn: asyncpg.Connection, pid: int) -> datetime:
    """Waits until backend `pid` waits on a lock; returns the clock then (past its start)."""
    for _ in range(1000):
        if await conn.fetchval(
            # Cleared each time: inside a transaction the activity is one snapshot.
            "SELECT wait_event_type = 'Lock' FROM pg_stat_clear_snapshot(), pg_stat_activity "
            "WHERE pid = $1",
            pid,
        ):
            return await conn.fetchval("SELECT clock_timestamp()")
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never waited on a lock")


async def until_clock_passes(conn: asyncpg.Connection, when: datetime) -> None:
    for _ in range(1000):
        if await conn.fetchval("SELECT now() > $1", when):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the database clock never passed {when}")


@pytest.mark.parametrize(
    ("lock", "queue", "options", "send"),
    [
        (
            GROUP_LOCK,
            "blocked.fifo",
            {"content_based_deduplication": True},
            "SELECT postbox.send($1, 'late', message_group_id => 'g')",
        ),
        (DEPTH_LOCK, "bounded", {"max_depth": 10}, "SELECT postbox.send($1, 'late')"),
    ],
    ids=["FIFO group lock", "max_depth lock"],
)
async def test_a_send_waiting_on_a_lock_holds_the_floor_back(
    conn, engine_url, lock, queue, options, send
):
    """The locks a send may wait on besides the queue's (test_receive_floor.py): a send
    that read its clock before waiting on them committed behind the floor."""
    await conn.execute("SELECT postbox.create_queue($1, $2::jsonb)", queue, json.dumps(options))
    holder = await asyncpg.connect(engine_url)
    sender = await asyncpg.connect(engine_url)
    try:
        await holder.execute("BEGIN")
        await holder.fetchval(lock, queue)
        sending = asyncio.ensure_future(sender.fetchval(send, queue))
        blocked_at = await until_waiting_on_a_lock(conn, sender.get_server_pid())
        # The floor stays a second behind now: wait until it would be past the send's start.
        await until_clock_passes(conn, blocked_at + timedelta(seconds=1))
        floor = await conn.fetchval(FLOOR, queue)
        await holder.execute("COMMIT")
        late = await sending
    finally:
        await holder.close()
        await sender.close()
    assert floor <= blocked_at
    got = await conn.fetch(RECEIVE, queue, floor)
    assert [r["message_id"] for r in got] == [late]
