"""Idempotency ids of the Spark writer: attempts of one partition, run side by side as
Spark's speculative execution or a task retry does, against the real server."""

from __future__ import annotations

import re
import threading
from collections import Counter

import pyarrow as pa
import pytest
from postbox_client.spark.encode import Encoder, PostboxRowError
from postbox_client.spark.options import WritePlan, write_plan
from postbox_client.spark.writer import PartitionResult, send_partition
from pyspark.sql.types import StringType, StructField, StructType
from spark_support import receive_all

ROWS = 3000
PREFIX = "nightly:7"  # <write id>:<partition>, as a task of partition 7 derives it


def _plan(target: str, queue: str) -> WritePlan:
    schema = StructType([StructField("body", StringType())])
    options = {"target": target, "queue": queue, "body_column": "body", "batch_size": "100"}
    return write_plan(options, schema, streaming=False)


def _batches(rows: list[int]) -> list[pa.RecordBatch]:
    bodies = [str(row) for row in rows]
    return [
        pa.RecordBatch.from_pydict({"body": bodies[i : i + 500]})
        for i in range(0, len(bodies), 500)
    ]


def test_ids_are_the_prefix_row_and_content_digest(server, queue):
    encoder = Encoder(_plan(server.target, queue), PREFIX)
    (request,) = encoder.requests(pa.RecordBatch.from_pydict({"body": ["a", "b"]}))
    first, second = (entry.deduplication_id for entry in request.entries)
    assert re.fullmatch(r"nightly:7:0:[0-9a-f]{16}", first)
    assert re.fullmatch(r"nightly:7:1:[0-9a-f]{16}", second)
    # The same row at the same position: the same id; other content there: another.
    (again,) = Encoder(_plan(server.target, queue), PREFIX).requests(
        pa.RecordBatch.from_pydict({"body": ["a", "c"]})
    )
    assert again.entries[0].deduplication_id == first
    assert again.entries[1].deduplication_id.split(":")[:3] == ["nightly", "7", "1"]
    assert again.entries[1].deduplication_id != second


def test_parallel_attempts_of_a_partition_land_each_row_once(server, messages, queue):
    plan = _plan(server.target, queue)
    results: list[PartitionResult] = []

    def attempt() -> None:
        results.append(send_partition(plan, _batches(list(range(ROWS))), PREFIX))

    attempts = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in attempts:
        thread.start()
    for thread in attempts:
        thread.join(120)

    assert [r.messages for r in results] == [ROWS, ROWS]
    assert sum(r.duplicates for r in results) == ROWS  # each row was new to one attempt
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert got == Counter(range(ROWS))


def test_a_retry_in_another_order_loses_no_row(server, messages, queue):
    """The first attempt committed half its rows, then failed; the retry's rows come in
    reverse order (a shuffle without a sort). Ids of the row position alone would take
    the retry's first half for repeats of what was committed and drop it."""
    plan = _plan(server.target, queue)
    half = ROWS // 2
    send_partition(plan, _batches(list(range(half))), PREFIX)
    retry = send_partition(plan, _batches(list(reversed(range(ROWS)))), PREFIX)

    assert retry.duplicates == 0  # no position holds the row it held before
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert set(got) == set(range(ROWS))
    # At least once for the rows that moved: those the first attempt had sent, twice.
    assert got == Counter(range(ROWS)) + Counter(range(half))


@pytest.mark.parametrize("destination", ["queue", "topic"])
@pytest.mark.parametrize("body_type", [pa.string(), pa.binary(), pa.large_string()])
def test_bodies_alone_take_the_fast_encoding_with_the_same_ids_and_bytes(destination, body_type):
    """A plan of bodies alone is encoded without serializing each entry for its digest:
    the requests, ids included, are those of the general encoding, byte for byte, so an
    attempt of another client version repeats them."""
    schema = StructType([StructField("body", StringType())])
    plan = write_plan({destination: "d", "body_column": "body"}, schema, streaming=False)
    bodies = ["", "a", "é" * 70, "x" * 200, "y" * 20_000]  # one- to three-byte lengths
    batch = pa.RecordBatch.from_pydict({"body": pa.array(bodies, body_type)})
    fast = Encoder(plan, PREFIX)
    general = Encoder(plan, PREFIX)
    general._bodies_only = lambda: False  # type: ignore[method-assign]
    assert fast._bodies_only()
    for _ in range(2):  # positions go on across batches alike
        assert [r.SerializeToString() for r in fast.requests(batch)] == [
            r.SerializeToString() for r in general.requests(batch)
        ]


def test_a_null_body_on_the_fast_encoding_names_its_row():
    schema = StructType([StructField("body", StringType())])
    plan = write_plan({"queue": "q", "body_column": "body"}, schema, streaming=False)
    encoder = Encoder(plan, PREFIX)
    list(encoder.requests(pa.RecordBatch.from_pydict({"body": ["a", "b"]})))
    with pytest.raises(PostboxRowError, match="'body' is null in row 3 of this partition"):
        list(encoder.requests(pa.RecordBatch.from_pydict({"body": ["c", None]})))
