"""Delayed publishes into a stream topic: Publish with stream_delay keeps the message out
of the log, unseen by every consumer group and out of their lag, until it is due; then
a read of the topic, a tick or a maintenance worker appends it, once, and it sorts after
what was published before it became due."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from support import create_queue, error_of, seconds, unique_name, until

from postbox_server.db.engine import Engine
from postbox_server.workers.maintenance import MaintenanceWorker

FINAL = """
SELECT coalesce(bool_and(l.tx < pg_snapshot_xmin(pg_current_snapshot())), true)
FROM postbox.stream_log l JOIN postbox.topics t ON t.id = l.topic_id WHERE t.name = $1
"""
# The topic's delayed messages fall due now (rather than after a wait).
DUE_NOW = """
UPDATE postbox.stream_delayed d SET deliver_at = now() - interval '1 second'
FROM postbox.topics t WHERE t.id = d.topic_id AND t.name = $1
"""


@pytest.fixture
def stream(topics, streams, request: pytest.FixtureRequest) -> str:
    """A stream topic with a group `g` reading from the earliest."""
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    group = spb.ConsumerGroup(topic=name, name="g")
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return name


def publish(topics, topic: str, body: bytes, delay: float | None = None, **fields):
    request = tpb.PublishRequest(topic=topic, body=body, **fields)
    if delay is not None:
        request.stream_delay.CopyFrom(seconds(delay))
    return topics.Publish(request)


def take(streams, topic: str, n: int) -> spb.ReadStreamResponse:
    request = spb.ReadStreamRequest(
        topic=topic, consumer_group="g", min_messages=n, wait_time=seconds(10)
    )
    return streams.ReadStream(request)


def read_now(streams, topic: str) -> spb.ReadStreamResponse:
    return streams.ReadStream(spb.ReadStreamRequest(topic=topic, consumer_group="g"))


def ack(streams, topic: str, batch: str) -> None:
    streams.AckStream(spb.AckStreamRequest(topic=topic, consumer_group="g", batch=batch))


def lag(streams, topic: str) -> int:
    request = spb.GetConsumerGroupRequest(topic=topic, name="g")
    return streams.GetConsumerGroup(request).consumer_group.lag_messages


async def test_a_delayed_message_is_unseen_until_due_then_sorts_after_what_came_before(
    topics, streams, stream, db
):
    delayed = publish(topics, stream, b"later", delay=3600, routing_key="a.b", subject="s")
    assert delayed.publish_id
    assert not delayed.queues
    publish(topics, stream, b"plain")
    first = take(streams, stream, 1)
    assert [m.body for m in first.messages] == [b"plain"]
    ack(streams, stream, first.batch)
    assert read_now(streams, stream).batch == ""
    assert lag(streams, stream) == 0  # not in the log, not in the lag
    publish(topics, stream, b"meanwhile")
    assert await db.execute(DUE_NOW, stream) == "UPDATE 1"
    # The next read of the topic appends it; a read after that has it.
    due = take(streams, stream, 2)
    assert [m.body for m in due.messages] == [b"meanwhile", b"later"]
    later = due.messages[1]
    assert later.publish_id == delayed.publish_id
    assert (later.routing_key, later.subject) == ("a.b", "s")
    assert later.offset > due.messages[0].offset  # its offset is from when it became due
    assert later.publish_time.ToDatetime() >= due.messages[0].publish_time.ToDatetime()
    ack(streams, stream, due.batch)
    assert await db.fetchval("SELECT count(*) FROM postbox.stream_delayed") == 0


def test_a_zero_delay_appends_at_once(topics, streams, stream):
    publish(topics, stream, b"now", delay=0)
    assert [m.body for m in take(streams, stream, 1).messages] == [b"now"]


async def test_tick_appends_due_messages_with_no_reader_and_once_under_concurrency(
    topics, streams, stream, db, database_url
):
    publish(topics, stream, b"x", delay=3600)
    publish(topics, stream, b"y", delay=3600)
    first = await asyncpg.connect(database_url)
    second = await asyncpg.connect(database_url)
    try:
        # The first makes them due and appends them in an open transaction, holding their
        # rows: the second (or a server's worker) skips them rather than wait or append
        # them again.
        await first.execute("BEGIN")
        assert await first.execute(DUE_NOW, stream) == "UPDATE 2"
        assert await first.fetchval("SELECT postbox.publish_due_streams()") == 2
        assert await second.fetchval("SELECT postbox.publish_due_streams()") == 0
        await first.execute("COMMIT")
        assert await second.fetchval("SELECT (postbox.tick() ->> 'published_delayed')::int") == 0
    finally:
        await first.close()
        await second.close()
    await until(db, FINAL, stream)
    assert lag(streams, stream) == 2
    assert [m.body for m in take(streams, stream, 2).messages] == [b"x", b"y"]


async def test_tick_reports_what_it_appended(topics, stream, db):
    publish(topics, stream, b"z", delay=60)
    async with db.transaction():  # due and appended at once: no worker takes it between
        assert await db.execute(DUE_NOW, stream) == "UPDATE 1"
        assert await db.fetchval("SELECT (postbox.tick() ->> 'published_delayed')::int") == 1


def test_a_delay_is_refused_where_it_cannot_hold(topics, queues, stream):
    plain = unique_name("plain_topic")
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=plain)))
    error = error_of(publish, topics, plain, b"m", delay=10)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not a stream topic" in error.details()
    for value in (-1, 30 * 86400 + 1):
        error = error_of(publish, topics, stream, b"m", delay=value)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "stream_delay must be from 0 s to 2592000 s (30 days), not" in error.details()
    error = error_of(publish, topics, stream, b"m", delay=10, deduplication_id="d")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "deduplication_id is for queues" in error.details()
    error = error_of(publish, topics, stream, b"m", delay=10, routing_key="a..b")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    queue = create_queue(queues, unique_name("delayed_sub"))
    topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="s", topic=stream, pattern="#", queue=queue.name)
        )
    )
    error = error_of(publish, topics, stream, b"m", delay=10)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has subscriptions: a delayed publish goes to the stream log only" in error.details()


async def test_the_servers_maintenance_appends_a_due_message_with_no_reader_or_tick(
    topics, streams, stream, db
):
    """The session's server runs maintenance every 0.2 s (tests/conftest.py): it alone
    appends a message that came due, which then counts in the group's lag."""
    publish(topics, stream, b"w", delay=3600)
    assert await db.execute(DUE_NOW, stream) == "UPDATE 1"
    await until(db, "SELECT NOT EXISTS (SELECT FROM postbox.stream_delayed d JOIN postbox.topics t "
                "ON t.id = d.topic_id WHERE t.name = $1)", stream)  # fmt: skip
    await until(db, FINAL, stream)
    assert lag(streams, stream) == 1


