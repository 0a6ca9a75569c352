"""MessageService.Receive: a server stream that long-polls for one batch, or with
RECEIVE_MODE_CONTINUOUS delivers batches until its client leaves, it goes idle or it
has delivered max_total_messages. It claims through Claims, waits on the wake-up hub
between claims, and in continuous mode keeps its window of unsettled batches (Prefetch).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import timedelta

import grpc
from postbox.v1 import message_service_pb2 as pb

from postbox_server.db.engine import Engine
from postbox_server.db.wakeup import WakeHub
from postbox_server.errors import ApiError, invalid
from postbox_server.observability import tracing
from postbox_server.services import convert
from postbox_server.services.receive.claims import Claims, more_left
from postbox_server.services.receive.prefetch import Prefetch

DEFAULT_MAX_MESSAGES = 10
MAX_WAIT = timedelta(seconds=300)
MAX_IDLE = timedelta(hours=24)


# A long poll ends before the client's deadline, so the client gets an orderly
# (empty) end of stream rather than DEADLINE_EXCEEDED: a tenth of the time the
# client gave, within 50 ms to 1 s, because a loaded server answers later than it
# meant to by a part of the wait rather than by a fixed amount.
def _deadline_margin(client_left: float) -> float:
    return min(max(client_left / 10, 0.05), 1.0)


# How long a continuous stream waits for its consumer to settle an older batch
# before claiming more (see prefetch.py).
_PATIENCE = 1.0
_DEFAULT_LEASE = timedelta(seconds=30)  # stands for the queue's when the request has none


class ReceiveCall:
    """One Receive call, from its request to its last batch."""

    def __init__(self, engine: Engine, hub: WakeHub, claims: Claims, prefetch: Prefetch) -> None:
        self.engine = engine
        self.hub = hub
        self.claims = claims
        self.prefetch = prefetch

    async def run(
        self, request: pb.ReceiveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncGenerator[pb.ReceiveResponse, None]:
        queue = request.queue
        max_messages = request.max_messages or DEFAULT_MAX_MESSAGES
        visibility_timeout = convert.optional_timedelta(request, "visibility_timeout")
        continuous = request.mode == pb.RECEIVE_MODE_CONTINUOUS
        wait = convert.optional_timedelta(request, "wait_time")
        if wait is not None and not timedelta(0) <= wait <= MAX_WAIT:
            raise invalid(
                f"wait_time is {wait.total_seconds():g} s; it must be 0 to {MAX_WAIT.seconds} s"
            )
        idle = convert.optional_timedelta(request, "idle_timeout")
        if idle is not None and not timedelta(milliseconds=1) <= idle <= MAX_IDLE:
            raise invalid(f"idle_timeout is {idle.total_seconds():g} s; it must be 1 ms to 24 h")
        if request.HasField("max_total_messages") and request.max_total_messages < 1:
            raise invalid(
                f"max_total_messages is {request.max_total_messages}; it must be at least 1, "
                "or unset for no limit"
            )

        loop = asyncio.get_running_loop()
        started = loop.time()
        remaining = request.max_total_messages if request.HasField("max_total_messages") else None
        wait_until = None if wait is None else started + wait.total_seconds()
        idle_until = None if idle is None else started + idle.total_seconds()
        consumer_id = request.consumer_id or None  # the engine checks it with the first claim
        window = self.prefetch.open(self.engine.receipts_in_flight, queue) if continuous else None
        if window is not None:
            # types-grpcio's _DoneCallback is a class, not a Protocol: no function matches it.
            context.add_done_callback(lambda _: window.close())  # type: ignore[arg-type]
            # Half a lease at most, so an unsettled batch's messages are not yet due again.
            patience = min(_PATIENCE, (visibility_timeout or _DEFAULT_LEASE).total_seconds() / 2)
        first_poll = True
        while not self.hub.closing:
            handed = None if window is None else await window.room(patience)
            generation = self.hub.generation(queue)
            want = min(max_messages, remaining) if remaining else max_messages
            try:
                if handed is None:
                    rows = await self.claims.claim(queue, want, visibility_timeout, consumer_id)
                else:
                    _, rows = await self.claims.delete_and_claim(
                        queue,
                        handed.receipts,
                        want,
                        visibility_timeout,
                        handed.claimed,
                        consumer_id=consumer_id,
                    )
            except ApiError as error:
                # A new stream on a paused queue fails; one already waiting waits on.
                if error.paused and not first_poll:
                    rows = []
                else:
                    await self._ride_out(error, continuous)
                    continue
            first_poll = False
            if rows:
                batch = [convert.message(row) for row in rows]
                tracing.delivered(queue, batch)
                try:
                    yield pb.ReceiveResponse(messages=batch)
                except BaseException:
                    # The stream died with this batch in hand: it never reached the client.
                    await self.claims.release(queue, rows)
                    raise
                if window is not None:
                    window.delivered(row["receipt"] for row in rows)
                more = more_left(rows)
                full = len(rows) == want or more
                if full:
                    self.hub.wake(queue)  # there may be more: let another stream look too
                if not continuous:
                    # One response, within the response size: a message that never
                    # reached the client is then always the one given back above.
                    return
                if remaining:
                    remaining -= len(rows)
                    if remaining == 0:
                        return
                if idle is not None:
                    idle_until = loop.time() + idle.total_seconds()
                if full:
                    continue
                # Fewer than asked: nothing else was visible, so wait rather than poll
                # again; a wake-up since `generation` ends the wait at once.

            if continuous:
                until = idle_until
            else:
                if wait_until is None:
                    queue_row = await self.engine.get_queue(queue)
                    wait_until = started + queue_row["receive_wait_time"].total_seconds()
                until = wait_until
                client_left = context.time_remaining()
                if client_left is not None:
                    until = min(until, loop.time() + client_left - _deadline_margin(client_left))
            timeout = None if until is None else until - loop.time()
            if timeout is not None and timeout <= 0:
                return
            try:
                next_visible = await self.claims.next_visible_at(queue)
            except ApiError as error:
                await self._ride_out(error, continuous)
                continue
            if next_visible is not None:
                self.hub.wake_at(queue, next_visible)
            await self.hub.wait(queue, generation, timeout)

    async def _ride_out(self, error: ApiError, continuous: bool) -> None:
        """Any error ends a long poll; a continuous stream rides out an outage."""
        if not continuous:
            raise error
        await self.claims.ride_out(error)
