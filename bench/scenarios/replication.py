"""Synchronous replication: what waiting for a standby on every commit costs sends.

Builds its own primary and synchronous standby (Debian's PostgreSQL 15, fsync on,
see bench/pg_cluster.py) and serves two databases of that primary: one whose commits
wait for the standby (synchronous_commit = on) and one whose commits do not
(ALTER DATABASE ... SET synchronous_commit = local, what a primary without a
synchronous standby does). Same machine, same primary, same run, in turns.
"""

from __future__ import annotations

import statistics
from collections.abc import Awaitable, Callable

from bench.load import Load
from bench.pg_cluster import PG_BIN, Pair, scratch_directory
from bench.processes import Served
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import BATCH_CLIENTS, send_batches, single_sends

CLIENTS = 16
BATCH = 100
TURNS = 3


@scenario(
    "send_sync_replication",
    f"Send(1) x{CLIENTS} and SendBatch({BATCH}) x{BATCH_CLIENTS} with a synchronous "
    "standby vs without (synchronous_commit local), one primary of its own, in turns",
)
async def run(ctx: Context) -> list[Row]:
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(f"needs Debian's postgresql-15 ({PG_BIN})")
    pair = Pair.build(scratch_directory("postbox-bench-replication-"))
    try:
        pair.primary.sql("CREATE DATABASE postbox_local")
        pair.primary.sql("ALTER DATABASE postbox_local SET synchronous_commit = local")
        with (
            Served.postbox(pair.primary.url("postbox"), name="sync") as synchronous,
            Served.postbox(pair.primary.url("postbox_local"), name="local") as local,
        ):
            return [
                await _compare(ctx, synchronous, local, f"Send(1) x{CLIENTS}", _single(ctx)),
                await _compare(
                    ctx, synchronous, local, f"SendBatch({BATCH}) x{BATCH_CLIENTS}", _batch(ctx)
                ),
            ]
    finally:
        pair.remove()


Measure = Callable[[Served, str], Awaitable[Load]]


def _single(ctx: Context) -> Measure:
    async def measure(served: Served, queue: str) -> Load:
        return (await single_sends(ctx, served, queue, CLIENTS, seconds=_turn(ctx)))[0]

    return measure


def _batch(ctx: Context) -> Measure:
    async def measure(served: Served, queue: str) -> Load:
        return (await send_batches(ctx, served, queue, BATCH, seconds=_turn(ctx)))[0]

    return measure


def _turn(ctx: Context) -> float:
    return max(1.0, ctx.seconds / TURNS)


async def _compare(
    ctx: Context, synchronous: Served, local: Served, what: str, measure: Measure
) -> Row:
    queues = {
        served.name: await ctx.new_queue(served.target, "replication")
        for served in (synchronous, local)
    }
    turns: list[tuple[Load, Load]] = []
    for _ in range(TURNS):
        waited = await measure(synchronous, queues["sync"])
        not_waited = await measure(local, queues["local"])
        turns.append((waited, not_waited))
    ratios = sorted(w.rate / n.rate for w, n in turns if n.rate)
    on = sum((w for w, _ in turns), Load(0, 0.0))
    off = sum((n for _, n in turns), Load(0, 0.0))
    return Row(
        f"{what}, synchronous standby",
        "msgs/s",
        on.rate,
        off.rate,
        "same primary, synchronous_commit local",
        note=f"per-turn ratio median {statistics.median(ratios):.2f} "
        f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}, {TURNS} turns); "
        f"p50 {on.latency_ms(0.5):.1f} ms vs {off.latency_ms(0.5):.1f}",
    )
