"""Tenants (issue 47): a tenant is a namespace. Two tenants keep queues of one name apart;
a tenant's key, `*` grants and all, cannot list, read, send to or even detect another
tenant's (or the default tenant's) resources; and every RPC, with a key of tenant A, on a
resource of tenant B, is refused (the authorisation matrix's tenant axis).

A database and server of their own, as test_auth.py: keys turn authentication on.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import asyncpg
import grpc
import pytest
from auth_support import METHODS, bearer, wait_until
from google.protobuf import message_factory
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)
from support import HttpServerProcess, bootstrap_key, create_database, drop_database, error_of

from postbox_server.auth.rules import ANY_RESOURCE, RULES

TENANT_A, TENANT_B, TENANT_C = "acme", "globex", "initech"
# Exists as a queue, a topic and a schedule in tenant B and in the default tenant.
SHARED = "authz-tenant"


@dataclass
class World:
    default_admin: str
    admins: dict[str, str]  # per tenant: a key with admin:*


@pytest.fixture(scope="module")
def tenant_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_tenants")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def tenant_server(tenant_database: str) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(tenant_database).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def channel(tenant_server: HttpServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(tenant_server.target) as channel:
        yield channel


def _admin_grant() -> access_pb.Grant:
    return access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")


def _create_everything(channel: grpc.Channel, secret: str, name: str) -> None:
    """A queue, a topic and a schedule (firing into the queue) named `name`."""
    metadata = bearer(secret)
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
        metadata=metadata,
    )
    topic_service_pb2_grpc.TopicServiceStub(channel).CreateTopic(
        topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name=name)),
        metadata=metadata,
    )
    schedule_service_pb2_grpc.ScheduleServiceStub(channel).CreateSchedule(
        schedule_service_pb2.CreateScheduleRequest(
            schedule=schedule_service_pb2.Schedule(
                name=name,
                interval={"seconds": 3600},
                target=schedule_service_pb2.ScheduleTarget(queue=name),
                body=b"tick",
            )
        ),
        metadata=metadata,
    )


@pytest.fixture(scope="module")
def world(tenant_database: str, channel: grpc.Channel) -> World:
    default_admin = bootstrap_key(tenant_database, "tenants-admin", "admin:*")
    access = access_service_pb2_grpc.AccessServiceStub(channel)
    wait_until(
        lambda: _ok(
            lambda: access.ListTenants(
                access_pb.ListTenantsRequest(), metadata=bearer(default_admin)
            )
        ),
        5,
        "the first key",
    )
    admins = {}
    for tenant in (TENANT_A, TENANT_B, TENANT_C):
        access.CreateTenant(
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name=tenant)),
            metadata=bearer(default_admin),
        )
        created = access.CreateKey(
            access_pb.CreateKeyRequest(
                key=access_pb.Key(name=f"{tenant}-admin", grants=[_admin_grant()], tenant=tenant)
            ),
            metadata=bearer(default_admin),
        )
        assert created.key.tenant == tenant
        admins[tenant] = created.secret
    _create_everything(channel, default_admin, SHARED)
    _create_everything(channel, admins[TENANT_B], SHARED)
    return World(default_admin, admins)


def _ok(call) -> bool:
    try:
        call()
    except grpc.RpcError:
        return False
    return True


def test_two_tenants_each_have_a_queue_orders_and_their_messages_stay_apart(
    channel: grpc.Channel, world: World, tenant_database: str
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    for tenant in (TENANT_A, TENANT_B):
        created = queues.CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="orders")),
            metadata=bearer(world.admins[tenant]),
        )
        assert created.queue.name == "orders"  # the caller's name, never the stored one
        messages.Send(
            message_service_pb2.SendRequest(queue="orders", body=f"for {tenant}".encode()),
            metadata=bearer(world.admins[tenant]),
        )
    for tenant in (TENANT_A, TENANT_B):
        response = messages.Receive(
            message_service_pb2.ReceiveRequest(queue="orders", max_messages=10),
            metadata=bearer(world.admins[tenant]),
        )
        received = [m for batch in response for m in batch.messages]
        assert [m.body for m in received] == [f"for {tenant}".encode()]
        assert all("/" not in m.queue for m in received)
    stored = asyncio.run(_stored_queue_names(tenant_database))
    assert {f"{TENANT_A}/orders", f"{TENANT_B}/orders"} <= stored
    assert "orders" not in stored  # the default tenant has none


async def _stored_queue_names(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        return {row["name"] for row in await conn.fetch("SELECT name FROM postbox.queues")}
    finally:
        await conn.close()


def test_a_tenants_star_key_cannot_list_get_send_receive_or_delete_anothers(
    channel: grpc.Channel, world: World
) -> None:
    """B and the default tenant have SHARED; A's admin:* key sees none of them, and a
    missing name and a foreign one read the same."""
    a = bearer(world.admins[TENANT_A])
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    listed = queues.ListQueues(queue_service_pb2.ListQueuesRequest(), metadata=a)
    assert SHARED not in {q.name for q in listed.queues}
    listed_topics = topics.ListTopics(topic_service_pb2.ListTopicsRequest(), metadata=a)
    assert SHARED not in {t.name for t in listed_topics.topics}
    listed_schedules = schedules.ListSchedules(
        schedule_service_pb2.ListSchedulesRequest(), metadata=a
    )
    assert SHARED not in {s.name for s in listed_schedules.schedules}
    for response in (listed, listed_topics, listed_schedules):
        assert b"/" not in b"".join(
            item.name.encode() for item in getattr(response, response.DESCRIPTOR.fields[0].name)
        )

    foreign_and_missing = [
        (queues.GetQueue, lambda n: queue_service_pb2.GetQueueRequest(name=n)),
        (queues.DeleteQueue, lambda n: queue_service_pb2.DeleteQueueRequest(name=n)),
        (queues.PurgeQueue, lambda n: queue_service_pb2.PurgeQueueRequest(name=n)),
        (topics.GetTopic, lambda n: topic_service_pb2.GetTopicRequest(name=n)),
        (topics.DeleteTopic, lambda n: topic_service_pb2.DeleteTopicRequest(name=n)),
        (schedules.GetSchedule, lambda n: schedule_service_pb2.GetScheduleRequest(name=n)),
        (schedules.DeleteSchedule, lambda n: schedule_service_pb2.DeleteScheduleRequest(name=n)),
        (messages.Send, lambda n: message_service_pb2.SendRequest(queue=n, body=b"x")),
        (
            topics.Publish,
            lambda n: topic_service_pb2.PublishRequest(topic=n, body=b"x"),
        ),
    ]
    for call, request in foreign_and_missing:
        foreign = error_of(call, request(SHARED), metadata=a)
        missing = error_of(call, request("authz-nowhere"), metadata=a)
        assert foreign.code() == missing.code() == grpc.StatusCode.NOT_FOUND, call
        assert foreign.details() == missing.details().replace("authz-nowhere", SHARED)
        assert "/" not in foreign.details()
    receive = messages.Receive(
        message_service_pb2.ReceiveRequest(queue=SHARED, wait_time={"seconds": 0}), metadata=a
    )
    with pytest.raises(grpc.RpcError) as caught:
        list(receive)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    # Naming another tenant's resource by its stored name is malformed, for every caller.
    for secret in (world.admins[TENANT_A], world.default_admin):
        error = error_of(
            queues.GetQueue,
            queue_service_pb2.GetQueueRequest(name=f"{TENANT_B}/{SHARED}"),
            metadata=bearer(secret),
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "may only contain" in error.details()
    # B's and the default tenant's are all there still.
    for secret in (world.admins[TENANT_B], world.default_admin):
        assert (
            queues.GetQueue(
                queue_service_pb2.GetQueueRequest(name=SHARED), metadata=bearer(secret)
            ).queue.name
            == SHARED
        )
        assert (
            topics.GetTopic(
                topic_service_pb2.GetTopicRequest(name=SHARED), metadata=bearer(secret)
            ).topic.name
            == SHARED
        )
        assert (
            schedules.GetSchedule(
                schedule_service_pb2.GetScheduleRequest(name=SHARED), metadata=bearer(secret)
            ).schedule.name
            == SHARED
        )


def test_the_default_tenant_lists_none_of_a_tenants_resources(
    channel: grpc.Channel, world: World
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="b-only")),
        metadata=bearer(world.admins[TENANT_B]),
    )
    names = {
        q.name
        for q in queues.ListQueues(
            queue_service_pb2.ListQueuesRequest(), metadata=bearer(world.default_admin)
        ).queues
    }
    assert "b-only" not in names
    assert all("/" not in name for name in names)
    prefixed = queues.ListQueues(
        queue_service_pb2.ListQueuesRequest(name_prefix="b-"),
        metadata=bearer(world.admins[TENANT_B]),
    )
    assert [q.name for q in prefixed.queues] == ["b-only"]


def test_keys_live_in_their_tenant(channel: grpc.Channel, world: World) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(channel)
    a = bearer(world.admins[TENANT_A])
    created = access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(
                name="acme-reader",
                grants=[access_pb.Grant(permission=access_pb.PERMISSION_READ, pattern="*")],
            )
        ),
        metadata=a,
    )
    assert created.key.tenant == TENANT_A  # a tenant's admin creates keys in its own tenant
    listed = access.ListKeys(access_pb.ListKeysRequest(), metadata=a)
    assert {k.name for k in listed.keys} == {"acme-admin", "acme-reader"}
    foreign = error_of(access.GetKey, access_pb.GetKeyRequest(name="globex-admin"), metadata=a)
    missing = error_of(access.GetKey, access_pb.GetKeyRequest(name="nobody"), metadata=a)
    assert foreign.code() == missing.code() == grpc.StatusCode.NOT_FOUND
    error = error_of(access.DeleteKey, access_pb.DeleteKeyRequest(name="tenants-admin"), metadata=a)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = error_of(
        access.CreateKey,
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name="sneaky", grants=[_admin_grant()], tenant=TENANT_B)
        ),
        metadata=a,
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    for call, request in (
        (access.ListTenants, access_pb.ListTenantsRequest()),
        (access.GetTenant, access_pb.GetTenantRequest(name=TENANT_A)),
        (access.DeleteTenant, access_pb.DeleteTenantRequest(name=TENANT_B)),
    ):
        assert error_of(call, request, metadata=a).code() == grpc.StatusCode.PERMISSION_DENIED
    # The default tenant's admin sees every tenant's keys.
    everyone = access.ListKeys(access_pb.ListKeysRequest(), metadata=bearer(world.default_admin))
    assert {"acme-admin", "globex-admin", "tenants-admin"} <= {k.name for k in everyone.keys}


def test_tenants_are_created_got_listed_updated_and_deleted(
    channel: grpc.Channel, world: World
) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(channel)
    admin = bearer(world.default_admin)
    created = access.CreateTenant(
        access_pb.CreateTenantRequest(
            tenant=access_pb.Tenant(name="umbrella", account_id="123456789012", description="d")
        ),
        metadata=admin,
    ).tenant
    assert (created.name, created.account_id, created.description) == (
        "umbrella",
        "123456789012",
        "d",
    )
    assert (
        access.GetTenant(access_pb.GetTenantRequest(name="umbrella"), metadata=admin).tenant
        == created
    )
    names = [
        t.name for t in access.ListTenants(access_pb.ListTenantsRequest(), metadata=admin).tenants
    ]
    assert names == sorted(names)
    assert {TENANT_A, TENANT_B, "umbrella"} <= set(names)
    first = access.ListTenants(access_pb.ListTenantsRequest(page_size=1), metadata=admin)
    assert len(first.tenants) == 1
    assert first.next_page_token
    updated = access.UpdateTenant(
        access_pb.UpdateTenantRequest(
            tenant=access_pb.Tenant(name="umbrella", description="changed"),
            update_mask={"paths": ["description"]},
        ),
        metadata=admin,
    ).tenant
    assert (updated.description, updated.account_id) == ("changed", "123456789012")
    for request, code in (
        (
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="umbrella")),
            grpc.StatusCode.ALREADY_EXISTS,
        ),
        (
            access_pb.CreateTenantRequest(
                tenant=access_pb.Tenant(name="other", account_id="123456789012")
            ),
            grpc.StatusCode.ALREADY_EXISTS,
        ),
        (
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="Bad_Name")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="ok", account_id="12")),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    ):
        assert error_of(access.CreateTenant, request, metadata=admin).code() == code
    # A tenant that owns resources is deleted only with force, and they go with it.
    key = access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name="umbrella-admin", grants=[_admin_grant()], tenant="umbrella")
        ),
        metadata=admin,
    ).secret
    wait_until(lambda: _ok(lambda: _create_everything(channel, key, "doomed")), 5, "the new key")
    error = error_of(
        access.DeleteTenant, access_pb.DeleteTenantRequest(name="umbrella"), metadata=admin
    )
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "1 queues, 1 topics and 1 schedules" in error.details()
    access.DeleteTenant(access_pb.DeleteTenantRequest(name="umbrella", force=True), metadata=admin)
    assert (
        error_of(
            access.GetTenant, access_pb.GetTenantRequest(name="umbrella"), metadata=admin
        ).code()
        == grpc.StatusCode.NOT_FOUND
    )
    assert (
        error_of(
            access.GetKey, access_pb.GetKeyRequest(name="umbrella-admin"), metadata=admin
        ).code()
        == grpc.StatusCode.NOT_FOUND
    )


def test_connect_http_door_keeps_tenants_apart(
    tenant_server: HttpServerProcess, world: World
) -> None:
    """The HTTP door runs the same interceptors: A lists its own queues, unqualified."""
    request = urllib.request.Request(
        f"{tenant_server.base}/postbox.v1.QueueService/ListQueues",
        data=b"{}",
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {world.admins[TENANT_B]}",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        body = json.loads(answer.read())
    names = {q["name"] for q in body.get("queues", [])}
    assert SHARED in names
    assert all("/" not in name for name in names)
    missing = urllib.request.Request(
        f"{tenant_server.base}/postbox.v1.QueueService/GetQueue",
        data=json.dumps({"name": SHARED}).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {world.admins[TENANT_A]}",
        },
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(missing, timeout=10)
    assert caught.value.code == 404
    assert b"/" + SHARED.encode() not in caught.value.read()


# The tenant axis of the authorisation matrix.


def _matrix_call(channel: grpc.Channel, path: str, secret: str, name: str | None):
    """(status, details, response bytes) of `path` called with `name` at its rule's field."""
    method = METHODS[path]
    rule = RULES[path]
    request = message_factory.GetMessageClass(method.input_type)()
    if rule.field is not None and name is not None:
        *parents, last = rule.field.split(".")
        target = request
        for part in parents:
            target = getattr(target, part)
        setattr(target, last, name)
    serialize = type(request).SerializeToString
    parse = message_factory.GetMessageClass(method.output_type).FromString
    metadata = bearer(secret)
    try:
        if method.client_streaming:
            responses = list(
                channel.stream_stream(path, serialize, parse)(
                    iter([request]), metadata=metadata, timeout=10
                )
            )
        elif method.server_streaming:
            call = channel.unary_stream(path, serialize, parse)(
                request, metadata=metadata, timeout=3
            )
            responses = [next(call, None)]
            call.cancel()
        else:
            responses = [
                channel.unary_unary(path, serialize, parse)(request, metadata=metadata, timeout=10)
            ]
    except grpc.RpcError as error:
        return error.code(), error.details() or "", b""
    data = b"".join(r.SerializeToString() for r in responses if r is not None)
    # A stream answering each request on its own carries its refusal in the answer.
    for response in responses:
        for result in getattr(response, "results", ()):
            if result.HasField("error"):
                return (
                    grpc.StatusCode(
                        next(c for c in grpc.StatusCode if c.value[0] == result.error.code)
                    ),
                    result.error.message,
                    data,
                )
    return grpc.StatusCode.OK, "", data


