"""Runs the engine's housekeeping: redrive tasks, message expiry, archive, dedupe and
queue activity cleanup, and the rotation of the stream log.

Every server runs this; the SQL jobs claim their rows with SKIP LOCKED, so replicas
share the work and never do the same piece twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta

from postbox_server.db.engine import Engine
from postbox_server.errors import ApiError
from postbox_server.workers import OutageLog

log = logging.getLogger(__name__)

# How long a rotation pass waits for a slot's lock before it leaves the slot for the
# next pass: readers and publishers queue behind a waiting TRUNCATE at most this long.
STREAM_ROTATION_LOCK_WAIT = timedelta(milliseconds=20)


class MaintenanceWorker:
    def __init__(
        self,
        engine: Engine,
        *,
        interval: float = 1.0,
        expiry_interval: float = 10.0,
        idle_interval: float = 60.0,
        batch_size: int = 1000,
    ) -> None:
        self.engine = engine
        # Redrives step every `interval`, so their rate limits see a steady clock.
        self.interval = interval
        # With no redrive running, the worker sleeps until one starts (the engine
        # signals it), looking this often at the latest: a task another server
        # started and left, say.
        self.idle_interval = idle_interval
        self._redrive_started = asyncio.Event()
        # Expiry walks every queue with a retention: less often.
        self.expiry_interval = expiry_interval
        self.batch_size = batch_size

    def wake(self) -> None:
        """A redrive started: step it now."""
        self._redrive_started.set()

    async def run(self) -> None:
        # Three loops: a cleanup that takes long (a backlog of expired records, a
        # lock held elsewhere) must hold back neither redrives and their rate clocks,
        # nor the delayed stream messages that come due meanwhile.
        await asyncio.gather(self._run_redrives(), self._run_expiry(), self._run_due_streams())

    async def _run_redrives(self) -> None:
        outage = OutageLog(log, "redrive")
        while True:
            self._redrive_started.clear()
            pause = self.interval
            try:
                if await self.engine.run_redrives(self.batch_size) is None:
                    pause = self.idle_interval  # nothing running: sleep until one starts
                outage.worked()
            except ApiError as error:
                outage.failed(error)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._redrive_started.wait(), pause)

    async def _run_expiry(self) -> None:
        # Each job fails on its own: one that keeps failing (a queue whose expired
        # messages cannot be removed, say) holds back none of the others.
        jobs: list[tuple[OutageLog, Callable[[], Awaitable[object]]]] = [
            (OutageLog(log, "message expiry"), lambda: self._drain(self.engine.expire_messages)),
            (OutageLog(log, "record expiry"), lambda: self._drain(self.engine.expire_records)),
            # What queue_throughput no longer shows.
            (OutageLog(log, "activity expiry"), self.engine.expire_activity),
            # The engine's own rotation period: half the shortest stream retention.
            (
                OutageLog(log, "stream rotation"),
                lambda: self.engine.rotate_streams(None, STREAM_ROTATION_LOCK_WAIT),
            ),
        ]
        while True:
            for outage, job in jobs:
                try:
                    await job()
                    outage.worked()
                except ApiError as error:
                    outage.failed(error)
            await asyncio.sleep(self.expiry_interval)

    async def _run_due_streams(self) -> None:
        # Delayed stream publishes that are due: reads of their topics append them
        # too, but a topic nobody reads still shows them in its lag until this does.
        # As often as the sweep (an idle server's statements per second stay as they
        # were, tests/ops/test_idle.py), but never waiting for it.
        outage = OutageLog(log, "appending due stream messages")
        while True:
            try:
                await self._drain(self.engine.publish_due_streams)
                outage.worked()
            except ApiError as error:
                outage.failed(error)
            await asyncio.sleep(self.expiry_interval)

    async def _drain(self, job: Callable[[int], Awaitable[int]]) -> None:
        """Repeats a job while it fills whole batches: each call is one short transaction."""
        done = self.batch_size
        while done >= self.batch_size:
            done = await job(self.batch_size)
