"""StreamingReceive: batches out and settles in on one bidirectional stream.

A consumer of Receive pays one call per DeleteBatch, and on this stack a call
costs several times what a stream message does. Here settles travel on the
stream, and they also drive the flow control: the stream claims more only while
fewer than `max_outstanding_messages` delivered messages are unsettled, so it
never claims far ahead of its consumer (the guessing that prefetch.py does for
Receive streams is not needed).

Two tasks share the stream. The response generator claims and sends batches;
the settle task reads requests, settles them in the database and queues their
results, which the generator sends in request order. Settle results and freed
room stir the generator; queue wake-ups reach it only while it has room, so a
full stream never takes a wake-up that another stream could use.

A request that only deletes is offered to the generator first (a Handoff): the
room its deletes free is what the next claim fills, so the generator deletes
and claims in one engine call, which costs about what either call costs alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
from postbox.v1 import message_service_pb2 as pb

from postbox_server.db.engine import Engine, Record
from postbox_server.db.wakeup import WakeHub
from postbox_server.errors import ApiError, invalid
from postbox_server.observability import tracing
from postbox_server.services import convert
from postbox_server.services.receive.claims import Claims, more_left
from postbox_server.services.receive.prefetch import Prefetch

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGES = 10
MAX_OUTSTANDING = 10_000
MAX_SETTLES = 1000
# Requests read ahead of their settling, at most: beyond, gRPC's flow control
# holds the client back. Enough to gather a consumer's one-message deletes.
MAX_WAITING_REQUESTS = 100
MAX_VISIBILITY = timedelta(hours=12)

_FIRST_ONLY = (
    "queue",
    "max_messages",
    "visibility_timeout",
    "max_outstanding_messages",
    "consumer_id",
)

# How long the settle task waits for the generator to take its deletes before it
# deletes them itself: the generator takes them at once unless it is claiming
# (milliseconds) or sending to a client that has stopped reading (then the deletes
# must not wait on the client).
HANDOFF_WAIT = 0.1


@dataclass(frozen=True)
class Opening:
    """What the first request of a stream asks for."""

    queue: str
    max_messages: int
    visibility_timeout: timedelta | None
    max_outstanding: int
    consumer_id: str | None  # the engine checks it with the first claim

    @classmethod
    def parse(cls, request: pb.StreamingReceiveRequest) -> Opening:
        if not request.queue:
            raise invalid("the first request must name the queue")
        max_messages = request.max_messages or DEFAULT_MAX_MESSAGES
        if not 1 <= max_messages <= 1000:
            raise invalid(f"max_messages is {max_messages}; it must be 1 to 1000")
        timeout = convert.optional_timedelta(request, "visibility_timeout")
        if timeout is not None and not timedelta(0) <= timeout <= MAX_VISIBILITY:
            raise invalid(f"visibility_timeout is {timeout}; it must be 0 s to 12 h")
        outstanding = request.max_outstanding_messages or 2 * max_messages
        if not 1 <= outstanding <= MAX_OUTSTANDING:
            raise invalid(
                f"max_outstanding_messages is {outstanding}; it must be 1 to {MAX_OUTSTANDING:,}"
            )
        return cls(request.queue, max_messages, timeout, outstanding, request.consumer_id or None)


class Stir(asyncio.Event):
    """An Event that also calls the callbacks in `callbacks` when set: a waiter that
    waits on several things adds a callback rather than a task per thing."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: set[Callable[[], None]] = set()

    def set(self) -> None:
        super().set()
        for callback in list(self.callbacks):
            callback()


