"""AccessService: API keys and their grants, and tenants. The rules live in SQL; the
secret is made here. A tenant's admin sees and changes its own tenant's keys only."""

from __future__ import annotations

import logging
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
from postbox_server.errors import ApiError, invalid, quoted
from postbox_server.services import convert
from postbox_server.services.pagination import decode_page_token, next_page, page_size_of
from postbox_server.services.status import reports_errors
from postbox_server.tenant_names import CALLER_TENANT, DEFAULT_TENANT
from postbox_server.tenant_quotas import TenantQuotas

log = logging.getLogger(__name__)

_UPDATABLE = ("grants", "expire_time", "rate_limits")
_QUOTA_FIELDS = ("max_queues", "max_topics", "max_messages", "max_bytes")
_TENANT_UPDATABLE = (
    "account_id",
    "description",
    "quota",
    *(f"quota.{field}" for field in _QUOTA_FIELDS),
    "rate_limits",
)
_RATES = ("sends_per_second", "receives_per_second", "calls_per_second")
_BURSTS = ("send_burst", "receive_burst", "call_burst")


def rate_limits_json(holder: pb.Key | pb.Tenant) -> str | None:
    """A key's or a tenant's rate limits as the engine stores them (JSON), None for none;
    checked here."""
    if not holder.HasField("rate_limits"):
        return None
    limits = holder.rate_limits
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


def rate_limits_resource(row: Row) -> pb.RateLimits | None:
    """The stored rate limits (JSON) of a key's or a tenant's row as the API's message."""
    return json_format.Parse(row["rate_limits"], pb.RateLimits()) if row["rate_limits"] else None


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
        rate_limits=rate_limits_resource(row),
        tenant=row["tenant"] or DEFAULT_TENANT,
    )


def tenant_resource(row: Row) -> pb.Tenant:
    quota = {field: row[field] for field in _QUOTA_FIELDS if row[field] is not None}
    return pb.Tenant(
        name=row["name"],
        account_id=row["account_id"],
        description=row["description"],
        create_time=convert.timestamp(row["created_at"]),
        update_time=convert.timestamp(row["updated_at"]),
        quota=pb.TenantQuota(**quota) if quota else None,
        rate_limits=rate_limits_resource(row),
    )


def quota_fields(tenant: pb.Tenant, paths: list[str] | None = None) -> dict[str, int] | None:
    """The quota fields to store, as the engine takes them (it checks their ranges):
    on create, those set (None without a quota); on update, those the mask names
    ("quota": all four)."""
    if paths is None:
        fields = list(_QUOTA_FIELDS) if tenant.HasField("quota") else []
    elif "quota" in paths:
        fields = list(_QUOTA_FIELDS)
    else:
        fields = [path.removeprefix("quota.") for path in paths if path.startswith("quota.")]
    return {field: getattr(tenant.quota, field) for field in fields} or None


def usage_resource(quotas: TenantQuotas, tenant: str) -> pb.TenantUsage | None:
    """A tenant's usage as this server last counted it; None before its first count."""
    figures = quotas.of(tenant)
    if figures is None or figures.counted_at is None:
        return None
    return pb.TenantUsage(
        queues=figures.queues,
        topics=figures.topics,
        messages=figures.messages,
        bytes=figures.bytes,
        count_time=convert.timestamp(figures.counted_at),
    )


def _keys_in_reach() -> str | None:
    """The tenant whose keys the caller manages: a tenant's admin its own; an admin of
    the default tenant (or anyone, while auth is off) every tenant's (None)."""
    return CALLER_TENANT.get() or None


def _update_paths(mask: Any, updatable: tuple[str, ...]) -> list[str]:
    """The update mask's paths, INVALID_ARGUMENT unless each is one of `updatable`."""
    paths = list(mask.paths)
    unknown = [path for path in paths if path not in updatable]
    if not paths or unknown:
        raise invalid(
            f"update_mask names the fields to change: any of {', '.join(updatable)}"
            + (f" (not {quoted(', '.join(unknown))})" if unknown else "")
        )
    return paths


