"""The HTTP server: POST /<service>/<method> in the Connect protocol, GET /healthz and
GET /openapi.json, on aiohttp.

Unary methods take the Connect unary wire: the request message as the body, the
response message (HTTP 200) or a Connect error (its code's HTTP status) as the answer.
Server-streaming methods (Receive) take the Connect streaming wire, enveloped messages
with an end-of-stream envelope; called with a unary content type they answer once the
stream ends, with its responses merged into one (their repeated fields concatenated),
which is a long-poll Receive for curl. A bidirectional stream has no HTTP/1.1 form.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, cast

import grpc
from aiohttp import web

from postbox_server.errors import quoted
from postbox_server.http import connect, invoke
from postbox_server.http.connect import Codec, ConnectError
from postbox_server.http.context import HttpCallContext
from postbox_server.http.procedures import Procedure
from postbox_server.http.rest import routes as rest
from postbox_server.http.rest.framework import error_response
from postbox_server.observability import request_ids
from postbox_server.observability.probes import Ready, add_probes
from postbox_server.services.decoding import Undecodable
from postbox_server.sns_signing import CERTIFICATE_PATH, PEM_CONTENT_TYPE

# beyond-queue's route for the SNS signing certificate.
SNS_CERT_PATH = "/v1/cert"

_JSON_ADVICE = "send the request message in proto3 JSON (field names as in the protos)"
_PROTO_ADVICE = "send the request message in the protobuf binary format"
_CLIENT_DEADLINE = "its Connect-Timeout-Ms"
# What an HTTP caller of a bidirectional stream, which HTTP/1.1 cannot carry, calls instead.
_UNARY_INSTEAD = {
    "SendStream": "Send",
    "SendBatchStream": "SendBatch",
    "StreamingReceive": "Receive (long poll, or continuous mode with application/connect+json)",
}


def _error_response(
    error: ConnectError, *, status: int | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    """A Connect error; `status` overrides its code's when HTTP has a more precise one."""
    return web.Response(
        status=status or error.status,
        body=error.body(),
        content_type="application/json",
        headers=headers,
    )


class ConnectHandler:
    """Answers every procedure's path."""

    def __init__(self, procedures: dict[str, Procedure], max_request_size: int) -> None:
        self._procedures = procedures
        self._max_request_size = max_request_size

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        procedure = self._procedures.get(request.path)
        if procedure is None:
            return _error_response(
                ConnectError(
                    grpc.StatusCode.NOT_FOUND,
                    f"no procedure is at {quoted(request.path)}; procedures are at "
                    "/postbox.v1.<Service>/<Method> (GET /openapi.json lists them)",
                )
            )
        if request.method != "POST":
            return _error_response(
                connect.invalid(f"{quoted(request.method)} is not how procedures are called: POST"),
                status=405,
                headers={"Allow": "POST"},
            )
        if procedure.client_streaming:
            return _error_response(
                ConnectError(
                    grpc.StatusCode.UNIMPLEMENTED,
                    f"{procedure.method.name} streams both ways, which HTTP/1.1 cannot carry: "
                    f"call it over gRPC, or use {_UNARY_INSTEAD[procedure.method.name]}",
                )
            )
        content_type = request.content_type
        streaming = content_type in connect.STREAM_TYPES
        if content_type not in connect.UNARY_TYPES and not (
            streaming and procedure.server_streaming
        ):
            accepted = [*connect.UNARY_TYPES]
            if procedure.server_streaming:
                accepted += [*connect.STREAM_TYPES]
            return _error_response(
                connect.invalid(
                    f"Content-Type {quoted(content_type)} is not one this procedure takes: "
                    f"{', '.join(accepted)}"
                ),
                status=415,
                headers={"Accept-Post": ", ".join(accepted)},
            )
        types = connect.STREAM_TYPES if streaming else connect.UNARY_TYPES
        codec = Codec(types[content_type])
        try:
            timeout = connect.timeout_seconds(request.headers.get("Connect-Timeout-Ms"))
            body = await invoke.read_body(request, self._max_request_size)
        except ConnectError as error:
            return _error_response(error)
        loop = asyncio.get_running_loop()
        context = HttpCallContext(
            invoke.metadata(request), None if timeout is None else loop.time() + timeout
        )
        call = _decoded(codec, procedure, body, streaming)
        if streaming:
            return await self._stream(request, procedure, codec, call, context, timeout)
        try:
            response = await asyncio.wait_for(invoke.answer(procedure, call, context), timeout)
        except Exception as error:
            return _error_response(invoke.failure(context, error, _CLIENT_DEADLINE))
        finally:
            context.done()
        return web.Response(body=codec.encode(response), content_type=content_type)

    async def _stream(
        self,
        request: web.Request,
        procedure: Procedure,
        codec: Codec,
        call: Any,
        context: HttpCallContext,
        timeout: float | None,
    ) -> web.StreamResponse:
        answer = web.StreamResponse(status=200)
        answer.content_type = request.content_type
        await answer.prepare(request)
        grpc_context = cast(grpc.aio.ServicerContext, context)

        async def pump() -> None:
            # aclosing: a client gone mid-write ends the stream now, releasing what it claimed.
            replies = invoke.responses(procedure, call, grpc_context)
            async with contextlib.aclosing(replies) as stream:
                async for response in stream:
                    await answer.write(connect.envelope(0, codec.encode(response)))

        error = None
        try:
            await asyncio.wait_for(pump(), timeout)
        except ConnectionResetError:
            return answer  # the client left; the stream's cleanup has run
        except Exception as failure:
            error = invoke.failure(context, failure, _CLIENT_DEADLINE)
        finally:
            context.done()
        with contextlib.suppress(ConnectionResetError):
            await answer.write(connect.end_of_stream(error))
            await answer.write_eof()
        return answer


