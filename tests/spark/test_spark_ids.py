"""Idempotency ids of the Spark writer: attempts of one partition, run side by side as
Spark's speculative execution or a task retry does, against the real server."""

from __future__ import annotations

import re
import threading
from collections import Counter

import pyarrow as pa
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox_client.spark import encode
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


def _requests(encoder: Encoder, bodies: list[str]) -> list[pb.SendBatchRequest]:
    batch = pa.RecordBatch.from_pydict({"body": bodies})
    return [pb.SendBatchRequest.FromString(r.payload) for r in encoder.requests(batch)]


def _ids(requests: list[pb.SendBatchRequest]) -> list[str]:
    return [entry.deduplication_id for request in requests for entry in request.entries]


def test_ids_are_the_prefix_row_and_request_digest(server, queue):
    bodies = [str(row) for row in range(150)]  # two requests of batch_size 100
    first = _ids(_requests(Encoder(_plan(server.target, queue), PREFIX), bodies))
    assert re.fullmatch(r"nightly:7:0:[0-9a-f]{16}", first[0])
    assert re.fullmatch(r"nightly:7:149:[0-9a-f]{16}", first[149])
    assert len({id.rsplit(":", 1)[1] for id in first[:100]}) == 1  # one digest a request
    # The same rows in the same order: the same ids. Other content in one row: every
    # row of its request gets another id, and the other request's rows keep theirs.
    again = _ids(_requests(Encoder(_plan(server.target, queue), PREFIX), bodies))
    assert again == first
    changed = _ids(
        _requests(Encoder(_plan(server.target, queue), PREFIX), [*bodies[:120], "x", *bodies[121:]])
    )
    assert changed[:100] == first[:100]
    assert [id.split(":")[2] for id in changed[100:]] == [str(row) for row in range(100, 150)]
    assert not set(changed[100:]) & set(first[100:])


def test_rows_that_trade_places_get_other_ids_even_an_empty_one(server, queue):
    """An empty body leaves the entry empty: the digest still tells `["", "a"]` from
    `["a", ""]`, since it hashes each entry with its length."""
    plan = _plan(server.target, queue)
    assert _ids(_requests(Encoder(plan, PREFIX), ["", "a"])) != _ids(
        _requests(Encoder(plan, PREFIX), ["a", ""])
    )


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
        assert list(fast.requests(batch)) == list(general.requests(batch))


def test_bodies_alone_split_requests_by_size_as_the_general_encoding(monkeypatch):
    """Requests end at `batch_size` rows or before their bodies pass MAX_REQUEST_BYTES
    (a larger body alone is a request of its own), on both encodings alike, whether
    the fast one takes the batch's chunks in one pass or several (ENCODE_BYTES)."""
    monkeypatch.setattr(encode, "MAX_REQUEST_BYTES", 500)
    monkeypatch.setattr(encode, "ENCODE_BYTES", 2000)
    schema = StructType([StructField("body", StringType())])
    plan = write_plan(
        {"queue": "q", "body_column": "body", "batch_size": "7"}, schema, streaming=False
    )
    sizes = [0, 1, 50, 200, 499, 500, 501, 1000, 3, 3, 3, 3, 3, 3, 3, 3, 250, 250, 251, 3000]
    batch = pa.RecordBatch.from_pydict({"body": ["x" * size for size in sizes * 3]})
    general = Encoder(plan, PREFIX)
    general._bodies_only = lambda: False  # type: ignore[method-assign]
    fast = list(Encoder(plan, PREFIX).requests(batch))
    assert fast == list(general.requests(batch))
    assert sum(r.entries for r in fast) == batch.num_rows
    for request in fast:
        entries = pb.SendBatchRequest.FromString(request.payload).entries
        assert len(entries) <= 7
        assert len(entries) == 1 or sum(len(e.body) for e in entries) <= 500


def test_a_null_body_on_the_fast_encoding_names_its_row():
    schema = StructType([StructField("body", StringType())])
    plan = write_plan({"queue": "q", "body_column": "body"}, schema, streaming=False)
    encoder = Encoder(plan, PREFIX)
    list(encoder.requests(pa.RecordBatch.from_pydict({"body": ["a", "b"]})))
    with pytest.raises(PostboxRowError, match="'body' is null in row 3 of this partition"):
        list(encoder.requests(pa.RecordBatch.from_pydict({"body": ["c", None]})))
