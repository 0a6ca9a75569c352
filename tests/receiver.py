"""A real HTTP server that receives webhooks for the tests: aiohttp on a free port, in a thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from support import free_port


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()

    @property
    def document(self) -> Any:
        return json.loads(self.body)


class Receiver:
    """Answers each path with its planned (status, delay) replies in turn, then 200."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: list[Received] = []
        self._plans: dict[str, deque[tuple[int, float]]] = defaultdict(deque)
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def plan(self, path: str, *replies: tuple[int, float]) -> None:
        """The replies to the next requests on `path`: (HTTP status, seconds to wait first)."""
        with self._changed:
            self._plans[path].extend(replies)

    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def on(self, path: str) -> list[Received]:
        with self._changed:
            return [r for r in self.received if r.path == path]

    def wait_for(self, path: str, count: int, timeout: float = 30.0) -> list[Received]:
        """The requests on `path` once there are at least `count` of them (fails after timeout)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(got := [r for r in self.received if r.path == path]) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(got)} of {count} requests on {path} after {timeout} s"
                self._changed.wait(left)
            return got

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        with self._changed:
            self.received.append(
                Received(request.path, dict(request.headers), body, time.monotonic())
            )
            self._changed.notify_all()
            plan = self._plans[request.path]
            status, delay = plan.popleft() if plan else (200, 0.0)
        if delay:
            await asyncio.sleep(delay)
        if 300 <= status < 400:
            raise web.HTTPFound(location=self.url("/elsewhere"))
        return web.Response(status=status, text=f"planned {status}")
