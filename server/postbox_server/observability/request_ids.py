"""The request id of a call: `x-request-id`, taken from the caller or made here.

Every front door gives each call one id. gRPC takes it from the call's metadata (the
outermost interceptor, grpc_metrics.CountCalls, calls `begin_call`) and sends it back in
the trailing metadata; the HTTP ports and the SQS shim take it from the header
(`install` on their aiohttp application) and send it back as a response header, and the
shim passes it on to the server in the metadata of the calls it makes for the request.
While the call runs, the id is in REQUEST_ID: every log line written then carries it
(logs.py), and every span started then has it as the attribute `postbox.request_id`
(tracing.py).

An id from outside is kept only when it is 1 to 128 printable ASCII characters without
spaces: it goes into log lines, headers and span attributes, so anything longer or with
control characters could forge log lines or bloat every record; such an id is replaced
by a new one (which the response then carries), never refused.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any

from aiohttp import web

from postbox_server.observability.logs import REQUEST_ID

HEADER = "x-request-id"
MAX_LENGTH = 128
# Printable ASCII without the space (0x21-0x7e).
_ACCEPTED = re.compile(rf"[\x21-\x7e]{{1,{MAX_LENGTH}}}")
_REQUEST_KEY = "postbox_request_id"
_NOTES_KEY = "postbox_http_notes"
# What a call served over HTTP tells its response besides its id: the seconds a
# throttled caller should wait (Retry-After). A dict the middleware puts in place, so
# that the call's own tasks, which copy the context, write into the same one.
_NOTES: ContextVar[dict[str, float] | None] = ContextVar("postbox_http_notes", default=None)


def new() -> str:
    return str(uuid.uuid4())


def accept(value: object) -> str:
    """The caller's id when it is a usable one, else a new id."""
    if isinstance(value, str) and _ACCEPTED.fullmatch(value):
        return value
    return new()


def note_retry_after(seconds: float) -> None:
    """A throttled call's wait, for the HTTP response's Retry-After (gRPC has RetryInfo)."""
    notes = _NOTES.get()
    if notes is not None:
        notes["retry_after"] = seconds


def current() -> str | None:
    return REQUEST_ID.get()


def trailing() -> tuple[tuple[str, str], ...]:
    """The metadata pair that echoes the current call's id (none outside a call)."""
    request_id = REQUEST_ID.get()
    return () if request_id is None else ((HEADER, request_id),)


def _from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> object:
    for key, value in metadata or ():
        if key == HEADER:
            return value
    return None


def begin_call(context: Any) -> None:
    """Gives the current gRPC call its id and echoes it in the trailing metadata.

    A call that an HTTP port or the shim passes on already has one (set by `install`'s
    middleware in this task): it keeps it, and the HTTP response carries it instead.
    """
    if REQUEST_ID.get() is not None:
        return
    REQUEST_ID.set(accept(_from_metadata(context.invocation_metadata())))
    # Kept by grpc.aio through an abort without trailing metadata of its own; whoever
    # sets trailing metadata later adds trailing() to it (auth/interceptor.py).
    context.set_trailing_metadata(trailing())


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = accept(request.headers.get(HEADER))
    request[_REQUEST_KEY] = request_id
    notes = request[_NOTES_KEY] = {}
    # A keep-alive connection serves its requests in one task: reset, not just set.
    token, notes_token = REQUEST_ID.set(request_id), _NOTES.set(notes)
    try:
        return await handler(request)
    finally:
        REQUEST_ID.reset(token)
        _NOTES.reset(notes_token)


async def _echo(request: web.Request, response: web.StreamResponse) -> None:
    request_id = request.get(_REQUEST_KEY)
    if request_id is not None:
        response.headers[HEADER] = request_id
    retry_after = request.get(_NOTES_KEY, {}).get("retry_after")
    if retry_after is not None and response.status == 429:
        # Whole seconds (RFC 9110), rounded up so that a client waiting them succeeds.
        response.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))


def install(app: web.Application) -> None:
    """Gives every request of an aiohttp application its id, and every response the
    `x-request-id` header (streamed responses and errors too: it is added as the
    response's headers are sent)."""
    app.middlewares.append(_middleware)
    app.on_response_prepare.append(_echo)
