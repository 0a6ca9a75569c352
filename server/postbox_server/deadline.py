"""A deadline for unary calls whose client set none (--unary-deadline).

A call without a deadline waits as long as the database makes it: behind a lock, on a
pool that is exhausted. Past the default it ends with DEADLINE_EXCEEDED, what it had not
committed rolled back, and the client can retry. A client's own
deadline, shorter or longer, is the client's: gRPC (or Connect-Timeout-Ms) enforces it.
Streams are left alone: a long-poll Receive waits by design.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from postbox_server.interceptors import AioMethodHandler, Context, Handler, WrapsEachMethod

_OURS = "/postbox.v1."


class DefaultDeadline(WrapsEachMethod):
    """Ends a unary postbox call without a client deadline after `seconds`."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self._seconds = seconds

    def wrap(self, handler: AioMethodHandler, method: str) -> Handler | None:
        behaviour = handler.unary_unary
        if behaviour is None or not method.startswith(_OURS):
            return None
        seconds = self._seconds

        async def unary(request: Any, context: Context) -> Any:
            if context.time_remaining() is not None:
                return await behaviour(request, context)
            try:
                return await asyncio.wait_for(behaviour(request, context), seconds)
            except asyncio.TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the call ran past the server's default deadline of {seconds:g} s "
                    "(--unary-deadline) and was stopped: what it had not committed is rolled "
                    "back. Retry, or set a deadline of your own",
                )

        return grpc.unary_unary_rpc_method_handler(
            unary, handler.request_deserializer, handler.response_serializer
        )
