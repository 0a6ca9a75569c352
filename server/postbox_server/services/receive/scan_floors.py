"""Where each queue's receives start their walk of the ready index.

While some transaction pins the xmin horizon, every message deleted since stays in
the ready index as a dead entry, and a receive that starts at the front of a queue
visits them all: on a busy queue, receives slow down by the minute. postbox.receive_floor
finds where the live rows begin; it walks the dead entries once, so this process asks
for it every few seconds per queue and hands the answer to every receive meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

log = logging.getLogger(__name__)

# A floor is asked for again this long after the last answer at the earliest...
_REFRESH = 1.0
# ...and later when computing it took long: it may take this share of one connection.
_SHARE = 0.1
# Receives name queues that may not exist; past this many floors, start over.
_MAX_QUEUES = 10_000


@dataclass(slots=True)
class _Floor:
    at: datetime | None
    refresh_after: float  # time.monotonic()


class ScanFloors:
    """A floor per queue, refreshed in the background when a receive finds it old."""

    def __init__(self, compute: Callable[[str], Awaitable[datetime]]) -> None:
        self._compute = compute
        self._floors: dict[str, _Floor] = {}
        self._refreshing: dict[str, asyncio.Task[None]] = {}

    def get(self, queue: str) -> datetime | None:
        """The queue's floor, or None (walk from the front) until one is known."""
        floor = self._floors.get(queue)
        if (floor is None or time.monotonic() >= floor.refresh_after) and (
            queue not in self._refreshing
        ):
            task = asyncio.create_task(self._refresh(queue))
            self._refreshing[queue] = task
            task.add_done_callback(lambda _: self._refreshing.pop(queue, None))
        return None if floor is None else floor.at

    async def _refresh(self, queue: str) -> None:
        started = time.monotonic()
        try:
            at = await self._compute(queue)
        except Exception as exc:  # no such queue, an outage: walk from the front for now
            log.debug("no scan floor for %r: %r", queue, exc)
            at = None
        took = time.monotonic() - started
        if len(self._floors) >= _MAX_QUEUES:
            self._floors.clear()
        self._floors[queue] = _Floor(at, time.monotonic() + max(_REFRESH, took / _SHARE))
