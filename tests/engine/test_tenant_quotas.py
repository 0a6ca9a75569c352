"""Tenants' quotas (issue 47): a tenant past its max_queues or max_topics cannot create
one more; past its max_messages or max_bytes, no send of any door (gRPC Send, SendBatch,
SendStream, Publish, REST, SQS SendMessage and SendMessageBatch) stores anything.
Message and byte quotas are checked against each server's snapshot of the tenants'
usage, so each test fills a tenant up, waits until the server's snapshot (GetTenant's
usage) shows it, and then sends. Quotas are set and changed through CreateTenant and
UpdateTenant's field mask; bad ones are refused; `postbox status --tenant` and the
metrics show usage against them.

A database, server and shim of their own: keys turn authentication on.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import grpc
import pytest
from auth_support import bearer, wait_key_works
from botocore.exceptions import ClientError
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)
from support import (
    HttpServerProcess,
    SqsShimProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    eventually,
    metric,
    postbox,
    run_sql,
    scrape,
    sqs_client,
)

# Seconds between the test server's counts of the tenants' usage.
REFRESH = 0.2


@dataclass
class World:
    database_url: str
    server: HttpServerProcess
    shim_endpoint: str
    access: access_service_pb2_grpc.AccessServiceStub
    admin: list[tuple[str, str]]
    admin_secret: str


@dataclass
class Tenant:
    """A tenant and its admin key: gRPC metadata, and its SQS credentials."""

    name: str
    metadata: list[tuple[str, str]]
    secret: str
    key_name: str
    sigv4_secret: str


@pytest.fixture(scope="module")
def world(admin_url: str) -> Iterator[World]:
    url = create_database(admin_url, "postbox_tenant_quotas")
    server = shim = None
    try:
        server = HttpServerProcess(
            url, "--quota-refresh-interval", str(REFRESH), metrics=True
        ).start()
        admin_secret = bootstrap_key(url, "root", "admin:*")
        shim = SqsShimProcess(server.target).start()
        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)
            admin = bearer(admin_secret)

            wait_key_works(access, admin)
            yield World(url, server, shim.endpoint, access, admin, admin_secret)
    finally:
        if shim is not None:
            shim.stop()
        if server is not None:
            server.stop()
        drop_database(admin_url, url)


@pytest.fixture
def channel(world: World) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(world.server.target) as channel:
        yield channel


def _tenant(world: World, name: str, **quota: int) -> Tenant:
    world.access.CreateTenant(
        access_pb.CreateTenantRequest(
            tenant=access_pb.Tenant(name=name, quota=access_pb.TenantQuota(**quota))
        ),
        metadata=world.admin,
    )
    grant = access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")
    created = world.access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name=f"{name}-admin", tenant=name, grants=[grant])
        ),
        metadata=world.admin,
    )
    return Tenant(
        name, bearer(created.secret), created.secret, f"{name}-admin",
        created.sigv4_secret_access_key,
    )  # fmt: skip


def _usage(world: World, tenant: str) -> access_pb.TenantUsage:
    return world.access.GetTenant(
        access_pb.GetTenantRequest(name=tenant), metadata=world.admin
    ).usage


def _wait_counted(world: World, tenant: str, *, messages: int, size: int | None = None) -> None:
    """Until the server's snapshot, which its sends are checked against, shows this."""
    eventually(
        lambda: (
            _usage(world, tenant).messages == messages
            and (size is None or _usage(world, tenant).bytes == size)
        ),
        what=f"tenant {tenant} counted with {messages} messages",
    )


def _create_queue(channel: grpc.Channel, tenant: Tenant, name: str) -> None:
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
        metadata=tenant.metadata,
    )


def _depth(channel: grpc.Channel, tenant: Tenant, queue: str) -> int:
    stats = (
        queue_service_pb2_grpc.QueueServiceStub(channel)
        .GetQueue(
            queue_service_pb2.GetQueueRequest(name=queue, view=queue_service_pb2.QUEUE_VIEW_FULL),
            metadata=tenant.metadata,
        )
        .queue.stats
    )
    return stats.visible_messages + stats.in_flight_messages + stats.delayed_messages


