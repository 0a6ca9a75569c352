"""The thinnest layer over the SQL engine: one method per engine call, errors translated."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import math
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, TypeAlias
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from postbox_server.db import hosts
from postbox_server.db.errors import pool_exhausted, translate
from postbox_server.db.observer import EngineObserver
from postbox_server.db.own_sessions import UNTHROTTLED_SETTING, OwnSessions
from postbox_server.db.sqlfiles import queries
from postbox_server.errors import ApiError

Record = asyncpg.Record
# A connection of the pool (a proxy) or one of its own: calls take either.
Connection: TypeAlias = "asyncpg.Connection | PoolConnectionProxy"
# A row: asyncpg's Record, which is no Mapping (it iterates its values), or a dict (the
# SQS shim's and tests' rows). Functions that only read columns by name take either.
Row: TypeAlias = "Record | Mapping[str, Any]"
# What a send_batch returns: message ids (decimal, as the API carries them) and
# whether each was a duplicate, in message order.
SentBatch = tuple[list[str], list[bool]]
# Run first in a transaction whose commit need not wait for its WAL flush (sends
# with relaxed_durability; a lone statement sets it itself, send_batch_relaxed): the
# commit is then visible at once and on disk within about three wal_writer_delay, so
# a crash of PostgreSQL may lose it after its OK.
RELAXED_COMMIT = "SET LOCAL synchronous_commit = off"


# Slots and not frozen: SendBatch builds one per entry, and a frozen dataclass's
# __init__ costs several times more.
@dataclass(slots=True)
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
    ttl: timedelta | None = None
    expire_at: datetime | None = None
    max_receive_count: int | None = None


# send_batch's per-entry arrays after the bodies, in its parameter order.
_SEND_OPTIONS = (
    "attributes",
    "delay",
    "message_group_id",
    "deduplication_id",
    "dedupe_key",
    "priority",
    "deliver_at",
    "ttl",
    "expire_at",
    "max_receive_count",
)
assert set(_SEND_OPTIONS) | {"body"} == {f.name for f in fields(OutgoingMessage)}
# send_batch's optional columns, all left out (the bench calls the statement too),
# and its request_id, which follows them.
NO_SEND_OPTIONS = (None,) * (len(_SEND_OPTIONS) + 1)
assert _SEND_OPTIONS[3] == "deduplication_id"  # where send_bodies puts the ids


def _delivery_arguments(delivery: SubscriptionDelivery) -> tuple[Any, ...]:
    """create_ and update_subscription's filter_policy, filter_scope, sns and suspended."""
    sns = json.dumps(delivery.sns) if delivery.sns is not None else None
    return delivery.filter_policy, delivery.filter_scope, sns, delivery.suspended


# Slots and not frozen, as OutgoingMessage: PublishBatch builds one per entry.
@dataclass(slots=True)
class OutgoingPublish:
    """One message to publish, as postbox.publish_batch takes it."""

    body: bytes
    routing_key: str = ""
    attributes: str | None = None  # JSON in the engine's attribute format
    ordering_key: str | None = None
    deduplication_id: str | None = None
    subject: str | None = None
    delay: timedelta | None = None  # None: each queue's delivery_delay, webhooks at once


@dataclass(frozen=True)
class PublishSignatures:
    """SNS signatures for a publish_batch (postbox_server/sns_signing.py): per entry,
    its Signature by topic ARN, over the publish ids and time given with them."""

    version: str
    publish_ids: list[UUID]
    published_at: datetime
    by_topic_arn: list[dict[str, str]]


@dataclass(frozen=True)
class SubscriptionDelivery:
    """Which messages a subscription takes and how: the filter and SNS columns."""

    filter_policy: str | None = None  # JSON; checked by the engine
    filter_scope: str = "attributes"
    sns: dict[str, Any] | None = None
    suspended: bool = False


@dataclass(frozen=True)
class ScheduleFields:
    """What a schedule fires, where and when: the columns of postbox.schedules a caller sets."""

    body: bytes = b""
    target_queue: str | None = None
    target_topic: str | None = None
    routing_key: str = ""
    attributes: str | None = None  # JSON in the engine's attribute format
    cron_expression: str | None = None
    time_zone: str | None = None
    every: timedelta | None = None
    run_at: datetime | None = None
    catch_up_limit: int = 0
    failure_threshold: int = 0

    def arguments(self) -> tuple[Any, ...]:
        """In the order create_schedule and update_schedule take them after next_fire_at."""
        return (
            self.body, self.target_queue, self.target_topic, self.routing_key, self.attributes,
            self.cron_expression, self.time_zone, self.every, self.run_at, self.catch_up_limit,
            self.failure_threshold,
        )  # fmt: skip


# Computes a schedule's next fire time from its row and the database's clock.
NextFire = Callable[[Record, datetime], "datetime | None"]
# Plans the fires of a due schedule from its row and the database's clock: per fire,
# the next_fire_at it leaves (a missed due time still to catch up, or the next one).
FirePlan = Callable[[Record, datetime], "list[datetime | None]"]
# Why a claimed schedule must not send at all (its body breaks the target's payload
# schema), or None: the server's check, which the engine cannot make.
FireRefusal = Callable[[Record], Awaitable["str | None"]]


