"""The PgQue comparison's SQL runs: PgQue installs beside the engine, each producer
statement sends, and each consumer loop drains what its fill put in. No timing: the
figures are the bench's (`python -m bench --only pgque_producer pgque_consumer`)."""

from __future__ import annotations

import asyncpg
import pytest

from bench.database import BenchDatabase
from bench.scenarios import pgque

pytestmark = pytest.mark.skipif(
    not pgque.PGQUE_SQL.is_file(), reason=f"PgQue's SQL is absent ({pgque.PGQUE_SQL})"
)


async def test_the_pgque_scenarios_statements_run(admin_url: str) -> None:
    async with BenchDatabase(admin_url) as db:
        conn = await asyncpg.connect(db.url)
        try:
            await pgque.install(conn)
            for script in pgque.producer_scripts().values():
                await conn.execute(script)
            assert (
                await conn.fetchval(
                    "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q "
                    "ON q.id = m.queue_id WHERE q.name = $1",
                    pgque.QUEUE,
                )
                == 1
            )
            # The producers' one event each is read with the fills' (PgQue's is in the first tick).
            await pgque.fill_pgque(conn, pgque.BATCH)
            await pgque.fill_postbox(conn, pgque.BATCH)
            assert await pgque.drain_pgque(conn) == pgque.BATCH + 1
            assert await pgque.drain_postbox(conn) == pgque.BATCH + 1
        finally:
            await conn.close()
