"""What the tests that turn API keys on share: bearer metadata, the status of one call of
any RPC made with a key, waiting for a key to take effect, the RetryInfo of a call
refused over a rate limit, the refusal to serve a network address anonymously, and
tenants with an admin key each."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.rpc import error_details_pb2, status_pb2
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import access_service_pb2_grpc
from support import ROOT, ServerProcess, api_methods, bootstrap_key, create_database, drop_database

from postbox_server.auth.rules import RULES, Rule

# The name every matrix request names: malformed for every kind of resource, so no
# call changes anything, yet grants on "authz-*" match it.
RESOURCE = "authz-no such name"
# Every RPC of the API by its path, /postbox.v1.<Service>/<Method>.
METHODS = {f"/{m.containing_service.full_name}/{m.name}": m for m in api_methods()}


def bearer(secret: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {secret}")]


STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def retry_delay(error: grpc.RpcError) -> float:
    """The RetryInfo's delay in the status details of a call refused over a rate limit."""
    (details,) = [v for k, v in error.trailing_metadata() if k == "grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    (packed,) = status.details
    info = error_details_pb2.RetryInfo()
    assert packed.Unpack(info)
    return info.retry_delay.ToNanoseconds() / 1e9


def matrix_request(method: MethodDescriptor, rule: Rule | None):
    request = message_factory.GetMessageClass(method.input_type)()
    if rule is not None and rule.field is not None:
        *path, last = rule.field.split(".")
        target = request
        for part in path:
            target = getattr(target, part)
        setattr(target, last, RESOURCE)
    return request


def call_status(channel: grpc.Channel, path: str, secret: str | None) -> grpc.StatusCode:
    """The status of one call of `path` with the matrix request, presenting `secret`; for
    a stream answering each request on its own (Rule.per_request), its request's answer."""
    method = METHODS[path]
    rule = RULES.get(path)
    request = matrix_request(method, rule)
    metadata = bearer(secret) if secret is not None else None
    serialize = type(request).SerializeToString
    parse = message_factory.GetMessageClass(method.output_type).FromString
    try:
        if method.client_streaming:
            call = channel.stream_stream(path, serialize, parse)
            responses = call(iter([request]), metadata=metadata, timeout=10)
            first = next(responses, None)
            if rule is not None and rule.per_request and first is not None:
                (answer,) = first.results
                if answer.HasField("error"):
                    return STATUS_BY_NUMBER[answer.error.code]
        elif method.server_streaming:
            responses = channel.unary_stream(path, serialize, parse)(
                request, metadata=metadata, timeout=10
            )
            next(responses, None)
        else:
            channel.unary_unary(path, serialize, parse)(request, metadata=metadata, timeout=10)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def wait_until(condition, timeout: float, what: str) -> float:
    """Polls until `condition()` holds; the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what} not seen after {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - started


def assert_refuses_anonymous_exposure(*args: str) -> None:
    """`python -m postbox_server *args` exits at once with 2, naming both ways out."""
    result = subprocess.run(
        [sys.executable, "-m", "postbox_server", *args],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "postbox keys create" in result.stderr
    assert "--insecure-allow-anonymous" in result.stderr


def wait_key_works(access, metadata: list[tuple[str, str]], timeout: float = 5.0) -> None:
    """Until the server's key cache has the key (an admin key, bootstrapped in SQL): it
    takes a notification, which may come after the server answers its first call."""
    from postbox.v1 import access_service_pb2

    def works() -> bool:
        try:
            access.ListKeys(access_service_pb2.ListKeysRequest(), metadata=metadata)
        except grpc.RpcError:
            return False
        return True

    wait_until(works, timeout, "the first key")


def tenant_admins(channel: grpc.Channel, default_admin: str, *tenants: str) -> dict[str, str]:
    """Creates each tenant and a key of it with admin:*, by the default tenant's
    `default_admin` (waited for until the server knows it); each tenant's secret."""
    access = access_service_pb2_grpc.AccessServiceStub(channel)

    def known() -> bool:
        try:
            access.ListTenants(access_pb.ListTenantsRequest(), metadata=bearer(default_admin))
        except grpc.RpcError:
            return False
        return True

    wait_until(known, 30, "the first key")
    secrets = {}
    for tenant in tenants:
        access.CreateTenant(
            access_pb.CreateTenantRequest(tenant=access_pb.Tenant(name=tenant)),
            metadata=bearer(default_admin),
        )
        grant = access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")
        created = access.CreateKey(
            access_pb.CreateKeyRequest(
                key=access_pb.Key(name=f"{tenant}-admin", grants=[grant], tenant=tenant)
            ),
            metadata=bearer(default_admin),
        )
        secrets[tenant] = created.secret
    return secrets


Server = TypeVar("Server", bound=ServerProcess)


@contextmanager
def tenant_server(
    admin_url: str, database: str, server_class: type[Server], *tenants: str
) -> Iterator[tuple[Server, dict[str, str]]]:
    """A database of its own (keys turn authentication on), a server on it, and the
    tenants, each with its admin:* key's secret; all gone on exit."""
    url = create_database(admin_url, database)
    server = server_class(url).start()
    try:
        default_admin = bootstrap_key(url, f"{database}-admin", "admin:*")
        with grpc.insecure_channel(server.target) as channel:
            secrets = tenant_admins(channel, default_admin, *tenants)
        yield server, secrets
    finally:
        server.stop()
        drop_database(admin_url, url)
