"""Fires due schedules into their queues and topics.

Every server runs this. Each round claims due schedules with SKIP LOCKED and, in the
same transaction, fires each and stores its next fire time (computed here: cron
needs a library), so replicas never fire a schedule twice for one due time and a
crash between claim and commit fires nothing: another round fires it again.

Between rounds the worker sleeps until the next due time, at most `poll_interval`,
which is long: an idle server stays quiet. Creating, changing or resuming a
schedule anywhere wakes it at once (through this server, or by the engine's
"#schedules" signal).

A fire whose body breaks its target's payload schema (changed since the schedule was
set, which checked it then) does not send: it fails like any refused fire, in
last_error, and counts toward failure_threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone

import grpc

from postbox_server.db.engine import Engine, Record
from postbox_server.errors import ApiError
from postbox_server.observability import metrics
from postbox_server.workers import OutageLog
from postbox_server.workers.scheduling import fire_plan

log = logging.getLogger(__name__)
# What the schema check answers for a body that breaks the schema, or a schema that
# does not compile; anything else (the database down) is the round's failure.
_BODY_REFUSALS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


class SchedulerWorker:
    def __init__(
        self,
        engine: Engine,
        # services.schedules.check_fired_body, given by the app: workers sit below
        # services and do not import them.
        check_fired_body: Callable[[str | None, str | None, bytes], Awaitable[None]],
        *,
        on_webhook_deliveries: Callable[[], None] = lambda: None,
        poll_interval: float = 1.0,
        batch_size: int = 100,
    ) -> None:
        self.engine = engine
        self.check_fired_body = check_fired_body
        # Fires into topics may queue webhook deliveries: the webhook worker wants to know.
        self.on_webhook_deliveries = on_webhook_deliveries
        self.poll_interval = poll_interval
        self.batch_size = batch_size
        self._nudge = asyncio.Event()

    def wake(self) -> None:
        """A schedule changed: look at the due times again now."""
        self._nudge.set()

    async def _refusal(self, row: Record) -> str | None:
        """Why the schedule in `row` must not send: its body breaks the target's schema."""
        try:
            await self.check_fired_body(row["target_queue"], row["target_topic"], row["body"])
        except ApiError as error:
            if error.code not in _BODY_REFUSALS:
                raise
            return error.message
        return None

    async def run(self) -> None:
        outage = OutageLog(log, "the scheduler")
        while True:
            self._nudge.clear()
            timeout = self.poll_interval
            try:
                fired = await self.engine.fire_due_schedules(
                    self.batch_size, fire_plan, self._refusal
                )
                for row, error, webhook_deliveries in fired:
                    metrics.SCHEDULE_FIRES.labels("failed" if error else "fired").inc()
                    if error is not None:
                        log.warning("schedule %r did not fire: %s", row["name"], error)
                    if webhook_deliveries:
                        self.on_webhook_deliveries()
                if len(fired) == self.batch_size:
                    continue
                due = await self.engine.next_schedule_fire_at()
                if due is not None:
                    wait = (due - datetime.now(timezone.utc)).total_seconds()
                    # A time already past: a schedule another server is firing now.
                    timeout = min(timeout, max(wait, 0.02))
                outage.worked()
            except ApiError as error:
                outage.failed(error)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._nudge.wait(), timeout)