async def _no_refusal(row: Record) -> str | None:
    return None


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


def _optional_column(values: list[Any]) -> list[Any] | None:
    """A per-entry array, or NULL when no entry uses it (the engine's fast paths)."""
    return values if any(v is not None for v in values) else None


@dataclass(slots=True)
class Counts:
    """One queue's activity since a process's last flush to postbox.queue_activity
    (observability/activity.py counts them; record_activity writes them)."""

    sent: int = 0
    received: int = 0
    deleted: int = 0
    latency_sum: float = 0.0  # seconds from enqueue to first delivery, summed
    latency_count: int = 0
    latency_max: float | None = None

    def add(self, other: Counts) -> None:
        self.sent += other.sent
        self.received += other.received
        self.deleted += other.deleted
        self.latency_sum += other.latency_sum
        self.latency_count += other.latency_count
        if other.latency_max is not None:
            self.latency_max = max(self.latency_max or 0.0, other.latency_max)


def application_name(role: str = "") -> str:
    """What pg_stat_activity shows for this process's connections: `postbox/<pid>`, and
    `postbox/<pid>/<role>` for a connection with a role of its own (listen, migrate), so
    an operator can tell the processes of `serve --workers N` and their connections apart."""
    name = f"postbox/{os.getpid()}"
    return f"{name}/{role}" if role else name


def _one(row: Record | None) -> Record:
    """The row of a statement that returns one (a select of a function) or raises."""
    assert row is not None
    return row


async def keep_session(conn: asyncpg.Connection) -> None:
    """Returns a connection to the pool as it is. The engine leaves no session state
    behind (its locks are transaction locks, its settings are function settings), and
    asyncpg rolls back an open transaction anyway; its default reset would cost one more
    round trip on every call. The bench's raw PostgreSQL pools use it too, so that its
    floors pay what the server pays."""


# Seconds a call waits for a pooled connection by default (--pool-acquire-timeout).
DEFAULT_ACQUIRE_TIMEOUT = 30.0


