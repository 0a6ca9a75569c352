"""The engine's observer of a serving process: what its calls did, counted into the
Prometheus metrics and the queue activity counts, and each statement a client span."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from postbox_server.db.observer import EngineObserver
from postbox_server.observability import metrics, tracing
from postbox_server.observability.activity import ACTIVITY, Activity


class CountingObserver(EngineObserver):
    """Counts into the process's metrics and `activity` (the process's ACTIVITY)."""

    def __init__(self, activity: Activity = ACTIVITY) -> None:
        self._activity = activity

    def statement(self, name: str) -> AbstractContextManager[object]:
        return tracing.engine_span(name)

    def sent(self, queue: str, amount: int) -> None:
        metrics.count(metrics.MESSAGES_SENT, queue, amount)
        self._activity.sent(queue, amount)

    def received(self, queue: str, rows: Sequence[Mapping[str, Any]]) -> None:
        metrics.count(metrics.MESSAGES_RECEIVED, queue, len(rows))
        redelivered = 0
        ages = metrics.AGE_AT_RECEIVE.labels(*metrics.tenant_and_name(queue))
        for row in rows:
            if row["receive_count"] > 1:
                redelivered += 1
            elif row["first_received_at"] is not None:
                age = row["first_received_at"] - row["enqueued_at"]
                ages.observe(max(age.total_seconds(), 0.0))
        metrics.count(metrics.MESSAGES_REDELIVERED, queue, redelivered)
        self._activity.received(queue, rows)

    def deleted(self, queue: str, amount: int) -> None:
        metrics.count(metrics.MESSAGES_DELETED, queue, amount)
        self._activity.deleted(queue, amount)

    def nacked(self, queue: str, amount: int) -> None:
        metrics.count(metrics.MESSAGES_NACKED, queue, amount)

    def pool_exhausted(self) -> None:
        metrics.POOL_ACQUIRE_TIMEOUTS.inc()

    def group_waiting(self, change: int) -> None:
        metrics.GROUP_COMMIT_PENDING.inc(change)

    def group_committed(self, size: int) -> None:
        metrics.GROUP_COMMIT_SIZE.observe(size)
