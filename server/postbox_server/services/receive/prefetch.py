"""Keeps a continuous Receive stream from claiming far ahead of its consumer.

gRPC accepts a streamed batch as soon as it fits the client's HTTP/2 window, long
before the consumer reads it. A stream that claimed its next batch whenever the
last one was accepted would claim hundreds of messages per consumer, whose leases
then run out in buffers and send them round again (found by the 16-consumer
survival test: five deliveries per message with 2 s leases).

So a stream holds at most two unsettled batches: it claims the next one once the
consumer has settled (deleted, nacked, or changed the visibility of) every message
of the older one. Settling through this process is seen at once. Settling through
another replica is seen by asking the database which of the batch's receipts still
hold their message in flight, at growing intervals while the window stays full.
A consumer that settles never (it lets leases run out on purpose) is waited for at
most `patience` seconds per batch; then the older batch is forgotten and the
stream goes on.

A DeleteBatch of exactly the older batch, while its stream waits for that room,
is handed to the stream: one transaction deletes the batch and claims the next,
and the DeleteBatch answers with the deletes' outcomes once it has committed. So
a consumer of Receive and DeleteBatch costs the database one call per batch, as a
StreamingReceive consumer does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from postbox_server.errors import ApiError

# Batches a stream may have delivered and not yet seen settled.
BATCHES_AHEAD = 2
# Seconds between looks at the database while the window stays full: short at
# first (a consumer on another replica settles as fast as one here), then longer.
_FIRST_LOOK = 0.05
_LAST_LOOK = 0.5

InFlight = Callable[[list[str]], Awaitable[int]]


class HandedDeletes:
    """A DeleteBatch's receipts, handed to a stream's next claim."""

    def __init__(self, receipts: list[str]) -> None:
        self.receipts = receipts
        # The deletes' outcomes once committed with the claim; None when the stream
        # did not delete them (its claim failed, or it ended first): the DeleteBatch
        # then deletes them itself.
        self.outcomes: asyncio.Future[list[str] | None] = asyncio.get_running_loop().create_future()

    def give_back(self) -> None:
        if not self.outcomes.done():
            self.outcomes.set_result(None)

    def claimed(self, call: asyncio.Future[tuple[list[str], Any]]) -> None:
        """Done callback of the delete-and-claim call: it may outlive the stream."""
        if self.outcomes.done():
            return
        if call.cancelled() or call.exception() is not None:
            self.outcomes.set_result(None)
        else:
            self.outcomes.set_result(call.result()[0])


class Window:
    """The unsettled batches of one stream, oldest first."""

    def __init__(self, registry: Prefetch, in_flight: InFlight, queue: str) -> None:
        self._registry = registry
        self._in_flight = in_flight
        self._queue = queue
        self._batches: deque[set[str]] = deque()
        self._settled = asyncio.Event()
        self._waiting = False  # in room()
        self._handed: HandedDeletes | None = None

    def delivered(self, receipts: Iterable[str]) -> None:
        batch = set(receipts)
        self._batches.append(batch)
        self._registry.track(batch, self, batch)

    def settle(self, batch: set[str], receipt: str) -> None:
        batch.discard(receipt)
        while self._batches and not self._batches[0]:
            self._batches.popleft()
        self._settled.set()

    def hand(self, queue: str, batch: set[str], receipts: list[str]) -> HandedDeletes | None:
        """Takes a DeleteBatch's receipts for the next claim if they are the whole of
        the oldest batch (`batch`) and the stream waits for it to be settled."""
        if (
            not self._waiting
            or self._handed is not None
            or queue != self._queue
            or len(self._batches) < BATCHES_AHEAD
            or self._batches[0] is not batch
            or set(receipts) != batch
        ):
            return None
        self._handed = HandedDeletes(receipts)
        self._settled.set()
        return self._handed

    async def room(self, patience: float) -> HandedDeletes | None:
        """Returns once fewer than BATCHES_AHEAD batches are unsettled, or after `patience` s;
        with the deletes handed to the next claim, if a DeleteBatch freed the room."""
        self._waiting = True
        try:
            return await self._room(patience)
        finally:
            self._waiting = False
            self._give_back()  # left without taking them (cancelled, or settled meanwhile)

    async def _room(self, patience: float) -> HandedDeletes | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        look = _FIRST_LOOK
        while len(self._batches) >= BATCHES_AHEAD:
            if self._handed is not None:
                # Settled now as far as this stream goes: they are being deleted.
                handed, self._handed = self._handed, None
                self._forget(self._batches.popleft())
                return handed
            left = deadline - loop.time()
            if left <= 0:
                self._forget(self._batches.popleft())
                return None
            self._settled.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._settled.wait(), min(look, left))
            if self._settled.is_set() or len(self._batches) < BATCHES_AHEAD:
                continue
            # Nothing settled through this process: perhaps through another one.
            oldest = self._batches[0]
            with contextlib.suppress(ApiError):  # the database is away: wait on
                settled = await self._in_flight(list(oldest)) == 0
                # Local settles may have retired it meanwhile.
                if settled and self._batches and self._batches[0] is oldest:
                    self._forget(self._batches.popleft())
            look = min(look * 2, _LAST_LOOK)
        return None

    def _forget(self, batch: set[str]) -> None:
        self._registry.forget(batch)

    def _give_back(self) -> None:
        """Deletes handed and not taken go back to their DeleteBatch, which makes them itself."""
        if self._handed is not None:
            self._handed.give_back()
            self._handed = None

    def close(self) -> None:
        self._give_back()
        while self._batches:
            self._forget(self._batches.popleft())


class Settles(Protocol):
    """Whatever waits for delivered receipts to be settled (a Window, a streaming receive)."""

    def settle(self, token: Any, receipt: str) -> None: ...


class Prefetch:
    """Per-process map from the receipts streams delivered to whoever waits for their settling."""

    def __init__(self) -> None:
        self._owners: dict[str, tuple[Settles, Any]] = {}

    def open(self, in_flight: InFlight, queue: str) -> Window:
        """A window for a new stream of `queue`; `in_flight` counts receipts still holding
        their message."""
        return Window(self, in_flight, queue)

    def hand(self, queue: str, receipts: list[str]) -> HandedDeletes | None:
        """The receipts handed to the claim of the stream that delivered them (see Window.hand),
        or None: the caller deletes them itself."""
        entry = self._owners.get(receipts[0]) if receipts else None
        if entry is None or not isinstance(entry[0], Window):
            return None
        return entry[0].hand(queue, entry[1], receipts)

    def track(self, receipts: Iterable[str], owner: Settles, token: Any = None) -> None:
        """`owner.settle(token, receipt)` is called when one of these receipts is settled."""
        for receipt in receipts:
            self._owners[receipt] = (owner, token)

    def forget(self, receipts: Iterable[str]) -> None:
        for receipt in receipts:
            self._owners.pop(receipt, None)

    def settled(self, receipts: Iterable[str]) -> None:
        """The consumer deleted these or changed their visibility: their streams may go on."""
        for receipt in receipts:
            entry = self._owners.pop(receipt, None)
            if entry is not None:
                owner, token = entry
                owner.settle(token, receipt)
