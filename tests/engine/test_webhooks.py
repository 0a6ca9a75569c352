"""Webhook subscriptions end to end: a real HTTP receiver, Standard Webhooks signatures, retries."""

from __future__ import annotations

import base64
import itertools
import os
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from postbox.v1 import message_pb2
from postbox.v1 import topic_service_pb2 as pb
from receiver import Receiver
from standardwebhooks.webhooks import Webhook
from support import create_queue, error_of, eventually, free_port, seconds, unique_name


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture
def topic(topics, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    topics.CreateTopic(pb.CreateTopicRequest(topic=pb.Topic(name=name)))
    return name


def webhook(topics, topic: str, name: str, url: str, pattern: str = "", **endpoint):
    subscription = pb.Subscription(
        name=name, topic=topic, pattern=pattern, webhook=pb.WebhookEndpoint(url=url, **endpoint)
    )
    return topics.CreateSubscription(
        pb.CreateSubscriptionRequest(subscription=subscription)
    ).subscription


def fast_retries(**overrides) -> dict:
    settings = {
        "minimum_backoff": seconds(0.2),
        "maximum_backoff": seconds(0.4),
        "timeout": seconds(1),
    }
    return {**settings, **overrides}


def verified(secret: str, request) -> dict:
    """The envelope, after an independent Standard Webhooks implementation checked the signature."""
    return Webhook(secret).verify(request.body, request.headers)


def test_delivers_a_signed_envelope(topics, receiver, topic):
    path = f"/{topic}"
    created = webhook(topics, topic, "hook", receiver.url(path), "orders.#")
    secret = created.webhook.secret
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[6:])) == 32
    got = topics.GetSubscription(pb.GetSubscriptionRequest(topic=topic, name="hook")).subscription
    assert got.webhook.secret == ""
    assert got.webhook.url == receiver.url(path)
    assert (got.webhook.max_attempts, got.webhook.timeout.seconds) == (20, 10)
    listed = topics.ListSubscriptions(pb.ListSubscriptionsRequest(topic=topic)).subscriptions
    assert listed[0].webhook.secret == ""

    attributes = {
        "kind": message_pb2.AttributeValue(data_type="String", string_value="new"),
        "blob": message_pb2.AttributeValue(data_type="Binary", binary_value=b"\x00\xff"),
    }
    published = topics.Publish(
        pb.PublishRequest(
            topic=topic, routing_key="orders.created", body=b"\x01 order", attributes=attributes,
            ordering_key="customer-7",
        )
    )  # fmt: skip
    assert published.webhook_deliveries == 1
    assert list(published.queues) == []
    topics.Publish(pb.PublishRequest(topic=topic, routing_key="payments.created", body=b"no"))

    (request,) = receiver.wait_for(path, 1)
    assert request.headers["Content-Type"] == "application/json"
    document = verified(secret, request)
    assert document == {
        "topic": topic,
        "subscription": "hook",
        "deliveryAttempt": 1,
        "message": {
            "messageId": published.publish_id,
            "publishTime": document["message"]["publishTime"],
            "routingKey": "orders.created",
            "orderingKey": "customer-7",
            "data": base64.b64encode(b"\x01 order").decode(),
            "attributes": {
                "kind": {"dataType": "String", "stringValue": "new"},
                "blob": {"dataType": "Binary", "binaryValue": "AP8="},
            },
        },
    }
    assert document["message"]["publishTime"].endswith("Z")
    assert request.headers["webhook-id"].startswith("msg_")
    # Someone without the secret cannot produce the signature.
    with pytest.raises(Exception, match="signature"):
        Webhook("whsec_" + base64.b64encode(os.urandom(32)).decode()).verify(
            request.body, request.headers
        )


