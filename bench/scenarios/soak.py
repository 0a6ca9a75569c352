"""The soak: an hour of mixed load while the server's database sessions and the server itself
are killed on a timer. Does anything acknowledged go missing, is anything delivered twice
within a live lease, and does the server's memory or file-descriptor count creep?

The load, each at a fixed rate: Send(1) and SendBatch(10) into a queue, Publish into a topic
with a queue subscription, Publish into a stream topic read by a consumer group, and an
interval schedule into a queue of its own. Consumers receive and delete (streams: read and
ack) as they would in production, reconnecting after every failure.

The faults: every `backend_every` seconds one of the server's PostgreSQL sessions is ended
with pg_terminate_backend, and every `server_every` seconds the server gets SIGKILL and is
started again on the same port. For the full hour (`--soak-seconds 3600`, the default) that
is once a minute and once every ten; shorter runs scale both down.

What it checks:
* lost: messages whose send or publish returned OK but which no consumer ever saw, after
  a drain at the end;
* double deliveries: a message delivered again before its previous delivery's lease
  (visibility timeout) had run out;
* the schedule fired as many messages as its fire_count says, no more;
* the server's RSS and open file descriptors at the end of each life against the same
  process after its warm-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
import grpc
import psutil
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import (
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import schedule_service_pb2 as schpb
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb

from bench.processes import Served
from bench.runner import Context, Row, message_stub, scenario

# A lease the consumers keep: a message seen again sooner than this after its previous
# delivery was delivered twice within a live lease. SLACK covers the distance between the
# consumer's clock reading and the server's claim (both sides of one loopback call).
LEASE_SECONDS = 30
SLACK_SECONDS = 2.0
SEND_RATE = 40.0  # Send(1) calls a second
BATCH_RATE = 4.0  # SendBatch(10) calls a second
PUBLISH_RATE = 20.0
STREAM_RATE = 20.0
SCHEDULE_EVERY = 5  # seconds between the schedule's fires
CONSUMERS = 3
SAMPLE_EVERY = 10.0  # seconds between samples of the server's RSS and descriptors
DRAIN_SECONDS = 120.0  # after the load, how long consumers may take to see the rest
# A median that moves by one descriptor between halves is noise (a socket of a call in
# progress); a leak of one per call or per reconnect moves it by hundreds in an hour.
FD_NOISE = 1
EDGE = 3  # samples at each end of a server's life that its growth compares
CALL_TIMEOUT = 10.0  # each call's deadline: a call caught by a kill fails, it does not hang


@dataclass
class Ledger:
    """What the clients know: which sends were acknowledged, and each message's deliveries."""

    acknowledged: set[str] = field(default_factory=set)
    delivered: dict[str, float] = field(default_factory=dict)  # body -> last delivery time
    double_deliveries: list[tuple[str, float]] = field(default_factory=list)
    deliveries: int = 0
    send_failures: int = 0
    consume_failures: int = 0

    def saw(self, body: str) -> None:
        now = time.monotonic()
        previous = self.delivered.get(body)
        if previous is not None and now - previous < LEASE_SECONDS - SLACK_SECONDS:
            self.double_deliveries.append((body, now - previous))
        self.delivered[body] = now
        self.deliveries += 1

    @property
    def lost(self) -> set[str]:
        return self.acknowledged - self.delivered.keys()


@dataclass
class Life:
    """One server process's samples: (seconds since start, RSS bytes, open descriptors)."""

    pid: int
    samples: list[tuple[float, int, int]] = field(default_factory=list)

    def growth(self, warm_up: float) -> tuple[float, float] | None:
        """RSS growth (a fraction) from just after warm-up to the end of the life, and the
        change in open descriptors from the first half of the life after warm-up to the
        second; None for a life too short to tell. RSS compares EDGE samples at each end, by
        their medians. Descriptors compare halves by their medians: calls in progress hold
        sockets for a moment, and a sample taken as the process dies sees almost none, so
        single samples swing by a few either way while a leak moves the whole second half."""
        warm = [s for s in self.samples if s[0] >= warm_up]
        if len(warm) < 2 * EDGE:
            return None
        first, last = warm[:EDGE], warm[-EDGE:]
        rss_growth = statistics.median(s[1] for s in last) / statistics.median(s[1] for s in first)
        half = len(warm) // 2
        fds_growth = statistics.median(s[2] for s in warm[half:]) - statistics.median(
            s[2] for s in warm[:half]
        )
        return rss_growth - 1, fds_growth


