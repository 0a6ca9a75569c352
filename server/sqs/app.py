"""The shim's HTTP side: one aiohttp handler for both protocols, and the process around it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import uuid
from typing import Any

from aiohttp import web

from server.sqs import jsonproto, query, shapes
from server.sqs.actions import HANDLERS, Call
from server.sqs.backend import Backend
from server.sqs.errors import (
    INTERNAL_FAILURE,
    INVALID_ACTION,
    INVALID_ADDRESS,
    INVALID_HTTP_REQUEST,
    MISSING_ACTION,
    REQUEST_ENTITY_TOO_LARGE,
    SqsError,
)
from server.sqs.settings import ShimSettings
from server.sqs.sigv4 import Verifier

log = logging.getLogger("postbox.sqs")

_BACKEND = web.AppKey("backend", Backend)
_SETTINGS = web.AppKey("settings", ShimSettings)
_VERIFIER = web.AppKey("verifier", Verifier)


class _Json:
    """awsJson 1.0: the action in X-Amz-Target, parameters in a JSON body."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.action = ""

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        self.action = jsonproto.action_of(self.target)
        return jsonproto.decode(_input(self.action), body)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        return _response(200, jsonproto.encode_result(result), jsonproto.CONTENT_TYPE, request_id)

    def failure(self, error: SqsError, request_id: str) -> web.Response:
        body, headers = jsonproto.encode_error(error)
        return _response(error.kind.status, body, jsonproto.CONTENT_TYPE, request_id, headers)


class _Query:
    """The query protocol: Action and parameters in a form body (or the URL), XML back."""

    action = ""

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
        self.action = form.get("Action", "")
        if not self.action:
            raise SqsError(MISSING_ACTION, "The request must contain the parameter Action.")
        return query.decode(_input(self.action), form)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        output = shapes.ACTIONS[self.action][1]
        body = query.encode_result(self.action, output, result, request_id)
        return _response(200, body, query.CONTENT_TYPE, request_id)

    def failure(self, error: SqsError, request_id: str) -> web.Response:
        body = query.encode_error(error, request_id)
        return _response(error.kind.status, body, query.CONTENT_TYPE, request_id)


def _input(action: str) -> shapes.Structure:
    if action not in shapes.ACTIONS:
        raise SqsError(INVALID_ACTION, f"The action {action} is not valid for this endpoint.")
    return shapes.ACTIONS[action][0]


def _response(
    status: int,
    body: bytes,
    content_type: str,
    request_id: str,
    headers: dict[str, str] | None = None,
) -> web.Response:
    response = web.Response(status=status, body=body, headers=headers)
    response.content_type = content_type
    response.headers["x-amzn-RequestId"] = request_id
    return response


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused before it is read when it is larger than the limit."""
    too_large = SqsError(
        REQUEST_ENTITY_TOO_LARGE,
        f"The request body is larger than this endpoint accepts ({limit} bytes).",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        return await request.read()  # aiohttp stops reading at client_max_size
    except web.HTTPRequestEntityTooLarge:
        raise too_large from None


def _check_request(request: web.Request, json_protocol: bool) -> None:
    """Refuses what is no SQS call: SQS's paths, methods and content types only."""
    segments = request.path.strip("/").split("/")
    if segments != [""] and (len(segments) != 2 or not all(segments)):
        raise SqsError(
            INVALID_ADDRESS, f"The address {request.url} is not valid for this endpoint."
        )
    if request.method not in ("GET", "POST"):
        raise SqsError(
            INVALID_HTTP_REQUEST, f"The HTTP method {request.method} is not valid for SQS."
        )
    content_type = request.headers.get("Content-Type")
    if json_protocol:
        expected = jsonproto.CONTENT_TYPE
    elif content_type is None or request.content_length == 0:
        return  # parameters in the URL
    else:
        expected = query.FORM_CONTENT_TYPE
    if request.content_type != expected:
        raise SqsError(
            INVALID_HTTP_REQUEST,
            f"Content-Type {content_type!r} is not valid for this request; expected {expected}.",
        )


async def handle(request: web.Request) -> web.StreamResponse:
    request_id = str(uuid.uuid4())
    target = request.headers.get("X-Amz-Target")
    protocol: _Json | _Query = _Json(target) if target else _Query()
    settings = request.app[_SETTINGS]
    try:
        _check_request(request, isinstance(protocol, _Json))
        body = await _read_body(request, settings.max_request_size)
        verifier = request.app.get(_VERIFIER)
        if verifier is not None:
            verifier.verify(request.method, request.host, request.raw_path, request.headers, body)
        params = protocol.parse(request, body)
        handler = HANDLERS.get(protocol.action)
        if handler is None:
            raise SqsError(
                INVALID_ACTION, f"The action {protocol.action} is not valid for this endpoint."
            )
        call = Call(
            params=params,
            path=request.path,
            base_url=f"{request.scheme}://{request.host}",
            settings=settings,
            backend=request.app[_BACKEND],
        )
        result = await handler(call)
        return protocol.success(result, request_id)
    except SqsError as error:
        log.debug("%s %s: %s %s", request_id, protocol.action, error.kind.code, error.message)
        return protocol.failure(error, request_id)
    except Exception:
        log.exception("%s %s failed", request_id, protocol.action)
        failure = SqsError(
            INTERNAL_FAILURE, f"Internal failure; see the shim's log for request {request_id}."
        )
        return protocol.failure(failure, request_id)


def build_app(settings: ShimSettings, backend: Backend) -> web.Application:
    app = web.Application(client_max_size=settings.max_request_size)
    app[_SETTINGS] = settings
    app[_BACKEND] = backend
    if settings.credentials:
        app[_VERIFIER] = Verifier(settings.credentials)
    # POST is what SDKs send; old query clients also use GET with the parameters in the URL.
    # Every other path and method reaches the handler too, to be refused as SQS refuses
    # them (with a request id, in the protocol of the request).
    app.router.add_route("*", "/{path:.*}", handle)
    return app


async def serve(settings: ShimSettings, stop: asyncio.Event | None = None) -> None:
    """Serves until `stop` is set (or SIGINT/SIGTERM arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    if not settings.credentials:
        log.warning(
            "no credentials configured: accepting requests with any signature or none. "
            "Give --access-key/--secret-key or --credentials-file to verify SigV4."
        )
    backend = Backend(settings.grpc_target, settings.grpc_timeout)
    # handler_cancellation: a client that hangs up cancels its handler, and so the
    # long-poll gRPC stream it is waiting on.
    runner = web.AppRunner(build_app(settings, backend), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        log.info(
            "postbox sqs serving on http://%s:%d, calling postbox at %s",
            settings.host,
            settings.port,
            settings.grpc_target,
        )
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()
        await backend.close()
        log.info("stopped")
