"""http_site, the one way postbox's aiohttp servers start and stop: it serves inside its
block on the port it yields, stops on leaving it, and names the address it cannot bind."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web

from postbox_server.http_site import http_site


def _app() -> web.Application:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    return app


async def test_serves_inside_the_block_and_stops_on_leaving_it() -> None:
    async with http_site(_app(), "127.0.0.1", 0) as port:
        assert port > 0
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/") as r,
        ):
            assert await r.text() == "hello"
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_bracketed_ipv6_host_is_served() -> None:
    # The machine's IPv6 loopback, checked apart: an OSError of http_site itself fails.
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as error:
        pytest.skip(f"no IPv6 loopback on this machine: {error}")
    async with http_site(_app(), "[::1]", 0) as port:
        _, writer = await asyncio.open_connection("::1", port)
        writer.close()


async def test_a_busy_port_is_named_and_nothing_is_left_running() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}: "):
            async with http_site(_app(), "127.0.0.1", port):
                pytest.fail("the block ran on a port that is taken")
