"""Structured Streaming through the real server: writeStream to a queue, readStream from one."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from postbox.v1 import message_service_pb2 as pb
from pyspark.errors import StreamingQueryException
from spark_support import receive_all, stats

ROWS_PER_SECOND = 500


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(0.2)


def _batches(checkpoint: Path, log: str) -> list[int]:
    """Batch ids in the checkpoint's "offsets" (planned) or "commits" (done) log."""
    return sorted(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())


def _stop_between_batches(query, checkpoint: Path, batches: int) -> None:
    """Stops once `batches` batches committed, right after a commit, while the query idles."""
    try:
        wait_for(lambda: len(_batches(checkpoint, "commits")) >= batches, 120, "batches")
        done = len(_batches(checkpoint, "commits"))
        wait_for(lambda: len(_batches(checkpoint, "commits")) > done, 30, "one more batch")
    finally:
        query.stop()


def _rate_to_queue(spark, server, queue: str, checkpoint: Path):
    return (
        spark.readStream.format("rate")
        .option("rowsPerSecond", ROWS_PER_SECOND)
        .option("numPartitions", 2)
        .load()
        .selectExpr("CAST(value AS STRING) AS body", "CAST(value % 3 AS INT) AS lane")
        .writeStream.format("postbox")
        .option("target", server.target)
        .option("queue", queue)
        .option("body_column", "body")
        .option("attribute_columns", "lane")
        .option("checkpointLocation", str(checkpoint))
        # Batches take well under the trigger interval, so the query mostly idles
        # and a stop() right after a commit does not cut a batch short.
        .trigger(processingTime="2 seconds")
        .start()
    )


def test_stream_from_rate_lands_every_row_once_across_a_restart(
    spark, server, messages, queue, tmp_path
):
    checkpoint = tmp_path / "checkpoint"
    _stop_between_batches(_rate_to_queue(spark, server, queue, checkpoint), checkpoint, 3)

    # Forget that the last batch committed, as if the driver died right before
    # writing its commit: the restarted query runs the batch again, sending rows
    # that are already in the queue. (Should stop() have cut a batch short after
    # all, that batch is the one run again.)
    replayed = _batches(checkpoint, "offsets")[-1]
    for leftover in (checkpoint / "commits").glob(f"*{replayed}*"):
        leftover.unlink()
    query = _rate_to_queue(spark, server, queue, checkpoint)
    _stop_between_batches(query, checkpoint, replayed + 2)
    rerun = [p for p in query.recentProgress if p["batchId"] == replayed]
    assert rerun, "the restarted query did not run the uncommitted batch again"
    assert rerun[0]["numInputRows"] > 0

    # The rate source's offset is in seconds: committed batches hold values below
    # offset * rows per second. Values of a batch cut short by stop() may have
    # landed too, but none may land twice.
    last = _batches(checkpoint, "commits")[-1]
    offset = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[-1])
    committed = offset * ROWS_PER_SECOND
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert max(got.values()) == 1, "a row landed twice"
    assert set(range(committed)) <= set(got)


def test_stream_write_id_option_is_refused(spark, server, queue, tmp_path):
    query = (
        spark.readStream.format("rate")
        .load()
        .writeStream.format("postbox")
        .option("target", server.target)
        .option("queue", queue)
        .option("write_id", "mine")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        with pytest.raises(StreamingQueryException, match="option 'write_id' is for batch"):
            query.awaitTermination(120)
    finally:
        query.stop()


def _send(messages, queue: str, count: int) -> list[str]:
    ids = []
    for start in range(0, count, 1000):
        entries = [pb.SendBatchEntry(body=f"m{i}".encode()) for i in range(start, start + 1000)]
        ids += messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries)).message_ids
    return ids


