"""Tenants at the AWS door (issue 47): each tenant's key sees its tenant's account id in
its queue URLs and ARNs, topic and subscription ARNs, through real boto3 against a real
server and shim; a URL or ARN of another account is a missing resource. And the server's
queue metrics name the tenant.

A database, server and shim of their own: keys turn authentication on for every server
of a database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import boto3
import grpc
import pytest
from auth_support import bearer, wait_key_works
from botocore.config import Config
from botocore.exceptions import ClientError
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import access_service_pb2_grpc
from support import (
    SQS_ACCOUNT,
    ServerProcess,
    SqsShimProcess,
    bootstrap_key,
    create_database,
    drop_database,
    eventually,
    metric,
    scrape,
    sqs_client,
)

ACME, GLOBEX = "acme", "globex"


@dataclass
class Tenant:
    account: str
    sqs: Any
    sns: Any


@dataclass
class World:
    endpoint: str
    metrics_port: int
    default: Tenant
    tenants: dict[str, Tenant]
    # acme's key with send on acme's "orders" only.
    acme_sender: Any


def _sns_client(endpoint: str, access_key: str, secret: str) -> Any:
    return boto3.client(
        "sns",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=access_key,
        aws_secret_access_key=secret,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


@pytest.fixture(scope="module")
def world(admin_url: str) -> Iterator[World]:
    url = create_database(admin_url, "postbox_tenant_accounts")
    server = shim = None
    try:
        server = ServerProcess(url, metrics=True).start()
        admin_secret = bootstrap_key(url, "root", "admin:*")
        # Loopback webhooks allowed: the http endpoints of tests here are on 127.0.0.1.
        shim = SqsShimProcess(server.target, "--webhook-allow-cidr", "127.0.0.0/8").start()
        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)
            admin = bearer(admin_secret)

            wait_key_works(access, admin)

            def key(name: str, tenant: str, permission: str, pattern: str) -> str:
                grant = access_pb.Grant(
                    permission=access_pb.Permission.Value(f"PERMISSION_{permission.upper()}"),
                    pattern=pattern,
                )
                created = access.CreateKey(
                    access_pb.CreateKeyRequest(
                        key=access_pb.Key(name=name, tenant=tenant, grants=[grant])
                    ),
                    metadata=admin,
                )
                return created.sigv4_secret_access_key

            def clients(name: str, tenant: str, account: str) -> Tenant:
                secret = key(name, tenant, "admin", "*")
                return Tenant(
                    account,
                    sqs_client(shim.endpoint, "json", name, secret),
                    _sns_client(shim.endpoint, name, secret),
                )

            tenants = {}
            for name in (ACME, GLOBEX):
                created = access.CreateTenant(
                    access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name=name)),
                    metadata=admin,
                ).tenant
                tenants[name] = clients(f"{name}-admin", name, created.account_id)
            assert tenants[ACME].account != tenants[GLOBEX].account
            sender = sqs_client(
                shim.endpoint, "json", "acme-sender", key("acme-sender", ACME, "send", "orders")
            )
            default = clients("default-admin", "", SQS_ACCOUNT)
        assert server.metrics_port is not None
        yield World(shim.endpoint, server.metrics_port, default, tenants, sender)
    finally:
        if shim is not None:
            shim.stop()
        if server is not None:
            server.stop()
        drop_database(admin_url, url)


def _error(call: Callable[[], Any]) -> tuple[str, str]:
    """(code, message) of a failed call; ("OK", "") when it succeeds."""
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"], error.response["Error"].get("Message", "")
    return "OK", ""


def _queue(tenant: Tenant, name: str, **attributes: str) -> str:
    return tenant.sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]


def _arn_of(tenant: Tenant, url: str) -> str:
    attributes = tenant.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attributes["Attributes"]["QueueArn"]


NON_EXISTENT_QUEUE = "AWS.SimpleQueueService.NonExistentQueue"


def test_each_tenants_orders_queue_carries_its_tenants_account(world: World) -> None:
    for tenant in (*world.tenants.values(), world.default):
        url = _queue(tenant, "orders")
        assert url == f"{world.endpoint}/{tenant.account}/orders"
        assert _arn_of(tenant, url) == f"arn:aws:sqs:us-east-1:{tenant.account}:orders"
        assert tenant.sqs.get_queue_url(QueueName="orders")["QueueUrl"] == url
        assert tenant.sqs.list_queues(QueueNamePrefix="orders")["QueueUrls"] == [url]


def test_a_url_or_arn_of_another_tenants_account_is_a_missing_queue(world: World) -> None:
    acme, globex = world.tenants[ACME], world.tenants[GLOBEX]
    globex_url = _queue(globex, "orders")
    _queue(acme, "orders")
    # acme's key on globex's URL: what a queue that is nowhere gives, never globex's.
    nowhere = f"{world.endpoint}/{acme.account}/no-such-queue"
    for url in (globex_url, world.default.sqs.get_queue_url(QueueName="orders")["QueueUrl"]):
        for call in (
            lambda u: acme.sqs.send_message(QueueUrl=u, MessageBody="stray"),
            lambda u: acme.sqs.receive_message(QueueUrl=u),
            lambda u: acme.sqs.get_queue_attributes(QueueUrl=u, AttributeNames=["All"]),
            lambda u: acme.sqs.purge_queue(QueueUrl=u),
        ):
            foreign = _error(lambda c=call, u=url: c(u))
            assert foreign == _error(lambda c=call: c(nowhere))
            assert foreign[0] == NON_EXISTENT_QUEUE
    # The default tenant's admin reaches no tenant's queue by its URL either.
    refused = _error(lambda: world.default.sqs.send_message(QueueUrl=globex_url, MessageBody="x"))
    assert refused[0] == NON_EXISTENT_QUEUE
    # Nothing reached globex's queue.
    received = globex.sqs.receive_message(QueueUrl=globex_url, WaitTimeSeconds=0)
    assert received.get("Messages", []) == []
    # An ARN of another account, in a redrive policy or a move task.
    globex_dlq = _arn_of(globex, _queue(globex, "orders-dlq"))
    policy = {"deadLetterTargetArn": globex_dlq, "maxReceiveCount": "3"}
    missing = {"deadLetterTargetArn": globex_dlq.replace(globex.account, acme.account)}
    create = lambda p: acme.sqs.create_queue(  # noqa: E731
        QueueName="orders-src", Attributes={"RedrivePolicy": json.dumps({**policy, **p})}
    )
    # SQS refuses a dead-letter queue of another account as it refuses a missing one,
    # in words that do not depend on whether globex's queue is there.
    refused = _error(lambda: create({}))
    assert refused[0] == _error(lambda: create(missing))[0] == "InvalidParameterValue"
    assert "owner should be same as the source" in refused[1]
    absent = {"deadLetterTargetArn": globex_dlq.replace("orders-dlq", "absent-dlq")}
    assert _error(lambda: create(absent)) == (
        refused[0],
        refused[1].replace("orders-dlq", "absent-dlq"),
    )
    move = lambda arn: acme.sqs.start_message_move_task(SourceArn=arn)  # noqa: E731
    moved = _error(lambda: move(globex_dlq))
    assert moved[0] == _error(lambda: move(missing["deadLetterTargetArn"]))[0]
    assert moved == _error(lambda: move(absent["deadLetterTargetArn"]))
    assert moved[0] == "ResourceNotFoundException"


def test_a_key_with_one_grant_gets_its_tenants_account(world: World) -> None:
    """A key that may only send to one queue still learns its account (GetCallerTenant
    needs no grant), so the URL its tenant handed out works."""
    url = _queue(world.tenants[ACME], "orders")
    sent = world.acme_sender.send_message(QueueUrl=url, MessageBody="narrow")
    assert sent["MessageId"]
    assert world.acme_sender.get_queue_url(QueueName="orders")["QueueUrl"] == url
    # The key holds no more than that: listing needs read.
    assert _error(lambda: world.acme_sender.list_queues())[0] == "AccessDenied"


def test_a_redrive_policy_names_its_dead_letter_queue_by_an_arn_of_the_tenant(
    world: World,
) -> None:
    acme = world.tenants[ACME]
    dlq_url = _queue(acme, "jobs-dlq")
    dlq_arn = _arn_of(acme, dlq_url)
    assert dlq_arn == f"arn:aws:sqs:us-east-1:{acme.account}:jobs-dlq"
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    url = _queue(acme, "jobs", RedrivePolicy=policy)
    attributes = acme.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert json.loads(attributes["Attributes"]["RedrivePolicy"])["deadLetterTargetArn"] == dlq_arn
    sources = acme.sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"]
    assert sources == [url]
    acme.sqs.send_message(QueueUrl=url, MessageBody="poison")
    first = acme.sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=5)
    assert [m["Body"] for m in first["Messages"]] == ["poison"]

    # Its second receive is past maxReceiveCount: the message moves to the tenant's DLQ.
    def dead_lettered() -> list[dict[str, Any]] | None:
        acme.sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=0)
        found = acme.sqs.receive_message(
            QueueUrl=dlq_url, WaitTimeSeconds=1, AttributeNames=["All"]
        ).get("Messages")
        return found or None

    (moved,) = eventually(dead_lettered, 30, "the message in jobs-dlq")  # type: ignore[misc]
    assert moved["Body"] == "poison"


def test_topic_and_subscription_arns_carry_the_tenants_account(world: World) -> None:
    acme, globex = world.tenants[ACME], world.tenants[GLOBEX]
    topics = {}
    for tenant in (acme, globex, world.default):
        topic = tenant.sns.create_topic(Name="news")["TopicArn"]
        assert topic == f"arn:aws:sns:us-east-1:{tenant.account}:news"
        assert [t["TopicArn"] for t in tenant.sns.list_topics()["Topics"]] == [topic]
        topics[tenant.account] = topic
    inbox = _queue(acme, "inbox")
    subscription = acme.sns.subscribe(
        TopicArn=topics[acme.account],
        Protocol="sqs",
        Endpoint=_arn_of(acme, inbox),
        ReturnSubscriptionArn=True,
    )["SubscriptionArn"]
    assert subscription.startswith(f"arn:aws:sns:us-east-1:{acme.account}:news:")
    listed = acme.sns.list_subscriptions_by_topic(TopicArn=topics[acme.account])
    (entry,) = listed["Subscriptions"]
    assert entry["SubscriptionArn"] == subscription
    assert entry["Endpoint"] == f"arn:aws:sqs:us-east-1:{acme.account}:inbox"
    assert entry["Owner"] == acme.account
    acme.sns.publish(TopicArn=topics[acme.account], Message="hello")
    received = acme.sqs.receive_message(QueueUrl=inbox, WaitTimeSeconds=10)
    assert json.loads(received["Messages"][0]["Body"])["TopicArn"] == topics[acme.account]

    # globex's topic by its ARN is, to acme, a topic that is not there.
    nowhere = f"arn:aws:sns:us-east-1:{acme.account}:no-such-topic"
    for call in (
        lambda t: acme.sns.publish(TopicArn=t, Message="stray"),
        lambda t: acme.sns.get_topic_attributes(TopicArn=t),
        lambda t: acme.sns.list_subscriptions_by_topic(TopicArn=t),
    ):
        assert _error(lambda c=call: c(topics[globex.account]))[0] == "NotFound"
        assert _error(lambda c=call: c(nowhere))[0] == "NotFound"
    # Deleting a missing topic is no error in SNS: nor is deleting another's, which stays.
    acme.sns.delete_topic(TopicArn=topics[globex.account])
    assert globex.sns.get_topic_attributes(TopicArn=topics[globex.account])["Attributes"]
    foreign_subscription = subscription.replace(acme.account, globex.account)
    refused = _error(lambda: globex.sns.unsubscribe(SubscriptionArn=subscription))
    assert refused[0] == "NotFound"
    refused = _error(lambda: acme.sns.unsubscribe(SubscriptionArn=foreign_subscription))
    assert refused[0] == "NotFound"
    assert acme.sns.list_subscriptions_by_topic(TopicArn=topics[acme.account])["Subscriptions"]

    # An SQS endpoint of another account: no tenant's topic delivers into another's
    # queue, the default tenant's admin's included.
    for tenant, endpoint in (
        (globex, f"arn:aws:sqs:us-east-1:{acme.account}:inbox"),
        (world.default, f"arn:aws:sqs:us-east-1:{acme.account}:inbox"),
        (acme, f"arn:aws:sqs:us-east-1:{SQS_ACCOUNT}:orders"),
    ):
        refused = _error(
            lambda t=tenant, e=endpoint: t.sns.subscribe(
                TopicArn=topics[t.account], Protocol="sqs", Endpoint=e
            )
        )
        assert refused[0] == "NotFound", refused


def test_queue_metrics_name_the_tenant_and_the_tenants_queue_name(world: World) -> None:
    acme = world.tenants[ACME]
    url = _queue(acme, "metered")
    acme.sqs.send_message(QueueUrl=url, MessageBody="counted")
    _queue(world.default, "metered")

    def shown() -> dict | None:
        samples = scrape(world.metrics_port)
        sent = metric(samples, "postbox_messages_sent_total", tenant=ACME, queue="metered")
        visible = metric(samples, "postbox_queue_messages_visible", tenant=ACME, queue="metered")
        return samples if sent == 1 and visible == 1 else None

    samples = eventually(shown, 30, "acme's metered queue in the metrics")
    assert isinstance(samples, dict)
    # The default tenant's queue of the same name is its own series, without a tenant.
    assert metric(samples, "postbox_queue_messages_visible", queue="metered") == 0
    assert ("postbox_queue_messages_visible", frozenset({("queue", "metered")})) in samples
    assert not any("/" in dict(labels).get("queue", "") for _, labels in samples)


def test_a_wrong_secret_learns_nothing_of_a_keys_account(world: World) -> None:
    """The shim knows acme-admin's account from its last request; someone with the key's
    name but not its secret is refused for the signature whatever account the URL names,
    so cannot test a guess of acme's account id."""
    acme, globex = world.tenants[ACME], world.tenants[GLOBEX]
    acme_url = _queue(acme, "orders")  # acme-admin's account is known to the shim now
    guesser = sqs_client(world.endpoint, "json", "acme-admin", "not-the-secret")
    for url in (acme_url, _queue(globex, "orders"), f"{world.endpoint}/123456789012/orders"):
        refused = _error(lambda u=url: guesser.send_message(QueueUrl=u, MessageBody="x"))
        assert refused[0] == "SignatureDoesNotMatch", (url, refused)
        refused = _error(
            lambda u=url: guesser.get_queue_url(
                QueueName="orders", QueueOwnerAWSAccountId=u.split("/")[-2]
            )
        )
        assert refused[0] == "SignatureDoesNotMatch", (url, refused)


