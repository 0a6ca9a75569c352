"""QueueService: queue lifecycle, attributes, statistics, pausing and redrives."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import grpc
from postbox.v1 import queue_service_pb2 as pb
from postbox.v1 import queue_service_pb2_grpc

from postbox_server.db.engine import Engine, Row
from postbox_server.errors import ApiError, invalid, quoted
from postbox_server.queue_names import (
    DEAD_LETTER_SUFFIX,
    MAX_QUEUE_NAME,
    dead_letter_queue_name,
)
from postbox_server.services import convert, payload_schemas
from postbox_server.services.pagination import (
    decode_page_token,
    foreign_token,
    is_bigint_id,
    next_page,
    page_size_of,
)
from postbox_server.services.payload_schema_cache import PayloadSchemaCache
from postbox_server.services.status import reports_errors

# A queue's max_message_size when none is given (the engine's default).
DEFAULT_MAX_MESSAGE_SIZE = 1024 * 1024
# A dead_letter_policy's max_receive_count: the engine's bounds, and what
# CreateQueue's with_dead_letter_queue sets when not told.
MAX_RECEIVE_COUNT = 1000
DEFAULT_MAX_RECEIVE_COUNT = 5

_PERMISSIONS = {
    pb.RedriveAllowPolicy.PERMISSION_UNSPECIFIED: "allow_all",
    pb.RedriveAllowPolicy.PERMISSION_ALLOW_ALL: "allow_all",
    pb.RedriveAllowPolicy.PERMISSION_DENY_ALL: "deny_all",
    pb.RedriveAllowPolicy.PERMISSION_BY_QUEUE: "by_queue",
}
_PERMISSION_ENUMS = {
    "allow_all": pb.RedriveAllowPolicy.PERMISSION_ALLOW_ALL,
    "deny_all": pb.RedriveAllowPolicy.PERMISSION_DENY_ALL,
    "by_queue": pb.RedriveAllowPolicy.PERMISSION_BY_QUEUE,
}
# The engine's words for the high-throughput FIFO settings; unspecified: the default.
_SCOPES = {
    pb.DEDUPLICATION_SCOPE_UNSPECIFIED: None,
    pb.DEDUPLICATION_SCOPE_QUEUE: "queue",
    pb.DEDUPLICATION_SCOPE_MESSAGE_GROUP: "message_group",
}
_THROUGHPUT_LIMITS = {
    pb.FIFO_THROUGHPUT_LIMIT_UNSPECIFIED: None,
    pb.FIFO_THROUGHPUT_LIMIT_PER_QUEUE: "per_queue",
    pb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID: "per_message_group_id",
}
_SCOPE_ENUMS = {word: value for value, word in _SCOPES.items() if word is not None}
_THROUGHPUT_LIMIT_ENUMS = {
    word: value for value, word in _THROUGHPUT_LIMITS.items() if word is not None
}
_TASK_STATES = {
    "running": pb.RedriveTask.STATE_RUNNING,
    "completed": pb.RedriveTask.STATE_COMPLETED,
    "cancelled": pb.RedriveTask.STATE_CANCELLED,
    "failed": pb.RedriveTask.STATE_FAILED,
}


def _enum_setting(queue: pb.Queue, field: str, words: Mapping[Any, str | None]) -> str | None:
    value = getattr(queue, field)
    if value not in words:
        raise invalid(f"{field} is {value}, which is none of its enum's values")
    return words[value]


def _duration_setting(queue: pb.Queue, field: str) -> float | None:
    return convert.seconds(getattr(queue, field)) if queue.HasField(field) else None


def _retention_setting(queue: pb.Queue, field: str) -> float | None:
    """The engine's value for a Retention: None for the default, 0 for forever."""
    if not queue.HasField(field):
        return None
    retention = getattr(queue, field)
    if not retention.HasField("period"):
        return 0
    seconds = convert.seconds(retention.period)
    if seconds <= 0:
        raise invalid(
            f"{field}.period is {seconds} s; it must be 60 s to 14 days, or leave period "
            "unset to keep messages forever"
        )
    return seconds


