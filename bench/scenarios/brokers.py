"""postbox beside the brokers a team would pick instead: RabbitMQ and NATS JetStream.

Each system runs on this machine and is driven through its usual Python asyncio client:
RabbitMQ through aio-pika (durable queues, persistent messages, publisher confirms, manual
acks), JetStream through nats-py (file-backed streams, acked pulls), postbox through
postbox_client. Every workload runs the systems in turns, ROUNDS times over, so the
machine's drift reaches them alike; a figure is the median of its rounds, a ratio the
median of the rounds' own ratios with their range.

The systems do not promise the same thing when they answer (DURABILITY), and each row says
so. A system whose port does not answer is left out of the run with a printed note.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import socket
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import nats
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType, StreamConfig
from postbox.v1 import message_service_pb2 as pb
from postbox_client import AsyncClient

from bench import raw
from bench.cpu import DATABASE_PROCESSES, seconds_of
from bench.load import Load, Paced, closed_loop, fixed_rate
from bench.processes import Served
from bench.runner import Context, Row, scenario
from bench.scenarios.latency import Stopwatch, _body
from bench.scenarios.latency import theirs as raw_postgres_latency
from bench.scenarios.streams import _stream_topic
from bench.scenarios.topics import _topic as fanout_topic

log = logging.getLogger(__name__)

CALLERS = 64  # concurrent senders, each awaiting one send at a time
CONSUMERS = 8  # concurrent consumers acking each message
PREFETCH = 20  # RabbitMQ's unacked messages per consumer
PULL = 10  # JetStream's messages per acked pull
SUBSCRIBERS = 10
RATE = 1000.0  # msgs/s of the latency rows
ROUNDS = 3
CHANNELS = 8  # AMQP channels the RabbitMQ senders share, as a web service's pool would
# Generous: a consumer turn on a loaded machine may take several times its usual seconds.
DRAIN_TIMEOUT = 300.0

RABBITMQ_URL = os.environ.get("POSTBOX_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("POSTBOX_BENCH_NATS_URL", "nats://127.0.0.1:4222")

POSTBOX, RABBITMQ, JETSTREAM = "postbox", "RabbitMQ", "JetStream"
UNARY = "postbox unary Send"
NOT_IDEMPOTENT = "postbox Producer, idempotent=False"
UNARY_BATCHES = "postbox Producer, unary SendBatch"
# The latency turn's floor: INSERT + NOTIFY, and a LISTENing consumer that claims (asyncpg).
RAW_POSTGRES = "raw PostgreSQL"
# The Producer's two floors, measured apart: the transport (the SDK's Producer against
# bench.empty_server: gRPC, protobuf and the event loops, no database) and the engine
# (SendBatch's statement alone, one batch at a time, as the Producer's batches go); and
# the rate of a server that added nothing to them, their batch times added.
TRANSPORT = "transport ceiling"
ENGINE = "engine send_batch alone"
FLOORS = "transport + engine"
DURABILITY = {
    POSTBOX: "OK after PostgreSQL's commit (fsync {fsync}, synchronous_commit {sync})",
    RABBITMQ: "confirm once the persistent message is on disk (durable queue)",
    JETSTREAM: "ack before its periodic fsync (sync_interval, 2 min by default)",
}
# The processes of each part whose CPU a send turn charges, by name.
SERVER_PROCESSES = {
    RABBITMQ: frozenset({"beam.smp"}),
    JETSTREAM: frozenset({"nats-server"}),
    "PostgreSQL": DATABASE_PROCESSES,
}


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2):
            return True
    except OSError:
        return False


class CpuParts:
    """CPU seconds by part over a load's measured interval (a load.Window): this process
    (the clients), the postbox server, PostgreSQL, RabbitMQ and NATS."""

    def __init__(self, served: Served) -> None:
        self._served = served
        self._opened: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _sample(self) -> dict[str, float]:
        own = os.times()
        sample = {"client": own.user + own.system, POSTBOX: self._served.cpu().cpu_seconds}
        for part, names in SERVER_PROCESSES.items():
            sample[part] = seconds_of(names)
        return sample

    def open(self) -> None:
        self._opened = self._sample()

    def close(self) -> None:
        closed = self._sample()
        self.used = {part: closed[part] - self._opened[part] for part in closed}

    def per_message(self, load: Load) -> dict[str, float]:
        """Milliseconds of CPU each part spent per operation of the load."""
        per = 1000 / max(load.operations, 1)
        return {part: seconds * per for part, seconds in self.used.items()}


@dataclass
class Results:
    """One workload's figures by system, a list of its rounds each; CPU ms per message."""

    rounds: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, system: str, value: float) -> None:
        self.rounds.setdefault(system, []).append(value)

    def median(self, system: str) -> float:
        return statistics.median(self.rounds[system])

    def ratios(self, ours: str, theirs: str) -> list[float]:
        return [a / b for a, b in zip(self.rounds[ours], self.rounds[theirs], strict=True) if b > 0]

    def cpu_note(self, system: str) -> str:
        """Each part's median CPU per message over the rounds, the parts that used any."""
        turns = self.cpu.get(system, [])
        if not turns:
            return ""
        parts = {part: statistics.median(t[part] for t in turns) for part in turns[0]}
        shown = [f"{part} {ms:.2f}" for part, ms in parts.items() if ms >= 0.005]
        return f"{system} CPU ms/msg: " + ", ".join(shown)


