"""What every server interceptor shares: wrap a method's handler once; relay its stream."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc


class WrapsEachMethod(grpc.aio.ServerInterceptor, abc.ABC):
    """Wraps a method's handler the first time the method is called and keeps the wrapper.

    Unknown methods pass through unremembered: callers choose their names, so remembering
    them would let anyone grow the table.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        wrapped = self._handlers.get(method)
        if wrapped is None:
            handler = await continuation(handler_call_details)
            if handler is None:
                return handler
            wrapped = self._handlers[method] = self.wrap(handler, method)
        return wrapped

    @abc.abstractmethod
    def wrap(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        """The handler to use for `method` from now on."""


async def relay(responses: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Yields a wrapped streaming handler's responses.

    When the call ends early (cancelled, the client gone), the wrapped generator is
    closed at once, so its own cleanup (releasing messages it claimed) runs now rather
    than whenever the garbage collector reaches it.
    """
    async with contextlib.aclosing(responses) as inner:  # type: ignore[type-var]
        async for response in inner:
            yield response
