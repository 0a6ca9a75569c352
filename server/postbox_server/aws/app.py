"""The shim's HTTP side: one aiohttp handler for SQS and SNS, and the process around it.

A request's way: `handle` reads it (`_check_request`, `_read_body`), picks the protocol
that speaks it (SQS's JSON or query protocol, aws/sqs/protocol.py, or SNS's,
aws/sns/protocol.py), decides how its calls authenticate to the server (`_caller`), and
runs the action's handler (aws/sqs/actions/, aws/sns/actions/), which calls postbox's
gRPC API through `backend`. The protocol writes the result or the error back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
import uuid
from collections.abc import Mapping
from typing import Any

import grpc
from aiohttp import web
from postbox.v1.access_service_pb2 import GetCallerTenantRequest
from postbox.v1.queue_service_pb2 import ListQueuesRequest

from postbox_server.auth.client import bearer_metadata
from postbox_server.auth.interceptor import SIGV4_REQUIRED_METADATA
from postbox_server.aws import query
from postbox_server.aws.accounts import CallerAccounts
from postbox_server.aws.backend import CALLER, Backend
from postbox_server.aws.call import Call
from postbox_server.aws.errors import (
    INTERNAL_FAILURE,
    INVALID_ACTION,
    INVALID_ADDRESS,
    INVALID_HTTP_REQUEST,
    REQUEST_ENTITY_TOO_LARGE,
    AwsError,
)
from postbox_server.aws.protocol import ServiceProtocol
from postbox_server.aws.settings import ShimSettings
from postbox_server.aws.sigv4 import Verifier, credential_region, is_region, signed_request
from postbox_server.aws.sns.protocol import SnsJson, SnsQuery, is_sns, is_sns_json
from postbox_server.aws.sqs.protocol import SqsJson, SqsQuery
from postbox_server.config import is_loopback
from postbox_server.errors import quoted
from postbox_server.http_site import http_site
from postbox_server.observability import metrics, request_ids, tracing
from postbox_server.sns_signing import CERTIFICATE_PATH, PEM_CONTENT_TYPE

log = logging.getLogger("postbox.sqs")

_BACKEND = web.AppKey("backend", Backend)
_SETTINGS = web.AppKey("settings", ShimSettings)
_VERIFIER = web.AppKey("verifier", Verifier)
_ACCOUNTS = web.AppKey("accounts", CallerAccounts)

# The access key of requests whose calls carry the shim's own key.
_SHIMS_OWN_KEY = ""


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused before it is read when it is larger than the limit."""
    too_large = AwsError(
        REQUEST_ENTITY_TOO_LARGE,
        f"The request body is larger than this endpoint accepts ({limit} bytes).",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        return await request.read()  # aiohttp stops reading at client_max_size
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None


def _check_request(request: web.Request, content_type_required: str | None) -> None:
    """Refuses what is no SQS call: SQS's paths, methods and content types only."""
    segments = request.path.strip("/").split("/")
    if segments != [""] and (len(segments) != 2 or not all(segments)):
        raise AwsError(
            INVALID_ADDRESS, f"The address {request.url} is not valid for this endpoint."
        )
    if request.method not in ("GET", "POST"):
        raise AwsError(
            INVALID_HTTP_REQUEST, f"The HTTP method {request.method} is not valid for SQS."
        )
    content_type = request.headers.get("Content-Type")
    if content_type_required is not None:
        expected = content_type_required
    elif content_type is None or request.content_length == 0:
        return  # parameters in the URL
    else:
        expected = query.FORM_CONTENT_TYPE
    if request.content_type != expected:
        raise AwsError(
            INVALID_HTTP_REQUEST,
            f"Content-Type {quoted(content_type or '')} is not valid for this request; "
            f"expected {expected}.",
        )


def _caller(
    request: web.Request, body: bytes, verifier: Verifier | None, settings: ShimSettings
) -> tuple[tuple[tuple[str, str], ...], str]:
    """How this request's calls authenticate to the server, and the access key they
    authenticate as (_SHIMS_OWN_KEY for the shim's own).

    A static credential's signature is checked here, and the calls carry the shim's own
    key. Any other signature goes to the server, which checks it with the API key named
    by the access key id (and, while no key exists, lets an open shim's calls through).
    """
    try:
        signed = signed_request(
            request.method, request.host, request.raw_path, request.headers, body
        )
    except AwsError:
        if verifier is not None:
            raise
        # An open shim takes any signature or none.
        return bearer_metadata(settings.api_key), _SHIMS_OWN_KEY
    if verifier is not None and signed.access_key in verifier.secrets:
        verifier.verify(signed)
        return bearer_metadata(settings.api_key), _SHIMS_OWN_KEY
    if verifier is not None:
        # Not a static credential: only a key can vouch for it, even while none exists.
        return (
            (*signed.forwarded_metadata(), (SIGV4_REQUIRED_METADATA, "1")),
            signed.access_key,
        )
    return signed.forwarded_metadata(), signed.access_key


def _region(request: web.Request, params: Mapping[str, Any]) -> str | None:
    """The region a request is answered in: the one it is signed for. An unsigned
    request (an endpoint visiting its SubscribeURL or UnsubscribeURL) is in the region of
    the topic or subscription ARN it names, as AWS's such URLs are in their host's
    region; else None, the shim's own."""
    authorization = request.headers.get("Authorization")
    if authorization is not None:
        return credential_region(authorization)
    for name in ("TopicArn", "SubscriptionArn"):
        parts = str(params.get(name) or "").split(":")
        if len(parts) >= 6 and parts[0] == "arn" and is_region(parts[3]):
            return parts[3]
    return None


async def handle(request: web.Request) -> web.StreamResponse:
    started = time.perf_counter()
    response, outcome, protocol = await _respond(request)
    # Callers name the action: only the ones that exist become label values.
    action = protocol.action if protocol.action in protocol.handlers else "unknown"
    metrics.SQS_REQUESTS.labels(action, outcome).inc()
    metrics.SQS_SECONDS.labels(action).observe(time.perf_counter() - started)
    return response


async def _respond(request: web.Request) -> tuple[web.StreamResponse, str, ServiceProtocol]:
    """The response to a request, its outcome (OK or the error code) and its protocol."""
    # The caller's x-request-id (request_ids.install), else a new one: AWS's RequestId too.
    request_id = request_ids.current() or str(uuid.uuid4())
    call = None
    target = request.headers.get("X-Amz-Target")
    # JSON names its service in X-Amz-Target; a query-protocol request is SNS's when
    # is_sns says so.
    protocol: ServiceProtocol
    if is_sns_json(target):
        protocol = SnsJson(target or "")
    else:
        protocol = SqsJson(target) if target else SqsQuery()
    settings = request.app[_SETTINGS]
    try:
        _check_request(request, protocol.request_content_type)
        body = await _read_body(request, settings.max_request_size)
        if not target and is_sns(request, body):
            protocol = SnsQuery()
        if protocol.vouched(request):
            caller, access_key = bearer_metadata(settings.api_key), _SHIMS_OWN_KEY
        else:
            caller, access_key = _caller(request, body, request.app.get(_VERIFIER), settings)
        CALLER.set(caller)
        # The server's calls for this request log and echo the same id.
        CALLER.set((*CALLER.get(), (request_ids.HEADER, request_id)))
        params = protocol.parse(request, body)
        handler = protocol.handlers.get(protocol.action)
        if handler is None:
            raise AwsError(
                INVALID_ACTION, f"The action {protocol.action} is not valid for this endpoint."
            )
        backend = request.app[_BACKEND].speaking(protocol.status_errors)
        call = protocol.call_type(
            params=params,
            path=request.path,
            base_url=f"{request.scheme}://{request.host}",
            # With the caller's account id (its tenant's) and region (aws/accounts.py).
            settings=await request.app[_ACCOUNTS].settings_for(
                access_key, _region(request, params), backend
            ),
            backend=backend,
        )
        result = await handler(call)
        return protocol.success(result, request_id), "OK", protocol
    except AwsError as error:
        if call is not None:
            error = await protocol.explain(call, error)
            if error.other_account:
                error = await _authenticated(call, error)
        log.debug("%s %s: %s %s", request_id, protocol.action, error.kind.code, error.message)
        return protocol.failure(error, request_id), error.kind.code, protocol
    except Exception:
        log.exception("%s %s failed", request_id, protocol.action)
        failure = AwsError(
            INTERNAL_FAILURE, f"Internal failure; see the shim's log for request {request_id}."
        )
        return protocol.failure(failure, request_id), failure.kind.code, protocol


async def _authenticated(call: Call, error: AwsError) -> AwsError:
    """The refusal of another account's URL or ARN, once the server has authenticated the
    caller; else the server's refusal of the caller. The shim knew the caller's account
    from an earlier request of its access key, and must not tell someone who has only
    the key's name whether an account id is that key's."""
    try:
        await call.backend.call(call.backend.access.GetCallerTenant, GetCallerTenantRequest())
    except AwsError as refused:
        return refused
    return error


def build_app(settings: ShimSettings, backend: Backend) -> web.Application:
    app = web.Application(client_max_size=settings.max_request_size)
    app[_SETTINGS] = settings
    app[_BACKEND] = backend
    app[_ACCOUNTS] = CallerAccounts(settings)
    request_ids.install(app)
    if settings.credentials:
        app[_VERIFIER] = Verifier(settings.credentials)
    if settings.sns_signing_key is not None:
        certificate = settings.sns_signing_key.certificate_pem

        async def sns_certificate(_: web.Request) -> web.Response:
            # Public, as SNS's is: subscribers fetch it to verify, without credentials.
            return web.Response(body=certificate, content_type=PEM_CONTENT_TYPE)

        app.router.add_get(CERTIFICATE_PATH, sns_certificate)
    # POST is what SDKs send; old query clients also use GET with the parameters in the URL.
    # Every other path and method reaches the handler too, to be refused as SQS refuses
    # them (with a request id, in the protocol of the request).
    app.router.add_route("*", "/{path:.*}", handle)
    return app


class AnonymousExposure(Exception):
    """Serving the SQS API beyond loopback with no credentials and no API key."""


async def refuse_anonymous_exposure(settings: ShimSettings, backend: Backend) -> None:
    """The server's rule for the shim: with no key and no static credential, loopback only.

    Whether keys exist is what an anonymous call to the server answers.
    """
    if settings.insecure_allow_anonymous or is_loopback(settings.host):
        return
    try:
        await backend.queues.ListQueues(ListQueuesRequest(page_size=1), timeout=10)
    except grpc.aio.AioRpcError as error:
        if error.code() == grpc.StatusCode.UNAUTHENTICATED:
            return  # keys exist: the server checks every request's signature
        reason = (
            f"the server at {settings.grpc_target} did not say whether keys exist "
            f"({error.code().name})"
        )
    else:
        reason = "the server has no API key"
    raise AnonymousExposure(
        f"refusing to serve {settings.host!r} without authentication: {reason}, and no "
        "--access-key/--credentials-file is given, so anyone who reaches this address could "
        "read, purge or delete every queue. Either create an API key on the server "
        "(postbox keys create NAME --grant 'admin:*' --database-url URL), give static "
        "credentials, or pass --insecure-allow-anonymous to serve anonymously on purpose."
    )


async def serve(settings: ShimSettings, stop: asyncio.Event | None = None) -> None:
    """Serves until `stop` is set (or SIGINT/SIGTERM arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    tracing.configure("postbox-sqs")
    backend = Backend(settings.grpc_target, settings.grpc_timeout, settings.grpc_tls)
    if not settings.credentials:
        try:
            await refuse_anonymous_exposure(settings, backend)
        except AnonymousExposure:
            await backend.close()
            raise
        log.warning(
            "no static credentials: accepting requests with any signature or none while the "
            "server has no API key; once one exists, the server checks every signature"
        )
    ssl_context = None if settings.tls is None else settings.tls.ssl_context()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if settings.metrics_port is not None:
                await stack.enter_async_context(
                    metrics.serve_metrics(
                        settings.metrics_host,
                        settings.metrics_port,
                        lambda: metrics.exposition(None, 0),
                    )
                )
            # handler_cancellation: a client that hangs up cancels its handler, and so the
            # long-poll gRPC stream it is waiting on.
            await stack.enter_async_context(
                http_site(
                    build_app(settings, backend),
                    settings.host,
                    settings.port,
                    ssl_context=ssl_context,
                    handler_cancellation=True,
                )
            )
            log.info(
                "postbox sqs serving on %s://%s:%d, calling postbox at %s",
                "http" if ssl_context is None else "https",
                settings.host,
                settings.port,
                settings.grpc_target,
            )
            await stop.wait()
            log.info("shutting down")
    finally:
        await backend.close()
        tracing.shutdown()
        log.info("stopped")
