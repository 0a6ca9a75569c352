"""Checks every call's API key and grant before the servicer sees it.

Authentication comes first (UNAUTHENTICATED), before the request is even decoded;
then the rule of the method (rules.py) names the permission and the request field
holding the resource (PERMISSION_DENIED). Lists the key may call come back filtered
to what it may read. With no key in the database, every call passes.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

import grpc

from postbox_server.auth import sigv4
from postbox_server.auth.keys import CALLER, ApiKey, KeyCache
from postbox_server.auth.ratelimits import Throttled
from postbox_server.auth.rules import (
    ANY_RESOURCE,
    OPEN_SERVICES,
    RULES,
    Rule,
    parts_of,
    resource_of,
    targets_of,
)
from postbox_server.auth.tenancy import qualify_request, unqualify_response
from postbox_server.errors import ApiError, Refused, quoted
from postbox_server.interceptors import (
    AioMethodHandler,
    Context,
    Handler,
    WrapsEachMethod,
    relay,
    yields,
)
from postbox_server.observability import request_ids
from postbox_server.tenant_names import CALLER_TENANT, DEFAULT_TENANT, belongs, qualified

# Trailing metadata of an UNAUTHENTICATED call saying why (missing, unknown-key, expired,
# signature), so the SQS shim can answer with the error AWS would.
FAILURE_METADATA = "postbox-auth-failure"
# Sent by the SQS shim with a forwarded signature it cannot check itself: verify it even
# while no key exists (then it is unknown), rather than let the call through.
SIGV4_REQUIRED_METADATA = "postbox-sigv4-required"
_BEARER = "bearer "
_MISSING = (
    "this server requires an API key: send the metadata `authorization: Bearer <secret>` "
    "(postbox CLI: --api-key or POSTBOX_API_KEY)"
)
_UNKNOWN = (
    "the API key is not known: it was mistyped or has been revoked; an admin can create "
    "one with `postbox keys create`"
)


def _metadata_value(metadata: Iterable[tuple[str, Any]] | None, name: str) -> str | None:
    for key, value in metadata or ():
        if key == name:
            return value if isinstance(value, str) else None
    return None


class AuthFailure(ApiError):
    """UNAUTHENTICATED, with the reason the trailing metadata carries."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, message)
        self.reason = reason


def _by_signature(keys: KeyCache, header: str) -> ApiKey:
    """The key whose SigV4 secret signed a request the SQS shim forwarded."""
    try:
        name, string_to_sign, signature = sigv4.parse(header)
    except sigv4.SignatureProblem as problem:
        raise AuthFailure("signature", str(problem)) from None
    key = keys.by_name(name)
    if key is None:
        raise AuthFailure("unknown-key", f"no API key is named {quoted(name)}")
    try:
        sigv4.verify(key.sigv4_secret, string_to_sign, signature)
    except sigv4.SignatureProblem as problem:
        raise AuthFailure("signature", f"{problem} for API key {key.name!r}") from None
    return key


