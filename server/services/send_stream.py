"""SendStream: single sends as messages of one long-lived stream rather than calls.

A unary Send pays gRPC's cost of a call in client and server alike, and at 64
concurrent callers that cost, not the database, bounds the rate. On this stream a
send is one request message: each goes through the same group commit as Send
(server/db/group_commit.py), so the sends of many callers share commits, and each
is answered only after its own message committed, or with its own error.

A reader task takes requests off the stream, at most MAX_IN_PROGRESS unanswered at a
time (then it stops reading, so the client's writes wait: gRPC's flow control), and
starts a task per send; the answers of the sends that finished together go out in
one response.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from google.rpc import status_pb2
from postbox.v1 import message_service_pb2 as pb

from server.errors import ApiError, Refused, invalid

MAX_IN_PROGRESS = 1000

Send = Callable[[pb.SendRequest], Awaitable[pb.SendResponse]]


def _failed(tag: int, error: ApiError) -> pb.SendStreamResult:
    status = status_pb2.Status(code=error.code.value[0], message=error.message)
    return pb.SendStreamResult(tag=tag, error=status)


class SendStreamCall:
    """One SendStream call: reads sends, answers each once its message committed."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._answers: asyncio.Queue[pb.SendStreamResult | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(MAX_IN_PROGRESS)
        self._sending: set[asyncio.Task[None]] = set()

    async def run(
        self, requests: AsyncIterator[pb.SendStreamRequest | Refused]
    ) -> AsyncIterator[pb.SendStreamResponse]:
        reader = asyncio.create_task(self._read(requests))
        # The reader's end (the client half-closed, or the stream broke) ends the answers.
        reader.add_done_callback(lambda _: self._answers.put_nowait(None))
        try:
            ended = False
            while not ended:
                # What is answered by now goes in one response: a group's sends together.
                results = [await self._answers.get()]
                while not self._answers.empty():
                    results.append(self._answers.get_nowait())
                ended = results[-1] is None
                answered = [result for result in results if result is not None]
                if answered:
                    yield pb.SendStreamResponse(results=answered)
            await reader  # raises what broke the stream
        finally:
            reader.cancel()
            for task in self._sending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    async def _read(self, requests: AsyncIterator[pb.SendStreamRequest | Refused]) -> None:
        async for request in requests:
            if isinstance(request, Refused):  # the authorisation interceptor's verdict
                self._answers.put_nowait(_failed(request.request.tag, request.error))
                continue
            if not request.HasField("send"):
                error = invalid(f"request with tag {request.tag} has no send: set its `send`")
                self._answers.put_nowait(_failed(request.tag, error))
                continue
            await self._room.acquire()
            task = asyncio.create_task(self._answer(request))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        # Half-closed: every send read so far is answered before the stream ends.
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def _answer(self, request: pb.SendStreamRequest) -> None:
        try:
            sent = await self._send(request.send)
        except ApiError as error:
            self._answers.put_nowait(_failed(request.tag, error))
        else:
            self._answers.put_nowait(pb.SendStreamResult(tag=request.tag, sent=sent))
        finally:
            self._room.release()
