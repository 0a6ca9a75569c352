"""What every REST route shares: its entry in the route table (which also writes the
OpenAPI document), reading its path, query and JSON body, calling procedures, and the
error body {"error": message, "code": code}.

Bad input is refused through the route's procedure, as an undecodable request: the
interceptors check the caller's key first, so an anonymous caller learns nothing, and
nothing reaches the database.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.message import Message

from postbox_server.http import connect, invoke
from postbox_server.http.connect import ConnectError
from postbox_server.http.context import HttpCallContext
from postbox_server.http.procedures import Procedure
from postbox_server.services.decoding import Undecodable

log = logging.getLogger(__name__)

PACKAGE = "/postbox.v1."
_ADVICE = "see this route in GET /v1/openapi.json"
ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error", "code"],
    "properties": {
        "error": {"type": "string", "description": "What was wrong and how to fix it."},
        "code": {"type": "string", "enum": list(connect.CODES)},
    },
}


class BadInput(Exception):
    """The request's path, query or body cannot be translated: the caller's to fix."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Gone(BadInput):
    """The request names something this server process does not know (any more): 410,
    after the caller's key is checked as for any bad input."""


class RestError(Exception):
    """A call's failure, as the REST client hears it."""

    def __init__(self, error: ConnectError, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.headers = dict(headers or {})

    @property
    def code(self) -> grpc.StatusCode:
        return self.error.code

    def response(self) -> web.Response:
        return error_response(self.error, headers=self.headers)


def error_response(
    error: ConnectError, *, status: int | None = None, headers: Mapping[str, str] | None = None
) -> web.Response:
    """The REST error body, with the HTTP status Connect gives the code."""
    return web.json_response(
        {"error": error.message, "code": connect.code_name(error.code)},
        status=status or error.status,
        headers=headers,
    )


def quoted(text: str, limit: int = 40) -> str:
    """Caller input for a message: whole when short, else a prefix with its length."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text)} characters)"


@dataclass(frozen=True)
class Param:
    """A path or query parameter."""

    name: str
    where: str  # "path" or "query"
    schema: Mapping[str, Any]
    description: str


@dataclass(frozen=True)
class Reply:
    """One documented answer of a route."""

    description: str
    schema: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    # The procedure ("MessageService/Send") whose key and grant rules the route answers
    # to first: bad input is refused through it.
    procedure: str
    handler: Callable[[RestCall], Awaitable[web.StreamResponse]]
    summary: str
    params: tuple[Param, ...] = ()
    body: Mapping[str, Any] | None = None
    replies: Mapping[int, Reply] = field(default_factory=dict)


def path_param(name: str, description: str) -> Param:
    return Param(name, "path", {"type": "string"}, description)


def query_param(name: str, schema: Mapping[str, Any], description: str) -> Param:
    return Param(name, "query", schema, description)


class RestCall:
    """One request to a route, and the procedures it calls."""

    def __init__(
        self,
        request: web.Request,
        route: Route,
        procedures: Mapping[str, Procedure],
        max_body: int,
        deadline: float | None,
    ) -> None:
        self.request = request
        self.route = route
        self._procedures = procedures
        self._max_body = max_body
        # Seconds a call may take (None: no deadline), on the event loop's clock from now.
        self._deadline = deadline
        self._renamed: dict[str, str] = {}
        self._body: bytes | None = None

    def path(self, name: str) -> str:
        return self._renamed.get(name) or self.request.match_info[name]

    def renamed(self, param: str, value: str) -> RestCall:
        """The same request with one path parameter read as `value`: its body, if read,
        is kept for the new call."""
        call = RestCall(self.request, self.route, self._procedures, self._max_body, self._deadline)
        call._renamed = {**self._renamed, param: value}
        call._body = self._body
        return call

    def query_int(self, name: str, default: int) -> int:
        text = self.request.query.get(name)
        if text is None:
            return default
        if not text.isascii() or not text.isdigit() or len(text) > 9:
            raise BadInput(
                f"query parameter {name} is {quoted(text)}; it must be a whole number "
                "of at most 9 digits"
            )
        return int(text)

    def query_bool(self, name: str) -> bool | None:
        text = self.request.query.get(name)
        if text is None:
            return None
        if text.lower() not in ("true", "false"):
            raise BadInput(f"query parameter {name} is {quoted(text)}; it must be true or false")
        return text.lower() == "true"

    def query_str(self, name: str) -> str | None:
        return self.request.query.get(name)

    async def json(self) -> Any:
        """The body as JSON; BadInput when it is not JSON."""
        if self._body is None:
            try:
                self._body = await invoke.read_body(self.request, self._max_body)
            except ConnectError as error:
                raise RestError(error) from None
        data = self._body
        if not data.strip():
            raise BadInput("the body is empty; this route takes a JSON body")
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as error:
            raise BadInput(f"the body is not JSON: {error}") from None

    async def json_object(self) -> dict[str, Any]:
        body = await self.json()
        if not isinstance(body, dict):
            raise BadInput(f"the body is a JSON {json_type(body)}; this route takes an object")
        return body

    async def call(self, procedure: str, message: Message | Undecodable) -> Any:
        """The procedure's response (a server-streaming one's merged), or RestError."""
        target = self._procedures[PACKAGE + procedure]
        loop = asyncio.get_running_loop()
        deadline = None if self._deadline is None else loop.time() + self._deadline
        context = HttpCallContext(invoke.metadata(self.request), deadline)
        try:
            return await asyncio.wait_for(invoke.answer(target, message, context), self._deadline)
        except Exception as error:
            raise RestError(invoke.failure(context, error)) from None
        finally:
            context.done()

    async def refuse(self, bad: BadInput) -> web.Response:
        """Bad input's answer, from the route's procedure: the caller's key first."""
        try:
            await self.call(self.route.procedure, Undecodable(bad.reason, _ADVICE))
        except RestError as error:
            if isinstance(bad, Gone) and error.code is grpc.StatusCode.INVALID_ARGUMENT:
                # The key passed: the refusal is the route's own.
                return error_response(
                    ConnectError(grpc.StatusCode.NOT_FOUND, bad.reason), status=410
                )
            return error.response()
        raise AssertionError(f"{self.route.procedure} took an undecodable request")


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "number"


def handler_of(
    route: Route,
    procedures: Mapping[str, Procedure],
    max_body: int,
    deadline: float | None,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        call = RestCall(request, route, procedures, max_body, deadline)
        try:
            return await route.handler(call)
        except BadInput as bad:
            return await call.refuse(bad)
        except RestError as error:
            return error.response()
        except Exception as error:
            # A fault of this layer: UNKNOWN, as a servicer's crash; its cause in the log.
            log.error("%s %s failed", route.method, route.path, exc_info=error)
            return error_response(
                ConnectError(grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}")
            )

    return handle
