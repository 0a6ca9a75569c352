"""Topics over gRPC: lifecycle, AMQP pattern matching, fan-out to queues, refusals."""

from __future__ import annotations

import itertools

import grpc
import pytest
from postbox.v1 import message_pb2
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import topic_service_pb2 as pb
from support import create_queue, error_of, receive, unique_name


@pytest.fixture
def topic(topics, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    return name


def subscribe(topics, topic: str, name: str, pattern: str = "", **destination) -> pb.Subscription:
    subscription = pb.Subscription(name=name, topic=topic, pattern=pattern, **destination)
    return topics.CreateSubscription(
        pb.CreateSubscriptionRequest(subscription=subscription)
    ).subscription


def new_queue(queues, hint: str, **attributes) -> str:
    return create_queue(queues, unique_name(hint), **attributes).name


def test_topic_lifecycle(topics):
    names = sorted(unique_name(f"life{i}") for i in range(3))
    for name in names:
        created = topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name))).topic
        assert created.name == name
        assert created.create_time.seconds > 0
    error = error_of(topics.CreateTopic, pb.CreateTopicRequest(topic=pb.Topic(name=names[0])))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert topics.GetTopic(pb.GetTopicRequest(name=names[1])).topic.name == names[1]

    seen, token = [], ""
    while True:
        page = topics.ListTopics(pb.ListTopicsRequest(page_size=1, page_token=token))
        seen += [t.name for t in page.topics]
        token = page.next_page_token
        if not token:
            break
    assert [name for name in seen if name in names] == names

    topics.DeleteTopic(pb.DeleteTopicRequest(name=names[0]))
    for call, request in (
        (topics.GetTopic, pb.GetTopicRequest(name=names[0])),
        (topics.DeleteTopic, pb.DeleteTopicRequest(name=names[0])),
    ):
        error = error_of(call, request)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "does not exist" in error.details()


