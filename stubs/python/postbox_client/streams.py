"""A reader of a stream topic's consumer group: batches in, acks out, a graceful stop.

A consumer group hands its batches to one reader at a time, under a lease (see
StreamService). `run(handler)` long-polls ReadStream and calls the handler with each
batch: a return acknowledges the batch (the group's cursor moves past it); an exception
leaves it unacknowledged, so it comes back, whole, once its lease runs out. At least
once per group: a handler must tolerate a batch it has seen (`delivery_count` > 1).
`stop()` ends the loop after the batch in hand.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from google.protobuf.duration_pb2 import Duration
from postbox.v1 import stream_service_pb2

if TYPE_CHECKING:
    from postbox_client.client import AsyncClient

log = logging.getLogger(__name__)


def _duration(value: timedelta) -> Duration:
    duration = Duration()
    duration.FromTimedelta(value)
    return duration


@dataclass
class StreamBatch:
    """One batch of a consumer group: its messages in read order, and its ack token."""

    reader: StreamReader
    batch: str
    messages: list[stream_service_pb2.StreamMessage]
    delivery_count: int

    async def ack(self) -> int:
        """Moves the group's cursor past this batch; returns the cursor's offset."""
        return await self.reader.ack(self.batch)


class StreamReader:
    def __init__(
        self,
        client: AsyncClient,
        topic: str,
        group: str,
        *,
        max_messages: int = 100,
        min_messages: int = 1,
        max_batch_wait: timedelta | None = None,
        lease: timedelta = timedelta(seconds=30),
        wait_time: timedelta = timedelta(seconds=20),
    ) -> None:
        self.client = client
        self.topic = topic
        self.group = group
        self.request = stream_service_pb2.ReadStreamRequest(
            topic=topic,
            consumer_group=group,
            max_messages=max_messages,
            min_messages=min_messages,
            wait_time=_duration(wait_time),
            lease_duration=_duration(lease),
        )
        if max_batch_wait is not None:
            self.request.max_batch_wait.CopyFrom(_duration(max_batch_wait))
        self._stopping = asyncio.Event()

    async def read(self) -> StreamBatch | None:
        """The group's next batch, waiting up to wait_time; None when none came."""
        response = await self.client.call(self.client.streams.ReadStream, self.request)
        if not response.batch:
            return None
        return StreamBatch(self, response.batch, list(response.messages), response.delivery_count)

    async def ack(self, batch: str) -> int:
        request = stream_service_pb2.AckStreamRequest(
            topic=self.topic, consumer_group=self.group, batch=batch
        )
        response = await self.client.call(self.client.streams.AckStream, request)
        return response.cursor_offset

    async def run(self, handler: Callable[[StreamBatch], Awaitable[Any]]) -> None:
        """Handles batches until stop(): a handler that returns acks its batch; one that
        raises leaves it to come back after its lease."""
        while not self._stopping.is_set():
            reading = asyncio.ensure_future(self.read())
            stopping = asyncio.ensure_future(self._stopping.wait())
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not reading.done():
                # A stop while waiting: the read is abandoned; a batch it was about to
                # take comes back after its lease.
                reading.cancel()
                break
            batch = reading.result()
            if batch is None:
                continue
            try:
                await handler(batch)
            except Exception:
                log.exception(
                    "handler failed on batch %s of %s/%s; it comes back after its lease",
                    batch.batch, self.topic, self.group,
                )  # fmt: skip
            else:
                await batch.ack()

    def stop(self) -> None:
        """Ends run() after the batch in hand (its ack included)."""
        self._stopping.set()
