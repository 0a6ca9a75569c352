"""The shape every server interceptor shares: wrap a method's handler once, reuse it."""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable

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