def _positive_setting(queue: pb.Queue, field: str) -> float | None:
    """An optional limit: None (unset) for none, else a value above 0."""
    if not queue.HasField(field):
        return None
    value = getattr(queue, field)
    if value <= 0:
        raise invalid(f"{field} is {value}; it must be above 0, or unset for no limit")
    return value


def _dead_letter_policy(queue: pb.Queue) -> dict[str, Any] | None:
    if not queue.HasField("dead_letter_policy"):
        return None
    policy = queue.dead_letter_policy
    return {
        "dead_letter_queue": policy.dead_letter_queue,
        "max_receive_count": policy.max_receive_count,
    }


def _redrive_allow_policy(queue: pb.Queue) -> dict[str, Any] | None:
    if not queue.HasField("redrive_allow_policy"):
        return None
    policy = queue.redrive_allow_policy
    if policy.permission not in _PERMISSIONS:
        raise invalid(
            f"redrive_allow_policy.permission {policy.permission} is not a known permission"
        )
    return {
        "permission": _PERMISSIONS[policy.permission],
        "source_queues": list(policy.source_queues),
    }


def _retry_policy(queue: pb.Queue) -> dict[str, Any] | None:
    if not queue.HasField("retry_policy"):
        return None
    policy = queue.retry_policy
    # Unset bounds keep the engine's defaults.
    return {
        name: convert.seconds(getattr(policy, name))
        for name in ("minimum_backoff", "maximum_backoff")
        if policy.HasField(name)
    }


# Queue attributes a caller may set: API field -> its value for the engine's
# settings (same names; seconds for durations; None for "the default").
SETTINGS: dict[str, Callable[[pb.Queue], Any]] = {
    "visibility_timeout": lambda q: _duration_setting(q, "visibility_timeout"),
    "delivery_delay": lambda q: _duration_setting(q, "delivery_delay"),
    "retention": lambda q: _retention_setting(q, "retention"),
    "max_message_size": lambda q: q.max_message_size or None,
    "receive_wait_time": lambda q: _duration_setting(q, "receive_wait_time"),
    "content_based_deduplication": lambda q: q.content_based_deduplication,
    "deduplication_window": lambda q: _duration_setting(q, "deduplication_window"),
    "dead_letter_policy": _dead_letter_policy,
    "redrive_allow_policy": _redrive_allow_policy,
    "retry_policy": _retry_policy,
    "archive_on_delete": lambda q: q.archive_on_delete,
    "archive_retention": lambda q: _retention_setting(q, "archive_retention"),
    "max_depth": lambda q: _positive_setting(q, "max_depth"),
    "receive_rate_limit": lambda q: _positive_setting(q, "receive_rate_limit"),
    "tags": lambda q: dict(q.tags),
    "access_policy": lambda q: q.access_policy,
    "deduplication_scope": lambda q: _enum_setting(q, "deduplication_scope", _SCOPES),
    "fifo_throughput_limit": lambda q: _enum_setting(
        q, "fifo_throughput_limit", _THROUGHPUT_LIMITS
    ),
    # Compiled here, so that a schema that cannot check anything is refused now.
    "payload_schema": lambda q: (
        payload_schemas.setting(q.payload_schema) if q.HasField("payload_schema") else None
    ),
}

_DURATIONS = (
    "visibility_timeout",
    "delivery_delay",
    "receive_wait_time",
    "deduplication_window",
)
_RETENTIONS = ("retention", "archive_retention")  # NULL in the engine: forever


def queue_settings(queue: pb.Queue, fields: list[str], max_message_size: int) -> dict[str, Any]:
    """The engine's settings for these fields of `queue`, on a server that accepts
    messages of at most max_message_size bytes."""
    if queue.max_message_size > max_message_size:
        raise invalid(
            f"max_message_size is {queue.max_message_size} bytes; this server accepts messages "
            f"of at most {max_message_size} bytes (--max-message-size)"
        )
    settings = {field: SETTINGS[field](queue) for field in fields}
    if "max_message_size" in settings and settings["max_message_size"] is None:
        # The default, unless this server accepts less: a queue never promises more.
        settings["max_message_size"] = min(DEFAULT_MAX_MESSAGE_SIZE, max_message_size)
    return settings


