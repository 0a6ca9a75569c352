"""Wakes waiting Receive streams when their queue may hold visible messages.

One LISTEN connection per server process receives the engine's NOTIFYs (sent on
commit, so every replica hears every send). Waiters queue up per queue and are
woken one at a time: a woken stream that fills its batch passes the wake-up on,
so a burst drains in parallel while a single message wakes a single stream.
Timers cover delayed and in-flight messages that become visible without any
send; a slow safety poll covers notifications lost in a reconnect: one statement
for all queues with waiting streams, which also keeps the LISTEN connection alive.

Sends notify only queues that some server lists as waited on
(postbox.queue_listeners): NOTIFY serialises commits, and most sends go to queues
whose consumers are busy or absent. A queue is listed when a stream first waits on
it and stays listed while streams keep waiting on it. Listing races with sends: a
send that looked for listeners just before the listing committed does not notify.
So once listed, the hub looks at the queues itself, at once (sends committed before
the listing) and again once every transaction in progress at the listing has ended
(sends that had looked already but not yet committed).

A send through this server wakes its local streams itself once it has committed,
so here the NOTIFY of that send is redundant (other servers still need it): it
would make a stream that has claimed the message already claim again. The hub
skips it (OwnSessions). This server's sessions do not throttle their NOTIFYs, so
every other change they make to a waited-on queue (a move to a dead-letter
queue, a FIFO promotion, a resume, a schedule's fire) wakes by its own NOTIFY,
and only other sessions' NOTIFYs need the trailing look (see _on_notify).

The same channel carries the engine's signals to the workers (a payload starting
with "#", which no queue name can: "#webhooks", "#schedules", "#redrives"), so an
idle worker sleeps until its next due time or a signal, not on a short poll. A
signal may name what it is about after a colon ("#payload_schema:queues:orders").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import cast

import asyncpg

from postbox_server.db import hosts
from postbox_server.db.engine import application_name
from postbox_server.db.own_sessions import OwnSessions

log = logging.getLogger(__name__)

CHANNEL = "postbox"
_RETRY_LOCKED = 0.02  # seconds
# The most ids a wake-up remembers for woken_only_for: a claim takes at most 1000, but
# most take 10 or fewer, and the memory is per queue.
_MAX_WOKEN_FOR = 100
# A listed queue stays listed this long (seconds) after its last waiting stream, so
# that streams that wait again soon do not list it again.
LISTED_LINGER = 30.0
# Between looks at whether the transactions in progress at a listing have ended.
_ENDED_POLL = (0.005, 0.2)  # first and longest, seconds
# Whether every transaction in progress at a snapshot ($1) has ended, given an id
# drawn after it ($2): see WakeHub._look_once_ended.
ENDED = """
SELECT NOT EXISTS (
    SELECT FROM pg_snapshot_xip($1::text::pg_snapshot) AS x WHERE pg_xact_status(x) = 'in progress'
    UNION ALL
    SELECT FROM generate_series(pg_snapshot_xmax($1::text::pg_snapshot)::text::bigint,
                                $2::bigint - 1) AS x
    WHERE pg_xact_status(x::text::xid8) = 'in progress')