def _send(channel: grpc.Channel, tenant: Tenant, queue: str, body: bytes) -> None:
    message_service_pb2_grpc.MessageServiceStub(channel).Send(
        message_service_pb2.SendRequest(queue=queue, body=body), metadata=tenant.metadata
    )


def test_creating_past_the_queue_and_topic_quota_is_refused(
    world: World, channel: grpc.Channel
) -> None:
    tenant = _tenant(world, "few-queues", max_queues=2, max_topics=1)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    _create_queue(channel, tenant, "one")
    _create_queue(channel, tenant, "two")
    error = error_of(
        queues.CreateQueue,
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="three")),
        metadata=tenant.metadata,
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details() == (
        "tenant 'few-queues' is at its quota of 2 queues (max_queues); "
        "delete one or raise the quota"
    )
    # The create was undone; an existing name is still ALREADY_EXISTS, not the quota.
    listed = queues.ListQueues(queue_service_pb2.ListQueuesRequest(), metadata=tenant.metadata)
    assert [q.name for q in listed.queues] == ["one", "two"]
    error = error_of(
        queues.CreateQueue,
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="two")),
        metadata=tenant.metadata,
    )
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS

    create_topic = topic_service_pb2.CreateTopicRequest
    topics.CreateTopic(
        create_topic(topic=topic_service_pb2.Topic(name="t1")), metadata=tenant.metadata
    )
    error = error_of(
        topics.CreateTopic,
        create_topic(topic=topic_service_pb2.Topic(name="t2")),
        metadata=tenant.metadata,
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "quota of 1 topics (max_topics)" in error.details()

    # Raising the quota (one field of it, by the mask) lets the next one in.
    request = access_pb.UpdateTenantRequest(
        tenant=access_pb.Tenant(name=tenant.name, quota=access_pb.TenantQuota(max_queues=3))
    )
    request.update_mask.paths.append("quota.max_queues")
    changed = world.access.UpdateTenant(request, metadata=world.admin).tenant
    assert (changed.quota.max_queues, changed.quota.max_topics) == (3, 1)
    _create_queue(channel, tenant, "three")


def test_sends_past_the_message_quota_store_nothing(world: World, channel: grpc.Channel) -> None:
    tenant = _tenant(world, "few-messages", max_messages=3)
    _create_queue(channel, tenant, "orders")
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    topics.CreateTopic(
        topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name="events")),
        metadata=tenant.metadata,
    )
    topics.CreateSubscription(
        topic_service_pb2.CreateSubscriptionRequest(
            subscription=topic_service_pb2.Subscription(topic="events", name="s", queue="orders")
        ),
        metadata=tenant.metadata,
    )
    _send(channel, tenant, "orders", b"one")
    messages.SendBatch(
        message_service_pb2.SendBatchRequest(
            queue="orders",
            entries=[message_service_pb2.SendBatchEntry(body=b) for b in (b"two", b"three")],
        ),
        metadata=tenant.metadata,
    )
    _wait_counted(world, tenant.name, messages=3)

    refusals = []
    refusals.append(
        error_of(
            messages.Send,
            message_service_pb2.SendRequest(queue="orders", body=b"four"),
            metadata=tenant.metadata,
        )
    )
    refusals.append(
        error_of(
            messages.SendBatch,
            message_service_pb2.SendBatchRequest(
                queue="orders", entries=[message_service_pb2.SendBatchEntry(body=b"four")]
            ),
            metadata=tenant.metadata,
        )
    )
    refusals.append(
        error_of(
            topics.Publish,
            topic_service_pb2.PublishRequest(topic="events", body=b"four"),
            metadata=tenant.metadata,
        )
    )
    for error in refusals:
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.details().startswith(
            "tenant 'few-messages' holds 3 messages and its quota max_messages is 3, so 1 more "
            "do not fit; receive some or raise the quota"
        )
    stream = messages.SendStream(
        iter(
            [
                message_service_pb2.SendStreamRequest(
                    tag=1, send=message_service_pb2.SendRequest(queue="orders", body=b"four")
                )
            ]
        ),
        metadata=tenant.metadata,
    )
    (result,) = [r for response in stream for r in response.results]
    assert result.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "max_messages is 3" in result.error.message
    batches = messages.SendBatchStream(
        iter(
            [
                message_service_pb2.SendBatchStreamRequest(
                    tag=1,
                    batch=message_service_pb2.SendBatchRequest(
                        queue="orders", entries=[message_service_pb2.SendBatchEntry(body=b"4")]
                    ),
                )
            ]
        ),
        metadata=tenant.metadata,
    )
    (result,) = [r for response in batches for r in response.results]
    assert result.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "max_messages is 3" in result.error.message

    request = urllib.request.Request(
        f"{world.server.base}/v1/queues/orders/messages",
        data=json.dumps({"message": {"n": 4}}).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {tenant.secret}"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 429
    assert "max_messages is 3" in caught.value.read().decode()

    assert _depth(channel, tenant, "orders") == 3

    # Receiving and deleting one makes room once the server has counted again.
    received = messages.Receive(
        message_service_pb2.ReceiveRequest(queue="orders", max_messages=1),
        metadata=tenant.metadata,
    )
    (message,) = [m for response in received for m in response.messages]
    messages.Delete(
        message_service_pb2.DeleteRequest(queue="orders", receipt=message.receipt),
        metadata=tenant.metadata,
    )
    _wait_counted(world, tenant.name, messages=2)
    _send(channel, tenant, "orders", b"four")
    assert _depth(channel, tenant, "orders") == 3


def test_sends_past_the_byte_quota_are_refused(world: World, channel: grpc.Channel) -> None:
    tenant = _tenant(world, "few-bytes", max_bytes=10)
    _create_queue(channel, tenant, "blobs")
    _send(channel, tenant, "blobs", b"12345678")
    _wait_counted(world, tenant.name, messages=1, size=8)
    error = error_of(
        message_service_pb2_grpc.MessageServiceStub(channel).Send,
        message_service_pb2.SendRequest(queue="blobs", body=b"123"),
        metadata=tenant.metadata,
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error.details().startswith(
        "tenant 'few-bytes' holds 8 bytes of messages and its quota max_bytes is 10, so 3 more "
        "bytes do not fit"
    )
    _send(channel, tenant, "blobs", b"12")  # exactly up to the quota
    assert _depth(channel, tenant, "blobs") == 2


def test_sqs_sends_past_the_quota_are_over_limit(world: World, channel: grpc.Channel) -> None:
    tenant = _tenant(world, "sqs-quota", max_messages=1)
    sqs = sqs_client(world.shim_endpoint, "json", tenant.key_name, tenant.sigv4_secret)
    url = sqs.create_queue(QueueName="jobs")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="first")
    _wait_counted(world, tenant.name, messages=1)
    for send in (
        lambda: sqs.send_message(QueueUrl=url, MessageBody="second"),
        lambda: sqs.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "second"}]
        ),
    ):
        with pytest.raises(ClientError) as caught:
            send()
        assert caught.value.response["Error"]["Code"] == "OverLimit"
        assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        assert "max_messages is 1" in caught.value.response["Error"]["Message"]
    assert _depth(channel, tenant, "jobs") == 1