def _dead_letter_queue_of(request: pb.CreateQueueRequest) -> str:
    """The name of the dead-letter queue a CreateQueue with with_dead_letter_queue makes;
    INVALID_ARGUMENT for a request that cannot have one."""
    name = request.queue.name
    if request.queue.HasField("dead_letter_policy"):
        raise invalid(
            "with_dead_letter_queue sets queue.dead_letter_policy itself: leave the policy "
            "unset, or create the dead-letter queue yourself and drop with_dead_letter_queue"
        )
    count = request.dead_letter_max_receive_count
    if not 0 <= count <= MAX_RECEIVE_COUNT:
        raise invalid(
            f"dead_letter_max_receive_count is {count}; it must be 1 to {MAX_RECEIVE_COUNT}, "
            f"or 0 for {DEFAULT_MAX_RECEIVE_COUNT}"
        )
    dead_letter_queue = dead_letter_queue_name(name)
    if name and len(dead_letter_queue) > MAX_QUEUE_NAME:
        room = MAX_QUEUE_NAME - len(DEAD_LETTER_SUFFIX)
        raise invalid(
            f"queue name {quoted(name)} is {len(name)} characters long; with_dead_letter_queue "
            f"adds {DEAD_LETTER_SUFFIX!r} to it for the dead-letter queue, whose name may have "
            f"at most {MAX_QUEUE_NAME} characters: give a name of at most {room}"
        )
    return dead_letter_queue


def default_settings(max_message_size: int) -> dict[str, Any]:
    """The settings of a queue created without any: what CreateQueue with a bare name gives."""
    return queue_settings(pb.Queue(), list(SETTINGS), max_message_size)


def queue_resource(row: Row, *, with_payload_schema: bool = True) -> pb.Queue:
    """A row of postbox.queues (with its dead_letter_queue name) as an API Queue; its
    payload_schema (up to 256 KiB) only when asked for, as GetQueue does and a page of
    ListQueues does not."""
    queue = pb.Queue(
        name=row["name"],
        max_message_size=row["max_message_size"],
        create_time=convert.timestamp(row["created_at"]),
        update_time=convert.timestamp(row["updated_at"]),
        purge_time=convert.timestamp(row["purged_at"]),
        fifo=row["fifo"],
        content_based_deduplication=row["content_based_deduplication"],
        archive_on_delete=row["archive_on_delete"],
        send_paused=row["send_paused"],
        receive_paused=row["receive_paused"],
        tags=json.loads(row["tags"]),
        access_policy=row["access_policy"],
        deduplication_scope=_SCOPE_ENUMS[row["deduplication_scope"]],
        fifo_throughput_limit=_THROUGHPUT_LIMIT_ENUMS[row["fifo_throughput_limit"]],
        payload_schema=(
            payload_schemas.resource(row["payload_schema"]) if with_payload_schema else None
        ),
        redrive_allow_policy=pb.RedriveAllowPolicy(
            permission=_PERMISSION_ENUMS[row["redrive_permission"]],
            source_queues=row["redrive_sources"],
        ),
        retry_policy=pb.RetryPolicy(
            minimum_backoff=convert.duration(row["retry_minimum_backoff"]),
            maximum_backoff=convert.duration(row["retry_maximum_backoff"]),
        ),
    )
    for field in _DURATIONS:
        getattr(queue, field).CopyFrom(convert.duration(row[field]))
    for field in _RETENTIONS:
        getattr(queue, field).SetInParent()  # without a period: forever
        if row[field] is not None:
            getattr(queue, field).period.CopyFrom(convert.duration(row[field]))
    for field in ("max_depth", "receive_rate_limit"):
        if row[field] is not None:
            setattr(queue, field, row[field])
    if row["dead_letter_queue"] is not None:
        queue.dead_letter_policy.CopyFrom(
            pb.DeadLetterPolicy(
                dead_letter_queue=row["dead_letter_queue"],
                max_receive_count=row["max_receive_count"],
            )
        )
    if "visible" in row:
        queue.stats.CopyFrom(
            pb.QueueStats(
                visible_messages=row["visible"],
                in_flight_messages=row["in_flight"],
                delayed_messages=row["delayed"],
                oldest_message_age=convert.duration(row["oldest_age"]),
                newest_message_age=convert.duration(row["newest_age"]),
                sent_messages_total=row["sent_total"],
                sent_per_second=row["sent_per_second"],
                received_per_second=row["received_per_second"],
            )
        )
    return queue


