"""GET /livez and GET /readyz, on the HTTP and metrics ports.

/livez says the process runs, without asking the database: an orchestrator restarting a
process because its database is away would only add restarts to the outage. /readyz asks
the database (a ping, bounded) and answers 503 `degraded` while it does not answer or
the process is shutting down, so a balancer sends it no calls then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from postbox_server import __version__
from postbox_server.errors import ApiError

# Longest a readiness ping may take before the database counts as away.
READY_TIMEOUT = 2.0

Ready = Callable[[], Awaitable[bool]]


def database_ready(ping: Callable[[], Awaitable[None]], running: Callable[[], bool]) -> Ready:
    """Ready while `running()` and `ping()` answers within READY_TIMEOUT."""

    async def ready() -> bool:
        if not running():
            return False
        try:
            await asyncio.wait_for(ping(), READY_TIMEOUT)
        except (ApiError, asyncio.TimeoutError, OSError):
            return False
        return running()

    return ready


def add_probes(app: web.Application, ready: Ready) -> None:
    async def livez(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    async def readyz(_: web.Request) -> web.Response:
        if await ready():
            return web.json_response({"status": "ok", "version": __version__})
        return web.json_response({"status": "degraded", "version": __version__}, status=503)

    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
