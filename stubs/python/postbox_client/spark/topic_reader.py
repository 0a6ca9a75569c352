"""`spark.readStream.format("postbox").option("topic", ...)`: a stream topic's log as a
Structured Streaming source, through a consumer group, exactly once into an idempotent
or transactional sink.

A stream topic's log can be read again by position (StreamService.ReadStreamRange), so
Spark's offsets are positions: {"tx": ..., "offset": ...}, a message's place in the order
consumer groups read in. A micro-batch is the range between two positions; Spark writes
it to its offset log before running it, and a batch run again after a restart reads the
very same range (readBetweenOffsets). Nothing is leased: the consumer group named by
option `consumer_group` is where the query starts (its cursor, on a fresh checkpoint)
and where it commits (SeekConsumerGroup to the batch's end position), so the group's lag
and the log's rotation follow what Spark has committed. The log keeps a range until the
group has passed it, so a batch Spark may still run again is never rotated away.

Spark tells a source that a batch committed only when it plans the next batch with
data; but it asks for new data only once the previous batch is in the commit log. So
`read(start)` first commits `start` to the group, and the lag goes to 0 one trigger after
the last batch commits, even with nothing more to read.

The first batch's start is not in Spark's offset log: Spark asks `initialOffset()` again
on a restart, which is the group's cursor. That cursor moves only once the first batch
is in the commit log, so a first batch run again reads the same range.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timezone
from typing import Any

import grpc
from postbox.v1 import stream_service_pb2 as pb
from postbox.v1 import stream_service_pb2_grpc
from pyspark.sql.datasource import SimpleDataSourceStreamReader

from postbox_client.spark.client import call_with_retries
from postbox_client.spark.options import TopicReadPlan

log = logging.getLogger(__name__)

TOPIC_SCHEMA = (
    "offset long, publish_id string, publish_time timestamp, routing_key string,"
    " ordering_key string, subject string, body binary,"
    " attributes map<string, struct<data_type: string, string_value: string,"
    " binary_value: binary>>"
)
_MAX_PER_CALL = 1000  # ReadStreamRange's limit
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


class PostboxTopicStreamReader(SimpleDataSourceStreamReader):
    """Offsets are log positions; commits move the consumer group."""

    def __init__(self, plan: TopicReadPlan) -> None:
        self.plan = plan
        self._channel: grpc.Channel | None = None
        self._committed: Position | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark may pickle the reader to run readBetweenOffsets elsewhere; the channel
        # belongs to the driver's instance.
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

    def read(self, start: Position) -> tuple[Iterator[tuple[Any, ...]], Position]:
        self.commit(start)  # Spark asks for new data only once the batch before committed
        messages, end = self._read_range(start, None, self.plan.max_messages_per_batch)
        return iter([_row(m) for m in messages]), end

    def readBetweenOffsets(self, start: Position, end: Position) -> Iterator[tuple[Any, ...]]:
        """A batch run again after a restart: the same range, the same messages."""
        messages, last = self._read_range(start, end, None)
        if last != end:
            raise RuntimeError(
                f"topic {self.plan.topic!r} no longer holds batch {start} to {end}: it was"
                f" read up to {last} (was consumer group {self.plan.consumer_group!r} moved"
                " past it, or deleted, letting the log rotate?)"
            )
        return iter([_row(m) for m in messages])

    def commit(self, end: Position) -> None:
        """Moves the consumer group's cursor to `end`: its lag and the rotation follow."""
        if end == self._committed:
            return
        request = pb.SeekConsumerGroupRequest(
            topic=self.plan.topic, consumer_group=self.plan.consumer_group, position=_position(end)
        )
        self._call("SeekConsumerGroup", self._stub().SeekConsumerGroup, request)
        self._committed = dict(end)

    def _read_range(
        self, start: Position, until: Position | None, most: int | None
    ) -> tuple[list[pb.StreamMessage], Position]:
        messages: list[pb.StreamMessage] = []
        after = _position(start)
        while most is None or len(messages) < most:
            page = _MAX_PER_CALL if most is None else min(_MAX_PER_CALL, most - len(messages))
            request = pb.ReadStreamRangeRequest(
                topic=self.plan.topic,
                after=after,
                until=None if until is None else _position(until),
                max_messages=page,
            )
            response = self._call("ReadStreamRange", self._stub().ReadStreamRange, request)
            messages.extend(response.messages)
            after = response.last_position
            if len(response.messages) < page:
                break
        return messages, _offset(after)
