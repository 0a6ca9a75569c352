"""Requests that do not decode are the caller's error: INVALID_ARGUMENT, not UNKNOWN.

grpcio turns a request it cannot parse (corrupt wire format, invalid UTF-8 in a
string field) into UNKNOWN with a traceback in the server log, as if the server
were at fault. This interceptor gives every method a deserializer that hands
such a request over as a marker, which is refused with INVALID_ARGUMENT before
the servicer sees it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from postbox_server.errors import invalid
from postbox_server.interceptors import (
    AioMethodHandler,
    Context,
    Generates,
    Handler,
    WrapsEachMethod,
    relay,
    yields,
)

_PROTOBUF_ADVICE = "send a valid protobuf message (string fields must be UTF-8)"


class Undecodable:
    """Stands for a request that did not decode, in place of the message; the HTTP front
    door hands its undecodable JSON over as one too, so it is refused in the same place."""

    def __init__(self, reason: str, advice: str = _PROTOBUF_ADVICE) -> None:
        self.reason = reason
        self.advice = advice


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data) if deserializer else data
        except DecodeError as exc:
            return Undecodable(str(exc))

    return deserialize


def _refusal(request: Undecodable) -> str:
    return f"the request could not be decoded: {request.reason}; {request.advice}"


async def _refuse(request: Undecodable, context: Context) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _refusal(request))


def _guard_unary(
    behavior: Callable[[Any, Context], Awaitable[Any]],
) -> Callable[[Any, Context], Awaitable[Any]]:
    async def unary(request: Any, context: Context) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        return await behavior(request, context)

    return unary


def _guard_stream(behavior: Generates) -> Generates:
    async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        async for response in relay(behavior(request, context)):
            yield response

    return stream


def _guard_requests(behavior: Generates) -> Generates:
    """For request-streaming methods: an undecodable request ends the call as the method's
    own INVALID_ARGUMENT (it is raised where the method reads its requests)."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                raise invalid(_refusal(request))
            yield request

    async def stream(requests: AsyncIterator[Any], context: Context) -> AsyncGenerator[Any, None]:
        async for response in relay(behavior(checked(requests), context)):
            yield response

    return stream


class RejectUndecodable(WrapsEachMethod):
    """Answers undecodable requests with INVALID_ARGUMENT."""

    def wrap(self, handler: AioMethodHandler, method: str) -> Handler | None:
        deserialize = _tolerant(handler.request_deserializer)
        if handler.request_streaming:
            behavior = handler.stream_stream
            # No client-streaming methods exist; the bidi ones (StreamingReceive, reflection)
            # are async generators.
            if behavior is None or not yields(behavior):
                return None
            return grpc.stream_stream_rpc_method_handler(
                _guard_requests(behavior), deserialize, handler.response_serializer
            )
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary), deserialize, handler.response_serializer
            )
        streams = handler.unary_stream
        if streams is None:
            return None
        # A streaming method is an async generator, or a coroutine that calls context.write.
        guarded = _guard_stream(streams) if yields(streams) else _guard_unary(streams)
        return grpc.unary_stream_rpc_method_handler(
            guarded, deserialize, handler.response_serializer
        )
