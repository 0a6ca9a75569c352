"""Requests that do not decode are the caller's error: INVALID_ARGUMENT, not UNKNOWN.

grpcio turns a request it cannot parse (corrupt wire format, invalid UTF-8 in a
string field) into UNKNOWN with a traceback in the server log, as if the server
were at fault. This interceptor gives every method a deserializer that hands
such a request over as a marker, which is refused with INVALID_ARGUMENT before
the servicer sees it.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from server.errors import invalid
from server.interceptors import WrapsEachMethod, relay

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


async def _refuse(request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _refusal(request))


def _guard_unary(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        return await behavior(request, context)

    return unary


def _guard_stream(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await _refuse(request, context)
        async for response in relay(behavior(request, context)):
            yield response

    return stream


def _guard_requests(
    behavior: Callable[..., AsyncIterator[Any]],
) -> Callable[..., AsyncIterator[Any]]:
    """For request-streaming methods: an undecodable request ends the call as the method's
    own INVALID_ARGUMENT (it is raised where the method reads its requests)."""

    async def checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                raise invalid(_refusal(request))
            yield request

    async def stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
        async for response in relay(behavior(checked(requests), context)):
            yield response

    return stream


class RejectUndecodable(WrapsEachMethod):
    """Answers undecodable requests with INVALID_ARGUMENT."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        deserialize = _tolerant(handler.request_deserializer)
        if handler.request_streaming:
            if handler.stream_stream is None:  # no client-streaming methods exist
                return handler
            return grpc.stream_stream_rpc_method_handler(
                _guard_requests(handler.stream_stream), deserialize, handler.response_serializer
            )
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary), deserialize, handler.response_serializer
            )
        behavior = handler.unary_stream
        # A streaming method is an async generator, or a coroutine that calls context.write.
        guard = _guard_stream if inspect.isasyncgenfunction(behavior) else _guard_unary
        return grpc.unary_stream_rpc_method_handler(
            guard(behavior), deserialize, handler.response_serializer
        )