@pytest.mark.parametrize("name", ["", "a.b", "x" * 257, "a.fifo.fifo", "bad name", "ä"])
def test_bad_topic_names_are_invalid(topics, name):
    error = error_of(topics.CreateTopic, pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "topic name" in error.details()


def amqp_matches(pattern: list[str], key: list[str]) -> bool:
    """The AMQP topic-exchange rule, written out recursively: the tests' reference."""
    if not pattern:
        return not key
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(amqp_matches(rest, key[i:]) for i in range(len(key) + 1))
    return bool(key) and head in ("*", key[0]) and amqp_matches(rest, key[1:])


async def test_patterns_match_as_amqp_topic_exchanges_do(db):
    words = ["a", "b", "*", "#"]
    patterns = [".".join(p) for n in range(1, 5) for p in itertools.product(words, repeat=n)]
    keys = [".".join(k) for n in range(5) for k in itertools.product(["a", "b"], repeat=n)]
    rows = await db.fetch(
        """SELECT p, k, postbox._key_matches(c.match_kind, c.match_text, k) AS hit
           FROM unnest($1::text[]) AS p, postbox._compile_pattern(p) AS c,
                unnest($2::text[]) AS k""",
        patterns,
        keys,
    )
    assert len(rows) == len(patterns) * len(keys)
    wrong = [
        (row["p"], row["k"], row["hit"])
        for row in rows
        if row["hit"] != amqp_matches(row["p"].split("."), row["k"].split(".") if row["k"] else [])
    ]
    assert not wrong, wrong[:10]
    # The examples of the reference, and plain comparisons for the common shapes.
    for pattern, key, hit in [
        ("a.#", "a", True), ("#.c", "c", True), ("a.*.c", "a.b.c", True), ("a.*.c", "a.c", False),
        ("a.*.c", "a.b.b.c", False), ("#", "", True), ("#", "x.y", True), ("*", "", False),
    ]:  # fmt: skip
        got = await db.fetchval(
            "SELECT postbox._key_matches(c.match_kind, c.match_text, $2) "
            "FROM postbox._compile_pattern($1) c",
            pattern,
            key,
        )
        assert got is hit, (pattern, key)
    kinds = {
        p: await db.fetchval("SELECT match_kind FROM postbox._compile_pattern($1)", p)
        for p in ("#", "#.#", "a.b", "a.b.#", "#.b", "a.*", "a.#.b")
    }
    assert kinds == {
        "#": "all", "#.#": "all", "a.b": "exact", "a.b.#": "prefix", "#.b": "suffix",
        "a.*": "regex", "a.#.b": "regex",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("a..b", "empty word"),
        ("a.b*", "'b*' is neither"),
        ("é", "'é' is neither"),
        ("a." * 130, "255"),
    ],
)
def test_bad_patterns_are_invalid(topics, queues, topic, pattern, says):
    queue = new_queue(queues, "pattern")
    error = error_of(subscribe, topics, topic, "s", pattern, queue=queue)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def test_subscriptions(topics, queues, topic):
    queue = new_queue(queues, "subs")
    created = subscribe(topics, topic, "b-queue", "orders.*", queue=queue)
    assert (created.queue, created.pattern) == (queue, "orders.*")
    assert subscribe(topics, topic, "a-default", queue=queue).pattern == "#"
    error = error_of(subscribe, topics, topic, "b-queue", queue=queue)
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    error = error_of(subscribe, topics, topic, "nowhere", queue="no-such-queue")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = error_of(subscribe, topics, topic, "none")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = error_of(subscribe, topics, "no-such-topic", "x", queue=queue)
    assert error.code() == grpc.StatusCode.NOT_FOUND

    page = topics.ListSubscriptions(pb.ListSubscriptionsRequest(topic=topic, page_size=1))
    assert [s.name for s in page.subscriptions] == ["a-default"]
    page = topics.ListSubscriptions(
        pb.ListSubscriptionsRequest(topic=topic, page_token=page.next_page_token)
    )
    assert [s.name for s in page.subscriptions] == ["b-queue"]
    assert not page.next_page_token
    got = topics.GetSubscription(pb.GetSubscriptionRequest(topic=topic, name="b-queue"))
    assert got.subscription == created

    topics.DeleteSubscription(pb.DeleteSubscriptionRequest(topic=topic, name="b-queue"))
    error = error_of(topics.GetSubscription, pb.GetSubscriptionRequest(topic=topic, name="b-queue"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def publish(topics, topic: str, body: bytes = b"x", routing_key: str = "", **fields):
    request = pb.PublishRequest(topic=topic, body=body, routing_key=routing_key, **fields)
    return topics.Publish(request)


def test_publish_fans_out_to_every_matching_queue_once(topics, queues, messages, topic):
    orders, created, everything, unrelated = (
        new_queue(queues, hint) for hint in ("orders", "created", "everything", "unrelated")
    )
    subscribe(topics, topic, "orders", "orders.#", queue=orders)
    subscribe(topics, topic, "orders-again", "#.created", queue=orders)  # same queue: one copy
    subscribe(topics, topic, "created", "*.created", queue=created)
    subscribe(topics, topic, "everything", "#", queue=everything)
    subscribe(topics, topic, "unrelated", "payments.*", queue=unrelated)
    attributes = {"kind": message_pb2.AttributeValue(data_type="String", string_value="new")}

    reply = publish(topics, topic, b"order 1", "orders.created", attributes=attributes)
    assert list(reply.queues) == sorted([orders, created, everything])
    assert len(reply.message_ids) == 3
    assert list(reply.duplicates) == [False] * 3
    assert reply.webhook_deliveries == 0
    assert reply.publish_id
    for queue, message_id in zip(reply.queues, reply.message_ids, strict=True):
        (got,) = receive(messages, queue)
        assert (got.message_id, got.body) == (message_id, b"order 1")
        assert got.attributes["kind"].string_value == "new"
    assert receive(messages, unrelated) == []

    reply = publish(topics, topic, b"no key")
    assert list(reply.queues) == [everything]


def test_a_refusing_queue_fails_the_publish_and_nothing_is_published(
    topics, queues, messages, topic
):
    open_queue = new_queue(queues, "open")
    paused = new_queue(queues, "paused")
    subscribe(topics, topic, "a-open", queue=open_queue)
    subscribe(topics, topic, "b-paused", queue=paused)
    queues.PauseQueue(qpb.PauseQueueRequest(name=paused, sends=True))
    error = error_of(publish, topics, topic)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"subscription 'b-paused' (queue '{paused}') refused the publish" in error.details()
    assert "nothing was published" in error.details()
    assert receive(messages, open_queue) == []
    queues.ResumeQueue(qpb.ResumeQueueRequest(name=paused))

    small = new_queue(queues, "small", max_message_size=1024)
    subscribe(topics, topic, "c-small", "big.#", queue=small)
    error = error_of(publish, topics, topic, b"x" * 2000, "big.one")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'c-small'" in error.details()
    assert "2000 bytes" in error.details()

    full = new_queue(queues, "full", max_depth=1)
    subscribe(topics, topic, "d-full", "full", queue=full)
    publish(topics, topic, routing_key="full")
    error = error_of(publish, topics, topic, routing_key="full")
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "'d-full'" in error.details()

    error = error_of(publish, topics, topic, routing_key="bad..key")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "routing key 'bad..key'" in error.details()
    error = error_of(publish, topics, "no-such-topic")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    # Only the publishes that succeeded arrived.
    assert [m.body for m in receive(messages, open_queue)] == [b"x"]


def test_fifo_queues_group_by_ordering_key_and_deduplicate(topics, queues, messages, topic):
    fifo = create_queue(queues, unique_name("fanout") + ".fifo").name
    subscribe(topics, topic, "fifo", queue=fifo)

    first = publish(topics, topic, b"1", "orders.eu", ordering_key="customer-7")
    publish(topics, topic, b"2", "orders.eu")
    publish(topics, topic, b"3")
    got = receive(messages, fifo, visibility=0)
    assert {m.body: m.message_group_id for m in got} == {
        b"1": "customer-7", b"2": "orders.eu", b"3": topic,
    }  # fmt: skip
    assert {m.body: m.deduplication_id for m in got}[b"1"] == first.publish_id

    once = publish(topics, topic, b"4", deduplication_id="retry-me")
    again = publish(topics, topic, b"4", deduplication_id="retry-me")
    assert list(again.duplicates) == [True]
    assert again.message_ids == once.message_ids


def test_publish_batch(topics, queues, messages, topic):
    evens = new_queue(queues, "evens", max_message_size=1024)
    everything = new_queue(queues, "everything")
    subscribe(topics, topic, "evens", "even", queue=evens)
    subscribe(topics, topic, "everything", queue=everything)
    entries = [
        pb.PublishBatchEntry(body=f"m{i}".encode(), routing_key="even" if i % 2 == 0 else "odd")
        for i in range(5)
    ]
    results = topics.PublishBatch(pb.PublishBatchRequest(topic=topic, entries=entries)).results
    assert [list(r.queues) for r in results] == [
        sorted([evens, everything]) if i % 2 == 0 else [everything] for i in range(5)
    ]
    assert len({r.publish_id for r in results}) == 5
    assert [m.body for m in receive(messages, evens)] == [b"m0", b"m2", b"m4"]
    assert len(receive(messages, everything)) == 5

    # Entry 3 is the second that queue evens gets; the error names the publish's entry.
    entries[3] = pb.PublishBatchEntry(body=b"x" * 2000, routing_key="even")
    error = error_of(topics.PublishBatch, pb.PublishBatchRequest(topic=topic, entries=entries))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("entry 3: subscription 'evens'"), error.details()
    entries[3] = pb.PublishBatchEntry(routing_key=".odd")
    error = error_of(topics.PublishBatch, pb.PublishBatchRequest(topic=topic, entries=entries))
    assert error.details().startswith("entry 3: routing key '.odd'"), error.details()
    assert receive(messages, everything) == []


def test_deleting_a_queue_or_topic(topics, queues, messages, topic):
    kept, dropped = new_queue(queues, "kept"), new_queue(queues, "dropped")
    subscribe(topics, topic, "kept", queue=kept)
    subscribe(topics, topic, "dropped", queue=dropped)
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=dropped))
    listed = topics.ListSubscriptions(pb.ListSubscriptionsRequest(topic=topic)).subscriptions
    assert [s.name for s in listed] == ["kept"]  # a queue's subscriptions go with it
    assert list(publish(topics, topic).queues) == [kept]

    topics.DeleteTopic(pb.DeleteTopicRequest(name=topic))
    assert [m.body for m in receive(messages, kept)] == [b"x"]  # the queue and its messages stay


