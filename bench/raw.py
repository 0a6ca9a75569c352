"""The raw side: the same work done on PostgreSQL directly, with asyncpg or pgbench."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeAlias

import asyncpg

from bench.database import RAW_TABLE, BenchDatabase
from postbox_server.config import Settings
from postbox_server.db.engine import NO_SEND_OPTIONS
from postbox_server.db.sqlfiles import queries
from postbox_server.services.receive.claims import claim_budget

# The server's own statements (server/postbox_server/db/queries.sql), for the engine-alone figures.
SERVER_QUERIES = queries()
# A connection of its own or one borrowed from a pool: the claims run on either.
Connection: TypeAlias = "asyncpg.Connection | asyncpg.pool.PoolConnectionProxy"

INSERT_MANY = f"""
INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body)
SELECT 1, now(), now(), b FROM unnest($1::bytea[]) AS b
RETURNING id
"""

# The oldest visible rows of the queue that no one else holds, up to $1.
CLAIMABLE = f"""
    SELECT id FROM {RAW_TABLE}
    WHERE queue_id = 1 AND visible_at <= now()
    ORDER BY visible_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED"""

# The whole of a queue's receive+delete in one statement: claim and delete.
CLAIM_DELETE = f"""
DELETE FROM {RAW_TABLE} WHERE id IN ({CLAIMABLE})
RETURNING id, body, attributes
"""

# The same work as Receive then Delete: a claim that leases the rows (so a
# crashed consumer's messages come back), committed; then a delete that checks
# the lease, so a late delete cannot remove a message someone else now holds.
LEASED_CLAIM = f"""
UPDATE {RAW_TABLE} m
SET visible_at = clock_timestamp() + interval '120 seconds',
    receive_count = m.receive_count + 1,
    first_received_at = coalesce(m.first_received_at, clock_timestamp()),
    lease = gen_random_uuid()
WHERE m.id IN ({CLAIMABLE})
RETURNING m.id, m.lease, m.body, m.attributes
"""

LEASED_DELETE = f"""
DELETE FROM {RAW_TABLE} m
USING unnest($1::bigint[], $2::uuid[]) AS t(id, lease)
WHERE m.id = t.id AND m.lease = t.lease
"""

# FIFO done by hand: only the head of each message group is visible (the rest
# wait at 'infinity'), a claim takes visible heads, and deleting a head makes
# the next message of its group visible, in the same statement.
FIFO_CLAIM_DELETE = f"""
WITH head AS (
    DELETE FROM {RAW_TABLE} WHERE id IN ({CLAIMABLE})
    RETURNING id, message_group_id, body
), promoted AS (
    UPDATE {RAW_TABLE} m SET visible_at = now()
    WHERE m.id IN (
        SELECT (SELECT x.id FROM {RAW_TABLE} x
                WHERE x.queue_id = 1 AND x.message_group_id = h.message_group_id AND x.id > h.id
                ORDER BY x.id LIMIT 1)
        FROM head h)
    RETURNING 1
)
SELECT count(*) FROM head
"""

INSERT_FIFO = f"""
INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body, message_group_id)
SELECT 1, CASE WHEN i <= $2 THEN now() ELSE 'infinity' END, now(), $1,
       'group-' || (i % $2)
FROM generate_series(1, $3) AS i
"""

# Priorities done by hand, as the engine does them: the rows of priority > 0
# first (highest first, through the partial priority index), then the rest in
# visibility order; each branch claims with SKIP LOCKED.
PRIORITY_CLAIM_DELETE = f"""
DELETE FROM {RAW_TABLE} WHERE id IN (
    SELECT id FROM (
        SELECT * FROM (
            SELECT id FROM {RAW_TABLE}
            WHERE queue_id = 1 AND priority > 0 AND visible_at <= now()
            ORDER BY priority DESC, visible_at, id
            LIMIT $1
            FOR UPDATE SKIP LOCKED) AS high
        UNION ALL
        SELECT * FROM (
            SELECT id FROM {RAW_TABLE}
            WHERE queue_id = 1 AND priority = 0 AND visible_at <= now()
            ORDER BY visible_at, id
            LIMIT $1
            FOR UPDATE SKIP LOCKED) AS normal
        LIMIT $1) AS claimed)
