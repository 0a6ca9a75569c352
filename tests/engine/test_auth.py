"""API keys and grants: the authorisation matrix of every RPC, revocation across replicas,
and the refusal to serve a network address anonymously.

These run on a database and servers of their own: a key turns authentication on for
every server of a database, which the other suites' shared server must not see.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from auth_support import (
    METHODS,
    assert_refuses_anonymous_exposure,
    bearer,
    call_status,
    matrix_request,
    wait_until,
)
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
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
from support import (
    ServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    free_port,
)

from postbox_server.auth.rules import RULES, Rule, Target
from postbox_server.auth.secrets import sigv4_secret

# A permission that does not allow the rule's call (publish allows only publishing).
OTHER_PERMISSION = {"publish": "send"}  # default: "publish"


@dataclass
class Keys:
    admin: str
    # Per rule (permission, on "authz-*" or "*"): a key that has it, and one that has another.
    right: dict[tuple[str, str], str]
    wrong: dict[str, str]
    other_resource: dict[str, str]
    expired: str
    revoked: str
    # Per target permission: a key with it on "elsewhere-*" and every permission on "authz-*".
    targeted: dict[str, str]


@pytest.fixture(scope="module")
def auth_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_auth")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def auth_server(auth_database: str) -> Iterator[ServerProcess]:
    process = ServerProcess(auth_database).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def auth_channel(auth_server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(auth_server.target) as channel:
        yield channel


def _pattern(rule: Rule) -> str:
    return "authz-*" if rule.field is not None else "*"


@pytest.fixture(scope="module")
def keys(auth_database: str, auth_channel: grpc.Channel) -> Keys:
    admin = bootstrap_key(auth_database, "matrix-admin", "admin:*")
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    wait_until(
        lambda: (
            call_status(auth_channel, "/postbox.v1.AccessService/ListKeys", admin)
            == grpc.StatusCode.OK
        ),
        5,
        "the first key",
    )

    def create(name: str, *grants: tuple[str, str], expire_in: float | None = None) -> str:
        key = access_pb.Key(
            name=name,
            grants=[
                access_pb.Grant(
                    permission=access_pb.Permission.Value(f"PERMISSION_{p.upper()}"), pattern=pat
                )
                for p, pat in grants
            ],
        )
        if expire_in is not None:
            key.expire_time.FromSeconds(int(time.time() + expire_in) + 1)
        response = access.CreateKey(
            access_pb.CreateKeyRequest(key=key), metadata=bearer(admin), timeout=10
        )
        return response.secret

    rules = {(rule.permission, _pattern(rule)) for rule in RULES.values()}
    right = {
        (permission, pattern): create(f"right-{permission}-{'any' if pattern == '*' else 'az'}",
                                      (permission, pattern))
        for permission, pattern in rules
    }  # fmt: skip
    wrong = {
        permission: create(
            f"wrong-{permission}", (OTHER_PERMISSION.get(permission, "publish"), "*")
        )
        for permission in {permission for permission, _ in rules}
    }
    other_resource = {
        permission: create(f"other-{permission}", (permission, "elsewhere-*"))
        for permission in {permission for permission, _ in rules}
    }
    expired = create("expired", ("admin", "*"), expire_in=1)
    revoked = create("revoked", ("admin", "*"))
    ping = f"/{queue_service_pb2.DESCRIPTOR.services_by_name['QueueService'].full_name}/ListQueues"
    # Both work until the one expires and the other is deleted.
    assert call_status(auth_channel, ping, revoked) == grpc.StatusCode.OK
    access.DeleteKey(access_pb.DeleteKeyRequest(name="revoked"), metadata=bearer(admin))
    wait_until(
        lambda: call_status(auth_channel, ping, revoked) == grpc.StatusCode.UNAUTHENTICATED,
        5,
        "revocation",
    )
    wait_until(
        lambda: call_status(auth_channel, ping, expired) == grpc.StatusCode.UNAUTHENTICATED,
        10,
        "expiry",
    )
    targets = {target.permission for rule in RULES.values() for target in rule.targets}
    targeted = {
        permission: create(
            f"targeted-{permission}",
            (permission, "elsewhere-*"),
            *((held, "authz-*") for held in {p for p, _ in rules}),
        )
        for permission in targets
    }
    return Keys(admin, right, wrong, other_resource, expired, revoked, targeted)


def test_every_rpc_of_every_service_has_an_authorisation_rule() -> None:
    missing = sorted(set(METHODS) - set(RULES))
    assert not missing, f"RPCs without a rule in server/postbox_server/auth/rules.py: {missing}"
    assert not set(RULES) - set(METHODS), "rules for RPCs that no longer exist"


@pytest.mark.parametrize("path", sorted(METHODS))
def test_authorisation_matrix(path: str, keys: Keys, auth_channel: grpc.Channel) -> None:
    rule = RULES.get(path)
    assert rule is not None, f"{path} has no authorisation rule"
    status = lambda secret: call_status(auth_channel, path, secret)  # noqa: E731
    assert status(None) == grpc.StatusCode.UNAUTHENTICATED
    assert status("pbk_" + "x" * 43) == grpc.StatusCode.UNAUTHENTICATED
    assert status(keys.expired) == grpc.StatusCode.UNAUTHENTICATED
    assert status(keys.revoked) == grpc.StatusCode.UNAUTHENTICATED
    if rule.any_key:
        # About the caller itself: any valid key, whatever its grants.
        assert status(keys.wrong[rule.permission]) == grpc.StatusCode.OK
        assert status(keys.other_resource[rule.permission]) == grpc.StatusCode.OK
        return
    assert status(keys.wrong[rule.permission]) == grpc.StatusCode.PERMISSION_DENIED
    if rule.field is not None:
        assert status(keys.other_resource[rule.permission]) == grpc.StatusCode.PERMISSION_DENIED
    # The right key passes authorisation: it gets exactly what an admin gets.
    allowed = status(keys.right[rule.permission, _pattern(rule)])
    assert allowed not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    assert allowed == status(keys.admin)


def test_denial_names_permission_and_resource_never_the_secret(
    keys: Keys, auth_channel: grpc.Channel
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    secret = keys.wrong["manage"]
    error = error_of(
        queues.PurgeQueue,
        queue_service_pb2.PurgeQueueRequest(name="orders"),
        metadata=bearer(secret),
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'manage'" in error.details()
    assert "'orders'" in error.details()
    assert secret not in error.details()
    unknown = "pbk_" + "y" * 43
    error = error_of(
        queues.ListQueues,
        queue_service_pb2.ListQueuesRequest(),
        metadata=[*bearer(unknown), ("x-request-id", "req-refused")],
    )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    # A refused call still echoes its request id, next to why it was refused.
    trailing = dict(error.trailing_metadata())
    assert trailing["x-request-id"] == "req-refused"
    assert trailing["postbox-auth-failure"] == "unknown-key"
    assert "y" * 10 not in error.details()


def test_health_and_reflection_stay_open(keys: Keys, auth_channel: grpc.Channel) -> None:
    reply = health_pb2_grpc.HealthStub(auth_channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(auth_channel)
    answers = reflection.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    services = {s.name for s in next(answers).list_services_response.service}
    assert "postbox.v1.AccessService" in services


def test_lists_return_only_what_the_key_may_read(
    keys: Keys, auth_database: str, auth_channel: grpc.Channel
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    for name in ("orders-eu", "orders-us", "billing"):
        queues.CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
            metadata=bearer(keys.admin),
        )
    reader = bootstrap_key(auth_database, "orders-reader", "read:orders-*", "send:billing")
    # A new key works once the server's cache has heard of it (a notification away).
    wait_until(
        lambda: (
            call_status(auth_channel, "/postbox.v1.QueueService/ListQueues", reader)
            == grpc.StatusCode.OK
        ),
        5,
        "the new key",
    )
    listed = queues.ListQueues(queue_service_pb2.ListQueuesRequest(), metadata=bearer(reader))
    assert [q.name for q in listed.queues] == ["orders-eu", "orders-us"]
    listed = queues.ListQueues(queue_service_pb2.ListQueuesRequest(), metadata=bearer(keys.admin))
    assert {"orders-eu", "orders-us", "billing"} <= {q.name for q in listed.queues}


def test_a_revoked_key_stops_working_on_another_replica_within_a_second(
    keys: Keys, auth_database: str, auth_server: ServerProcess
) -> None:
    replica = ServerProcess(auth_database).start()
    try:
        secret = bootstrap_key(auth_database, "short-lived", "read:*")
        ping = "/postbox.v1.QueueService/ListQueues"
        with (
            grpc.insecure_channel(replica.target) as channel,
            grpc.insecure_channel(auth_server.target) as first,
        ):
            # The replica learns of the new key by the same notification.
            wait_until(lambda: call_status(channel, ping, secret) == grpc.StatusCode.OK, 5, "key")
            access = access_service_pb2_grpc.AccessServiceStub(first)
            access.DeleteKey(
                access_pb.DeleteKeyRequest(name="short-lived"), metadata=bearer(keys.admin)
            )
            # The bound: a revoked key stops working within a second everywhere.
            took = wait_until(
                lambda: call_status(channel, ping, secret) == grpc.StatusCode.UNAUTHENTICATED,
                1.0,
                "revocation on the replica",
            )
            assert took < 1.0
    finally:
        replica.stop()


def test_serve_refuses_a_network_address_without_keys(admin_url: str) -> None:
    url = create_database(admin_url, "postbox_open")
    try:
        assert_refuses_anonymous_exposure(
            "serve", "--database-url", url, "--grpc-host", "0.0.0.0",
            "--grpc-port", str(free_port()),
        )  # fmt: skip
    finally:
        drop_database(admin_url, url)


def test_cli_bootstraps_the_first_key_on_the_database_then_manages_keys_through_the_server(
    admin_url: str,
) -> None:
    from support import postbox

    url = create_database(admin_url, "postbox_keys_cli")
    server = None
    try:
        # The engine is not installed yet: the direct path installs it.
        created = postbox("keys", "create", "root", "--grant", "admin:*", "--database-url", url)
        assert created.returncode == 0, created.stderr
        root = created.stdout.splitlines()[-1]
        assert root.startswith("pbk_")
        assert len(root) == 4 + 43  # 256 bits in base64url
        server = ServerProcess(url).start()
        target = ("--target", server.target)

        anonymous = postbox("queues", "list", *target)
        assert anonymous.returncode == 1
        assert "UNAUTHENTICATED" in anonymous.stderr
        as_root = {"POSTBOX_API_KEY": root}
        assert postbox("queues", "list", *target, env=as_root).returncode == 0

        created = postbox(
            "keys", "create", "sender", "--grant", "send:orders-*", "--expires-in", "30d",
            *target, env=as_root,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        sender = created.stdout.splitlines()[-1]
        refused = postbox("messages", "send", "billing", "hi", *target, "--api-key", sender)
        assert refused.returncode == 1
        assert "PERMISSION_DENIED" in refused.stderr
        assert "'send'" in refused.stderr
        assert "'billing'" in refused.stderr

        listed = postbox("keys", "list", *target, env=as_root)
        assert listed.returncode == 0, listed.stderr
        assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["root", "sender"]
        assert "send:orders-*" in listed.stdout
        assert sender not in listed.stdout
        assert root not in listed.stdout

        revoked = postbox("keys", "revoke", "sender", *target, env=as_root)
        assert revoked.returncode == 0, revoked.stderr
        listed = postbox("keys", "list", "--database-url", url)
        assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == ["root"]
        missing = postbox("keys", "revoke", "sender", *target, env=as_root)
        assert missing.returncode == 1
        assert "NOT_FOUND" in missing.stderr
    finally:
        if server is not None:
            server.stop()
        drop_database(admin_url, url)


def test_cli_keys_update_changes_only_the_fields_given_through_the_server_or_the_database(
    keys: Keys, auth_server: ServerProcess, auth_database: str, auth_channel: grpc.Channel
) -> None:
    from support import postbox

    target = ("--target", auth_server.target)
    as_admin = {"POSTBOX_API_KEY": keys.admin}
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)

    def stored() -> access_pb.Key:
        request = access_pb.GetKeyRequest(name="cli-update")
        return access.GetKey(request, metadata=bearer(keys.admin)).key

    def update(*flags: str, on: tuple[str, ...] = target) -> str:
        result = postbox("keys", "update", "cli-update", *flags, *on, env=as_admin)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("updated cli-update\t")
        return result.stdout

    created = postbox(
        "keys", "create", "cli-update", "--grant", "send:jobs-*", "--expires-in", "30d",
        "--sends-per-second", "5", *target, env=as_admin,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    secret = created.stdout.splitlines()[-1]
    expiry = stored().expire_time.seconds
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    purge = queue_service_pb2.PurgeQueueRequest(name="jobs-1")
    assert error_of(queues.PurgeQueue, purge, metadata=bearer(secret)).code() == (
        grpc.StatusCode.PERMISSION_DENIED
    )

    # Grants: the ones given replace them all; the expiry and the limits stay.
    shown = update("--grant", "manage:jobs-*", "--grant", "read:jobs-*")
    assert "\tmanage:jobs-* read:jobs-*\t" in shown
    key = stored()
    assert [g.pattern for g in key.grants] == ["jobs-*", "jobs-*"]
    assert key.expire_time.seconds == expiry
    assert key.rate_limits.sends_per_second == 5
    # The server's key cache took the new grants before UpdateKey answered.
    assert error_of(queues.PurgeQueue, purge, metadata=bearer(secret)).code() == (
        grpc.StatusCode.NOT_FOUND
    )

    # Expiry: lifted, then set again, on the database directly.
    assert "\texpires never\t" in update("--no-expiry")
    assert not stored().HasField("expire_time")
    before = time.time()
    update("--expires-in", "2h", on=("--database-url", auth_database))
    # Generous bounds: "2h from now" is taken between `before` and this line.
    assert before + 7200 - 1 <= stored().expire_time.seconds <= time.time() + 7200 + 1

    # Rate limits: the flags given replace all of them; --no-rate-limits lifts them.
    assert "\tlimits calls_per_second=9" in update("--calls-per-second", "9")
    limits = stored().rate_limits
    assert (limits.calls_per_second, limits.sends_per_second) == (9, 0)
    assert "limits" not in update("--no-rate-limits", on=("--database-url", auth_database))
    key = stored()
    assert not key.HasField("rate_limits")
    assert len(key.grants) == 2

    # Refusals change nothing.
    nothing = postbox("keys", "update", "cli-update", *target, env=as_admin)
    assert nothing.returncode == 2
    assert "give --grant, --expires-in, --no-expiry or rate-limit flags" in nothing.stderr
    both = postbox(
        "keys", "update", "cli-update", "--no-expiry", "--expires-in", "1d", *target, env=as_admin
    )
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    negative = postbox(
        "keys", "update", "cli-update", "--sends-per-second", "-1", *target, env=as_admin
    )
    assert negative.returncode == 1
    assert "INVALID_ARGUMENT" in negative.stderr
    assert "rate_limits.sends_per_second" in negative.stderr
    assert stored() == key
    missing = postbox("keys", "update", "no-such-key", "--no-expiry", *target, env=as_admin)
    assert missing.returncode == 1
    assert "NOT_FOUND" in missing.stderr
    assert postbox("keys", "revoke", "cli-update", *target, env=as_admin).returncode == 0


def _grant(permission: str, pattern: str) -> access_pb.Grant:
    return access_pb.Grant(
        permission=access_pb.Permission.Value(f"PERMISSION_{permission.upper()}"), pattern=pattern
    )


def test_access_service_creates_gets_lists_updates_and_deletes_keys(
    keys: Keys, auth_channel: grpc.Channel
) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    admin = bearer(keys.admin)
    created = access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name="lifecycle", grants=[_grant("send", "jobs-*")])
        ),
        metadata=admin,
    )
    assert created.secret.startswith("pbk_")
    assert created.sigv4_secret_access_key
    got = access.GetKey(access_pb.GetKeyRequest(name="lifecycle"), metadata=admin).key
    assert created.secret not in str(got)
    assert [(g.permission, g.pattern) for g in got.grants] == [
        (access_pb.PERMISSION_SEND, "jobs-*")
    ]
    assert not got.HasField("expire_time")
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    purge = queue_service_pb2.PurgeQueueRequest(name="jobs-1")
    assert error_of(queues.PurgeQueue, purge, metadata=bearer(created.secret)).code() == (
        grpc.StatusCode.PERMISSION_DENIED
    )

    # New grants work on this server as soon as UpdateKey returns.
    update = access_pb.UpdateKeyRequest(
        key=access_pb.Key(name="lifecycle", grants=[_grant("manage", "jobs-*")]),
        update_mask={"paths": ["grants"]},
    )
    updated = access.UpdateKey(update, metadata=admin).key
    assert [g.permission for g in updated.grants] == [access_pb.PERMISSION_MANAGE]
    assert error_of(queues.PurgeQueue, purge, metadata=bearer(created.secret)).code() == (
        grpc.StatusCode.NOT_FOUND
    )
    expiring = access_pb.UpdateKeyRequest(
        key=access_pb.Key(name="lifecycle"), update_mask={"paths": ["expire_time"]}
    )
    expiring.key.expire_time.FromSeconds(int(time.time()) + 3600)
    assert access.UpdateKey(expiring, metadata=admin).key.expire_time.seconds == (
        expiring.key.expire_time.seconds
    )

    # Pages: every key once, in name order.
    names, token = [], ""
    while True:
        page = access.ListKeys(
            access_pb.ListKeysRequest(page_size=3, page_token=token), metadata=admin
        )
        assert len(page.keys) <= 3
        names += [key.name for key in page.keys]
        if not (token := page.next_page_token):
            break
    assert names == sorted(names)
    assert "lifecycle" in names
    assert len(names) == len(set(names))

    access.DeleteKey(access_pb.DeleteKeyRequest(name="lifecycle"), metadata=admin)
    assert error_of(queues.PurgeQueue, purge, metadata=bearer(created.secret)).code() == (
        grpc.StatusCode.UNAUTHENTICATED
    )
    missing = error_of(access.GetKey, access_pb.GetKeyRequest(name="lifecycle"), metadata=admin)
    assert missing.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("key", "mask", "message"),
    [
        (access_pb.Key(name="bad name", grants=[_grant("send", "*")]), None, "key name"),
        (access_pb.Key(name="k" * 81, grants=[_grant("send", "*")]), None, "limit is 80"),
        (access_pb.Key(name="no-grants"), None, "at least one grant"),
        (access_pb.Key(name="g", grants=[_grant("send", "*")] * 101), None, "limit is 100"),
        (access_pb.Key(name="g", grants=[_grant("send", "a b")]), None, "may only contain"),
        (access_pb.Key(name="g", grants=[_grant("send", "p" * 81)]), None, "limit is 80"),
        (access_pb.Key(name="g", grants=[access_pb.Grant(pattern="*")]), None, "permission"),
        (access_pb.Key(name="g", grants=[_grant("send", "*")]), [], "update_mask"),
        (access_pb.Key(name="g", grants=[_grant("send", "*")]), ["name"], "update_mask"),
    ],
)
def test_access_service_refuses_bad_keys(
    keys: Keys, auth_channel: grpc.Channel, key: access_pb.Key, mask, message: str
) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    if mask is None:
        error = error_of(
            access.CreateKey, access_pb.CreateKeyRequest(key=key), metadata=bearer(keys.admin)
        )
    else:
        error = error_of(
            access.UpdateKey,
            access_pb.UpdateKeyRequest(key=key, update_mask={"paths": mask}),
            metadata=bearer(keys.admin),
        )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in error.details()


def test_access_service_refuses_a_duplicate_and_a_past_expiry(
    keys: Keys, auth_channel: grpc.Channel
) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    admin = bearer(keys.admin)
    duplicate = access_pb.CreateKeyRequest(
        key=access_pb.Key(name="matrix-admin", grants=[_grant("read", "*")])
    )
    assert error_of(access.CreateKey, duplicate, metadata=admin).code() == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    past = access_pb.CreateKeyRequest(key=access_pb.Key(name="past", grants=[_grant("read", "*")]))
    past.key.expire_time.FromSeconds(int(time.time()) - 60)
    error = error_of(access.CreateKey, past, metadata=admin)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "future" in error.details()


def test_keys_sigv4_secret_derives_the_sqs_secret_from_the_key(keys: Keys) -> None:
    from support import postbox

    result = postbox("keys", "sigv4-secret", env={"POSTBOX_API_KEY": keys.admin})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == sigv4_secret(keys.admin)


def test_a_streaming_receive_is_checked_on_every_queue_it_names(
    keys: Keys, auth_database: str, auth_channel: grpc.Channel
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="stream-mine")),
        metadata=bearer(keys.admin),
    )
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    receiver = access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name="stream-receiver", grants=[_grant("receive", "stream-mine")])
        ),
        metadata=bearer(keys.admin),
    ).secret
    # The first request is allowed; were only it checked, the stream would wait on
    # stream-mine until the deadline instead.
    requests = iter(
        [
            message_service_pb2.StreamingReceiveRequest(queue="stream-mine", max_messages=1),
            message_service_pb2.StreamingReceiveRequest(queue="stream-theirs"),
        ]
    )
    stream = message_service_pb2_grpc.MessageServiceStub(auth_channel).StreamingReceive(
        requests, metadata=bearer(receiver), timeout=20
    )
    with pytest.raises(grpc.RpcError) as refused:
        for _ in stream:
            pass
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'stream-theirs'" in refused.value.details()


def test_a_send_stream_refuses_a_send_alone_and_goes_on(
    keys: Keys, auth_channel: grpc.Channel
) -> None:
    admin = bearer(keys.admin)
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    for name in ("send-mine", "send-theirs"):
        queues.CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name)),
            metadata=admin,
        )
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    sender = access.CreateKey(
        access_pb.CreateKeyRequest(
            key=access_pb.Key(name="stream-sender", grants=[_grant("send", "send-mine")])
        ),
        metadata=admin,
    ).secret
    requests = [
        message_service_pb2.SendStreamRequest(
            tag=tag, send=message_service_pb2.SendRequest(queue=queue, body=b"x")
        )
        for tag, queue in ((1, "send-mine"), (2, "send-theirs"), (3, "send-mine"))
    ]
    # The sends a request carries in `more` are each checked alone.
    carrying = message_service_pb2.SendStreamRequest(
        tag=4, send=message_service_pb2.SendRequest(queue="send-mine", body=b"x")
    )
    for tag, queue in ((5, "send-theirs"), (6, "send-mine")):
        carrying.more.add(tag=tag, send=message_service_pb2.SendRequest(queue=queue, body=b"x"))
    requests.append(carrying)
    responses = message_service_pb2_grpc.MessageServiceStub(auth_channel).SendStream(
        iter(requests), metadata=bearer(sender), timeout=20
    )
    answers = {result.tag: result for response in responses for result in response.results}
    assert answers[1].sent.message_id
    assert answers[3].sent.message_id
    assert answers[2].error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert "'send-theirs'" in answers[2].error.message
    assert "'send'" in answers[2].error.message
    assert answers[4].sent.message_id
    assert answers[6].sent.message_id
    assert answers[5].error == answers[2].error

    # A batch stream checks each batch alone: a refused one is answered, the others sent.
    batches = [
        message_service_pb2.SendBatchStreamRequest(
            tag=tag,
            batch=message_service_pb2.SendBatchRequest(
                queue=queue, entries=[message_service_pb2.SendBatchEntry(body=b"x")]
            ),
        )
        for tag, queue in ((1, "send-mine"), (2, "send-theirs"), (3, "send-mine"))
    ]
    responses = message_service_pb2_grpc.MessageServiceStub(auth_channel).SendBatchStream(
        iter(batches), metadata=bearer(sender), timeout=20
    )
    answers = {result.tag: result for response in responses for result in response.results}
    assert answers[1].sent.message_ids
    assert answers[3].sent.message_ids
    assert answers[2].error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert "'send-theirs'" in answers[2].error.message


def test_listing_every_queues_messages_needs_read_on_every_queue(
    keys: Keys, auth_database: str, auth_channel: grpc.Channel
) -> None:
    from postbox.v1 import message_service_pb2, message_service_pb2_grpc

    messages = message_service_pb2_grpc.MessageServiceStub(auth_channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="jobs-eu")),
        metadata=bearer(keys.admin),
    )
    reader = bootstrap_key(auth_database, "jobs-reader", "read:jobs-*")
    wait_until(
        lambda: (
            call_status(auth_channel, "/postbox.v1.QueueService/ListQueues", reader)
            == grpc.StatusCode.OK
        ),
        5,
        "the new key",
    )
    one = message_service_pb2.ListMessagesRequest(queue="jobs-eu")
    assert list(messages.ListMessages(one, metadata=bearer(reader)).messages) == []
    every = message_service_pb2.ListMessagesRequest()
    denied = error_of(messages.ListMessages, every, metadata=bearer(reader))
    assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "lacks permission 'read' on any resource" in denied.details()
    messages.ListMessages(every, metadata=bearer(keys.admin))


# Second resources: a grant on the resource a call names must not let it write into
# another (a dead-letter queue, a redrive's destination, a subscription's queue, a
# schedule's queue or topic).
TARGETED = [
    (path, target)
    for path, rule in sorted(RULES.items())
    for target in rule.targets
    if target.derive is None
]
# Second resources whose name the server makes from the first's (CreateQueue's
# with_dead_letter_queue: tests/engine/test_auto_create.py checks its grant).
DERIVED = [
    (path, target)
    for path, rule in sorted(RULES.items())
    for target in rule.targets
    if target.derive is not None
]
ELSEWHERE = "elsewhere-no such name"


def _targeted_status(
    channel: grpc.Channel, path: str, target: Target, secret: str
) -> tuple[grpc.StatusCode, str]:
    """The status and details of the matrix request of `path` naming ELSEWHERE as target."""
    method = METHODS[path]
    request = matrix_request(method, RULES[path])
    *parents, last = target.field.split(".")
    holder = request
    for part in parents:
        holder = getattr(holder, part)
    setattr(holder, last, ELSEWHERE)
    if target.mask is not None:
        request.update_mask.paths.append(target.mask)
    parse = message_factory.GetMessageClass(method.output_type).FromString
    call = channel.unary_unary(path, type(request).SerializeToString, parse)
    try:
        call(request, metadata=bearer(secret), timeout=10)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def test_every_rpc_writing_into_a_second_resource_names_it_as_a_target() -> None:
    # The fields of the API that name a queue or topic the call then writes into.
    assert {(path.rsplit("/", 1)[1], t.field) for path, t in TARGETED} == {
        ("CreateQueue", "queue.dead_letter_policy.dead_letter_queue"),
        ("UpdateQueue", "queue.dead_letter_policy.dead_letter_queue"),
        ("RedriveMessages", "destination"),
        ("CreateSubscription", "subscription.queue"),
        ("UpdateSubscription", "subscription.queue"),
        ("CreateSchedule", "schedule.target.queue"),
        ("CreateSchedule", "schedule.target.topic"),
        ("UpdateSchedule", "schedule.target.queue"),
        ("UpdateSchedule", "schedule.target.topic"),
    }
    assert [(path.rsplit("/", 1)[1], t.permission, t.when) for path, t in DERIVED] == [
        ("CreateQueue", "manage", "with_dead_letter_queue")
    ]


@pytest.mark.parametrize(
    ("path", "target"), TARGETED, ids=[f"{p.rsplit('/', 1)[1]}-{t.field}" for p, t in TARGETED]
)
def test_a_second_resource_needs_its_own_grant(
    path: str, target: Target, keys: Keys, auth_channel: grpc.Channel
) -> None:
    rule = RULES[path]
    # The grant on the named resource alone is not enough.
    code, details = _targeted_status(
        auth_channel, path, target, keys.right[rule.permission, _pattern(rule)]
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert f"'{target.permission}'" in details
    assert repr(ELSEWHERE) in details
    # With the target's permission on it too, the call gets what an admin gets.
    both = keys.targeted[target.permission]
    allowed, _ = _targeted_status(auth_channel, path, target, both)
    assert allowed != grpc.StatusCode.PERMISSION_DENIED
    assert allowed == _targeted_status(auth_channel, path, target, keys.admin)[0]


def test_a_team_key_cannot_route_messages_into_another_teams_queue(
    keys: Keys, auth_database: str, auth_channel: grpc.Channel
) -> None:
    admin = bearer(keys.admin)
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(auth_channel)
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(auth_channel)
    qpb, tpb, spb = queue_service_pb2, topic_service_pb2, schedule_service_pb2
    for name in ("team-a-dlq", "team-a-jobs", "team-b-jobs"):
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)), metadata=admin)
    for name in ("team-a-events", "team-b-events"):
        topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=name)), metadata=admin)
    team_a = bootstrap_key(
        auth_database, "team-a", "manage:team-a-*", "send:team-a-*", "publish:team-a-*",
        "read:team-a-*",
    )  # fmt: skip
    wait_until(
        lambda: (
            call_status(auth_channel, "/postbox.v1.QueueService/ListQueues", team_a)
            == grpc.StatusCode.OK
        ),
        5,
        "the new key",
    )
    a = bearer(team_a)

    def refused(call, request, target: str, permission: str = "send") -> None:
        error = error_of(call, request, metadata=a)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
        assert f"'{permission}'" in error.details()
        assert f"'{target}'" in error.details()

    def dead_letters(queue: str) -> qpb.DeadLetterPolicy:
        return qpb.DeadLetterPolicy(dead_letter_queue=queue, max_receive_count=3)

    with_dlq = qpb.Queue(name="team-a-src", dead_letter_policy=dead_letters("team-b-jobs"))
    refused(queues.CreateQueue, qpb.CreateQueueRequest(queue=with_dlq), "team-b-jobs")
    gone = error_of(queues.GetQueue, qpb.GetQueueRequest(name="team-a-src"), metadata=admin)
    assert gone.code() == grpc.StatusCode.NOT_FOUND, "a refused create creates nothing"
    # Its own dead-letter queue is fine; then pointing it at team B's is not.
    with_dlq.dead_letter_policy.dead_letter_queue = "team-a-dlq"
    queues.CreateQueue(qpb.CreateQueueRequest(queue=with_dlq), metadata=a)
    with_dlq.dead_letter_policy.dead_letter_queue = "team-b-jobs"
    update = qpb.UpdateQueueRequest(queue=with_dlq)
    update.update_mask.paths.append("dead_letter_policy")
    refused(queues.UpdateQueue, update, "team-b-jobs")
    # Another setting's update carries the same queue message: it changes no target.
    update.update_mask.paths[:] = ["visibility_timeout"]
    queues.UpdateQueue(update, metadata=a)
    got = queues.GetQueue(qpb.GetQueueRequest(name="team-a-src"), metadata=admin).queue
    assert got.dead_letter_policy.dead_letter_queue == "team-a-dlq"

    refused(
        queues.RedriveMessages,
        qpb.RedriveMessagesRequest(dead_letter_queue="team-a-dlq", destination="team-b-jobs"),
        "team-b-jobs",
    )
    subscription = tpb.Subscription(name="leak", topic="team-a-events", queue="team-b-jobs")
    refused(
        topics.CreateSubscription,
        tpb.CreateSubscriptionRequest(subscription=subscription),
        "team-b-jobs",
    )
    subscription.queue = "team-a-jobs"
    topics.CreateSubscription(tpb.CreateSubscriptionRequest(subscription=subscription), metadata=a)
    subscription.queue = "team-b-jobs"
    moved = tpb.UpdateSubscriptionRequest(subscription=subscription)
    moved.update_mask.paths.append("queue")
    refused(topics.UpdateSubscription, moved, "team-b-jobs")

    schedule = spb.Schedule(name="team-a-tick", target=spb.ScheduleTarget(queue="team-b-jobs"))
    schedule.interval.FromSeconds(60)
    refused(schedules.CreateSchedule, spb.CreateScheduleRequest(schedule=schedule), "team-b-jobs")
    schedule.target.topic = "team-b-events"
    refused(
        schedules.CreateSchedule,
        spb.CreateScheduleRequest(schedule=schedule),
        "team-b-events",
        "publish",
    )
    schedule.target.queue = "team-a-jobs"
    schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=schedule), metadata=a)
    schedule.target.queue = "team-b-jobs"
    retarget = spb.UpdateScheduleRequest(schedule=schedule)
    retarget.update_mask.paths.append("target")
    refused(schedules.UpdateSchedule, retarget, "team-b-jobs")

    # Publishing on team A's topic reaches team A's queue only.
    published = topics.Publish(tpb.PublishRequest(topic="team-a-events", body=b"x"), metadata=a)
    assert list(published.queues) == ["team-a-jobs"]
    peek = message_service_pb2.PeekMessagesRequest(queue="team-b-jobs")
    messages = message_service_pb2_grpc.MessageServiceStub(auth_channel)
    assert not messages.PeekMessages(peek, metadata=admin).messages


def test_a_keys_last_use_is_recorded_at_most_once_a_minute(
    keys: Keys, auth_channel: grpc.Channel
) -> None:
    access = access_service_pb2_grpc.AccessServiceStub(auth_channel)
    admin = bearer(keys.admin)

    def create(name: str) -> str:
        key = access_pb.Key(name=name, grants=[_grant("read", "*")])
        return access.CreateKey(access_pb.CreateKeyRequest(key=key), metadata=admin).secret

    def last_used(name: str) -> access_pb.Key:
        return access.GetKey(access_pb.GetKeyRequest(name=name), metadata=admin).key

    busy, idle = create("usage-busy"), create("usage-late")
    assert not last_used("usage-busy").HasField("last_used_time")
    ping = "/postbox.v1.QueueService/ListQueues"
    before = time.time()
    assert call_status(auth_channel, ping, busy) == grpc.StatusCode.OK
    # A key's first use is written at once, in the background.
    wait_until(lambda: last_used("usage-busy").HasField("last_used_time"), 5, "the first use")
    first = last_used("usage-busy").last_used_time
    assert before - 1 <= first.ToNanoseconds() / 1e9 <= time.time() + 1
    for _ in range(20):
        assert call_status(auth_channel, ping, busy) == grpc.StatusCode.OK
    # Another key's first use makes the server write what is due: the busy key's later
    # uses are not, within a minute of its last write.
    assert call_status(auth_channel, ping, idle) == grpc.StatusCode.OK
    wait_until(lambda: last_used("usage-late").HasField("last_used_time"), 5, "the other key")
    assert last_used("usage-busy").last_used_time == first
    listed = access.ListKeys(access_pb.ListKeysRequest(), metadata=admin).keys
    assert {k.name: k.last_used_time for k in listed}["usage-busy"] == first


def test_dead_letter_source_queues_list_only_what_the_key_may_read(
    keys: Keys, auth_database: str, auth_channel: grpc.Channel
) -> None:
    queues = queue_service_pb2_grpc.QueueServiceStub(auth_channel)
    qpb = queue_service_pb2
    admin = bearer(keys.admin)
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="dlqx-dlq")), metadata=admin)
    for source in ("dlqx-orders", "hidden-orders"):
        policy = qpb.DeadLetterPolicy(dead_letter_queue="dlqx-dlq", max_receive_count=3)
        queues.CreateQueue(
            qpb.CreateQueueRequest(queue=qpb.Queue(name=source, dead_letter_policy=policy)),
            metadata=admin,
        )
    reader = bootstrap_key(auth_database, "dlqx-reader", "read:dlqx-*")
    wait_until(
        lambda: (
            call_status(auth_channel, "/postbox.v1.QueueService/ListQueues", reader)
            == grpc.StatusCode.OK
        ),
        5,
        "the new key",
    )
    request = qpb.ListDeadLetterSourceQueuesRequest(dead_letter_queue="dlqx-dlq")
    everything = queues.ListDeadLetterSourceQueues(request, metadata=admin).queue_names
    assert list(everything) == ["dlqx-orders", "hidden-orders"]
    # The other team's queue is not even named.
    seen = queues.ListDeadLetterSourceQueues(request, metadata=bearer(reader)).queue_names
    assert list(seen) == ["dlqx-orders"]
