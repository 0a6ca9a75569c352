"""MessageService unary calls through the real server: send, delete, change visibility."""

from __future__ import annotations

import time

import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import error_of, receive, seconds, stats


def test_send_then_receive_and_delete(messages, queues, queue):
    sent = messages.Send(pb.SendRequest(queue=queue, body=b"hello"))
    (got,) = receive(messages, queue)
    assert got.message_id == sent.message_id
    assert got.body == b"hello"
    assert got.receive_count == 1
    assert got.receipt
    assert got.enqueue_time.seconds > 0
    assert got.first_receive_time.seconds > 0
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    assert stats(queues, queue).in_flight_messages == 0


def test_send_to_missing_queue_is_not_found(messages):
    error = error_of(messages.Send, pb.SendRequest(queue="no_such_queue", body=b"x"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_send_batch_returns_ids_in_order(messages, queue):
    bodies = [f"m{i}".encode() for i in range(1000)]
    response = messages.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b) for b in bodies])
    )
    assert len(response.message_ids) == 1000
    by_id = {}
    for batch in messages.Receive(
        pb.ReceiveRequest(queue=queue, max_messages=1000, wait_time=seconds(0))
    ):
        by_id.update({m.message_id: m.body for m in batch.messages})
    assert [by_id[i] for i in response.message_ids] == bodies


def test_send_batch_deduplicates_entries_that_set_only_a_body_and_an_id(messages, queue):
    """The Producer's batches: the short way keeps deduplication, across batches and within."""
    first = messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue,
            entries=[
                pb.SendBatchEntry(body=b"a", deduplication_id="id-a"),
                pb.SendBatchEntry(body=b"b"),
            ],
        )
    )
    assert list(first.duplicates) == [False, False]
    again = messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue,
            entries=[
                pb.SendBatchEntry(body=b"c", deduplication_id="id-c"),
                pb.SendBatchEntry(body=b"a", deduplication_id="id-a"),
                pb.SendBatchEntry(body=b"c", deduplication_id="id-c"),
            ],
        )
    )
    assert list(again.duplicates) == [False, True, True]
    assert again.message_ids[1] == first.message_ids[0]
    assert again.message_ids[2] == again.message_ids[0]
    bodies = sorted(m.body for m in receive(messages, queue, count=10))
    assert bodies == [b"a", b"b", b"c"]


@pytest.mark.parametrize("count", [0, 1001])
def test_send_batch_size_limits(messages, queue, count):
    error = error_of(
        messages.SendBatch,
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * count),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1 to 1000 entries" in error.details()


@pytest.mark.parametrize(
    ("bad_entry", "says"),
    [
        (pb.SendBatchEntry(body=b"x" * (1024 * 1024 + 1)), "bytes"),
        (pb.SendBatchEntry(body=b"x", delay=seconds(-1)), "delay"),
        (
            pb.SendBatchEntry(
                body=b"x",
                attributes={"a": msg.AttributeValue(data_type="Number", string_value="NaN")},
            ),
            "decimal number",
        ),
        (
            pb.SendBatchEntry(
                body=b"x",
                attributes={"a": msg.AttributeValue(data_type="String", string_value="\x00")},
            ),
            "NUL",
        ),
        # Body and deduplication id only: the batch takes the short way (plain_batch).
        (pb.SendBatchEntry(body=b"x", deduplication_id="d" * 129), "deduplication_id"),
        (pb.SendBatchEntry(body=b"x", deduplication_id="d d"), "deduplication_id"),
    ],
)
def test_send_batch_is_all_or_nothing(messages, queues, queue, bad_entry, says):
    entries = [pb.SendBatchEntry(body=b"ok")] * 3 + [bad_entry] + [pb.SendBatchEntry(body=b"ok")]
    error = error_of(messages.SendBatch, pb.SendBatchRequest(queue=queue, entries=entries))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "entry 3" in error.details()
    assert says in error.details()
    assert stats(queues, queue).visible_messages == 0