def test_the_default_tenant_and_tenants_without_quota_are_not_limited(
    world: World, channel: grpc.Channel
) -> None:
    free = _tenant(world, "no-quota")
    _create_queue(channel, free, "q")
    for _ in range(5):
        _send(channel, free, "q", b"x" * 100)
    _wait_counted(world, free.name, messages=5, size=500)
    _send(channel, free, "q", b"more")
    default = bearer(world.admin_secret)
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="default-q")),
        metadata=default,
    )
    message_service_pb2_grpc.MessageServiceStub(channel).Send(
        message_service_pb2.SendRequest(queue="default-q", body=b"x"), metadata=default
    )


def test_quota_changes_by_field_mask(world: World) -> None:
    _tenant(world, "masked", max_queues=5, max_messages=100)

    def update(paths: list[str], **quota: int) -> access_pb.TenantQuota:
        request = access_pb.UpdateTenantRequest(
            tenant=access_pb.Tenant(name="masked", quota=access_pb.TenantQuota(**quota))
        )
        request.update_mask.paths.extend(paths)
        return world.access.UpdateTenant(request, metadata=world.admin).tenant.quota

    # One field: the others stay.
    assert update(["quota.max_bytes"], max_bytes=4096, max_queues=1) == access_pb.TenantQuota(
        max_queues=5, max_messages=100, max_bytes=4096
    )
    # "quota": every field, as given (unset: no limit).
    assert update(["quota"], max_topics=7) == access_pb.TenantQuota(max_topics=7)
    got = world.access.GetTenant(access_pb.GetTenantRequest(name="masked"), metadata=world.admin)
    assert got.tenant.quota == access_pb.TenantQuota(max_topics=7)
    assert update(["quota"]) == access_pb.TenantQuota()
    error = error_of(
        world.access.UpdateTenant,
        access_pb.UpdateTenantRequest(
            tenant=access_pb.Tenant(name="masked"),
            update_mask={"paths": ["quota.max_widgets"]},
        ),
        metadata=world.admin,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "quota.max_queues" in error.details()


@pytest.fixture(scope="module")
def unlimited_tenant(world: World) -> str:
    world.access.CreateTenant(
        access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="unlimited")),
        metadata=world.admin,
    )
    return "unlimited"


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        (
            {"max_queues": -1},
            "quota.max_queues is '-1'; give a whole number from 0 (no limit) to 1000000",
        ),
        (
            {"max_topics": 1_000_001},
            "quota.max_topics is '1000001'; give a whole number from 0 (no limit) to 1000000",
        ),
        (
            {"max_messages": -5},
            "quota.max_messages is '-5'; give a whole number from 0 (no limit) to 1000000000000",
        ),
        (
            {"max_bytes": 2**62},
            f"quota.max_bytes is '{2**62}'; give a whole number from 0 (no limit) to "
            "1125899906842624",
        ),
    ],
)
def test_bad_quotas_are_invalid(
    world: World, unlimited_tenant: str, quota: dict[str, int], message: str
) -> None:
    error = error_of(
        world.access.CreateTenant,
        access_pb.CreateTenantRequest(
            tenant=access_pb.Tenant(name="bad-quota", quota=access_pb.TenantQuota(**quota))
        ),
        metadata=world.admin,
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == message
    request = access_pb.UpdateTenantRequest(
        tenant=access_pb.Tenant(name=unlimited_tenant, quota=access_pb.TenantQuota(**quota))
    )
    request.update_mask.paths.append("quota")
    error = error_of(world.access.UpdateTenant, request, metadata=world.admin)
    assert (error.code(), error.details()) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_status_and_metrics_show_usage_against_quotas(world: World, channel: grpc.Channel) -> None:
    tenant = _tenant(world, "watched", max_queues=4, max_messages=10)
    _create_queue(channel, tenant, "a")
    for body in (b"abc", b"defgh"):
        _send(channel, tenant, "a", body)
    _wait_counted(world, tenant.name, messages=2, size=8)

    env = {"POSTBOX_API_KEY": world.admin_secret, "POSTBOX_TARGET": world.server.target}
    shown = postbox("status", "--tenant", "watched", "-o", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {row["usage"]: row for row in json.loads(shown.stdout)}
    assert {usage: (row["used"], row["quota"]) for usage, row in rows.items()} == {
        "queues": (1, 4),
        "topics": (0, "none"),
        "messages": (2, 10),
        "bytes": (8, "none"),
    }
    assert rows["messages"]["used_pct"] == 20.0
    table = postbox("status", "--tenant", "watched", env=env)
    assert table.returncode == 0, table.stderr
    assert "messages" in table.stdout
    assert "20.0" in table.stdout

    assert world.server.metrics_port is not None
    samples: dict[Any, float] = {}

    def scraped() -> bool:
        samples.update(scrape(world.server.metrics_port))  # type: ignore[arg-type]
        return metric(samples, "postbox_tenant_messages", tenant="watched") == 2

    eventually(scraped, what="tenant metrics")
    assert metric(samples, "postbox_tenant_queues", tenant="watched") == 1
    assert metric(samples, "postbox_tenant_bytes", tenant="watched") == 8
    assert metric(samples, "postbox_tenant_quota_messages", tenant="watched") == 10
    assert ("postbox_tenant_quota_bytes", frozenset({("tenant", "watched")})) not in samples


def test_tenant_cli_sets_quotas(world: World) -> None:
    env = {"POSTBOX_API_KEY": world.admin_secret, "POSTBOX_TARGET": world.server.target}
    made = postbox("tenants", "create", "cli-quota", "--max-queues", "3", "-o", "json", env=env)
    assert made.returncode == 0, made.stderr
    # Proto JSON: every field shown, 64-bit numbers as strings.
    unlimited = {"max_queues": 0, "max_topics": 0, "max_messages": "0", "max_bytes": "0"}
    assert json.loads(made.stdout)["quota"] == {**unlimited, "max_queues": 3}
    changed = postbox(
        "tenants", "update", "cli-quota", "--max-messages", "50", "--max-bytes", "0",
        "-o", "json", env=env,
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["quota"] == {
        **unlimited,
        "max_queues": 3,
        "max_messages": "50",
    }
    refused = postbox("tenants", "update", "cli-quota", "--max-topics", "-2", env=env)
    assert refused.returncode != 0
    assert "quota.max_topics is '-2'" in refused.stderr


def test_the_servers_share_one_count_per_interval(world: World) -> None:
    """postbox.tenant_usage counts one session at a time: while another session counts
    (here: holds its lock), it answers the last count at once, and counts again once the
    lock is free (max_age 0: any count is too old)."""

    async def run() -> None:
        counting = await asyncpg.connect(world.database_url)
        asking = await asyncpg.connect(world.database_url)
        usage = "SELECT messages FROM postbox.tenant_usage($1) WHERE tenant_name = 'sql-count'"
        try:
            await asking.execute("SELECT postbox.create_tenant('sql-count')")
            await asking.execute("SELECT postbox.create_queue('sql-count/q')")
            async with counting.transaction():
                await counting.execute("SELECT pg_advisory_xact_lock(1886350201, 2)")
                await asking.execute("SELECT postbox.send('sql-count/q', 'a')")
                await asking.execute("SELECT postbox.send('sql-count/q', 'b')")
                assert await asking.fetchval(usage, timedelta(0)) == 0
            deadline = asyncio.get_running_loop().time() + 30
            while await asking.fetchval(usage, timedelta(0)) != 2:
                assert asyncio.get_running_loop().time() < deadline, "never counted again"
                await asyncio.sleep(0.02)
        finally:
            await counting.close()
            await asking.close()

    asyncio.run(run())


def test_a_quota_set_elsewhere_wakes_a_server_that_counted_no_quotas(admin_url: str) -> None:
    """While no tenant has a message or byte quota, a server counts usage only every
    IDLE_REFRESH_INTERVAL (60 s), so that an idle server stays quiet; a quota set anywhere
    (here in SQL, as another server or `postbox tenants update --database-url` would)
    reaches it by the tenants' NOTIFY, and its sends are refused at once, not a minute on."""
    url = create_database(admin_url, "postbox_quota_wake")
    server = None
    try:
        server = HttpServerProcess(url, "--quota-refresh-interval", str(REFRESH)).start()
        admin = bearer(bootstrap_key(url, "root", "admin:*"))
        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)
            wait_key_works(access, admin)
            access.CreateTenant(
                access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="late")),
                metadata=admin,
            )
            grant = access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")
            secret = access.CreateKey(
                access_pb.CreateKeyRequest(
                    key=access_pb.Key(name="late-admin", tenant="late", grants=[grant])
                ),
                metadata=admin,
            ).secret
            tenant = Tenant("late", bearer(secret), secret, "late-admin", "")
            _create_queue(channel, tenant, "orders")
            _send(channel, tenant, "orders", b"one")
            _send(channel, tenant, "orders", b"two")  # no quota: taken
            run_sql(
                url,
                """SELECT postbox.update_tenant('late', false, NULL, false, NULL,
                                                           '{"max_messages": 1}')""",
            )
            messages = message_service_pb2_grpc.MessageServiceStub(channel)
            request = message_service_pb2.SendRequest(queue="orders", body=b"three")

            def refused() -> grpc.StatusCode | None:
                try:
                    messages.Send(request, metadata=tenant.metadata)
                except grpc.RpcError as error:
                    return error.code()
                return None

            # 20 s: the count follows the NOTIFY at once, on a loaded machine within
            # seconds; without the wake-up it would come after the 60 s idle interval.
            status = eventually(refused, timeout=20.0, what="a send refused past the new quota")
            assert status == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        if server is not None:
            server.stop()
        drop_database(admin_url, url)