@pytest.mark.parametrize("path", sorted(METHODS))
def test_every_rpc_with_a_key_of_tenant_a_on_a_resource_of_tenant_b_is_refused(
    path: str, channel: grpc.Channel, world: World
) -> None:
    """A's admin:* key (every permission) names B's resource as stored, and by the name B
    uses; and calls that name no resource reach nothing of B's."""
    rule = RULES[path]
    a = world.admins[TENANT_A]
    if rule.field is not None:
        status, details, _ = _matrix_call(channel, path, a, f"{TENANT_B}/{SHARED}")
        assert status == grpc.StatusCode.INVALID_ARGUMENT, (status, details)
        assert f"{TENANT_A}/" not in details
        # By B's own name, A gets what C (a tenant with nothing) gets: a missing resource,
        # or the creation of its own. Never anything of B's.
        status_a, details_a, data_a = _matrix_call(channel, path, a, SHARED)
        status_c, details_c, _data_c = _matrix_call(channel, path, world.admins[TENANT_C], SHARED)
        assert (status_a, details_a) == (status_c, details_c)
        assert f"{TENANT_A}/".encode() not in data_a
        assert TENANT_B.encode() not in data_a
        assert TENANT_A not in details_a
        assert TENANT_B not in details_a
    elif rule.listed is not None:
        status, details, data = _matrix_call(channel, path, a, None)
        assert status == grpc.StatusCode.OK, details
        assert SHARED.encode() not in data
        assert b"/" not in data
    elif rule.any_key:
        # About the caller: A's own tenant, nothing of B's.
        status, details, data = _matrix_call(channel, path, a, None)
        assert status == grpc.StatusCode.OK, details
        assert TENANT_A.encode() in data
        assert TENANT_B.encode() not in data
    elif rule.within_tenant:
        # Key RPCs act on the caller's own tenant: test_keys_live_in_their_tenant.
        status, details, data = _matrix_call(channel, path, a, None)
        assert TENANT_B.encode() not in data
        assert b"tenants-admin" not in data
    else:
        # By id or over every name: no tenant's grant covers every name.
        assert rule.permission
        assert resource_free(path)
        status, details, _ = _matrix_call(channel, path, a, None)
        assert status == grpc.StatusCode.PERMISSION_DENIED, (status, details)


