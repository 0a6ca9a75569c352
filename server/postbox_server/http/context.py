"""What a servicer and the interceptors ask of a call, for a call that came over HTTP.

The servicers and interceptors are written against grpc.aio.ServicerContext; this
answers the part of it they use: the caller's metadata (its HTTP headers), abort, the
status set, the deadline and done callbacks (no servicer streams with write(), so
there is none). An abort raises grpc.aio.AbortError as
grpc.aio's does, so code that tells an abort from a crash (the call counter) works alike.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import grpc


class HttpCallContext:
    def __init__(self, metadata: Sequence[tuple[str, str]], deadline: float | None) -> None:
        self._metadata = tuple(metadata)
        # On the event loop's clock; None: the client set no Connect-Timeout-Ms.
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._trailing: tuple[tuple[str, str], ...] = ()
        self._done_callbacks: list[Callable[[Any], None]] = []
        self._writes: asyncio.Queue[Any] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        self._code = code
        self._details = details
        raise grpc.aio.AbortError(f"aborted with {code.name}: {details}")

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, str]]) -> None:
        self._trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._done_callbacks.append(callback)

    def done(self) -> None:
        """The call has ended, however: run what the servicer asked to run then."""
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            callback(self)
