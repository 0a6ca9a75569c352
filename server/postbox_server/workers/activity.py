"""Flushes this process's per-queue counts (postbox_server/observability/activity.py) into the
engine's postbox.queue_activity every few seconds, off the request path."""

from __future__ import annotations

import asyncio
import logging

from postbox_server.db.engine import Engine
from postbox_server.errors import ApiError
from postbox_server.observability import activity
from postbox_server.workers import OutageLog

log = logging.getLogger(__name__)


async def run_flusher(engine: Engine, interval: float) -> None:
    """Flushes every `interval` seconds until cancelled. While the database is away the
    counts pile up in memory (a few numbers per queue) and go with the next flush; the
    server flushes once more on shutdown, after its calls have ended."""
    outage = OutageLog(log, "queue activity flush")
    while True:
        await asyncio.sleep(interval)
        try:
            await activity.flush(engine)
            outage.worked()
        except ApiError as error:
            outage.failed(error)
