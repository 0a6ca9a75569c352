"""Throughput: SendBatch, single Send at several concurrencies, Receive+Delete."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

from bench import raw
from bench.load import Load, closed_loop
from bench.processes import Served, cpu_share
from bench.runner import Context, Row, message_stub, scenario

BATCH_CLIENTS = 4
CONSUMERS = 8


class Channels:
    """A few channels shared round-robin by many clients, the same for every server measured."""

    def __init__(self, target: str, count: int) -> None:
        self._channels = [grpc.aio.insecure_channel(target) for _ in range(count)]
        self._stubs = itertools.cycle([message_stub(c) for c in self._channels])

    def stub(self) -> message_service_pb2_grpc.MessageServiceStub:
        return next(self._stubs)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._channels))


async def measured(served: Served, work: Callable[[], Awaitable[Load]]) -> tuple[Load, float]:
    """Runs the work; returns its Load and the server's CPU use (share of a core) meanwhile."""
    before = served.cpu()
    load = await work()
    return load, cpu_share(before, served.cpu())


async def grpc_load(
    served: Served,
    clients: int,
    seconds: float,
    call: Callable[[message_service_pb2_grpc.MessageServiceStub], Awaitable[int]],
) -> tuple[Load, float]:
    """`clients` closed loops of `call` on a few shared channels; Load and server CPU."""
    channels = Channels(served.target, min(clients, 4))
    try:
        return await measured(
            served,
            lambda: closed_loop(lambda: call(channels.stub()), clients=clients, seconds=seconds),
        )
    finally:
        await channels.close()


async def send_batches(ctx: Context, served: Served, queue: str, size: int) -> tuple[Load, float]:
    request = pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=ctx.body())] * size)

    async def call(stub: message_service_pb2_grpc.MessageServiceStub) -> int:
        return len((await stub.SendBatch(request)).message_ids)

    return await grpc_load(served, BATCH_CLIENTS, ctx.seconds, call)


async def raw_batches(ctx: Context, size: int) -> Load:
    pool = await ctx.db.pool(BATCH_CLIENTS)
    bodies = [ctx.body()] * size
    try:
        return await closed_loop(
            lambda: raw.insert_many(pool, bodies), clients=BATCH_CLIENTS, seconds=ctx.seconds
        )
    finally:
        await pool.close()


def _send_batch_scenario(size: int) -> None:
    @scenario(
        f"send_batch_{size}",
        f"SendBatch({size}) msgs/s, {BATCH_CLIENTS} clients, vs asyncpg multi-row INSERT",
    )
    async def run(ctx: Context) -> list[Row]:
        served = ctx.postbox()
        queue = await ctx.new_queue(served.target, f"batch{size}")
        ours, cpu = await send_batches(ctx, served, queue, size)
        theirs = await raw_batches(ctx, size)
        row = Row(
            f"SendBatch({size}) x{BATCH_CLIENTS}",
            "msgs/s",
            ours.rate,
            theirs.rate,
            "asyncpg multi-row INSERT",
            note=f"p99 {ours.latency_ms(0.99):.1f} ms/call; server CPU {cpu:.0%}",
        )
        if size == 500:
            row.target, row.met = ">= 0.7x raw", (row.ratio or 0) >= 0.7
        return [row]


for _size in (100, 500, 1000):
    _send_batch_scenario(_size)


async def single_sends(
    ctx: Context, served: Served, queue: str, clients: int
) -> tuple[Load, float]:
    request = pb.SendRequest(queue=queue, body=ctx.body())

    async def call(stub: message_service_pb2_grpc.MessageServiceStub) -> int:
        await stub.Send(request)
        return 1

    return await grpc_load(served, clients, ctx.seconds, call)


def _send_one_scenario(clients: int) -> None:
    @scenario(
        f"send_1_c{clients}",
        f"Send(1) calls/s with {clients} concurrent clients, vs the empty handler and pgbench",
    )
    async def run(ctx: Context) -> list[Row]:
        served = ctx.postbox()
        queue = await ctx.new_queue(served.target, f"send1c{clients}")
        ours, cpu = await single_sends(ctx, served, queue, clients)
        empty, _ = await single_sends(ctx, ctx.empty(), queue, clients)
        pgbench = await raw.pgbench_single_inserts(
            ctx.db, ctx.body(), clients=clients, seconds=ctx.seconds
        )
        note = (
            f"p50 {ours.latency_ms(0.5):.1f} / p99 {ours.latency_ms(0.99):.1f} ms "
            f"(empty: {empty.latency_ms(0.5):.1f} / {empty.latency_ms(0.99):.1f}); "
            f"server CPU {cpu:.0%}"
        )
        ceiling = Row(
            f"Send(1) x{clients}", "calls/s", ours.rate, empty.rate, "empty gRPC handler", note=note
        )
        if clients == 64:
            ceiling.target, ceiling.met = ">= 0.8x empty", (ceiling.ratio or 0) >= 0.8
        return [
            ceiling,
            Row(f"Send(1) x{clients}", "calls/s", ours.rate, pgbench, "pgbench 1 INSERT/commit"),
        ]


