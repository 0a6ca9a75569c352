"""QueueService: queue lifecycle, attributes and live statistics."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import grpc
from postbox.v1 import queue_service_pb2 as pb
from postbox.v1 import queue_service_pb2_grpc

from server.db.engine import Engine
from server.errors import invalid
from server.services import convert
from server.services.status import reports_errors

# Queue attributes a caller may set: API field -> whether it is a Duration. The
# engine's settings use the same names, durations in seconds.
SETTINGS = {
    "visibility_timeout": True,
    "delivery_delay": True,
    "retention": True,
    "max_message_size": False,
    "receive_wait_time": True,
}

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def queue_resource(row: Mapping[str, Any]) -> pb.Queue:
    queue = pb.Queue(
        name=row["name"],
        max_message_size=row["max_message_size"],
        create_time=convert.timestamp(row["created_at"]),
        update_time=convert.timestamp(row["updated_at"]),
    )
    for field, is_duration in SETTINGS.items():
        if is_duration:
            getattr(queue, field).CopyFrom(convert.duration(row[field]))
    if "visible" in row:
        queue.stats.CopyFrom(
            pb.QueueStats(
                visible_messages=row["visible"],
                in_flight_messages=row["in_flight"],
                delayed_messages=row["delayed"],
                oldest_message_age=convert.duration(row["oldest_age"]),
            )
        )
    return queue


class QueueService(queue_service_pb2_grpc.QueueServiceServicer):
    def __init__(self, engine: Engine, *, max_message_size: int) -> None:
        self.engine = engine
        self.max_message_size = max_message_size

    def _setting(self, queue: pb.Queue, field: str) -> float | int | None:
        """The value of a settable field for the engine, or None when it is unset."""
        if SETTINGS[field]:
            return convert.seconds(getattr(queue, field)) if queue.HasField(field) else None
        value = getattr(queue, field)
        if field == "max_message_size" and value > self.max_message_size:
            raise invalid(
                f"max_message_size is {value} bytes; this server accepts messages of at most "
                f"{self.max_message_size} bytes"
            )
        return value or None

    @reports_errors
    async def CreateQueue(
        self, request: pb.CreateQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateQueueResponse:
        if not request.HasField("queue"):
            raise invalid("queue is required: give at least queue.name")
        settings = {field: self._setting(request.queue, field) for field in SETTINGS}
        row = await self.engine.create_queue(request.queue.name, settings)
        return pb.CreateQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def GetQueue(
        self, request: pb.GetQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetQueueResponse:
        row = await self.engine.get_queue_with_stats(request.name)
        return pb.GetQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def ListQueues(
        self, request: pb.ListQueuesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListQueuesResponse:
        page_size = request.page_size or DEFAULT_PAGE_SIZE
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise invalid(f"page_size is {page_size}; it must be 1 to {MAX_PAGE_SIZE}")
        after = _decode_page_token(request.page_token)
        rows = await self.engine.list_queues(page_size + 1, after, request.name_prefix)
        response = pb.ListQueuesResponse(queues=[queue_resource(row) for row in rows[:page_size]])
        if len(rows) > page_size:
            response.next_page_token = _encode_page_token(rows[page_size - 1]["name"])
        return response

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
        settings = {path: self._setting(request.queue, path) for path in paths}
        row = await self.engine.update_queue(request.queue.name, settings)
        return pb.UpdateQueueResponse(queue=queue_resource(row))

    @reports_errors
    async def DeleteQueue(
        self, request: pb.DeleteQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteQueueResponse:
        await self.engine.drop_queue(request.name)
        return pb.DeleteQueueResponse()

    @reports_errors
    async def PurgeQueue(
        self, request: pb.PurgeQueueRequest, context: grpc.aio.ServicerContext
    ) -> pb.PurgeQueueResponse:
        purged = await self.engine.purge_queue(request.name)
        return pb.PurgeQueueResponse(purged_messages=purged)


def _encode_page_token(last_name: str) -> str:
    return base64.urlsafe_b64encode(last_name.encode()).decode("ascii")


def _decode_page_token(token: str) -> str:
    if not token:
        return ""
    try:
        return base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise invalid("page_token is not a next_page_token of ListQueues") from None
