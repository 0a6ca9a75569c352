"""gRPC server metrics as the grpc-ecosystem interceptors name them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from server.interceptors import WrapsEachMethod, relay
from server.observability.logs import CURRENT_RPC
from server.observability.metrics import GRPC_HANDLED, GRPC_SECONDS, GRPC_STARTED, OPEN_STREAMS


def _code_of(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return "CANCELLED" if isinstance(error, asyncio.CancelledError) else "UNKNOWN"
    code = context.code()
    if code is None:
        return "OK"
    return code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode(code).name


class CountCalls(WrapsEachMethod):
    """grpc_server_started_total, _handled_total and _handling_seconds for every method."""

    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        return _counted(handler, method)


def _counted(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    service, _, name = method.lstrip("/").partition("/")
    if handler.request_streaming and handler.response_streaming:
        kind = "bidi_stream"
    elif handler.response_streaming:
        kind = "server_stream"
    elif handler.request_streaming:
        kind = "client_stream"
    else:
        kind = "unary"
    labels = (kind, service, name)
    started = GRPC_STARTED.labels(*labels)
    seconds = GRPC_SECONDS.labels(*labels)
    streams = kind in ("bidi_stream", "server_stream")

    def begin() -> float:
        started.inc()
        if streams:
            OPEN_STREAMS.inc()
        return time.perf_counter()

    def end(begun: float, context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
        if streams:
            OPEN_STREAMS.dec()
        seconds.observe(time.perf_counter() - begun)
        GRPC_HANDLED.labels(*labels, _code_of(context, error)).inc()

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        begun, error = begin(), None
        CURRENT_RPC.set(method)
        try:
            return await handler.unary_unary(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(begun, context, error)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        begun, error = begin(), None
        CURRENT_RPC.set(method)
        try:
            if handler.request_streaming:
                responses = handler.stream_stream(request, context)
            else:
                responses = handler.unary_stream(request, context)
            if hasattr(responses, "__aiter__"):
                async for response in relay(responses):
                    yield response
            else:  # a coroutine that writes with context.write
                await responses
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(begun, context, error)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(
            stream, handler.request_deserializer, handler.response_serializer
        )
    if handler.request_streaming:

        async def client_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            begun, error = begin(), None
            try:
                return await handler.stream_unary(requests, context)
            except BaseException as exc:
                error = exc
                raise
            finally:
                end(begun, context, error)

        return grpc.stream_unary_rpc_method_handler(
            client_stream, handler.request_deserializer, handler.response_serializer
        )
    return grpc.unary_unary_rpc_method_handler(
        unary, handler.request_deserializer, handler.response_serializer
    )