def _read_queue(spark, server, queue: str, checkpoint: Path, sink, **options: str):
    reader = (
        spark.readStream.format("postbox")
        .option("target", server.target)
        .option("queue", queue)
        .option("wait_time", "0")
        .option("max_messages_per_batch", "1000")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return (
        reader.load()
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def _read_all(spark, server, queues, queue: str, checkpoint: Path, count: int, **options):
    """The rows a stream reader delivers until `count` arrived and all were deleted."""
    rows: list = []

    def sink(batch, batch_id: int) -> None:
        rows.extend(batch.collect())

    query = _read_queue(spark, server, queue, checkpoint, sink, **options)
    try:
        wait_for(lambda: len(rows) >= count, 120, f"{count} rows")
        # Deleted once Spark committed their batches, so the queue empties.
        wait_for(lambda: stats(queues, queue).in_flight_messages == 0, 30, "deletes")
    finally:
        query.stop()
    return rows


def test_reader_delivers_every_message_once_and_deletes_it_after_commit(
    spark, server, messages, queues, queue, tmp_path
):
    sent = _send(messages, queue, 3000)
    rows = _read_all(spark, server, queues, queue, tmp_path / "checkpoint", len(sent))
    assert sorted(r.message_id for r in rows) == sorted(sent)
    by_id = {r.message_id: r for r in rows}
    assert by_id[sent[7]].body == b"m7"
    assert by_id[sent[7]].receive_count == 1
    assert stats(queues, queue).visible_messages == 0


def test_reader_delivers_a_batch_that_never_committed_again(
    spark, server, messages, queues, queue, tmp_path
):
    sent = _send(messages, queue, 1000)
    checkpoint = tmp_path / "checkpoint"

    def broken_sink(batch, batch_id: int) -> None:
        raise RuntimeError("the sink is down")

    query = _read_queue(spark, server, queue, checkpoint, broken_sink, visibility_timeout="3")
    with pytest.raises(StreamingQueryException, match="the sink is down"):
        query.awaitTermination(120)
    # Received, never deleted: in flight until the visibility timeout runs out.
    assert stats(queues, queue).in_flight_messages + stats(queues, queue).visible_messages == 1000

    rows = _read_all(spark, server, queues, queue, checkpoint, len(sent), visibility_timeout="30")
    assert sorted(r.message_id for r in rows) == sorted(sent)
    assert {r.receive_count for r in rows} == {2}


def writer_log(queue: str) -> list[str]:
    """The data source's log lines about `queue`: level and message, from every process of
    the run (the driver's commit and abort hooks run in one of its Python workers)."""
    text = Path(os.environ["POSTBOX_SPARK_LOG_FILE"]).read_text(encoding="utf-8")
    lines = [line.split(" ", 2)[2] for line in text.splitlines() if f"queue {queue!r}" in line]
    return [
        line.replace(" postbox_client.spark.writer:", "", 1)
        for line in lines
        if " postbox_client.spark.writer: " in line
    ]


def _micro_batches_to_queue(spark, server, queue: str, checkpoint: Path, body: str):
    """One micro-batch of 1000 rows in 2 partitions, the same rows whenever it runs again."""
    query = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", 1000)
        .option("numPartitions", 2)
        .load()
        .selectExpr(f"{body} AS body")
        .writeStream.format("postbox")
        .option("target", server.target)
        .option("queue", queue)
        .option("body_column", "body")
        .option("checkpointLocation", str(checkpoint))
        .trigger(once=True)
        .start()
    )
    query.awaitTermination(120)
    return query


def test_commit_logs_what_landed_and_a_rerun_batch_sends_nothing_twice(
    spark, server, messages, queue, tmp_path
):
    checkpoint = tmp_path / "checkpoint"
    body = "CAST(value AS STRING)"
    _micro_batches_to_queue(spark, server, queue, checkpoint, body)
    assert _batches(checkpoint, "commits") == [0]
    # As if the driver died before recording the commit: the restart runs batch 0 again.
    for leftover in (checkpoint / "commits").glob("*0*"):
        leftover.unlink()
    rerun = _micro_batches_to_queue(spark, server, queue, checkpoint, body)
    assert [p["batchId"] for p in rerun.recentProgress][:1] == [0]

    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert got == Counter(range(1000))
    assert writer_log(queue) == [
        f"INFO batch 0 to queue {queue!r} committed: 1000 messages from 2 partitions",
        f"INFO batch 0 to queue {queue!r} committed: 1000 messages from 2 partitions (1000 of"
        " them already committed by an earlier attempt, not sent again)",
    ]


def test_abort_logs_what_landed_before_the_failure(spark, server, messages, queue, tmp_path):
    # Row 999 has a null body: its partition fails on every attempt, after sending
    # the rows before it; the other partition commits its 500.
    with pytest.raises(StreamingQueryException, match="column 'body' is null"):
        _micro_batches_to_queue(
            spark, server, queue, tmp_path / "checkpoint",
            "IF(value = 999, NULL, CAST(value AS STRING))",
        )  # fmt: skip
    (line,) = writer_log(queue)
    assert line.startswith(
        f"ERROR batch 0 to queue {queue!r} failed; committed before the failure:"
        " 500 messages from 1 partitions."
    )
