"""StreamService: consumer groups of stream topics, and their reads of the log."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import grpc
from postbox.v1 import stream_service_pb2 as pb
from postbox.v1 import stream_service_pb2_grpc

from postbox_server.db.engine import Engine, Record, Row
from postbox_server.errors import invalid, quoted
from postbox_server.services import convert
from postbox_server.services.pagination import (
    decode_id_page_token,
    decode_page_token,
    next_page,
    page_size_of,
)
from postbox_server.services.status import reports_errors

_STARTS = {
    pb.STREAM_START_UNSPECIFIED: "earliest",
    pb.STREAM_START_EARLIEST: "earliest",
    pb.STREAM_START_LATEST: "latest",
    pb.STREAM_START_TIME: "time",
}
DEFAULT_MAX_MESSAGES = 100
MAX_RANGE_MESSAGES = 1000
# ReadStreamRange with positions_only reads no message, only the index.
MAX_RANGE_POSITIONS = 1_000_000
DEFAULT_LEASE = timedelta(seconds=30)
MAX_NACK_OFFSETS = 1000  # a batch holds at most 1000 messages
MAX_NACK_DELAY = timedelta(hours=12)
MAX_REPLAY_OFFSETS = 1000
# The one field UpdateConsumerGroup changes.
_UPDATABLE = ["max_deliveries"]
MAX_WAIT_TIME = timedelta(seconds=20)
MAX_BATCH_WAIT = timedelta(hours=1)
# A waiting ReadStream hears of publishes through this server at once; of those
# through other servers, and of leases running out, by looking again this often.
POLL_INTERVAL = 0.25  # seconds
# The same for an idle StreamingReadStream, which stays open for good: less often.
STREAM_POLL_INTERVAL = 1.0  # seconds


class StreamWaiters:
    """ReadStream calls of this process waiting on a topic, woken by its publishes, acks and
    seeks here."""

    def __init__(self) -> None:
        # Bumped by every publish: a reader that saw an older one before its empty read
        # reads again at once, so no publish falls between its read and its wait.
        self._generations: dict[str, int] = {}
        self._events: dict[str, asyncio.Event] = {}

    def generation(self, topic: str) -> int:
        return self._generations.get(topic, 0)

    def wake(self, topic: str) -> None:
        self._generations[topic] = self._generations.get(topic, 0) + 1
        event = self._events.pop(topic, None)
        if event is not None:
            event.set()

    async def wait(self, topic: str, seen_generation: int, timeout: float) -> None:
        if self.generation(topic) != seen_generation:
            return
        event = self._events.setdefault(topic, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)


def consumer_group(row: Row) -> pb.ConsumerGroup:
    group = pb.ConsumerGroup(
        topic=row["topic"],
        name=row["name"],
        create_time=convert.timestamp(row["created_at"]),
        cursor_offset=row["cursor_offset"],
        lag_messages=row["lag_messages"],
        lag=convert.duration(timedelta(seconds=row["lag_seconds"])),
        paused=row["paused"],
        retry_messages=row["retry_messages"],
        max_deliveries=row["max_deliveries"] or 0,
        dead_letter_messages=row["dead_letters"],
    )
    if row["acked_at"] is not None:
        group.ack_time.CopyFrom(convert.timestamp(row["acked_at"]))
    if row["lease_expires_at"] is not None:
        group.lease_expire_time.CopyFrom(convert.timestamp(row["lease_expires_at"]))
    return group


def stream_dead_letter(row: Row) -> pb.StreamDeadLetter:
    return pb.StreamDeadLetter(
        message=stream_message(row),
        dead_time=convert.timestamp(row["dead_at"]),
        reason=row["reason"],
    )


def stream_message(row: Row) -> pb.StreamMessage:
    return pb.StreamMessage(
        offset=row["stream_offset"],
        publish_id=str(row["publish_id"]),
        publish_time=convert.timestamp(row["published_at"]),
        routing_key=row["routing_key"],
        ordering_key=row["ordering_key"] or "",
        subject=row["subject"] or "",
        body=row["body"],
        attributes=convert.attributes_from_json(row["attributes"]),
        delivery_count=row.get("delivery_count") or 0,
    )


def _bounded(
    request: pb.ReadStreamRequest | pb.StreamingReadStreamRequest | pb.AckStreamRequest,
    field: str,
    high: timedelta | None,
) -> timedelta | None:
    """The Duration field, None when unset; INVALID_ARGUMENT outside 0 to high."""
    value = convert.optional_timedelta(request, field)
    low = timedelta(0)
    if value is not None and not low <= value <= (high or timedelta.max):
        allowed = f"from 0 s to {high.total_seconds():g} s" if high else "at least 0 s"
        raise invalid(f"{field} must be {allowed}, not {value.total_seconds():g} s")
    return value


def _position(position: pb.StreamPosition) -> tuple[int, int]:
    """(tx, offset); the engine says what is out of range."""
    return position.tx, position.offset


def _batch(rows: Sequence[Row]) -> dict[str, Any]:
    """The fields ReadStream and StreamingReadStream answer a batch with."""
    return {
        "batch": str(rows[0]["batch"]),
        "messages": [stream_message(row) for row in rows],
        "delivery_count": rows[0]["batch_delivery_count"],
    }


class StreamService(stream_service_pb2_grpc.StreamServiceServicer):
    def __init__(self, engine: Engine, waiters: StreamWaiters) -> None:
        self.engine = engine
        self.waiters = waiters

    @reports_errors
    async def CreateConsumerGroup(
        self, request: pb.CreateConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateConsumerGroupResponse:
        if request.start not in _STARTS:
            raise invalid(f"start {request.start} is not a known StreamStart")
        group = request.consumer_group
        row = await self.engine.create_consumer_group(
            group.topic, group.name, _STARTS[request.start],
            convert.optional_datetime(request, "start_time"), group.max_deliveries or None,
        )  # fmt: skip
        return pb.CreateConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def GetConsumerGroup(
        self, request: pb.GetConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetConsumerGroupResponse:
        row = await self.engine.get_consumer_group(request.topic, request.name)
        return pb.GetConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def ListConsumerGroups(
        self, request: pb.ListConsumerGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConsumerGroupsResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListConsumerGroups")
        page, token = next_page(
            await self.engine.list_consumer_groups(request.topic, page_size + 1, after),
            page_size,
            "ListConsumerGroups",
        )
        return pb.ListConsumerGroupsResponse(
            consumer_groups=[consumer_group(row) for row in page], next_page_token=token
        )

    @reports_errors
    async def DeleteConsumerGroup(
        self, request: pb.DeleteConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteConsumerGroupResponse:
        await self.engine.delete_consumer_group(request.topic, request.name)
        return pb.DeleteConsumerGroupResponse()

    @reports_errors
    async def PauseConsumerGroup(
        self, request: pb.PauseConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseConsumerGroupResponse:
        row = await self.engine.pause_consumer_group(request.topic, request.name)
        return pb.PauseConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def ResumeConsumerGroup(
        self, request: pb.ResumeConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResumeConsumerGroupResponse:
        row = await self.engine.resume_consumer_group(request.topic, request.name)
        return pb.ResumeConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def UpdateConsumerGroup(
        self, request: pb.UpdateConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateConsumerGroupResponse:
        paths = list(request.update_mask.paths)
        group = request.consumer_group
        if paths != _UPDATABLE:
            # The names first, as every other call checks them: a malformed or absent
            # group is the error to fix before the mask.
            await self.engine.get_consumer_group(group.topic, group.name)
            named = ", ".join(quoted(path) for path in paths) or "nothing"
            raise invalid(
                f"update_mask must name max_deliveries, the one field UpdateConsumerGroup"
                f" changes, not {named}"
            )
        row = await self.engine.set_consumer_group_max_deliveries(
            group.topic, group.name, group.max_deliveries or None
        )
        return pb.UpdateConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def ListStreamDeadLetters(
        self, request: pb.ListStreamDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListStreamDeadLettersResponse:
        page_size = page_size_of(request.page_size)
        after = decode_id_page_token(request.page_token, "ListStreamDeadLetters")
        rows = await self.engine.list_stream_dead_letters(
            request.topic, request.consumer_group, page_size + 1, after
        )
        page, token = next_page(rows, page_size, "ListStreamDeadLetters", "stream_offset")
        return pb.ListStreamDeadLettersResponse(
            dead_letters=[stream_dead_letter(row) for row in page], next_page_token=token
        )

    @reports_errors
    async def ReplayStreamDeadLetters(
        self, request: pb.ReplayStreamDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReplayStreamDeadLettersResponse:
        if len(request.offsets) > MAX_REPLAY_OFFSETS:
            raise invalid(
                f"offsets holds {len(request.offsets)} offsets; at most {MAX_REPLAY_OFFSETS}"
                " (none: every dead letter of the group)"
            )
        replayed = await self.engine.replay_stream_dead_letters(
            request.topic, request.consumer_group, request.offsets or None
        )
        self.waiters.wake(request.topic)  # the group has messages to read again
        return pb.ReplayStreamDeadLettersResponse(replayed_count=replayed)

    @reports_errors
    async def PurgeStreamDeadLetters(
        self, request: pb.PurgeStreamDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.PurgeStreamDeadLettersResponse:
        # Unset: the engine refuses it, once it has checked the names.
        older_than = convert.optional_datetime(request, "older_than")
        purged = await self.engine.purge_stream_dead_letters(
            request.topic, request.consumer_group, older_than
        )
        return pb.PurgeStreamDeadLettersResponse(purged_count=purged)

    @reports_errors
    async def ReadStream(
        self, request: pb.ReadStreamRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadStreamResponse:
        wait = _bounded(request, "wait_time", MAX_WAIT_TIME) or timedelta(0)
        lease = _bounded(request, "lease_duration", None)  # the engine checks its range
        batch_wait = _bounded(request, "max_batch_wait", MAX_BATCH_WAIT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait.total_seconds()
        while True:
            seen = self.waiters.generation(request.topic)
            rows = await self._read(request, lease, batch_wait)
            remaining = deadline - loop.time()
            if rows or remaining <= 0:
                break
            await self.waiters.wait(request.topic, seen, min(remaining, POLL_INTERVAL))
        if not rows:
            return pb.ReadStreamResponse()
        return pb.ReadStreamResponse(**_batch(rows))

    async def _read(
        self,
        request: pb.ReadStreamRequest | pb.StreamingReadStreamRequest,
        lease: timedelta | None,
        batch_wait: timedelta | None,
    ) -> list[Record]:
        """The group's next batch for a reader's request; none while another is out."""
        return await self.engine.read_stream(
            request.topic, request.consumer_group,
            request.max_messages or DEFAULT_MAX_MESSAGES,
            DEFAULT_LEASE if lease is None else lease,
            request.min_messages or 1, batch_wait,
        )  # fmt: skip

    @reports_errors
    async def StreamingReadStream(
        self, request: pb.StreamingReadStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamingReadStreamResponse]:
        lease = _bounded(request, "lease_duration", None)
        batch_wait = _bounded(request, "max_batch_wait", MAX_BATCH_WAIT)
        while True:
            seen = self.waiters.generation(request.topic)
            rows = await self._read(request, lease, batch_wait)
            if not rows:
                await self.waiters.wait(request.topic, seen, STREAM_POLL_INTERVAL)
                continue
            yield pb.StreamingReadStreamResponse(**_batch(rows))

    @reports_errors
    async def AckStream(
        self, request: pb.AckStreamRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckStreamResponse:
        if not request.batch:
            raise invalid("batch is required: the ReadStreamResponse.batch of the batch to ack")
        try:
            batch = uuid.UUID(request.batch)
        except ValueError:
            raise invalid(
                f"batch {quoted(request.batch)} is not a batch token: pass ReadStreamResponse.batch"
            ) from None
        if len(request.nack_offsets) > MAX_NACK_OFFSETS:
            raise invalid(
                f"nack_offsets holds {len(request.nack_offsets)} offsets; a batch has at most"
                f" {MAX_NACK_OFFSETS} messages"
            )
        delay = _bounded(request, "nack_delay", MAX_NACK_DELAY) or timedelta(0)
        cursor = await self.engine.ack_stream(
            request.topic, request.consumer_group, batch, request.nack_offsets, delay
        )
        self.waiters.wake(request.topic)  # readers waiting while the batch was out: go on
        return pb.AckStreamResponse(cursor_offset=cursor)

    @reports_errors
    async def SeekConsumerGroup(
        self, request: pb.SeekConsumerGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.SeekConsumerGroupResponse:
        target = request.WhichOneof("target")
        if target is None:
            raise invalid("offset, time or position is required: where the group reads from next")
        if target == "position":
            row = await self.engine.set_consumer_group_cursor(
                request.topic, request.consumer_group, _position(request.position)
            )
        else:
            row = await self.engine.seek_consumer_group(
                request.topic, request.consumer_group,
                request.offset if target == "offset" else None,
                convert.optional_datetime(request, "time"),
            )  # fmt: skip
        self.waiters.wake(request.topic)  # a batch called back: the group can read again
        return pb.SeekConsumerGroupResponse(consumer_group=consumer_group(row))

    @reports_errors
    async def ReadStreamRange(
        self, request: pb.ReadStreamRangeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReadStreamRangeResponse:
        after = _position(request.after)
        until = _position(request.until) if request.HasField("until") else None
        most = request.max_messages or DEFAULT_MAX_MESSAGES
        if request.positions_only:
            if not 1 <= most <= MAX_RANGE_POSITIONS:
                raise invalid(
                    f"max_messages must be from 1 to {MAX_RANGE_POSITIONS} with positions_only,"
                    f" not {most}"
                )
            row = await self.engine.read_stream_positions(request.topic, after, until, most)
            return pb.ReadStreamRangeResponse(
                last_position=pb.StreamPosition(tx=row["last_tx"], offset=row["last_offset"]),
                message_count=row["message_count"],
            )
        if not 1 <= most <= MAX_RANGE_MESSAGES:
            more = (
                f" (up to {MAX_RANGE_POSITIONS} with positions_only, which returns no messages,"
                " only where they end)"
                if MAX_RANGE_MESSAGES < most <= MAX_RANGE_POSITIONS
                else ""
            )
            raise invalid(f"max_messages must be from 1 to {MAX_RANGE_MESSAGES}, not {most}{more}")
        rows = await self.engine.read_stream_range(request.topic, after, until, most)
        last = (rows[-1]["tx"], rows[-1]["stream_offset"]) if rows else after
        return pb.ReadStreamRangeResponse(
            messages=[stream_message(row) for row in rows],
            last_position=pb.StreamPosition(tx=last[0], offset=last[1]),
            message_count=len(rows),
        )

    @reports_errors
    async def GetStreamPosition(
        self, request: pb.GetStreamPositionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetStreamPositionResponse:
        row = await self.engine.stream_position(request.topic, request.consumer_group)
        return pb.GetStreamPositionResponse(
            cursor_position=pb.StreamPosition(tx=row["cursor_tx"], offset=row["cursor_offset"]),
            end_position=pb.StreamPosition(tx=row["end_tx"], offset=row["end_offset"]),
        )
