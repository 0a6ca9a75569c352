"""Group commit: concurrent single sends share one transaction, so one commit serves many calls.

A commit costs a WAL flush and a round trip no matter how many rows it carries, so
at high concurrency single Sends are limited by commits, not by work. Sends that
arrive while the database is busy wait (at most `max_wait`, at most `max_size` of
them) and go in together; a Send arriving at an idle server goes at once.

The promises of a lone Send still hold for each caller:
  * it is answered only after the shared transaction committed, with its own id;
  * a message the engine refuses fails only its own caller: the transaction is
    rolled back (nothing of it was committed) and sent again with each message
    in its own savepoint, so the others commit and the refused one gets its error;
  * when the commit's outcome is unknown (the connection broke), every caller
    gets UNAVAILABLE, as a lone Send would; a retry may then duplicate, never lose;
  * a caller that goes away takes its message out if it was not sent yet, and
    otherwise changes nothing for the rest.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc

from server.db.engine import Connection, Engine, OutgoingMessage
from server.db.errors import translate
from server.errors import ApiError
from server.observability import metrics

log = logging.getLogger(__name__)


def _entry_fault(error: ApiError) -> bool:
    """Whether a statement failed over its own input, rather than the database being away."""
    return error.code != grpc.StatusCode.UNAVAILABLE


# What a send returns: the message id, and whether it was a duplicate (deduplication).
Sent = tuple[str, bool]


@dataclass
class _Waiting:
    queue: str
    message: OutgoingMessage
    future: asyncio.Future[Sent] = field(repr=False)

    def settle(self, outcome: Sent | ApiError) -> None:
        if self.future.done():  # the caller went away meanwhile
            return
        if isinstance(outcome, ApiError):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


class GroupCommit:
    """Coalesces concurrent sends of one process into shared transactions."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_wait: float = 0.002,
        max_size: int = 256,
        max_in_flight: int = 2,
    ) -> None:
        self._engine = engine
        self._max_wait = max_wait
        self._max_size = max_size
        # Transactions committing at once: two keeps the database busy while the
        # next group fills, without taking the pool from receives and deletes.
        self._max_in_flight = max_in_flight
        self._waiting: list[_Waiting] = []
        self._in_flight = 0
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, queue: str, message: OutgoingMessage) -> Sent:
        """Sends one message; returns (id, duplicate) once its transaction has committed."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(queue, message, loop.create_future())
        self._waiting.append(waiting)
        if len(self._waiting) >= self._max_size or self._in_flight == 0:
            # Idle database: go now, after the other sends of this loop turn joined.
            self._schedule(0.0)
        else:
            self._schedule(self._max_wait)
        return await waiting.future

    def _schedule(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        if self._timer is not None:
            if self._timer.when() <= loop.time() + delay:
                return
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        self._timer = None
        while self._waiting and self._in_flight < self._max_in_flight:
            group, rest = self._waiting[: self._max_size], self._waiting[self._max_size :]
            self._waiting = rest
            group = [w for w in group if not w.future.done()]  # callers gone before sending
            if not group:
                continue
            self._in_flight += 1
            task = asyncio.create_task(self._commit(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _commit(self, group: list[_Waiting]) -> None:
        metrics.GROUP_COMMIT_SIZE.observe(len(group))
        try:
            outcomes = await self._run(group)
        except Exception as exc:
            error = translate(exc)
            for waiting in group:
                waiting.settle(error)
        else:
            for waiting, outcome in zip(group, outcomes, strict=True):
                waiting.settle(outcome)
        finally:
            self._in_flight -= 1
            if self._waiting:
                self._flush()  # the next group filled up while this one committed

    async def _run(self, group: list[_Waiting]) -> list[Sent | ApiError]:
        async with self._engine.connection() as conn:
            try:
                if len({w.queue for w in group}) == 1:
                    # One send_batch statement is a transaction of its own: no BEGIN
                    # and COMMIT round trips, which a lone Send would otherwise pay.
                    return list(await self._send_by_queue(conn, group))
                async with conn.transaction():
                    return list(await self._send_by_queue(conn, group))
            except ApiError as error:
                if not _entry_fault(error) or len(group) == 1:
                    raise
                log.debug("group of %d rolled back (%s); isolating", len(group), error.message)
            # Rolled back, so nothing was committed: send again, each in a savepoint.
            outcomes: list[Sent | ApiError] = []
            async with conn.transaction():
                for waiting in group:
                    try:
                        async with conn.transaction():
                            (sent,) = await self._send_by_queue(conn, [waiting])
                        outcomes.append(sent)
                    except ApiError as error:
                        if not _entry_fault(error):
                            raise
                        outcomes.append(error)
            return outcomes

    async def _send_by_queue(self, conn: Connection, group: list[_Waiting]) -> list[Sent]:
        """Results in group order; one send_batch per queue, in name order so that
        concurrent groups take the queues' locks in the same order."""
        positions: dict[str, list[int]] = {}
        for position, waiting in enumerate(group):
            positions.setdefault(waiting.queue, []).append(position)
        results: list[Sent] = [("", False)] * len(group)
        for queue in sorted(positions):
            messages = [group[p].message for p in positions[queue]]
            ids, duplicates = await self._engine.send_batch(queue, messages, conn=conn)
            sent = zip(ids, duplicates, strict=True)
            for position, result in zip(positions[queue], sent, strict=True):
                results[position] = result
        return results
