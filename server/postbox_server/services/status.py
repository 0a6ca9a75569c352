"""Turns what a servicer method raises into the gRPC status of the call: an ApiError's
own, UNKNOWN with the bare type of anything else (grpc.aio would send its text)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from postbox_server.errors import ApiError, crashed
from postbox_server.observability import request_ids

F = TypeVar("F", bound=Callable[..., Any])


async def _abort(context: grpc.aio.ServicerContext, error: ApiError) -> None:
    if error.metadata:
        # With the request id, which an abort's own metadata would replace.
        context.set_trailing_metadata((*error.metadata, *request_ids.trailing()))
    await context.abort(error.code, error.message)


def reports_errors(method: F) -> F:
    """Decorates a unary or server-streaming servicer method."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                # aclosing: when the client goes away, the method's own cleanup runs now.
                async with contextlib.aclosing(method(self, request, context)) as responses:
                    async for response in responses:
                        yield response
            except ApiError as error:
                await _abort(context, error)
            except grpc.aio.AbortError:
                raise
            except Exception as error:
                failure = crashed(error)
                await context.abort(failure.code, failure.message)

        # functools.wraps keeps the method's signature; mypy cannot see that the wrapper is F.
        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ApiError as error:
            await _abort(context, error)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            failure = crashed(error)
            await context.abort(failure.code, failure.message)

    return unary  # type: ignore[return-value]  # as above: the wrapper is F
