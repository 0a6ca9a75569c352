"""The thinnest layer over the SQL engine: one method per engine call, errors translated."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg

from server.db.errors import translate
from server.db.sqlfiles import queries

Record = asyncpg.Record


@dataclass(frozen=True)
class OutgoingMessage:
    """One message to send, as postbox.send_batch takes it (see its comment for the rules)."""

    body: bytes
    attributes: str | None = None  # JSON in the engine's attribute format
    delay: timedelta | None = None
    message_group_id: str | None = None
    deduplication_id: str | None = None
    dedupe_key: str | None = None
    priority: int | None = None
    deliver_at: datetime | None = None


# send_batch's per-entry arrays after the bodies, in its parameter order.
_SEND_OPTIONS = (
    "attributes",
    "delay",
    "message_group_id",
    "deduplication_id",
    "dedupe_key",
    "priority",
    "deliver_at",
)
assert set(_SEND_OPTIONS) | {"body"} == {f.name for f in fields(OutgoingMessage)}


class Engine:
    """Runs the named queries of queries.sql on a connection pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self._sql = queries()

    @classmethod
    async def connect(cls, dsn: str, *, pool_size: int = 10) -> Engine:
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min(2, pool_size),
                max_size=pool_size,
                server_settings={"application_name": "postbox"},
            )
        except Exception as exc:
            raise translate(exc) from exc
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def _call(self, method: str, name: str, *args: Any) -> Any:
        try:
            return await getattr(self.pool, method)(self._sql[name], *args)
        except Exception as exc:
            raise translate(exc) from exc

    async def ping(self) -> None:
        await self._call("fetchval", "ping")

    # Queues. Settings are dicts in the shape of postbox.queue_defaults().

    async def create_queue(self, name: str, settings: dict[str, Any]) -> Record:
        return await self._call("fetchrow", "create_queue", name, json.dumps(settings))

    async def get_queue(self, name: str) -> Record:
        return await self._call("fetchrow", "get_queue", name)

    async def get_queue_with_stats(self, name: str) -> Record:
        return await self._call("fetchrow", "get_queue_with_stats", name)

    async def list_queues(self, page_size: int, after_name: str, name_prefix: str) -> list[Record]:
        return await self._call("fetch", "list_queues", page_size, after_name, name_prefix)

    async def update_queue(self, name: str, settings: dict[str, Any]) -> Record:
        return await self._call("fetchrow", "update_queue", name, json.dumps(settings))

    async def pause_queue(self, name: str, sends: bool, receives: bool) -> Record:
        return await self._call("fetchrow", "pause_queue", name, sends, receives)

    async def resume_queue(self, name: str, sends: bool, receives: bool) -> Record:
        return await self._call("fetchrow", "resume_queue", name, sends, receives)

    async def drop_queue(self, name: str) -> None:
        await self._call("execute", "drop_queue", name)

    async def purge_queue(self, name: str) -> int:
        return await self._call("fetchval", "purge_queue", name)

    async def list_dead_letter_source_queues(
        self, name: str, page_size: int, after_name: str
    ) -> list[str]:
        rows = await self._call(
            "fetch", "list_dead_letter_source_queues", name, page_size, after_name
        )
        return [row[0] for row in rows]

    async def start_redrive(
        self, dead_letter_queue: str, destination: str | None, max_messages: int | None,
        rate: float | None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "start_redrive", dead_letter_queue, destination, max_messages, rate
        )

    async def list_redrive_tasks(self, dead_letter_queue: str, page_size: int) -> list[Record]:
        return await self._call("fetch", "list_redrive_tasks", dead_letter_queue, page_size)

    async def cancel_redrive(self, task_id: UUID) -> Record:
        return await self._call("fetchrow", "cancel_redrive", task_id)

    # Messages.

    async def send_batch(
        self, queue: str, messages: Sequence[OutgoingMessage]
    ) -> list[tuple[int, bool]]:
        """(message id, duplicate) per message, in order."""
        options = []
        for name in _SEND_OPTIONS:
            values = [getattr(message, name) for message in messages]
            # An option nobody uses is sent as NULL, which keeps the engine's fast path.
            options.append(values if any(v is not None for v in values) else None)
        rows = await self._call("fetch", "send_batch", queue, [m.body for m in messages], *options)
        return [(row[0], row[1]) for row in rows]

    async def receive(
        self, queue: str, max_messages: int, visibility_timeout: timedelta | None
    ) -> list[Record]:
        return await self._call("fetch", "receive", queue, max_messages, visibility_timeout)

    async def next_visible_at(self, queue: str) -> datetime | None:
        return await self._call("fetchval", "next_visible_at", queue)

    async def release(self, queue: str, receipts: Sequence[str]) -> int:
        return await self._call("fetchval", "release", queue, receipts)

    async def delete(self, queue: str, receipt: str) -> None:
        await self._call("execute", "delete", queue, receipt)

    async def change_visibility(self, queue: str, receipt: str, timeout: timedelta) -> None:
        await self._call("execute", "change_visibility", queue, receipt, timeout)

    async def delete_batch(self, queue: str, receipts: Sequence[str]) -> list[str]:
        rows = await self._call("fetch", "delete_batch", queue, receipts)
        return [row[0] for row in rows]

    async def change_visibility_batch(
        self, queue: str, receipts: Sequence[str], timeouts: Sequence[timedelta]
    ) -> list[str]:
        rows = await self._call("fetch", "change_visibility_batch", queue, receipts, timeouts)
        return [row[0] for row in rows]

    async def nack(
        self, queue: str, receipt: str, delay: timedelta | None, error: str | None
    ) -> None:
        await self._call("execute", "nack", queue, receipt, delay, error)

    async def peek_messages(
        self, queue: str, state: str | None, after_id: int, page_size: int
    ) -> list[Record]:
        return await self._call("fetch", "peek_messages", queue, state, after_id, page_size)

    async def get_message(self, queue: str, message_id: int) -> Record:
        return await self._call("fetchrow", "get_message", queue, message_id)

    async def list_archived_messages(
        self, queue: str, after_id: int, page_size: int
    ) -> list[Record]:
        return await self._call("fetch", "list_archived_messages", queue, after_id, page_size)

    # Maintenance.

    async def run_redrives(self, batch_size: int) -> int:
        return await self._call("fetchval", "run_redrives", batch_size)

    async def expire_messages(self, batch_size: int) -> int:
        return await self._call("fetchval", "expire_messages", batch_size)

    async def expire_records(self, batch_size: int) -> int:
        return await self._call("fetchval", "expire_records", batch_size)
