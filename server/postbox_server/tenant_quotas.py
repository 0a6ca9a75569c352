"""Tenants' quotas on what they store (issue 47): the messages and bytes of message
bodies a tenant's queues may hold.

A send must not write a per-tenant counter row: every send of a tenant would then
wait on the one before it. Instead each server process keeps a snapshot of every
tenant's quotas and usage, refreshed every `interval` seconds off the request path, and
checks a send against it in memory. The snapshot comes from postbox.tenant_usage, which
counts the tenants' queues' messages in one pass when its last count is older than the
interval and otherwise returns that count, so the servers of a database share one count
per interval. So a quota holds within two refreshes (a count up to one interval old
when read, read once an interval): what a tenant sends meanwhile, through every server,
may take it past its quota, and the next refresh refuses its sends until it is under
again.

Queue and topic quotas are the engine's, exact, checked as each is created
(postbox._check_resource_quota); the snapshot only shows them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import grpc

from postbox_server.db.engine import Engine, Row
from postbox_server.errors import ApiError
from postbox_server.tenant_names import SEPARATOR
from postbox_server.workers import OutageLog

log = logging.getLogger(__name__)

# Seconds between refreshes by default (`serve --quota-refresh-interval`).
DEFAULT_REFRESH_INTERVAL = 5.0
# Seconds between refreshes while no tenant has a message or byte quota: nothing is
# checked against the counts then, and a quota set anywhere wakes the refresher at
# once. An idle server's statements stay under one a second (tests/ops/test_idle.py).
IDLE_REFRESH_INTERVAL = 60.0


@dataclass(frozen=True, slots=True)
class TenantFigures:
    """One tenant's quotas (None: no limit) and what it held at the last refresh."""

    name: str
    max_queues: int | None
    max_topics: int | None
    max_messages: int | None
    max_bytes: int | None
    queues: int
    topics: int
    messages: int
    bytes: int
    # When they were counted (None: not yet, a tenant made since the last count).
    counted_at: datetime | None

    @classmethod
    def from_row(cls, row: Row) -> TenantFigures:
        return cls(
            name=row["tenant_name"],
            max_queues=row["max_queues"],
            max_topics=row["max_topics"],
            max_messages=row["max_messages"],
            max_bytes=row["max_bytes"],
            queues=row["queues"],
            topics=row["topics"],
            messages=row["messages"],
            bytes=row["bytes"],
            counted_at=row["counted_at"],
        )

    @property
    def limits_stores(self) -> bool:
        """Whether a send must be checked: the tenant has a message or byte quota."""
        return self.max_messages is not None or self.max_bytes is not None

    def refuse_beyond(self, messages: int, size: int) -> None:
        """RESOURCE_EXHAUSTED when `messages` more, of `size` bytes, do not fit."""
        if self.counted_at is None:
            return
        age = max(0.0, time.time() - self.counted_at.timestamp())
        if self.max_messages is not None and self.messages + messages > self.max_messages:
            raise ApiError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tenant {self.name!r} holds {self.messages} messages and its quota "
                f"max_messages is {self.max_messages}, so {messages} more do not fit; "
                f"receive some or raise the quota (counted {age:.1f} s ago)",
            )
        if self.max_bytes is not None and self.bytes + size > self.max_bytes:
            raise ApiError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"tenant {self.name!r} holds {self.bytes} bytes of messages and its quota "
                f"max_bytes is {self.max_bytes}, so {size} more bytes do not fit; "
                f"receive some or raise the quota (counted {age:.1f} s ago)",
            )


class TenantQuotas:
    """The snapshot of this process, and its refresher."""

    def __init__(self, engine: Engine, interval: float = DEFAULT_REFRESH_INTERVAL) -> None:
        self._engine = engine
        self.interval = interval
        self._tenants: dict[str, TenantFigures] = {}
        # Only the tenants with a message or byte quota: the send path looks here, and
        # while it is empty (no such quota anywhere) a send only tests it.
        self._limiting: dict[str, TenantFigures] = {}
        self._refreshing = asyncio.Lock()
        self._changed = asyncio.Event()

    def wake(self) -> None:
        """A tenant changed (its quotas, say), here or on another server: count again now."""
        self._changed.set()

    async def refresh(self) -> None:
        """Counts again now (after a tenant's quota changed here, and every interval)."""
        async with self._refreshing:
            rows = await self._engine.tenant_usage(timedelta(seconds=self.interval))
            tenants = {row["tenant_name"]: TenantFigures.from_row(row) for row in rows}
            self._tenants = tenants
            self._limiting = {name: t for name, t in tenants.items() if t.limits_stores}

    async def run(self) -> None:
        """Refreshes every `interval` seconds until cancelled (every IDLE_REFRESH_INTERVAL
        while no tenant has a message or byte quota), and at once after wake. While the
        database is away the last snapshot stands."""
        outage = OutageLog(log, "tenant usage refresh")
        while True:
            self._changed.clear()  # before the count: a change during it wakes again
            try:
                await self.refresh()
                outage.worked()
            except ApiError as error:
                outage.failed(error)
            pause = self.interval if self._limiting else max(self.interval, IDLE_REFRESH_INTERVAL)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), pause)

    def of(self, tenant: str) -> TenantFigures | None:
        """A tenant's figures as of the last refresh; None for one not counted yet."""
        return self._tenants.get(tenant)

    def check_send(self, destination: str, messages: int, bodies: Iterable[bytes]) -> None:
        """RESOURCE_EXHAUSTED when `messages` more into the queue or topic `destination`
        (a stored name), with these bodies, would take its tenant past a quota of the
        snapshot. A dict lookup; the bodies are only summed for a tenant with a quota."""
        if not self._limiting:
            return
        tenant, separator, _ = destination.partition(SEPARATOR)
        figures = self._limiting.get(tenant) if separator else None
        if figures is not None:
            figures.refuse_beyond(messages, sum(len(body) for body in bodies))