class Broker(abc.ABC):
    """One system's side of every workload."""

    name = ""

    @abc.abstractmethod
    async def sends(self, seconds: float, window: CpuParts) -> Load:
        """CALLERS loops, each awaiting one durable send at a time."""

    @abc.abstractmethod
    async def consumes(self, total: int) -> Load:
        """`total` messages already waiting, then CONSUMERS consumers acking each one."""

    @abc.abstractmethod
    async def latency(self, rate: float, seconds: float, size: int) -> Load:
        """Send (from a process of its own) to delivery, at `rate` msgs/s."""

    @abc.abstractmethod
    async def fanout(self, seconds: float) -> Load:
        """CALLERS loops publishing, each message to SUBSCRIBERS subscribers."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Closes the system's connections."""


def _name(hint: str) -> str:
    return f"bench_{hint}_{uuid.uuid4().hex[:8]}"


# A consumer turn: it calls done(count) as it acks, and returns once `finished` is set.
Drain = Callable[[Callable[[int], bool], asyncio.Event], Awaitable[None]]


async def _drained(total: int, consume: Drain) -> Load:
    """Runs `consume`; the time from its start until it has acked all `total` messages."""
    acked = 0
    finished = asyncio.Event()
    started = time.perf_counter()
    ended = started

    def done(count: int) -> bool:
        nonlocal acked, ended
        acked += count
        if acked >= total and not finished.is_set():
            ended = time.perf_counter()
            finished.set()
        return finished.is_set()

    running = asyncio.ensure_future(consume(done, finished))
    try:
        await asyncio.wait_for(running, DRAIN_TIMEOUT)
    finally:
        running.cancel()
    if not finished.is_set():
        raise RuntimeError(f"the consumers ended after {acked} of {total} messages")
    return Load(total, ended - started)


@dataclass(frozen=True)
class Production:
    """What the producer process of a latency turn does: send to `destination` of `system`
    at `address`, `rate` msgs/s of `size` bytes for `seconds`."""

    system: str
    address: str
    destination: str
    rate: float
    seconds: float
    size: int


async def _stopwatched(
    production: Production, consume: Callable[[Stopwatch], Awaitable[None]]
) -> Load:
    """Latencies of messages a producer process sends while `consume` receives them."""
    watch = Stopwatch()
    consuming = asyncio.ensure_future(consume(watch))
    try:
        paced = await _produced(production)
        load, unseen = await watch.finish(paced.sent)
        if unseen:
            log.warning("%s: %d not arrived 10 s after the last send", production.system, unseen)
        return load
    finally:
        consuming.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consuming


