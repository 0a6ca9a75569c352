"""Webhooks reach only public addresses unless the operator allows a range.

A server started without --webhook-allow-cidr refuses a subscription whose URL is, or
resolves to, a loopback, private, link-local or unspecified address, and refuses a
delivery whose host resolves to one at the time of the attempt (here: a
subscription made by SQL, past the API's check, to `localhost`), recording why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from postbox.v1 import topic_service_pb2 as tpb
from postbox.v1 import topic_service_pb2_grpc
from receiver import Receiver
from support import (
    ServerProcess,
    create_database,
    drop_database,
    error_of,
    eventually,
    unique_name,
)


@pytest.fixture(scope="module")
def strict_database(admin_url: str) -> Iterator[str]:
    """Its own database: the shared test server, which may reach loopback, would
    otherwise race the strict one to deliver."""
    url = create_database(admin_url, "postbox_egress")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def strict_server(strict_database: str) -> Iterator[ServerProcess]:
    process = ServerProcess(strict_database, loopback_webhooks=False).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def strict_topics(strict_server) -> Iterator[topic_service_pb2_grpc.TopicServiceStub]:
    with grpc.insecure_channel(strict_server.target) as channel:
        yield topic_service_pb2_grpc.TopicServiceStub(channel)


def _subscribe(topics, topic: str, url: str):
    subscription = tpb.Subscription(
        name="hook", topic=topic, webhook=tpb.WebhookEndpoint(url=url, max_attempts=1)
    )
    return topics.CreateSubscription(tpb.CreateSubscriptionRequest(subscription=subscription))


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:9/hook", "loopback"),
        ("http://localhost:9/hook", "loopback"),
        ("http://[::1]:9/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://172.16.0.1/hook", "private"),
        ("http://192.168.1.1/hook", "private"),
        ("http://[fd00::1]/hook", "private"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://0.0.0.0/hook", "unspecified"),
    ],
)
def test_a_subscription_to_a_non_public_address_is_refused(strict_topics, url, kind):
    topic = unique_name("egress")
    strict_topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    error = error_of(_subscribe, strict_topics, topic, url)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f" {kind} address" in error.details()
    assert "--webhook-allow-cidr" in error.details()
    listed = strict_topics.ListSubscriptions(tpb.ListSubscriptionsRequest(topic=topic))
    assert list(listed.subscriptions) == []


async def test_a_delivery_to_a_name_that_resolves_to_loopback_is_refused(
    strict_server, strict_topics, strict_database
):
    receiver = Receiver().start()
    topic = unique_name("rebound")
    conn = await asyncpg.connect(strict_database)
    try:
        await conn.execute("SELECT postbox.create_topic($1)", topic)
        # Made by SQL, past the API's check, as if the name had resolved elsewhere then.
        await conn.execute(
            "SELECT postbox.create_subscription($1, 'hook', '#', webhook_url => $2, "
            """webhook_settings => '{"max_attempts": 1}')""",
            topic,
            f"http://localhost:{receiver.port}/rebound",
        )
        strict_topics.Publish(tpb.PublishRequest(topic=topic, body=b"secret"))
        request = tpb.ListWebhookDeliveriesRequest(
            topic=topic, subscription="hook", state=tpb.WEBHOOK_DELIVERY_STATE_FAILED
        )
        failed = await asyncio.to_thread(
            eventually,
            lambda: list(strict_topics.ListWebhookDeliveries(request).deliveries),
            20,
            "the delivery failed",
        )
        (delivery,) = failed
        assert "a loopback address" in delivery.last_error
        assert "--webhook-allow-cidr" in delivery.last_error
        assert receiver.on("/rebound") == []
    finally:
        await conn.close()
        receiver.stop()


def test_an_allowed_range_is_reached(channel, topics_stub_for_default_server):
    """The shared test server allows loopback (127.0.0.0/8, ::1): its receivers work,
    as every webhook test shows; here, the create check passes for loopback."""
    topics = topics_stub_for_default_server
    topic = unique_name("allowed")
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    created = _subscribe(topics, topic, "http://127.0.0.1:9/hook").subscription
    assert created.webhook.url == "http://127.0.0.1:9/hook"


@pytest.fixture
def topics_stub_for_default_server(channel) -> topic_service_pb2_grpc.TopicServiceStub:
    return topic_service_pb2_grpc.TopicServiceStub(channel)