def _update(topics, subscription: pb.Subscription, *paths: str) -> pb.Subscription:
    from google.protobuf.field_mask_pb2 import FieldMask

    request = pb.UpdateSubscriptionRequest(
        subscription=subscription, update_mask=FieldMask(paths=list(paths))
    )
    return topics.UpdateSubscription(request).subscription


def test_update_subscription_changes_its_pattern_and_queue(topics, queues, messages, topic):
    first, second = new_queue(queues, "first"), new_queue(queues, "second")
    subscribe(topics, topic, "orders", "orders.created", queue=first)
    publish(topics, topic, b"before", "orders.paid")
    changed = _update(
        topics,
        pb.Subscription(topic=topic, name="orders", pattern="orders.*", queue=second),
        "pattern",
        "queue",
    )
    assert (changed.pattern, changed.queue) == ("orders.*", second)
    assert (
        topics.GetSubscription(pb.GetSubscriptionRequest(topic=topic, name="orders")).subscription
        == changed
    )
    publish(topics, topic, b"after", "orders.paid")
    assert receive(messages, first) == []
    assert [m.body for m in receive(messages, second)] == [b"after"]
    # An unset pattern in the mask goes back to the default, "#".
    assert _update(topics, pb.Subscription(topic=topic, name="orders"), "pattern").pattern == "#"


@pytest.mark.parametrize(
    ("paths", "says"),
    [
        ((), "fields to change"),
        (("name",), "fields to change"),
        (("webhook.url",), "delivers to a queue"),
        (("pattern",), "pattern"),
    ],
)
def test_update_subscription_refuses_what_it_cannot_do(topics, queues, topic, paths, says):
    queue = new_queue(queues, "kept")
    subscribe(topics, topic, "sub", "a.b", queue=queue)
    update = pb.Subscription(topic=topic, name="sub", pattern="a..b")
    error = error_of(_update, topics, update, *paths)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    kept = topics.GetSubscription(pb.GetSubscriptionRequest(topic=topic, name="sub")).subscription
    assert (kept.pattern, kept.queue) == ("a.b", queue)