def _decoded(codec: Codec, procedure: Procedure, body: bytes, streaming: bool) -> Any:
    """The request message, or an Undecodable that the interceptors refuse after checking
    the caller's key (an anonymous caller learns nothing, not even how its body failed)."""
    advice = _JSON_ADVICE if codec.name == "json" else _PROTO_ADVICE
    try:
        if streaming:
            body = connect.single_envelope(body)
        return codec.decode(body, procedure.request_class)
    except ValueError as error:
        return Undecodable(str(error), advice)


def build_app(
    procedures: dict[str, Procedure],
    *,
    max_request_size: int,
    serving: Callable[[], bool],
    ready: Ready,
    openapi: bytes,
    sns_certificate: bytes | None = None,
) -> web.Application:
    """`openapi`: the OpenAPI document GET /openapi.json serves; `ready`: /readyz's check;
    `sns_certificate`: the PEM certificate of the SNS signing key, which GET /v1/cert and
    GET /SimpleNotificationService.pem serve (None: SNS envelopes go unsigned, and they
    answer 404 saying so)."""

    async def healthz(_: web.Request) -> web.Response:
        status = "SERVING" if serving() else "NOT_SERVING"
        return web.json_response({"status": status}, status=200 if serving() else 503)

    async def openapi_json(_: web.Request) -> web.Response:
        return web.Response(body=openapi, content_type="application/json")

    app = web.Application()
    request_ids.install(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/openapi.json", openapi_json)
    add_probes(app, ready)

    async def sns_cert(_: web.Request) -> web.Response:
        # Public, as SNS's certificate is: subscribers fetch it without credentials.
        if sns_certificate is None:
            return error_response(
                ConnectError(
                    grpc.StatusCode.NOT_FOUND,
                    "this server signs no SNS messages: start it with --sns-signing-key FILE",
                )
            )
        return web.Response(body=sns_certificate, content_type=PEM_CONTENT_TYPE)

    app.router.add_get(SNS_CERT_PATH, sns_cert)
    # Where SNS serves it too, as beyond-queue's server does.
    app.router.add_get(CERTIFICATE_PATH, sns_cert)
    rest.add_routes(app, procedures, max_body=max_request_size, deadline=None)
    # Every other path: a procedure's, or a Connect not_found naming where they are.
    app.router.add_route("*", "/{path:.*}", ConnectHandler(procedures, max_request_size))
    return app
