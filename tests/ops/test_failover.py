"""Fail over from a primary to its synchronous standby in the middle of a stream of sends.

The test builds its own pair from Debian's PostgreSQL 15 (initdb, pg_basebackup -R,
fsync on): the primary waits for the standby on every commit
(synchronous_standby_names = '*'), so a message is acknowledged only once it is on
both. The server is given both hosts with target_session_attrs=read-write, as an
operator would. The old primary dies (pg_ctl stop -m immediate: no shutdown
checkpoint, connections cut), nothing answers as a primary until the standby is
promoted, then the standby is the primary.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import (
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from receiver import Receiver
from support import ServerProcess, eventually, seconds

from bench.pg_cluster import PG_BIN, Pair, Postgres, scratch_directory

pytestmark = pytest.mark.skipif(
    not (PG_BIN / "initdb").exists(),
    reason="Debian's postgresql-15 is not installed (.ci/run installs it)",
)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


@pytest.fixture
def pair() -> Iterator[Pair]:
    pair = Pair.build(scratch_directory("postbox-failover-"))
    try:
        yield pair
    finally:
        pair.remove()


async def until(check, timeout: float, what: str):
    """Waits on the event loop until `check()` (or what it returns, when awaitable) holds,
    and returns it; UNAVAILABLE counts as not yet; fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                result = await result
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            result = None  # asked while no primary answers
        if result:
            return result
        assert time.monotonic() < deadline, f"not after {timeout} s: {what}"
        await asyncio.sleep(0.02)


async def health(stub: health_pb2_grpc.HealthStub) -> int:
    try:
        return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)).status
    except grpc.aio.AioRpcError:
        return -1


async def wait_for_health(stub: health_pb2_grpc.HealthStub, status: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await health(stub) != status:
        assert time.monotonic() < deadline, f"health not {status} after {timeout} s"
        await asyncio.sleep(0.05)


@dataclass
class Senders:
    """Send calls in a loop, each retried until acknowledged; what was refused, and how."""

    messages: message_service_pb2_grpc.MessageServiceStub
    queue: str
    acknowledged: set[int] = field(default_factory=set)
    refusals: list[tuple[float, grpc.StatusCode, str]] = field(default_factory=list)
    last_ack: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _numbers: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))

    async def run(self) -> None:
        while not self.stop.is_set():
            number = next(self._numbers)
            request = pb.SendRequest(queue=self.queue, body=str(number).encode())
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    # 10 s: far beyond a send, so a call that hangs through the switch fails.
                    await self.messages.Send(request, timeout=10)
                except grpc.aio.AioRpcError as error:
                    self.refusals.append(
                        (time.monotonic() - started, error.code(), error.details() or "")
                    )
                    await asyncio.sleep(0.05)
                    continue
                self.acknowledged.add(number)
                self.last_ack = time.monotonic()
                break


async def receive_all(messages, queue: str, **fields) -> list[pb.Message]:
    """Receives until the queue has nothing visible."""
    received: list[pb.Message] = []
    while batch := await receive_once(messages, queue, **fields):
        received += batch
    return received


async def receive_once(messages, queue: str, **fields) -> list[pb.Message]:
    request = pb.ReceiveRequest(queue=queue, max_messages=1000, wait_time={}, **fields)
    return [m async for r in messages.Receive(request) for m in r.messages]


async def visible(queues, queue: str) -> int:
    reply = await queues.GetQueue(qpb.GetQueueRequest(name=queue))
    return reply.queue.stats.visible_messages


async def test_failover_to_synchronous_standby_mid_stream(pair):
    server = ServerProcess(
        pair.url(), "--safety-poll-interval", "1", "--require-synchronous-commit"
    ).start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _fail_over_under_load(pair, channel)
    finally:
        server.stop()
    log = server.log()
    assert "NOT_SERVING" in log
    assert "internal error" not in log, log


