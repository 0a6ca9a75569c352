"""Send->stream latency at a fixed rate: from the start of a Send to the message on a stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import asyncpg
import grpc
from postbox.v1 import message_service_pb2 as pb

from bench import raw
from bench.load import Load, Paced, fixed_rate
from bench.processes import Served, cpu_share
from bench.runner import Context, Row, message_stub, scenario

RATE = 1000.0
# Also measured well below saturation, so the figure shows the path, not a queue.
LOW_RATE = 100.0
WARMUP = 0.5


class Stopwatch:
    """Start times by message number, and the latencies of the ones seen arriving."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.started: dict[int, float] = {}
        self.latencies: list[float] = []
        self.first = time.perf_counter()
        self.all_seen = asyncio.Event()
        self.expected = -1
        self.redelivered = 0

    def body(self, i: int) -> bytes:
        self.started[i] = time.perf_counter()
        return f"{i}:".encode().ljust(self.size, b"x")

    def arrived(self, body: bytes) -> None:
        now = time.perf_counter()
        started = self.started.pop(int(body.split(b":", 1)[0]), None)
        if started is None:  # delivered again: its visibility ran out before the delete
            self.redelivered += 1
            return
        if started - self.first >= WARMUP:
            self.latencies.append(now - started)
        if self.expected >= 0 and not self.started:
            self.all_seen.set()

    async def finish(self, sent: int, timeout: float = 10.0) -> Load:
        """Waits up to `timeout` for the last messages; those still unseen stay in `started`."""
        self.expected = sent
        if self.started:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.all_seen.wait(), timeout)
        return Load(len(self.latencies), 0.0, self.latencies)


async def ours(ctx: Context, seconds: float, rate: float) -> tuple[Load, float, int, Paced]:
    served = ctx.postbox()
    return await streamed(ctx, served, await ctx.new_queue(served.target, "latency"), seconds, rate)


async def streamed(
    ctx: Context, served: Served, queue: str, seconds: float, rate: float
) -> tuple[Load, float, int, Paced]:
    """Sends at `rate` to `queue` while a continuous Receive deletes what it gets:
    the latencies, the server's CPU, how many never arrived, and the pace kept."""
    watch = Stopwatch(ctx.body_size)
    async with (
        grpc.aio.insecure_channel(served.target) as producer_channel,
        grpc.aio.insecure_channel(served.target) as consumer_channel,
    ):
        producer, consumer = message_stub(producer_channel), message_stub(consumer_channel)
        stream = consumer.Receive(
            pb.ReceiveRequest(queue=queue, max_messages=100, mode=pb.RECEIVE_MODE_CONTINUOUS)
        )
        deletes: set[asyncio.Task[object]] = set()

        async def consume() -> None:
            async for response in stream:
                for message in response.messages:
                    watch.arrived(message.body)
                task = asyncio.ensure_future(
                    consumer.DeleteBatch(
                        pb.DeleteBatchRequest(
                            queue=queue, receipts=[m.receipt for m in response.messages]
                        )
                    )
                )
                deletes.add(task)
                task.add_done_callback(deletes.discard)

        async def send(i: int) -> None:
            await producer.Send(pb.SendRequest(queue=queue, body=watch.body(i)))

        consuming = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)  # the stream waits before the first send
        before = served.cpu()
        paced = await fixed_rate(send, rate=rate, seconds=seconds)
        cpu = cpu_share(before, served.cpu())
        load = await watch.finish(paced.sent)
        unseen = len(watch.started)
        stream.cancel()
        consuming.cancel()
        await asyncio.gather(consuming, *deletes, return_exceptions=True)
    return load, cpu, unseen, paced


async def theirs(ctx: Context, seconds: float, rate: float) -> tuple[Load, Paced]:
    """The same flow on raw PostgreSQL: INSERT + NOTIFY, a LISTENing consumer that claims."""
    watch = Stopwatch(ctx.body_size)
    pool = await ctx.db.pool(4)
    listener = await asyncpg.connect(ctx.db.url)
    consumer = await asyncpg.connect(ctx.db.url)
    woken = asyncio.Event()
    await listener.add_listener("bench_raw", lambda *_: woken.set())

    async def consume() -> None:
        while True:
            await woken.wait()
            woken.clear()
            while rows := await consumer.fetch(raw.CLAIM_DELETE, 100):
                for row in rows:
                    watch.arrived(row["body"])

    async def send(i: int) -> None:
        await pool.execute(raw.INSERT_NOTIFY, watch.body(i))

    consuming = asyncio.ensure_future(consume())
    try:
        paced = await fixed_rate(send, rate=rate, seconds=seconds)
        return await watch.finish(paced.sent), paced
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await listener.close()
        await consumer.close()
        await pool.close()


@scenario(
    "send_to_stream_latency",
    f"send->stream latency p50/p99/p999 at {RATE:,.0f} msg/s (and at {LOW_RATE:,.0f} msg/s)",
)
async def run(ctx: Context) -> list[Row]:
    seconds = max(ctx.seconds * 2, 5.0)
    rows = []
    for rate in (RATE, LOW_RATE):
        mine, cpu, mine_unseen, mine_paced = await ours(ctx, seconds, rate)
        raw_load, raw_paced = await theirs(ctx, seconds, rate)
        relay = f"relay-{uuid.uuid4().hex[:8]}"
        transport, _, _, _ = await streamed(ctx, ctx.empty(), relay, seconds, rate)
        for label, fraction in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
            row = Row(
                f"send->stream {label} @{rate:,.0f}/s",
                "ms",
                mine.latency_ms(fraction),
                raw_load.latency_ms(fraction),
                "INSERT+NOTIFY -> LISTEN+SKIP LOCKED",
            )
            if label == "p50":
                if rate == RATE:
                    row.target, row.met = "<= 3 ms", row.ours <= 3.0
                row.note = (
                    f"{mine.operations} samples; sent at {mine_paced.rate:,.0f}/s "
                    f"(raw {raw_paced.rate:,.0f}/s); server CPU {cpu:.0%}"
                )
                if mine_unseen:
                    row.note += f"; {mine_unseen} not arrived 10 s after the last send"
            rows.append(row)
        rows.append(
            Row(
                f"send->stream p50 @{rate:,.0f}/s",
                "ms",
                mine.latency_ms(0.5),
                transport.latency_ms(0.5),
                "the same client, in-memory relay server (no DB)",
                note=f"transport alone: p99 {transport.latency_ms(0.99):.2f} ms",
            )
        )
    return rows
