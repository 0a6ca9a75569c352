"""Calling a procedure from an HTTP request, for every HTTP front door (Connect, REST):
the caller's headers as its metadata, the same intercepted handler gRPC runs, and what
the client is told when the call fails."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import Any, cast

import grpc
from aiohttp import web
from google.protobuf.message import Message

from postbox_server.errors import ApiError, crashed
from postbox_server.http.connect import ConnectError
from postbox_server.http.context import HttpCallContext
from postbox_server.http.procedures import Procedure

log = logging.getLogger(__name__)

# Headers of the HTTP exchange itself, which gRPC metadata would not hold either.
_NOT_METADATA = frozenset(
    ("content-type", "content-length", "content-encoding", "host", "connection",
     "transfer-encoding", "accept-encoding", "user-agent", "connect-timeout-ms")
)  # fmt: skip


def metadata(request: web.Request) -> list[tuple[str, str]]:
    """The request's headers as the call's gRPC metadata."""
    return [
        (name.lower(), value)
        for name, value in request.headers.items()
        if name.lower() not in _NOT_METADATA
    ]


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, refused before it is read when it says it is larger than the limit, and
    as soon as it grows past it when it does not say."""
    too_large = ConnectError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the request body is larger than this server accepts ({limit} bytes, "
        "--http-max-request-size)",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.content.iter_any():
        body += chunk
        if len(body) > limit:
            raise too_large
    return bytes(body)


def failure(
    context: HttpCallContext, error: BaseException, deadline: str = "its deadline"
) -> ConnectError:
    """What the client is told of a call that raised `error`; `deadline` names the
    deadline a timeout ran past."""
    if isinstance(error, grpc.aio.AbortError):
        code = context.code() or grpc.StatusCode.UNKNOWN
        return ConnectError(code, context.details() or "")
    if isinstance(error, ApiError):
        return ConnectError(error.code, error.message)
    if isinstance(error, asyncio.TimeoutError) and context.time_remaining() == 0:
        return ConnectError(grpc.StatusCode.DEADLINE_EXCEEDED, f"the call ran past {deadline}")
    # As a servicer's crash is answered over gRPC: UNKNOWN, the cause in the server's log.
    crash = crashed(error)
    return ConnectError(crash.code, crash.message)


async def responses(
    procedure: Procedure, call: Any, context: grpc.aio.ServicerContext
) -> AsyncGenerator[Message, None]:
    """A server-streaming procedure's responses. An async generator: the outermost
    interceptor (the call counter) makes every streaming handler one."""
    async for response in cast(Any, procedure.handler.unary_stream)(call, context):
        yield response


async def answer(procedure: Procedure, call: Any, context: HttpCallContext) -> Message:
    """A unary procedure's response, or a server-streaming one's responses merged into
    one (their repeated fields concatenated)."""
    grpc_context = cast(grpc.aio.ServicerContext, context)
    if not procedure.server_streaming:
        # types-grpcio types handlers for the sync server; grpc.aio's are coroutines.
        return await cast(Any, procedure.handler.unary_unary)(call, grpc_context)
    merged = procedure.response_class()
    async with contextlib.aclosing(responses(procedure, call, grpc_context)) as stream:
        async for response in stream:
            merged.MergeFrom(response)
    return merged
