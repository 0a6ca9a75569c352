"""gRPC server metrics as the grpc-ecosystem interceptors name them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from postbox_server.interceptors import AioMethodHandler, Context, Handler, WrapsEachMethod, relay
from postbox_server.observability import request_ids
from postbox_server.observability.logs import CURRENT_RPC
from postbox_server.observability.metrics import (
    GRPC_HANDLED,
    GRPC_SECONDS,
    GRPC_STARTED,
    OPEN_STREAMS,
)


def _code_of(context: Context, error: BaseException | None) -> str:
    if error is not None and not isinstance(error, grpc.aio.AbortError):
        return "CANCELLED" if isinstance(error, asyncio.CancelledError) else "UNKNOWN"
    code = context.code()
    if code is None:
        return "OK"
    return code.name if isinstance(code, grpc.StatusCode) else grpc.StatusCode(code).name


class CountCalls(WrapsEachMethod):
    """grpc_server_started_total, _handled_total and _handling_seconds for every method."""

    def wrap(self, handler: AioMethodHandler, method: str) -> Handler:
        return _counted(handler, method)


def _counted(handler: AioMethodHandler, method: str) -> Handler:
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

    def end(begun: float, context: Context, error: BaseException | None) -> None:
        if streams:
            OPEN_STREAMS.dec()
        seconds.observe(time.perf_counter() - begun)
        GRPC_HANDLED.labels(*labels, _code_of(context, error)).inc()

    async def unary(request: Any, context: Context) -> Any:
        begun, error = begin(), None
        CURRENT_RPC.set(method)
        request_ids.begin_call(context)
        try:
            assert handler.unary_unary is not None  # the handler of a unary method
            return await handler.unary_unary(request, context)
        except BaseException as exc:
            error = exc
            raise
        finally:
            end(begun, context, error)

    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        begun, error = begin(), None
        CURRENT_RPC.set(method)
        request_ids.begin_call(context)
        try:
            behaviour = handler.stream_stream if handler.request_streaming else handler.unary_stream
            assert behaviour is not None  # the handler of a response-streaming method
            responses = behaviour(request, context)
            if isinstance(responses, AsyncGenerator):
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

        async def client_stream(requests: Any, context: Context) -> Any:
            begun, error = begin(), None
            CURRENT_RPC.set(method)
            request_ids.begin_call(context)
            try:
                assert handler.stream_unary is not None  # the handler of a client stream
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
