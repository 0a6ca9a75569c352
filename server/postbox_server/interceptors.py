"""What every server interceptor shares: wrap a method's handler once; relay its stream."""

from __future__ import annotations

import abc
import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, cast

import grpc

if TYPE_CHECKING:
    from typing_extensions import TypeIs

# The interceptors wrap every method, whatever its messages.
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]
# A response-streaming behaviour is an async generator function, or a coroutine function
# that writes its responses with context.write. The first argument is the request, or
# for request-streaming methods an async iterator of requests.
Generates: TypeAlias = Callable[[Any, Context], AsyncGenerator[Any, None]]
Writes: TypeAlias = Callable[[Any, Context], Awaitable[None]]
Streams: TypeAlias = Generates | Writes
# Quoted: grpcio's RpcMethodHandler is generic only in types-grpcio.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class AioMethodHandler(Protocol):
    """A method's handler as grpc.aio fills it in.

    types-grpcio types grpc.RpcMethodHandler for the sync server (behaviours return plain
    values or Iterators and take a grpc.ServicerContext); under grpc.aio they are
    coroutine or async generator functions taking a grpc.aio.ServicerContext, and
    request streams are async iterators. Exactly the behaviour matching
    request_streaming/response_streaming is set.
    """

    @property
    def request_streaming(self) -> bool: ...
    @property
    def response_streaming(self) -> bool: ...
    @property
    def request_deserializer(self) -> Callable[[bytes], Any] | None: ...
    @property
    def response_serializer(self) -> Callable[[Any], bytes] | None: ...
    @property
    def unary_unary(self) -> Callable[[Any, Context], Awaitable[Any]] | None: ...
    @property
    def unary_stream(self) -> Streams | None: ...
    @property
    def stream_unary(self) -> Callable[[AsyncIterator[Any], Context], Awaitable[Any]] | None: ...
    @property
    def stream_stream(self) -> Streams | None: ...


def aio_handler(handler: Handler) -> AioMethodHandler:
    """The one place the sync-server typing of a handler is exchanged for grpc.aio's."""
    return cast(AioMethodHandler, handler)


def yields(behaviour: Streams) -> TypeIs[Generates]:
    """Whether a response-streaming behaviour is an async generator function."""
    return inspect.isasyncgenfunction(behaviour)


class WrapsEachMethod(grpc.aio.ServerInterceptor, abc.ABC):
    """Wraps a method's handler the first time the method is called and keeps the wrapper.

    Unknown methods pass through unremembered: callers choose their names, so remembering
    them would let anyone grow the table.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method = handler_call_details.method
        wrapped = self._handlers.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return handler
            wrapped = self.wrap(aio_handler(handler), method)
            if wrapped is None:
                wrapped = handler
            self._handlers[method] = wrapped
        return wrapped

    @abc.abstractmethod
    def wrap(self, handler: AioMethodHandler, method: str) -> Handler | None:
        """The handler to use for `method` from now on (None: `handler` itself)."""


async def relay(responses: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    """Yields a wrapped streaming handler's responses.

    When the call ends early (cancelled, the client gone), the wrapped generator is
    closed at once, so its own cleanup (releasing messages it claimed) runs now rather
    than whenever the garbage collector reaches it.
    """
    async with contextlib.aclosing(responses) as inner:
        async for response in inner:
            yield response
