"""Per-queue counts of this process (sent, received, deleted, receive latency), added to
the engine's postbox.queue_activity every few seconds: the source of the queue_throughput
view and of the rates GetQueue reports.

The engine counts none of these itself: a write to a shared row per send would make
concurrent senders wait on one another. So the calls that already count for Prometheus
count here too, in memory, and a background task flushes the deltas, one statement per
flush for every queue that had any, off the request path. Every process adds its own,
so the processes of `serve --workers N` and every replica add up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from postbox_server.db.engine import Counts, Engine

__all__ = ["ACTIVITY", "Activity", "Counts", "flush"]


class Activity:
    """What this process counted since its last flush, by queue name."""

    def __init__(self) -> None:
        self._pending: dict[str, Counts] = {}

    def _counts(self, queue: str) -> Counts:
        counts = self._pending.get(queue)
        if counts is None:
            counts = self._pending[queue] = Counts()
        return counts

    def sent(self, queue: str, amount: int) -> None:
        if amount:
            self._counts(queue).sent += amount

    def deleted(self, queue: str, amount: int) -> None:
        if amount:
            self._counts(queue).deleted += amount

    def received(self, queue: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Deliveries, from postbox.receive's rows: a first delivery (receive_count 1)
        adds its wait from enqueue to delivery to the latency figures."""
        counts: Counts | None = None
        for row in rows:
            counts = counts or self._counts(queue)
            counts.received += 1
            if row["receive_count"] == 1:
                first: datetime = row["first_received_at"]
                latency = max((first - row["enqueued_at"]).total_seconds(), 0.0)
                counts.latency_sum += latency
                counts.latency_count += 1
                counts.latency_max = max(counts.latency_max or 0.0, latency)

    def take(self) -> dict[str, Counts]:
        """The counts so far; the next start from zero."""
        pending, self._pending = self._pending, {}
        return pending

    def give_back(self, pending: dict[str, Counts]) -> None:
        """Counts a flush could not write, kept for the next one."""
        for queue, counts in pending.items():
            self._counts(queue).add(counts)


# The process's counts: the serving Engine's observer (observability/engine.py) adds to them.
ACTIVITY = Activity()


async def flush(engine: Engine, activity: Activity = ACTIVITY) -> None:
    """Writes what was counted since the last flush; on failure keeps it for the next."""
    pending = activity.take()
    if not pending:
        return
    try:
        await engine.record_activity(pending)
    except BaseException:  # cancelled too: nothing counted is lost
        activity.give_back(pending)
        raise