"""


@dataclass
class _QueueWaiters:
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    timer: asyncio.Handle | None = None  # uvloop gives a plain Handle for a time past
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
        own_sessions: OwnSessions | None = None,
    ) -> None:
        self._dsn = dsn
        self._own = own_sessions
        if own_sessions is not None:
            own_sessions.listed = self._is_listed
        self._safety_interval = safety_interval
        # The engine throttles NOTIFY per queue and session (other than this server's);
        # a sender that skipped one commits a moment after the notifying sender, so
        # waiters look once more shortly after.
        self._trailing_wake = trailing_wake
        self._reconnect_delay = reconnect_delay
        self._queues: dict[str, _QueueWaiters] = {}
        # Per queue that streams have claimed from, bumped by every wake-up, also while
        # no stream waits; a stream that saw an older generation before its empty
        # claim does not sleep, so no wake-up falls between claim and wait.
        self._generations: dict[str, int] = {}
        # Per queue, the messages whose send made its latest generation, when this
        # server sent them (see woken_only_for).
        self._woken_for: dict[str, frozenset[str]] = {}
        # Queues listed in postbox.queue_listeners for this LISTEN connection, with
        # the loop time a stream last waited on each; and those to list next.
        self._listed: dict[str, float] = {}
        # Looks at newly listed queues still waiting for older transactions to end.
        self.looks_pending = 0
        self._to_list: set[str] = set()
        self._list_requested = asyncio.Event()
        # One statement at a time on the LISTEN connection.
        self._conn_lock = asyncio.Lock()
        self._signals: dict[str, list[Callable[[], None]]] = {}
        self._subject_signals: dict[str, list[Callable[[str], None]]] = {}
        self._on_lost: list[Callable[[], None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._connected = asyncio.Event()
        self._closed = asyncio.Event()
        self._closed_future: asyncio.Future[None] | None = None
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

    def closed(self) -> asyncio.Future[None]:
        """A future done once the server shuts down, for callers that add a callback to it
        rather than wait in a task of their own (see until_closed)."""
        if self._closed_future is None:
            self._closed_future = asyncio.get_running_loop().create_future()
            if self.closing:
                self._closed_future.set_result(None)
        return self._closed_future

    def on_signal(self, kind: str, callback: Callable[[], None]) -> None:
        """Calls `callback` whenever the engine signals work of that kind (see _signal)."""
        self._signals.setdefault(kind, []).append(callback)

    def on_subject_signal(self, kind: str, callback: Callable[[str], None]) -> None:
        """Calls `callback` with the subject of each signal of that kind ("#kind:subject"),
        and with "" (everything) whenever signals may have been missed: on (re)connecting."""
        self._subject_signals.setdefault(kind, []).append(callback)

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
        if self._closed_future is not None and not self._closed_future.done():
            self._closed_future.set_result(None)
        for queue in list(self._queues):
            self.wake(queue, everyone=True)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _is_listed(self, queue: str) -> bool:
        return queue in self._listed

    def generation(self, queue: str) -> int:
        return self._generations.setdefault(queue, 0)

    def woken_only_for(self, queue: str, seen_generation: int, claimed: Iterable[str]) -> bool:
        """Whether the one wake-up since `seen_generation` was for sent messages that are
        all among `claimed`: a send that committed just before a claim began, and woke
        the queue just after, for messages that claim took. Claiming again for it finds
        nothing (on a loaded server, one claim in ten did)."""
        if self._generations.get(queue, 0) != seen_generation + 1:
            return False
        woken_for = self._woken_for.get(queue)
        return woken_for is not None and woken_for.issubset(claimed)

    async def wait(self, queue: str, seen_generation: int, timeout: float | None) -> None:
        """Sleeps until the queue is woken after `seen_generation`, or the timeout passes."""
        waiter = self.watch(queue, seen_generation)
        if waiter is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout)
        except asyncio.TimeoutError:
            pass
        except asyncio.CancelledError:
            self.unwatch(queue, waiter, pass_on=True)  # this stream will not poll
            raise
        finally:
            self.unwatch(queue, waiter)

    def watch(self, queue: str, seen_generation: int) -> asyncio.Future[None] | None:
        """What `wait` waits on, for a caller that waits on other things too: a future
        done once the queue is woken after `seen_generation` (or the hub closes); None
        if that has happened already. Every future returned goes back through unwatch.

        A caller that waits on its own future and a task's `wait` together pays for
        the task's hops on every wake-up; a callback on this future costs one."""
        if self.closing:
            return None
        if self._generations.get(queue, 0) != seen_generation:
            return None
        state = self._queues.setdefault(queue, _QueueWaiters())
        loop = asyncio.get_running_loop()
        if queue in self._listed:
            self._listed[queue] = loop.time()
        elif queue not in self._to_list:
            self._to_list.add(queue)
            self._list_requested.set()
        waiter: asyncio.Future[None] = loop.create_future()
        state.waiters.append(waiter)
        return waiter

    def unwatch(self, queue: str, waiter: asyncio.Future[None], *, pass_on: bool = False) -> None:
        """Ends a watch. `pass_on`: the caller will not claim, so a wake-up it was given
        goes to the next stream waiting on the queue."""
        if pass_on and waiter.done() and not waiter.cancelled():
            self.wake(queue)
        if not waiter.done():
            waiter.cancel()
        state = self._queues.get(queue)
        if state is not None:
            with contextlib.suppress(ValueError):
                state.waiters.remove(waiter)
        self._forget_if_idle(queue)

    def wake(self, queue: str, *, everyone: bool = False, sent: Iterable[str] = ()) -> None:
        """Wakes the longest-waiting stream of the queue (or the next one to wait), or all.
        `sent`: the ids (decimal) of the messages whose send on this server is the cause."""
        if queue in self._generations:
            self._generations[queue] += 1
            woken_for = frozenset(sent)
            if 0 < len(woken_for) <= _MAX_WOKEN_FOR:
                self._woken_for[queue] = woken_for
            else:
                self._woken_for.pop(queue, None)
        state = self._queues.get(queue)
        if state is None:
            return
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

    def _on_notify(self, _conn: object, pid: int, _channel: str, payload: object) -> None:
        queue = cast(str, payload)  # a NOTIFY payload is text; asyncpg's stubs say object
        if queue.startswith("#"):
            kind, _, subject = queue[1:].partition(":")
            for callback in self._signals.get(kind, ()):
                callback()
            for subject_callback in self._subject_signals.get(kind, ()):
                subject_callback(subject)
            return
        # Taken off the count first, whether or not a stream waits on the queue now.
        if self._own is not None and self._own.covers(pid, queue):
            return  # a send of this server's, which woke the queue itself
        if queue not in self._queues:
            return
        self.wake(queue)
        if self._own is None or not self._own.own(pid):
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
                # This connection's listings start empty (the last one's rows are
                # cleared by the next listen_to); streams list their queues as they wait.
                self._listed.clear()
                self._to_list.clear()
                if self._own is not None:
                    self._own.forget()  # sent while listed on the last connection
                self._connected.set()
                log.info("listening for wake-ups on channel %r", CHANNEL)
                # Notifications sent while disconnected are gone: look at every queue,
                # and let every worker look for work.
                for queue in list(self._queues):
                    self.wake(queue)
                for callbacks in self._signals.values():
                    for callback in callbacks:
                        callback()
                for subject_callbacks in self._subject_signals.values():
                    for subject_callback in subject_callbacks:
                        subject_callback("")
                listing = asyncio.create_task(self._list_forever(conn), name="postbox-list")
                listing.add_done_callback(functools.partial(self._listing_ended, lost=lost))
                try:
                    while not lost.is_set():
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(lost.wait(), self._safety_interval)
                        if not lost.is_set():
                            await self._safety_poll(conn)
                            await self._unlist_idle(conn)
                finally:
                    listing.cancel()
                    await asyncio.gather(listing, return_exceptions=True)
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
        await self._wake_ready(conn, waiting)

    async def _wake_ready(self, conn: asyncpg.Connection, queues: list[str]) -> None:
        async with self._conn_lock:
            ready = await conn.fetch(
                "SELECT postbox.ready_queues($1::text[])", queues, timeout=self._safety_interval
            )
        for (queue,) in ready:
            self.wake(queue)

    @staticmethod
    def _listing_ended(task: asyncio.Task[None], lost: asyncio.Event) -> None:
        """A listing that failed takes the connection down: a new one lists afresh."""
        if not task.cancelled() and task.exception() is not None:
            log.warning("wake-up listing failed: %r", task.exception())
        lost.set()

    async def _list_forever(self, conn: asyncpg.Connection) -> None:
        """Lists the queues streams start waiting on, then looks at them itself for the
        sends that raced the listing (see the module's docstring)."""
        loop = asyncio.get_running_loop()
        looks: set[asyncio.Task[None]] = set()
        try:
            while True:
                await self._list_requested.wait()
                self._list_requested.clear()
                queues = sorted(self._to_list)
                async with self._conn_lock:
                    await conn.execute("SELECT postbox.listen_to($1::text[])", queues)
                    # The snapshot, then an id drawn after it: above every id that a
                    # transaction in progress at the snapshot can have.
                    drawn = await conn.fetchrow(
                        "SELECT pg_current_snapshot()::text, pg_current_xact_id()::text::bigint"
                    )
                    assert drawn is not None  # a SELECT without FROM has its row
                    snapshot, drawn_after = drawn
                now = loop.time()
                for queue in queues:
                    self._to_list.discard(queue)
                    self._listed[queue] = now
                await self._wake_ready(conn, queues)  # committed before the listing
                look = asyncio.create_task(
                    self._look_once_ended(conn, queues, snapshot, drawn_after)
                )
                looks.add(look)
                self.looks_pending += 1
                look.add_done_callback(self._look_done)
                look.add_done_callback(looks.discard)
        finally:
            for look in looks:
                look.cancel()

    def _look_done(self, _look: asyncio.Task[None]) -> None:
        self.looks_pending -= 1

    async def _look_once_ended(
        self, conn: asyncpg.Connection, queues: list[str], snapshot: str, drawn_after: int
    ) -> None:
        """Looks at `queues` once the transactions in progress at `snapshot` have ended,
        or gives up after the safety interval, whose poll covers the rest. A snapshot
        lists the ids in progress below its xmax (one past the newest id to have ended)
        and counts every id from there on as in progress without listing it: those up
        to `drawn_after`, an id drawn after the snapshot, are looked at as well."""
        deadline = asyncio.get_running_loop().time() + self._safety_interval
        delay, longest = _ENDED_POLL
        try:
            while True:
                async with self._conn_lock:
                    ended = await conn.fetchval(ENDED, snapshot, drawn_after)
                if ended:
                    await self._wake_ready(conn, queues)
                    return
                if asyncio.get_running_loop().time() > deadline:
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, longest)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Lost with its connection (reconnecting wakes every queue), or failed:
            # the safety poll still finds the queues' messages.
            log.warning("could not look at newly listed queues %s: %r", queues[:10], exc)

    async def _unlist_idle(self, conn: asyncpg.Connection) -> None:
        """Takes off the listings of queues no stream has waited on for a while."""
        cutoff = asyncio.get_running_loop().time() - LISTED_LINGER
        idle = [
            queue
            for queue, waited in self._listed.items()
            if waited < cutoff and not (queue in self._queues and self._queues[queue].waiters)
        ]
        if not idle:
            return
        async with self._conn_lock:
            await conn.execute("SELECT postbox.unlisten($1::text[])", idle)
        for queue in idle:
            self._listed.pop(queue, None)
            if self._own is not None:
                self._own.forget(queue)  # a send that missed the listing does not notify