class RabbitMQ(Broker):
    name = RABBITMQ

    def __init__(self, connection: aio_pika.abc.AbstractRobustConnection, body: bytes) -> None:
        self.connection = connection
        self.body = body
        self.channels: list[aio_pika.abc.AbstractChannel] = []

    @classmethod
    async def open(cls, body: bytes) -> RabbitMQ:
        broker = cls(await aio_pika.connect_robust(RABBITMQ_URL), body)
        for _ in range(CHANNELS):
            broker.channels.append(await broker.connection.channel(publisher_confirms=True))
        return broker

    def _message(self, body: bytes | None = None) -> aio_pika.Message:
        return aio_pika.Message(body or self.body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

    async def _publishers(
        self, seconds: float, exchange: str, routing_key: str, window: CpuParts | None = None
    ) -> Load:
        exchanges = itertools.cycle(
            [
                await channel.get_exchange(exchange) if exchange else channel.default_exchange
                for channel in self.channels
            ]
        )

        async def publish() -> int:
            await next(exchanges).publish(self._message(), routing_key=routing_key)
            return 1

        return await closed_loop(publish, clients=CALLERS, seconds=seconds, window=window)

    async def sends(self, seconds: float, window: CpuParts) -> Load:
        queue = await self.channels[0].declare_queue(_name("send"), durable=True)
        try:
            return await self._publishers(seconds, "", queue.name, window)
        finally:
            await queue.delete(if_unused=False, if_empty=False)

    async def consumes(self, total: int) -> Load:
        channel = self.channels[0]
        queue = await channel.declare_queue(_name("consume"), durable=True)
        try:
            # Filled with confirms pipelined, a thousand at a time: only the draining counts.
            exchange = channel.default_exchange
            for start in range(0, total, 1000):
                await asyncio.gather(
                    *(
                        exchange.publish(self._message(), routing_key=queue.name)
                        for _ in range(min(1000, total - start))
                    )
                )

            async def consume(done: Callable[[int], bool], finished: asyncio.Event) -> None:
                consumers = []
                for _ in range(CONSUMERS):
                    own = await self.connection.channel()
                    await own.set_qos(prefetch_count=PREFETCH)
                    mine = await own.declare_queue(queue.name, passive=True)

                    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                        await message.ack()
                        done(1)

                    consumers.append((own, await mine.consume(on_message)))
                try:
                    await finished.wait()
                finally:
                    for own, _ in consumers:
                        await own.close()

            return await _drained(total, consume)
        finally:
            await queue.delete(if_unused=False, if_empty=False)

    async def latency(self, rate: float, seconds: float, size: int) -> Load:
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.declare_queue(_name("latency"), durable=True)

        async def consume(watch: Stopwatch) -> None:
            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                watch.arrived(message.body)
                await message.ack()

            await queue.consume(on_message)
            await asyncio.Future()

        try:
            return await _stopwatched(
                Production(RABBITMQ, RABBITMQ_URL, queue.name, rate, seconds, size), consume
            )
        finally:
            await channel.close()  # its consumer first: a deleted queue cancels it, loudly
            await self.channels[0].queue_delete(queue.name)

    async def fanout(self, seconds: float) -> Load:
        channel = self.channels[0]
        exchange = await channel.declare_exchange(
            _name("fanout"), aio_pika.ExchangeType.TOPIC, durable=True
        )
        queues = []
        try:
            for _ in range(SUBSCRIBERS):
                queue = await channel.declare_queue(_name("subscriber"), durable=True)
                await queue.bind(exchange, routing_key="orders.#")
                queues.append(queue)
            return await self._publishers(seconds, exchange.name, "orders.created")
        finally:
            for queue in queues:
                await queue.delete(if_unused=False, if_empty=False)
            await exchange.delete()

    async def close(self) -> None:
        await self.connection.close()


class JetStream(Broker):
    name = JETSTREAM

    def __init__(self, connection: nats.NATS, body: bytes) -> None:
        self.connection = connection
        self.js = connection.jetstream()
        self.body = body

    @classmethod
    async def open(cls, body: bytes) -> JetStream:
        return cls(await nats.connect(NATS_URL), body)

    async def _stream(self, hint: str, retention: RetentionPolicy) -> str:
        name = _name(hint)
        await self.js.add_stream(
            StreamConfig(
                name=name,
                subjects=[f"{name}.>"],
                retention=retention,
                storage=StorageType.FILE,
            )
        )
        return name

    async def _publishers(self, seconds: float, subject: str, window: CpuParts | None) -> Load:
        async def publish() -> int:
            await self.js.publish(subject, self.body)
            return 1

        return await closed_loop(publish, clients=CALLERS, seconds=seconds, window=window)

    async def sends(self, seconds: float, window: CpuParts) -> Load:
        stream = await self._stream("send", RetentionPolicy.WORK_QUEUE)
        try:
            return await self._publishers(seconds, f"{stream}.orders", window)
        finally:
            await self.js.delete_stream(stream)

    async def consumes(self, total: int) -> Load:
        stream = await self._stream("consume", RetentionPolicy.WORK_QUEUE)
        try:
            subject = f"{stream}.orders"
            filled = 0

            async def fill() -> None:
                nonlocal filled
                while filled < total:
                    filled += 1
                    await self.js.publish(subject, self.body)

            await asyncio.gather(*(fill() for _ in range(CALLERS)))
            pulls = [
                await self.js.pull_subscribe(subject, durable="workers", stream=stream)
                for _ in range(CONSUMERS)
            ]

            async def consume(done: Callable[[int], bool], finished: asyncio.Event) -> None:
                async def worker(pull: Any) -> None:
                    while not finished.is_set():
                        try:
                            messages = await pull.fetch(PULL, timeout=1)
                        except asyncio.TimeoutError:  # nats-py raises either kind
                            continue
                        for message in messages:
                            await message.ack()
                            if done(1):
                                return

                await asyncio.gather(*(worker(pull) for pull in pulls))

            return await _drained(total, consume)
        finally:
            await self.js.delete_stream(stream)

    async def latency(self, rate: float, seconds: float, size: int) -> Load:
        stream = await self._stream("latency", RetentionPolicy.WORK_QUEUE)
        subject = f"{stream}.orders"
        pull = await self.js.pull_subscribe(subject, durable="latency", stream=stream)

        async def consume(watch: Stopwatch) -> None:
            while True:
                try:
                    messages = await pull.fetch(PULL, timeout=1)
                except asyncio.TimeoutError:  # nats-py raises either kind
                    continue
                for message in messages:
                    watch.arrived(message.data)
                    await message.ack()

        try:
            return await _stopwatched(
                Production(JETSTREAM, NATS_URL, subject, rate, seconds, size), consume
            )
        finally:
            await self.js.delete_stream(stream)

    async def fanout(self, seconds: float) -> Load:
        # A limits stream stores each message once; each of its consumers reads all of it.
        stream = await self._stream("fanout", RetentionPolicy.LIMITS)
        try:
            for i in range(SUBSCRIBERS):
                await self.js.add_consumer(stream, ConsumerConfig(durable_name=f"subscriber{i}"))
            return await self._publishers(seconds, f"{stream}.orders.created", None)
        finally:
            await self.js.delete_stream(stream)

    async def close(self) -> None:
        await self.connection.close()


class Postbox(Broker):
    name = POSTBOX

    def __init__(self, ctx: Context, served: Served, client: AsyncClient) -> None:
        self.ctx = ctx
        self.served = served
        self.client = client
        self.body = ctx.body()

    async def _queue(self, hint: str) -> str:
        return await self.ctx.new_queue(self.served.target, hint)

    async def _callers(
        self, seconds: float, send: Callable[[], Awaitable[object]], window: CpuParts | None
    ) -> Load:
        async def call() -> int:
            await send()
            return 1

        return await closed_loop(call, clients=CALLERS, seconds=seconds, window=window)

    async def sends(self, seconds: float, window: CpuParts) -> Load:
        queue = await self._queue("send")
        try:
            return await self._callers(seconds, lambda: self.client.send(queue, self.body), window)
        finally:
            await self.client.delete_queue(queue)

    async def unary_sends(self, seconds: float, window: CpuParts) -> Load:
        """As sends, but each a unary Send call: what AsyncClient.send was before SendStream."""
        queue = await self._queue("unary")
        request = pb.SendRequest(queue=queue, body=self.body)
        try:
            return await self._callers(
                seconds, lambda: self.client.call(self.client.messages.Send, request), window
            )
        finally:
            await self.client.delete_queue(queue)

    async def producer_sends(
        self, seconds: float, window: CpuParts, *, idempotent: bool = True, unary: bool = False
    ) -> Load:
        """64 callers awaiting Producer.send; `unary`: its batches as unary SendBatch calls,
        what the Producer sent before SendBatchStream."""
        queue = await self._queue("producer")
        client = self.client
        if unary:
            client = AsyncClient(self.served.target)
            client.batch_stream.supported = False  # as a server without the stream
        try:
            async with client.producer(queue, idempotent=idempotent) as producer:
                return await self._callers(seconds, lambda: producer.send(self.body), window)
        finally:
            await self.client.delete_queue(queue)
            if unary:
                await client.close()

    async def producer_floors(self, seconds: float) -> tuple[float, float]:
        """msgs/s of the Producer's transport ceiling and of the engine alone."""
        bare = AsyncClient(self.ctx.empty().target)
        async with bare, bare.producer("ceiling") as producer:
            ceiling = await self._callers(seconds, lambda: producer.send(self.body), None)
        queue = await self._queue("engine")
        try:
            engine = await engine_batches(self.ctx, queue, seconds, self.body)
        finally:
            await self.client.delete_queue(queue)
        return ceiling.rate, engine

    async def consumes(self, total: int) -> Load:
        queue = await self._queue("consume")
        try:
            entries = [pb.SendBatchEntry(body=self.body)] * 1000
            for start in range(0, total, 1000):
                await self.client.send_batch(queue, entries[: total - start])
            consumer = self.client.consumer(queue)

            async def consume(done: Callable[[int], bool], finished: asyncio.Event) -> None:
                async def handle(message: Any) -> None:
                    if done(1):
                        consumer.stop()

                await consumer.run(handle, concurrency=CONSUMERS)

            return await _drained(total, consume)
        finally:
            await self.client.delete_queue(queue)

    async def latency(self, rate: float, seconds: float, size: int) -> Load:
        queue = await self._queue("latency")
        consumer = self.client.consumer(queue, max_messages=100)

        async def consume(watch: Stopwatch) -> None:
            async def handle(message: Any) -> None:
                watch.arrived(message.body)

            await consumer.run(handle, concurrency=CONSUMERS)

        try:
            return await _stopwatched(
                Production(POSTBOX, self.served.target, queue, rate, seconds, size), consume
            )
        finally:
            await consumer.close()
            await self.client.delete_queue(queue)

    async def fanout(self, seconds: float) -> Load:
        topic = await fanout_topic(self.ctx, self.served.target)
        return await self._callers(seconds, lambda: self.client.publish(topic, self.body), None)

    async def stream_fanout(self, seconds: float) -> Load:
        topic = await _stream_topic(self.served.target)
        return await self._callers(seconds, lambda: self.client.publish(topic, self.body), None)

    async def close(self) -> None:
        await self.client.close()


class RawBatcher:
    """The floor of a batching producer on PostgreSQL, with nothing between the callers and
    the database: what callers send while batches are at the database waits and goes in
    one multi-row INSERT (asyncpg), committed with the run's fsync and synchronous_commit;
    at most `max_in_flight` batches at once, as the SDK's Producer sends them."""

    def __init__(self, pool: asyncpg.Pool, max_in_flight: int = 4) -> None:
        self.pool = pool
        self.max_in_flight = max_in_flight
        self.in_flight = 0
        self.waiting: list[tuple[bytes, asyncio.Future[int]]] = []
        self.scheduled = False
        self.tasks: set[asyncio.Task[None]] = set()

    def send(self, body: bytes) -> asyncio.Future[int]:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waiting.append((body, future))
        if self.in_flight < self.max_in_flight and not self.scheduled:
            # After this turn of the loop, so the sends made in it go together.
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)
        return future

    def _dispatch(self) -> None:
        self.scheduled = False
        if not self.waiting or self.in_flight >= self.max_in_flight:
            return
        batch, self.waiting = self.waiting[:1000], self.waiting[1000:]
        self.in_flight += 1
        task = asyncio.ensure_future(self._insert(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _insert(self, batch: list[tuple[bytes, asyncio.Future[int]]]) -> None:
        try:
            rows = await self.pool.fetch(raw.INSERT_MANY, [body for body, _ in batch])
            for (_, future), row in zip(batch, rows, strict=True):
                if not future.done():
                    future.set_result(row["id"])
        except Exception as error:  # every caller of the batch hears of it
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        finally:
            self.in_flight -= 1
            self._dispatch()


async def engine_batches(ctx: Context, queue: str, seconds: float, body: bytes) -> float:
    """msgs/s of SendBatch's statement alone: batches of CALLERS bodies, each with a
    request id, one at a time over one session, as the Producer's batches reach it."""
    send_batch = raw.engine_send_batch(queue, request_ids=True)
    pool = await ctx.db.pool(1)
    try:
        await send_batch(pool, [body] * CALLERS)  # warm: the session's first statement
        sent, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < seconds:
            sent += await send_batch(pool, [body] * CALLERS)
        return sent / elapsed
    finally:
        await pool.close()


async def raw_producer_sends(ctx: Context, seconds: float, body: bytes) -> Load:
    """64 callers awaiting RawBatcher.send: the Producer row's PostgreSQL floor."""
    pool = await ctx.db.pool(4)
    batcher = RawBatcher(pool)
    try:
        return await closed_loop(lambda: _one(batcher.send(body)), clients=CALLERS, seconds=seconds)
    finally:
        await asyncio.gather(*batcher.tasks, return_exceptions=True)
        await pool.close()
        await ctx.db.reset_raw()


async def _one(sent: Awaitable[object]) -> int:
    await sent
    return 1


def _produce(production: Production, out: Connection) -> None:
    """The producer process of a latency turn: sends through its system's client."""
    address, destination, size = production.address, production.destination, production.size

    async def pace(send: Callable[[int], Coroutine[Any, Any, object]]) -> Paced:
        return await fixed_rate(send, rate=production.rate, seconds=production.seconds)

    async def run() -> Paced:
        if production.system == RABBITMQ:
            connection = await aio_pika.connect_robust(address)
            channel = await connection.channel(publisher_confirms=True)
            try:
                return await pace(
                    lambda i: channel.default_exchange.publish(
                        aio_pika.Message(
                            _body(i, size), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                        ),
                        routing_key=destination,
                    )
                )
            finally:
                await connection.close()
        if production.system == JETSTREAM:
            client = await nats.connect(address)
            js = client.jetstream()
            try:
                return await pace(lambda i: js.publish(destination, _body(i, size)))
            finally:
                await client.close()
        async with AsyncClient(address) as postbox:
            return await pace(lambda i: postbox.send(destination, _body(i, size)))

    paced = asyncio.run(run())
    out.send((paced.sent, paced.seconds))


async def _produced(production: Production) -> Paced:
    """Runs a producer process to its end (spawned: no fork of a process with gRPC threads)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe(duplex=False)
    process = context.Process(target=_produce, args=(production, theirs), daemon=True)
    process.start()
    theirs.close()
    try:
        sent, elapsed = await asyncio.to_thread(ours.recv)
    except EOFError:
        raise RuntimeError(f"the {production.system} producer process died") from None
    finally:
        await asyncio.to_thread(process.join, 10)
        if process.is_alive():
            process.kill()
    return Paced(sent, elapsed)


async def _open_brokers(body: bytes) -> list[Broker]:
    brokers: list[Broker] = []
    for name, url, opener in (
        (RABBITMQ, RABBITMQ_URL, RabbitMQ.open),
        (JETSTREAM, NATS_URL, JetStream.open),
    ):
        if not _listening(url):
            print(f"note: {name} is not listening at {url}: left out of this run", file=sys.stderr)
            continue
        brokers.append(await opener(body))
    return brokers


async def _durability(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        fsync = await conn.fetchval("SHOW fsync")
        sync = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    return {**DURABILITY, POSTBOX: DURABILITY[POSTBOX].format(fsync=fsync, sync=sync)}


def _rows(
    label: str,
    unit: str,
    results: Results,
    rivals: list[str],
    *,
    ours: str = POSTBOX,
    targets: dict[str, tuple[str, Callable[[float], bool]]] | None = None,
    durability: dict[str, str] | None = None,
) -> list[Row]:
    """Ours against each rival: medians, and the rounds' ratios with their range."""
    rows = []
    for rival in rivals:
        ratios = results.ratios(ours, rival)
        ratio = statistics.median(ratios)
        note = (
            f"÷{rival} per round {ratio:.2f} ({min(ratios):.2f}-{max(ratios):.2f}), "
            f"{len(ratios)} rounds"
        )
        if durability:
            note += f"; {rival}: {durability[rival]}; postbox: {durability[POSTBOX]}"
        for system in (ours, rival):
            if cpu := results.cpu_note(system):
                note += f"; {cpu}"
        row = Row(label, unit, results.median(ours), results.median(rival), rival, note=note)
        if targets and rival in targets:
            row.target, check = targets[rival]
            row.met = check(ratio)
        rows.append(row)
    return rows


@scenario(
    "brokers",
    f"postbox beside RabbitMQ (aio-pika) and NATS JetStream (nats-py) on this machine: "
    f"{CALLERS} awaited senders, {CONSUMERS} acking consumers, the batching Producer, "
    f"latency at {RATE:,.0f} msgs/s, fan-out to {SUBSCRIBERS}; {ROUNDS} rounds in turns",
)
async def brokers(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    durability = await _durability(ctx.db.url)
    postbox = Postbox(ctx, served, AsyncClient(served.target))
    rivals = await _open_brokers(postbox.body)
    names = [rival.name for rival in rivals]
    systems: list[Broker] = [*rivals, postbox]
    turn = max(ctx.seconds / ROUNDS, 1.0)
    total = max(int(ctx.seconds * 2000), 2000)  # messages each consumer turn drains
    sends, producer, consumed, latency, fanout = (Results() for _ in range(5))
    try:
        for _ in range(ROUNDS):
            for system in systems:
                window = CpuParts(served)
                load = await system.sends(turn, window)
                sends.add(system.name, load.rate)
                sends.cpu.setdefault(system.name, []).append(window.per_message(load))
            window = CpuParts(served)
            load = await postbox.unary_sends(turn, window)
            sends.add(UNARY, load.rate)
            sends.cpu.setdefault(UNARY, []).append(window.per_message(load))
            window = CpuParts(served)
            load = await postbox.producer_sends(turn, window)
            producer.add(POSTBOX, load.rate)
            producer.cpu.setdefault(POSTBOX, []).append(window.per_message(load))
            load = await raw_producer_sends(ctx, turn, postbox.body)
            producer.add(RAW_POSTGRES, load.rate)
            window = CpuParts(served)
            load = await postbox.producer_sends(turn, window, unary=True)
            producer.add(UNARY_BATCHES, load.rate)
            producer.cpu.setdefault(UNARY_BATCHES, []).append(window.per_message(load))
            # Without a deduplication id per message, as JetStream's publishes are sent.
            window = CpuParts(served)
            load = await postbox.producer_sends(turn, window, idempotent=False)
            producer.add(NOT_IDEMPOTENT, load.rate)
            producer.cpu.setdefault(NOT_IDEMPOTENT, []).append(window.per_message(load))
            ceiling, engine = await postbox.producer_floors(turn)
            producer.add(TRANSPORT, ceiling)
            producer.add(ENGINE, engine)
            producer.add(FLOORS, 1 / (1 / ceiling + 1 / engine))
            if JETSTREAM in sends.rounds:  # the Producer against JetStream's own publish
                producer.add(JETSTREAM, sends.rounds[JETSTREAM][-1])
                producer.cpu.setdefault(JETSTREAM, []).append(sends.cpu[JETSTREAM][-1])
            for system in systems:
                consumed.add(system.name, (await system.consumes(total)).rate)
            for system in systems:
                load = await system.latency(RATE, turn + 1.0, ctx.body_size)
                latency.add(f"{system.name} p50", load.latency_ms(0.5))
                latency.add(f"{system.name} p99", load.latency_ms(0.99))
            # The floor of any queue on PostgreSQL that delivers only committed messages.
            load, _ = await raw_postgres_latency(ctx, turn + 1.0, RATE)
            latency.add(f"{RAW_POSTGRES} p50", load.latency_ms(0.5))
            latency.add(f"{RAW_POSTGRES} p99", load.latency_ms(0.99))
            for system in systems:
                fanout.add(system.name, (await system.fanout(turn)).rate)
            fanout.add("postbox stream topic", (await postbox.stream_fanout(turn)).rate)
    finally:
        for system in systems:
            await system.close()
    at_least = (">= 1.5x", lambda ratio: ratio >= 1.5)
    rows = _rows(
        f"send, {CALLERS} callers awaiting each",
        "msgs/s",
        sends,
        names,
        targets={RABBITMQ: at_least},
        durability=durability,
    )
    rows += _rows(f"send, {CALLERS} callers awaiting each", "msgs/s", sends, [UNARY])
    rows += _rows(
        f"Producer, {CALLERS} callers",
        "msgs/s",
        producer,
        [JETSTREAM] if JETSTREAM in names else [],
        targets={JETSTREAM: (">= 1.0x", lambda ratio: ratio >= 1.0)},
        durability=durability,
    )
    rows += _rows(f"Producer, {CALLERS} callers", "msgs/s", producer, [UNARY_BATCHES])
    # What bounds the Producer: raw PostgreSQL's batching producer; its floors apart, and
    # what a server adding nothing to them would make, with the Producer beside that.
    rows += _rows(f"Producer, {CALLERS} callers", "msgs/s", producer, [FLOORS])
    for floor in (RAW_POSTGRES, TRANSPORT, ENGINE, FLOORS):
        rows += _rows(
            f"Producer, {CALLERS} callers, {floor}",
            "msgs/s",
            producer,
            [JETSTREAM] if JETSTREAM in names else [],
            ours=floor,
        )
    rows += _rows(
        f"Producer, {CALLERS} callers, idempotent=False",
        "msgs/s",
        producer,
        [JETSTREAM] if JETSTREAM in names else [],
        ours=NOT_IDEMPOTENT,
        durability=durability,
    )
    rows += _rows(
        f"consume, {CONSUMERS} consumers acking each",
        "msgs/s",
        consumed,
        names,
        targets={RABBITMQ: at_least},
    )
    for percentile in ("p50", "p99"):
        rows += _rows(
            f"send->delivery {percentile} @{RATE:,.0f}/s",
            "ms",
            latency,
            [f"{name} {percentile}" for name in names],
            ours=f"{POSTBOX} {percentile}",
            targets={f"{RABBITMQ} p50": ("<= 1.0x", lambda ratio: ratio <= 1.0)},
        )
        rows += _rows(
            f"send->delivery {percentile} @{RATE:,.0f}/s",
            "ms",
            latency,
            [f"{RAW_POSTGRES} {percentile}"],
            ours=f"{POSTBOX} {percentile}",
        )
        # What RabbitMQ would be beside even a bare PostgreSQL queue: it hands a message
        # to its consumer before the message is on disk; a PostgreSQL queue only after
        # the commit, and its consumer then claims it in a transaction of its own.
        rows += _rows(
            f"send->delivery {percentile} @{RATE:,.0f}/s, raw PostgreSQL",
            "ms",
            latency,
            [f"{name} {percentile}" for name in names if name == RABBITMQ],
            ours=f"{RAW_POSTGRES} {percentile}",
        )
    rows += _rows(f"fan-out to {SUBSCRIBERS}, topic", "msgs/s", fanout, names)
    rows += _rows(
        f"fan-out to {SUBSCRIBERS}, stream topic",
        "msgs/s",
        fanout,
        names,
        ours="postbox stream topic",
    )
    return rows
