"""Publish with a delay, through a real server: each subscribed queue keeps the message
invisible for the delay (as Send's delay does), each webhook first attempts its delivery
after it; PublishBatch takes one per entry. A bad delay is refused and publishes nothing.

Timing: a delay of 2 s is short enough for the suite and long enough that a receive right
after the publish is known to be before it. The lower bound (nothing arrives sooner than
the delay after the publish) holds on any machine; the upper bounds are the helpers' 30 s,
generous because other test runs share the two cores."""

from __future__ import annotations

import time
from datetime import timedelta

import grpc
import pytest
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import topic_service_pb2 as pb
from receiver import Receiver
from support import create_queue, error_of, eventually, receive, seconds, unique_name

DELAY = 2.0

VISIBLE_AFTER = """
SELECT m.visible_at - m.enqueued_at FROM postbox.messages m
JOIN postbox.queues q ON q.id = m.queue_id WHERE q.name = $1 ORDER BY m.id
"""
STORED = """
SELECT (SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id
        WHERE q.name = $1)
     + (SELECT count(*) FROM postbox.webhook_deliveries d
        JOIN postbox.subscriptions s ON s.id = d.subscription_id
        JOIN postbox.topics t ON t.id = s.topic_id WHERE t.name = $2)
"""


@pytest.fixture
def topic(topics, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    return name


def subscribe(topics, topic: str, name: str, **destination) -> None:
    subscription = pb.Subscription(name=name, topic=topic, pattern="#", **destination)
    topics.CreateSubscription(pb.CreateSubscriptionRequest(subscription=subscription))


def subscribed_queue(queues, topics, topic: str, hint: str = "q", **fields) -> str:
    queue = unique_name(hint) + (".fifo" if fields.get("fifo") else "")
    create_queue(queues, queue, **fields)
    subscribe(topics, topic, f"to-{hint}", queue=queue)
    return queue


def delayed(value: float) -> dict:
    return {"delay": seconds(value)}


async def test_a_delayed_publish_is_invisible_until_its_delay(queues, topics, messages, topic, db):
    queue = subscribed_queue(queues, topics, topic)
    start = time.monotonic()
    published = topics.Publish(pb.PublishRequest(topic=topic, body=b"later", **delayed(DELAY)))
    assert list(published.queues) == [queue]
    assert receive(messages, queue) == []  # well within the 2 s
    assert await db.fetchval(VISIBLE_AFTER, queue) == timedelta(seconds=DELAY)
    [message] = eventually(lambda: receive(messages, queue, wait=1), what="the delayed message")
    assert time.monotonic() - start >= DELAY
    assert message.body == b"later"


async def test_a_zero_delay_overrides_the_queues_delivery_delay(
    queues, topics, messages, topic, db
):
    queue = subscribed_queue(queues, topics, topic, delivery_delay=seconds(3600))
    topics.Publish(pb.PublishRequest(topic=topic, body=b"now", **delayed(0)))
    topics.Publish(pb.PublishRequest(topic=topic, body=b"default"))
    assert [r[0] for r in await db.fetch(VISIBLE_AFTER, queue)] == [
        timedelta(0),
        timedelta(hours=1),
    ]
    assert [m.body for m in receive(messages, queue)] == [b"now"]


async def test_publish_batch_delays_each_entry_its_own(queues, topics, messages, topic, db):
    queue = subscribed_queue(queues, topics, topic)
    # A FIFO-free topic with a plain queue and one with a max_depth: both fan-out paths.
    capped = subscribed_queue(queues, topics, topic, "capped", max_depth=100)
    entries = [
        pb.PublishBatchEntry(body=b"hour", **delayed(3600)),
        pb.PublishBatchEntry(body=b"now"),
        pb.PublishBatchEntry(body=b"soon", **delayed(DELAY)),
    ]
    start = time.monotonic()
    topics.PublishBatch(pb.PublishBatchRequest(topic=topic, entries=entries))
    for name in (queue, capped):
        assert [r[0] for r in await db.fetch(VISIBLE_AFTER, name)] == [
            timedelta(hours=1),
            timedelta(0),
            timedelta(seconds=DELAY),
        ]
        assert [m.body for m in receive(messages, name)] == [b"now"]
    for name in (queue, capped):
        [soon] = eventually(lambda n=name: receive(messages, n, wait=1), what="the 2 s entry")
        assert soon.body == b"soon"
        assert time.monotonic() - start >= DELAY


def test_a_webhook_is_first_attempted_after_the_delay(topics, topic):
    receiver = Receiver().start()
    try:
        subscribe(topics, topic, "hook", webhook=pb.WebhookEndpoint(url=receiver.url("/hook")))
        start = time.monotonic()
        published = topics.Publish(pb.PublishRequest(topic=topic, body=b"x", **delayed(DELAY)))
        assert published.webhook_deliveries == 1
        [delivery] = receiver.wait_for("/hook", 1)
        assert delivery.at - start >= DELAY
    finally:
        receiver.stop()


@pytest.mark.parametrize(
    ("delay", "words"),
    [
        (-1, ["delay -1 s is negative"]),
        (365 * 86400, ["365 days"]),
        (120, ["retention", "subscription 'to-short'"]),
    ],
)
async def test_a_bad_delay_publishes_nothing(queues, topics, topic, db, delay, words):
    subscribed_queue(queues, topics, topic)
    short = subscribed_queue(
        queues, topics, topic, "short", retention=qpb.Retention(period=seconds(60))
    )
    subscribe(topics, topic, "hook", webhook=pb.WebhookEndpoint(url="http://127.0.0.1:9/"))
    for call in (
        lambda: topics.Publish(pb.PublishRequest(topic=topic, body=b"x", **delayed(delay))),
        lambda: topics.PublishBatch(
            pb.PublishBatchRequest(
                topic=topic,
                entries=[pb.PublishBatchEntry(body=b"y"), pb.PublishBatchEntry(**delayed(delay))],
            )
        ),
    ):
        error = error_of(call)
        assert error.code() is grpc.StatusCode.INVALID_ARGUMENT, error.details()
        for word in words:
            assert word in error.details()
    assert await db.fetchval(STORED, short, topic) == 0


async def test_a_fifo_subscription_refuses_a_delay(queues, topics, topic, db):
    queue = subscribed_queue(queues, topics, topic, "ordered", fifo=True)
    error = error_of(
        topics.Publish,
        pb.PublishRequest(topic=topic, body=b"x", ordering_key="g", **delayed(DELAY)),
    )
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "FIFO" in error.details()
    assert "to-ordered" in error.details()
    assert await db.fetchval(STORED, queue, topic) == 0


def test_a_stream_topic_takes_stream_delay_instead(topics, request: pytest.FixtureRequest):
    stream = unique_name(request.node.name)
    topics.CreateTopic(
        pb.CreateTopicRequest(topic=pb.Topic(name=stream, stream_retention=seconds(3600)))
    )
    error = error_of(topics.Publish, pb.PublishRequest(topic=stream, **delayed(DELAY)))
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "stream_delay" in error.details()
    both = pb.PublishRequest(topic=stream, stream_delay=seconds(1), **delayed(DELAY))
    error = error_of(topics.Publish, both)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "not both" in error.details()