RETURNING id, body, attributes
"""

INSERT_PRIORITIES = f"""
INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body, priority)
SELECT 1, now(), now(), $1, i % $2 FROM generate_series(1, $3) AS i
"""

# A publish to 10 subscribed queues, by hand: the same row in each queue.
INSERT_FANOUT = f"""
INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body)
SELECT q, now(), now(), $1 FROM generate_series(1, $2) AS q
"""

INSERT_NOTIFY = f"""
WITH inserted AS (
    INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body)
    VALUES (1, now(), now(), $1) RETURNING id
)
SELECT pg_notify('bench_raw', '') FROM inserted
"""


async def insert_many(pool: asyncpg.Pool, bodies: Sequence[bytes]) -> int:
    rows = await pool.fetch(INSERT_MANY, bodies)
    return len(rows)


def engine_send_batch(
    queue: str, *, request_ids: bool = False
) -> Callable[[asyncpg.Pool, Sequence[bytes]], Awaitable[int]]:
    """SendBatch's statement as the server runs it, straight on the engine's SQL API;
    with request_ids, each batch named by a new request id, as the SDK's Producer's are."""
    statement = SERVER_QUERIES["send_batch"]

    async def insert(pool: asyncpg.Pool, bodies: Sequence[bytes]) -> int:
        request_id = os.urandom(16).hex() if request_ids else None
        row = await pool.fetchrow(statement, queue, bodies, *NO_SEND_OPTIONS[:-1], request_id)
        assert row is not None  # send_batch returns one row: the ids and the duplicates
        ids, _ = row
        return len(ids)

    return insert


async def fill(db: BenchDatabase, body: bytes, count: int) -> None:
    pool = await db.pool(2)
    try:
        for start in range(0, count, 1000):
            await insert_many(pool, [body] * min(1000, count - start))
    finally:
        await pool.close()


async def claim_delete(conn: Connection, batch: int) -> int:
    return len(await conn.fetch(CLAIM_DELETE, batch))


async def leased_claim_delete(conn: Connection, batch: int) -> int:
    """Claim with a lease, commit, delete by id and lease, commit: two round trips."""
    rows = await conn.fetch(LEASED_CLAIM, batch)
    if rows:
        await conn.execute(LEASED_DELETE, [r["id"] for r in rows], [r["lease"] for r in rows])
    return len(rows)


def engine_claim_delete(queue: str) -> Callable[[Connection, int], Awaitable[int]]:
    """Receive then DeleteBatch as the server runs them, straight on the engine's SQL API:
    what the engine costs without the server and its transport. A consumer's DeleteBatch
    goes with its stream's next claim (one delete_and_receive), so each connection
    deletes the batch it claimed before in the statement that claims the next."""
    receive, delete_and_receive = SERVER_QUERIES["receive"], SERVER_QUERIES["delete_and_receive"]
    lease = timedelta(seconds=120)
    # A claim's size budget, as the server's default settings give it (the server
    # also passes its scan floor, which the engine finds by itself when given none).
    max_bytes = claim_budget(Settings().max_response_size)
    held: dict[Connection, list[str]] = {}

    async def claim(conn: Connection, batch: int) -> int:
        receipts = held.pop(conn, None)
        if receipts is None:
            rows = await conn.fetch(receive, queue, batch, lease, None, max_bytes, None)
        else:
            both = await conn.fetch(
                delete_and_receive, queue, receipts, batch, lease, None, max_bytes, None
            )
            rows = [row for row in both if row["message_id"] is not None]
        if rows:
            held[conn] = [row["receipt"] for row in rows]
        return len(rows)

    return claim


async def fifo_claim_delete(conn: Connection, batch: int) -> int:
    return await conn.fetchval(FIFO_CLAIM_DELETE, batch)


async def priority_claim_delete(conn: Connection, batch: int) -> int:
    return len(await conn.fetch(PRIORITY_CLAIM_DELETE, batch))


async def fill_fifo(db: BenchDatabase, body: bytes, count: int, groups: int) -> None:
    """`count` messages in `groups` groups, sent round-robin; each group's first is its head."""
    await _execute(db, INSERT_FIFO, body, groups, count)


async def fill_priorities(db: BenchDatabase, body: bytes, count: int, priorities: int) -> None:
    """`count` messages of priorities 0 .. priorities-1, round-robin."""
    await _execute(db, INSERT_PRIORITIES, body, priorities, count)


async def _execute(db: BenchDatabase, statement: str, *args: object) -> None:
    conn = await asyncpg.connect(db.url)
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def insert_fanout(pool: asyncpg.Pool, body: bytes, queues: int) -> int:
    await pool.execute(INSERT_FANOUT, body, queues)
    return 1


async def pgbench_single_inserts(
    db: BenchDatabase, body: bytes, *, clients: int, seconds: float
) -> float:
    """Transactions per second of pgbench running one INSERT of `body` per transaction."""
    script = (
        f"INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
        f"VALUES (1, now(), now(), '\\x{body.hex()}'::bytea);\n"
    )
    return await pgbench_tps(db, script, clients=clients, seconds=seconds)


async def pgbench_tps(db: BenchDatabase, script: str, *, clients: int, seconds: float) -> float:
    """Transactions per second of pgbench -M prepared running `script` from `clients` sessions."""
    if db.pgbench is None:
        raise RuntimeError("pgbench is not installed")
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write(script + "\n")
        file.flush()
        process = await asyncio.create_subprocess_exec(
            db.pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(max(1, round(seconds))), "-f", file.name, db.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
    text = output.decode(errors="replace")
    match = re.search(r"tps = ([\d.]+)", text)
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed:\n{text[-2000:]}")
    return float(match.group(1))