class ExpiryHeld(Engine):
    """An engine whose message expiry blocks until released, and which counts the
    passes that append due stream messages."""

    expiring: asyncio.Event
    released: asyncio.Event
    due_passes = 0

    async def expire_messages(self, max_messages: int) -> int:
        self.expiring.set()
        await self.released.wait()
        return await super().expire_messages(max_messages)

    async def publish_due_streams(self, max_messages: int) -> int:
        appended = await super().publish_due_streams(max_messages)
        self.due_passes += 1
        return appended


async def test_due_stream_messages_are_appended_while_expiry_is_held(database_url, server):
    """A maintenance pass stuck in expiry (a backlog, a lock held elsewhere) does not
    hold back the appending of delayed stream messages that come due. (`server`
    installs the engine.)"""
    engine = await ExpiryHeld.connect(database_url, pool_size=2)
    engine.expiring, engine.released = asyncio.Event(), asyncio.Event()
    worker = asyncio.create_task(
        MaintenanceWorker(engine, interval=0.05, expiry_interval=0.05).run()
    )
    try:
        await asyncio.wait_for(engine.expiring.wait(), 30)  # 30 s: a loaded machine
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while engine.due_passes < 2:
            assert loop.time() < deadline, "no due-stream pass while expiry was held"
            await asyncio.sleep(0.02)
        assert not engine.released.is_set()  # still held: the passes ran beside it
    finally:
        engine.released.set()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await engine.close()


def publish_batch(topics, topic: str, *entries: tuple[bytes, float | None], **fields):
    """PublishBatch of (body, stream_delay) entries; the fields go on every entry."""
    request = tpb.PublishBatchRequest(topic=topic)
    for body, delay in entries:
        entry = request.entries.add(body=body, **fields)
        if delay is not None:
            entry.stream_delay.CopyFrom(seconds(delay))
    return topics.PublishBatch(request)


async def test_a_batch_with_delays_appends_the_undelayed_at_once_and_holds_the_rest(
    topics, streams, stream, db
):
    done = publish_batch(topics, stream, (b"now-1", None), (b"later", 3600), (b"now-2", 0))
    assert len(done.results) == 3
    assert all(r.publish_id and not r.queues for r in done.results)
    first = take(streams, stream, 2)
    assert [m.body for m in first.messages] == [b"now-1", b"now-2"]  # entry order
    ack(streams, stream, first.batch)
    assert read_now(streams, stream).batch == ""  # the delayed one is not in the log yet
    assert await db.execute(DUE_NOW, stream) == "UPDATE 1"
    due = take(streams, stream, 1)
    assert [(m.body, m.publish_id) for m in due.messages] == [
        (b"later", done.results[1].publish_id)
    ]


async def test_a_batch_with_delays_is_all_or_nothing(topics, queues, streams, stream, db):
    for value in (-1, 30 * 86400 + 1):
        error = error_of(publish_batch, topics, stream, (b"a", None), (b"b", value))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("entry 1: stream_delay must be from 0 s to 2592000 s")
    # A deduplication_id on an entry without a delay: the batch goes to the log only.
    request = tpb.PublishBatchRequest(topic=stream)
    request.entries.add(body=b"a", deduplication_id="d")
    request.entries.add(body=b"b").stream_delay.CopyFrom(seconds(10))
    error = error_of(topics.PublishBatch, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("entry 0: deduplication_id is for queues")
    # The second entry's routing key is refused by the engine: the first, a delay of
    # 0, is not appended either.
    request = tpb.PublishBatchRequest(topic=stream)
    request.entries.add(body=b"a").stream_delay.CopyFrom(seconds(0))
    request.entries.add(body=b"b", routing_key="a..b").stream_delay.CopyFrom(seconds(10))
    error = error_of(topics.PublishBatch, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    queue = create_queue(queues, unique_name("batch_delayed_sub"))
    topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="s", topic=stream, pattern="#", queue=queue.name)
        )
    )
    error = error_of(publish_batch, topics, stream, (b"c", None), (b"d", 10))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "has subscriptions: a delayed publish goes to the stream log only" in error.details()
    assert await db.fetchval(
        "SELECT count(*) FROM postbox.stream_log l JOIN postbox.topics t ON t.id = l.topic_id "
        "WHERE t.name = $1", stream
    ) == 0  # fmt: skip
    assert await db.fetchval(
        "SELECT count(*) FROM postbox.stream_delayed d JOIN postbox.topics t ON t.id = d.topic_id "
        "WHERE t.name = $1", stream
    ) == 0  # fmt: skip
