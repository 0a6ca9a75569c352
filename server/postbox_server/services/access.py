"""AccessService: API keys and their grants. The rules live in SQL; the secret is made here."""

from __future__ import annotations

import math
from typing import Any, cast

import grpc
from google.protobuf import json_format
from postbox.v1 import access_service_pb2 as pb
from postbox.v1 import access_service_pb2_grpc

from postbox_server.auth.keys import KeyCache
from postbox_server.auth.ratelimits import MAX_RATE
from postbox_server.auth.secrets import Credentials
from postbox_server.db.engine import Engine, Row
from postbox_server.errors import invalid, quoted
from postbox_server.services import convert
from postbox_server.services.pagination import decode_page_token, next_page, page_size_of
from postbox_server.services.status import reports_errors

_UPDATABLE = ("grants", "expire_time", "rate_limits")
_RATES = ("sends_per_second", "receives_per_second", "calls_per_second")
_BURSTS = ("send_burst", "receive_burst", "call_burst")


def rate_limits_json(key: pb.Key) -> str | None:
    """A key's rate limits as the engine stores them (JSON), None for none; checked here."""
    if not key.HasField("rate_limits"):
        return None
    limits = key.rate_limits
    for name in _RATES:
        value = getattr(limits, name)
        if not (math.isfinite(value) and 0 <= value <= MAX_RATE):
            raise invalid(
                f"rate_limits.{name} is {value!r}: give 0 (no limit) to {MAX_RATE:,} per second"
            )
    for name in _BURSTS:
        value = getattr(limits, name)
        if not 0 <= value <= MAX_RATE:
            raise invalid(
                f"rate_limits.{name} is {value}: give 0 (a second's worth) to {MAX_RATE:,}"
            )
    if not any(getattr(limits, name) for name in _RATES):
        return None
    return json_format.MessageToJson(limits, preserving_proto_field_name=True, indent=None)


def _permission_name(permission: int) -> str:
    """The engine's name of an API Permission ("" for unspecified or unknown numbers)."""
    if permission == pb.PERMISSION_UNSPECIFIED or permission not in pb.Permission.values():
        return ""
    return pb.Permission.Name(permission).removeprefix("PERMISSION_").lower()


def _permission(name: str) -> pb.Permission:
    """The API Permission of the engine's name; Value() gives the number, which the
    generated stub types as the enum."""
    return cast("pb.Permission", pb.Permission.Value(f"PERMISSION_{name.upper()}"))


def grant_arrays(grants: Any) -> tuple[list[str], list[str]]:
    """Grants as the engine's parallel arrays; an unknown permission is the engine's to refuse."""
    permissions = []
    for grant in grants:
        name = _permission_name(grant.permission)
        if not name:
            raise invalid(
                "each grant needs a permission: one of send, receive, publish, read, manage, admin"
            )
        permissions.append(name)
    return permissions, [grant.pattern for grant in grants]


def key_resource(row: Row) -> pb.Key:
    """A row of postbox.api_key as an API Key (never anything that verifies its secret)."""
    return pb.Key(
        name=row["name"],
        grants=[
            pb.Grant(permission=_permission(permission), pattern=p)
            for permission, p in zip(row["permissions"], row["patterns"], strict=True)
        ],
        expire_time=convert.timestamp(row["expires_at"]),
        create_time=convert.timestamp(row["created_at"]),
        update_time=convert.timestamp(row["updated_at"]),
        last_used_time=convert.timestamp(row["last_used_at"]),
        rate_limits=(
            json_format.Parse(row["rate_limits"], pb.RateLimits()) if row["rate_limits"] else None
        ),
    )


class AccessService(access_service_pb2_grpc.AccessServiceServicer):
    def __init__(self, engine: Engine, keys: KeyCache) -> None:
        self.engine = engine
        # Every change waits until this server's cache has it, so a client that
        # changed a key here can use the change at once; other replicas follow by
        # notification.
        self.keys = keys

    @reports_errors
    async def CreateKey(
        self, request: pb.CreateKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateKeyResponse:
        key = request.key
        permissions, patterns = grant_arrays(key.grants)
        credentials = Credentials.issue()
        row = await self.engine.create_key(
            key.name, credentials.secret_sha256, credentials.sigv4_secret, permissions, patterns,
            convert.optional_datetime(key, "expire_time"), rate_limits_json(key),
        )  # fmt: skip
        await self.keys.catch_up()
        return pb.CreateKeyResponse(
            key=key_resource(row),
            secret=credentials.secret,
            sigv4_secret_access_key=credentials.sigv4_secret,
        )

    @reports_errors
    async def GetKey(
        self, request: pb.GetKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetKeyResponse:
        return pb.GetKeyResponse(key=key_resource(await self.engine.get_key(request.name)))

    @reports_errors
    async def ListKeys(
        self, request: pb.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListKeysResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListKeys")
        rows, token = next_page(
            await self.engine.list_keys(page_size + 1, after), page_size, "ListKeys"
        )
        return pb.ListKeysResponse(keys=[key_resource(row) for row in rows], next_page_token=token)

    @reports_errors
    async def UpdateKey(
        self, request: pb.UpdateKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateKeyResponse:
        paths = list(request.update_mask.paths)
        unknown = [path for path in paths if path not in _UPDATABLE]
        if not paths or unknown:
            raise invalid(
                f"update_mask names the fields to change: any of {', '.join(_UPDATABLE)}"
                + (f" (not {quoted(', '.join(unknown))})" if unknown else "")
            )
        permissions = patterns = None
        if "grants" in paths:
            permissions, patterns = grant_arrays(request.key.grants)
        row = await self.engine.update_key(
            request.key.name, permissions, patterns, "expire_time" in paths,
            convert.optional_datetime(request.key, "expire_time"),
            "rate_limits" in paths, rate_limits_json(request.key),
        )  # fmt: skip
        await self.keys.catch_up()
        return pb.UpdateKeyResponse(key=key_resource(row))

    @reports_errors
    async def DeleteKey(
        self, request: pb.DeleteKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteKeyResponse:
        await self.engine.delete_key(request.name)
        await self.keys.catch_up()
        return pb.DeleteKeyResponse()
