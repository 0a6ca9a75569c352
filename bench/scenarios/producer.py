"""The SDK's batching Producer with 64 concurrent send() callers, against PGMQ's SQL send.

A Python program that sends one message per call pays a gRPC call each through
postbox's Send, and a transaction each through PGMQ's `pgmq.send` over an asyncpg
pool. The Producer gathers concurrent sends into SendBatch calls. The three take turns
(seven rounds of a fifth of --seconds each), in the same run, on the same database; the
figures are medians of the rounds, and the ratio is the median of the rounds' own
ratios, with their range.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
from pathlib import Path

import asyncpg
from postbox_client import AsyncClient

from bench.load import Load, closed_loop, interleaved_rounds
from bench.processes import ROOT
from bench.runner import Context, Row, scenario

log = logging.getLogger(__name__)

CALLERS = 64
POOL = 16  # asyncpg connections for the SQL senders
ROUNDS = 7
# PGMQ's SQL-only install sits beside the repository (shared/peers), not in it;
# POSTBOX_PEERS_DIR names another place (a git worktree elsewhere, say).
PGMQ_SQL = (
    Path(os.environ.get("POSTBOX_PEERS_DIR") or ROOT.parent / "shared" / "peers") / "pgmq-1.5.1.sql"
)


async def install_pgmq(url: str, sql: Path) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("DROP SCHEMA IF EXISTS pgmq CASCADE; CREATE SCHEMA pgmq")
        await conn.execute(await asyncio.to_thread(sql.read_text))
        await conn.execute("SELECT pgmq.create('bench_producer')")
    finally:
        await conn.close()


@scenario(
    "producer",
    f"SDK Producer, {CALLERS} concurrent send() callers, vs PGMQ's pgmq.send and "
    f"postbox.send over an asyncpg pool of {POOL}",
)
async def producer(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    queue = await ctx.new_queue(served.target, "producer")
    body = ctx.body()
    turn = ctx.seconds / 5  # short turns, more of them: this machine's speed drifts
    have_pgmq = PGMQ_SQL.is_file()
    if have_pgmq:
        await install_pgmq(ctx.db.url, PGMQ_SQL)
    else:
        log.warning("PGMQ's SQL is absent (%s): no PGMQ comparison in this run", PGMQ_SQL)
    pool = await ctx.db.pool(POOL)
    document = json.dumps({"body": body.decode()})
    batches = sent = 0  # SendBatch calls and the sends they carried, warm-ups included

    async with AsyncClient(served.target) as client:

        async def through_producer() -> Load:
            nonlocal batches
            sender = client.producer(queue)

            async def send() -> int:
                nonlocal sent
                await sender.send(body)
                sent += 1
                return 1

            try:
                return await closed_loop(send, clients=CALLERS, seconds=turn)
            finally:
                await sender.close()
                batches += sender.batches_sent

        async def through_pgmq() -> Load:
            async def send() -> int:
                await pool.fetchval("SELECT pgmq.send('bench_producer', $1::jsonb)", document)
                return 1

            return await closed_loop(send, clients=CALLERS, seconds=turn)

        async def through_postbox_sql() -> Load:
            async def send() -> int:
                await pool.fetchval("SELECT postbox.send($1, $2)", queue, body)
                return 1

            return await closed_loop(send, clients=CALLERS, seconds=turn)

        measures = [through_producer, through_postbox_sql]
        if have_pgmq:
            measures.append(through_pgmq)
        try:
            rounds = await interleaved_rounds(ROUNDS, *measures)
        finally:
            await pool.close()
    ours = statistics.median(loads[0].rate for loads in rounds)
    sql = statistics.median(loads[1].rate for loads in rounds)
    note = (
        f"medians of {ROUNDS} rounds of {turn:.1f} s; {batches} SendBatch calls of "
        f"{sent / max(batches, 1):.1f} messages on average; "
        f"postbox.send over the pool {sql:,.0f}/s"
    )
    pgmq, met = None, None
    if have_pgmq:
        pgmq = statistics.median(loads[2].rate for loads in rounds)
        ratios = [loads[0].rate / loads[2].rate for loads in rounds if loads[2].rate > 0]
        if ratios:
            ratio = statistics.median(ratios)
            note += f"; Producer/PGMQ per round {ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            met = ratio >= 3
    return [
        Row(
            f"Producer send() x{CALLERS}",
            "msgs/s",
            ours,
            pgmq,
            "PGMQ pgmq.send, asyncpg pool" if have_pgmq else "PGMQ absent",
            target=">= 3",
            met=met,
            note=note,
        )
    ]
