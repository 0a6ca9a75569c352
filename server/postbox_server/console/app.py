"""The console's HTTP server: its static assets, its session endpoints and /api/, the
HTTP API's own handler reached through the session.

A call to /api/postbox.v1.<Service>/<Method> is the Connect call of that path, answered
by the same handler, servicers and interceptors as --http-port answers it: the console
cannot do what the API would refuse, nor see what it would not show. The proxy only
swaps the session cookie for the key's `Authorization: Bearer` after checking the
session's CSRF token (header X-CSRF-Token) on every call.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import grpc
from aiohttp import web

from postbox_server.auth.keys import KeyCache
from postbox_server.console.sessions import Session, Sessions
from postbox_server.http.app import ConnectHandler
from postbox_server.http.connect import ConnectError
from postbox_server.http.procedures import Procedure
from postbox_server.observability import request_ids

COOKIE = "postbox_console"
CSRF_HEADER = "X-CSRF-Token"
API_PREFIX = "/api/"
# Largest login request: a JSON object holding one secret.
MAX_LOGIN_SIZE = 4096
_ASSETS = {
    "/": ("index.html", "text/html"),
    "/static/app.js": ("app.js", "text/javascript"),
    "/static/app.css": ("app.css", "text/css"),
}
# Scripts and styles only from this origin, nothing framed: the bundle needs no eval and
# no inline script, so an injected one does not run.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
# Headers the browser sent that the API call must not carry: the proxy sets the
# credentials itself.
_DROPPED = frozenset(("cookie", "authorization", CSRF_HEADER.lower(), "origin", "referer"))

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _connect_error(code: grpc.StatusCode, message: str) -> web.Response:
    error = ConnectError(code, message)
    return web.Response(status=error.status, body=error.body(), content_type="application/json")


def _assets() -> dict[str, tuple[bytes, str]]:
    static = resources.files("postbox_server.console") / "static"
    return {
        path: ((static / name).read_bytes(), content_type)
        for path, (name, content_type) in _ASSETS.items()
    }


def _same_origin(request: web.Request) -> bool:
    """A browser names the page's origin on every POST: it must be this server's."""
    origin = request.headers.get("Origin")
    if origin is None:  # not a browser's cross-site request, which always sends one
        return True
    return urlsplit(origin).netloc == request.host


def _host_name(host: str) -> str:
    """The name or address of a Host header, without its port."""
    return urlsplit(f"//{host}").hostname or ""


def _open_to(request: web.Request, bound_host: str) -> bool:
    """While no key exists, a page may use the console only at an IP address, at
    localhost, or at the name it listens on: a site whose name an attacker points at
    127.0.0.1 (DNS rebinding) would otherwise be same-origin with an open console."""
    name = _host_name(request.host)
    if name in ("localhost", bound_host.strip("[]").lower()):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _grants(keys: KeyCache, session: Session) -> dict[str, Any] | None:
    if session.secret is None:
        return None
    key = keys.by_secret(session.secret)
    if key is None or key.expired():
        return None
    return {
        "name": key.name,
        # "" for the default tenant: the console shows tenants to its admins only.
        "tenant": key.tenant,
        "grants": [{"permission": g.permission, "pattern": g.pattern} for g in key.grants],
    }


def build_console_app(
    keys: KeyCache,
    procedures: dict[str, Procedure],
    *,
    max_request_size: int,
    secure_cookie: bool,
    bound_host: str = "localhost",
    sessions: Sessions | None = None,
) -> web.Application:
    """The console; `procedures` are the HTTP API's (postbox_server.http.procedures)."""
    api = ConnectHandler(procedures, max_request_size)
    assets = _assets()
    sessions = sessions or Sessions()

    def current(request: web.Request) -> tuple[str | None, Session | None]:
        session_id = request.cookies.get(COOKIE)
        return session_id, sessions.get(session_id)

    def with_cookie(response: web.Response, session_id: str) -> web.Response:
        response.set_cookie(
            COOKIE, session_id, httponly=True, samesite="Strict", secure=secure_cookie, path="/"
        )
        return response

    def describe(session: Session) -> dict[str, Any]:
        return {
            "auth": keys.enabled,
            "signedIn": True,
            "key": _grants(keys, session),
            "csrf": session.csrf,
        }

    @web.middleware
    async def security(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD") and not _same_origin(request):
            return _connect_error(
                grpc.StatusCode.PERMISSION_DENIED,
                "cross-origin requests are refused: use the console from its own address",
            )
        if not keys.enabled and not _open_to(request, bound_host):
            return _connect_error(
                grpc.StatusCode.PERMISSION_DENIED,
                "no API key exists, so this console answers only at an IP address, localhost "
                f"or {bound_host!r}; create a key to reach it by another name",
            )
        response = await handler(request)
        response.headers.update(_SECURITY_HEADERS)
        response.headers.setdefault("Cache-Control", "no-store")
        return response

    async def asset(request: web.Request) -> web.Response:
        body, content_type = assets[request.path]
        return web.Response(body=body, content_type=content_type)

    async def no_icon(_: web.Request) -> web.Response:
        return web.Response(status=204)

    async def session_info(request: web.Request) -> web.Response:
        session_id, session = current(request)
        if session is not None and (
            (session.secret is None and keys.enabled)
            or (session.secret is not None and _grants(keys, session) is None)
        ):
            # Opened before the first key existed, or its key was revoked or expired.
            sessions.close(session_id)
            session = None
        if session is None:
            if keys.enabled:
                return web.json_response(
                    {"auth": True, "signedIn": False, "key": None, "csrf": None}
                )
            # No key exists: the console is open, as the API is (loopback, or on purpose).
            session_id, session = sessions.open(None)
            return with_cookie(web.json_response(describe(session)), session_id)
        return web.json_response(describe(session))

    async def login(request: web.Request) -> web.Response:
        if request.content_type != "application/json":
            # A cross-site form cannot send JSON without a preflight, which is not answered.
            return _connect_error(
                grpc.StatusCode.INVALID_ARGUMENT, 'send {"secret": "<API key>"} as application/json'
            )
        if request.content_length is None or request.content_length > MAX_LOGIN_SIZE:
            return _connect_error(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a login body has a Content-Length of at most {MAX_LOGIN_SIZE} bytes",
            )
        try:
            body = await request.json()
        except ValueError:
            body = None
        secret = body.get("secret") if isinstance(body, dict) else None
        if not isinstance(secret, str) or not secret.strip():
            return _connect_error(
                grpc.StatusCode.INVALID_ARGUMENT, 'send {"secret": "<API key>"} as application/json'
            )
        key = keys.by_secret(secret.strip())
        if key is None or key.expired():
            return _connect_error(
                grpc.StatusCode.UNAUTHENTICATED,
                "this API key is not known or has expired",
            )
        sessions.close(request.cookies.get(COOKIE))
        session_id, session = sessions.open(secret.strip())
        return with_cookie(web.json_response(describe(session)), session_id)

    async def logout(request: web.Request) -> web.Response:
        session_id, session = current(request)
        if session is not None and not session.accepts(request.headers.get(CSRF_HEADER)):
            return _connect_error(
                grpc.StatusCode.PERMISSION_DENIED, f"the {CSRF_HEADER} header is missing or wrong"
            )
        sessions.close(session_id)
        response = web.json_response({})
        response.del_cookie(COOKIE, path="/")
        return response

    async def proxy(request: web.Request) -> web.StreamResponse:
        _, session = current(request)
        if session is None:
            return _connect_error(
                grpc.StatusCode.UNAUTHENTICATED, "no console session: log in again"
            )
        if not session.accepts(request.headers.get(CSRF_HEADER)):
            return _connect_error(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the {CSRF_HEADER} header is missing or wrong: every console call carries "
                "its session's token",
            )
        headers = {
            name: value for name, value in request.headers.items() if name.lower() not in _DROPPED
        }
        if session.secret is not None:
            headers["Authorization"] = f"Bearer {session.secret}"
        path = "/" + request.path[len(API_PREFIX) :]
        return await api(request.clone(rel_url=path, headers=headers))

    app = web.Application(middlewares=[security])
    request_ids.install(app)
    for path in assets:
        app.router.add_get(path, asset)
    app.router.add_get("/favicon.ico", no_icon)
    app.router.add_get("/console/session", session_info)
    app.router.add_post("/console/login", login)
    app.router.add_post("/console/logout", logout)
    app.router.add_route("*", API_PREFIX + "{path:.*}", proxy)
    return app
