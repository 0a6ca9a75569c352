"""The SQS shim with API keys: access key id = key name, SigV4 checked by the server with
the key's SigV4 secret, and the key's grants, through boto3 for every action.

A database, server and shim of their own: keys turn authentication on for every server
of a database.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from auth_support import assert_refuses_anonymous_exposure, bearer, wait_until
from botocore import UNSIGNED
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
    free_port,
    sqs_client,
)

from postbox_server.auth.secrets import sigv4_secret
from postbox_server.aws.sqs.actions import HANDLERS

# Well-formed, so that every call reaches the server (which alone knows keys): a task
# handle as the shim makes them, and (set by the fixture) a real message's receipt.
TASK = base64.urlsafe_b64encode(
    json.dumps({"taskId": "00000000-0000-0000-0000-000000000000"}).encode()
).decode()
RECEIPT = ""


def _arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:{SQS_ACCOUNT}:{name}"


@dataclass(frozen=True)
class Case:
    permission: str  # what the right key holds, on "authz-*" (or "*" for `anywhere`)
    call: Callable[[Any, str], Any]  # (client, queue URL) -> the boto3 call
    anywhere: bool = False


# Every action of the shim; the queue is "authz-missing" (absent, so nothing changes)
# unless the action creates one.
CASES: dict[str, Case] = {
    "CreateQueue": Case("manage", lambda c, u: c.create_queue(QueueName="authz-created")),
    "DeleteQueue": Case("manage", lambda c, u: c.delete_queue(QueueUrl=u)),
    "GetQueueUrl": Case("read", lambda c, u: c.get_queue_url(QueueName="authz-missing")),
    "GetQueueAttributes": Case(
        "read", lambda c, u: c.get_queue_attributes(QueueUrl=u, AttributeNames=["All"])
    ),
    "SetQueueAttributes": Case(
        "manage",
        lambda c, u: c.set_queue_attributes(QueueUrl=u, Attributes={"DelaySeconds": "1"}),
    ),
    "ListQueues": Case("read", lambda c, u: c.list_queues()),
    "PurgeQueue": Case("manage", lambda c, u: c.purge_queue(QueueUrl=u)),
    "TagQueue": Case("manage", lambda c, u: c.tag_queue(QueueUrl=u, Tags={"a": "b"})),
    "UntagQueue": Case("manage", lambda c, u: c.untag_queue(QueueUrl=u, TagKeys=["a"])),
    "ListQueueTags": Case("read", lambda c, u: c.list_queue_tags(QueueUrl=u)),
    "SendMessage": Case("send", lambda c, u: c.send_message(QueueUrl=u, MessageBody="x")),
    "SendMessageBatch": Case(
        "send",
        lambda c, u: c.send_message_batch(QueueUrl=u, Entries=[{"Id": "1", "MessageBody": "x"}]),
    ),
    "ReceiveMessage": Case("receive", lambda c, u: c.receive_message(QueueUrl=u)),
    "DeleteMessage": Case(
        "receive", lambda c, u: c.delete_message(QueueUrl=u, ReceiptHandle=RECEIPT)
    ),
    "DeleteMessageBatch": Case(
        "receive",
        lambda c, u: c.delete_message_batch(
            QueueUrl=u, Entries=[{"Id": "1", "ReceiptHandle": RECEIPT}]
        ),
    ),
    "ChangeMessageVisibility": Case(
        "receive",
        lambda c, u: c.change_message_visibility(
            QueueUrl=u, ReceiptHandle=RECEIPT, VisibilityTimeout=1
        ),
    ),
    "ChangeMessageVisibilityBatch": Case(
        "receive",
        lambda c, u: c.change_message_visibility_batch(
            QueueUrl=u, Entries=[{"Id": "1", "ReceiptHandle": RECEIPT, "VisibilityTimeout": 1}]
        ),
    ),
    "ListDeadLetterSourceQueues": Case(
        "read", lambda c, u: c.list_dead_letter_source_queues(QueueUrl=u)
    ),
    "StartMessageMoveTask": Case(
        "manage", lambda c, u: c.start_message_move_task(SourceArn=_arn("authz-missing"))
    ),
    "ListMessageMoveTasks": Case(
        "read", lambda c, u: c.list_message_move_tasks(SourceArn=_arn("authz-missing"))
    ),
    "CancelMessageMoveTask": Case(
        "manage", lambda c, u: c.cancel_message_move_task(TaskHandle=TASK), anywhere=True
    ),
    # The queue's access policy is one of its attributes (stored, not enforced).
    "AddPermission": Case(
        "manage",
        lambda c, u: c.add_permission(
            QueueUrl=u, Label="l", AWSAccountIds=["111111111111"], Actions=["SendMessage"]
        ),
    ),
    "RemovePermission": Case("manage", lambda c, u: c.remove_permission(QueueUrl=u, Label="l")),
}
# A permission no SQS action needs stands for "the wrong grant" (read would pass the
# queue lookups some actions make first, and the absent queue would answer).
WRONG_PERMISSION = "publish"


@dataclass
class Clients:
    endpoint: str
    server_target: str
    database_url: str
    admin: Any
    right: dict[tuple[str, bool], Any]
    wrong: Any
    unsigned: Any
    unknown: Any
    bad_secret: Any
    expired: Any
    revoked: Any


@pytest.fixture(scope="module")
def clients(admin_url: str) -> Iterator[Clients]:
    url = create_database(admin_url, "postbox_sqs_keys")
    server = shim = None
    try:
        server = ServerProcess(url).start()
        admin_secret = bootstrap_key(url, "sqs-admin", "admin:*")
        shim = SqsShimProcess(server.target).start()
        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)

            def ready() -> bool:
                try:
                    access.ListKeys(access_pb.ListKeysRequest(), metadata=bearer(admin_secret))
                except grpc.RpcError:
                    return False
                return True

            wait_until(ready, 5, "the first key")

            def create(name: str, permission: str, pattern: str, expire_in: float | None = None):
                key = access_pb.Key(
                    name=name,
                    grants=[
                        access_pb.Grant(
                            permission=access_pb.Permission.Value(
                                f"PERMISSION_{permission.upper()}"
                            ),
                            pattern=pattern,
                        )
                    ],
                )
                if expire_in is not None:
                    key.expire_time.FromSeconds(int(time.time() + expire_in) + 1)
                created = access.CreateKey(
                    access_pb.CreateKeyRequest(key=key), metadata=bearer(admin_secret)
                )
                return sqs_client(shim.endpoint, "json", name, created.sigv4_secret_access_key)

            admin = create("sqs-root", "admin", "*")
            permissions = {(case.permission, case.anywhere) for case in CASES.values() if case}
            right = {
                (permission, anywhere): create(
                    f"right-{permission}-{anywhere:d}", permission, "*" if anywhere else "authz-*"
                )
                for permission, anywhere in permissions
            }
            wrong = create("wrong", WRONG_PERMISSION, "*")
            # A receipt of the matrix's queue, which then goes away.
            global RECEIPT
            gone = admin.create_queue(QueueName="authz-missing")["QueueUrl"]
            admin.send_message(QueueUrl=gone, MessageBody="x")
            RECEIPT = admin.receive_message(QueueUrl=gone)["Messages"][0]["ReceiptHandle"]
            admin.delete_queue(QueueUrl=gone)
            expired = create("expired", "admin", "*", expire_in=1)
            revoked = create("revoked", "admin", "*")
            revoked.list_queues()  # works until revoked
            access.DeleteKey(
                access_pb.DeleteKeyRequest(name="revoked"), metadata=bearer(admin_secret)
            )
        unsigned = _unsigned_client(shim.endpoint)
        clients = Clients(
            endpoint=shim.endpoint,
            server_target=server.target,
            database_url=url,
            admin=admin,
            right=right,
            wrong=wrong,
            unsigned=unsigned,
            unknown=sqs_client(shim.endpoint, "json", "nobody", "whatever"),
            bad_secret=sqs_client(shim.endpoint, "json", "sqs-root", "not-its-secret"),
            expired=expired,
            revoked=revoked,
        )

        def expired_now() -> bool:
            return _error(lambda: expired.list_queues()) == "InvalidClientTokenId"

        wait_until(expired_now, 10, "expiry")
        yield clients
    finally:
        if shim is not None:
            shim.stop()
        if server is not None:
            server.stop()
        drop_database(admin_url, url)


def _unsigned_client(endpoint: str):
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1, "mode": "standard"}),
    )


def _error(call: Callable[[], Any]) -> str:
    """The AWS error code of a call, "OK" when it succeeds."""
    try:
        call()
    except ClientError as error:
        return error.response["Error"]["Code"]
    return "OK"


def test_every_sqs_action_is_in_the_matrix() -> None:
    assert sorted(CASES) == sorted(HANDLERS)


@pytest.mark.parametrize("action", sorted(CASES))
def test_sqs_authorisation_matrix(action: str, clients: Clients) -> None:
    case = CASES[action]
    url = f"{clients.endpoint}/{SQS_ACCOUNT}/authz-missing"

    def outcome(client: Any) -> str:
        return _error(lambda: case.call(client, url))

    assert outcome(clients.unsigned) == "MissingAuthenticationToken"
    assert outcome(clients.unknown) == "InvalidClientTokenId"
    assert outcome(clients.bad_secret) == "SignatureDoesNotMatch"
    assert outcome(clients.expired) == "InvalidClientTokenId"
    assert outcome(clients.revoked) == "InvalidClientTokenId"
    assert outcome(clients.wrong) == "AccessDenied"
    allowed = outcome(clients.right[case.permission, case.anywhere])
    assert allowed not in (
        "MissingAuthenticationToken",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "AccessDenied",
    )
    assert allowed == outcome(clients.admin)


def test_static_credentials_act_with_the_shims_own_key(clients: Clients) -> None:
    sender = bootstrap_key(clients.database_url, "shim-sender", "send:static-*", "manage:static-*")
    shim = SqsShimProcess(
        clients.server_target, "--access-key", "static", "--secret-key", "static-secret"
    )
    shim.spawn(
        "sqs", "--host", "127.0.0.1", "--port", str(shim.port),
        "--grpc-target", clients.server_target,
        "--access-key", "static", "--secret-key", "static-secret",
        env={**os.environ, "POSTBOX_API_KEY": sender},
    )  # fmt: skip
    shim.wait_ready(shim._answers, "shim", 30)
    try:
        static = sqs_client(shim.endpoint, "json", "static", "static-secret")
        url = static.create_queue(QueueName="static-orders")["QueueUrl"]
        static.send_message(QueueUrl=url, MessageBody="hello")
        # The shim's key may not read other queues, so neither may its static clients.
        assert _error(lambda: static.list_dead_letter_source_queues(
            QueueUrl=f"{shim.endpoint}/{SQS_ACCOUNT}/elsewhere"
        )) == "AccessDenied"  # fmt: skip
        # Access key ids the shim does not know go to the server's keys.
        credentials = clients.admin._request_signer._credentials
        as_key = sqs_client(shim.endpoint, "json", "sqs-root", credentials.secret_key)
        assert _error(lambda: as_key.list_queues()) == "OK"
        unknown = sqs_client(shim.endpoint, "json", "nobody", "whatever")
        assert _error(lambda: unknown.list_queues()) == "InvalidClientTokenId"
        wrong_secret = sqs_client(shim.endpoint, "json", "static", "not-it")
        assert _error(lambda: wrong_secret.list_queues()) == "SignatureDoesNotMatch"
    finally:
        shim.stop()


def test_shim_refuses_a_network_address_without_credentials_or_keys(admin_url: str) -> None:
    url = create_database(admin_url, "postbox_sqs_open")
    server = ServerProcess(url).start()
    try:
        assert_refuses_anonymous_exposure(
            "sqs", "--host", "0.0.0.0", "--port", str(free_port()),
            "--grpc-target", server.target,
        )  # fmt: skip
    finally:
        server.stop()
        drop_database(admin_url, url)


def test_a_redrive_policy_needs_send_on_its_dead_letter_queue(clients: Clients) -> None:
    secret = bootstrap_key(
        clients.database_url, "team-a-sqs", "manage:team-a-*", "send:team-a-*", "read:team-a-*"
    )
    team_a = sqs_client(clients.endpoint, "json", "team-a-sqs", sigv4_secret(secret))
    wait_until(lambda: _error(lambda: team_a.list_queues()) == "OK", 5, "the new key")
    clients.admin.create_queue(QueueName="team-b-dlq")

    def redrive(target: str) -> dict[str, str]:
        policy = {"deadLetterTargetArn": _arn(target), "maxReceiveCount": "3"}
        return {"RedrivePolicy": json.dumps(policy)}

    refused = _error(
        lambda: team_a.create_queue(QueueName="team-a-src", Attributes=redrive("team-b-dlq"))
    )
    assert refused == "AccessDenied"
    assert _error(lambda: clients.admin.get_queue_url(QueueName="team-a-src")) == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
    team_a.create_queue(QueueName="team-a-dlq")
    url = team_a.create_queue(QueueName="team-a-src", Attributes=redrive("team-a-dlq"))["QueueUrl"]
    refused = _error(
        lambda: team_a.set_queue_attributes(QueueUrl=url, Attributes=redrive("team-b-dlq"))
    )
    assert refused == "AccessDenied"
    attributes = team_a.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert "team-a-dlq" in attributes["Attributes"]["RedrivePolicy"]
    # A move task's destination is written into as well.
    moved = _error(
        lambda: team_a.start_message_move_task(
            SourceArn=_arn("team-a-dlq"), DestinationArn=_arn("team-b-dlq")
        )
    )
    assert moved == "AccessDenied"


def test_an_sns_subscription_needs_send_on_its_queue(clients: Clients) -> None:
    import boto3

    secret = bootstrap_key(
        clients.database_url, "team-a-sns", "manage:team-a-*", "publish:team-a-*",
        "send:team-a-*", "read:team-a-*",
    )  # fmt: skip
    sns = boto3.client(
        "sns",
        endpoint_url=clients.endpoint,
        region_name="us-east-1",
        aws_access_key_id="team-a-sns",
        aws_secret_access_key=sigv4_secret(secret),
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    wait_until(lambda: _error(lambda: sns.list_topics()) == "OK", 5, "the new key")
    clients.admin.create_queue(QueueName="team-b-inbox")
    topic = sns.create_topic(Name="team-a-news")["TopicArn"]
    refused = _error(
        lambda: sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=_arn("team-b-inbox"))
    )
    assert refused == "AuthorizationError"
    clients.admin.create_queue(QueueName="team-a-inbox")
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=_arn("team-a-inbox"))


def test_a_tenants_key_sees_only_its_tenants_queues_through_the_shim(clients: Clients) -> None:
    """The shim reaches the server through the tenant door: a tenant's key names its
    queues as anyone does and never sees the default tenant's. (Its account id in URLs
    and ARNs: test_tenant_accounts.py.)"""
    with grpc.insecure_channel(clients.server_target) as channel:
        access = access_service_pb2_grpc.AccessServiceStub(channel)
        admin_secret = bootstrap_key(clients.database_url, "sqs-tenant-admin", "admin:*")
        wait_until(lambda: _error(lambda: _granted(access, admin_secret)) == "OK", 5, "the new key")
        access.CreateTenant(
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name="sqs-acme")),
            metadata=bearer(admin_secret),
        )
        created = access.CreateKey(
            access_pb.CreateKeyRequest(
                key=access_pb.Key(
                    name="sqs-acme-app",
                    tenant="sqs-acme",
                    grants=[access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")],
                )
            ),
            metadata=bearer(admin_secret),
        )
    tenant = sqs_client(clients.endpoint, "json", "sqs-acme-app", created.sigv4_secret_access_key)
    default_url = clients.admin.create_queue(QueueName="shared-orders")["QueueUrl"]
    clients.admin.create_queue(QueueName="default-only")
    clients.admin.send_message(QueueUrl=default_url, MessageBody="default's")
    tenant_url = tenant.create_queue(QueueName="shared-orders")["QueueUrl"]
    assert tenant_url.endswith("/shared-orders")
    tenant.send_message(QueueUrl=tenant_url, MessageBody="acme's")
    listed = tenant.list_queues().get("QueueUrls", [])
    assert [url.rsplit("/", 1)[1] for url in listed] == ["shared-orders"]
    received = tenant.receive_message(QueueUrl=tenant_url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in received["Messages"]] == ["acme's"]
    missing = _error(lambda: tenant.get_queue_url(QueueName="default-only"))
    assert missing == _error(lambda: tenant.get_queue_url(QueueName="nowhere-at-all"))
    assert missing == "AWS.SimpleQueueService.NonExistentQueue"
    received = clients.admin.receive_message(QueueUrl=default_url, MaxNumberOfMessages=10)
    assert [m["Body"] for m in received["Messages"]] == ["default's"]


def _granted(access: Any, secret: str) -> None:
    try:
        access.ListTenants(access_pb.ListTenantsRequest(), metadata=bearer(secret))
    except grpc.RpcError as error:
        raise ClientError({"Error": {"Code": error.code().name}}, "ListTenants") from None