class Engine:
    """Runs the named queries of queries.sql on a connection pool."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        own_sessions: OwnSessions | None = None,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
        observer: EngineObserver | None = None,
    ) -> None:
        self.pool = pool
        # Hears what the calls did (metrics, activity counts, traces live above db/).
        self.observer = observer or EngineObserver()
        # Longest a call waits for a pooled connection before it is refused UNAVAILABLE.
        self.acquire_timeout = acquire_timeout
        self._sql = queries()
        # None behind a transaction pooler, whose server sessions are not this pool's.
        self.own_sessions = own_sessions
        # When a named query last answered (monotonic clock): what proves the database
        # alive without a ping of its own (the health watch of an idle server).
        self.answered_at = -math.inf

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        pool_size: int = 10,
        transaction_pooler: bool = False,
        acquire_timeout: float = DEFAULT_ACQUIRE_TIMEOUT,
        observer: EngineObserver | None = None,
    ) -> Engine:
        """A pool on `dsn`. Behind a transaction pooler, consecutive calls of one pool
        connection may reach different server connections, where a named prepared
        statement does not exist: asyncpg then prepares unnamed ones, per call."""
        own = None if transaction_pooler else OwnSessions()
        settings = {"application_name": application_name()}
        if own is not None:
            settings[UNTHROTTLED_SETTING] = "on"  # this server wakes its own streams
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=min(2, pool_size),
                max_size=pool_size,
                server_settings=settings,
                reset=keep_session,
                statement_cache_size=0 if transaction_pooler else 100,
                connect=hosts.connect,
            )
        except Exception as exc:
            raise translate(exc) from exc
        return cls(pool, own, acquire_timeout, observer)

    @contextlib.asynccontextmanager
    async def _sending(self, queue: str, conn: Connection | None) -> AsyncIterator[Connection]:
        """`conn`, or a connection of the pool, for a send into `queue` whose NOTIFY this
        server's hub skips: every caller wakes the queue's local streams itself. Only
        a send outside a transaction: one inside may be rolled back after it returns,
        or share its NOTIFY with another send into the queue (PostgreSQL sends one)."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                if conn is None:
                    conn = await stack.enter_async_context(self.connection())
                own, pid = self.own_sessions, conn.get_server_pid()
                counted = own is not None and not conn.is_in_transaction()
                if own is not None and counted:
                    counted = own.sending(pid, queue)
                try:
                    yield conn
                except BaseException:
                    if own is not None and counted:
                        own.failed(pid, queue)
                    raise
        except ApiError:
            raise
        except Exception as exc:
            raise translate(exc) from exc

    async def close(self) -> None:
        await self.pool.close()

    async def _call(
        self, method: str, name: str, *args: Any, conn: Connection | None = None
    ) -> Any:
        try:
            with self.observer.statement(name):
                if conn is not None:
                    answer = await getattr(conn, method)(self._sql[name], *args)
                else:
                    async with self.connection() as acquired:
                        answer = await getattr(acquired, method)(self._sql[name], *args)
        except Exception as exc:
            raise translate(exc) from exc
        self.answered_at = time.monotonic()
        return answer

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Connection]:
        """A connection of the pool; every call takes its connection here, so that the
        wake-up hub knows what each session does last (see OwnSessions)."""
        try:
            conn = await self.pool.acquire(timeout=self.acquire_timeout)
        except asyncio.TimeoutError:
            self.observer.pool_exhausted()
            raise pool_exhausted(self.acquire_timeout, self.pool.get_max_size()) from None
        try:
            if self.own_sessions is not None:
                self.own_sessions.acquired(conn.get_server_pid())
            yield conn
        except asyncpg.ReadOnlySQLTransactionError:
            # A session on a standby: one opened while a failover was under way, or on a
            # host demoted since. A new session finds the writable host (the URL's
            # target_session_attrs) or, failing that, says the database is unavailable.
            conn.terminate()
            raise
        finally:
            await self.pool.release(conn)

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
        """A connection in a transaction, for calls that Python code must sit between."""
        try:
            async with self.connection() as conn, conn.transaction():
                yield conn
        except Exception as exc:
            raise translate(exc) from exc

    async def ping(self) -> None:
        await self._call("fetchval", "ping")

    async def probe_disk_space(self) -> None:
        """A small write of its own, dropped at once: DiskFull while the disk has no room."""
        await self._call("execute", "disk_probe")

    async def replication_settings(self) -> tuple[str, str]:
        """synchronous_commit and synchronous_standby_names, as the pool's sessions see them."""
        row = await self._call("fetchrow", "replication_settings")
        return row[0], row[1]

    # Queues. Settings are dicts in the shape of postbox.queue_defaults().

    async def create_queue(self, name: str, settings: dict[str, Any]) -> Record:
        return await self._call("fetchrow", "create_queue", name, json.dumps(settings))

    async def create_queue_with_dead_letter_queue(
        self, name: str, settings: dict[str, Any], dead_letter_queue: str,
        dead_letter_settings: dict[str, Any], max_receive_count: int,
    ) -> Record:  # fmt: skip
        """Creates dead_letter_queue, then the queue with its dead_letter_policy pointing
        there, in one transaction: both or neither (PB409 if either exists)."""
        policy = {"dead_letter_queue": dead_letter_queue, "max_receive_count": max_receive_count}
        async with self._transaction() as conn:
            await self._call(
                "fetchrow", "create_queue", dead_letter_queue, json.dumps(dead_letter_settings),
                conn=conn,
            )  # fmt: skip
            return await self._call(
                "fetchrow", "create_queue", name,
                json.dumps({**settings, "dead_letter_policy": policy}), conn=conn,
            )  # fmt: skip

    async def get_queue(self, name: str) -> Record:
        return await self._call("fetchrow", "get_queue", name)

    async def get_queue_with_stats(self, name: str) -> Record:
        return await self._call("fetchrow", "get_queue_with_stats", name)

    async def list_queues(
        self, page_size: int, after_name: str, name_prefix: str, with_stats: bool = False
    ) -> list[Record]:
        query = "list_queues_with_stats" if with_stats else "list_queues"
        return await self._call("fetch", query, page_size, after_name, name_prefix)

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
        rate: float | None, message_ids: list[int] | None = None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "start_redrive", dead_letter_queue, destination, max_messages, rate,
            message_ids,
        )  # fmt: skip

    async def list_redrive_tasks(
        self, dead_letter_queue: str, page_size: int, after_task: UUID | None = None
    ) -> list[Record]:
        return await self._call(
            "fetch", "list_redrive_tasks", dead_letter_queue, page_size, after_task
        )

    async def cancel_redrive(self, task_id: UUID) -> Record:
        return await self._call("fetchrow", "cancel_redrive", task_id)

    # Messages.

    async def send_batch(
        self,
        queue: str,
        messages: Sequence[OutgoingMessage],
        *,
        conn: Connection | None = None,
        relaxed: bool = False,
        request_id: str | None = None,
    ) -> SentBatch:
        """The message ids and duplicate flags, in message order. On `conn` it joins that
        connection's transaction (group commit). `relaxed`: that transaction, or the
        statement's own, commits with synchronous_commit off (relaxed_durability).
        `request_id` names the batch: a repeat answers the first one's ids."""
        options = []
        for name in _SEND_OPTIONS:
            values = [getattr(message, name) for message in messages]
            options.append(_optional_column(values))
        bodies = [m.body for m in messages]
        async with self._sending(queue, conn) as sending:
            statement = "send_batch_relaxed" if relaxed else "send_batch"
            row = await self._call(
                "fetchrow", statement, queue, bodies, *options, request_id, conn=sending
            )
        sent = len(row[1]) - sum(row[1])
        self.observer.sent(queue, sent)
        return row[0], row[1]

    async def send_bodies(
        self,
        queue: str,
        bodies: Sequence[bytes],
        deduplication_ids: Sequence[str | None] | None = None,
        request_id: str | None = None,
    ) -> SentBatch:
        """send_batch for messages that are nothing but a body and perhaps a deduplication
        id, the batch perhaps named by a request id."""
        options: tuple[Any, ...] = (None, None, None, deduplication_ids, *NO_SEND_OPTIONS[4:-1])
        options += (request_id,)
        async with self._sending(queue, None) as conn:
            row = await self._call("fetchrow", "send_batch", queue, bodies, *options, conn=conn)
        sent = len(row[1]) - sum(row[1])
        self.observer.sent(queue, sent)
        return row[0], row[1]

    async def receive(
        self,
        queue: str,
        max_messages: int,
        visibility_timeout: timedelta | None,
        scan_from: datetime | None = None,
        max_bytes: int | None = None,
        consumer_id: str | None = None,
    ) -> list[Record]:
        """Claims messages; each row's `more` says that max_bytes left some behind."""
        rows = await self._call(
            "fetch", "receive", queue, max_messages, visibility_timeout, scan_from, max_bytes,
            consumer_id,
        )  # fmt: skip
        self.observer.received(queue, rows)
        return rows

    async def next_visible_at(
        self, queue: str, scan_from: datetime | None = None
    ) -> datetime | None:
        return await self._call("fetchval", "next_visible_at", queue, scan_from)

    async def receive_floor(self, queue: str) -> datetime:
        return await self._call("fetchval", "receive_floor", queue)

    async def release(self, queue: str, receipts: Sequence[str]) -> int:
        return await self._call("fetchval", "release", queue, receipts)

    async def receipts_in_flight(self, receipts: Sequence[str]) -> int:
        return await self._call("fetchval", "receipts_in_flight", receipts)

    async def delete(self, queue: str, receipt: str, result: bytes | None = None) -> None:
        await self._call("execute", "delete", queue, receipt, result)
        self.observer.deleted(queue, 1)

    async def delivery_receipts(
        self, queue: str, message_ids: Sequence[int], receive_counts: Sequence[int]
    ) -> list[str]:
        """The receipt per (message id, receive count mod 4096): the message's while
        that delivery holds it, else one no delivery holds (stale or gone)."""
        return list(
            await self._call("fetchval", "delivery_receipts", queue, message_ids, receive_counts)
        )

    async def change_visibility(self, queue: str, receipt: str, timeout: timedelta) -> None:
        await self._call("execute", "change_visibility", queue, receipt, timeout)

    async def delete_batch(
        self, queue: str, receipts: Sequence[str], results: Sequence[bytes | None] | None = None
    ) -> list[str]:
        """An outcome per receipt; results[i] is what the job of receipts[i] returned."""
        rows = await self._call("fetch", "delete_batch", queue, receipts, results)
        outcomes = [row[0] for row in rows]
        self.observer.deleted(queue, outcomes.count("ok"))
        return outcomes

    async def delete_and_receive(
        self,
        queue: str,
        receipts: Sequence[str],
        max_messages: int,
        visibility_timeout: timedelta | None,
        scan_from: datetime | None = None,
        max_bytes: int | None = None,
        consumer_id: str | None = None,
    ) -> tuple[list[str], list[Record]]:
        """delete_batch's outcomes and receive's rows, committed together."""
        rows = await self._call(
            "fetch",
            "delete_and_receive",
            queue,
            receipts,
            max_messages,
            visibility_timeout,
            scan_from,
            max_bytes,
            consumer_id,
        )
        outcomes = list(rows[0]["outcomes"])
        received = [row for row in rows if row["message_id"] is not None]
        self.observer.deleted(queue, outcomes.count("ok"))
        self.observer.received(queue, received)
        return outcomes, received

    async def change_visibility_batch(
        self, queue: str, receipts: Sequence[str], timeouts: Sequence[timedelta]
    ) -> list[str]:
        rows = await self._call("fetch", "change_visibility_batch", queue, receipts, timeouts)
        return [row[0] for row in rows]

    async def nack(
        self,
        queue: str,
        receipt: str,
        delay: timedelta | None,
        error: str | None,
        dead_letter: bool = False,
    ) -> None:
        """Gives the message back for a retry, or with dead_letter ends its tries."""
        await self._call("execute", "nack", queue, receipt, delay, error, dead_letter)
        self.observer.nacked(queue, 1)

    async def nack_batch(self, queue: str, receipts: Sequence[str]) -> list[str]:
        """Gives messages back after the queue's retry backoff; an outcome per receipt."""
        rows = await self._call("fetch", "nack_batch", queue, receipts)
        outcomes = [row[0] for row in rows]
        self.observer.nacked(queue, outcomes.count("ok"))
        return outcomes

    async def peek_messages(
        self, queue: str, state: str | None, after_id: int, page_size: int
    ) -> list[Record]:
        return await self._call("fetch", "peek_messages", queue, state, after_id, page_size)

    async def get_message(self, queue: str, message_id: int) -> Record:
        return await self._call("fetchrow", "get_message", queue, message_id)

    async def cancel_message(self, queue: str, message_id: int) -> None:
        await self._call("execute", "cancel_message", queue, message_id)

    async def list_messages(
        self, queue: str | None, state: str | None, after_id: int, page_size: int
    ) -> list[Record]:
        """Messages' lives (postbox.list_messages): one queue's, or every queue's (None)."""
        return await self._call("fetch", "list_messages", queue, state, after_id, page_size)

    async def list_archived_messages(
        self, queue: str, after_id: int, page_size: int
    ) -> list[Record]:
        return await self._call("fetch", "list_archived_messages", queue, after_id, page_size)

    # Topics.

    async def create_topic(
        self, name: str, tags: dict[str, str], sns_attributes: dict[str, str],
        stream_retention: timedelta | None = None, payload_schema: dict[str, Any] | None = None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "create_topic", name, json.dumps(tags), json.dumps(sns_attributes),
            stream_retention, json.dumps(payload_schema),
        )  # fmt: skip

    async def update_topic(
        self, name: str, fields: Sequence[str], tags: dict[str, str],
        sns_attributes: dict[str, str], stream_retention: timedelta | None = None,
        payload_schema: dict[str, Any] | None = None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "update_topic", name, list(fields), json.dumps(tags),
            json.dumps(sns_attributes), stream_retention, json.dumps(payload_schema),
        )  # fmt: skip

    async def payload_schema(self, kind: str, name: str) -> tuple[bool, Any]:
        """The stored payload_schema of queue or topic `name` (kind "queues" or "topics"):
        (whether it exists, its schema or None)."""
        rows = await self._call("fetch", f"{kind[:-1]}_payload_schema", name)
        if not rows:
            return False, None
        text = rows[0]["payload_schema"]
        return True, None if text is None else json.loads(text)

    async def get_topic(self, name: str) -> Record:
        return await self._call("fetchrow", "get_topic", name)

    async def sns_signing_needs(
        self, topic: str, *, conn: Connection | None = None
    ) -> tuple[list[str], str | None]:
        """The topic ARNs of a topic's SNS subscriptions that get envelopes (not raw), and
        the topic's SignatureVersion attribute; no ARNs for a topic that is not there."""
        row = await self._call("fetchrow", "sns_signing_needs", topic, conn=conn)
        if row is None:
            return [], None
        return list(row["topic_arns"]), row["signature_version"]

    async def list_topics(self, page_size: int, after_name: str) -> list[Record]:
        return await self._call("fetch", "list_topics", page_size, after_name)

    async def delete_topic(self, name: str) -> None:
        await self._call("execute", "delete_topic", name)

    async def create_subscription(
        self, topic: str, name: str, pattern: str, queue: str | None, webhook_url: str | None,
        webhook_secret: str | None, webhook_settings: dict[str, Any],
        delivery: SubscriptionDelivery,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "create_subscription", topic, name, pattern, queue, webhook_url,
            webhook_secret, json.dumps(webhook_settings), *_delivery_arguments(delivery),
        )  # fmt: skip

    async def get_subscription(self, topic: str, name: str) -> Record:
        return await self._call("fetchrow", "get_subscription", topic, name)

    async def list_subscriptions(self, topic: str, page_size: int, after_name: str) -> list[Record]:
        return await self._call("fetch", "list_subscriptions", topic, page_size, after_name)

    async def update_subscription(
        self, topic: str, name: str, fields: Sequence[str], pattern: str | None,
        queue: str | None, webhook_url: str | None, webhook_secret: str | None,
        webhook_settings: dict[str, Any], delivery: SubscriptionDelivery,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "update_subscription", topic, name, list(fields), pattern, queue,
            webhook_url, webhook_secret, json.dumps(webhook_settings),
            *_delivery_arguments(delivery),
        )  # fmt: skip

    async def delete_subscription(self, topic: str, name: str) -> None:
        await self._call("execute", "delete_subscription", topic, name)

    async def publish_batch(
        self,
        topic: str,
        messages: Sequence[OutgoingPublish],
        *,
        conn: Connection | None = None,
        signatures: PublishSignatures | None = None,
    ) -> list[Record]:
        """Per message: publish_id, queues, message_ids, duplicates, webhook_deliveries.
        On `conn` it joins that connection's transaction (group commit)."""
        rows = await self._call(
            "fetch", "publish_batch", topic, [m.body for m in messages],
            [m.routing_key for m in messages],
            _optional_column([m.attributes for m in messages]),
            _optional_column([m.ordering_key for m in messages]),
            _optional_column([m.deduplication_id for m in messages]),
            _optional_column([m.subject for m in messages]),
            *(
                (None, None, None, None) if signatures is None else (
                    [json.dumps(s) for s in signatures.by_topic_arn], signatures.version,
                    signatures.publish_ids, signatures.published_at,
                )
            ),
            _optional_column([m.delay for m in messages]),
            conn=conn,
        )  # fmt: skip
        # What the fan-out put into each queue is sent to that queue, as a Send is;
        # counted once per queue, not per message (a group of Publishes to a topic
        # with many queues would otherwise spend more here than on the call).
        sent: collections.Counter[str] = collections.Counter()
        for row in rows:
            for queue, duplicate in zip(row["queues"] or (), row["duplicates"] or (), strict=True):
                if not duplicate:
                    sent[queue] += 1
        for queue, amount in sent.items():
            self.observer.sent(queue, amount)
        return rows

    # Stream topics. Group rows carry topic, name, created_at, cursor_offset, acked_at,
    # lease_expires_at, lag_messages, lag_seconds, paused, retry_messages, max_deliveries
    # and dead_letters.

    async def publish_delayed(self, topic: str, entry: OutgoingPublish, delay: timedelta) -> UUID:
        """A stream topic's message, appended to its log once `delay` has passed."""
        return await self._call(
            "fetchval", "publish_delayed", topic, entry.body, delay, entry.routing_key,
            entry.attributes, entry.ordering_key, entry.subject,
        )  # fmt: skip

    async def publish_delayed_batch(
        self, topic: str, entries: Sequence[tuple[OutgoingPublish, timedelta]]
    ) -> list[UUID]:
        """A stream topic's messages, each appended to its log once its delay has
        passed (0: at once), in one transaction: all or none."""
        async with self._transaction() as conn:
            return [
                await self._call(
                    "fetchval", "publish_delayed", topic, entry.body, delay, entry.routing_key,
                    entry.attributes, entry.ordering_key, entry.subject, conn=conn,
                )
                for entry, delay in entries
            ]  # fmt: skip

    async def publish_due_streams(self, max_messages: int) -> int:
        """Delayed stream messages that were due, appended to their logs."""
        return await self._call("fetchval", "publish_due_streams", max_messages)

    async def create_consumer_group(
        self, topic: str, name: str, start: str, start_time: datetime | None,
        max_deliveries: int | None = None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "create_consumer_group", topic, name, start, start_time, max_deliveries
        )

    async def set_consumer_group_max_deliveries(
        self, topic: str, name: str, max_deliveries: int | None
    ) -> Record:
        return await self._call(
            "fetchrow", "set_consumer_group_max_deliveries", topic, name, max_deliveries
        )

    async def list_stream_dead_letters(
        self, topic: str, group: str, page_size: int, after_offset: int
    ) -> list[Record]:
        """Dead letters in offset order: message rows with delivery_count, dead_at, reason."""
        return await self._call(
            "fetch", "list_stream_dead_letters", topic, group, page_size, after_offset
        )

    async def replay_stream_dead_letters(
        self, topic: str, group: str, offsets: Sequence[int] | None
    ) -> int:
        """How many went back to the group; offsets None: all."""
        chosen = None if offsets is None else list(offsets)
        return await self._call("fetchval", "replay_stream_dead_letters", topic, group, chosen)

    async def purge_stream_dead_letters(
        self, topic: str, group: str, older_than: datetime | None
    ) -> int:
        return await self._call("fetchval", "purge_stream_dead_letters", topic, group, older_than)

    async def get_consumer_group(self, topic: str, name: str) -> Record:
        return await self._call("fetchrow", "get_consumer_group", topic, name)

    async def list_consumer_groups(
        self, topic: str, page_size: int, after_name: str
    ) -> list[Record]:
        return await self._call("fetch", "list_consumer_groups", topic, page_size, after_name)

    async def delete_consumer_group(self, topic: str, name: str) -> None:
        await self._call("execute", "delete_consumer_group", topic, name)

    async def pause_consumer_group(self, topic: str, name: str) -> Record:
        return await self._call("fetchrow", "pause_consumer_group", topic, name)

    async def resume_consumer_group(self, topic: str, name: str) -> Record:
        return await self._call("fetchrow", "resume_consumer_group", topic, name)

    async def read_stream(
        self, topic: str, group: str, max_messages: int, lease_duration: timedelta,
        min_messages: int, max_batch_wait: timedelta | None,
    ) -> list[Record]:  # fmt: skip
        """The batch's rows (each with the batch token and its delivery count); [] if none."""
        return await self._call(
            "fetch", "read_stream", topic, group, max_messages, lease_duration, min_messages,
            max_batch_wait,
        )  # fmt: skip

    async def ack_stream(
        self, topic: str, group: str, batch: UUID, nack_offsets: Sequence[int] = (),
        nack_delay: timedelta = timedelta(0),
    ) -> int:  # fmt: skip
        """The group's cursor offset after the ack; nack_offsets are given back."""
        return await self._call(
            "fetchval", "ack_stream", topic, group, batch, list(nack_offsets), nack_delay
        )

    async def seek_consumer_group(
        self, topic: str, group: str, to_offset: int | None, to_time: datetime | None
    ) -> Record:
        return await self._call("fetchrow", "seek_consumer_group", topic, group, to_offset, to_time)

    async def read_stream_range(
        self, topic: str, after: tuple[int, int], until: tuple[int, int] | None, max_messages: int
    ) -> list[Record]:
        """Rows of the log by position (each with its tx and stream_offset); no lease."""
        until_tx, until_offset = until if until is not None else (None, None)
        return await self._call(
            "fetch", "read_stream_range", topic, after[0], after[1], until_tx, until_offset,
            max_messages,
        )  # fmt: skip

    async def read_stream_positions(
        self, topic: str, after: tuple[int, int], until: tuple[int, int] | None, max_messages: int
    ) -> Record:
        """Where the range of read_stream_range would end after max_messages rows, without
        reading them: last_tx, last_offset and message_count (the rows passed over)."""
        until_tx, until_offset = until if until is not None else (None, None)
        return await self._call(
            "fetchrow", "read_stream_positions", topic, after[0], after[1], until_tx, until_offset,
            max_messages,
        )  # fmt: skip

    async def stream_position(self, topic: str, group: str) -> Record:
        """The group's cursor (cursor_tx, cursor_offset) and the log's end for readers now
        (end_tx, end_offset)."""
        return await self._call("fetchrow", "stream_position", topic, group)

    async def set_consumer_group_cursor(
        self, topic: str, group: str, position: tuple[int, int]
    ) -> Record:
        return await self._call(
            "fetchrow", "set_consumer_group_cursor", topic, group, position[0], position[1]
        )

    async def rotate_streams(self, rotation_period: timedelta | None, lock_wait: timedelta) -> int:
        """Slots of the stream log truncated by one rotation pass."""
        return await self._call("fetchval", "rotate_streams", rotation_period, lock_wait)

    async def list_webhook_deliveries(
        self, topic: str, subscription: str, state: str | None, after_id: int, page_size: int
    ) -> list[Record]:
        return await self._call(
            "fetch", "list_webhook_deliveries", topic, subscription, state, after_id, page_size
        )

    async def retry_webhook_deliveries(
        self, topic: str, subscription: str, delivery_id: int | None
    ) -> int:
        return await self._call(
            "fetchval", "retry_webhook_deliveries", topic, subscription, delivery_id
        )

    async def claim_webhook_deliveries(self, max_deliveries: int) -> list[Record]:
        return await self._call("fetch", "claim_webhook_deliveries", max_deliveries)

    async def finish_webhook_delivery(
        self, delivery_id: int, lease: UUID, status: int | None, error: str | None
    ) -> str:
        """The outcome: delivered, retrying, failed or stale."""
        return await self._call(
            "fetchval", "finish_webhook_deliveries", [delivery_id], [lease], [status], [error]
        )

    async def next_webhook_attempt_at(self) -> datetime | None:
        return await self._call("fetchval", "next_webhook_attempt_at")

    async def expire_webhook_deliveries(self, batch_size: int) -> int:
        return await self._call("fetchval", "expire_webhook_deliveries", batch_size)

    # Schedules.

    async def create_schedule(
        self, name: str, next_fire_at: datetime, schedule: ScheduleFields
    ) -> Record:
        return await self._call(
            "fetchrow", "create_schedule", name, next_fire_at, *schedule.arguments()
        )

    async def update_schedule(
        self, name: str, changed: Sequence[str], next_fire_at: datetime | None,
        schedule: ScheduleFields,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "update_schedule", name, list(changed), next_fire_at, *schedule.arguments()
        )

    async def get_schedule(self, name: str) -> Record:
        return await self._call("fetchrow", "get_schedule", name)

    async def list_schedules(
        self, page_size: int, after_name: str, *, paused: bool | None = None,
        target_kind: str | None = None, name_prefix: str = "",
    ) -> list[Record]:  # fmt: skip
        return await self._call(
            "fetch", "list_schedules", page_size, after_name, paused, target_kind, name_prefix
        )

    async def delete_schedule(self, name: str) -> None:
        await self._call("execute", "delete_schedule", name)

    async def pause_schedule(self, name: str) -> Record:
        return await self._call("fetchrow", "pause_schedule", name)

    async def run_schedule(self, name: str) -> Record:
        """The schedule after the run, with the ids of the committed messages (message_ids)."""
        return await self._call("fetchrow", "run_schedule", name)

    async def resume_schedule(self, name: str, next_fire: NextFire) -> Record:
        async with self._transaction() as conn:
            row = _one(await conn.fetchrow(self._sql["lock_schedule"], name))
            return _one(
                await conn.fetchrow(
                    self._sql["resume_schedule"], name, next_fire(row, row["db_now"])
                )
            )

    async def fire_due_schedules(
        self, max_schedules: int, plan: FirePlan, refusal: FireRefusal = _no_refusal
    ) -> list[tuple[Record, str | None, int]]:
        """Claims due schedules and fires each as `plan` says (more than once to catch
        up missed due times), all in one transaction; a schedule that `refusal` refuses
        fails each of those fires with its reason instead of sending.

        Per fire: the schedule's row as claimed, the error of a refused fire, and how
        many webhook deliveries the fire queued. A fire that pauses the schedule (its
        failure_threshold) ends its catch-up.
        """
        fired = []
        async with self._transaction() as conn:
            for row in await conn.fetch(self._sql["claim_due_schedules"], max_schedules):
                refused = await refusal(row)
                for following in plan(row, row["db_now"]):
                    error, webhook_deliveries, paused = _one(
                        await conn.fetchrow(
                            self._sql["fire_schedule"], row["id"], following, refused
                        )
                    )
                    fired.append((row, error, webhook_deliveries))
                    if paused:
                        break
        return fired

    async def next_schedule_fire_at(self) -> datetime | None:
        return await self._call("fetchval", "next_schedule_fire_at")

    # API keys: grants are parallel arrays of permissions and patterns.

    async def create_key(
        self, name: str, secret_sha256: bytes, sigv4_secret: str, permissions: Sequence[str],
        patterns: Sequence[str], expires_at: datetime | None, rate_limits: str | None = None,
        tenant: str = "",
    ) -> Record:  # fmt: skip
        """`rate_limits`: the RateLimits message as JSON, or None for none; `tenant`: ""
        for the default tenant."""
        return await self._call(
            "fetchrow", "create_key", name, secret_sha256, sigv4_secret, list(permissions),
            list(patterns), expires_at, rate_limits, tenant,
        )  # fmt: skip

    # `tenant` of the key lookups: the caller's ("" for the default tenant); None: any.

    async def get_key(self, name: str, tenant: str | None = None) -> Record:
        return await self._call("fetchrow", "get_key", name, tenant)

    async def list_keys(
        self, page_size: int, after_name: str, tenant: str | None = None
    ) -> list[Record]:
        return await self._call("fetch", "list_keys", page_size, after_name, tenant)

    async def update_key(
        self, name: str, permissions: Sequence[str] | None, patterns: Sequence[str] | None,
        set_expiry: bool, expires_at: datetime | None, set_rate_limits: bool = False,
        rate_limits: str | None = None, tenant: str | None = None,
    ) -> Record:  # fmt: skip
        return await self._call(
            "fetchrow", "update_key", name,
            None if permissions is None else list(permissions),
            None if patterns is None else list(patterns), set_expiry, expires_at,
            set_rate_limits, rate_limits, tenant,
        )  # fmt: skip

    async def delete_key(self, name: str, tenant: str | None = None) -> None:
        await self._call("execute", "delete_key", name, tenant)

    # Tenants (the default tenant has no row).

    async def create_tenant(
        self,
        name: str,
        account_id: str | None,
        description: str,
        quota: dict[str, int] | None,
        rate_limits: str | None = None,
    ) -> Record:
        """`quota`: the engine's quota fields (postbox.tenant_quota_problem); None: none.
        `rate_limits`: the RateLimits message as JSON, or None for none."""
        return await self._call(
            "fetchrow", "create_tenant", name, account_id, description, _json_or_none(quota),
            rate_limits,
        )  # fmt: skip

    async def get_tenant(self, name: str) -> Record:
        return await self._call("fetchrow", "get_tenant", name)

    async def list_tenants(self, page_size: int, after_name: str) -> list[Record]:
        return await self._call("fetch", "list_tenants", page_size, after_name)

    async def update_tenant(
        self,
        name: str,
        account_id: str | None,
        description: str | None,
        quota: dict[str, int] | None = None,
        set_rate_limits: bool = False,
        rate_limits: str | None = None,
    ) -> Record:
        """Changes the fields given (None: leave it); of `quota`, the fields it holds;
        the rate limits when set_rate_limits (`rate_limits` None: none)."""
        return await self._call(
            "fetchrow", "update_tenant", name, account_id is not None, account_id,
            description is not None, description, _json_or_none(quota),
            set_rate_limits, rate_limits,
        )  # fmt: skip

    async def delete_tenant(self, name: str, force: bool) -> None:
        await self._call("execute", "delete_tenant", name, force)

    async def tenant_usage(self, max_age: timedelta) -> list[Record]:
        """Each tenant's quotas and what it held at the last count (postbox.tenant_usage),
        counted again first when that is older than max_age: one pass over the tenants'
        queues' messages, so called every few seconds, never per call."""
        return await self._call("fetch", "tenant_usage", max_age)

    # Maintenance.

    async def run_redrives(self, batch_size: int) -> int | None:
        """How many messages the running redrives moved; None when none was running."""
        return await self._call("fetchval", "run_redrives", batch_size)

    async def expire_messages(self, batch_size: int) -> int:
        return await self._call("fetchval", "expire_messages", batch_size)

    async def stream_metrics(self, max_groups: int) -> list[Record]:
        """Lag of the first max_groups consumer groups by topic and name."""
        return await self._call("fetch", "stream_metrics", max_groups)

    async def consumer_metrics(self, max_consumers: int) -> list[Record]:
        """In-flight messages per queue and consumer (postbox.consumer_metrics)."""
        return await self._call("fetch", "consumer_metrics", max_consumers)

    async def queue_metrics(self, max_queues: int) -> list[Record]:
        """Depth figures of the first max_queues queues by name (postbox.queue_metrics)."""
        return await self._call("fetch", "queue_metrics", max_queues)

    async def expire_records(self, batch_size: int) -> int:
        return await self._call("fetchval", "expire_records", batch_size)

    async def expire_activity(self) -> int:
        return await self._call("fetchval", "expire_activity")

    async def record_activity(self, pending: dict[str, Counts]) -> None:
        """Adds a flush's per-queue counts to postbox.queue_activity, in one statement."""
        counts = pending.values()
        await self._call(
            "execute", "record_activity", list(pending),
            [c.sent for c in counts], [c.received for c in counts], [c.deleted for c in counts],
            [c.latency_sum for c in counts], [c.latency_count for c in counts],
            [c.latency_max for c in counts],
        )  # fmt: skip