class Outstanding:
    """Receipts delivered on one stream and not yet settled, with their lease deadlines.

    A message stops counting when it is settled (on the stream, or by a call to this
    process, which the Prefetch registry reports) or when its lease runs out: then
    it is visible again and holds nothing.
    """

    def __init__(self, registry: Prefetch) -> None:
        self._registry = registry
        self._deadlines: dict[str, float] = {}
        self.freed = Stir()

    def delivered(self, receipts: Iterable[str], lease: float) -> None:
        deadline = asyncio.get_running_loop().time() + lease
        receipts = list(receipts)
        for receipt in receipts:
            self._deadlines[receipt] = deadline
        self._registry.track(receipts, self)

    def settle(self, token: Any, receipt: str) -> None:
        if self._deadlines.pop(receipt, None) is not None:
            self.freed.set()

    def extend(self, receipt: str, lease: float) -> None:
        if receipt in self._deadlines:
            self._deadlines[receipt] = asyncio.get_running_loop().time() + lease

    def count(self) -> int:
        now = asyncio.get_running_loop().time()
        expired = [r for r, deadline in self._deadlines.items() if deadline <= now]
        for receipt in expired:
            del self._deadlines[receipt]
        self._registry.forget(expired)
        return len(self._deadlines)

    def among(self, receipts: Iterable[str]) -> int:
        """How many of these receipts count."""
        return sum(1 for receipt in receipts if receipt in self._deadlines)

    def until_next_expiry(self) -> float | None:
        if not self._deadlines:
            return None
        return max(0.0, min(self._deadlines.values()) - asyncio.get_running_loop().time())

    def close(self) -> None:
        self._registry.forget(self._deadlines)
        self._deadlines.clear()


class Handoff:
    """Deletes of one or more requests (`sizes` receipts each), offered by the settle
    task to the generator's next claim."""

    def __init__(self, deletes: list[str], sizes: list[int]) -> None:
        self.deletes = deletes
        self.sizes = sizes
        self.taken = asyncio.Event()
        # True once the generator has deleted them and queued their results; False
        # when it gives them back for the settle task to delete alone.
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def give_back(self) -> None:
        if not self.done.done():
            self.done.set_result(False)


