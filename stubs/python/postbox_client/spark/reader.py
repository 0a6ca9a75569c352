"""`spark.readStream.format("postbox")`: a driver-side stream reader, at least once.

Each micro-batch receives up to `max_messages_per_batch` messages under a
visibility timeout and hands them to Spark; their receipts wait here until Spark
commits the batch, and only then are the messages deleted. A batch that never
commits (the query failed or stopped) deletes nothing: its messages become
visible again when the timeout runs out and a later batch gets them.

Spark tells a source that a batch committed only when it plans the next batch
with data, which may be long after; but it asks for new data only once the
previous batch is in the commit log. So `read(start)` first deletes the
messages of every batch up to `start`, and an idle stream keeps nothing in
flight for longer than one trigger.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from datetime import timedelta, timezone
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from pyspark.sql.datasource import SimpleDataSourceStreamReader

from postbox_client.spark.client import call_with_retries
from postbox_client.spark.options import ReadPlan

log = logging.getLogger(__name__)

SCHEMA = (
    "message_id string, body binary,"
    " attributes map<string, struct<data_type: string, string_value: string,"
    " binary_value: binary>>,"
    " enqueue_time timestamp, receive_count int"
)
_MAX_PER_CALL = 1000  # Receive's and DeleteBatch's limit


def _duration(seconds: float) -> Duration:
    result = Duration()
    result.FromTimedelta(timedelta(seconds=seconds))
    return result


def _row(message: Any) -> tuple[Any, ...]:
    attributes = {
        name: (
            value.data_type,
            value.string_value if value.HasField("string_value") else None,
            value.binary_value if value.HasField("binary_value") else None,
        )
        for name, value in message.attributes.items()
    }
    return (
        message.message_id,
        message.body,
        attributes,
        message.enqueue_time.ToDatetime(tzinfo=timezone.utc),
        message.receive_count,
    )


class PostboxStreamReader(SimpleDataSourceStreamReader):
    """Offsets count batches ({"batch": n}); a queue has no position to replay from."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan
        self._channel: grpc.Channel | None = None
        # End offset of each uncommitted batch -> the receipts of its messages.
        self._receipts: dict[int, list[str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Spark may pickle the reader to run readBetweenOffsets on an executor; the
        # channel and the receipts belong to the driver's instance.
        return {"plan": self.plan, "_channel": None, "_receipts": {}}

    def _stub(self) -> message_service_pb2_grpc.MessageServiceStub:
        if self._channel is None:
            self._channel = self.plan.connection.open()
        return message_service_pb2_grpc.MessageServiceStub(self._channel)

    def initialOffset(self) -> dict[str, int]:
        return {"batch": 0}

    def read(self, start: dict[str, int]) -> tuple[Iterator[tuple[Any, ...]], dict[str, int]]:
        self._delete_through(start["batch"])
        messages = self._receive()
        if not messages:
            return iter(()), start
        end = start["batch"] + 1
        self._receipts[end] = [m.receipt for m in messages]
        return iter([_row(m) for m in messages]), {"batch": end}

    def readBetweenOffsets(
        self, start: dict[str, int], end: dict[str, int]
    ) -> Iterator[tuple[Any, ...]]:
        # Spark replays a batch that was planned but never committed before a
        # restart. Its messages were never deleted, so they come back by
        # themselves when their visibility timeout runs out; the replay is empty.
        return iter(())

    def commit(self, end: dict[str, int]) -> None:
        self._delete_through(end["batch"])

    def _delete_through(self, last: int) -> None:
        """Deletes the messages of the committed batches up to `last`."""
        done = sorted(batch for batch in self._receipts if batch <= last)
        receipts = [r for batch in done for r in self._receipts.pop(batch)]
        stale = 0
        stub = self._stub()
        for start in range(0, len(receipts), _MAX_PER_CALL):
            request = pb.DeleteBatchRequest(
                queue=self.plan.queue, receipts=receipts[start : start + _MAX_PER_CALL]
            )

            def delete(request: pb.DeleteBatchRequest = request) -> pb.DeleteBatchResponse:
                return stub.DeleteBatch(
                    request,
                    timeout=self.plan.connection.timeout,
                    metadata=self.plan.connection.metadata,
                )

            response = call_with_retries(
                f"DeleteBatch on queue {self.plan.queue!r}", self.plan.retry, delete
            )
            stale += sum(1 for result in response.results if result.code != 0)
        if stale:
            # Spark already holds these rows; the queue will deliver them again.
            log.warning(
                "%d of %d messages of batches up to %d could not be deleted from queue %r"
                " (their visibility timeout ran out before the batch committed, so they"
                " will be delivered again): raise option visibility_timeout",
                stale,
                len(receipts),
                last,
                self.plan.queue,
            )

    def _receive(self) -> list[Any]:
        stub = self._stub()
        received: list[Any] = []
        wait = self.plan.wait_time
        while len(received) < self.plan.max_messages_per_batch:
            request = pb.ReceiveRequest(
                queue=self.plan.queue,
                max_messages=min(_MAX_PER_CALL, self.plan.max_messages_per_batch - len(received)),
                visibility_timeout=_duration(self.plan.visibility_timeout),
                wait_time=_duration(wait),
            )
            got = call_with_retries(
                f"Receive from queue {self.plan.queue!r}",
                self.plan.retry,
                functools.partial(self._receive_once, stub, request),
            )
            if not got:
                break
            received.extend(got)
            wait = 0.0  # only the first call of a batch waits for messages
        return received

    def _receive_once(
        self, stub: message_service_pb2_grpc.MessageServiceStub, request: pb.ReceiveRequest
    ) -> list[Any]:
        wait = request.wait_time.ToTimedelta().total_seconds()
        responses = stub.Receive(
            request,
            timeout=self.plan.connection.timeout + wait,
            metadata=self.plan.connection.metadata,
        )
        return [m for response in responses for m in response.messages]
