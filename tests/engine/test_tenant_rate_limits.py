"""Tenants' rate limits (issue 47): every call of a tenant's key draws from its key's
buckets and from its tenant's, which all the tenant's keys share. Over the tenant's
limit a call is refused as over a key's (RESOURCE_EXHAUSTED with a RetryInfo over gRPC,
429 with Retry-After over Connect and REST, ThrottlingException at the SQS shim), and
the refusal names the tenant; another tenant's keys are not affected. Limits are set
and changed through CreateTenant and UpdateTenant's field mask, and `postbox tenants`.

Most tests use a refill rate of 0.01 per second, so that no token comes back within a
test (one would take 100 s) and the counts are exact however slow the machine is; the
test against the clock allows one refill step either way plus slack.

A database, server and shim of their own: keys turn authentication on.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from auth_support import bearer, retry_delay, wait_key_works
from botocore.exceptions import ClientError
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from support import (
    HttpServerProcess,
    ServerProcess,
    SqsShimProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    eventually,
    postbox,
    sqs_client,
)

LIST_QUEUES = queue_service_pb2.ListQueuesRequest()
SLOW = 0.01  # tokens per second: none comes back within a test


@dataclass
class World:
    database_url: str
    server: HttpServerProcess
    shim_endpoint: str
    access: access_service_pb2_grpc.AccessServiceStub
    admin: list[tuple[str, str]]
    admin_secret: str


@dataclass
class Key:
    name: str
    secret: str
    sigv4_secret: str

    @property
    def metadata(self) -> list[tuple[str, str]]:
        return bearer(self.secret)


@pytest.fixture(scope="module")
def world(admin_url: str) -> Iterator[World]:
    url = create_database(admin_url, "postbox_tenant_rate_limits")
    server = shim = None
    try:
        # A small pool: the machine's PostgreSQL is shared, and these tests make few calls.
        server = HttpServerProcess(url, "--pool-size", "3").start()
        admin_secret = bootstrap_key(url, "root", "admin:*")
        shim = SqsShimProcess(server.target).start()
        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)
            wait_key_works(access, bearer(admin_secret))
            yield World(url, server, shim.endpoint, access, bearer(admin_secret), admin_secret)
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


def _tenant(world: World, name: str, **limits: float) -> access_pb.Tenant:
    tenant = access_pb.Tenant(name=name)
    if limits:
        tenant.rate_limits.CopyFrom(access_pb.RateLimits(**limits))
    request = access_pb.CreateTenantRequest(tenant=tenant)
    return world.access.CreateTenant(request, metadata=world.admin).tenant


def _key(world: World, name: str, tenant: str, **limits: float) -> Key:
    """An admin key of the tenant, with limits of its own if given."""
    key = access_pb.Key(
        name=name,
        tenant=tenant,
        grants=[access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")],
    )
    if limits:
        key.rate_limits.CopyFrom(access_pb.RateLimits(**limits))
    created = world.access.CreateKey(access_pb.CreateKeyRequest(key=key), metadata=world.admin)
    return Key(name, created.secret, created.sigv4_secret_access_key)


def _update_limits(world: World, tenant: str, **limits: float) -> access_pb.Tenant:
    request = access_pb.UpdateTenantRequest(
        tenant=access_pb.Tenant(name=tenant, rate_limits=access_pb.RateLimits(**limits))
    )
    request.update_mask.paths.append("rate_limits")
    return world.access.UpdateTenant(request, metadata=world.admin).tenant


def _create_queue(channel: grpc.Channel, key: Key, name: str) -> None:
    queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
        metadata=key.metadata,
    )


def _outcome(call, request, key: Key) -> grpc.RpcError | None:
    """The error a call with the key fails with, None when it succeeds."""
    try:
        call(request, metadata=key.metadata)
    except grpc.RpcError as error:
        return error
    return None


def _send(channel: grpc.Channel, key: Key, queue: str) -> grpc.RpcError | None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    return _outcome(messages.Send, message_service_pb2.SendRequest(queue=queue, body=b"x"), key)


def _depth(channel: grpc.Channel, key: Key, queue: str) -> int:
    peek = message_service_pb2.PeekMessagesRequest(queue=queue, page_size=100)
    stub = message_service_pb2_grpc.MessageServiceStub(channel)
    return len(stub.PeekMessages(peek, metadata=key.metadata).messages)


def test_the_tenant_keeps_its_limits_and_bad_ones_are_refused(world: World) -> None:
    created = _tenant(world, "shown", sends_per_second=5, send_burst=7)
    assert created.rate_limits.sends_per_second == 5
    assert created.rate_limits.send_burst == 7
    got = world.access.GetTenant(access_pb.GetTenantRequest(name="shown"), metadata=world.admin)
    assert got.tenant.rate_limits.send_burst == 7
    listed = world.access.ListTenants(access_pb.ListTenantsRequest(), metadata=world.admin)
    assert [t.rate_limits.send_burst for t in listed.tenants if t.name == "shown"] == [7]
    # The checks of the keys' limits, with the same words.
    for bad in ({"calls_per_second": -1}, {"receive_burst": -2}, {"sends_per_second": 2e6}):
        field = next(iter(bad))
        request = access_pb.CreateTenantRequest(
            tenant=access_pb.Tenant(name="bad-limits", rate_limits=access_pb.RateLimits(**bad))
        )
        error = error_of(world.access.CreateTenant, request, metadata=world.admin)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"rate_limits.{field}" in error.details()
        update = access_pb.UpdateTenantRequest(
            tenant=access_pb.Tenant(name="shown", rate_limits=access_pb.RateLimits(**bad))
        )
        update.update_mask.paths.append("rate_limits")
        error = error_of(world.access.UpdateTenant, update, metadata=world.admin)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"rate_limits.{field}" in error.details()
    # Other fields change without touching them; the mask's rate_limits with none lifts them.
    update = access_pb.UpdateTenantRequest(
        tenant=access_pb.Tenant(name="shown", description="kept")
    )
    update.update_mask.paths.append("description")
    kept = world.access.UpdateTenant(update, metadata=world.admin).tenant
    assert kept.rate_limits.send_burst == 7
    assert not _update_limits(world, "shown").HasField("rate_limits")


def _limits_shown(stdout: str) -> dict[str, float]:
    """The limits `-o json` shows (it prints every field, 0 for those unset)."""
    return {k: v for k, v in json.loads(stdout).get("rate_limits", {}).items() if v}


def test_the_cli_sets_changes_and_lifts_a_tenants_limits(world: World) -> None:
    target = ("--target", world.server.target, "-o", "json")
    as_admin = {"POSTBOX_API_KEY": world.admin_secret}
    created = postbox(
        "tenants", "create", "cli-limits", "--sends-per-second", "3", "--send-burst", "4",
        *target, env=as_admin,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert _limits_shown(created.stdout) == {"sends_per_second": 3, "send_burst": 4}
    changed = postbox(
        "tenants", "update", "cli-limits", "--calls-per-second", "9", *target, env=as_admin
    )
    assert changed.returncode == 0, changed.stderr
    # The flags given replace all the limits, as the field mask's rate_limits does.
    assert _limits_shown(changed.stdout) == {"calls_per_second": 9}
    lifted = postbox("tenants", "update", "cli-limits", "--no-rate-limits", *target, env=as_admin)
    assert lifted.returncode == 0, lifted.stderr
    assert _limits_shown(lifted.stdout) == {}
    refused = postbox(
        "tenants", "update", "cli-limits", "--sends-per-second", "-1", *target, env=as_admin
    )
    assert refused.returncode != 0
    assert "rate_limits.sends_per_second" in refused.stderr
    # `postbox keys create` takes the same flags.
    key = postbox(
        "keys", "create", "cli-limited-key", "--grant", "read:*", "--tenant", "cli-limits",
        "--call-burst", "2", "--calls-per-second", "1",
        "--target", world.server.target, env=as_admin,
    )  # fmt: skip
    assert key.returncode == 0, key.stderr
    assert "limits calls_per_second=1 call_burst=2" in key.stdout


def test_two_keys_of_a_tenant_share_its_burst_and_other_tenants_are_not_affected(
    world: World, channel: grpc.Channel
) -> None:
    burst = 4
    _tenant(world, "shared", sends_per_second=SLOW, send_burst=burst)
    _tenant(world, "other", sends_per_second=SLOW, send_burst=burst)
    first = _key(world, "shared-one", "shared")
    second = _key(world, "shared-two", "shared")
    other = _key(world, "other-one", "other")
    for key in (first, other):
        _create_queue(channel, key, "jobs")
    _create_queue(channel, world_key := Key("root", world.admin_secret, ""), "jobs")
    # Taking turns, the two keys get the tenant's burst between them, not one each.
    for turn in range(burst):
        assert _send(channel, (first, second)[turn % 2], "jobs") is None
    for key in (first, second):
        refused = _send(channel, key, "jobs")
        assert refused is not None
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.details().startswith(
            f"tenant 'shared' is over its limit of 0.01 sends per second (burst {burst}); "
        )
        # One token comes back in 1/rate s, less the little time since the burst.
        assert 0 < retry_delay(refused) <= 1 / SLOW
    # A refused send stored nothing; other calls are not sends.
    assert _depth(channel, first, "jobs") == burst
    # Another tenant's keys, with the same limits, have buckets of their own; the default
    # tenant's key has no tenant limits.
    for _ in range(burst):
        assert _send(channel, other, "jobs") is None
        assert _send(channel, world_key, "jobs") is None


def test_the_refusal_names_the_key_when_its_own_limit_is_the_shorter(
    world: World, channel: grpc.Channel
) -> None:
    _tenant(world, "roomy", sends_per_second=SLOW, send_burst=100)
    tight = _key(world, "roomy-tight", "roomy", sends_per_second=SLOW, send_burst=2)
    loose = _key(world, "roomy-loose", "roomy")
    _create_queue(channel, loose, "jobs")
    assert _send(channel, tight, "jobs") is None
    assert _send(channel, tight, "jobs") is None
    refused = _send(channel, tight, "jobs")
    assert refused is not None
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.details().startswith(
        "API key 'roomy-tight' is over its limit of 0.01 sends per second (burst 2); "
    )
    # The key's refusal took nothing from the tenant: 100 - 2 sends are left for the rest.
    for _ in range(98):
        assert _send(channel, loose, "jobs") is None
    refused = _send(channel, loose, "jobs")
    assert refused is not None
    assert refused.details().startswith("tenant 'roomy' is over its limit")


def test_a_tenants_calls_are_limited_against_the_clock(world: World, channel: grpc.Channel) -> None:
    rate, burst = 4.0, 6
    _tenant(world, "clocked", calls_per_second=rate, call_burst=burst)
    keys = [_key(world, f"clocked-{n}", "clocked") for n in range(2)]
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    for turn in range(burst):
        queues.ListQueues(LIST_QUEUES, metadata=keys[turn % 2].metadata)
    refused = error_of(queues.ListQueues, LIST_QUEUES, metadata=keys[0].metadata)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant 'clocked'" in refused.details()
    assert 0 < retry_delay(refused) <= 1 / rate
    # Both keys calling flat out for 2 s get burst-free rate * elapsed calls between them;
    # the bounds allow one refill step either way plus a slow machine's slack (calls take
    # ms, so the loop makes hundreds of attempts).
    started, allowed, turn = time.monotonic(), 0, 0
    while (elapsed := time.monotonic() - started) < 2.0:
        turn += 1
        error = _outcome(queues.ListQueues, LIST_QUEUES, keys[turn % 2])
        assert error is None or error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        allowed += error is None
    assert rate * elapsed - 2 <= allowed <= rate * elapsed + 2, (allowed, elapsed)


def test_connect_and_rest_answer_429_with_retry_after(world: World) -> None:
    _tenant(world, "http", calls_per_second=0.5, call_burst=1)
    first = _key(world, "http-one", "http")
    second = _key(world, "http-two", "http")

    def call(method: str, path: str, key: Key) -> tuple[int, dict[str, str], dict]:
        data = b"{}" if method == "POST" else None
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key.secret}"}
        request = urllib.request.Request(
            f"{world.server.base}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read())

    connect = ("POST", "/postbox.v1.QueueService/ListQueues")
    assert call(*connect, first)[0] == 200
    # The tenant's one token is spent: its other key is refused, at either door.
    for method, path in (connect, ("GET", "/v1/queues")):
        status, answer, body = call(method, path, second)
        assert status == 429, body
        assert "tenant 'http'" in json.dumps(body)
        # Half a token a second: the one spent comes back within 2 s.
        assert answer["Retry-After"] in ("1", "2")


def test_the_sqs_shim_answers_throttling_exception(world: World) -> None:
    _tenant(world, "sqs", calls_per_second=SLOW, call_burst=1)
    first = _key(world, "sqs-one", "sqs")
    second = _key(world, "sqs-two", "sqs")
    sqs_client(world.shim_endpoint, "json", first.name, first.sigv4_secret).list_queues()
    client = sqs_client(world.shim_endpoint, "json", second.name, second.sigv4_secret)
    with pytest.raises(ClientError) as refused:
        client.list_queues()
    error = refused.value.response
    assert error["Error"]["Code"] == "ThrottlingException"
    assert "tenant 'sqs'" in error["Error"]["Message"]
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_a_change_of_the_tenants_limits_takes_effect(world: World, channel: grpc.Channel) -> None:
    _tenant(world, "changing", sends_per_second=SLOW, send_burst=1)
    key = _key(world, "changing-one", "changing")
    _create_queue(channel, key, "jobs")
    assert _send(channel, key, "jobs") is None
    assert _send(channel, key, "jobs") is not None
    # Lifted: sends go again (at once on this server, which reloads before it answers;
    # waited for all the same, as another server would be).
    _update_limits(world, "changing")
    eventually(lambda: _send(channel, key, "jobs") is None, what="the lifted limit")
    for _ in range(5):
        assert _send(channel, key, "jobs") is None
    # A new limit starts with a full burst of its own.
    _update_limits(world, "changing", sends_per_second=SLOW, send_burst=2)
    eventually(
        lambda: (error := _send(channel, key, "jobs")) is not None and "burst 2" in error.details(),
        what="the new limit refusing a send",
    )


def test_a_send_stream_over_the_tenants_limit_waits_rather_than_fails(
    world: World, channel: grpc.Channel
) -> None:
    rate = 5.0
    _tenant(world, "streamed", sends_per_second=rate, send_burst=1)
    key = _key(world, "streamed-one", "streamed")
    _create_queue(channel, key, "paced")
    requests = [
        message_service_pb2.SendStreamRequest(
            tag=tag, send=message_service_pb2.SendRequest(queue="paced", body=b"x")
        )
        for tag in range(6)
    ]
    started = time.monotonic()
    responses = message_service_pb2_grpc.MessageServiceStub(channel).SendStream(
        iter(requests), metadata=key.metadata, timeout=30
    )
    results = [result for response in responses for result in response.results]
    elapsed = time.monotonic() - started
    assert len(results) == 6
    assert all(result.sent.message_id for result in results)
    # The first goes on the burst, the 5 others one every 1/rate s: 1 s at the least;
    # 0.1 s less for the clock's granularity, and no upper bound but the deadline.
    assert elapsed >= 5 / rate - 0.1


def test_servers_on_one_database_each_enforce_a_share_and_follow_changes(world: World) -> None:
    second = ServerProcess(world.database_url, "--pool-size", "3").start()
    try:
        # Created after both run: the tenant change makes each server count the others.
        _tenant(world, "spread", calls_per_second=SLOW, call_burst=6)
        key = _key(world, "spread-one", "spread")
        allowed = {}
        for server in (world.server, second):
            with grpc.insecure_channel(server.target) as channel:
                queues = queue_service_pb2_grpc.QueueServiceStub(channel)
                eventually(
                    lambda queues=queues: (
                        (error := _outcome(queues.ListQueues, LIST_QUEUES, key)) is None
                        or error.code() != grpc.StatusCode.UNAUTHENTICATED
                    ),
                    what="the new key on each server",
                )
                count = 1
                while (error := _outcome(queues.ListQueues, LIST_QUEUES, key)) is None:
                    count += 1
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "tenant 'spread'" in error.details()
                assert "this server's share" in error.details()
                allowed[server.target] = count
        # A burst of 6 over two servers: 3 each, so 6 in all, not 12.
        assert sorted(allowed.values()) == [3, 3]
        # Lifted through the first server, the second follows by notification.
        _update_limits(world, "spread")
        with grpc.insecure_channel(second.target) as channel:
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)
            eventually(
                lambda: _outcome(queues.ListQueues, LIST_QUEUES, key) is None,
                what="the second server lifting the tenant's limit",
            )
    finally:
        second.stop()
