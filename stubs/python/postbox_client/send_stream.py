"""Every `AsyncClient.send` of a client over one MessageService.SendStream, and every
batch (`send_batch`, the Producer's) over one SendBatchStream.

A unary Send or SendBatch costs a gRPC call in client and server alike, and with many
concurrent callers those calls, not the database, bound the rate. On a stream a send or
a batch is part of a request message, with a tag: the sends that callers start while a
write is under way go together in the next request (a batch goes alone). The server
answers each tag once what it carries committed (sends that arrive together share a
commit), or with its own error.

A stream opens with the first request and opens again after it ends. When it breaks,
the requests not yet answered fail with Unavailable: they may or may not have
committed, as with a unary call that broke (a batch with a request id, or a send with a
deduplication id, may go again). A caller that stops waiting (it is cancelled) leaves
the stream and the other requests alone. A server without the method answers
UNIMPLEMENTED, and the client makes unary calls from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from postbox.v1 import message_service_pb2

from postbox_client.errors import PostboxError, Unavailable, from_rpc_error, from_status

# Codes a broken stream ends with that say nothing about the sends on it: their outcome
# is unknown, which a caller learns as Unavailable (retry with a deduplication id).
_BROKEN = (
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DEADLINE_EXCEEDED,
)


# Most sends of one request (the server's limit: a SendStreamRequest and its `more`).
MAX_SENDS = 1000

# The answer a caller awaits: a SendResponse, or a SendBatchResponse.
Answer = asyncio.Future[Any]
# A request not written yet: its tag, what it carries, and the future its caller awaits.
Ready = tuple[int, Any, Answer]


@dataclass
class _Stream:
    """One stream call and the requests written to it not answered yet, by tag."""

    call: Any
    waiting: dict[int, Answer] = field(default_factory=dict)
    accepted: bool = False  # the server sent its initial metadata


def _send_frame(ready: Sequence[Ready]) -> message_service_pb2.SendStreamRequest:
    """A SendStream request: the first send, and the others in its `more`."""
    (tag, first, _), more = ready[0], ready[1:]
    frame = message_service_pb2.SendStreamRequest(tag=tag, send=first)
    for tag, request, _ in more:
        frame.more.add(tag=tag, send=request)
    return frame


def _batch_frame(ready: Sequence[Ready]) -> message_service_pb2.SendBatchStreamRequest:
    [(tag, batch, _)] = ready
    return message_service_pb2.SendBatchStreamRequest(tag=tag, batch=batch)


class TaggedStream:
    """Multiplexes requests over one stream of a channel's MessageService: `method` is
    SendStream or SendBatchStream; `frame` makes one request of up to `per_frame`."""

    def __init__(
        self,
        messages: Any,
        metadata: Sequence[tuple[str, str]],
        method: str,
        frame: Callable[[Sequence[Ready]], Any],
        per_frame: int,
    ) -> None:
        self._messages = messages
        self._metadata = metadata
        self._method = method
        self._frame = frame
        self._per_frame = per_frame
        self._tags = itertools.count(1)
        self._stream: _Stream | None = None
        self._readers: set[asyncio.Task[None]] = set()
        self._writing = asyncio.Lock()  # grpc.aio takes one write at a time
        self._ready: list[Ready] = []
        self._writer: asyncio.Future[None] | None = None
        self.supported = True  # False once the server answered UNIMPLEMENTED

    @classmethod
    def of_sends(cls, messages: Any, metadata: Sequence[tuple[str, str]]) -> TaggedStream:
        return cls(messages, metadata, "SendStream", _send_frame, MAX_SENDS)

    @classmethod
    def of_batches(cls, messages: Any, metadata: Sequence[tuple[str, str]]) -> TaggedStream:
        return cls(messages, metadata, "SendBatchStream", _batch_frame, 1)

    async def send(self, request: Any) -> Any:
        """Sends one SendRequest or SendBatchRequest; its response once committed, or its
        typed error."""
        answer: Answer = asyncio.get_running_loop().create_future()
        self._ready.append((next(self._tags), request, answer))
        if self._writer is None or self._writer.done():
            # The writer, not the caller, writes: a caller cancelled during a write would
            # cancel the whole call (grpc.aio cancels a call whose write is cancelled).
            self._writer = asyncio.ensure_future(self._write_all())
        return await answer

    async def _write_all(self) -> None:
        """Writes the sends ready, as one request each time: while one write is under way
        the sends of other callers gather, and the next write takes them all."""
        async with self._writing:
            while self._ready:
                # A caller that stopped waiting before its send was written: not sent.
                taken = self._ready[: self._per_frame]
                del self._ready[: self._per_frame]
                ready = [send for send in taken if not send[2].done()]
                try:
                    await self._write(ready)
                except Exception as error:  # whatever it is, its callers must hear of it
                    for _, _, answer in ready:
                        if not answer.done():
                            answer.set_exception(error)

    async def _write(self, ready: list[Ready]) -> None:
        if not ready:
            return
        if not self.supported:  # learnt while these sends waited to be written
            error = PostboxError(f"the server has no {self._method}", grpc.StatusCode.UNIMPLEMENTED)
            for _, _, answer in ready:
                answer.set_exception(error)
            return
        frame = self._frame(ready)
        stream = self._open()
        # Waiting before the write: the stream's reader fails them if the stream ends.
        for tag, _, answer in ready:
            stream.waiting[tag] = answer
        if not stream.accepted:
            # The server's initial metadata says it took the stream. A write to a call
            # the server had already ended (no such method, a refused key) would turn
            # its status into INTERNAL (grpc/grpc#36066), hiding an UNIMPLEMENTED.
            with contextlib.suppress(grpc.RpcError):
                await stream.call.initial_metadata()
            stream.accepted = True
        # A write to a stream that ended fails; its reader fails the sends waiting on it.
        if not stream.call.done():
            with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                await stream.call.write(frame)

    def _open(self) -> _Stream:
        if self._stream is None:
            call = getattr(self._messages, self._method)(metadata=self._metadata)
            self._stream = _Stream(call)
            reader = asyncio.ensure_future(self._read(self._stream))
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)
        return self._stream

    async def _read(self, stream: _Stream) -> None:
        failure: PostboxError = Unavailable(
            f"the {self._method} stream ended before answering; send again"
        )
        try:
            async for response in stream.call:
                for result in response.results:
                    answer = stream.waiting.pop(result.tag, None)
                    if answer is None or answer.done():
                        continue  # its caller gave up
                    if result.HasField("sent"):
                        answer.set_result(result.sent)
                    else:
                        answer.set_exception(from_status(result.error))
        except grpc.RpcError as error:
            failure = from_rpc_error(error)
            if failure.code == grpc.StatusCode.UNIMPLEMENTED:
                self.supported = False
            elif failure.code in _BROKEN:
                failure = Unavailable(f"the {self._method} stream broke ({failure}); send again")
        finally:
            if self._stream is stream:
                self._stream = None  # the next send opens a new stream
            # Written to this stream and not answered: their outcome is unknown.
            for answer in stream.waiting.values():
                if not answer.done():
                    answer.set_exception(failure)
            stream.waiting.clear()

    async def close(self) -> None:
        """Half-closes the stream, after its sends, and waits for their answers."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        async with self._writing:
            stream, self._stream = self._stream, None
            if stream is not None:
                with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
                    await stream.call.done_writing()
        await asyncio.gather(*self._readers, return_exceptions=True)
