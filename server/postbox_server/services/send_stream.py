"""SendStream and SendBatchStream: sends, or batches, as messages of one long-lived
stream rather than calls.

A unary Send or SendBatch pays gRPC's cost of a call in client and server alike
(and the interceptors' once per call), and at 64 concurrent callers that cost, not the
database, bounds the rate. On these streams a send or a batch is one request message,
tagged by the client: each is handled exactly as its unary call would be (a send
through the same group commit as Send, postbox_server/db/group_commit.py, so the sends
of many callers share commits; a batch in one transaction, all or nothing, with its
request id), and answered only after it committed, or with its own error.

A SendStream request may carry several sends (`more`): the authorisation interceptor
hands each on as a request of its own (auth.rules.parts_of), checked and paced alone,
so this call sees one send per request. A reader task takes the requests off the
stream, at most `max_in_progress` unanswered at a time (then it stops reading, so the
client's writes wait: gRPC's flow control), and starts a task per request; the answers
of the requests that finished together go out in one response. When the server shuts
down, the stream stops reading, answers what it read and ends with UNAVAILABLE at once:
an idle stream of every connected client would otherwise hold the shutdown for its
whole grace period.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc
from google.rpc import status_pb2

from postbox_server.errors import ApiError, Refused, crashed, invalid

MAX_SENDS_IN_PROGRESS = 1000  # SendStream's, a stream
MAX_BATCHES_IN_PROGRESS = 16  # SendBatchStream's, a stream (up to 16,000 messages)

Request = TypeVar("Request")  # SendRequest or SendBatchRequest
Result = Any  # SendStreamResult or SendBatchStreamResult: a tag, then sent or error
Response = Any  # SendStreamResponse or SendBatchStreamResponse: results


class TaggedStreamCall(Generic[Request]):
    """One SendStream or SendBatchStream call: reads tagged requests, answers each once
    what it carries committed. `field` names the request's payload (`send`, `batch`),
    which `handle` sends; `result` and `response` are the call's answer messages."""

    def __init__(
        self,
        handle: Callable[[Request], Awaitable[Any]],
        field: str,
        result: type[Result],
        response: type[Response],
        max_in_progress: int,
    ) -> None:
        self._handle = handle
        self._field = field
        self._result = result
        self._response = response
        self._answers: asyncio.Queue[Result | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(max_in_progress)
        self._sending: set[asyncio.Task[None]] = set()

    def _failed(self, tag: int, error: ApiError) -> Result:
        status = status_pb2.Status(code=error.code.value[0], message=error.message)
        return self._result(tag=tag, error=status)

    async def run(
        self, requests: AsyncIterator[Any], closing: Awaitable[None]
    ) -> AsyncIterator[Response]:
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
                    yield self._response(results=answered)
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

    async def _read(self, requests: AsyncIterator[Any]) -> None:
        async for request in requests:
            if isinstance(request, Refused):  # the authorisation interceptor's verdict
                self._answers.put_nowait(self._failed(request.request.tag, request.error))
                continue
            if not request.HasField(self._field):
                error = invalid(
                    f"request with tag {request.tag} has no {self._field}: set its `{self._field}`"
                )
                self._answers.put_nowait(self._failed(request.tag, error))
                continue
            await self._room.acquire()
            task = asyncio.create_task(self._answer(request))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _answer(self, request: Any) -> None:
        try:
            sent = await self._handle(getattr(request, self._field))
        except ApiError as error:
            self._answers.put_nowait(self._failed(request.tag, error))
        except Exception as error:  # its caller must hear of it, as of a unary call's
            self._answers.put_nowait(self._failed(request.tag, crashed(error)))
        else:
            self._answers.put_nowait(self._result(tag=request.tag, sent=sent))
        finally:
            self._room.release()
