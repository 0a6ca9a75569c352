"""The maintenance worker's expiry sweep: its jobs fail one at a time."""

from __future__ import annotations

import asyncio
import logging

import grpc

from postbox_server.db.engine import Engine
from postbox_server.errors import ApiError
from postbox_server.workers.maintenance import MaintenanceWorker


class MessageExpiryFails(Engine):
    """An engine whose message expiry always fails, and which counts the record
    expiry passes (the job after it in the sweep)."""

    failures = 0
    record_passes = 0

    async def expire_messages(self, max_messages: int) -> int:
        self.failures += 1
        raise ApiError(grpc.StatusCode.INTERNAL, "message expiry broke on purpose")

    async def expire_records(self, batch_size: int) -> int:
        removed = await super().expire_records(batch_size)
        self.record_passes += 1
        return removed


async def test_a_failing_expiry_job_holds_back_none_of_the_others(database_url, server, caplog):
    """Before, one failure ended the whole pass: a queue whose expired messages could
    not be removed kept deduplication ids and batch request ids forever. (`server`
    installs the engine.)"""
    engine = await MessageExpiryFails.connect(database_url, pool_size=2)
    worker = asyncio.create_task(MaintenanceWorker(engine, expiry_interval=0.05).run())
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30  # 30 s: a loaded machine; each pass is milliseconds
        while engine.failures < 3 or engine.record_passes < 3:
            assert loop.time() < deadline, (engine.failures, engine.record_passes)
            await asyncio.sleep(0.02)
    finally:
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        await engine.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    # Once per outage, not once per pass.
    assert warnings == ["message expiry failed: message expiry broke on purpose"]
