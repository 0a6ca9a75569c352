"""What 1,000 waiting streams cost an idle server: CPU (share of a core), resident memory,
and the statements it runs in its database (pg_stat_database.xact_commit)."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
from postbox.v1 import message_service_pb2 as pb

from bench.processes import Served, cpu_share
from bench.runner import Context, Row, message_stub, scenario

STREAMS = 1000
QUEUES = 100
CHANNELS = 10
# PostgreSQL reports an idle backend's counts up to 10 s late (PGSTAT_IDLE_INTERVAL).
STATS_DELAY = 11.0


async def _statements_per_second(database_url: str, seconds: float) -> float:
    """Transactions committed in the database per second over `seconds` (less our reads)."""
    conn = await asyncpg.connect(database_url)
    try:
        query = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        await asyncio.sleep(STATS_DELAY)
        before = await conn.fetchval(query)
        await asyncio.sleep(seconds)
        return max(0, await conn.fetchval(query) - before - 1) / seconds
    finally:
        await conn.close()


async def _idle_cpu(served: Served, seconds: float) -> float:
    before = served.cpu()
    await asyncio.sleep(seconds)
    return cpu_share(before, served.cpu())


@scenario("idle_streams", f"server CPU and RSS with {STREAMS} waiting streams, vs none")
async def run(ctx: Context) -> list[Row]:
    # The database's statements are this server's alone: servers that earlier scenarios
    # left running (a second worker, the HTTP port's) have rounds of their own.
    ctx.stop_servers()
    served = ctx.postbox()
    # Longer than the safety poll (10 s by default), so its rounds are in the figure.
    seconds = max(12.0, ctx.seconds * 2)
    queues = [await ctx.new_queue(served.target, f"idle{i}") for i in range(QUEUES)]
    await asyncio.sleep(1.0)
    baseline_cpu = await _idle_cpu(served, seconds)
    baseline_rss = served.rss()

    channels = [grpc.aio.insecure_channel(served.target) for _ in range(CHANNELS)]
    calls = []
    for i in range(STREAMS):
        stub = message_stub(channels[i % CHANNELS])
        calls.append(
            stub.Receive(
                pb.ReceiveRequest(queue=queues[i % QUEUES], mode=pb.RECEIVE_MODE_CONTINUOUS)
            )
        )
    # A read per stream makes the client start every call; none of them returns.
    reads = [asyncio.ensure_future(call.read()) for call in calls]
    try:
        await asyncio.sleep(3.0)  # every stream has polled once and waits now
        if any(read.done() for read in reads):
            failed = next(read for read in reads if read.done())
            raise RuntimeError(f"a waiting stream ended: {failed.result()!r}")
        cpu = await _idle_cpu(served, seconds)
        rss = served.rss()
        statements = await _statements_per_second(ctx.db.url, seconds)
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*reads, return_exceptions=True)
        await asyncio.gather(*(channel.close() for channel in channels))
    return [
        Row(
            f"idle, {STREAMS} waiting streams",
            "% of a core",
            cpu * 100,
            baseline_cpu * 100,
            "same server, no streams",
            "< 1%",
            cpu < 0.01,
            f"measured over {seconds:.0f} s",
        ),
        Row(
            f"idle, {STREAMS} waiting streams on {QUEUES} queues",
            "statements/s",
            statements,
            None,
            "",
            "<= 1",
            statements <= 1.0,
            f"pg_stat_database.xact_commit over {seconds:.0f} s",
        ),
        Row(
            f"idle, {STREAMS} waiting streams",
            "RSS MiB",
            rss / 2**20,
            baseline_rss / 2**20,
            "same server, no streams",
        ),
    ]