class StreamingReceive:
    """One StreamingReceive call."""

    def __init__(self, engine: Engine, hub: WakeHub, claims: Claims, registry: Prefetch) -> None:
        self.engine = engine
        self.hub = hub
        self.claims = claims
        self.registry = registry
        self.outstanding = Outstanding(registry)
        self.results: asyncio.Queue[pb.StreamingReceiveResponse] = asyncio.Queue()
        self._offer: Handoff | None = None
        self._look: asyncio.Task[None] | None = None
        self._look_again = False

    async def run(
        self, requests: AsyncIterator[pb.StreamingReceiveRequest]
    ) -> AsyncIterator[pb.StreamingReceiveResponse]:
        first = await anext(aiter(requests), None)
        if first is None:
            raise invalid("the stream ended before its first request named the queue")
        opening = Opening.parse(first)
        lease = opening.visibility_timeout
        if lease is None:  # the queue's, which also says NOT_FOUND at once
            lease = (await self.engine.get_queue(opening.queue))["visibility_timeout"]
        settling = asyncio.ensure_future(self._settle_all(opening, first, requests))
        try:
            async for response in self._deliver(opening, lease.total_seconds(), settling):
                yield response
        finally:
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await settling
            if self._look is not None:
                self._look.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._look
            self.outstanding.close()

    async def _deliver(
        self, opening: Opening, lease: float, settling: asyncio.Future[None]
    ) -> AsyncIterator[pb.StreamingReceiveResponse]:
        queue = opening.queue
        first_claim = True
        # The wake-up generation of the last claim that found fewer messages than it
        # could take, while no wake-up has come since: nothing new can be visible.
        exhausted_at: int | None = None
        while not self.hub.closing:
            while not self.results.empty():
                yield self.results.get_nowait()
            if settling.done():
                settling.result()  # the settle task's error ends the stream
                return  # the client half-closed, and the results of its settles are out
            handoff = self._take_offer()
            self.outstanding.freed.clear()
            want = min(opening.max_messages, opening.max_outstanding - self.outstanding.count())
            if want <= 0:
                if handoff is not None:
                    handoff.give_back()
                await self._until_stirred(settling, self.outstanding.until_next_expiry())
                continue
            if exhausted_at is not None and exhausted_at == self.hub.generation(queue):
                if handoff is not None:
                    handoff.give_back()
                # Stirred by settles or freed room only: that claim was not short of
                # room, so claiming again would find nothing (every send, timer and
                # NOTIFY that could change that wakes the queue).
                await self._until_stirred(
                    settling, self.outstanding.until_next_expiry(), (queue, exhausted_at)
                )
                continue
            exhausted_at = None
            generation = self.hub.generation(queue)
            try:
                rows = await self._claim(opening, want, handoff)
            except ApiError as error:
                if error.paused and not first_claim:
                    rows = []  # paused after it opened: wait on
                elif error.paused:
                    raise
                else:
                    await self.claims.ride_out(error)
                    continue
            first_claim = False
            if rows:
                receipts = [row["receipt"] for row in rows]
                # Counted before the client can settle them.
                self.outstanding.delivered(receipts, lease)
                batch = [convert.message(row) for row in rows]
                tracing.delivered(queue, batch)
                while not self.results.empty():  # those of the deletes claimed with
                    yield self.results.get_nowait()
                try:
                    yield pb.StreamingReceiveResponse(batch=pb.MessageBatch(messages=batch))
                except BaseException:
                    self.registry.settled(receipts)
                    await self.claims.release(queue, rows)
                    raise
                if len(rows) == want or more_left(rows):
                    self.hub.wake(queue)  # there may be more: let another stream look too
                    continue
            # Fewer than asked: nothing else was visible, so wait rather than claim
            # again; a wake-up since `generation` ends the wait at once. When the next
            # message becomes visible is looked up meanwhile, not before the wait: a
            # send that commits during that query would wait for it too.
            self._look_ahead(queue)
            if self.hub.woken_only_for(queue, generation, (str(row["message_id"]) for row in rows)):
                generation += 1  # its wake-up came after the claim took its messages
            exhausted_at = generation
            await self._until_stirred(
                settling, self.outstanding.until_next_expiry(), (queue, generation)
            )

    def _look_ahead(self, queue: str) -> None:
        """Sets the queue's timer for when its next message becomes visible (delayed, or
        in flight), in a task of its own; one look at a time, and once more if asked
        again meanwhile (a claim since may have changed the answer)."""
        if self._look is not None and not self._look.done():
            self._look_again = True
            return
        self._look = asyncio.create_task(self._looking(queue))

    async def _looking(self, queue: str) -> None:
        again = True
        while again:
            self._look_again = False
            generation = self.hub.generation(queue)
            try:
                next_visible = await self.claims.next_visible_at(queue)
            except ApiError as error:
                # The next claim meets the same database and rides its error out;
                # the hub's safety poll covers a timer this look could not set.
                log.debug("no look at when %s's next message is visible: %s", queue, error)
                return
            # A time already past means visible rows: locked by another session (the
            # hub's timer looks again soon) or, when the queue was woken during the
            # look, most likely a send that committed meanwhile, whose wake-up has a
            # stream claim it (and look again, if short). The timer would then only
            # wake the queue for an empty claim after that one: one claim in ten, loaded.
            woken = self.hub.generation(queue) != generation
            if next_visible is not None and (
                next_visible > datetime.now(timezone.utc) or not woken
            ):
                self.hub.wake_at(queue, next_visible)
            again = self._look_again

    def _take_offer(self) -> Handoff | None:
        """The settle task's pending deletes, now the generator's; they stop counting
        as outstanding, as they will once deleted."""
        handoff, self._offer = self._offer, None
        if handoff is not None:
            handoff.taken.set()
            self.registry.settled(handoff.deletes)
        return handoff

    async def _claim(self, opening: Opening, want: int, handoff: Handoff | None) -> list[Record]:
        """Claims, deleting the handed-off receipts in the same call."""
        queue, timeout, consumer_id = opening.queue, opening.visibility_timeout, opening.consumer_id
        if handoff is None:
            return await self.claims.claim(queue, want, timeout, consumer_id)
        try:
            outcomes, rows = await self.claims.delete_and_claim(
                queue, handoff.deletes, want, timeout, consumer_id=consumer_id
            )
        except ApiError:
            # Undone with the claim: the settle task deletes them on its own, and
            # the claim's error takes the course a plain claim's would.
            handoff.give_back()
            raise
        self._queue_delete_results(handoff.sizes, convert.batch_results(outcomes))
        handoff.done.set_result(True)
        return rows

    async def _until_stirred(
        self,
        settling: asyncio.Future[None],
        timeout: float | None,
        wake_up: tuple[str, int] | None = None,
    ) -> None:
        """Waits for settle results or freed room, the end of the settle task, a wake-up
        of the queue (when given), the server's shutdown, or the timeout.

        One future, set by a callback of each: a wake-up reaches the claim after one
        hop of the event loop, not the several of a task per source and their
        cancelling (a send's latency pays for each hop while the loop is busy)."""
        watching = None
        if wake_up is not None:
            watching = self.hub.watch(*wake_up)
            if watching is None:
                return  # woken since, or shutting down
        loop = asyncio.get_running_loop()
        stirred: asyncio.Future[None] = loop.create_future()

        def stir(_: object = None) -> None:
            if not stirred.done():
                stirred.set_result(None)

        freed, closed = self.outstanding.freed, self.hub.closed()
        sources: list[asyncio.Future[Any]] = [settling, closed]
        if watching is not None:
            sources.append(watching)
        for source in sources:
            source.add_done_callback(stir)
        freed.callbacks.add(stir)
        timer = loop.call_later(timeout, stir) if timeout is not None else None
        try:
            if freed.is_set():
                return
            await stirred
        finally:
            if timer is not None:
                timer.cancel()
            freed.callbacks.discard(stir)
            for source in sources:
                source.remove_done_callback(stir)
            if watching is not None and wake_up is not None:
                # A wake-up taken by a stream that ends (or stops) goes on to the next.
                ending = settling.done() or not stirred.done()
                self.hub.unwatch(wake_up[0], watching, pass_on=ending)

    async def _settle_all(
        self,
        opening: Opening,
        first: pb.StreamingReceiveRequest,
        requests: AsyncIterator[pb.StreamingReceiveRequest],
    ) -> None:
        """Settles the requests in order. Those that only delete and arrive while a
        settle is in the database go to it together next: a client that deletes each
        message on its own (as a consumer with several handlers does) gets one call
        per batch of them, not per message."""
        arrived = Arrivals()
        reading = asyncio.ensure_future(arrived.read(first, requests))
        try:
            while (request := await arrived.next()) is not None:
                if not _deletes_only(request):
                    await self._settle(opening.queue, request)
                    continue
                group = [request]
                total = len(request.delete_receipts)
                while (following := arrived.peek()) is not None and _deletes_only(following):
                    if total + len(following.delete_receipts) > MAX_SETTLES:
                        break
                    group.append(arrived.take())
                    total += len(following.delete_receipts)
                await self._delete(opening, group)
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading

    async def _delete(self, opening: Opening, requests: list[pb.StreamingReceiveRequest]) -> None:
        """The deletes of requests that only delete, in one call; a result per request."""
        sizes = [len(request.delete_receipts) for request in requests]
        deletes = [receipt for request in requests for receipt in request.delete_receipts]
        if self._frees_a_batch(opening, deletes) and await self._handed_off(deletes, sizes):
            return
        outcomes = await self._outcomes(self.engine.delete_batch, opening.queue, deletes)
        self.registry.settled(deletes)
        self._queue_delete_results(sizes, outcomes)

    async def _settle(self, queue: str, request: pb.StreamingReceiveRequest) -> None:
        deletes = list(request.delete_receipts)
        nacks = list(request.nack_receipts)
        changes = list(request.visibility_changes)
        if not (deletes or nacks or changes):
            return
        for name, entries in (
            ("delete_receipts", deletes),
            ("nack_receipts", nacks),
            ("visibility_changes", changes),
        ):
            if len(entries) > MAX_SETTLES:
                raise invalid(f"{name} has {len(entries)} entries; at most {MAX_SETTLES} a request")
        timeouts = []
        for index, change in enumerate(changes):
            timeout = convert.optional_timedelta(change, "visibility_timeout")
            if timeout is None:
                raise invalid(f"visibility_changes entry {index}: visibility_timeout is required")
            timeouts.append(timeout)
        receipts = [change.receipt for change in changes]
        results = pb.SettleResults(
            deletes=await self._outcomes(self.engine.delete_batch, queue, deletes),
            nacks=await self._outcomes(self.engine.nack_batch, queue, nacks),
            visibility_changes=await self._outcomes(
                self.engine.change_visibility_batch, queue, receipts, timeouts
            ),
        )
        for receipt, timeout, status in zip(
            receipts, timeouts, results.visibility_changes, strict=True
        ):
            if timeout and status.code == grpc.StatusCode.OK.value[0]:
                self.outstanding.extend(receipt, timeout.total_seconds())
            else:
                self.registry.settled([receipt])
        self.registry.settled(deletes + nacks)
        if nacks or any(not timeout for timeout in timeouts):
            self.hub.wake(queue)
        self._queue_results(results)

    def _frees_a_batch(self, opening: Opening, deletes: list[str]) -> bool:
        """Whether the stream has room for a whole batch once these are deleted. Only
        then do deletes wait for a claim: a consumer that deletes one message at a
        time would otherwise have every delete wait for a claim of one."""
        held = self.outstanding.count() - self.outstanding.among(deletes)
        return opening.max_outstanding - held >= opening.max_messages

    async def _handed_off(self, deletes: list[str], sizes: list[int]) -> bool:
        """Offers the deletes to the generator's next claim; True once it has deleted
        them, False if it did not take them in time or gave them back."""
        handoff = self._offer = Handoff(deletes, sizes)
        self.outstanding.freed.set()  # stirs a waiting generator
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(handoff.taken.wait(), HANDOFF_WAIT)
        if not handoff.taken.is_set():
            self._offer = None
            return False
        return await handoff.done

    def _queue_results(self, results: pb.SettleResults) -> None:
        self.results.put_nowait(pb.StreamingReceiveResponse(settle_results=results))
        self.outstanding.freed.set()

    def _queue_delete_results(self, sizes: list[int], statuses: list[Any]) -> None:
        start = 0
        for size in sizes:
            self._queue_results(pb.SettleResults(deletes=statuses[start : start + size]))
            start += size

    @staticmethod
    async def _outcomes(settle: Any, queue: str, receipts: list[str], *args: Any) -> list[Any]:
        """Per-receipt statuses of one settle call; UNAVAILABLE for each when the database
        does not answer (the client settles again), other errors end the stream."""
        if not receipts:
            return []
        try:
            return convert.batch_results(await settle(queue, receipts, *args))
        except ApiError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE or error.paused:
                raise
            return convert.batch_results(["unavailable"] * len(receipts))


