"""The held-xmin "death spiral" (issue 44), PgQue's method scaled to this machine.

Four systems run side by side on a cluster of the run's own (Debian's PostgreSQL 15,
autovacuum on, nothing else on it): a postbox plain queue, a postbox stream topic
with one consumer group, PgQue (95d5c3c) with one consumer, and PGMQ 1.5.1. Each has
a producer capped at --spiral-rate messages a second (PgQue's 200-byte JSON, sent
in a batch every 50 ms: single sends at that rate from one Python process would
bound the producers rather than the systems) and one consumer taking batches of
100 as fast as they come. Three phases of --spiral-phase-seconds each:

1. clean;
2. a REPEATABLE READ transaction open on another connection, its snapshot held (it
   has run a SELECT), so the xmin horizon stays where it was: vacuum can remove
   nothing deleted after it started;
3. recovery, the holder committed.

Per system and phase: the consumer's throughput (messages a second, over the
phase), and at the phase's end the dead tuples (pg_stat_user_tables.n_dead_tup),
and the table and index size of the system's tables. Recovery is the time from the
holder's release until the consumer's backlog (sent less consumed) is back to its
clean-phase level, measured each second.

Maintenance runs as each system's own would: postbox.tick() every second (expiry,
stream rotation), PgQue's ticker every 100 ms, and pgque.maint() then
maint_rotate_tables_step2() every second, each in a transaction of its own as
pgque.start()'s cron jobs run them (the first recorded run left step 2 out). The
stream topic keeps its log for a quarter of a phase and PgQue rotates its tables
every quarter phase, so both rotate within each phase.

Targets (issue 44): the plain queue keeps >= 0.9 of its clean throughput while the
horizon is held and is back within 60 s of release; the stream topic keeps 0 dead
tuples.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bench.database import install
from bench.pg_cluster import Postgres, scratch_directory
from bench.runner import Context, Row, scenario
from bench.scenarios import pgque
from bench.scenarios.producer import PGMQ_SQL

log = logging.getLogger(__name__)

DATABASE = "spiral"
NAME = "spiral"  # each system's queue or topic
GROUP = "spiral_group"
BATCH = 100  # messages per consumer claim
TICK = 0.05  # seconds between producer batches
PHASES = ("clean", "held", "recovery")
DOCUMENT = json.dumps({"data": "x" * 200})


@dataclass
class System:
    """One system's statements: a producer batch, a consumer claim + ack that returns
    how many it took, and the SQL that names its tables."""

    name: str
    produce: Callable[[asyncpg.Connection, int], Awaitable[None]]
    consume: Callable[[asyncpg.Connection], Awaitable[int]]
    tables: str  # a WHERE clause over pg_stat_user_tables (schemaname, relname)
    sent: int = 0
    consumed: int = 0
    # Per phase: consumed messages, dead tuples and bytes at its end.
    phase_consumed: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    clean_backlog: list[int] = field(default_factory=list)
    recovered_after: float | None = None


async def _postbox_queue_consume(conn: asyncpg.Connection) -> int:
    receipts = await conn.fetchval(
        "SELECT array_agg(receipt) FROM postbox.receive($1, $2)", NAME, BATCH
    )
    if not receipts:
        return 0
    await conn.execute("SELECT count(*) FROM postbox.delete_batch($1, $2)", NAME, receipts)
    return len(receipts)


async def _stream_consume(conn: asyncpg.Connection) -> int:
    rows = await conn.fetch("SELECT batch FROM postbox.read_stream($1, $2, $3)", NAME, GROUP, BATCH)
    if rows:
        await conn.execute("SELECT postbox.ack_stream($1, $2, $3)", NAME, GROUP, rows[0]["batch"])
    return len(rows)


async def _pgque_consume(conn: asyncpg.Connection) -> int:
    async with conn.transaction():
        batch = await conn.fetchval("SELECT pgque.next_batch($1, $2)", NAME, GROUP)
        if batch is None:
            return 0
        taken = len(await conn.fetch("SELECT ev_id FROM pgque.get_batch_events($1)", batch))
        await conn.execute("SELECT pgque.finish_batch($1)", batch)
        return taken


async def _pgmq_consume(conn: asyncpg.Connection) -> int:
    ids = await conn.fetchval("SELECT array_agg(msg_id) FROM pgmq.read($1, 30, $2)", NAME, BATCH)
    if not ids:
        return 0
    await conn.execute("SELECT pgmq.delete($1, $2::bigint[])", NAME, ids)
    return len(ids)


def _systems() -> list[System]:
    body = DOCUMENT.encode()

    def bodies(n: int) -> list[bytes]:
        return [body] * n

    def documents(n: int) -> list[str]:
        return [DOCUMENT] * n

    async def queue_send(conn: asyncpg.Connection, n: int) -> None:
        await conn.execute("SELECT count(*) FROM postbox.send_batch($1, $2)", NAME, bodies(n))

    async def stream_send(conn: asyncpg.Connection, n: int) -> None:
        await conn.execute("SELECT count(*) FROM postbox.publish_batch($1, $2)", NAME, bodies(n))

    async def pgque_send(conn: asyncpg.Connection, n: int) -> None:
        await conn.execute("SELECT pgque.send_batch($1, $2::jsonb[])", NAME, documents(n))

    async def pgmq_send(conn: asyncpg.Connection, n: int) -> None:
        await conn.execute("SELECT count(*) FROM pgmq.send_batch($1, $2::jsonb[])", NAME,
                           documents(n))  # fmt: skip

    return [
        System("postbox queue", queue_send, _postbox_queue_consume,
               "schemaname = 'postbox' AND relname = 'messages'"),
        System("postbox stream", stream_send, _stream_consume,
               "schemaname = 'postbox' AND relname LIKE 'stream_log_%'"),
        System("PgQue", pgque_send, _pgque_consume,
               "schemaname = 'pgque' AND relname LIKE 'event_%'"),
        System("PGMQ", pgmq_send, _pgmq_consume, f"schemaname = 'pgmq' AND relname = 'q_{NAME}'"),
    ]  # fmt: skip


async def _install(url: str, phase: float) -> None:
    conn = await asyncpg.connect(url)
    try:
        await install(conn, [])
        await conn.execute("SELECT postbox.create_queue($1)", NAME)
        retention = f"{max(1, round(phase / 4))} seconds"
        await conn.execute(
            "SELECT postbox.create_topic($1, stream_retention => $2::text::interval)",
            NAME,
            retention,
        )
        await conn.execute("SELECT FROM postbox.create_consumer_group($1, $2)", NAME, GROUP)
        await conn.execute(await asyncio.to_thread(pgque.PGQUE_SQL.read_text))
        await conn.execute("SELECT pgque.create_queue($1)", NAME)
        await conn.execute("SELECT pgque.set_queue_config($1, 'rotation_period', $2)", NAME,
                           retention)  # fmt: skip
        await conn.execute("SELECT pgque.register_consumer($1, $2)", NAME, GROUP)
        await conn.execute("CREATE SCHEMA pgmq")
        await conn.execute(await asyncio.to_thread(PGMQ_SQL.read_text))
        await conn.execute("SELECT pgmq.create($1)", NAME)
    finally:
        await conn.close()


async def _produce(url: str, system: System, rate: float, stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    try:
        started = time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - started) * rate) - system.sent
            if due > 0:
                await system.produce(conn, due)
                system.sent += due
            await asyncio.sleep(TICK)
    finally:
        await conn.close()


async def _consume(url: str, system: System, stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            taken = await system.consume(conn)
            system.consumed += taken
            if taken == 0:
                await asyncio.sleep(0.01)
    finally:
        await conn.close()


async def _maintain(url: str, stop: asyncio.Event) -> None:
    """postbox.tick(), pgque.maint() and its rotation's second step each second, PgQue's
    ticker every 100 ms."""
    conn = await asyncpg.connect(url)
    try:
        last = 0.0
        while not stop.is_set():
            await conn.execute("SELECT pgque.ticker()")
            if time.monotonic() - last >= 1:
                last = time.monotonic()
                await conn.execute("SELECT postbox.tick()")
                await conn.execute("SELECT pgque.maint()")
                # Its own transaction, after step 1's, as pgque.start()'s cron job runs it.
                await conn.execute("SELECT pgque.maint_rotate_tables_step2()")
            await asyncio.sleep(0.1)
    finally:
        await conn.close()


async def _measure(conn: asyncpg.Connection, systems: list[System], phase: str) -> None:
    for system in systems:
        row = await conn.fetchrow(
            "SELECT coalesce(sum(n_dead_tup), 0)::bigint AS dead, "
            "coalesce(sum(pg_total_relation_size(relid)), 0)::bigint AS size "
            f"FROM pg_stat_user_tables WHERE {system.tables}"
        )
        assert row is not None
        system.dead[phase] = row["dead"]
        system.size[phase] = row["size"]


async def _run_phases(url: str, systems: list[System], phase_seconds: float, rate: float) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(_maintain(url, stop))]
    for system in systems:
        tasks.append(asyncio.create_task(_produce(url, system, rate, stop)))
        tasks.append(asyncio.create_task(_consume(url, system, stop)))
    monitor = await asyncpg.connect(url)
    holder = await asyncpg.connect(url)
    try:
        for phase in PHASES:
            if phase == "held":
                await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                await holder.fetchval("SELECT count(*) FROM pg_class")  # takes the snapshot
            released = time.monotonic()
            before = {s.name: s.consumed for s in systems}
            ends = released + phase_seconds
            while time.monotonic() < ends:
                await asyncio.sleep(1)
                for system in systems:
                    backlog = system.sent - system.consumed
                    if phase == "clean":
                        system.clean_backlog.append(backlog)
                    elif (
                        phase == "recovery"
                        and system.recovered_after is None
                        # Back when the backlog is no deeper than the clean phase's worst.
                        and backlog <= max(system.clean_backlog, default=0)
                    ):
                        system.recovered_after = time.monotonic() - released
                for failed in (t for t in tasks if t.done() and t.exception()):
                    raise RuntimeError("a producer or consumer failed") from failed.exception()
            for system in systems:
                system.phase_consumed[phase] = system.consumed - before[system.name]
            await asyncio.sleep(1)  # the backends' statistics reach pg_stat within a second
            await _measure(monitor, systems, phase)
            if phase == "held":
                await holder.execute("COMMIT")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await monitor.close()
        await holder.close()


def _rows(systems: list[System], phase_seconds: float, rate: float) -> list[Row]:
    rows = []
    for system in systems:
        rates = {p: system.phase_consumed[p] / phase_seconds for p in PHASES}
        kept = rates["held"] / rates["clean"] if rates["clean"] else float("nan")
        stream = system.name == "postbox stream"
        if system.name == "postbox queue":
            target, met = (
                ">= 0.9 of clean while held, back within 60 s",
                (
                    kept >= 0.9
                    and system.recovered_after is not None
                    and system.recovered_after <= 60
                ),
            )
        elif stream:
            target = "0 dead tuples"
            met = all(system.dead[p] == 0 for p in PHASES)
        else:
            target, met = "", None
        recovered = (
            "not within the phase"
            if system.recovered_after is None
            else f"{system.recovered_after:.0f} s"
        )
        rows.append(
            Row(
                f"death spiral: {system.name}, throughput while held / clean",
                "ratio",
                kept,
                None,
                f"capped at {rate:,.0f}/s, 3 phases of {phase_seconds:.0f} s",
                target=target,
                met=met,
                note=(
                    "consumed msgs/s clean/held/recovery "
                    + "/".join(f"{rates[p]:,.0f}" for p in PHASES)
                    + "; dead tuples at each phase's end "
                    + "/".join(f"{system.dead[p]:,}" for p in PHASES)
                    + "; table + indexes "
                    + "/".join(f"{system.size[p] / 2**20:,.1f}" for p in PHASES)
                    + f" MiB; backlog back to the clean phase's {recovered} after release"
                ),
            )
        )
    return rows


@scenario(
    "death_spiral",
    "held-xmin death spiral (PgQue's method): a postbox queue, a postbox stream topic, PgQue "
    "and PGMQ side by side, producers capped, three phases (clean, a REPEATABLE READ holder "
    "open, recovery): throughput, dead tuples, size, time to recover",
)
async def death_spiral(ctx: Context) -> list[Row]:
    if not pgque.PGQUE_SQL.is_file() or not PGMQ_SQL.is_file():
        raise RuntimeError(f"needs PgQue's and PGMQ's SQL in {PGMQ_SQL.parent}")
    phase_seconds, rate = ctx.spiral_phase_seconds, ctx.spiral_rate
    directory = scratch_directory("postbox-bench-spiral-")
    cluster = Postgres(directory / "data").initdb(
        "shared_buffers = 128MB", "autovacuum_naptime = 10s"
    )
    try:
        cluster.start()
        cluster.sql(f"CREATE DATABASE {DATABASE}")
        url = cluster.url(DATABASE)
        await _install(url, phase_seconds)
        systems = _systems()
        await _run_phases(url, systems, phase_seconds, rate)
        ctx.extra["death_spiral"] = {
            s.name: {
                "consumed": s.phase_consumed,
                "dead_tuples": s.dead,
                "bytes": s.size,
                "recovered_after_s": s.recovered_after,
            }
            for s in systems
        }
        return _rows(systems, phase_seconds, rate)
    finally:
        with contextlib.suppress(Exception):
            cluster.stop()
        cluster.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)
