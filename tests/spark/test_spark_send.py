"""How Spark's tasks call SendBatch, seen by a gRPC proxy between them and the real server:
one channel per task, chunks within the batch size, a bounded number of calls in flight,
retries of UNAVAILABLE and DEADLINE_EXCEEDED, and no retry of other errors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import grpc
import pytest
from spark_support import Fault, SendBatchProxy, receive_all, writer

PARTITIONS = 2


@pytest.fixture
def proxy(server) -> Iterator[SendBatchProxy]:
    # Held calls overlap, so a writer that pipelines shows how many it keeps under way.
    proxy = SendBatchProxy(server.target, hold=0.05)
    yield proxy
    proxy.close()


def _bodies(spark, rows: int):
    return spark.range(0, rows, numPartitions=PARTITIONS).selectExpr("CAST(id AS STRING) AS body")


def _landed_once(messages, queue: str, rows: int) -> None:
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert sum(got.values()) == rows, "a row was lost or landed twice"
    assert set(got) == set(range(rows))


def test_calls_in_flight_stay_within_the_bound_and_chunks_within_the_batch_size(
    spark, server, messages, queue, proxy
):
    rows = 12_000
    writer(
        _bodies(spark, rows), server, queue,
        target=proxy.address, body_column="body", batch_size="250", max_in_flight="3",
    ).save()  # fmt: skip

    _landed_once(messages, queue, rows)
    assert len(proxy.calls) == PARTITIONS, "not one channel per task"
    assert set(proxy.max_concurrent.values()) == {3}, "in flight: not up to the bound of 3"
    assert max(proxy.chunk_sizes) == 250
    assert sum(proxy.chunk_sizes) == rows


def test_default_chunks_hold_at_most_1000_messages(spark, server, messages, queue, proxy):
    rows = 9_000
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2500")
    try:
        writer(_bodies(spark, rows), server, queue, target=proxy.address, body_column="body").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    _landed_once(messages, queue, rows)
    assert max(proxy.chunk_sizes) == 1000
    assert set(proxy.max_concurrent.values()) == {4}  # the default bound


def test_unavailable_and_deadline_exceeded_are_retried_and_land_once(
    spark, server, messages, queue, proxy
):
    rows = 6_000
    # One task is retried at most once by Spark (local[2,2]); three failed calls
    # would fail the job if the writer itself did not retry them. Two of them
    # commit first, as when an answer is lost on the way back.
    proxy.faults = [
        Fault(grpc.StatusCode.UNAVAILABLE),
        Fault(grpc.StatusCode.UNAVAILABLE, after_forwarding=True),
        Fault(grpc.StatusCode.DEADLINE_EXCEEDED, after_forwarding=True),
    ]
    writer(_bodies(spark, rows), server, queue, target=proxy.address, body_column="body").save()

    assert proxy.faults == [], "the proxy did not give every fault"
    _landed_once(messages, queue, rows)
    # Retried by the writer on the task's channel, not by Spark with a new task.
    assert len(proxy.calls) == PARTITIONS
    assert sum(proxy.calls.values()) == rows // 1000 + 3
    # Each after a backoff: the first pause is 0.1-0.2 s (RetryPolicy's jitter).
    assert len(proxy.retry_gaps) == 3
    assert min(proxy.retry_gaps) >= 0.1


def test_other_errors_fail_the_task_at_once_with_the_servers_message(spark, server, queue, proxy):
    proxy.faults = [Fault(grpc.StatusCode.INVALID_ARGUMENT)] * 10
    df = spark.range(0, 10, numPartitions=1).selectExpr("CAST(id AS STRING) AS body")
    with pytest.raises(Exception, match="INVALID_ARGUMENT: proxy fault INVALID_ARGUMENT"):
        writer(df, server, queue, target=proxy.address, body_column="body").save()
    # Each attempt of the task (Spark's retry opens a new channel) made one call.
    assert set(proxy.calls.values()) == {1}
    assert len(proxy.calls) == 2


def test_a_row_the_server_refuses_fails_the_write_with_its_message(spark, server, queue):
    df = spark.sql("SELECT 'urgent' AS body, 42 AS prio")
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT: .*priority"):
        writer(df, server, queue, body_column="body", priority_column="prio").save()
