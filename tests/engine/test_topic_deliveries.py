"""What a subscription takes and how, over gRPC: filter policies, SNS deliveries,
suspended subscriptions, FIFO topics, subjects, and topic tags (UpdateTopic)."""

from __future__ import annotations

import json

import grpc
import pytest
from google.protobuf import field_mask_pb2
from postbox.v1 import message_pb2
from postbox.v1 import topic_service_pb2 as pb
from support import create_queue, error_of, receive, unique_name


@pytest.fixture
def topic(topics, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    return name


def _subscribe(topics, topic: str, queue: str, **fields) -> pb.Subscription:
    subscription = pb.Subscription(name=unique_name("s"), topic=topic, queue=queue, **fields)
    return topics.CreateSubscription(
        pb.CreateSubscriptionRequest(subscription=subscription)
    ).subscription


def _string(value: str) -> message_pb2.AttributeValue:
    return message_pb2.AttributeValue(data_type="String", string_value=value)


def test_a_filter_policy_lets_through_only_matching_messages(topics, queues, messages, topic):
    queue = create_queue(queues, unique_name("filtered")).name
    policy = json.dumps({"color": ["red", {"prefix": "dark"}]})
    made = _subscribe(topics, topic, queue, filter_policy=policy)
    assert made.filter_policy == policy
    assert made.filter_policy_scope == pb.FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES
    for color in ("red", "blue", "darkred"):
        published = topics.Publish(
            pb.PublishRequest(
                topic=topic, body=color.encode(), attributes={"color": _string(color)}
            )
        )
        assert list(published.queues) == ([] if color == "blue" else [queue])
    assert sorted(m.body for m in receive(messages, queue, wait=5)) == [b"darkred", b"red"]


def test_body_scope_and_updates(topics, queues, messages, topic):
    queue = create_queue(queues, unique_name("body")).name
    made = _subscribe(
        topics, topic, queue, filter_policy=json.dumps({"n": [{"numeric": [">", 1]}]}),
        filter_policy_scope=pb.FILTER_POLICY_SCOPE_MESSAGE_BODY,
    )  # fmt: skip
    assert not topics.Publish(pb.PublishRequest(topic=topic, body=b'{"n": 1}')).queues
    assert not topics.Publish(pb.PublishRequest(topic=topic, body=b"not json")).queues
    assert list(topics.Publish(pb.PublishRequest(topic=topic, body=b'{"n": 2}')).queues) == [queue]
    made.filter_policy = ""
    topics.UpdateSubscription(
        pb.UpdateSubscriptionRequest(
            subscription=made, update_mask=field_mask_pb2.FieldMask(paths=["filter_policy"])
        )
    )
    assert list(topics.Publish(pb.PublishRequest(topic=topic, body=b"any")).queues) == [queue]


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "filter"),
        (json.dumps({"a": [{"nosuch": 1}]}), "nosuch"),
    ],
)
def test_a_bad_filter_policy_is_invalid_and_changes_nothing(topics, queues, topic, policy, says):
    queue = create_queue(queues, unique_name("bad")).name
    error = error_of(
        topics.CreateSubscription,
        pb.CreateSubscriptionRequest(
            subscription=pb.Subscription(name="s", topic=topic, queue=queue, filter_policy=policy)
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    assert not topics.ListSubscriptions(pb.ListSubscriptionsRequest(topic=topic)).subscriptions


def test_a_suspended_subscription_takes_nothing_until_resumed(topics, queues, messages, topic):
    queue = create_queue(queues, unique_name("suspended")).name
    made = _subscribe(topics, topic, queue, suspended=True)
    assert made.suspended
    assert not topics.Publish(pb.PublishRequest(topic=topic, body=b"skipped")).queues
    made.suspended = False
    topics.UpdateSubscription(
        pb.UpdateSubscriptionRequest(
            subscription=made, update_mask=field_mask_pb2.FieldMask(paths=["suspended"])
        )
    )
    topics.Publish(pb.PublishRequest(topic=topic, body=b"taken"))
    assert [m.body for m in receive(messages, queue, wait=5)] == [b"taken"]


def test_an_sns_delivery_wraps_the_message_in_sns_json(topics, queues, messages, topic):
    queue = create_queue(queues, unique_name("enveloped")).name
    delivery = pb.SnsDelivery(topic_arn="arn:aws:sns:r:1:t", subscription_arn="arn:aws:sns:r:1:t:s")
    _subscribe(topics, topic, queue, sns_delivery=delivery)
    published = topics.Publish(
        pb.PublishRequest(
            topic=topic, body="héllo".encode(), subject="hi", attributes={"a": _string("b")}
        )
    )
    (message,) = receive(messages, queue, wait=5)
    envelope = json.loads(message.body)
    # Signed, as SNS signs (the server makes its key when none is given); the signing
    # certificate's and unsubscribe URLs come with the shim's subscriptions, not this one.
    assert list(envelope) == [
        "Type", "MessageId", "TopicArn", "Subject", "Message", "Timestamp",
        "SignatureVersion", "Signature", "MessageAttributes",
    ]  # fmt: skip
    assert envelope["MessageId"] == published.publish_id
    assert envelope["Message"] == "héllo"
    assert envelope["MessageAttributes"] == {"a": {"Type": "String", "Value": "b"}}
    assert not message.attributes
    error = error_of(topics.Publish, pb.PublishRequest(topic=topic, body=b"\xff\xfe"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in error.details()


def test_fifo_topics_need_an_ordering_key(topics, queues, messages, request):
    name = unique_name(request.node.name) + ".fifo"
    topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    queue = create_queue(queues, unique_name("ordered") + ".fifo", fifo=True).name
    _subscribe(topics, name, queue)
    error = error_of(topics.Publish, pb.PublishRequest(topic=name, body=b"x"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ordering_key" in error.details()
    for i in range(3):
        topics.Publish(pb.PublishRequest(topic=name, body=b"%d" % i, ordering_key="g"))
    bodies = []
    while len(bodies) < 3:
        (message,) = receive(messages, queue, count=1, wait=5)
        bodies.append(message.body)
        from postbox.v1 import message_service_pb2 as mpb

        messages.Delete(mpb.DeleteRequest(queue=queue, receipt=message.receipt))
    assert bodies == [b"0", b"1", b"2"]


def test_subjects_are_checked(topics, topic):
    error = error_of(topics.Publish, pb.PublishRequest(topic=topic, body=b"x", subject="s" * 101))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "subject" in error.details()


def test_topic_tags_and_sns_attributes(topics, topic):
    updated = topics.UpdateTopic(
        pb.UpdateTopicRequest(
            topic=pb.Topic(name=topic, tags={"team": "a"}, sns_attributes={"DisplayName": "D"}),
            update_mask=field_mask_pb2.FieldMask(paths=["tags", "sns_attributes"]),
        )
    ).topic
    assert dict(updated.tags) == {"team": "a"}
    assert dict(updated.sns_attributes) == {"DisplayName": "D"}
    fetched = topics.GetTopic(pb.GetTopicRequest(name=topic)).topic
    assert dict(fetched.tags) == {"team": "a"}
    for mask, topic_fields, says in (
        (["nosuch"], {}, "fields to change"),
        (["tags"], {"tags": {str(i): "v" for i in range(51)}}, "at most 50"),
        (["sns_attributes"], {"sns_attributes": {"bad key!": "v"}}, "sns_attributes"),
    ):
        error = error_of(
            topics.UpdateTopic,
            pb.UpdateTopicRequest(
                topic=pb.Topic(name=topic, **topic_fields),
                update_mask=field_mask_pb2.FieldMask(paths=mask),
            ),
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.details()
    assert dict(topics.GetTopic(pb.GetTopicRequest(name=topic)).topic.tags) == {"team": "a"}