def authenticate(keys: KeyCache, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey:
    """The key a call's metadata presents, or AuthFailure saying why not."""
    header = _metadata_value(metadata, "authorization")
    if not header:
        raise AuthFailure("missing", _MISSING)
    if header.startswith(sigv4.SCHEME + " "):
        key = _by_signature(keys, header)
    elif header[: len(_BEARER)].lower() == _BEARER:
        found = keys.by_secret(header[len(_BEARER) :].strip())
        if found is None:
            raise AuthFailure("unknown-key", _UNKNOWN)
        key = found
    else:
        raise AuthFailure("missing", "the authorization metadata must read `Bearer <secret>`")
    if key.expired():
        raise AuthFailure(
            "expired",
            f"API key {key.name!r} has expired; an admin can extend it (postbox keys, "
            "AccessService.UpdateKey) or create a new one",
        )
    return key


async def refuse(context: Context, error: ApiError) -> None:
    if isinstance(error, Throttled):
        # An HTTP door answers 429 with Retry-After (request_ids.install).
        request_ids.note_retry_after(error.retry_after)
        await context.abort(
            error.code,
            error.message,
            trailing_metadata=(*error.trailing_metadata(), *request_ids.trailing()),
        )
    if isinstance(error, AuthFailure):
        context.set_trailing_metadata(((FAILURE_METADATA, error.reason), *request_ids.trailing()))
    await context.abort(error.code, error.message)


def denied(key: ApiKey, permission: str, resource: str) -> ApiError:
    what = "any resource" if resource == ANY_RESOURCE else f"resource {quoted(resource)}"
    return ApiError(
        grpc.StatusCode.PERMISSION_DENIED,
        f"API key {key.name!r} lacks permission {permission!r} on {what}; "
        f"grant it {permission}:<pattern matching the name>",
    )


def authorize(key: ApiKey, rule: Rule, request: Any) -> None:
    """Raises PERMISSION_DENIED unless the key may make this call (the request's names
    qualified with the key's tenant already)."""
    if rule.any_key:
        return
    if rule.listed is not None and rule.field is None:
        if not key.holds(rule.permission):
            raise denied(key, rule.permission, ANY_RESOURCE)
        return
    resource = resource_of(request, rule)
    if resource == ANY_RESOURCE and rule.within_tenant:
        # Every name of the key's own tenant (its grant "*" covers that, and no more).
        resource = qualified(key.tenant, ANY_RESOURCE)
    if not any(key.allows(permission, resource) for permission in rule.permissions):
        raise denied(key, rule.permission, resource)
    # The queue or topic the call would write into, besides the one it names.
    for permission, target in targets_of(request, rule):
        if not key.allows(permission, target):
            raise denied(key, permission, target)


def filter_listed(key: ApiKey | None, rule: Rule, listed: str, response: Any) -> Any:
    """A List response without the resources the caller may not read (its field `listed`):
    those of other tenants, and those the key's grants do not cover."""
    tenant = key.tenant if key is not None else DEFAULT_TENANT
    items = getattr(response, listed)
    kept = [
        item
        for item in items
        if belongs(tenant, name := item if isinstance(item, str) else item.name)
        and (key is None or key.allows(rule.permission, name))
    ]
    if len(kept) != len(items):
        del items[:]
        items.extend(kept)
    return response


class Authorize(WrapsEachMethod):
    """Checks the caller's key on every method; health and reflection pass untouched."""

    def __init__(self, keys: KeyCache, rules: dict[str, Rule] = RULES) -> None:
        super().__init__()
        self._keys = keys
        self._rules = rules

    def wrap(self, handler: AioMethodHandler, method: str) -> Handler | None:
        if method.lstrip("/").split("/")[0] in OPEN_SERVICES:
            return None
        return self._wrap(handler, self._rules.get(method), method)

    def _check(self, context: Context, rule: Rule | None) -> ApiKey | None:
        """The calling key (None while auth is off); raises ApiError for a refused call."""
        metadata = context.invocation_metadata()
        if not self._keys.enabled and not _metadata_value(metadata, SIGV4_REQUIRED_METADATA):
            return None
        key = authenticate(self._keys, metadata)
        self._keys.note_use(key)
        if rule is None:
            raise ApiError(
                grpc.StatusCode.PERMISSION_DENIED,
                "this method has no authorisation rule, so no key may call it",
            )
        return key

    def _wrap(self, handler: AioMethodHandler, rule: Rule | None, method: str) -> Handler:
        check = self._check
        limiter = self._keys.limiter

        def admits(request: Any) -> bool:
            # An undecodable request is the decoder's to refuse (INVALID_ARGUMENT).
            return hasattr(request, "DESCRIPTOR")

        def enter(key: ApiKey | None, request: Any) -> str:
            """The caller's tenant, with the request's names qualified by it."""
            CALLER.set(key)
            tenant = key.tenant if key is not None else DEFAULT_TENANT
            CALLER_TENANT.set(tenant)
            if admits(request):
                qualify_request(request, tenant)
            return tenant

        async def admit(request: Any, context: Context) -> tuple[ApiKey | None, str]:
            """The calling key (None while auth is off) and its tenant; ends the call if it
            is refused."""
            tenant = DEFAULT_TENANT
            try:
                key = check(context, rule)
                tenant = enter(key, request)
                # A key comes back only for a method with a rule.
                if key is not None and rule is not None and admits(request):
                    authorize(key, rule, request)
                    # Only an authorised call counts against the key's (and its tenant's)
                    # limits.
                    limiter.check_call(key.limited, method, request)
            except ApiError as error:
                await refuse(context, error)
            return key, tenant

        async def unary(request: Any, context: Context) -> Any:
            key, tenant = await admit(request, context)
            assert handler.unary_unary is not None  # the handler of a unary method
            response = await handler.unary_unary(request, context)
            if rule is not None and rule.listed is not None:
                response = filter_listed(key, rule, rule.listed, response)
            return unqualify_response(response, tenant)

        async def server_stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            _key, tenant = await admit(request, context)
            assert handler.unary_stream is not None
            assert yields(handler.unary_stream)
            async for response in relay(handler.unary_stream(request, context)):
                yield unqualify_response(response, tenant)

        async def server_stream_writes(request: Any, context: Context) -> None:
            await admit(request, context)
            assert handler.unary_stream is not None
            assert not yields(handler.unary_stream)
            await handler.unary_stream(request, context)

        async def bidi_stream(
            requests: AsyncIterator[Any], context: Context
        ) -> AsyncGenerator[Any, None]:
            try:
                key = check(context, rule)
                CALLER.set(key)
                if key is not None:
                    limiter.check(key.limited, "call", 1)
            except ApiError as error:
                await refuse(context, error)
            tenant = key.tenant if key is not None else DEFAULT_TENANT
            CALLER_TENANT.set(tenant)

            async def checked() -> AsyncIterator[Any]:
                async for carried in requests:
                    parts, too_many = parts_of(carried, rule)
                    for request in parts:
                        if too_many is not None:
                            yield Refused(request, too_many)
                            continue
                        if key is not None:
                            # Over its key's or tenant's limit, the stream waits rather
                            # than ends.
                            await limiter.pace(key.limited, method, request)
                        if admits(request):
                            try:
                                qualify_request(request, tenant)
                            except ApiError as error:
                                if rule is None or not rule.per_request:
                                    raise
                                yield Refused(request, error)
                                continue
                        # Requests after the first may leave the queue empty: it stays the
                        # first's.
                        if (
                            key is not None
                            and rule is not None
                            and admits(request)
                            and resource_of(request, rule)
                        ):
                            try:
                                authorize(key, rule, request)
                            except ApiError as error:
                                if not rule.per_request:
                                    raise
                                yield Refused(request, error)
                                continue
                        yield request

            assert handler.stream_stream is not None
            assert yields(handler.stream_stream)
            async for response in relay(handler.stream_stream(checked(), context)):
                yield unqualify_response(response, tenant)

        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                bidi_stream, handler.request_deserializer, handler.response_serializer
            )
        if handler.response_streaming:
            # A streaming method is an async generator, or a coroutine that calls context.write.
            writes = handler.unary_stream is not None and not yields(handler.unary_stream)
            return grpc.unary_stream_rpc_method_handler(
                server_stream_writes if writes else server_stream,
                handler.request_deserializer,
                handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
