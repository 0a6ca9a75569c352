"""Delivers topic messages to webhook subscriptions: POSTs, retries, gives up.

Every server runs this. Deliveries are claimed in the database with SKIP LOCKED and
leased for one attempt (the subscription's timeout and a margin), so replicas never
attempt the same delivery at once, and a server that dies mid-POST only delays it.
The engine decides what an outcome means (delivered, retry after backoff, failed);
this worker makes the HTTP calls, up to `concurrency` at a time, so one slow
endpoint holds only its own attempts.

A publish anywhere wakes the worker at once (through this server, or by the
engine's "#webhooks" signal); retries are found by sleeping until the next due
attempt, at most `poll_interval`, which is long: an idle server stays quiet.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from datetime import datetime, timezone
from typing import Any

import aiohttp

from postbox_server.db.engine import Engine, Record
from postbox_server.egress import EgressPolicy, Refused
from postbox_server.errors import ApiError
from postbox_server.observability import metrics, tracing
from postbox_server.workers import OutageLog
from postbox_server.workers import standard_webhooks as webhooks

log = logging.getLogger(__name__)

# Longest part of a failed response's body kept as the delivery's last error.
_ERROR_BODY_BYTES = 200


def sns_headers(sns: dict[str, Any], message_id: str) -> dict[str, str]:
    """The headers of an Amazon SNS notification POST."""
    headers = {
        "content-type": "text/plain; charset=UTF-8",
        "x-amz-sns-message-type": "Notification",
        "x-amz-sns-message-id": message_id,
        "x-amz-sns-topic-arn": sns["topic_arn"],
        "x-amz-sns-subscription-arn": sns["subscription_arn"],
    }
    if sns.get("raw"):
        headers["x-amz-sns-rawdelivery"] = "true"
    return headers


class WebhookWorker:
    def __init__(
        self,
        engine: Engine,
        egress: EgressPolicy,
        *,
        concurrency: int = 32,
        poll_interval: float = 1.0,
        expiry_interval: float = 60.0,
    ) -> None:
        self.engine = engine
        self.egress = egress
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.expiry_interval = expiry_interval
        self._nudge = asyncio.Event()
        self._attempts: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        """New deliveries are due: look now rather than at the next poll."""
        self._nudge.set()

    async def run(self) -> None:
        # No cookies or connection limits shared across endpoints beyond aiohttp's own pool.
        session = aiohttp.ClientSession(
            cookie_jar=aiohttp.DummyCookieJar(),
            # Every address it connects to passes the egress policy first.
            connector=aiohttp.TCPConnector(
                limit=self.concurrency, resolver=self.egress.resolver(), use_dns_cache=False
            ),
        )
        try:
            await self._loop(session)
        finally:
            for task in self._attempts:
                task.cancel()
            await asyncio.gather(*self._attempts, return_exceptions=True)
            await session.close()

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        outage = OutageLog(log, "webhook delivery")
        next_expiry = 0.0
        while True:
            self._nudge.clear()
            timeout = self.poll_interval
            try:
                free = self.concurrency - len(self._attempts)
                claimed = await self.engine.claim_webhook_deliveries(free) if free else []
                for row in claimed:
                    task = asyncio.create_task(self._attempt(session, row))
                    self._attempts.add(task)
                    task.add_done_callback(self._attempt_done)
                if time.monotonic() >= next_expiry:
                    await self.engine.expire_webhook_deliveries(1000)
                    next_expiry = time.monotonic() + self.expiry_interval
                if claimed and len(claimed) == free:
                    continue  # more may be due: claim again as soon as a slot frees
                if free:
                    due = await self.engine.next_webhook_attempt_at()
                    if due is not None:
                        wait = (due - datetime.now(timezone.utc)).total_seconds()
                        timeout = min(timeout, max(wait, 0.0))
                outage.worked()
            except ApiError as error:
                outage.failed(error)
            if self.concurrency - len(self._attempts) == 0:
                timeout = self.poll_interval  # a finishing attempt nudges
            if timeout > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._nudge.wait(), timeout)
            elif not self._nudge.is_set():
                # A due attempt that another server holds: look again shortly, not in a busy loop.
                await asyncio.sleep(0.02)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._attempts.discard(task)
        self._nudge.set()

    async def _attempt(self, session: aiohttp.ClientSession, delivery: Record) -> None:
        began = time.monotonic()
        status, error = await self._post(session, delivery)
        took = time.monotonic() - began
        try:
            outcome = await self.engine.finish_webhook_delivery(
                delivery["delivery_id"], delivery["lease"], status, error
            )
        except ApiError as failure:
            # The lease runs out and the delivery is attempted again.
            log.warning("could not record a webhook attempt: %s", failure.message)
            return
        metrics.WEBHOOK_DELIVERIES.labels(outcome).inc()
        metrics.WEBHOOK_SECONDS.labels(outcome).observe(took)
        if outcome == "failed":
            log.warning(
                "webhook delivery %s to subscription %r of topic %r failed after %d attempts: %s",
                delivery["delivery_id"], delivery["subscription"], delivery["topic"],
                delivery["attempt"], error,
            )  # fmt: skip

    async def _post(
        self, session: aiohttp.ClientSession, delivery: Record
    ) -> tuple[int | None, str | None]:
        """(HTTP status or None, what went wrong or None) of one attempt."""
        webhook_id = webhooks.delivery_id(delivery["publish_id"], delivery["delivery_id"])
        if delivery["sns"] is None:
            body = webhooks.envelope(delivery)
            headers = webhooks.headers(delivery["secret"], webhook_id, int(time.time()), body)
        else:
            # SNS's POST: the engine made the body; signed as every webhook is.
            body = delivery["body"]
            headers = webhooks.headers(delivery["secret"], webhook_id, int(time.time()), body)
            headers.update(sns_headers(json.loads(delivery["sns"]), str(delivery["publish_id"])))
        headers.update(tracing.traceparent_header(delivery["attributes"]))
        seconds = delivery["timeout"].total_seconds()
        request: dict[str, Any] = {
            "data": body,
            "headers": headers,
            "timeout": aiohttp.ClientTimeout(total=seconds),
            # A redirect is not a delivery: Standard Webhooks asks for a 2xx.
            "allow_redirects": False,
        }
        try:
            self.egress.check_literal_url(delivery["url"])
        except Refused as refused:
            return None, f"refused: {refused}"
        try:
            async with session.post(delivery["url"], **request) as response:
                if 200 <= response.status < 300:
                    return response.status, None
                text = await response.content.read(_ERROR_BODY_BYTES)
                reason = f"HTTP {response.status}"
                if text:
                    reason += ": " + text.decode("utf-8", errors="replace")
                return response.status, reason
        except asyncio.TimeoutError:
            return None, f"no response within {seconds:g} s"
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return None, f"request failed: {exc or type(exc).__name__}"
