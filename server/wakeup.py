"""Wakes waiting Receive streams when their queue may hold visible messages.

One LISTEN connection per server process receives the engine's NOTIFYs (sent on
commit, so every replica hears every send). Waiters queue up per queue and are
woken one at a time: a woken stream that fills its batch passes the wake-up on,
so a burst drains in parallel while a single message wakes a single stream.
Timers cover delayed and in-flight messages that become visible without any
send; a slow safety poll covers notifications lost in a reconnect: one statement
for all queues with waiting streams, which also keeps the LISTEN connection alive.

The same channel carries the engine's signals to the workers (a payload starting
with "#", which no queue name can: "#webhooks", "#schedules", "#redrives"), so an
idle worker sleeps until its next due time or a signal, not on a short poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

import asyncpg

from server.db import hosts
from server.db.engine import application_name

log = logging.getLogger(__name__)

CHANNEL = "postbox"
_RETRY_LOCKED = 0.02  # seconds


@dataclass
class _QueueWaiters:
    # Bumped by every wake-up; a stream that saw an older generation before its
    # empty poll does not sleep, so no wake-up falls between poll and wait.
    generation: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    timer: asyncio.TimerHandle | None = None
    timer_at: float = 0.0


class WakeHub:
    """Per-process registry of waiting streams, fed by LISTEN, local sends and timers."""

    def __init__(
        self,
        dsn: str,
        *,
        safety_interval: float = 10.0,
        trailing_wake: float = 0.02,
        reconnect_delay: float = 0.5,
    ) -> None:
        self._dsn = dsn
        self._safety_interval = safety_interval
        # The engine throttles NOTIFY per queue; a sender that skipped one commits
        # a moment after the notifying sender, so waiters look once more shortly after.
        self._trailing_wake = trailing_wake
        self._reconnect_delay = reconnect_delay
        self._queues: dict[str, _QueueWaiters] = {}
        self._signals: dict[str, list[Callable[[], None]]] = {}
        self._on_lost: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = asyncio.Event()
        self._closed = asyncio.Event()
        self.closing = False

    @property
    def listening(self) -> bool:
        return self._connected.is_set()

    async def until_listening(self, timeout: float) -> None:
        """Returns once the LISTEN connection is up (the database answers), or after `timeout`."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connected.wait(), timeout)

    async def until_closed(self) -> None:
        """Returns once the server shuts down (see close)."""
        await self._closed.wait()

    def on_signal(self, kind: str, callback: Callable[[], None]) -> None:
        """Calls `callback` whenever the engine signals work of that kind (see _signal)."""
        self._signals.setdefault(kind, []).append(callback)

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Calls `callback` when the LISTEN connection drops: the database may be gone."""
        self._on_lost.append(callback)

    async def start(self, *, wait_connected: float = 10.0) -> None:
        self._tasks = [asyncio.create_task(self._listen_forever(), name="postbox-listen")]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._connected.wait(), wait_connected)

    async def close(self) -> None:
        """Ends every wait at once (streams see `closing`) and stops listening."""
        self.closing = True
        self._closed.set()
        for queue in list(self._queues):
            self.wake(queue, everyone=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def generation(self, queue: str) -> int:
        state = self._queues.get(queue)
        return state.generation if state else 0

    async def wait(self, queue: str, seen_generation: int, timeout: float | None) -> None:
        """Sleeps until the queue is woken after `seen_generation`, or the timeout passes."""
        if self.closing:
            return
        state = self._queues.setdefault(queue, _QueueWaiters())
        if state.generation != seen_generation:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.wake(queue)  # this stream will not poll: pass its wake-up on
            raise
        finally:
            if not waiter.done():
                waiter.cancel()
            with contextlib.suppress(ValueError):
                state.waiters.remove(waiter)
            self._forget_if_idle(queue)

    def wake(self, queue: str, *, everyone: bool = False) -> None:
        """Wakes the longest-waiting stream of the queue (or the next one to wait), or all."""
        state = self._queues.get(queue)
        if state is None:
            return
        state.generation += 1
        while state.waiters:
            waiter = state.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                if not everyone:
                    return

    def wake_at(self, queue: str, when: datetime) -> None:
        """Wakes the queue when a message becomes visible at `when`, unless a timer comes sooner."""
        state = self._queues.setdefault(queue, _QueueWaiters())
        loop = asyncio.get_running_loop()
        delay = (when - datetime.now(timezone.utc)).total_seconds()
        # Just after the visibility instant. A time already past means visible rows
        # that another session holds locked: look again shortly, not in a busy loop.
        at = loop.time() + (delay + 0.001 if delay > 0 else _RETRY_LOCKED)
        if state.timer is not None:
            if state.timer_at <= at:
                return
            state.timer.cancel()
        state.timer, state.timer_at = loop.call_at(at, self._timer_fired, queue), at

    def _timer_fired(self, queue: str) -> None:
        state = self._queues.get(queue)
        if state is not None:
            state.timer = None
            self.wake(queue)
            self._forget_if_idle(queue)

    def _forget_if_idle(self, queue: str) -> None:
        state = self._queues.get(queue)
        if state is not None and not state.waiters and state.timer is None:
            del self._queues[queue]

    def _on_notify(self, _conn: object, _pid: int, _channel: str, queue: str) -> None:
        if queue.startswith("#"):
            for callback in self._signals.get(queue[1:], ()):
                callback()
            return
        if queue in self._queues:
            self.wake(queue)
            asyncio.get_running_loop().call_later(self._trailing_wake, self.wake, queue)

    async def _listen_forever(self) -> None:
        while not self.closing:
            conn: asyncpg.Connection | None = None
            try:
                conn = await hosts.connect(
                    self._dsn, server_settings={"application_name": application_name("listen")}
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, event=lost: event.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                self._connected.set()
                log.info("listening for wake-ups on channel %r", CHANNEL)
                # Notifications sent while disconnected are gone: look at every queue,
                # and let every worker look for work.
                for queue in list(self._queues):
                    self.wake(queue)
                for callbacks in self._signals.values():
                    for callback in callbacks:
                        callback()
                while not lost.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(lost.wait(), self._safety_interval)
                    if not lost.is_set():
                        await self._safety_poll(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if self._connected.is_set():
                    log.warning("wake-up listener lost its connection: %r", exc)
            finally:
                if self._connected.is_set():
                    for callback in self._on_lost:
                        callback()
                self._connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(self._reconnect_delay)

    async def _safety_poll(self, conn: asyncpg.Connection) -> None:
        """Wakes the waiting queues that hold visible messages: one statement for all of
        them, on the LISTEN connection, which it keeps alive (and checks) meanwhile."""
        waiting = [queue for queue, state in self._queues.items() if state.waiters]
        ready = await conn.fetch(
            "SELECT postbox.ready_queues($1::text[])", waiting, timeout=self._safety_interval
        )
        for (queue,) in ready:
            self.wake(queue)
