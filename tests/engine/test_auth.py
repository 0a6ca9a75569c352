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
    wait_until,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from support import (
    ServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    free_port,
)

from postbox_server.auth.rules import RULES, Rule
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
    return Keys(admin, right, wrong, other_resource, expired, revoked)


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
        queues.ListQueues, queue_service_pb2.ListQueuesRequest(), metadata=bearer(unknown)
    )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
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
    responses = message_service_pb2_grpc.MessageServiceStub(auth_channel).SendStream(
        iter(requests), metadata=bearer(sender), timeout=20
    )
    answers = {result.tag: result for response in responses for result in response.results}
    assert answers[1].sent.message_id
    assert answers[3].sent.message_id
    assert answers[2].error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    assert "'send-theirs'" in answers[2].error.message
    assert "'send'" in answers[2].error.message


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
