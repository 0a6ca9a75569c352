"""The SQL engine against PgQue on the same database, in PgQue's own benchmark shapes.

PgQue (issue 44) installs from one SQL file, read from beside the repository
(shared/peers, or POSTBOX_PEERS_DIR) at run time; without it the scenarios say so.
Its benchmark's payload is `json_build_object('data', repeat('x', 200))`: PgQue gets
that document as jsonb, postbox gets its text as the body, so both carry the same
bytes. The systems take turns within each round, rotated, and each ratio is the
median of the rounds' own ratios, with their range, as in engine_vs_pgmq.

- pgque_producer: one send per transaction from 8 pgbench sessions (-M prepared):
  `postbox.send` into a plain queue and `postbox.publish` into a stream topic
  against `pgque.send`, with synchronous_commit on and then off (set on the
  database, so every new pgbench session takes it).
- pgque_consumer: one consumer draining a backlog put in before its turn, in
  batches of 1,000: PgQue's claim pattern, `next_batch`, `get_batch_events`,
  `finish_batch` in one transaction (PgQue's batches are the events between two
  ticks, so the fill calls its ticker after every 1,000 events, as its ticker
  would with ticker_max_count 1000), against `postbox.read_stream` then
  `postbox.ack_stream` for one consumer group, each its own transaction, as a
  consumer that processes between them runs them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import time
from collections.abc import Awaitable, Callable

import asyncpg

from bench import raw
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.producer import PGMQ_SQL

log = logging.getLogger(__name__)

# Beside PGMQ's, in shared/peers or POSTBOX_PEERS_DIR.
PGQUE_SQL = PGMQ_SQL.parent / "pgque-95d5c3c.sql"
PGQUE_LABEL = "PgQue 0.2.0 (95d5c3c)"
ROUNDS = 5  # as engine_vs_pgmq: one slow turn moves no median
CLIENTS = 8
BATCH = 1000  # events per consumer batch, and per PgQue tick
QUEUE = "bench_pgque"  # the postbox queue, PgQue's queue and the stream topic
GROUP = "bench_group"  # the postbox consumer group and the PgQue consumer
# PgQue's benchmark payload: {"data": "xxx...x"} with 200 x's.
DOCUMENT = json.dumps({"data": "x" * 200})


def _body_literal() -> str:
    return f"'\\x{DOCUMENT.encode().hex()}'::bytea"


def _document_literal() -> str:
    return f"'{DOCUMENT}'::jsonb"


def producer_scripts() -> dict[str, str]:
    """Each system's one-send transaction, as pgbench runs it."""
    return {
        "postbox.send": f"SELECT postbox.send('{QUEUE}', {_body_literal()});",
        # One uuid column: the whole row would go to the client as a record.
        "postbox.publish": f"SELECT publish_id FROM postbox.publish('{QUEUE}', {_body_literal()});",
        "pgque.send": f"SELECT pgque.send('{QUEUE}', {_document_literal()});",
    }


async def install(conn: asyncpg.Connection) -> None:
    """PgQue, its queue and consumer; postbox's queue, stream topic and group."""
    await conn.execute("DROP SCHEMA IF EXISTS pgque CASCADE")
    await conn.execute(await asyncio.to_thread(PGQUE_SQL.read_text))
    await conn.execute("SELECT pgque.create_queue($1)", QUEUE)
    await conn.execute(
        "SELECT pgque.set_queue_config($1, 'ticker_max_count', $2)", QUEUE, str(BATCH)
    )
    await conn.execute("SELECT pgque.register_consumer($1, $2)", QUEUE, GROUP)
    await conn.execute("SELECT postbox.create_queue($1)", QUEUE)
    await conn.execute("SELECT postbox.create_topic($1, stream_retention => '1 day')", QUEUE)
    await conn.execute("SELECT FROM postbox.create_consumer_group($1, $2)", QUEUE, GROUP)


async def _with_pgque(ctx: Context) -> asyncpg.Connection | None:
    if not PGQUE_SQL.is_file():
        log.warning("PgQue's SQL is absent (%s)", PGQUE_SQL)
        return None
    conn = await asyncpg.connect(ctx.db.url)
    await install(conn)
    return conn


def _absent(name: str) -> list[Row]:
    return [Row(name, "msgs/s", float("nan"), None, f"PgQue absent ({PGQUE_SQL})")]


def _rates(values: list[float]) -> str:
    """A median rate with its range, in whole messages per second."""
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def _rotated(systems: list[str], round_: int) -> list[str]:
    k = round_ % len(systems)
    return systems[k:] + systems[:k]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} (1/5 min)"


