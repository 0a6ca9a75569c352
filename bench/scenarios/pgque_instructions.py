"""pgque_producer's and pgque_consumer's statements in CPU instructions, counted by
valgrind: the figures that the two-core machine's timings scatter by ±30% repeat here
to within a few per cent, so a change to the stream path is judged by them first.

As engine_instructions: a single-user backend (`postgres --single`) of a cluster of
the run's own runs each statement prepared, N and then 3N times, and one call costs
(count of 3N - count of N) / 2N. Producer: one send per call, each system's pgbench
statement. Consumer: one call reads and acknowledges a batch of 1,000 events from a
backlog put in beforehand, each system's claim pattern in one statement (the rows
are counted, not returned: the single-user backend would print them).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
from pathlib import Path

import asyncpg

from bench.database import install
from bench.pg_cluster import PG_BIN, Postgres, scratch_directory
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios import pgque
from bench.scenarios.instructions import DATABASE, _count, _single_user_script

ROUNDS = 3
PRODUCER_CALLS = 40
CONSUMER_CALLS = 8  # batches of 1,000 each: N = 8, 3N = 24

CONSUMER_SCRIPTS = {
    "postbox": (
        f"SELECT postbox.ack_stream('{pgque.QUEUE}', '{pgque.GROUP}', r.batch) "
        f"FROM (SELECT min(batch::text)::uuid AS batch, count(*) FROM postbox.read_stream("
        f"'{pgque.QUEUE}', '{pgque.GROUP}', {pgque.BATCH})) AS r"
    ),
    "pgque": (
        "SELECT pgque.finish_batch(b.id) "
        f"FROM (SELECT pgque.next_batch('{pgque.QUEUE}', '{pgque.GROUP}') AS id OFFSET 0) AS b, "
        "LATERAL (SELECT count(*) FROM pgque.get_batch_events(b.id)) AS e"
    ),
}


def _scripts(directory: Path, name: str, statement: str, calls: int) -> tuple[Path, Path]:
    paths = []
    for n in (calls, 3 * calls):
        path = directory / f"{name}-{n}.sql"
        path.write_text(_single_user_script(statement, n))
        paths.append(path)
    return paths[0], paths[1]


async def _per_call(directory: Path, scripts: dict[str, str], calls: int) -> dict[str, float]:
    """One round: each system's instructions per call."""
    counts = {}
    for name, statement in scripts.items():
        few, many = _scripts(directory, name.replace(".", "_"), statement, calls)
        low = await asyncio.to_thread(_count, directory / "data", few)
        high = await asyncio.to_thread(_count, directory / "data", many)
        counts[name] = (high - low) / (2 * calls)
    return counts


async def _fill(cluster: Postgres, events: int) -> None:
    conn = await asyncpg.connect(cluster.url(DATABASE))
    try:
        await pgque.fill_postbox(conn, events)
        await pgque.fill_pgque(conn, events)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


def _row(name: str, ours: list[float], theirs: list[float], unit: str) -> Row:
    as_throughput = [q / p for p, q in zip(ours, theirs, strict=True)]
    return Row(
        f"SQL {name} vs PgQue, CPU",
        unit,
        statistics.median(ours),
        statistics.median(theirs),
        f"{pgque.PGQUE_LABEL}, callgrind",
        note=(
            f"medians of {ROUNDS} rounds: postbox {median_range(ours)}, PgQue "
            f"{median_range(theirs)}; PgQue/postbox (the throughput ratio where the cores "
            f"are the limit) {median_range(as_throughput, 'x')}"
        ),
    )


@scenario(
    "pgque_instructions",
    f"CPU instructions (valgrind, single-user backend) of pgque_producer's one-send "
    f"statements and of pgque_consumer's read + ack of {pgque.BATCH} events, "
    f"postbox vs {pgque.PGQUE_LABEL}",
)
async def pgque_instructions(ctx: Context) -> list[Row]:
    if shutil.which("valgrind") is None or not (PG_BIN / "postgres").is_file():
        raise RuntimeError(f"needs valgrind and {PG_BIN / 'postgres'}")
    if not pgque.PGQUE_SQL.is_file():
        return pgque._absent("SQL calls vs PgQue, CPU")
    directory = scratch_directory("postbox-bench-pgque-callgrind-")
    cluster = Postgres(directory / "data").initdb(
        "fsync = off", "synchronous_commit = off", "full_page_writes = off", "autovacuum = off"
    )
    try:
        cluster.start()
        try:
            cluster.sql(f"CREATE DATABASE {DATABASE}")
            conn = await asyncpg.connect(cluster.url(DATABASE))
            try:
                await install(conn, ctx.db.apply_sql)
                await pgque.install(conn)
            finally:
                await conn.close()
        finally:
            cluster.stop()
        producers = pgque.producer_scripts()
        sends: dict[str, list[float]] = {name: [] for name in producers}
        reads: dict[str, list[float]] = {name: [] for name in CONSUMER_SCRIPTS}
        for _ in range(ROUNDS):
            for name, count in (await _per_call(directory, producers, PRODUCER_CALLS)).items():
                sends[name].append(count)
            cluster.start()
            try:
                await _fill(cluster, 4 * CONSUMER_CALLS * pgque.BATCH)
            finally:
                cluster.stop()
            for name, count in (
                await _per_call(directory, CONSUMER_SCRIPTS, CONSUMER_CALLS)
            ).items():
                reads[name].append(count / pgque.BATCH)
        return [
            _row("postbox.send, one per call", sends["postbox.send"], sends["pgque.send"],
                 "instr/msg"),
            _row("postbox.publish to a stream topic, one per call", sends["postbox.publish"],
                 sends["pgque.send"], "instr/msg"),
            _row(f"read_stream({pgque.BATCH}) + ack_stream", reads["postbox"], reads["pgque"],
                 "instr/msg"),
        ]  # fmt: skip
    finally:
        cluster.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)
