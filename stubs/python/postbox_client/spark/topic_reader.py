"""`spark.readStream.format("postbox").option("topic", ...)`: a stream topic's log as a
Structured Streaming source, through a consumer group, exactly once into an idempotent
or transactional sink, read by Spark tasks.

A stream topic's log can be read again by position (StreamService.ReadStreamRange), so
Spark's offsets are positions: {"tx": ..., "offset": ...}, a message's place in the order
consumer groups read in. A micro-batch is the range between two positions; Spark writes
it to its offset log before running it, and a batch run again after a restart reads the
very same range. Nothing is leased: the consumer group named by option `consumer_group`
is where the query starts (its cursor, on a fresh checkpoint) and where it commits
(SeekConsumerGroup to the batch's end position), so the group's lag and the log's
rotation follow what Spark has committed. The log keeps a range until the group has
passed it, so a batch Spark may still run again is never rotated away.

No message passes through the driver. It plans with ReadStreamRange's positions_only
mode, which walks the log's index without reading a message: `latestOffset(start,
limit)` ends a batch at the position of the `max_messages_per_batch`-th message after
`start` (the default read limit; with ReadAllAvailable, at the last message readers see
now), and `partitions(start, end)` cuts the range at every
`max_messages_per_partition`-th message. Each part is a Spark task, which opens its own
channel on an executor, reads its range with ReadStreamRange, up to 1,000 messages a
call, and fails if the log no longer holds all of it. A batch run again is planned from
its two positions, so it reads the same messages, split alike.

Spark tells a source that a batch committed only when it plans the next batch with
data; but it asks for new data only once the previous batch is in the commit log. So
`latestOffset(start, ...)` and `partitions(start, end)` first commit `start` to the
group, and the lag goes to 0 one trigger after the last batch commits, even with nothing
more to read.

The first batch's start is not in Spark's offset log: Spark asks `initialOffset()` again
on a restart, which is the group's cursor. That cursor moves only once the first batch
is in the commit log, so a first batch run again reads the same range.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timezone
from typing import Any

import grpc
from postbox.v1 import stream_service_pb2 as pb
from postbox.v1 import stream_service_pb2_grpc
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from postbox_client.spark.client import PostboxCallError, call_with_retries
from postbox_client.spark.options import TopicReadPlan

log = logging.getLogger(__name__)

TOPIC_SCHEMA = (
    "offset long, publish_id string, publish_time timestamp, routing_key string,"
    " ordering_key string, subject string, body binary,"
    " attributes map<string, struct<data_type: string, string_value: string,"
    " binary_value: binary>>"
)
_MAX_PER_CALL = 1000  # ReadStreamRange's limit
_MAX_POSITIONS_PER_CALL = 1_000_000  # ReadStreamRange's limit with positions_only
Position = dict[str, int]


def _position(position: Position) -> pb.StreamPosition:
    return pb.StreamPosition(tx=int(position["tx"]), offset=int(position["offset"]))


def _offset(position: pb.StreamPosition) -> Position:
    return {"tx": position.tx, "offset": position.offset}


def _row(message: pb.StreamMessage) -> tuple[Any, ...]:
    attributes = {
        name: (
            value.data_type,
            value.string_value if value.HasField("string_value") else None,
            value.binary_value if value.HasField("binary_value") else None,
        )
        for name, value in message.attributes.items()
    }
    return (
        message.offset,
        message.publish_id,
        message.publish_time.ToDatetime(tzinfo=timezone.utc),
        message.routing_key,
        message.ordering_key or None,
        message.subject or None,
        message.body,
        attributes,
    )


@dataclass
class TopicRangePartition(InputPartition):
    """One Spark task's part of a micro-batch: the `count` messages after `start`, up to
    and including `end`."""

    start: Position
    end: Position
    count: int


class PostboxTopicStreamReader(DataSourceStreamReader):
    """Offsets are log positions; tasks read the ranges; commits move the consumer group."""

    def __init__(self, plan: TopicReadPlan) -> None:
        self.plan = plan
        self._channel: grpc.Channel | None = None
        self._committed: Position | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run read(partition) on executors; the channel
        # belongs to the driver's instance, and each task opens its own.
        return {"plan": self.plan, "_channel": None, "_committed": None}

    def _stub(self) -> stream_service_pb2_grpc.StreamServiceStub:
        if self._channel is None:
            self._channel = self.plan.connection.open()
        return stream_service_pb2_grpc.StreamServiceStub(self._channel)

    def _call(self, what: str, method: Any, request: Any) -> Any:
        def once() -> Any:
            connection = self.plan.connection
            return method(request, timeout=connection.timeout, metadata=connection.metadata)

        return call_with_retries(
            f"{what} of topic {self.plan.topic!r}, consumer group {self.plan.consumer_group!r}",
            self.plan.retry,
            once,
        )

    def initialOffset(self) -> Position:
        """Where the consumer group's cursor stands: a fresh query reads what it has not."""
        request = pb.GetStreamPositionRequest(
            topic=self.plan.topic, consumer_group=self.plan.consumer_group
        )
        response = self._call("GetStreamPosition", self._stub().GetStreamPosition, request)
        return _offset(response.cursor_position)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.plan.max_messages_per_batch)

    def latestOffset(self, start: Position, limit: ReadLimit) -> Position:
        """The end of the next batch: the position of the limit's last message after
        `start`, or `start` when none is there yet."""
        self.commit(start)  # Spark asks for new data only once the batch before committed
        if isinstance(limit, ReadMaxRows):
            most: int | None = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            most = None
        else:
            raise PostboxCallError(
                f"read limit {limit!r} is not supported by the postbox topic reader: it limits"
                " a batch to a number of messages (ReadMaxRows, from option"
                " 'max_messages_per_batch') or reads all available"
            )
        end, _ = self._walk(start, None, most)
        return end

    def partitions(self, start: Position, end: Position) -> Sequence[TopicRangePartition]:
        """The batch from `start` to `end`, cut every `max_messages_per_partition`
        messages: one task per part. Only positions come to the driver."""
        self.commit(start)  # Spark plans a batch once the batch before is committed
        parts: list[TopicRangePartition] = []
        after = start
        while after != end:
            last, count = self._walk(after, end, self.plan.max_messages_per_partition)
            if count == 0:
                raise PostboxCallError(self._gone(start, end, after))
            parts.append(TopicRangePartition(start=after, end=last, count=count))
            after = last
        return parts

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """On an executor: the part's messages, read over a channel of the task's own."""
        assert isinstance(partition, TopicRangePartition)
        read, after = 0, _position(partition.start)
        with self.plan.connection.open() as channel:
            stub = stream_service_pb2_grpc.StreamServiceStub(channel)
            while read < partition.count:
                page = min(_MAX_PER_CALL, partition.count - read)
                request = pb.ReadStreamRangeRequest(
                    topic=self.plan.topic,
                    after=after,
                    until=_position(partition.end),
                    max_messages=page,
                )
                response = self._call("ReadStreamRange", stub.ReadStreamRange, request)
                for message in response.messages:
                    yield _row(message)
                read += len(response.messages)
                after = response.last_position
                if len(response.messages) < page:
                    break
        if read != partition.count or _offset(after) != partition.end:
            raise PostboxCallError(
                f"topic {self.plan.topic!r} no longer holds the {partition.count} messages"
                f" {partition.start} to {partition.end} of this batch: {read} were read, up to"
                f" {_offset(after)} (was consumer group {self.plan.consumer_group!r} moved past"
                " them, or deleted, letting the log rotate?)"
            )

    def commit(self, end: Position) -> None:
        """Moves the consumer group's cursor to `end`: its lag and the rotation follow."""
        if end == self._committed:
            return
        request = pb.SeekConsumerGroupRequest(
            topic=self.plan.topic, consumer_group=self.plan.consumer_group, position=_position(end)
        )
        self._call("SeekConsumerGroup", self._stub().SeekConsumerGroup, request)
        self._committed = dict(end)

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _walk(
        self, start: Position, until: Position | None, most: int | None
    ) -> tuple[Position, int]:
        """The position of the `most`-th message after `start` (None: of the last readers
        see now), not past `until`, and how many messages that passes over; from
        positions alone."""
        after, count = start, 0
        while most is None or count < most:
            left = _MAX_POSITIONS_PER_CALL if most is None else most - count
            page = min(_MAX_POSITIONS_PER_CALL, left)
            request = pb.ReadStreamRangeRequest(
                topic=self.plan.topic,
                after=_position(after),
                until=None if until is None else _position(until),
                max_messages=page,
                positions_only=True,
            )
            response = self._call("ReadStreamRange", self._stub().ReadStreamRange, request)
            count += response.message_count
            after = _offset(response.last_position)
            if response.message_count < page:
                break
        return after, count

    def _gone(self, start: Position, end: Position, last: Position) -> str:
        return (
            f"topic {self.plan.topic!r} no longer holds batch {start} to {end}: it was"
            f" read up to {last} (was consumer group {self.plan.consumer_group!r} moved past it,"
            " or deleted, letting the log rotate?)"
        )
