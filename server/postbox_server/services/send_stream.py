"""SendStream: single sends as messages of one long-lived stream rather than calls.

A unary Send pays gRPC's cost of a call in client and server alike, and at 64
concurrent callers that cost, not the database, bounds the rate. On this stream a
send is one request message: each goes through the same group commit as Send
(postbox_server/db/group_commit.py), so the sends of many callers share commits, and each
is answered only after its own message committed, or with its own error.

A request may carry several sends (`more`): the authorisation interceptor hands each
on as a request of its own (auth.rules.parts_of), checked and paced alone, so this call
sees one send per request. A reader task takes them off the stream, at most
MAX_IN_PROGRESS unanswered at a time (then it stops reading, so the client's writes
wait: gRPC's flow control), and starts a task per send; the answers of the sends that
finished together go out in one response. When the server shuts down, the stream stops
reading, answers what it read and ends with UNAVAILABLE at once: an idle stream of every
connected client would otherwise hold the shutdown for its whole grace period.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.rpc import status_pb2
from postbox.v1 import message_service_pb2 as pb

from postbox_server.errors import ApiError, Refused, invalid

MAX_IN_PROGRESS = 1000

Send = Callable[[pb.SendRequest], Awaitable[pb.SendResponse]]
# A send of the stream: a request, or one of the `more` a request carried.
Sent = pb.SendStreamRequest | pb.SendStreamEntry


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
        self, requests: AsyncIterator[Sent | Refused], closing: Awaitable[None]
    ) -> AsyncIterator[pb.SendStreamResponse]:
        """The responses of the stream until the client half-closes, the stream breaks, or
        `closing` returns (the server shuts down)."""
        reading = asyncio.create_task(self._read(requests))
        closed = asyncio.ensure_future(closing)
        ending = asyncio.create_task(self._end(reading, closed))
        ending.add_done_callback(lambda _: self._answers.put_nowait(None))
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
            await ending  # raises what broke the stream
        finally:
            for task in (reading, closed, ending, *self._sending):
                task.cancel()
            await asyncio.gather(reading, closed, ending, return_exceptions=True)

    async def _end(self, reading: asyncio.Task[None], closed: asyncio.Future[None]) -> None:
        """Once the client half-closed, the stream broke or the server shuts down: waits
        until every send read so far is answered, then ends the stream."""
        await asyncio.wait([reading, closed], return_when=asyncio.FIRST_COMPLETED)
        shutting_down = not reading.done()
        if shutting_down:
            reading.cancel()  # read no more: what is not read yet was not sent
            await asyncio.gather(reading, return_exceptions=True)
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)
        if shutting_down:
            # Rather than the grace period's cut: the client learns at once, and sends
            # its unanswered messages (none read, so none committed) to another server.
            raise ApiError(
                grpc.StatusCode.UNAVAILABLE,
                "the server is shutting down; sends not answered on this stream were not "
                "sent: send them again",
            )
        reading.result()  # raises what broke the stream

    async def _read(self, requests: AsyncIterator[Sent | Refused]) -> None:
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

    async def _answer(self, request: Sent) -> None:
        try:
            sent = await self._send(request.send)
        except ApiError as error:
            self._answers.put_nowait(_failed(request.tag, error))
        else:
            self._answers.put_nowait(pb.SendStreamResult(tag=request.tag, sent=sent))
        finally:
            self._room.release()
