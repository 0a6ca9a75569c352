"""Send->stream latency at a fixed rate: from the start of a Send to the message on a stream.

The producer runs in a process of its own, as producers and consumers do: in one
event loop, a thousand sends a second would queue the stream's reads behind them,
and the figure would measure the client's loop rather than the path. Each body
carries its message number and the moment its send started (the monotonic clock
is the machine's, so both processes read the same one).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
import uuid
from multiprocessing.connection import Connection

import asyncpg
import grpc
import psutil
from postbox.v1 import message_service_pb2 as pb

from bench import raw
from bench.database import pool_of
from bench.load import Load, Paced, fixed_rate
from bench.processes import Served, cpu_share, machine_cpu
from bench.runner import Context, Row, message_stub, scenario

RATE = 1000.0
# Also measured well below saturation, so the figure shows the path, not a queue.
LOW_RATE = 100.0
WARMUP = 0.5


def _body(i: int, size: int) -> bytes:
    return f"{i}:{time.perf_counter()!r}:".encode().ljust(size, b"x")


class Stopwatch:
    """The latencies of the messages seen arriving, by the start time in their bodies."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.latencies: list[float] = []
        self.first: float | None = None
        self.changed = asyncio.Event()
        self.redelivered = 0

    def arrived(self, body: bytes) -> None:
        now = time.perf_counter()
        number, started, _ = body.split(b":", 2)
        i = int(number)
        if i in self.seen:  # delivered again: its visibility ran out before the delete
            self.redelivered += 1
            return
        self.seen.add(i)
        self.changed.set()
        if self.first is None:
            self.first = float(started)
        if float(started) - self.first >= WARMUP:
            self.latencies.append(now - float(started))

    async def finish(self, sent: int, timeout: float = 10.0) -> tuple[Load, int]:
        """Waits up to `timeout` for the last messages; returns the latencies and how
        many never arrived."""
        deadline = time.perf_counter() + timeout
        while len(self.seen) < sent and time.perf_counter() < deadline:
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), deadline - time.perf_counter())
        return Load(len(self.latencies), 0.0, self.latencies), sent - len(self.seen)


def _produce(
    kind: str, address: str, queue: str, rate: float, seconds: float, size: int, out: Connection
) -> None:
    """The producer process: sends at `rate` for `seconds`, then reports what it kept up."""

    async def run() -> Paced:
        if kind == "raw":
            pool = await pool_of(address, 4)
            try:
                return await fixed_rate(
                    lambda i: pool.execute(raw.INSERT_NOTIFY, _body(i, size)),
                    rate=rate,
                    seconds=seconds,
                )
            finally:
                await pool.close()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = message_stub(channel)

            async def send(i: int) -> None:
                await stub.Send(pb.SendRequest(queue=queue, body=_body(i, size)))

            return await fixed_rate(send, rate=rate, seconds=seconds)

    paced = asyncio.run(run())
    out.send((paced.sent, paced.seconds))


async def _produced(
    kind: str, address: str, queue: str, rate: float, seconds: float, size: int
) -> Paced:
    """Runs the producer process to its end."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    ours, theirs = context.Pipe(duplex=False)
    process = context.Process(
        target=_produce, args=(kind, address, queue, rate, seconds, size, theirs), daemon=True
    )
    process.start()
    theirs.close()  # the child's end: if the child dies, recv() ends with EOFError
    try:
        sent, elapsed = await asyncio.to_thread(ours.recv)
    except EOFError:
        await asyncio.to_thread(process.join, 10)
        message = f"the {kind} producer process died (exit code {process.exitcode})"
        raise RuntimeError(message) from None
    finally:
        await asyncio.to_thread(process.join, 10)
        if process.is_alive():
            process.kill()
    return Paced(sent, elapsed)


async def streamed(
    ctx: Context, served: Served, queue: str, seconds: float, rate: float
) -> tuple[Load, tuple[float, float], int, Paced]:
    """Sends at `rate` to `queue` from a producer process while a continuous Receive
    deletes what it gets: the latencies, the server's and the machine's CPU (shares of
    one core), how many never arrived, and the pace kept."""
    watch = Stopwatch()
    async with grpc.aio.insecure_channel(served.target) as channel:
        consumer = message_stub(channel)
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

        consuming = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)  # the stream waits before the first send
        before, machine_before = served.cpu(), machine_cpu()
        paced = await _produced("grpc", served.target, queue, rate, seconds, ctx.body_size)
        cpu = cpu_share(before, served.cpu())
        machine = cpu_share(machine_before, machine_cpu())
        load, unseen = await watch.finish(paced.sent)
        stream.cancel()
        consuming.cancel()
        await asyncio.gather(consuming, *deletes, return_exceptions=True)
    return load, (cpu, machine), unseen, paced


async def ours(
    ctx: Context, seconds: float, rate: float
) -> tuple[Load, tuple[float, float], int, Paced]:
    served = ctx.postbox()
    return await streamed(ctx, served, await ctx.new_queue(served.target, "latency"), seconds, rate)


async def theirs(ctx: Context, seconds: float, rate: float) -> tuple[Load, Paced]:
    """The same flow on raw PostgreSQL: INSERT + NOTIFY, a LISTENing consumer that claims."""
    watch = Stopwatch()
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

    consuming = asyncio.ensure_future(consume())
    try:
        paced = await _produced("raw", ctx.db.url, "", rate, seconds, ctx.body_size)
        load, _ = await watch.finish(paced.sent)
        return load, paced
    finally:
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)
        await listener.close()
        await consumer.close()


@scenario(
    "send_to_stream_latency",
    f"send->stream latency p50/p99/p999 at {RATE:,.0f} msg/s (and at {LOW_RATE:,.0f} msg/s), "
    "producer in a process of its own",
)
async def run(ctx: Context) -> list[Row]:
    seconds = max(ctx.seconds * 2, 5.0)
    rows = []
    for rate in (RATE, LOW_RATE):
        mine, (cpu, machine), mine_unseen, mine_paced = await ours(ctx, seconds, rate)
        raw_load, raw_paced = await theirs(ctx, seconds, rate)
        relay = f"relay-{uuid.uuid4().hex[:8]}"
        transport, (_, transport_machine), _, _ = await streamed(
            ctx, ctx.empty(), relay, seconds, rate
        )
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
                    f"(raw {raw_paced.rate:,.0f}/s); CPU: server {cpu:.0%}, "
                    f"machine {machine:.0%} of {psutil.cpu_count()} cores"
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
                note=(
                    f"transport alone: p99 {transport.latency_ms(0.99):.2f} ms, "
                    f"machine CPU {transport_machine:.0%}"
                ),
            )
        )
    return rows