def test_an_unsubscribe_token_restores_the_subscription_in_its_tenant(world: World) -> None:
    from test_sns import _Endpoint

    acme, globex = world.tenants[ACME], world.tenants[GLOBEX]
    topic = acme.sns.create_topic(Name="restored")["TopicArn"]
    globex.sns.create_topic(Name="restored")
    with _Endpoint() as endpoint:
        acme.sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
        ((_, body),) = eventually(
            lambda: endpoint.of_type("SubscriptionConfirmation"), what="the confirmation"
        )
        arn = acme.sns.confirm_subscription(TopicArn=topic, Token=json.loads(body)["Token"])[
            "SubscriptionArn"
        ]
        acme.sns.unsubscribe(SubscriptionArn=arn)
        ((_, body),) = eventually(
            lambda: endpoint.of_type("UnsubscribeConfirmation"), what="the unsubscribe"
        )
        unsubscribed = json.loads(body)
        # Another tenant's topic of that name: the token restores nothing there.
        foreign = topic.replace(acme.account, globex.account)
        assert _error(
            lambda: globex.sns.confirm_subscription(TopicArn=foreign, Token=unsubscribed["Token"])
        ) == ("InvalidParameter", "Invalid parameter: Token")
        # Restored by the tenant's own call (an unsigned visit of SubscribeURL reaches the
        # server with the shim's key, which no tenant's subscriptions answer to).
        restored = acme.sns.confirm_subscription(TopicArn=topic, Token=unsubscribed["Token"])
        assert restored["SubscriptionArn"] == arn
        (listed,) = acme.sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
        assert (listed["SubscriptionArn"], listed["Owner"]) == (arn, acme.account)
        assert globex.sns.list_subscriptions_by_topic(TopicArn=foreign)["Subscriptions"] == []