def redrive_task(row: Row) -> pb.RedriveTask:
    return pb.RedriveTask(
        task_id=str(row["id"]),
        dead_letter_queue=row["dead_letter_queue"] or "",
        destination=row["destination"] or "",
        max_messages=row["max_messages"],
        max_messages_per_second=row["rate"],
        state=_TASK_STATES[row["status"]],
        moved_messages=row["moved"],
        messages_to_move=row["to_move"],
        failure_reason=row["failure_reason"] or "",
        create_time=convert.timestamp(row["created_at"]),
        update_time=convert.timestamp(row["updated_at"]),
        message_ids=[str(i) for i in row["message_ids"] or ()],
    )


class QueueService(queue_service_pb2_grpc.QueueServiceServicer):
    def __init__(
        self,
        engine: Engine,
        *,
        max_message_size: int,
        payload_schemas: PayloadSchemaCache | None = None,
    ) -> None:
        self.engine = engine
        self.max_message_size = max_message_size
        # This server's compiled schemas, told at once of a change made here.
        self.payload_schemas = payload_schemas

    def _schema_changed(self, name: str) -> None:
        if self.payload_schemas is not None:
            self.payload_schemas.forget("queues", name)

    def _settings(self, queue: pb.Queue, fields: list[str]) -> dict[str, Any]:
        return queue_settings(queue, fields, self.max_message_size)

    @reports_errors
    async def CreateQueue(
        self, request: pb.CreateQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateQueueResponse:
        if not request.HasField("queue"):
            raise invalid("queue is required: give at least queue.name")
        settings = self._settings(request.queue, list(SETTINGS))
        if not request.with_dead_letter_queue:
            if request.dead_letter_max_receive_count:
                raise invalid(
                    "dead_letter_max_receive_count is for with_dead_letter_queue; for a "
                    "dead-letter queue of your own, set queue.dead_letter_policy"
                )
            row = await self.engine.create_queue(request.queue.name, settings)
            self._schema_changed(request.queue.name)
            return pb.CreateQueueResponse(queue=queue_resource(row))
        name = request.queue.name
        dead_letter_queue = _dead_letter_queue_of(request)
        row = await self.engine.create_queue_with_dead_letter_queue(
            name, settings, dead_letter_queue, default_settings(self.max_message_size),
            request.dead_letter_max_receive_count or DEFAULT_MAX_RECEIVE_COUNT,
        )  # fmt: skip
        self._schema_changed(name)
        return pb.CreateQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def GetQueue(
        self, request: pb.GetQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueResponse:
        if request.view not in pb.QueueView.values():
            raise invalid(f"view {request.view} is not a QueueView")
        if request.view == pb.QUEUE_VIEW_BASIC:
            row = await self.engine.get_queue(request.name)
        else:
            row = await self.engine.get_queue_with_stats(request.name)
        return pb.GetQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListQueuesResponse:
        if request.view not in pb.QueueView.values():
            raise invalid(f"view {request.view} is not a QueueView")
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListQueues")
        rows = await self.engine.list_queues(
            page_size + 1, after, request.name_prefix, request.view == pb.QUEUE_VIEW_FULL
        )
        page, token = next_page(rows, page_size, "ListQueues")
        return pb.ListQueuesResponse(
            queues=[queue_resource(row, with_payload_schema=False) for row in page],
            next_page_token=token,
        )

    @reports_errors
    async def UpdateQueue(
        self, request: pb.UpdateQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateQueueResponse:
        paths = list(request.update_mask.paths)
        if not paths:
            raise invalid(f"update_mask is required: name any of {', '.join(SETTINGS)}")
        unknown = [path for path in paths if path not in SETTINGS]
        if unknown:
            raise invalid(
                f"update_mask names {', '.join(unknown)}; only {', '.join(SETTINGS)} can change"
            )
        row = await self.engine.update_queue(
            request.queue.name, self._settings(request.queue, paths)
        )
        self._schema_changed(request.queue.name)
        return pb.UpdateQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteQueueResponse:
        await self.engine.drop_queue(request.name)
        self._schema_changed(request.name)
        return pb.DeleteQueueResponse()

    @reports_errors
    async def PurgeQueue(
        self, request: pb.PurgeQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.PurgeQueueResponse:
        purged = await self.engine.purge_queue(request.name)
        return pb.PurgeQueueResponse(purged_messages=purged)

    @reports_errors
    async def PauseQueue(
        self, request: pb.PauseQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseQueueResponse:
        row = await self.engine.pause_queue(request.name, request.sends, request.receives)
        return pb.PauseQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def ResumeQueue(
        self, request: pb.ResumeQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResumeQueueResponse:
        row = await self.engine.resume_queue(request.name, request.sends, request.receives)
        return pb.ResumeQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def ListDeadLetterSourceQueues(
        self, request: pb.ListDeadLetterSourceQueuesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListDeadLetterSourceQueuesResponse:
        page_size = page_size_of(request.page_size)
        method = "ListDeadLetterSourceQueues"
        after = decode_page_token(request.page_token, method)
        names = await self.engine.list_dead_letter_source_queues(
            request.dead_letter_queue, page_size + 1, after
        )
        page, token = next_page([{"name": name} for name in names], page_size, method)
        return pb.ListDeadLetterSourceQueuesResponse(
            queue_names=[row["name"] for row in page], next_page_token=token
        )

    @reports_errors
    async def RedriveMessages(
        self, request: pb.RedriveMessagesRequest, context: grpc.aio.ServicerContext
    ) -> pb.RedriveMessagesResponse:
        max_messages = request.max_messages if request.HasField("max_messages") else None
        rate = (
            request.max_messages_per_second if request.HasField("max_messages_per_second") else None
        )
        ids = [_dead_letter_id(text) for text in request.message_ids] or None
        row = await self.engine.start_redrive(
            request.dead_letter_queue, request.destination or None, max_messages, rate, ids
        )
        return pb.RedriveMessagesResponse(task=redrive_task(row))

    @reports_errors
    async def ListRedriveTasks(
        self, request: pb.ListRedriveTasksRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListRedriveTasksResponse:
        page_size = page_size_of(request.page_size, default=10, limit=100)
        method = "ListRedriveTasks"
        after = decode_page_token(request.page_token, method)
        try:
            after_task = _task_id(after) if after else None
        except ApiError:
            raise foreign_token(method) from None
        rows = await self.engine.list_redrive_tasks(
            request.dead_letter_queue, page_size + 1, after_task
        )
        page, token = next_page(rows, page_size, method, key="id")
        return pb.ListRedriveTasksResponse(
            tasks=[redrive_task(row) for row in page], next_page_token=token
        )

    @reports_errors
    async def CancelRedriveTask(
        self, request: pb.CancelRedriveTaskRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelRedriveTaskResponse:
        row = await self.engine.cancel_redrive(_task_id(request.task_id))
        return pb.CancelRedriveTaskResponse(task=redrive_task(row))


def _task_id(text: str) -> uuid.UUID:
    refusal = invalid(f"task_id {quoted(text)} is not a task id of RedriveMessages")
    # uuid.UUID reads other scripts' digits as hex digits, as int() does.
    if not text.isascii():
        raise refusal
    try:
        return uuid.UUID(text)
    except ValueError:
        raise refusal from None


def _dead_letter_id(text: str) -> int:
    if not is_bigint_id(text):
        raise invalid(f"message_ids: {quoted(text)} is not a message id of this server")
    return int(text)