def _tree(pid: int) -> tuple[int, int]:
    """RSS and open descriptors of a process and its children."""
    parent = psutil.Process(pid)
    rss = fds = 0
    for process in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            rss += process.memory_info().rss
            fds += process.num_fds()
    return rss, fds


async def _retrying(
    ledger: Ledger, step: Callable[[], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Runs step until stop, as a production consumer does: a failure (a killed server or
    session) is counted, then the loop tries again."""
    while not stop.is_set():
        try:
            await step()
        except grpc.RpcError:
            ledger.consume_failures += 1
            await asyncio.sleep(0.2)


async def _paced(rate: float, call: Callable[[int], Awaitable[None]], stop: asyncio.Event) -> None:
    """Starts call(i) every 1/rate seconds until stop, without waiting for earlier ones."""
    loop = asyncio.get_running_loop()
    start, i = loop.time(), 0
    tasks: set[asyncio.Task[None]] = set()
    while not stop.is_set():
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) < 256:
            task = asyncio.ensure_future(call(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        i += 1
    if tasks:
        await asyncio.gather(*tasks)


@scenario(
    "soak",
    "an hour of mixed load while server sessions (each minute) and the server (every ten) "
    "are killed: lost, double-delivered, RSS and descriptor growth (--soak-seconds)",
)
async def run(ctx: Context) -> list[Row]:
    seconds = ctx.soak_seconds
    server_every = min(600.0, seconds / 6)
    backend_every = min(60.0, seconds / 60)
    warm_up = min(120.0, server_every / 4)
    suffix = uuid.uuid4().hex[:8]
    queue, fanout_queue, schedule_queue = (f"soak_{kind}_{suffix}" for kind in ("q", "fan", "sch"))
    topic, stream_topic, group = f"soak_t_{suffix}", f"soak_s_{suffix}", "soakers"
    schedule = f"soak_every_{suffix}"

    served = Served.postbox(ctx.db.url, name="soak")
    served.__enter__()
    lives = [Life(served.process.pid)]  # type: ignore[union-attr]
    ledger = Ledger()
    stop_load, stop_consumers = asyncio.Event(), asyncio.Event()
    started = life_started = time.monotonic()
    server_kills = backend_kills = 0
    monitor = await asyncpg.connect(ctx.db.url)
    channel = grpc.aio.insecure_channel(served.target)
    try:
        await _create(
            channel, queue, fanout_queue, schedule_queue, topic, stream_topic, group, schedule
        )
        messages = message_stub(channel)
        streams = stream_service_pb2_grpc.StreamServiceStub(channel)
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)

        async def send(i: int) -> None:
            body = f"q:{i}"
            try:
                await messages.Send(
                    mpb.SendRequest(queue=queue, body=body.encode()), timeout=CALL_TIMEOUT
                )
            except grpc.RpcError:
                ledger.send_failures += 1
            else:
                ledger.acknowledged.add(body)

        async def send_batch(i: int) -> None:
            bodies = [f"b:{i}:{j}" for j in range(10)]
            entries = [mpb.SendBatchEntry(body=b.encode()) for b in bodies]
            try:
                await messages.SendBatch(
                    mpb.SendBatchRequest(queue=queue, entries=entries), timeout=CALL_TIMEOUT
                )
            except grpc.RpcError:
                ledger.send_failures += 1
            else:
                ledger.acknowledged.update(bodies)

        async def publish(i: int) -> None:
            body = f"t:{i}"
            try:
                await topics.Publish(
                    tpb.PublishRequest(topic=topic, body=body.encode()), timeout=CALL_TIMEOUT
                )
            except grpc.RpcError:
                ledger.send_failures += 1
            else:
                ledger.acknowledged.add(body)

        async def publish_stream(i: int) -> None:
            body = f"s:{i}"
            try:
                await topics.Publish(
                    tpb.PublishRequest(topic=stream_topic, body=body.encode()), timeout=CALL_TIMEOUT
                )
            except grpc.RpcError:
                ledger.send_failures += 1
            else:
                ledger.acknowledged.add(body)

        def receiver(name: str) -> Callable[[], Awaitable[None]]:
            async def step() -> None:
                request = mpb.ReceiveRequest(queue=name, max_messages=10)
                request.visibility_timeout.FromSeconds(LEASE_SECONDS)
                request.wait_time.FromSeconds(1)
                receipts = []
                async for response in messages.Receive(request, timeout=CALL_TIMEOUT):
                    for message in response.messages:
                        body = message.body.decode()
                        # A schedule's fires share one body: each message id is its own fire.
                        ledger.saw(f"sch:{message.message_id}" if name == schedule_queue else body)
                        receipts.append(message.receipt)
                if receipts:
                    await messages.DeleteBatch(
                        mpb.DeleteBatchRequest(queue=name, receipts=receipts), timeout=CALL_TIMEOUT
                    )

            return step

        async def read_stream() -> None:
            request = spb.ReadStreamRequest(
                topic=stream_topic, consumer_group=group, max_messages=50
            )
            request.wait_time.FromSeconds(1)
            request.lease_duration.FromSeconds(LEASE_SECONDS)
            read = await streams.ReadStream(request, timeout=CALL_TIMEOUT)
            for message in read.messages:
                ledger.saw(message.body.decode())
            if read.batch:
                await streams.AckStream(
                    spb.AckStreamRequest(
                        topic=stream_topic, consumer_group=group, batch=read.batch
                    ),
                    timeout=CALL_TIMEOUT,
                )

        async def sample() -> None:
            while not stop_consumers.is_set():
                process = served.process
                if process is not None and process.poll() is None:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        rss, fds = _tree(process.pid)
                        life = lives[-1]
                        life.samples.append((time.monotonic() - life_started, rss, fds))
                await asyncio.sleep(SAMPLE_EVERY)

        async def faults() -> None:
            nonlocal server_kills, backend_kills, life_started
            next_backend, next_server = backend_every, server_every
            while not stop_load.is_set():
                elapsed = time.monotonic() - started
                if elapsed >= next_server:
                    next_server += server_every
                    assert served.process is not None
                    served.process.send_signal(signal.SIGKILL)
                    served.process.wait()
                    server_kills += 1
                    # Same command, same port: clients reconnect to the address they know.
                    await asyncio.to_thread(served.__enter__)
                    life_started = time.monotonic()
                    lives.append(Life(served.process.pid))
                elif elapsed >= next_backend:
                    next_backend += backend_every
                    ended = await monitor.fetchval(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND application_name LIKE 'postbox/%' "
                        "ORDER BY random() LIMIT 1"
                    )
                    backend_kills += bool(ended)
                await asyncio.sleep(0.5)

        consumers = [
            *(_retrying(ledger, receiver(queue), stop_consumers) for _ in range(CONSUMERS)),
            _retrying(ledger, receiver(fanout_queue), stop_consumers),
            _retrying(ledger, receiver(schedule_queue), stop_consumers),
            _retrying(ledger, read_stream, stop_consumers),
        ]
        consuming = [asyncio.ensure_future(c) for c in consumers]
        fault_task = asyncio.ensure_future(faults())
        sampler = asyncio.ensure_future(sample())
        producing = [
            asyncio.ensure_future(_paced(rate, call, stop_load))
            for rate, call in (
                (SEND_RATE, send),
                (BATCH_RATE, send_batch),
                (PUBLISH_RATE, publish),
                (STREAM_RATE, publish_stream),
            )
        ]
        await asyncio.sleep(seconds)
        stop_load.set()
        await asyncio.gather(*producing, fault_task)
        await _pause_schedule(channel, schedule)
        drain_deadline = time.monotonic() + DRAIN_SECONDS
        await _until(lambda: not ledger.lost, drain_deadline)
        fires = await _fire_count(channel, schedule)
        # The schedule's last fires may still be on their way to a consumer.
        await _until(lambda: _schedule_messages(ledger) >= fires, drain_deadline)
        stop_consumers.set()
        await asyncio.gather(*consuming, sampler)
    finally:
        stop_load.set()
        stop_consumers.set()
        await channel.close()
        await monitor.close()
        served.__exit__(None, None, None)

    fired = _schedule_messages(ledger)
    growths = [g for g in (life.growth(warm_up) for life in lives) if g is not None]
    rss_growth = max((g[0] for g in growths), default=float("nan"))
    fd_growth = max((g[1] for g in growths), default=0)
    summary = {
        "seconds": seconds,
        "server_kills": server_kills,
        "backend_kills": backend_kills,
        "acknowledged": len(ledger.acknowledged),
        "lost": len(ledger.lost),
        "lost_examples": sorted(ledger.lost)[:10],
        "double_deliveries": len(ledger.double_deliveries),
        "double_examples": ledger.double_deliveries[:10],
        "deliveries": ledger.deliveries,
        "send_failures": ledger.send_failures,
        "consume_failures": ledger.consume_failures,
        "schedule_fire_count": fires,
        "schedule_messages": fired,
        "lives": [{"pid": life.pid, "samples": life.samples} for life in lives],
    }
    ctx.extra["soak"] = summary
    print(
        f"    soak {json.dumps({k: v for k, v in summary.items() if k != 'lives'})}",
        file=sys.stderr,
    )
    faults_note = f"{seconds:.0f} s, {server_kills} server SIGKILLs, {backend_kills} sessions ended"
    return [
        Row("soak: acknowledged messages lost", "msgs", len(ledger.lost), target="0",
            met=not ledger.lost, note=f"{len(ledger.acknowledged):,} acknowledged; {faults_note}"),
        Row("soak: delivered twice within a lease", "msgs", len(ledger.double_deliveries),
            target="0", met=not ledger.double_deliveries, note=f"{ledger.deliveries:,} deliveries"),
        Row("soak: schedule messages beyond its fires", "msgs", fired - fires, target="0",
            met=fired == fires, note=f"{fires} fires"),
        Row("soak: server RSS growth after warm-up", "%", rss_growth * 100, target="< 10",
            met=rss_growth < 0.10,
            note=f"worst of {len(growths)} server lives, warm-up {warm_up:.0f} s"),
        Row("soak: open descriptors growth after warm-up", "fds", fd_growth, target="<= 1",
            met=fd_growth <= FD_NOISE, note=f"worst of {len(growths)} server lives"),
    ]  # fmt: skip


def _schedule_messages(ledger: Ledger) -> int:
    return sum(key.startswith("sch:") for key in ledger.delivered)


async def _until(done: Callable[[], bool], deadline: float) -> None:
    """Waits, polling once a second, until done() or the monotonic deadline: what it waits
    for happens in other tasks' consumers, which signal nothing."""
    while not done() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(1)


async def _create(
    channel: grpc.aio.Channel,
    queue: str,
    fanout_queue: str,
    schedule_queue: str,
    topic: str,
    stream_topic: str,
    group: str,
    schedule: str,
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    for name in (queue, fanout_queue, schedule_queue):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    await topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    await topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name=f"{topic}_to_queue", topic=topic, queue=fanout_queue)
        )
    )
    retained = tpb.Topic(name=stream_topic)
    retained.stream_retention.FromSeconds(3 * 3600)
    await topics.CreateTopic(tpb.CreateTopicRequest(topic=retained))
    await stream_service_pb2_grpc.StreamServiceStub(channel).CreateConsumerGroup(
        spb.CreateConsumerGroupRequest(
            consumer_group=spb.ConsumerGroup(topic=stream_topic, name=group)
        )
    )
    every = schpb.Schedule(
        name=schedule, body=b"tick", target=schpb.ScheduleTarget(queue=schedule_queue)
    )
    every.interval.FromSeconds(SCHEDULE_EVERY)
    await schedule_service_pb2_grpc.ScheduleServiceStub(channel).CreateSchedule(
        schpb.CreateScheduleRequest(schedule=every)
    )


async def _pause_schedule(channel: grpc.aio.Channel, schedule: str) -> None:
    await schedule_service_pb2_grpc.ScheduleServiceStub(channel).PauseSchedule(
        schpb.PauseScheduleRequest(name=schedule), timeout=CALL_TIMEOUT
    )


async def _fire_count(channel: grpc.aio.Channel, schedule: str) -> int:
    reply = await schedule_service_pb2_grpc.ScheduleServiceStub(channel).GetSchedule(
        schpb.GetScheduleRequest(name=schedule), timeout=CALL_TIMEOUT
    )
    return reply.schedule.fire_count
