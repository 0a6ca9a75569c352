"""Structured Streaming from a stream topic's log: offsets are log positions, a batch run
again reads the same range, and Spark's commits move the consumer group."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from pyspark.errors import StreamingQueryException
from support import seconds, unique_name

GROUP = "spark"


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.2)


@pytest.fixture
def topics(channel: grpc.Channel) -> topic_service_pb2_grpc.TopicServiceStub:
    return topic_service_pb2_grpc.TopicServiceStub(channel)


@pytest.fixture
def streams(channel: grpc.Channel) -> stream_service_pb2_grpc.StreamServiceStub:
    return stream_service_pb2_grpc.StreamServiceStub(channel)


@pytest.fixture
def stream(topics, streams) -> str:
    name = unique_name("spark-stream")
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    group = spb.ConsumerGroup(topic=name, name=GROUP)
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return name


def publish(topics, topic: str, first: int, count: int) -> None:
    for start in range(first, first + count, 1000):
        entries = [
            tpb.PublishBatchEntry(body=f"m{i}".encode(), routing_key=f"k{i % 3}")
            for i in range(start, min(start + 1000, first + count))
        ]
        topics.PublishBatch(tpb.PublishBatchRequest(topic=topic, entries=entries))


def lag(streams, topic: str) -> int:
    request = spb.GetConsumerGroupRequest(topic=topic, name=GROUP)
    return streams.GetConsumerGroup(request).consumer_group.lag_messages


def _commits(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def _start(spark, server, topic: str, checkpoint: Path, batches: dict[int, list]):
    """A query from the topic into `batches` (batch id -> its rows): an idempotent sink,
    as exactly-once needs, so a batch run again replaces what it wrote."""

    def sink(batch, batch_id: int) -> None:
        rows = batch.collect()
        if rows:
            batches[batch_id] = rows

    return (
        spark.readStream.format("postbox")
        .option("target", server.target)
        .option("topic", topic)
        .option("consumer_group", GROUP)
        .option("max_messages_per_batch", "1000")
        .load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _bodies(batches: dict[int, list]) -> list[bytes]:
    return [row.body for batch_id in sorted(batches) for row in batches[batch_id]]


def test_a_stream_topic_is_read_once_across_batches_and_restarts_and_commits_move_the_group(
    spark, server, topics, streams, stream, tmp_path
):
    checkpoint = tmp_path / "checkpoint"
    batches: dict[int, list] = {}
    query = _start(spark, server, stream, checkpoint, batches)
    try:
        publish(topics, stream, 0, 1000)
        wait_for(lambda: len(_bodies(batches)) >= 1000, 120, "the first 1000 rows")
        publish(topics, stream, 1000, 500)
        wait_for(lambda: len(_bodies(batches)) >= 1500, 120, "1500 rows")
        # One trigger after the last batch committed, the group has caught up with it.
        wait_for(lambda: lag(streams, stream) == 0, 60, "a lag of 0")
    finally:
        query.stop()
    assert _bodies(batches) == [f"m{i}".encode() for i in range(1500)]
    assert len(batches) >= 2
    first = batches[min(batches)][0]
    assert (first.routing_key, first.subject, first.ordering_key) == ("k0", None, None)
    offsets = [row.offset for batch_id in sorted(batches) for row in batches[batch_id]]
    assert offsets == sorted(offsets)

    # A restart from the checkpoint goes on where it stopped: no row again, none lost.
    publish(topics, stream, 1500, 300)
    query = _start(spark, server, stream, checkpoint, batches)
    try:
        wait_for(lambda: len(_bodies(batches)) >= 1800, 120, "the 300 rows after the restart")
        wait_for(lambda: lag(streams, stream) == 0, 60, "a lag of 0 after the restart")
    finally:
        query.stop()
    assert _bodies(batches) == [f"m{i}".encode() for i in range(1800)]


def test_a_batch_that_never_committed_reads_the_same_range_again(
    spark, server, topics, streams, stream, tmp_path
):
    checkpoint = tmp_path / "checkpoint"
    batches: dict[int, list] = {}
    query = _start(spark, server, stream, checkpoint, batches)
    try:
        # Two publishes a batch apart: the batch run again below is not the first,
        # whose start is the group's cursor when the query began rather than a
        # position in the offset log.
        publish(topics, stream, 0, 300)
        wait_for(lambda: len(_bodies(batches)) >= 300, 120, "300 rows")
        publish(topics, stream, 300, 400)
        wait_for(lambda: len(_bodies(batches)) >= 700, 120, "700 rows")
    finally:
        query.stop()
    last = _commits(checkpoint)[-1]
    assert last >= 1
    first_run = [row.offset for row in batches[last]]
    # As if the driver died before recording the commit: the restart runs the batch
    # again, from the range in the offset log, while newer rows wait behind it.
    for leftover in (checkpoint / "commits").glob(f"*{last}*"):
        leftover.unlink()
    publish(topics, stream, 700, 200)
    del batches[last]
    query = _start(spark, server, stream, checkpoint, batches)
    try:
        wait_for(lambda: len(_bodies(batches)) >= 900, 120, "the batch again and 200 more")
        wait_for(lambda: lag(streams, stream) == 0, 60, "a lag of 0")
    finally:
        query.stop()
    assert [row.offset for row in batches[last]] == first_run
    assert _bodies(batches) == [f"m{i}".encode() for i in range(900)]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "option 'consumer_group' is required"),
        ({"consumer_group": GROUP, "queue": "q"}, "unknown option 'queue'"),
        (
            {"consumer_group": GROUP, "visibility_timeout": "30"},
            "unknown option 'visibility_timeout'",
        ),
        ({"consumer_group": GROUP, "max_messages_per_batch": "0"}, "is 0; it must be 1 to 1e"),
        ({"consumer_group": "absent"}, "consumer group 'absent' of topic"),
    ],
)
def test_topic_reader_mistakes_fail_the_query_and_move_no_group(
    spark, server, streams, stream, tmp_path, options, message
):
    reader = spark.readStream.format("postbox").option("target", server.target)
    for key, value in {"topic": stream, **options}.items():
        reader = reader.option(key, value)
    query = (
        reader.load()
        .writeStream.foreachBatch(lambda batch, batch_id: None)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException, match=message):
            query.awaitTermination(120)
    finally:
        query.stop()
    request = spb.GetStreamPositionRequest(topic=stream, consumer_group=GROUP)
    assert streams.GetStreamPosition(request).cursor_position == spb.StreamPosition()
