"""The raw side: the same work done on PostgreSQL directly, with asyncpg or pgbench."""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import Sequence

import asyncpg

from bench.database import RAW_TABLE, BenchDatabase

INSERT_MANY = f"""
INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body)
SELECT 1, now(), now(), b FROM unnest($1::bytea[]) AS b
RETURNING id
"""

# The whole of a queue's receive+delete in one statement: claim the oldest
# visible rows no one else holds and delete them.
CLAIM_DELETE = f"""
DELETE FROM {RAW_TABLE} WHERE id IN (
    SELECT id FROM {RAW_TABLE}
    WHERE queue_id = 1 AND visible_at <= now()
    ORDER BY visible_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED)
RETURNING id, body, attributes
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


async def fill(db: BenchDatabase, body: bytes, count: int) -> None:
    pool = await db.pool(2)
    try:
        for start in range(0, count, 1000):
            await insert_many(pool, [body] * min(1000, count - start))
    finally:
        await pool.close()


async def claim_delete(conn: asyncpg.Connection, batch: int) -> int:
    return len(await conn.fetch(CLAIM_DELETE, batch))


async def pgbench_single_inserts(
    db: BenchDatabase, body: bytes, *, clients: int, seconds: float
) -> float:
    """Transactions per second of pgbench running one INSERT of `body` per transaction."""
    if db.pgbench is None:
        raise RuntimeError("pgbench is not installed")
    script = (
        f"INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
        f"VALUES (1, now(), now(), '\\x{body.hex()}'::bytea);\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write(script)
        file.flush()
        process = await asyncio.create_subprocess_exec(
            db.pgbench, "-n", "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(max(1, round(seconds))), "-f", file.name, db.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await process.communicate()
    text = output.decode(errors="replace")
    match = re.search(r"tps = ([\d.]+)", text)
    if process.returncode != 0 or match is None:
        raise RuntimeError(f"pgbench failed:\n{text}")
    return float(match.group(1))