def test_oversize_message_is_invalid_argument(messages, queues, queue):
    error = error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x" * (1024 * 1024 + 1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Attributes count toward the size, as in SQS.
    error = error_of(
        messages.Send,
        pb.SendRequest(
            queue=queue,
            body=b"x" * (1024 * 1024 - 10),
            attributes={"name": msg.AttributeValue(data_type="String", string_value="0123456789")},
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    messages.Send(pb.SendRequest(queue=queue, body=b"x" * (1024 * 1024)))
    assert stats(queues, queue).visible_messages == 1


ATTRIBUTES = {
    "plain": msg.AttributeValue(data_type="String", string_value="héllo wörld ✓ 𝄞"),
    "spaces": msg.AttributeValue(data_type="String", string_value="  \t\r\nline  "),
    "count": msg.AttributeValue(data_type="Number", string_value="-12.50e+3"),
    "big": msg.AttributeValue(
        data_type="Number", string_value="12345678901234567890123456789012345678"
    ),
    "ratio": msg.AttributeValue(data_type="Number.float", string_value="0.25"),
    "blob": msg.AttributeValue(data_type="Binary", binary_value=bytes(range(256))),
    "image": msg.AttributeValue(data_type="Binary.png", binary_value=b"\x89PNG\x00\xff"),
    "json": msg.AttributeValue(data_type="String.json", string_value='{"a": [1, "\\u0041"]}'),
    "a.b-c_d": msg.AttributeValue(data_type="String", string_value="dots"),
    "Custom": msg.AttributeValue(data_type="String.x y;z'\"", string_value="'; DROP TABLE x; --"),
}


def test_attributes_round_trip_byte_exact(messages, queue):
    body = bytes(range(256)) * 4
    messages.Send(pb.SendRequest(queue=queue, body=body, attributes=ATTRIBUTES))
    (got,) = receive(messages, queue)
    assert got.body == body
    assert dict(got.attributes) == ATTRIBUTES
    for name, value in ATTRIBUTES.items():
        assert got.attributes[name].WhichOneof("value") == value.WhichOneof("value")


@pytest.mark.parametrize(
    ("attributes", "says"),
    [
        ({"x": msg.AttributeValue(data_type="Text", string_value="v")}, "data_type"),
        ({"x": msg.AttributeValue(data_type="String")}, "non-empty string value"),
        ({"x": msg.AttributeValue(data_type="String", string_value="")}, "non-empty"),
        ({"x": msg.AttributeValue(data_type="Binary", string_value="v")}, "binary value"),
        ({"x": msg.AttributeValue(data_type="String", binary_value=b"v")}, "string value"),
        ({"x": msg.AttributeValue(data_type="Number", string_value="1,5")}, "decimal number"),
        ({"AWS.x": msg.AttributeValue(data_type="String", string_value="v")}, "AWS."),
        ({"amazon.x": msg.AttributeValue(data_type="String", string_value="v")}, "AWS."),
        ({".x": msg.AttributeValue(data_type="String", string_value="v")}, '"."'),
        ({"x..y": msg.AttributeValue(data_type="String", string_value="v")}, '".."'),
        ({"x y": msg.AttributeValue(data_type="String", string_value="v")}, "may only contain"),
        ({"x" * 257: msg.AttributeValue(data_type="String", string_value="v")}, "256"),
        (
            {f"a{i}": msg.AttributeValue(data_type="String", string_value="v") for i in range(101)},
            "101 attributes; a message may have at most 100",
        ),
    ],
)
def test_bad_attributes_are_invalid(messages, queues, queue, attributes, says):
    error = error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x", attributes=attributes))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    assert stats(queues, queue).visible_messages == 0


def test_delay_hides_message_until_due(messages, queues, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"late", delay=seconds(0.5)))
    assert receive(messages, queue) == []
    assert stats(queues, queue).delayed_messages == 1
    time.sleep(0.6)
    assert [m.body for m in receive(messages, queue)] == [b"late"]


def test_queue_delivery_delay_applies_by_default(messages, queues, queue):
    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=queue, delivery_delay=seconds(60)),
            update_mask={"paths": ["delivery_delay"]},
        )
    )
    messages.Send(pb.SendRequest(queue=queue, body=b"queued"))
    messages.Send(pb.SendRequest(queue=queue, body=b"now", delay=seconds(0)))
    assert [m.body for m in receive(messages, queue)] == [b"now"]


def test_visibility_expiry_redelivers_with_new_receipt(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"again"))
    (first,) = receive(messages, queue, visibility=0.3)
    assert receive(messages, queue) == []
    time.sleep(0.4)
    (second,) = receive(messages, queue)
    assert second.message_id == first.message_id
    assert second.receive_count == 2
    assert second.receipt != first.receipt
    assert second.first_receive_time == first.first_receive_time


