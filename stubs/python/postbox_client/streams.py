"""A reader of a stream topic's consumer group: batches in, acks out, a graceful stop.

A consumer group hands its batches to one reader at a time, under a lease (see
StreamService). `run(handler)` long-polls ReadStream and calls the handler with each
batch: a return acknowledges the batch (the group's cursor moves past it); an exception
leaves it unacknowledged, so it comes back, whole, once its lease runs out. At least
once per group: a handler must tolerate a batch it has seen (`delivery_count` > 1).
`stop()` ends the loop after the batch in hand. A handler may settle its batch itself,
giving some messages back (a nack) and acknowledging the rest:
`batch.ack(nack=[message.offset], nack_delay=timedelta(seconds=30))`; run() then acks
nothing more.

`StreamReader` is the asyncio reader (`AsyncClient.stream_reader`); `BlockingStreamReader`
the same for a thread (`Client.stream_reader`), whose `stop()` may be called from any
thread or from the handler.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.duration_pb2 import Duration
from postbox.v1 import stream_service_pb2

from postbox_client.errors import from_rpc_error

if TYPE_CHECKING:
    from postbox_client.client import AsyncClient, Client

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

    settled: bool = False

    async def ack(self, nack: Iterable[int] = (), nack_delay: timedelta = timedelta(0)) -> int:
        """Moves the group's cursor past this batch; returns the cursor's offset. The
        messages whose offsets are in `nack` are given back instead: they come to the
        group again, in a later batch, after `nack_delay`."""
        cursor = await self.reader.ack(self.batch, nack, nack_delay)
        self.settled = True
        return cursor


def _ack_request(
    topic: str, group: str, batch: str, nack: Iterable[int], nack_delay: timedelta
) -> stream_service_pb2.AckStreamRequest:
    return stream_service_pb2.AckStreamRequest(
        topic=topic,
        consumer_group=group,
        batch=batch,
        nack_offsets=list(nack),
        nack_delay=_duration(nack_delay),
    )


def _read_request(
    topic: str,
    group: str,
    *,
    max_messages: int = 100,
    min_messages: int = 1,
    max_batch_wait: timedelta | None = None,
    lease: timedelta = timedelta(seconds=30),
    wait_time: timedelta = timedelta(seconds=20),
) -> stream_service_pb2.ReadStreamRequest:
    request = stream_service_pb2.ReadStreamRequest(
        topic=topic,
        consumer_group=group,
        max_messages=max_messages,
        min_messages=min_messages,
        wait_time=_duration(wait_time),
        lease_duration=_duration(lease),
    )
    if max_batch_wait is not None:
        request.max_batch_wait.CopyFrom(_duration(max_batch_wait))
    return request


class StreamReader:
    def __init__(self, client: AsyncClient, topic: str, group: str, **options: Any) -> None:
        """`options`: max_messages (1-1000), min_messages, max_batch_wait, lease and
        wait_time (timedeltas), as ReadStreamRequest has them."""
        self.client = client
        self.topic = topic
        self.group = group
        self.request = _read_request(topic, group, **options)
        self._stopping = asyncio.Event()

    async def read(self) -> StreamBatch | None:
        """The group's next batch, waiting up to wait_time; None when none came."""
        response = await self.client.call(self.client.streams.ReadStream, self.request)
        if not response.batch:
            return None
        return StreamBatch(self, response.batch, list(response.messages), response.delivery_count)

    async def ack(
        self, batch: str, nack: Iterable[int] = (), nack_delay: timedelta = timedelta(0)
    ) -> int:
        request = _ack_request(self.topic, self.group, batch, nack, nack_delay)
        response = await self.client.call(self.client.streams.AckStream, request)
        return response.cursor_offset

    async def run(self, handler: Callable[[StreamBatch], Awaitable[Any]]) -> None:
        """Handles batches until stop(): a handler that returns acks its batch (unless it
        acked it itself, with nacks); one that raises leaves it to come back after its
        lease."""
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
                if not batch.settled:  # the handler may have acked it, with nacks
                    await batch.ack()

    def stop(self) -> None:
        """Ends run() after the batch in hand (its ack included)."""
        self._stopping.set()


@dataclass
class BlockingStreamBatch:
    """One batch of a consumer group, read by a BlockingStreamReader."""

    reader: BlockingStreamReader
    batch: str
    messages: list[stream_service_pb2.StreamMessage]
    delivery_count: int

    settled: bool = False

    def ack(self, nack: Iterable[int] = (), nack_delay: timedelta = timedelta(0)) -> int:
        """Moves the group's cursor past this batch; returns the cursor's offset. The
        messages whose offsets are in `nack` are given back instead: they come to the
        group again, in a later batch, after `nack_delay`."""
        cursor = self.reader.ack(self.batch, nack, nack_delay)
        self.settled = True
        return cursor


class BlockingStreamReader:
    """StreamReader for a thread: the same reads, acks and handler rules, blocking."""

    def __init__(self, client: Client, topic: str, group: str, **options: Any) -> None:
        self.client = client
        self.topic = topic
        self.group = group
        self.request = _read_request(topic, group, **options)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._waiting: grpc.Future[Any] | None = None

    def read(self) -> BlockingStreamBatch | None:
        """The group's next batch, waiting up to wait_time; None when none came or when
        stop() cut the wait short (a batch the read was about to take comes back after
        its lease)."""
        with self._lock:
            if self._stopping.is_set():
                return None
            # A future rather than a plain call, so that stop() can cancel the wait.
            waiting = self.client.streams.ReadStream.future(
                self.request, metadata=self.client.metadata
            )
            self._waiting = waiting
        try:
            response = waiting.result()
        except grpc.FutureCancelledError:
            return None
        except grpc.RpcError as error:
            if waiting.cancelled():
                return None
            raise from_rpc_error(error) from None
        finally:
            with self._lock:
                self._waiting = None
        if not response.batch:
            return None
        return BlockingStreamBatch(
            self, response.batch, list(response.messages), response.delivery_count
        )

    def ack(
        self, batch: str, nack: Iterable[int] = (), nack_delay: timedelta = timedelta(0)
    ) -> int:
        request = _ack_request(self.topic, self.group, batch, nack, nack_delay)
        return self.client.call(self.client.streams.AckStream, request).cursor_offset

    def run(self, handler: Callable[[BlockingStreamBatch], Any]) -> None:
        """Handles batches until stop(): a handler that returns acks its batch (unless it
        acked it itself, with nacks); one that raises leaves it to come back after its
        lease."""
        while not self._stopping.is_set():
            batch = self.read()
            if batch is None:
                continue
            try:
                handler(batch)
            except Exception:
                log.exception(
                    "handler failed on batch %s of %s/%s; it comes back after its lease",
                    batch.batch, self.topic, self.group,
                )  # fmt: skip
            else:
                if not batch.settled:  # the handler may have acked it, with nacks
                    batch.ack()

    def stop(self) -> None:
        """Ends run() after the batch in hand (its ack included); a read waiting for a
        batch is cancelled at once. Safe from any thread."""
        with self._lock:
            self._stopping.set()
            if self._waiting is not None:
                self._waiting.cancel()
