"""SendBatch's short way: a batch whose entries set nothing but a body, and perhaps a
deduplication id, skips the per-entry conversion. It must never take an entry that
sets anything else."""

from __future__ import annotations

import pytest
from postbox.v1 import message_pb2
from postbox.v1 import message_service_pb2 as pb

from postbox_server.services.convert import PlainBatch, plain_batch

LIMIT = 1 << 20


def batch(*entries: pb.SendBatchEntry, queue: str = "orders") -> pb.SendBatchRequest:
    return pb.SendBatchRequest(queue=queue, entries=entries)


# Body and queue lengths around every varint boundary of a field's length prefix.
@pytest.mark.parametrize("length", [1, 125, 126, 127, 128, 16380, 16383, 16384, 300_000])
def test_bodies_of_any_length_take_the_short_way(length):
    bodies = [b"x" * length, b"y"]
    entries = [pb.SendBatchEntry(body=b) for b in bodies]
    assert plain_batch(batch(*entries), LIMIT) == PlainBatch(bodies, None)
    long_queue = batch(pb.SendBatchEntry(body=b"z"), queue="q" * min(length, 300))
    assert plain_batch(long_queue, LIMIT) == PlainBatch([b"z"], None)
    with_ids = [pb.SendBatchEntry(body=b, deduplication_id="d" * min(length, 128)) for b in bodies]
    assert plain_batch(batch(*with_ids), LIMIT) == PlainBatch(bodies, ["d" * min(length, 128)] * 2)


def test_a_non_ascii_queue_name_is_counted_in_bytes():
    plain = plain_batch(batch(pb.SendBatchEntry(body=b"z"), queue="é" * 70), LIMIT)
    assert plain == PlainBatch([b"z"], None)


def test_deduplication_ids_take_the_short_way_beside_entries_without_one():
    entries = [pb.SendBatchEntry(body=b"a", deduplication_id="one"), pb.SendBatchEntry(body=b"b")]
    assert plain_batch(batch(*entries), LIMIT) == PlainBatch([b"a", b"b"], ["one", None])


def test_a_deduplication_id_that_is_not_ascii_takes_the_long_way():
    """Counted in characters, it would pass for shorter than it is; the engine refuses it."""
    entries = [pb.SendBatchEntry(body=b"a", deduplication_id="é" * 3)]
    assert plain_batch(batch(*entries), LIMIT) is None


def _with(**fields) -> pb.SendBatchEntry:
    return pb.SendBatchEntry(body=b"x", **fields)


@pytest.mark.parametrize(
    "entry",
    [
        _with(message_group_id="g"),
        _with(deduplication_id="d", message_group_id="g"),
        _with(deduplication_id="d", priority=1),
        _with(dedupe_key="k"),
        _with(priority=1),
        _with(delay={}),  # set to zero: still set
        _with(delay={"seconds": 5}),
        _with(deliver_at={"seconds": 5}),
        _with(attributes={"a": message_pb2.AttributeValue(string_value="v")}),
        pb.SendBatchEntry(body=b""),
    ],
)
def test_an_entry_that_sets_anything_else_takes_the_long_way(entry):
    assert plain_batch(batch(pb.SendBatchEntry(body=b"plain"), entry), LIMIT) is None
    plain_with_id = pb.SendBatchEntry(body=b"plain", deduplication_id="d")
    assert plain_batch(batch(plain_with_id, entry), LIMIT) is None


def test_an_oversized_or_empty_batch_takes_the_long_way():
    """There the per-entry checks give their precise errors."""
    assert plain_batch(batch(pb.SendBatchEntry(body=b"x" * 11)), 10) is None
    assert plain_batch(batch(), LIMIT) is None