def test_after_the_matrix_b_and_the_default_tenant_keep_all_they_had(
    channel: grpc.Channel, world: World, tenant_database: str
) -> None:
    """A's calls above (deletes and purges included) touched only A's own resources."""
    stored = asyncio.run(_stored_names(tenant_database))
    for table in ("queues", "topics", "schedules"):
        assert {SHARED, f"{TENANT_B}/{SHARED}"} <= stored[table], table


async def _stored_names(url: str) -> dict[str, set[str]]:
    conn = await asyncpg.connect(url)
    try:
        return {
            table: {row["name"] for row in await conn.fetch(f"SELECT name FROM postbox.{table}")}
            for table in ("queues", "topics", "schedules")
        }
    finally:
        await conn.close()


def resource_free(path: str) -> bool:
    """Rules without a field act on any resource ("*")."""
    return RULES[path].field is None and ANY_RESOURCE == "*"


def test_cli_manages_tenants_and_creates_keys_in_them(
    tenant_server: HttpServerProcess, world: World
) -> None:
    from support import postbox

    target = ("--target", tenant_server.target)
    as_admin = {"POSTBOX_API_KEY": world.default_admin}
    created = postbox(
        "tenants", "create", "hooli", "--account-id", "210987654321", "--description", "cli",
        "-o", "json", *target, env=as_admin,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["account_id"] == "210987654321"
    listed = postbox("tenants", "list", *target, env=as_admin)
    assert listed.returncode == 0, listed.stderr
    assert "hooli" in listed.stdout
    updated = postbox(
        "tenants", "update", "hooli", "--description", "changed", "-o", "json", *target,
        env=as_admin,
    )  # fmt: skip
    assert json.loads(updated.stdout)["description"] == "changed"
    key = postbox(
        "keys", "create", "hooli-app", "--grant", "send:*", "--tenant", "hooli", *target,
        env=as_admin,
    )  # fmt: skip
    assert key.returncode == 0, key.stderr
    assert "tenant hooli" in key.stdout
    got = postbox("tenants", "get", "hooli", "-o", "json", *target, env=as_admin)
    assert json.loads(got.stdout)["name"] == "hooli"
    refused = postbox("tenants", "list", *target, env={"POSTBOX_API_KEY": world.admins[TENANT_A]})
    assert refused.returncode == 1
    assert "PERMISSION_DENIED" in refused.stderr
    deleted = postbox("tenants", "delete", "hooli", *target, env=as_admin)
    assert deleted.returncode == 0, deleted.stderr
    missing = postbox("tenants", "get", "hooli", *target, env=as_admin)
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr
