"""One aiohttp application listening on one address: how every aiohttp server of
postbox starts and stops (the HTTP/JSON front door, the console, the metrics port and
the SQS/SNS shim)."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

from aiohttp import web

# aiohttp's own default: how long open requests may finish once a stop begins.
DEFAULT_SHUTDOWN_TIMEOUT = 60.0


@contextlib.asynccontextmanager
async def http_site(
    app: web.Application,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    reuse_port: bool = False,
    handler_cancellation: bool = False,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> AsyncIterator[int]:
    """Serves `app` on host:port (a bracketed IPv6 host too) inside the block, and yields
    the port it listens on (the one the system chose for port 0). Leaving the block stops
    it: no new connections, open requests get `shutdown_timeout` seconds to finish.

    handler_cancellation: a client that hangs up cancels its handler, so a long poll it
    waits on ends (and releases what it claimed), as a cancelled gRPC call does."""
    runner = web.AppRunner(
        app,
        handler_cancellation=handler_cancellation,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
    )
    await runner.setup()
    try:
        site = web.TCPSite(
            runner, host.strip("[]"), port, ssl_context=ssl_context, reuse_port=reuse_port
        )
        try:
            await site.start()
        except OSError as error:
            raise OSError(f"cannot listen on {host}:{port}: {error.strerror}") from None
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()