@scenario(
    "pgque_producer",
    f"the SQL engine vs {PGQUE_LABEL}, pgbench -M prepared x{CLIENTS}, one send per "
    "transaction of PgQue's 200-byte JSON: postbox.send (queue) and postbox.publish (stream "
    "topic) vs pgque.send, synchronous_commit on and off",
)
async def pgque_producer(ctx: Context) -> list[Row]:
    if ctx.db.pgbench is None:
        raise RuntimeError("pgbench is not installed")
    conn = await _with_pgque(ctx)
    if conn is None:
        return _absent("SQL send vs pgque.send")
    seconds = max(2, round(ctx.seconds / 2))
    scripts = producer_scripts()
    systems = list(scripts)
    database = await conn.fetchval("SELECT current_database()")
    rows = []
    try:
        for sync in ("on", "off"):
            # On the database: each pgbench session is new and takes it.
            await conn.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = {sync}')
            rates: dict[str, list[float]] = {system: [] for system in systems}
            before = _load()
            for round_ in range(ROUNDS):
                for system in _rotated(systems, round_):
                    rates[system].append(
                        await raw.pgbench_tps(
                            ctx.db, scripts[system], clients=CLIENTS, seconds=seconds
                        )
                    )
            after = _load()
            theirs = statistics.median(rates["pgque.send"])
            for ours in ("postbox.send", "postbox.publish"):
                ratios = [p / q for p, q in zip(rates[ours], rates["pgque.send"], strict=True)]
                rows.append(
                    Row(
                        f"SQL {ours} vs pgque.send x{CLIENTS}, synchronous_commit={sync}",
                        "msgs/s",
                        statistics.median(rates[ours]),
                        theirs,
                        f"{PGQUE_LABEL}, pgbench",
                        target=">= 1.0x PgQue",
                        met=statistics.median(ratios) >= 1.0,
                        note=(
                            f"medians of {ROUNDS} rounds of {seconds} s: {ours} "
                            f"{_rates(rates[ours])}, pgque.send "
                            f"{_rates(rates['pgque.send'])} msgs/s; {ours}/pgque.send per "
                            f"round {median_range(ratios, 'x')}; {before} before, {after} after"
                        ),
                    )
                )
    finally:
        await conn.execute(f'ALTER DATABASE "{database}" RESET synchronous_commit')
        await conn.close()
    return rows


async def fill_pgque(conn: asyncpg.Connection, events: int) -> None:
    for _ in range(events // BATCH):
        await conn.execute(
            "SELECT pgque.send_batch($1, array_fill($2::jsonb, ARRAY[$3::int]))",
            QUEUE,
            DOCUMENT,
            BATCH,
        )
        # Its own transaction, after the events commit: the tick's snapshot holds them.
        await conn.execute("SELECT pgque.ticker($1)", QUEUE)


async def fill_postbox(conn: asyncpg.Connection, events: int) -> None:
    for _ in range(events // BATCH):
        await conn.execute(
            "SELECT count(*) FROM postbox.publish_batch($1, array_fill($2::bytea, ARRAY[$3::int]))",
            QUEUE,
            DOCUMENT.encode(),
            BATCH,
        )


async def drain_pgque(conn: asyncpg.Connection) -> int:
    """PgQue's consumer loop: a batch's events read and the batch finished, one transaction."""
    read = 0
    while True:
        async with conn.transaction():
            batch = await conn.fetchval("SELECT pgque.next_batch($1, $2)", QUEUE, GROUP)
            if batch is None:
                return read
            read += len(await conn.fetch("SELECT * FROM pgque.get_batch_events($1)", batch))
            await conn.execute("SELECT pgque.finish_batch($1)", batch)


async def drain_postbox(conn: asyncpg.Connection) -> int:
    """A consumer group's loop: read a batch (its lease commits), then ack it."""
    read = 0
    while rows := await conn.fetch(
        "SELECT * FROM postbox.read_stream($1, $2, $3)", QUEUE, GROUP, BATCH
    ):
        read += len(rows)
        await conn.execute("SELECT postbox.ack_stream($1, $2, $3)", QUEUE, GROUP, rows[0]["batch"])
    return read


@scenario(
    "pgque_consumer",
    f"one consumer group reading + acking batches of {BATCH}: postbox.read_stream + "
    f"ack_stream vs {PGQUE_LABEL}'s next_batch + get_batch_events + finish_batch, "
    f"{ROUNDS} rounds in turns",
)
async def pgque_consumer(ctx: Context) -> list[Row]:
    conn = await _with_pgque(ctx)
    if conn is None:
        return _absent("SQL batch read + ack vs PgQue")
    # About a second's reading per turn at 25k/s: kept short so the run stays ~1 minute.
    events = max(BATCH, round(ctx.seconds * 5_000 / BATCH) * BATCH)
    systems: dict[str, tuple[Callable[..., Awaitable[None]], Callable[..., Awaitable[int]]]] = {
        "postbox": (fill_postbox, drain_postbox),
        "pgque": (fill_pgque, drain_pgque),
    }
    rates: dict[str, list[float]] = {system: [] for system in systems}
    before = _load()
    try:
        for round_ in range(ROUNDS):
            for system in _rotated(list(systems), round_):
                fill, drain = systems[system]
                await fill(conn, events)
                started = time.perf_counter()
                read = await drain(conn)
                elapsed = time.perf_counter() - started
                if read != events:
                    raise RuntimeError(f"{system} read {read} of {events} events")
                rates[system].append(read / elapsed)
    finally:
        await conn.close()
    after = _load()
    ratios = [p / q for p, q in zip(rates["postbox"], rates["pgque"], strict=True)]
    return [
        Row(
            f"SQL read_stream({BATCH}) + ack_stream vs PgQue batch, 1 group",
            "msgs/s",
            statistics.median(rates["postbox"]),
            statistics.median(rates["pgque"]),
            f"{PGQUE_LABEL}, asyncpg",
            target=">= 1.0x PgQue",
            met=statistics.median(ratios) >= 1.0,
            note=(
                f"medians of {ROUNDS} drains of {events:,} events each: postbox "
                f"{_rates(rates['postbox'])}, PgQue {_rates(rates['pgque'])} "
                f"msgs/s; postbox/PgQue per round {median_range(ratios, 'x')}; "
                f"{before} before, {after} after"
            ),
        )
    ]
