"""GET /livez and GET /readyz, on the HTTP and metrics ports.

/livez says the process runs, without asking the database: an orchestrator restarting a
process because its database is away would only add restarts to the outage. /readyz asks
the database (a ping, bounded) and answers 503 `degraded`, with the reason, while it does
not answer, while it is out of disk space (db/disk_space.py) or while the process is
shutting down, so a balancer sends it no calls then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from postbox_server import __version__
from postbox_server.db.disk_space import DISK_SPACE
from postbox_server.errors import ApiError

# Longest a readiness ping may take before the database counts as away.
READY_TIMEOUT = 2.0

# Why the process is not ready, or None when it is.
Ready = Callable[[], Awaitable["str | None"]]
SHUTTING_DOWN = "shutting down"


def database_ready(ping: Callable[[], Awaitable[None]], running: Callable[[], bool]) -> Ready:
    """Ready while `running()`, `ping()` answers within READY_TIMEOUT and the database
    is not out of disk space."""

    async def ready() -> str | None:
        if not running():
            return SHUTTING_DOWN
        try:
            await asyncio.wait_for(ping(), READY_TIMEOUT)
        except (ApiError, asyncio.TimeoutError, OSError):
            return f"the database does not answer within {READY_TIMEOUT:g} s"
        if DISK_SPACE.refusal is not None:
            return f"the database is out of disk space ({DISK_SPACE.refusal})"
        return None if running() else SHUTTING_DOWN

    return ready


def add_probes(app: web.Application, ready: Ready) -> None:
    async def livez(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": __version__})

    async def readyz(_: web.Request) -> web.Response:
        reason = await ready()
        if reason is None:
            return web.json_response({"status": "ok", "version": __version__})
        return web.json_response(
            {"status": "degraded", "reason": reason, "version": __version__}, status=503
        )

    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
