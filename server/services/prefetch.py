"""Keeps a continuous Receive stream from claiming far ahead of its consumer.

gRPC accepts a streamed batch as soon as it fits the client's HTTP/2 window, long
before the consumer reads it. A stream that claimed its next batch whenever the
last one was accepted would claim hundreds of messages per consumer, whose leases
then run out in buffers and send them round again (found by the 16-consumer
survival test: five deliveries per message with 2 s leases).

So a stream holds at most two unsettled batches: it claims the next one once the
consumer has settled (deleted, or changed the visibility of) every message of the
older one through this process. A consumer that settles elsewhere (another
replica) or never (one that lets leases run out on purpose) is waited for at most
`patience` seconds per batch; then the older batch is forgotten and the stream
goes on, so such a consumer gets a batch per `patience` at worst.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterable

# Batches a stream may have delivered and not yet seen settled.
BATCHES_AHEAD = 2


class Window:
    """The unsettled batches of one stream, oldest first."""

    def __init__(self, registry: Prefetch) -> None:
        self._registry = registry
        self._batches: deque[set[str]] = deque()
        self._settled = asyncio.Event()

    def delivered(self, receipts: Iterable[str]) -> None:
        batch = set(receipts)
        self._batches.append(batch)
        for receipt in batch:
            self._registry._owners[receipt] = (self, batch)

    def _settle(self, batch: set[str], receipt: str) -> None:
        batch.discard(receipt)
        while self._batches and not self._batches[0]:
            self._batches.popleft()
        self._settled.set()

    async def room(self, patience: float) -> None:
        """Returns once fewer than BATCHES_AHEAD batches are unsettled, or after `patience` s."""
        if len(self._batches) < BATCHES_AHEAD:
            return
        self._settled.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wait(), patience)
        if len(self._batches) >= BATCHES_AHEAD:
            self._forget(self._batches.popleft())

    async def _wait(self) -> None:
        while len(self._batches) >= BATCHES_AHEAD:
            await self._settled.wait()
            self._settled.clear()

    def _forget(self, batch: set[str]) -> None:
        for receipt in batch:
            self._registry._owners.pop(receipt, None)

    def close(self) -> None:
        while self._batches:
            self._forget(self._batches.popleft())


class Prefetch:
    """Per-process map from the receipts streams delivered to the stream and batch."""

    def __init__(self) -> None:
        self._owners: dict[str, tuple[Window, set[str]]] = {}

    def open(self) -> Window:
        return Window(self)

    def settled(self, receipts: Iterable[str]) -> None:
        """The consumer deleted these or changed their visibility: their streams may go on."""
        for receipt in receipts:
            owner = self._owners.pop(receipt, None)
            if owner is not None:
                window, batch = owner
                window._settle(batch, receipt)
