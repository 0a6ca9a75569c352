"""A consumer over StreamingReceive: lease management, flow control and a graceful stop.

One bidirectional stream carries the messages and their settles (acks, nacks, lease
extensions), as Pub/Sub's streaming pull does; acks and nacks made within _SETTLE_LATENCY
of each other share a request. While a message is held — handed out and
not settled — the consumer extends its lease before it runs out, up to `max_lease`, so
a slow handler never sees its message delivered to someone else. Flow control: the
server claims more only while fewer than `max_outstanding_messages` are unsettled, and
the consumer stops reading the stream while the held bodies exceed
`max_outstanding_bytes`.

`run(handler)` calls the handler for each message: a return acks it, an exception nacks
it (the queue's retry backoff applies; after its max_receive_count it moves to the
dead-letter queue). `stop()` — e.g. on SIGTERM — lets running handlers finish, gives
messages not yet started back at once, and ends the stream after their settles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypedDict

import grpc
from postbox.v1 import message_pb2, message_service_pb2

from postbox_client.errors import from_rpc_error

if TYPE_CHECKING:
    from postbox_client.client import AsyncClient

log = logging.getLogger(__name__)

_GIVE_BACK_BATCH = 1000  # receipts per ChangeVisibilityBatch
# How long an ack or nack may wait for others to go in the same request (as
# google-cloud-pubsub's dispatcher batches acks): one request per message cost
# the server a database call per message.
_SETTLE_LATENCY = 0.01  # seconds


class ReceivedMessage:
    """A delivered message, held until acked, nacked or given back."""

    def __init__(self, consumer: Consumer, message: message_pb2.Message) -> None:
        self._consumer = consumer
        self.message = message

    @property
    def message_id(self) -> str:
        return self.message.message_id

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def attributes(self) -> dict[str, str | bytes]:
        return {
            name: value.binary_value if value.data_type.startswith("Binary") else value.string_value
            for name, value in self.message.attributes.items()
        }

    @property
    def receive_count(self) -> int:
        return self.message.receive_count

    @property
    def receipt(self) -> str:
        return self.message.receipt

    async def ack(self) -> None:
        """Deletes the message: it is done."""
        await self._consumer._settle(self, delete=True)

    async def nack(self) -> None:
        """Gives the message back for a retry after the queue's backoff."""
        await self._consumer._settle(self, nack=True)


@dataclass
class _Held:
    message: ReceivedMessage
    received: float  # time.monotonic()
    deadline: float  # when its current lease runs out


@dataclass
class _Stream:
    call: Any
    reader: asyncio.Task[None]
    leases: asyncio.Task[None]
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ConsumerOptions(TypedDict, total=False):
    """The keyword options of Consumer, as AsyncClient.consumer takes them."""

    max_messages: int
    max_outstanding_messages: int
    max_outstanding_bytes: int
    lease: timedelta
    max_lease: timedelta