class AccessService(access_service_pb2_grpc.AccessServiceServicer):
    def __init__(self, engine: Engine, keys: KeyCache, quotas: TenantQuotas | None = None) -> None:
        self.engine = engine
        # Read again after a tenant or its quota changes, so that this server's next
        # send is checked against the new quota; other servers follow at their refresh.
        self.quotas = quotas or TenantQuotas(engine)
        # Every change waits until this server's cache has it, so a client that
        # changed a key here can use the change at once; other replicas follow by
        # notification.
        self.keys = keys

    async def _reload_quotas(self) -> None:
        """Reads the tenants' quotas (and their last count) again after a change that
        committed: should the database fail now, the change stands and the periodic
        refresh catches up."""
        try:
            await self.quotas.refresh()
        except ApiError as error:
            log.warning("tenant quotas not read again after a change: %s", error.message)

    @reports_errors
    async def CreateKey(
        self, request: pb.CreateKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateKeyResponse:
        key = request.key
        caller_tenant = CALLER_TENANT.get()
        if caller_tenant and key.tenant not in (DEFAULT_TENANT, caller_tenant):
            raise ApiError(
                grpc.StatusCode.PERMISSION_DENIED,
                f"tenant {quoted(key.tenant)}: only an admin key of the default tenant may "
                "create keys in another tenant; leave tenant empty for your own",
            )
        permissions, patterns = grant_arrays(key.grants)
        credentials = Credentials.issue()
        row = await self.engine.create_key(
            key.name, credentials.secret_sha256, credentials.sigv4_secret, permissions, patterns,
            convert.optional_datetime(key, "expire_time"), rate_limits_json(key),
            caller_tenant or key.tenant,
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
        row = await self.engine.get_key(request.name, _keys_in_reach())
        return pb.GetKeyResponse(key=key_resource(row))

    @reports_errors
    async def ListKeys(
        self, request: pb.ListKeysRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListKeysResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListKeys")
        rows, token = next_page(
            await self.engine.list_keys(page_size + 1, after, _keys_in_reach()),
            page_size,
            "ListKeys",
        )
        return pb.ListKeysResponse(keys=[key_resource(row) for row in rows], next_page_token=token)

    @reports_errors
    async def UpdateKey(
        self, request: pb.UpdateKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateKeyResponse:
        paths = _update_paths(request.update_mask, _UPDATABLE)
        permissions = patterns = None
        if "grants" in paths:
            permissions, patterns = grant_arrays(request.key.grants)
        row = await self.engine.update_key(
            request.key.name, permissions, patterns, "expire_time" in paths,
            convert.optional_datetime(request.key, "expire_time"),
            "rate_limits" in paths, rate_limits_json(request.key), _keys_in_reach(),
        )  # fmt: skip
        await self.keys.catch_up()
        return pb.UpdateKeyResponse(key=key_resource(row))

    @reports_errors
    async def DeleteKey(
        self, request: pb.DeleteKeyRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteKeyResponse:
        await self.engine.delete_key(request.name, _keys_in_reach())
        await self.keys.catch_up()
        return pb.DeleteKeyResponse()

    # Tenants: only an admin key of the default tenant reaches these (auth/rules.py).

    @reports_errors
    async def CreateTenant(
        self, request: pb.CreateTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTenantResponse:
        tenant = request.tenant
        row = await self.engine.create_tenant(
            tenant.name, tenant.account_id or None, tenant.description, quota_fields(tenant),
            rate_limits_json(tenant),
        )  # fmt: skip
        await self.keys.catch_up()
        await self._reload_quotas()
        return pb.CreateTenantResponse(tenant=tenant_resource(row))

    @reports_errors
    async def GetTenant(
        self, request: pb.GetTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTenantResponse:
        return pb.GetTenantResponse(
            tenant=tenant_resource(await self.engine.get_tenant(request.name)),
            usage=usage_resource(self.quotas, request.name),
        )

    @reports_errors
    async def ListTenants(
        self, request: pb.ListTenantsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTenantsResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListTenants")
        rows, token = next_page(
            await self.engine.list_tenants(page_size + 1, after), page_size, "ListTenants"
        )
        return pb.ListTenantsResponse(
            tenants=[tenant_resource(row) for row in rows], next_page_token=token
        )

    @reports_errors
    async def UpdateTenant(
        self, request: pb.UpdateTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateTenantResponse:
        paths = _update_paths(request.update_mask, _TENANT_UPDATABLE)
        tenant = request.tenant
        row = await self.engine.update_tenant(
            tenant.name,
            tenant.account_id if "account_id" in paths else None,
            tenant.description if "description" in paths else None,
            quota_fields(tenant, paths),
            "rate_limits" in paths,
            rate_limits_json(tenant),
        )
        await self.keys.catch_up()
        await self._reload_quotas()
        return pb.UpdateTenantResponse(tenant=tenant_resource(row))

    @reports_errors
    async def DeleteTenant(
        self, request: pb.DeleteTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTenantResponse:
        await self.engine.delete_tenant(request.name, request.force)
        await self.keys.catch_up()
        await self._reload_quotas()
        return pb.DeleteTenantResponse()

    @reports_errors
    async def GetCallerTenant(
        self, request: pb.GetCallerTenantRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetCallerTenantResponse:
        tenant = CALLER_TENANT.get()
        if tenant == DEFAULT_TENANT:
            return pb.GetCallerTenantResponse(tenant=pb.Tenant())
        return pb.GetCallerTenantResponse(
            tenant=tenant_resource(await self.engine.get_tenant(tenant))
        )
