"""Relaxed durability: what Send(relaxed_durability=True), a commit with
synchronous_commit off, gains over a durable Send. Same server, same database,
same run, in turns, each kind on a queue of its own."""

from __future__ import annotations

import statistics

from bench.load import Load
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import single_sends

CLIENTS = 64
TURNS = 3


@scenario(
    "send_relaxed_durability",
    f"Send(1) x{CLIENTS} with relaxed_durability (synchronous_commit off) vs durable, in turns",
)
async def run(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    durable_queue = await ctx.new_queue(served.target, "durable")
    relaxed_queue = await ctx.new_queue(served.target, "relaxed")
    seconds = max(1.0, ctx.seconds / TURNS)
    turns: list[tuple[Load, Load]] = []
    for _ in range(TURNS):
        relaxed, _ = await single_sends(
            ctx, served, relaxed_queue, CLIENTS, seconds=seconds, relaxed_durability=True
        )
        durable, _ = await single_sends(ctx, served, durable_queue, CLIENTS, seconds=seconds)
        turns.append((relaxed, durable))
    ratios = sorted(r.rate / d.rate for r, d in turns if d.rate)
    relaxed_total = sum((r for r, _ in turns), Load(0, 0.0))
    durable_total = sum((d for _, d in turns), Load(0, 0.0))
    return [
        Row(
            f"Send(1) x{CLIENTS}, relaxed_durability",
            "msgs/s",
            relaxed_total.rate,
            durable_total.rate,
            "durable Send, same server",
            note=f"per-turn ratio median {statistics.median(ratios):.2f} "
            f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}, {TURNS} turns); p50 "
            f"{relaxed_total.latency_ms(0.5):.1f} ms vs {durable_total.latency_ms(0.5):.1f}",
        )
    ]