class Consumer:
    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        *,
        # 50: claims of 10 cost server and database a call per 10 messages, and bounded
        # 8 acking handlers at a third of the rate (docs/performance/brokers.md).
        max_messages: int = 50,
        max_outstanding_messages: int = 100,
        max_outstanding_bytes: int = 64 * 1024 * 1024,
        lease: timedelta = timedelta(seconds=30),
        max_lease: timedelta = timedelta(hours=1),
    ) -> None:
        self.client = client
        self.queue = queue
        self.max_messages = max_messages
        self.max_outstanding_messages = max_outstanding_messages
        self.max_outstanding_bytes = max_outstanding_bytes
        self.lease = lease
        self.max_lease = max_lease
        self.extensions = 0  # lease extensions sent
        self.settle_requests = 0  # requests that carried acks and nacks
        self._deletes: list[str] = []  # acked, not yet sent
        self._nacks: list[str] = []
        self._settles_due: asyncio.TimerHandle | None = None
        self._flushes: set[asyncio.Task[None]] = set()
        self._held: dict[str, _Held] = {}
        self._held_bytes = 0
        self._room = asyncio.Condition()
        self._ready: asyncio.Queue[ReceivedMessage | None] = asyncio.Queue()
        self._stream: _Stream | None = None
        self._opening = asyncio.Lock()
        self._stopping = False
        self._returning: list[str] = []  # receipts of messages stop() took back unstarted
        self._failure: BaseException | None = None

    # The stream.

    async def _open(self) -> _Stream:
        # One stream for all workers: they ask at once, and the opening write yields.
        async with self._opening:
            if self._stream is None:
                call = self.client.messages.StreamingReceive(metadata=self.client.metadata)
                opening = message_service_pb2.StreamingReceiveRequest(
                    queue=self.queue,
                    max_messages=self.max_messages,
                    max_outstanding_messages=self.max_outstanding_messages,
                )
                opening.visibility_timeout.FromTimedelta(self.lease)
                await call.write(opening)
                self._stream = _Stream(
                    call,
                    asyncio.create_task(self._read(call)),
                    asyncio.create_task(self._extend_leases()),
                )
            return self._stream

    async def _read(self, call: Any) -> None:
        try:
            async for response in call:
                for message in response.batch.messages:  # none in a settle-results frame
                    await self._arrived(message)
        except grpc.RpcError as error:
            if not self._stopping:
                self._failure = from_rpc_error(error)
        finally:
            await self._ready.put(None)  # whoever waits for a message learns the stream ended

    async def _arrived(self, message: message_pb2.Message) -> None:
        if self._stopping:  # never handed out: given back once the stream has ended
            self._returning.append(message.receipt)
            return
        received = ReceivedMessage(self, message)
        now = time.monotonic()
        self._held[message.receipt] = _Held(received, now, now + self.lease.total_seconds())
        self._held_bytes += len(message.body)
        await self._ready.put(received)
        async with self._room:
            # Stop reading (so the server stops sending) while the held bodies are too many.
            await self._room.wait_for(lambda: self._held_bytes <= self.max_outstanding_bytes)

    async def _write(
        self, request: message_service_pb2.StreamingReceiveRequest, stream: _Stream | None = None
    ) -> None:
        stream = stream or self._stream
        if stream is None:
            return
        async with stream.write_lock:
            await stream.call.write(request)

    async def _settle(
        self, message: ReceivedMessage, *, delete: bool = False, nack: bool = False
    ) -> None:
        held = self._held.pop(message.receipt, None)
        if held is None:
            return  # settled already: settling twice changes nothing
        self._held_bytes -= len(message.body)
        if delete:
            self._deletes.append(message.receipt)
        elif nack:
            self._nacks.append(message.receipt)
        if len(self._deletes) + len(self._nacks) >= self.max_messages:
            await self._send_settles(self._stream)
        elif self._settles_due is None:
            self._settles_due = asyncio.get_running_loop().call_later(
                _SETTLE_LATENCY, self._send_settles_soon
            )
        async with self._room:
            self._room.notify_all()

    def _send_settles_soon(self) -> None:
        self._settles_due = None
        flush = asyncio.ensure_future(self._send_settles(self._stream))
        self._flushes.add(flush)
        flush.add_done_callback(self._flushes.discard)

    async def _send_settles(self, stream: _Stream | None) -> None:
        """Sends the acks and nacks waiting, in one request on `stream`."""
        if self._settles_due is not None:
            self._settles_due.cancel()
            self._settles_due = None
        if not (self._deletes or self._nacks):
            return
        request = message_service_pb2.StreamingReceiveRequest(
            delete_receipts=self._deletes, nack_receipts=self._nacks
        )
        self._deletes, self._nacks = [], []
        self.settle_requests += 1
        try:
            await self._write(request, stream)
        except (grpc.RpcError, asyncio.InvalidStateError):
            # The stream has ended (its reader reports why): the messages come back
            # when their leases run out, as for any settle that never arrived.
            log.debug(
                "settles for %d messages not sent: the stream ended",
                len(request.delete_receipts) + len(request.nack_receipts),
            )

    async def _give_back(self, receipts: list[str]) -> None:
        """Makes messages visible again now, for another consumer. A unary call after the
        stream ended: given back on the stream, the stream itself would claim them again."""
        for start in range(0, len(receipts), _GIVE_BACK_BATCH):
            request = message_service_pb2.ChangeVisibilityBatchRequest(queue=self.queue)
            for receipt in receipts[start : start + _GIVE_BACK_BATCH]:
                request.entries.add(receipt=receipt).visibility_timeout.SetInParent()  # zero
            await self.client.call(
                self.client.messages.ChangeVisibilityBatch, request, repeatable=True
            )

    async def _extend_leases(self) -> None:
        """Before half a lease is left, extends each held message's lease by a full one."""
        lease = self.lease.total_seconds()
        while True:
            await asyncio.sleep(lease / 4)
            now = time.monotonic()
            due = [
                held
                for held in self._held.values()
                if held.deadline - now < lease / 2
                and now - held.received < self.max_lease.total_seconds()
            ]
            if not due:
                continue
            request = message_service_pb2.StreamingReceiveRequest()
            for held in due:
                entry = request.visibility_changes.add(receipt=held.message.receipt)
                entry.visibility_timeout.FromTimedelta(self.lease)
                held.deadline = now + lease
            self.extensions += len(due)
            await self._write(request)

    # Taking messages.

    async def _next(self) -> ReceivedMessage | None:
        if self._stream is None:
            if self._stopping:
                return None  # stopped: never a new stream
            await self._open()
        message = await self._ready.get()
        if message is None:
            await self._ready.put(None)  # for the other workers
            if self._failure is not None:
                raise self._failure
        return message

    def __aiter__(self) -> AsyncIterator[ReceivedMessage]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[ReceivedMessage]:
        while (message := await self._next()) is not None:
            yield message

    async def run(
        self, handler: Callable[[ReceivedMessage], Awaitable[Any]], *, concurrency: int = 8
    ) -> None:
        """Handles messages with `concurrency` handlers at once until stop(); a handler that
        returns acks its message, one that raises nacks it."""

        async def work() -> None:
            while (message := await self._next()) is not None:
                try:
                    await handler(message)
                except Exception:
                    log.exception("handler failed on message %s; nacked", message.message_id)
                    await message.nack()
                else:
                    await message.ack()

        try:
            await asyncio.gather(*(work() for _ in range(concurrency)))
        finally:
            await self._close()

    def stop(self) -> None:
        """Begins a graceful stop: no new message is handed out, those waiting go back."""
        if self._stopping:
            return
        self._stopping = True
        waiting: list[str] = []
        while not self._ready.empty():
            message = self._ready.get_nowait()
            if message is not None:
                waiting.append(message.receipt)
                held = self._held.pop(message.receipt, None)
                if held is not None:
                    self._held_bytes -= len(message.body)
        self._ready.put_nowait(None)
        self._returning.extend(waiting)  # given back by _close, once the stream has ended

    async def _close(self) -> None:
        """Ends the stream after its settles (the server answers them, then ends it), then
        gives back what was never handled."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        self._stopping = True
        stream.leases.cancel()
        async with self._room:
            self._room.notify_all()
        await self._send_settles(stream)
        await asyncio.gather(*self._flushes)
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            async with stream.write_lock:
                await stream.call.done_writing()
        try:
            await asyncio.wait_for(stream.reader, timeout=30)
        except asyncio.TimeoutError:
            stream.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stream.leases
        # Handed out but never settled (an iteration left early): back now, not at lease end.
        returning = [*self._returning, *self._held]
        self._returning.clear()
        self._held.clear()
        self._held_bytes = 0
        if returning:
            await self._give_back(returning)

    async def close(self) -> None:
        self.stop()
        await self._close()

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
