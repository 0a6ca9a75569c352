"""Claims messages for a receiving stream and gives back what the stream could not deliver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

import grpc

from postbox_server.db.engine import Engine, Record
from postbox_server.db.wakeup import WakeHub
from postbox_server.errors import ApiError
from postbox_server.services.receive.scan_floors import ScanFloors

log = logging.getLogger(__name__)

_Claimed = TypeVar("_Claimed")

# While the database is away a continuous stream looks again as soon as the wake-up
# listener has reconnected, or after this many seconds at the latest.
_OUTAGE_RETRY = 5.0


# Room in a response beyond its messages' bodies and attributes (which the engine
# counts with 256 bytes each for ids, receipt and times): the response's own framing.
_RESPONSE_FRAMING = 16 * 1024


def claim_budget(max_response_size: int) -> int:
    """What one claim may hold (the engine's max_bytes): one response's worth, so a
    stream holds at most the bodies of the response it is sending."""
    return max_response_size - _RESPONSE_FRAMING


class Claims:
    def __init__(self, engine: Engine, hub: WakeHub, *, max_response_size: int) -> None:
        self.engine = engine
        self.hub = hub
        self.floors = ScanFloors(engine.receive_floor)
        self.max_bytes = claim_budget(max_response_size)

    async def claim(
        self,
        queue: str,
        count: int,
        visibility_timeout: timedelta | None,
        consumer_id: str | None = None,
    ) -> list[Record]:
        """Claims up to `count` messages that fit one response (or one message larger than
        that) for the consumer named consumer_id; more_left() tells whether others were
        left for the next claim. If the client goes away meanwhile, gives them back before
        leaving."""
        return await self._delivered_or_released(
            queue,
            self.engine.receive(
                queue,
                count,
                visibility_timeout,
                self.floors.get(queue),
                self.max_bytes,
                consumer_id,
            ),
            lambda rows: rows,
        )

    async def delete_and_claim(
        self,
        queue: str,
        receipts: list[str],
        count: int,
        visibility_timeout: timedelta | None,
        ended: Callable[[asyncio.Future[tuple[list[str], list[Record]]]], None] | None = None,
        consumer_id: str | None = None,
    ) -> tuple[list[str], list[Record]]:
        """Deletes settled messages (an outcome per receipt) and claims as claim() does,
        in one transaction. `ended` is called with the engine's call when it ends, even
        if the caller is cancelled before."""
        running = asyncio.ensure_future(
            self.engine.delete_and_receive(
                queue,
                receipts,
                count,
                visibility_timeout,
                self.floors.get(queue),
                self.max_bytes,
                consumer_id,
            )
        )
        if ended is not None:
            running.add_done_callback(ended)
        return await self._delivered_or_released(queue, running, lambda result: result[1])

    async def _delivered_or_released(
        self,
        queue: str,
        call: Awaitable[_Claimed],
        claimed: Callable[[_Claimed], Sequence[Record]],
    ) -> _Claimed:
        """The call's result; if the caller is cancelled meanwhile, what it claimed (the
        rows claimed() finds in its result) is released once the call has finished."""
        running = asyncio.ensure_future(call)
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):  # a failed call claimed nothing
                rows = claimed(await running)
                if rows:
                    await self.release(queue, rows)
            raise

    async def next_visible_at(self, queue: str) -> datetime | None:
        """When the queue's next message becomes visible (None: nothing is waiting)."""
        return await self.engine.next_visible_at(queue, self.floors.get(queue))

    async def release(self, queue: str, rows: Sequence[Record]) -> None:
        """Makes claimed messages that never reached the client visible again at once."""
        try:
            await asyncio.shield(self.engine.release(queue, [row["receipt"] for row in rows]))
        except Exception as exc:  # they become visible when their timeout runs out
            log.warning(
                "could not release %d undelivered messages of %r: %r", len(rows), queue, exc
            )
        else:
            self.hub.wake(queue)

    async def ride_out(self, error: ApiError) -> None:
        """A long-lived stream outlives a database outage: it waits for the database to
        answer again and goes on. Any other error ends it."""
        if error.code != grpc.StatusCode.UNAVAILABLE or error.paused:
            raise error
        if self.hub.listening:
            # The listener has not noticed the outage yet: do not spin on a dead pool.
            await asyncio.sleep(1.0)
        await self.hub.until_listening(_OUTAGE_RETRY)


def more_left(rows: Sequence[Record]) -> bool:
    """Whether a claim stopped at the response size with deliverable messages left."""
    return bool(rows) and rows[0]["more"]