def test_a_given_secret_signs(topics, receiver, topic):
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    created = webhook(topics, topic, "hook", receiver.url(f"/{topic}"), secret=secret)
    assert created.webhook.secret == secret
    topics.Publish(pb.PublishRequest(topic=topic, body=b"signed"))
    (request,) = receiver.wait_for(f"/{topic}", 1)
    assert base64.b64decode(verified(secret, request)["message"]["data"]) == b"signed"


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ({"url": "ftp://example.com/x"}, "http:// or https://"),
        ({"url": "http://"}, "http:// or https://"),
        ({"url": "http://x", "secret": "secret"}, "whsec_"),
        ({"url": "http://x", "secret": "whsec_" + base64.b64encode(b"short").decode()}, "24 to 64"),
        ({"url": "http://x", "timeout": Duration(seconds=61)}, "timeout is 61"),
        ({"url": "http://x", "max_attempts": 101}, "max_attempts is 101"),
        ({"url": "http://x", "minimum_backoff": Duration(seconds=9),
          "maximum_backoff": Duration(seconds=2)}, "maximum_backoff is 2"),
    ],
)  # fmt: skip
def test_bad_webhooks_are_invalid(topics, topic, endpoint, says):
    subscription = pb.Subscription(name="bad", topic=topic, webhook=pb.WebhookEndpoint(**endpoint))
    error = error_of(
        topics.CreateSubscription, pb.CreateSubscriptionRequest(subscription=subscription)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def test_failures_and_timeouts_are_retried_with_backoff(topics, receiver, topic):
    path = f"/{topic}"
    # A server error, a redirect, a response too slow for the 1 s timeout, then success.
    receiver.plan(path, (500, 0), (302, 0), (200, 2.5), (200, 0))
    secret = webhook(topics, topic, "hook", receiver.url(path), **fast_retries()).webhook.secret
    topics.Publish(pb.PublishRequest(topic=topic, body=b"persistent"))

    attempts = receiver.wait_for(path, 4)
    documents = [verified(secret, attempt) for attempt in attempts]
    assert [d["deliveryAttempt"] for d in documents] == [1, 2, 3, 4]
    assert len({attempt.headers["webhook-id"] for attempt in attempts}) == 1
    gaps = [b.at - a.at for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.1  # at least half the minimum backoff of 0.2 s
    # Delivered: once the worker has recorded it, nothing is left pending.
    request = pb.ListWebhookDeliveriesRequest(topic=topic, subscription="hook")
    eventually(lambda: not topics.ListWebhookDeliveries(request).deliveries, what="delivered")


def test_gives_up_after_max_attempts_and_keeps_the_failure(topics, receiver, topic):
    path = f"/{topic}"
    receiver.plan(path, (503, 0), (503, 0), (200, 0))
    webhook(topics, topic, "hook", receiver.url(path), **fast_retries(max_attempts=2))
    published = topics.Publish(pb.PublishRequest(topic=topic, routing_key="k", body=b"lost"))
    receiver.wait_for(path, 2)

    request = pb.ListWebhookDeliveriesRequest(
        topic=topic, subscription="hook", state=pb.WEBHOOK_DELIVERY_STATE_FAILED
    )

    def failed() -> list:
        return list(topics.ListWebhookDeliveries(request).deliveries)

    (delivery,) = eventually(failed, what="the delivery failed")
    assert delivery.publish_id == published.publish_id
    assert delivery.state == pb.WEBHOOK_DELIVERY_STATE_FAILED
    assert (delivery.attempts, delivery.last_status_code) == (2, 503)
    assert delivery.last_error == "HTTP 503: planned 503"
    assert delivery.routing_key == "k"
    assert not delivery.HasField("next_attempt_time")
    assert delivery.delivery_id == receiver.on(path)[0].headers["webhook-id"]
    # Given up: no third attempt, though the receiver would now say 200.
    topics.Publish(pb.PublishRequest(topic=topic, body=b"next"))
    receiver.wait_for(path, 3)
    assert [verified_body(r) for r in receiver.on(path)] == [b"lost", b"lost", b"next"]


def verified_body(request) -> bytes:
    return base64.b64decode(request.document["message"]["data"])


def test_unreachable_endpoints_are_retried(topics, receiver, topic):
    closed = f"http://127.0.0.1:{free_port()}/"
    webhook(topics, topic, "hook", closed, **fast_retries(max_attempts=2))
    topics.Publish(pb.PublishRequest(topic=topic, body=b"x"))
    request = pb.ListWebhookDeliveriesRequest(
        topic=topic, subscription="hook", state=pb.WEBHOOK_DELIVERY_STATE_FAILED
    )
    (delivery,) = eventually(lambda: topics.ListWebhookDeliveries(request).deliveries)
    assert delivery.last_status_code == 0
    assert delivery.last_error.startswith("request failed")


def test_deleting_the_subscription_drops_its_deliveries(topics, receiver, topic):
    path = f"/{topic}"
    receiver.plan(path, *[(500, 0)] * 50)
    webhook(topics, topic, "hook", receiver.url(path), **fast_retries())
    topics.Publish(pb.PublishRequest(topic=topic, body=b"x"))
    receiver.wait_for(path, 1)
    topics.DeleteSubscription(pb.DeleteSubscriptionRequest(topic=topic, name="hook"))
    error = error_of(
        topics.ListWebhookDeliveries,
        pb.ListWebhookDeliveriesRequest(topic=topic, subscription="hook"),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def _retry(topics, topic: str, subscription: str = "hook", delivery_id: str = "") -> int:
    request = pb.RetryWebhookDeliveryRequest(
        topic=topic, subscription=subscription, delivery_id=delivery_id
    )
    return topics.RetryWebhookDelivery(request).retried_deliveries


def _failed(topics, topic: str) -> list:
    request = pb.ListWebhookDeliveriesRequest(
        topic=topic, subscription="hook", state=pb.WEBHOOK_DELIVERY_STATE_FAILED
    )
    return list(topics.ListWebhookDeliveries(request).deliveries)


def test_a_failed_delivery_retried_by_id_is_delivered(topics, receiver, topic):
    path = f"/{topic}"
    receiver.plan(path, (503, 0))
    webhook(topics, topic, "hook", receiver.url(path), **fast_retries(max_attempts=1))
    topics.Publish(pb.PublishRequest(topic=topic, body=b"second chance"))
    (failed,) = eventually(lambda: _failed(topics, topic), what="the delivery failed")
    assert _retry(topics, topic, delivery_id=failed.delivery_id) == 1
    (_, delivered) = receiver.wait_for(path, 2)
    assert verified_body(delivered) == b"second chance"
    assert delivered.headers["webhook-id"] == failed.delivery_id
    eventually(
        lambda: (
            not topics.ListWebhookDeliveries(
                pb.ListWebhookDeliveriesRequest(topic=topic, subscription="hook")
            ).deliveries
        ),
        what="no delivery left",
    )


def test_retry_without_an_id_retries_every_failed_delivery(topics, receiver, topic):
    path = f"/{topic}"
    receiver.plan(path, (503, 0), (503, 0))
    webhook(topics, topic, "hook", receiver.url(path), **fast_retries(max_attempts=1))
    for body in (b"one", b"two"):
        topics.Publish(pb.PublishRequest(topic=topic, body=body))
    eventually(lambda: len(_failed(topics, topic)) == 2, what="both failed")
    assert _retry(topics, topic) == 2
    delivered = receiver.wait_for(path, 4)[2:]
    assert sorted(verified_body(r) for r in delivered) == [b"one", b"two"]
    assert _retry(topics, topic) == 0


def test_retry_refuses_what_it_cannot_retry(topics, receiver, topic, queues):
    webhook(topics, topic, "hook", receiver.url(f"/{topic}"))
    unknown = error_of(_retry, topics, topic, delivery_id="msg_" + "0" * 32 + "_999999999")
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    bad = error_of(_retry, topics, topic, delivery_id="x")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    queue = create_queue(queues, unique_name("q")).name
    topics.CreateSubscription(
        pb.CreateSubscriptionRequest(
            subscription=pb.Subscription(name="to-queue", topic=topic, queue=queue)
        )
    )
    not_a_webhook = error_of(_retry, topics, topic, "to-queue")
    assert not_a_webhook.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_update_moves_a_webhook_and_its_pending_deliveries(topics, receiver, topic):
    from google.protobuf.field_mask_pb2 import FieldMask

    old, new = f"/{topic}/old", f"/{topic}/new"
    receiver.plan(old, (503, 0))
    created = webhook(
        topics,
        topic,
        "hook",
        receiver.url(old),
        **fast_retries(minimum_backoff=seconds(2), maximum_backoff=seconds(3)),
    )
    topics.Publish(pb.PublishRequest(topic=topic, body=b"follows"))
    receiver.wait_for(old, 1)  # failed once; the next attempt is 1-2 s away
    update = pb.Subscription(
        topic=topic, name="hook", webhook=pb.WebhookEndpoint(url=receiver.url(new), max_attempts=7)
    )
    changed = topics.UpdateSubscription(
        pb.UpdateSubscriptionRequest(
            subscription=update,
            update_mask=FieldMask(paths=["webhook.url", "webhook.max_attempts", "webhook.secret"]),
        )
    ).subscription
    assert (changed.webhook.url, changed.webhook.max_attempts) == (receiver.url(new), 7)
    assert changed.webhook.secret.startswith("whsec_")
    assert changed.webhook.secret != created.webhook.secret  # unset in the mask: made anew
    (moved,) = receiver.wait_for(new, 1)
    assert verified(changed.webhook.secret, moved)["message"]["data"]
    assert len(receiver.on(old)) == 1
