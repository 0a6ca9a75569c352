"""What the engine tells whoever watches it: each statement it runs, the messages its
calls sent, delivered, deleted and nacked, a pool that had no connection to give, and
the groups that group commit wrote.

db/ knows nothing of Prometheus, OpenTelemetry or the queue activity counts. The
observability layer subclasses EngineObserver (observability/engine.py) and the server
hands one to its Engine; an Engine made without one (the CLI's, a test's) tells no one.
The methods are plain calls, made on the request path: an observer does no I/O in them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

_NOTHING = contextlib.nullcontext()


class EngineObserver:
    """Hears nothing: each method is a no-op, which a subclass overrides."""

    def statement(self, name: str) -> AbstractContextManager[object]:
        """Wraps one call of the named statement of queries.sql."""
        return _NOTHING

    def sent(self, queue: str, amount: int) -> None:
        """Messages newly sent into `queue` (a duplicate is not one)."""

    def received(self, queue: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Deliveries from `queue`: postbox.receive's rows (receive_count,
        first_received_at and enqueued_at among their columns)."""

    def deleted(self, queue: str, amount: int) -> None:
        """Messages deleted from `queue` by their receipts."""

    def nacked(self, queue: str, amount: int) -> None:
        """Messages given back to `queue` for a retry or dead-lettered by a Nack."""

    def pool_exhausted(self) -> None:
        """A call waited the acquire timeout for a pooled connection and was refused."""

    def group_waiting(self, change: int) -> None:
        """Writes waiting for a group commit: +1 as one starts waiting, -1 as it ends."""

    def group_committed(self, size: int) -> None:
        """A group commit begins writing `size` writes in one transaction."""