for _clients in (1, 16, 64):
    _send_one_scenario(_clients)


async def receive_deletes(ctx: Context, served: Served, queue: str, batch: int, total: int) -> Load:
    """CONSUMERS continuous streams, each deleting every batch it gets; msgs/s deleted."""
    channels = Channels(served.target, min(CONSUMERS, 4))
    loop = asyncio.get_running_loop()
    counts = Counts(loop, ctx.seconds, total)

    async def consume() -> None:
        stub = channels.stub()
        call = stub.Receive(
            pb.ReceiveRequest(
                queue=queue,
                max_messages=batch,
                mode=pb.RECEIVE_MODE_CONTINUOUS,
                visibility_timeout={"seconds": 120},
            )
        )
        try:
            async for response in call:
                receipts = [m.receipt for m in response.messages]
                if batch == 1:
                    await stub.Delete(pb.DeleteRequest(queue=queue, receipt=receipts[0]))
                else:
                    await stub.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=receipts))
                if counts.add(len(receipts)):
                    return
        finally:
            call.cancel()

    try:
        await asyncio.gather(*(consume() for _ in range(CONSUMERS)))
    finally:
        await channels.close()
    return counts.load()


async def raw_claim_deletes(ctx: Context, batch: int, total: int) -> Load:
    pool = await ctx.db.pool(CONSUMERS)
    counts = Counts(asyncio.get_running_loop(), ctx.seconds, total)

    async def consume() -> None:
        async with pool.acquire() as conn:
            while not counts.add(await raw.claim_delete(conn, batch)):
                pass

    try:
        await asyncio.gather(*(consume() for _ in range(CONSUMERS)))
    finally:
        await pool.close()
    return counts.load()


class Counts:
    """Messages done, counted after a warm-up, until the time is up or everything is done."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, total: int) -> None:
        self._loop = loop
        self._total = total
        self._start = loop.time() + 0.5
        self._end = self._start + seconds
        self._last = self._start
        self.done = 0
        self.counted = 0

    def add(self, count: int) -> bool:
        """Records `count` more; True when the run is over."""
        now = self._loop.time()
        self.done += count
        if self._start <= now < self._end:
            self.counted += count
            self._last = now
        return now >= self._end or self.done >= self._total or count == 0

    def load(self) -> Load:
        return Load(self.counted, self._last - self._start)


def _receive_scenario(batch: int) -> None:
    @scenario(
        f"receive_delete_{batch}",
        f"Receive+Delete msgs/s, batch {batch}, {CONSUMERS} consumers, vs raw SKIP LOCKED delete",
    )
    async def run(ctx: Context) -> list[Row]:
        served = ctx.postbox()
        queue = await ctx.new_queue(served.target, f"recv{batch}")
        # Enough that no side runs dry before its time is up.
        total = int((ctx.seconds + 1) * (4000 if batch == 1 else 25000))
        body = ctx.body()
        async with grpc.aio.insecure_channel(served.target) as channel:
            stub = message_stub(channel)
            entries = [pb.SendBatchEntry(body=body)] * 1000
            for _ in range(0, total, 1000):
                await stub.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
        total = (total + 999) // 1000 * 1000
        before = served.cpu()
        ours = await receive_deletes(ctx, served, queue, batch, total)
        cpu = cpu_share(before, served.cpu())
        await ctx.db.reset_raw()
        await raw.fill(ctx.db, body, total)
        theirs = await raw_claim_deletes(ctx, batch, total)
        await ctx.db.reset_raw()
        row = Row(
            f"Receive+Delete({batch}) x{CONSUMERS}",
            "msgs/s",
            ours.rate,
            theirs.rate,
            "asyncpg SKIP LOCKED DELETE",
            note=f"server CPU {cpu:.0%}",
        )
        if batch == 10:
            row.target, row.met = ">= 0.7x raw", (row.ratio or 0) >= 0.7
        return [row]


for _batch in (1, 10):
    _receive_scenario(_batch)


@scenario("workers_scaling", "Send(1) x64 and SendBatch(500) with 2 worker processes vs 1")
async def workers_scaling(ctx: Context) -> list[Row]:
    rows = []
    one, two = ctx.postbox(1), ctx.postbox(2)
    for label, measure in (
        ("Send(1) x64", lambda served, queue: single_sends(ctx, served, queue, 64)),
        (
            f"SendBatch(500) x{BATCH_CLIENTS}",
            lambda served, queue: send_batches(ctx, served, queue, 500),
        ),
    ):
        single, _ = await measure(one, await ctx.new_queue(one.target, "w1"))
        double, cpu = await measure(two, await ctx.new_queue(two.target, "w2"))
        rows.append(
            Row(
                f"{label}, 2 workers",
                "msgs/s",
                double.rate,
                single.rate,
                "same, 1 worker",
                note=f"2-worker server CPU {cpu:.0%}",
            )
        )
    return rows
