"""A batching producer: many `send()` calls, few batches.

Every gRPC call costs CPU in client and server alike, so single sends from many callers
are bounded by calls, not by the database. The producer's batches go as requests of the
client's one SendBatchStream (postbox_client.send_stream; unary SendBatch calls to a
server without it), each with SendBatch's outcome. The producer sends at once while fewer
than `max_in_flight` batches are on their way (the sends of one turn of the event loop
go together); otherwise what its callers send gathers until a batch comes back, for at
most `linger` seconds, or until `max_entries` messages or `max_bytes` of bodies wait,
and goes in one batch. Each caller's future gets its own message id; a message
the server refuses (it names the entry) fails its own future, and the rest of the
batch goes again without it.

With `idempotent` (the default) each batch gets a request id (32 random hex digits), so a batch
that failed with UNAVAILABLE is sent again under the same id without duplicating what
the first attempt may have committed (within the queue's deduplication window): the
server answers the first attempt's message ids. The id costs the server one row per
batch, where a deduplication id per message cost one per message and halved the rate
(issue 48). A batch sent again without an entry the server refused (none of it was
committed) gets a new id. Messages keep the deduplication ids they are given; a
message with a message_group_id and none (a FIFO queue needs one) gets one of its own,
as before request ids. A message that is nothing but a body waits as its bytes, and
its entry is made when its batch is: building an entry for each send() cost more than
the rest of it.
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from postbox.v1 import message_service_pb2

from postbox_client.errors import InvalidArgument
from postbox_client.fields import send_fields

if TYPE_CHECKING:
    from postbox_client.client import AsyncClient

MAX_BATCH = 1000  # the server's largest SendBatch
# How the server names the entry of a batch it refused: "entry 3: ttl is ...".
_REFUSED_ENTRY = re.compile(r"entry (\d+): (.*)", re.DOTALL)
_ID_BYTES = 16  # random bytes of a deduplication id the producer makes: 32 hex digits

# What waits to be sent: a message that is nothing but a body, as its bytes, or an entry.
Waiting: TypeAlias = "bytes | message_service_pb2.SendBatchEntry"


class ProducerOptions(TypedDict, total=False):
    """The keyword options of Producer, as AsyncClient.producer takes them."""

    max_entries: int
    max_bytes: int
    linger: float
    max_in_flight: int
    idempotent: bool


class Producer:
    def __init__(
        self,
        client: AsyncClient,
        queue: str,
        *,
        max_entries: int = 500,
        max_bytes: int = 4 * 1024 * 1024,
        linger: float = 0.005,
        max_in_flight: int = 4,
        idempotent: bool = True,
    ) -> None:
        if not 1 <= max_entries <= MAX_BATCH:
            raise ValueError(f"max_entries is {max_entries}; it must be 1 to {MAX_BATCH}")
        self.client = client
        self.queue = queue
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.linger = linger
        self.idempotent = idempotent
        self.batches_sent = 0  # batches sent (attempts refused for an entry count too)
        self._pending: list[tuple[Waiting, asyncio.Future[str]]] = []
        self._pending_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self.max_in_flight = max_in_flight
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def send(self, body: bytes | str, **fields: Any) -> asyncio.Future[str]:
        """Queues a message; the future resolves to its id once its batch committed."""
        if self._closed:
            raise RuntimeError("the producer is closed")
        waiting: Waiting
        if isinstance(body, str):
            body = body.encode()
        if fields or not isinstance(body, bytes):
            # A FIFO queue needs a deduplication id per message: the request id is not one.
            fifo = bool(fields.get("message_group_id"))
            if self.idempotent and fifo and not fields.get("deduplication_id"):
                fields["deduplication_id"] = os.urandom(_ID_BYTES).hex()
            # A body of another type raises here, to its caller, not in the batch.
            waiting = message_service_pb2.SendBatchEntry(**send_fields(body, **fields))
            size = len(waiting.body)
        else:
            waiting = body
            size = len(body)
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending.append((waiting, future))
        self._pending_bytes += size
        if len(self._pending) >= self.max_entries or self._pending_bytes >= self.max_bytes:
            self._dispatch()
        elif self._timer is None:
            # With a batch slot free, go after this turn of the loop (the sends made in it
            # join); with every slot busy, a finishing batch sends what waits, or the linger.
            free = self._in_flight < self.max_in_flight
            self._timer = asyncio.get_running_loop().call_later(
                0 if free else self.linger, self._dispatch
            )
        return future

    def _dispatch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending and (self._in_flight < self.max_in_flight or self._closed):
            batch = self._pending[: self.max_entries]
            self._pending = self._pending[self.max_entries :]
            self._pending_bytes -= sum(map(_body_size, (waiting for waiting, _ in batch)))
            self._in_flight += 1
            task = asyncio.create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _request(self, batch: list[tuple[Waiting, Any]]) -> tuple[Any, bool]:
        """The SendBatchRequest of a batch, and whether it may be repeated (it has a
        request id, or every entry has a deduplication id). Made once: a retry sends
        the same ids again."""
        request = message_service_pb2.SendBatchRequest(queue=self.queue)
        if self.idempotent:
            request.request_id = os.urandom(_ID_BYTES).hex()
        entries, add = request.entries, request.entries.add
        repeatable = True
        for waiting, _ in batch:
            if isinstance(waiting, bytes):
                add(body=waiting)
                repeatable = False
            else:
                entries.append(waiting)
                repeatable = repeatable and bool(waiting.deduplication_id)
        return request, self.idempotent or repeatable

    async def _send(self, batch: list[tuple[Waiting, Any]]) -> None:
        self.batches_sent += 1
        try:
            request, repeatable = self._request(batch)
            client = self.client
            while True:
                try:
                    response = await client.call(
                        client.send_batch_request, request, repeatable=repeatable
                    )
                    break
                except InvalidArgument as error:
                    # A batch is all or nothing: the server names the entry it refused
                    # and committed none. That entry's caller gets the error, the others'
                    # messages go again without it.
                    refused = _refused_entry(error, len(batch))
                    if refused is None:
                        raise
                    index, reason = refused
                    (_, future) = batch.pop(index)
                    del request.entries[index]
                    if self.idempotent:  # another batch now: its id must not answer this one
                        request.request_id = os.urandom(_ID_BYTES).hex()
                    if not future.done():
                        future.set_exception(InvalidArgument(reason, error.code))
                    if not batch:
                        return
                    self.batches_sent += 1
        except Exception as error:
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
        else:
            for (_, future), message_id in zip(batch, response.message_ids, strict=True):
                if not future.done():
                    future.set_result(message_id)
        finally:
            self._in_flight -= 1
            if self._pending:
                self._dispatch()  # what gathered while this batch was on its way

    async def flush(self) -> None:
        """Sends what waits and returns once every batch so far has an outcome."""
        while self._pending or self._tasks:
            self._dispatch()
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Flushes, then refuses further sends."""
        self._closed = True
        await self.flush()

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _body_size(waiting: Waiting) -> int:
    return len(waiting) if isinstance(waiting, bytes) else len(waiting.body)


def _refused_entry(error: InvalidArgument, entries: int) -> tuple[int, str] | None:
    """The index of the entry a refusal names, and the reason without the index."""
    match = _REFUSED_ENTRY.match(error.message)
    if match is None or not 0 <= int(match[1]) < entries:
        return None
    return int(match[1]), match[2]