async def _fail_over_under_load(pair: Pair, channel: grpc.aio.Channel) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    for name in ("load", "waiting", "streamed"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))

    # Long polls that wait on an empty queue through the whole failover.
    waiting = [
        messages.Receive(pb.ReceiveRequest(queue="waiting", mode=pb.RECEIVE_MODE_CONTINUOUS))
        for _ in range(3)
    ]
    first_batches = [asyncio.ensure_future(call.read()) for call in waiting]

    # A StreamingReceive consumer that deletes what it gets, fed all along. A delete
    # lost in the switch brings its message back after the 2 s visibility timeout.
    consumed: set[int] = set()
    stream = messages.StreamingReceive()
    await stream.write(
        pb.StreamingReceiveRequest(queue="streamed", max_messages=10, visibility_timeout=seconds(2))
    )

    async def consume() -> None:
        while (response := await stream.read()) is not grpc.aio.EOF:
            if response.HasField("batch"):
                consumed.update(int(m.body) for m in response.batch.messages)
                receipts = [m.receipt for m in response.batch.messages]
                await stream.write(pb.StreamingReceiveRequest(delete_receipts=receipts))
        raise AssertionError(f"the StreamingReceive ended: {await stream.code()}")

    consumer = asyncio.ensure_future(consume())
    load = Senders(messages, "load")
    fed = Senders(messages, "streamed")
    senders = [asyncio.ensure_future(load.run()) for _ in range(8)]
    senders.append(asyncio.ensure_future(fed.run()))
    await until(lambda: len(load.acknowledged) >= 200, 30, "sends before the failover")
    assert not load.refusals, load.refusals[:3]

    await asyncio.to_thread(pair.primary.stop, "immediate")
    await wait_for_health(checks, NOT_SERVING, timeout=10)  # no primary answers
    refused_before_promotion = len(load.refusals)
    await asyncio.to_thread(pair.standby.promote)
    promoted_at = time.monotonic()
    acknowledged_at_promotion = len(load.acknowledged)
    await until(lambda: len(load.acknowledged) > acknowledged_at_promotion + 50, 30, "resumed")
    resumed_after = load.last_ack - promoted_at  # an upper bound: 50 sends after the first
    await wait_for_health(checks, SERVING, timeout=10)
    load.stop.set()
    fed.stop.set()
    await asyncio.gather(*senders)

    print(
        f"{len(load.acknowledged)} acknowledged, {len(load.refusals)} refused "
        f"({refused_before_promotion} before promotion), 50 more sends "
        f"{resumed_after:.2f} s after promotion"
    )
    assert resumed_after < 10, "traffic should resume within 10 s of the promotion"
    assert refused_before_promotion, "no Send was refused while no primary answered"
    for _took, code, details in load.refusals + fed.refusals:
        assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
        assert "failing over" in details, details
    durations = sorted(took for took, _, _ in load.refusals)
    # Fast: no call waits for the database to come back (1 s: far above a refusal's
    # milliseconds, far below the 10 s call deadline).
    assert durations[len(durations) // 2] < 1.0, durations

    # The long polls are still open, and deliver what is sent now.
    assert not any(batch.done() for batch in first_batches), "a waiting stream ended"
    await messages.Send(pb.SendRequest(queue="waiting", body=b"after the failover"))
    done, _ = await asyncio.wait(first_batches, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no waiting stream delivered after the failover"
    assert next(iter(done)).result().messages[0].body == b"after the failover"
    for call in waiting:
        call.cancel()

    # The consumer carries on: every acknowledged message reaches it.
    await until(
        lambda: consumer.done() or fed.acknowledged <= consumed,
        20,
        "the StreamingReceive consumer got every acknowledged message",
    )
    if consumer.done():
        consumer.result()  # raises what ended it
    consumer.cancel()
    stream.cancel()
    await asyncio.gather(consumer, *first_batches, return_exceptions=True)

    # No acknowledged message is lost.
    received = {int(m.body) for m in await receive_all(messages, "load")}
    assert load.acknowledged <= received, f"lost {sorted(load.acknowledged - received)[:5]}"


async def test_workers_carry_on_across_a_failover(pair):
    """A redrive task, a schedule and webhook deliveries, each under way when the primary dies.

    Each must finish its work once the standby is promoted, and do it once: the
    redrive moves every dead letter exactly once, the schedule fires each slot once
    (one message per slot, as many as its fire count), and every acknowledged
    publish reaches the webhook.
    """
    receiver = Receiver().start()
    server = ServerProcess(
        pair.url(), "--safety-poll-interval", "1", "--maintenance-interval", "0.2"
    ).start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _workers_across_failover(pair, channel, receiver)
    finally:
        server.stop()
        receiver.stop()
    assert "internal error" not in server.log(), server.log()


DEAD_LETTERS = 600
REDRIVE_RATE = 150  # per second: the move spans the failover


async def _is(value, expected) -> bool:
    return await value == expected


async def _workers_across_failover(pair: Pair, channel: grpc.aio.Channel, receiver) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)

    # Dead letters: received once each, they dead-letter on the next receive.
    for name in ("dead", "redriven", "ticks"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    policy = qpb.DeadLetterPolicy(dead_letter_queue="dead", max_receive_count=1)
    await queues.CreateQueue(
        qpb.CreateQueueRequest(queue=qpb.Queue(name="failing", dead_letter_policy=policy))
    )
    entries = [pb.SendBatchEntry(body=str(i).encode()) for i in range(DEAD_LETTERS)]
    await messages.SendBatch(pb.SendBatchRequest(queue="failing", entries=entries))
    zero = seconds(0)
    while await receive_once(messages, "failing", visibility_timeout=zero):
        pass  # the first pass receives, the next dead-letters
    await until(lambda: _is(visible(queues, "dead"), DEAD_LETTERS), 30, "dead letters")

    await topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name="events")))
    endpoint = tpb.WebhookEndpoint(
        url=receiver.url("/hook"),
        minimum_backoff=seconds(0.2),
        maximum_backoff=seconds(0.4),
        timeout=seconds(2),
    )
    await topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="hook", topic="events", webhook=endpoint)
        )
    )
    await schedules.CreateSchedule(
        spb.CreateScheduleRequest(
            schedule=spb.Schedule(
                name="tick", target=spb.ScheduleTarget(queue="ticks"), interval=seconds(1)
            )
        )
    )

    published: set[str] = set()
    stop = asyncio.Event()

    async def publisher() -> None:
        while not stop.is_set():
            try:
                reply = await topics.Publish(
                    tpb.PublishRequest(topic="events", body=b"e"), timeout=10
                )
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(0.05)
                continue
            published.add(reply.publish_id)
            await asyncio.sleep(0.02)

    async def redrive_task() -> qpb.RedriveTask:
        reply = await queues.ListRedriveTasks(qpb.ListRedriveTasksRequest(dead_letter_queue="dead"))
        return reply.tasks[0]

    async def fire_count() -> int:
        reply = await schedules.GetSchedule(spb.GetScheduleRequest(name="tick"))
        return reply.schedule.fire_count

    publishing = asyncio.ensure_future(publisher())

    async def moved() -> int:
        return (await redrive_task()).moved_messages

    async def completed() -> bool:
        return (await redrive_task()).state == qpb.RedriveTask.STATE_COMPLETED

    async def fired_since(count: int) -> bool:
        return await fire_count() > count

    await until(lambda: len(published) >= 20, 30, "publishes before the failover")
    await until(lambda: fired_since(0), 30, "the schedule fired")
    # The redrive last, so that it is surely under way and far from done at the failover.
    await queues.RedriveMessages(
        qpb.RedriveMessagesRequest(
            dead_letter_queue="dead", destination="redriven", max_messages_per_second=REDRIVE_RATE
        )
    )
    await until(moved, 30, "the redrive under way")
    assert await moved() < DEAD_LETTERS, "the redrive finished before the failover"

    await asyncio.to_thread(pair.fail_over)
    promoted_fires = await until(fire_count, 30, "the schedule readable after the failover")
    published_at = len(published)
    await until(completed, 60, "the redrive completed")
    await until(lambda: len(published) >= published_at + 20, 30, "publishes after it")
    await until(lambda: fired_since(promoted_fires + 1), 30, "fires after it")
    await schedules.PauseSchedule(spb.PauseScheduleRequest(name="tick"))
    stop.set()
    await publishing

    # The redrive moved each dead letter once.
    task = await redrive_task()
    assert task.state == qpb.RedriveTask.STATE_COMPLETED
    assert task.moved_messages == DEAD_LETTERS
    bodies = [m.body for m in await receive_all(messages, "redriven")]
    assert sorted(bodies) == sorted(str(i).encode() for i in range(DEAD_LETTERS))
    assert await visible(queues, "dead") == 0

    # One message per slot, as many as fires counted (the schedule is paused now).
    ticks = await receive_all(messages, "ticks")
    slots = [m.deduplication_id for m in ticks]
    assert len(set(slots)) == len(slots), slots
    assert len(ticks) == await fire_count()

    # Every acknowledged publish reached the webhook (at least once).
    await asyncio.to_thread(
        eventually,
        lambda: published <= {r.document["message"]["messageId"] for r in receiver.on("/hook")},
        30,
        "every acknowledged publish delivered",
    )


@pytest.fixture
def lone_primary() -> Iterator[Postgres]:
    directory = scratch_directory("postbox-silent-host-")
    postgres = Postgres(directory / "data").initdb()
    try:
        yield postgres.start()
    finally:
        postgres.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_first_host_that_never_answers_is_passed_over(lone_primary):
    """A host gone without a TCP reset (powered off, cut off) holds a connection attempt
    until it times out: asyncpg's one timeout for all hosts would never reach the next
    host. Here the first host accepts TCP connections and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        hosts = f"127.0.0.1:{silent.getsockname()[1]},{lone_primary.address}"
        url = f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
        started = time.monotonic()
        # 40 s: the silent host costs HOST_TIMEOUT (5 s) once, not asyncpg's 60 s each time.
        server = ServerProcess(url).start(timeout=40)
        try:
            print(f"serving {time.monotonic() - started:.1f} s after the start")
            with grpc.insecure_channel(server.target) as channel:
                queues = queue_service_pb2_grpc.QueueServiceStub(channel)
                messages = message_service_pb2_grpc.MessageServiceStub(channel)
                queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="past_silence")))
                messages.Send(pb.SendRequest(queue="past_silence", body=b"x"), timeout=10)
        finally:
            server.stop()
