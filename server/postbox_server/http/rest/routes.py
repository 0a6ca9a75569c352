"""The route table of the REST API, which serves it and writes its OpenAPI document."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import grpc
from aiohttp import web

from postbox_server import __version__
from postbox_server.http.connect import ConnectError
from postbox_server.http.procedures import Procedure
from postbox_server.http.rest import events, messages, queues, schedules
from postbox_server.http.rest.fifo_names import taking_fifo_names
from postbox_server.http.rest.framework import ERROR_SCHEMA, Route, error_response, handler_of

ROUTES: tuple[Route, ...] = tuple(
    taking_fifo_names(route)
    for route in (*queues.ROUTES, *messages.ROUTES, *events.ROUTES, *schedules.ROUTES)
)
OPENAPI_PATH = "/v1/openapi.json"
_PARAM = re.compile(r"\{([a-z_]+)\}")


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": route.summary,
        "operationId": route.method.lower() + re.sub(r"[/{}]+", "_", route.path).rstrip("_"),
        "description": f"Calls postbox.v1.{route.procedure.replace('/', '.')}: its key "
        "and grant rules apply.",
        "responses": {
            str(status): {
                "description": reply.description,
                **(
                    {"content": {"application/json": {"schema": dict(reply.schema)}}}
                    if reply.schema is not None
                    else {}
                ),
            }
            for status, reply in sorted(route.replies.items())
        }
        | {
            "default": {
                "description": "An error: the HTTP status Connect gives its code.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
            }
        },
    }
    if route.params:
        operation["parameters"] = [
            {
                "name": param.name,
                "in": param.where,
                "required": param.where == "path",
                "description": param.description,
                "schema": dict(param.schema),
            }
            for param in route.params
        ]
    if route.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": dict(route.body)}},
        }
    return operation


def document(routes: tuple[Route, ...] = ROUTES) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes`."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "postbox REST API",
            "version": __version__,
            "description": "beyond-queue's native REST API, on postbox's services.",
        },
        "paths": paths,
        "components": {
            "schemas": {"Error": ERROR_SCHEMA},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


def _templates(routes: tuple[Route, ...]) -> list[tuple[re.Pattern[str], list[str]]]:
    methods: dict[str, list[str]] = {}
    for route in routes:
        methods.setdefault(route.path, []).append(route.method)
    return [
        (
            re.compile(
                "/".join(
                    "[^/]+" if _PARAM.fullmatch(part) else re.escape(part)
                    for part in path.split("/")
                )
            ),
            found,
        )
        for path, found in methods.items()
    ]


def add_routes(
    app: web.Application,
    procedures: Mapping[str, Procedure],
    *,
    max_body: int,
    deadline: float | None,
) -> None:
    """Adds every route, GET /v1/openapi.json, and answers for the other /v1 paths."""
    served = json.dumps(document()).encode()

    async def openapi(_: web.Request) -> web.Response:
        return web.Response(body=served, content_type="application/json")

    app.router.add_get(OPENAPI_PATH, openapi)
    for route in ROUTES:
        app.router.add_route(
            route.method, route.path, handler_of(route, procedures, max_body, deadline)
        )
    templates = _templates(ROUTES)

    async def elsewhere(request: web.Request) -> web.Response:
        for template, methods in templates:
            if template.fullmatch(request.path):
                return error_response(
                    ConnectError(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"{request.method[:20]} is not a method of {request.path[:200]!r}: "
                        f"{', '.join(methods)}",
                    ),
                    status=405,
                    headers={"Allow": ", ".join(methods)},
                )
        return error_response(
            ConnectError(
                grpc.StatusCode.NOT_FOUND,
                f"no route is at {request.path[:200]!r}; GET {OPENAPI_PATH} lists them",
            )
        )

    app.router.add_route("*", "/v1/{tail:.*}", elsewhere)
