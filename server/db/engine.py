"""The thinnest layer over the SQL engine: one method per engine call, errors translated."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from server.db.errors import translate
from server.db.sqlfiles import queries

Record = asyncpg.Record


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

    async def _call(
        self, method: str, name: str, *args: Any, conn: asyncpg.Connection | None = None
    ) -> Any:
        try:
            return await getattr(conn or self.pool, method)(self._sql[name], *args)
        except Exception as exc:
            raise translate(exc) from exc

    async def ping(self) -> None:
        await self._call("fetchval", "ping")

    # Queues. Settings are dicts of queue_defaults() keys, durations in seconds.

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

    async def drop_queue(self, name: str) -> None:
        await self._call("execute", "drop_queue", name)

    async def purge_queue(self, name: str) -> int:
        return await self._call("fetchval", "purge_queue", name)

    # Messages. Attributes are JSON text in the engine's format (see attribute_problem).

    async def send(
        self, queue: str, body: bytes, attributes: str | None, delay: timedelta | None
    ) -> int:
        return await self._call("fetchval", "send", queue, body, attributes, delay)

    async def send_batch(
        self,
        queue: str,
        bodies: Sequence[bytes],
        attributes: Sequence[str | None] | None,
        delays: Sequence[timedelta | None] | None,
        *,
        conn: asyncpg.Connection | None = None,
    ) -> list[int]:
        """Ids in input order. On `conn` it joins that connection's transaction (group commit)."""
        rows = await self._call("fetch", "send_batch", queue, bodies, attributes, delays, conn=conn)
        return [row[0] for row in rows]

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