def test_stale_receipt_is_refused(messages, queues, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (first,) = receive(messages, queue, visibility=0)
    (second,) = receive(messages, queue)
    for call, request in [
        (messages.Delete, pb.DeleteRequest(queue=queue, receipt=first.receipt)),
        (
            messages.ChangeVisibility,
            pb.ChangeVisibilityRequest(
                queue=queue, receipt=first.receipt, visibility_timeout=seconds(0)
            ),
        ),
    ]:
        error = error_of(call, request)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "stale" in error.details()
    assert stats(queues, queue).in_flight_messages == 1
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=second.receipt))
    error = error_of(messages.Delete, pb.DeleteRequest(queue=queue, receipt=second.receipt))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_a_delivery_named_by_message_id_and_receive_count_is_a_receipt(messages, queues, queue):
    """The REST API's delivery ids reach the engine as "<message id>#<receive count mod
    4096>": current while that delivery holds the message, stale after a redelivery."""
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (first,) = receive(messages, queue, visibility=60)
    assert first.receive_count == 1
    named = f"{first.message_id}#1"
    messages.ChangeVisibility(
        pb.ChangeVisibilityRequest(queue=queue, receipt=named, visibility_timeout=seconds(0))
    )
    (second,) = receive(messages, queue, visibility=60)
    for call, request in [
        (messages.Delete, pb.DeleteRequest(queue=queue, receipt=named)),
        (
            messages.ChangeVisibility,
            pb.ChangeVisibilityRequest(queue=queue, receipt=named, visibility_timeout=seconds(0)),
        ),
    ]:
        error = error_of(call, request)
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"'{named}' is stale" in error.details()
    assert stats(queues, queue).in_flight_messages == 1
    # (Beside the current delivery of the same message, the engine reads a stale one
    # as done with it: an outcome is the message's; neither deletes more.)
    refused = messages.DeleteBatch(
        pb.DeleteBatchRequest(queue=queue, receipts=[named, "999999999#1", "1#4096"])
    )
    assert [r.code for r in refused.results] == [
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        grpc.StatusCode.NOT_FOUND.value[0],
        grpc.StatusCode.INVALID_ARGUMENT.value[0],  # no count of 4096 or more: malformed
    ]
    done = messages.DeleteBatch(
        pb.DeleteBatchRequest(queue=queue, receipts=[f"{second.message_id}#2"])
    )
    assert [r.code for r in done.results] == [grpc.StatusCode.OK.value[0]]
    error = error_of(messages.Delete, pb.DeleteRequest(queue=queue, receipt=named))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_receipt_stays_valid_after_timeout_until_redelivery(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue, visibility=0)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    assert receive(messages, queue) == []


@pytest.mark.parametrize("receipt", ["", "garbage", "1:nope", "99999999999999999999:x", "1;DROP"])
def test_malformed_receipt_is_invalid(messages, queue, receipt):
    error = error_of(messages.Delete, pb.DeleteRequest(queue=queue, receipt=receipt))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_receipt_of_another_queue_is_not_found(messages, queues, queue):
    other = queue + "_other"
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=other)))
    messages.Send(pb.SendRequest(queue=other, body=b"x"))
    (got,) = receive(messages, other)
    error = error_of(messages.Delete, pb.DeleteRequest(queue=queue, receipt=got.receipt))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    messages.Delete(pb.DeleteRequest(queue=other, receipt=got.receipt))


def test_delete_batch_reports_each_entry(messages, queues, queue):
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 3))
    got = receive(messages, queue, visibility=0)
    (redelivered,) = receive(messages, queue, count=1)  # makes one of the receipts stale
    fresh = [m for m in got if m.message_id != redelivered.message_id]
    stale = next(m for m in got if m.message_id == redelivered.message_id)
    result = messages.DeleteBatch(
        pb.DeleteBatchRequest(
            queue=queue, receipts=[fresh[0].receipt, stale.receipt, "bad", fresh[1].receipt]
        )
    )
    assert [r.code for r in result.results] == [
        grpc.StatusCode.OK.value[0],
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
        grpc.StatusCode.OK.value[0],
    ]
    assert "stale" in result.results[1].message
    again = messages.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=[fresh[0].receipt]))
    assert again.results[0].code == grpc.StatusCode.NOT_FOUND.value[0]
    assert stats(queues, queue).in_flight_messages == 1


@pytest.mark.parametrize("count", [0, 1001])
def test_delete_batch_size_limits(messages, queue, count):
    error = error_of(
        messages.DeleteBatch, pb.DeleteBatchRequest(queue=queue, receipts=["1:x"] * count)
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_change_visibility_extends_and_releases(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue, visibility=0.3)
    messages.ChangeVisibility(
        pb.ChangeVisibilityRequest(queue=queue, receipt=got.receipt, visibility_timeout=seconds(60))
    )
    time.sleep(0.4)
    assert receive(messages, queue) == []
    messages.ChangeVisibility(
        pb.ChangeVisibilityRequest(queue=queue, receipt=got.receipt, visibility_timeout=seconds(0))
    )
    (again,) = receive(messages, queue)
    assert again.message_id == got.message_id
    assert again.receive_count == 2


@pytest.mark.parametrize("timeout", [None, -1, 43201])
def test_change_visibility_rejects_bad_timeouts(messages, queue, timeout):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    request = pb.ChangeVisibilityRequest(queue=queue, receipt=got.receipt)
    if timeout is not None:
        request.visibility_timeout.CopyFrom(seconds(timeout))
    assert error_of(messages.ChangeVisibility, request).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_change_visibility_batch_reports_each_entry(messages, queue):
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 2))
    first, second = receive(messages, queue, visibility=60)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=second.receipt))
    result = messages.ChangeVisibilityBatch(
        pb.ChangeVisibilityBatchRequest(
            queue=queue,
            entries=[
                pb.ChangeVisibilityBatchEntry(receipt=first.receipt, visibility_timeout=seconds(0)),
                pb.ChangeVisibilityBatchEntry(
                    receipt=second.receipt, visibility_timeout=seconds(0)
                ),
            ],
        )
    )
    assert [r.code for r in result.results] == [0, grpc.StatusCode.NOT_FOUND.value[0]]
    assert [m.message_id for m in receive(messages, queue)] == [first.message_id]
