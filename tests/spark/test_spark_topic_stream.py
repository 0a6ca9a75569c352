"""Structured Streaming from a stream topic's log: offsets are log positions, a batch run
again reads the same range, and Spark's commits move the consumer group."""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path

import grpc
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from postbox_client.spark.topic_reader import TopicRangePartition
from pyspark.errors import StreamingQueryException
from spark_support import wait_for
from support import seconds, unique_name

GROUP = "spark"


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


def _start(
    spark,
    server,
    topic: str,
    checkpoint: Path,
    batches: dict[int, list],
    partitions: dict[int, list[list]] | None = None,
    **options: str,
):
    """A query from the topic into `batches` (batch id -> its rows): an idempotent sink,
    as exactly-once needs, so a batch run again replaces what it wrote. With
    `partitions`, also each batch's rows as the partitions Spark's tasks read them."""

    def sink(batch, batch_id: int) -> None:
        if partitions is None:
            rows = batch.collect()
        else:
            parts = batch.rdd.glom().collect()
            assert len(parts) == batch.rdd.getNumPartitions()
            rows = [row for part in parts for row in part]
            if rows:
                partitions[batch_id] = parts
        if rows:
            batches[batch_id] = rows

    reader = (
        spark.readStream.format("postbox")
        .option("target", server.target)
        .option("topic", topic)
        .option("consumer_group", GROUP)
    )
    for key, value in {"max_messages_per_batch": "1000", **options}.items():
        reader = reader.option(key, value)
    return (
        reader.load()
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
        # Spark records a batch's commit after its sink returns: stopped before that, the
        # query would leave the second batch uncommitted on its own.
        wait_for(lambda: len(_commits(checkpoint)) >= 2, 120, "the second batch's commit")
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


def _sizes(count: int, most: int) -> list[int]:
    """How a range of `count` messages is cut into parts of at most `most`."""
    return [min(most, count - start) for start in range(0, count, most)]


def test_a_micro_batch_is_split_into_partitions_that_spark_tasks_read(
    spark, server, topics, streams, stream, tmp_path
):
    batches: dict[int, list] = {}
    partitions: dict[int, list[list]] = {}
    query = _start(
        spark, server, stream, tmp_path / "checkpoint", batches, partitions,
        max_messages_per_partition="150",
    )  # fmt: skip
    try:
        publish(topics, stream, 0, 1000)  # one transaction: one batch of 1000
        wait_for(lambda: len(_bodies(batches)) >= 1000, 120, "the 1000 rows")
        wait_for(lambda: lag(streams, stream) == 0, 60, "a lag of 0")
    finally:
        query.stop()
    assert _bodies(batches) == [f"m{i}".encode() for i in range(1000)]
    (parts,) = partitions.values()
    assert [len(part) for part in parts] == [150] * 6 + [100]
    # Each task read one stretch of the log, in read order, the next where it ended.
    bodies = [[row.body for row in part] for part in parts]
    assert bodies == [
        [f"m{i}".encode() for i in range(first, min(first + 150, 1000))]
        for first in range(0, 1000, 150)
    ]
    for part in parts:
        assert [row.offset for row in part] == sorted(row.offset for row in part)


def test_max_messages_per_batch_bounds_each_micro_batch(
    spark, server, topics, streams, stream, tmp_path
):
    publish(topics, stream, 0, 1000)  # before the query: 1000 wait, in one transaction
    batches: dict[int, list] = {}
    partitions: dict[int, list[list]] = {}
    query = _start(
        spark, server, stream, tmp_path / "checkpoint", batches, partitions,
        max_messages_per_batch="300", max_messages_per_partition="128",
    )  # fmt: skip
    try:
        wait_for(lambda: len(_bodies(batches)) >= 1000, 180, "the 1000 rows")
        wait_for(lambda: lag(streams, stream) == 0, 60, "a lag of 0")
    finally:
        query.stop()
    assert _bodies(batches) == [f"m{i}".encode() for i in range(1000)]
    assert [len(batches[b]) for b in sorted(batches)] == [300, 300, 300, 100]
    assert [[len(part) for part in partitions[b]] for b in sorted(partitions)] == [
        _sizes(300, 128), _sizes(300, 128), _sizes(300, 128), _sizes(100, 128)
    ]  # fmt: skip


def test_the_reader_plans_from_positions_and_a_task_reads_its_part_or_fails(
    server, topics, streams, stream
):
    """The reader's calls as Spark makes them, without Spark: ends of batches, their
    parts, a task's read of a part, and the log no longer holding a range."""
    from postbox_client.spark.options import topic_read_plan
    from postbox_client.spark.topic_reader import PostboxTopicStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    options = {"target": server.target, "topic": stream, "consumer_group": GROUP}
    reader = PostboxTopicStreamReader(
        topic_read_plan({**options, "max_messages_per_batch": "250",
                         "max_messages_per_partition": "100"})
    )  # fmt: skip
    try:
        start = reader.initialOffset()
        assert start == {"tx": 0, "offset": 0}
        assert reader.getDefaultReadLimit() == ReadMaxRows(250)
        assert reader.latestOffset(start, ReadMaxRows(250)) == start  # nothing yet
        publish(topics, stream, 0, 600)
        end = {}
        wait_for(
            lambda: end.update(reader.latestOffset(start, ReadAllAvailable())) or end != start,
            60, "the publish below the horizon",
        )  # fmt: skip
        first = reader.latestOffset(start, ReadMaxRows(250))
        parts = reader.partitions(start, first)
        assert [p.count for p in parts] == [100, 100, 50]
        assert (parts[0].start, parts[-1].end) == (start, first)
        assert all(a.end == b.start for a, b in itertools.pairwise(parts))
        # A task, with the reader as Spark ships it: pickled, without the channel.
        shipped = pickle.loads(pickle.dumps(reader))
        rows = [row for part in parts for row in shipped.read(part)]
        assert [row[6] for row in rows] == [f"m{i}".encode() for i in range(250)]
        rest = reader.partitions(first, end)
        assert [p.count for p in rest] == [100, 100, 100, 50]
        # Planning a batch committed its start; Spark's commit moves the group on.
        assert lag(streams, stream) == 350
        reader.commit(end)
        assert lag(streams, stream) == 0
        assert reader.partitions(end, end) == []
        # A batch the log no longer holds (as if rotated away) fails, saying so.
        beyond = {"tx": end["tx"], "offset": end["offset"] + 10**9}
        with pytest.raises(RuntimeError, match="no longer holds batch"):
            reader.partitions(end, beyond)
        short = TopicRangePartition(start=parts[2].start, end=parts[2].end, count=51)
        with pytest.raises(RuntimeError, match="no longer holds the 51 messages"):
            list(shipped.read(short))
    finally:
        reader.stop()


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
        (
            {"consumer_group": GROUP, "max_messages_per_partition": "0"},
            "option 'max_messages_per_partition' is 0; it must be 1 to 1e\\+06",
        ),
        (
            {"consumer_group": GROUP, "max_messages_per_partition": "2.5"},
            "option 'max_messages_per_partition' is 2.5; it must be a whole number",
        ),
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