class Arrivals:
    """A stream's requests as they arrive, read ahead of their settling (up to
    MAX_WAITING_REQUESTS), so that the settle task can see which have arrived. An
    error reading them (a request that breaks a rule, or one that cannot be decoded)
    takes its place in the order: the requests before it are settled first."""

    def __init__(self) -> None:
        self._waiting: deque[pb.StreamingReceiveRequest | Exception] = deque()
        self._arrived = asyncio.Event()
        self._room = asyncio.Semaphore(MAX_WAITING_REQUESTS)
        self._ended = False

    async def read(
        self, first: pb.StreamingReceiveRequest, requests: AsyncIterator[pb.StreamingReceiveRequest]
    ) -> None:
        try:
            await self._room.acquire()
            self._add(first)
            async for request in requests:
                if set_fields := [f for f in _FIRST_ONLY if _is_set(request, f)]:
                    self._add(
                        invalid(f"{', '.join(set_fields)} may be set in the first request only")
                    )
                    return
                await self._room.acquire()
                self._add(request)
        except Exception as error:
            self._add(error)
        finally:
            self._ended = True
            self._arrived.set()

    def _add(self, item: pb.StreamingReceiveRequest | Exception) -> None:
        self._waiting.append(item)
        self._arrived.set()

    async def next(self) -> pb.StreamingReceiveRequest | None:
        """The next request to settle; None once the client has half-closed and every
        request is out. Raises the error that ended the reading, in its turn."""
        while not self._waiting:
            if self._ended:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        return self.take()

    def peek(self) -> pb.StreamingReceiveRequest | None:
        """The request after the one being settled, if it has arrived."""
        if self._waiting and isinstance(self._waiting[0], pb.StreamingReceiveRequest):
            return self._waiting[0]
        return None

    def take(self) -> pb.StreamingReceiveRequest:
        item = self._waiting.popleft()
        if isinstance(item, Exception):
            raise item
        self._room.release()
        return item


def _deletes_only(request: pb.StreamingReceiveRequest) -> bool:
    """A request that only deletes, within the limit (_settle says what is wrong with
    one beyond it)."""
    return 0 < len(request.delete_receipts) <= MAX_SETTLES and not (
        request.nack_receipts or request.visibility_changes
    )


def _is_set(request: pb.StreamingReceiveRequest, field: str) -> bool:
    if field == "visibility_timeout":
        return request.HasField(field)
    return bool(getattr(request, field))
