"""FIFO groups, deduplication, idempotent enqueue and priority through the real server."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import defaultdict

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import create_queue, error_of, eventually, kept, receive, seconds, stats, unique_name


@pytest.fixture
def fifo(queues):
    return create_queue(queues, unique_name("ordered") + ".fifo").name


def send(messages, queue: str, body: bytes, **options) -> pb.SendResponse:
    return messages.Send(pb.SendRequest(queue=queue, body=body, **options))


def test_fifo_queue_is_made_by_its_name(queues, fifo):
    assert create_queue(queues, unique_name("plain")).fifo is False
    from postbox.v1 import queue_service_pb2 as qpb

    assert queues.GetQueue(qpb.GetQueueRequest(name=fifo)).queue.fifo is True


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"deduplication_id": "d"}, "message_group_id"),
        ({"message_group_id": "g"}, "deduplication_id"),
        ({"message_group_id": "g", "deduplication_id": "d", "priority": 3}, "priority"),
        ({"message_group_id": "g", "deduplication_id": "d", "delay": seconds(1)}, "delay"),
        ({"message_group_id": "g", "deduplication_id": "d", "dedupe_key": "k"}, "dedupe_key"),
        ({"message_group_id": "g" * 129, "deduplication_id": "d"}, "message_group_id"),
        ({"message_group_id": "a b", "deduplication_id": "d"}, "message_group_id"),
        ({"message_group_id": "g", "deduplication_id": "é"}, "deduplication_id"),
    ],
)
def test_fifo_send_rules(messages, queues, fifo, options, says):
    error = error_of(send, messages, fifo, b"x", **options)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    assert stats(queues, fifo).visible_messages == 0


def test_a_group_is_blocked_while_its_message_is_in_flight(messages, fifo):
    for body, group in [(b"a1", "A"), (b"a2", "A"), (b"b1", "B"), (b"a3", "A")]:
        send(messages, fifo, body, message_group_id=group, deduplication_id=body.decode())
    first = receive(messages, fifo, count=2)
    assert [m.body for m in first] == [b"a1", b"a2"]  # the head and its run
    (b1,) = receive(messages, fifo, count=10)  # group A is in flight: only B
    assert b1.body == b"b1"
    assert receive(messages, fifo, count=10) == []
    messages.Delete(pb.DeleteRequest(queue=fifo, receipt=first[0].receipt))
    assert receive(messages, fifo, count=10) == []  # a2 still in flight
    messages.Delete(pb.DeleteRequest(queue=fifo, receipt=first[1].receipt))
    (a3,) = receive(messages, fifo, count=10)
    assert a3.body == b"a3"
    assert a3.message_group_id == "A"


def test_several_messages_of_one_group_come_in_order_in_one_receive(messages, fifo):
    for body, group in [(b"a1", "A"), (b"b1", "B"), (b"a2", "A"), (b"b2", "B"), (b"a3", "A")]:
        send(messages, fifo, body, message_group_id=group, deduplication_id=body.decode())
    got = receive(messages, fifo, count=10)
    assert [m.body for m in got] == [b"a1", b"a2", b"a3", b"b1", b"b2"]
    assert len({m.receipt for m in got}) == 5
    assert receive(messages, fifo, count=10) == []


def test_a_timed_out_head_comes_back_before_the_rest_of_its_group(messages, fifo):
    for body in [b"1", b"2"]:
        send(messages, fifo, body, message_group_id="G", deduplication_id=body.decode())
    (head,) = receive(messages, fifo, count=1, visibility=0.3)
    assert head.body == b"1"
    time.sleep(0.4)
    (again,) = receive(messages, fifo, count=1)
    assert again.body == b"1"
    assert again.receive_count == 2


def make_visible(messages, fifo: str, message) -> None:
    messages.ChangeVisibility(
        pb.ChangeVisibilityRequest(
            queue=fifo, receipt=message.receipt, visibility_timeout=seconds(0)
        )
    )


def test_a_run_member_made_visible_waits_for_the_rest_of_its_run(messages, fifo):
    for body in [b"1", b"2", b"3", b"4"]:
        send(messages, fifo, body, message_group_id="G", deduplication_id=body.decode())
    run = receive(messages, fifo, count=3)
    assert [m.body for m in run] == [b"1", b"2", b"3"]
    make_visible(messages, fifo, run[1])  # "2" is not the group's oldest: not delivered
    assert receive(messages, fifo, count=10) == []
    make_visible(messages, fifo, run[0])  # "3" still in flight: the group stays blocked
    assert receive(messages, fifo, count=10) == []
    make_visible(messages, fifo, run[2])
    again = receive(messages, fifo, count=10)
    assert [m.body for m in again] == [b"1", b"2", b"3", b"4"]
    assert [m.receive_count for m in again] == [2, 2, 2, 1]


def test_deleting_the_head_of_a_run_does_not_release_the_group(messages, fifo):
    for body in [b"1", b"2", b"3"]:
        send(messages, fifo, body, message_group_id="G", deduplication_id=body.decode())
    run = receive(messages, fifo, count=2)
    messages.Delete(pb.DeleteRequest(queue=fifo, receipt=run[0].receipt))
    assert receive(messages, fifo, count=10) == []
    make_visible(messages, fifo, run[1])
    assert [m.body for m in receive(messages, fifo, count=10)] == [b"2", b"3"]


async def test_fifo_order_holds_for_8_consumers_and_20_groups(aio_channel, queues):
    queue = create_queue(queues, unique_name("fifo_load") + ".fifo").name
    stub = message_service_pb2_grpc.MessageServiceStub(aio_channel)
    groups, per_group = 20, 25
    # Interleaved sends, so every batch mixes groups.
    for round_ in range(per_group):
        entries = [
            pb.SendBatchEntry(
                body=f"{g}:{round_}".encode(),
                message_group_id=f"g{g}",
                deduplication_id=f"{g}:{round_}",
            )
            for g in range(groups)
        ]
        await stub.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
    delivered: dict[str, list[int]] = defaultdict(list)
    in_flight: set[str] = set()
    violations: list[str] = []

    async def consume() -> None:
        call = stub.Receive(
            pb.ReceiveRequest(
                queue=queue,
                mode=pb.RECEIVE_MODE_CONTINUOUS,
                max_messages=5,
                idle_timeout=seconds(1.5),
                visibility_timeout=seconds(60),
            )
        )
        async for response in call:
            groups_here = {m.body.decode().split(":")[0] for m in response.messages}
            for group in groups_here & in_flight:
                violations.append(f"group {group} delivered twice at once")
            in_flight.update(groups_here)
            for message in response.messages:
                group, sequence = message.body.decode().split(":")
                delivered[group].append(int(sequence))
            await asyncio.sleep(0.001)  # "processing"
            for message in response.messages:
                in_flight.discard(message.body.decode().split(":")[0])
            await stub.DeleteBatch(
                pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in response.messages])
            )

    await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(8))), 120)
    assert violations == []
    assert len(delivered) == groups
    for group, sequence in delivered.items():
        assert sequence == list(range(per_group)), group


def test_duplicate_within_window_returns_the_original(messages, queues, queue):
    first = send(messages, queue, b"once", deduplication_id="order-17")
    again = send(messages, queue, b"twice", deduplication_id="order-17")
    assert again.message_id == first.message_id
    assert (first.duplicate, again.duplicate) == (False, True)
    (got,) = receive(messages, queue, count=10)
    assert got.body == b"once"
    assert got.deduplication_id == "order-17"
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    after_delete = send(messages, queue, b"thrice", deduplication_id="order-17")
    assert after_delete.duplicate
    assert after_delete.message_id == first.message_id
    assert stats(queues, queue).visible_messages == 0


def test_deduplication_window_is_configurable(messages, queues):
    queue = create_queue(queues, unique_name("short_window"), deduplication_window=seconds(1)).name
    first = send(messages, queue, b"x", deduplication_id="d")
    assert send(messages, queue, b"x", deduplication_id="d").duplicate
    time.sleep(1.1)
    later = send(messages, queue, b"x", deduplication_id="d")
    assert not later.duplicate
    assert later.message_id != first.message_id


def test_content_based_deduplication_hashes_the_body(messages, queues):
    queue = create_queue(
        queues, unique_name("by_content") + ".fifo", content_based_deduplication=True
    )
    first = send(messages, queue.name, b"same", message_group_id="g")
    assert send(messages, queue.name, b"same", message_group_id="g").duplicate
    assert not send(messages, queue.name, b"other", message_group_id="g").duplicate
    (got,) = receive(messages, queue.name, count=1)
    assert got.message_id == first.message_id
    assert got.deduplication_id == hashlib.sha256(b"same").hexdigest()


def test_deduplication_scope_message_group_makes_an_id_its_groups_own(messages, queues):
    """SQS's high-throughput FIFO: with DeduplicationScope messageGroup the same id in two
    groups names two messages; within a group it is still a duplicate."""
    queue = create_queue(
        queues, unique_name("per_group") + ".fifo",
        deduplication_scope=qpb.DEDUPLICATION_SCOPE_MESSAGE_GROUP,
        fifo_throughput_limit=qpb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID,
    ).name  # fmt: skip
    got = queues.GetQueue(qpb.GetQueueRequest(name=queue)).queue
    assert got.deduplication_scope == qpb.DEDUPLICATION_SCOPE_MESSAGE_GROUP
    assert got.fifo_throughput_limit == qpb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID
    a = send(messages, queue, b"a", message_group_id="a", deduplication_id="order-1")
    b = send(messages, queue, b"b", message_group_id="b", deduplication_id="order-1")
    again = send(messages, queue, b"a2", message_group_id="a", deduplication_id="order-1")
    assert (a.duplicate, b.duplicate, again.duplicate) == (False, False, True)
    assert again.message_id == a.message_id != b.message_id
    # In one batch too, the first of a group's repeats claims the id.
    batch = messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[
        pb.SendBatchEntry(body=b"c", message_group_id="c", deduplication_id="order-2"),
        pb.SendBatchEntry(body=b"d", message_group_id="d", deduplication_id="order-2"),
        pb.SendBatchEntry(body=b"c2", message_group_id="c", deduplication_id="order-2"),
    ]))  # fmt: skip
    assert list(batch.duplicates) == [False, False, True]
    received = receive(messages, queue, count=10)
    assert sorted(m.body for m in received) == [b"a", b"b", b"c", b"d"]
    # A message keeps its own deduplication id, without its group.
    assert {m.deduplication_id for m in received} == {"order-1", "order-2"}


def test_deduplication_scope_by_content_is_per_group_too(messages, queues):
    queue = create_queue(
        queues, unique_name("per_group_content") + ".fifo", content_based_deduplication=True,
        deduplication_scope=qpb.DEDUPLICATION_SCOPE_MESSAGE_GROUP,
    ).name  # fmt: skip
    first = send(messages, queue, b"same", message_group_id="a")
    assert not send(messages, queue, b"same", message_group_id="b").duplicate
    assert send(messages, queue, b"same", message_group_id="a").message_id == first.message_id
    # Back to one scope for the queue: the ids seen so far were kept per group, and a
    # new one is the queue's.
    queues.UpdateQueue(qpb.UpdateQueueRequest(
        queue=qpb.Queue(name=queue), update_mask={"paths": ["deduplication_scope"]}
    ))  # fmt: skip
    assert send(messages, queue, b"new", message_group_id="a").duplicate is False
    assert send(messages, queue, b"new", message_group_id="b").duplicate is True


@pytest.mark.parametrize(
    ("name", "attributes", "says"),
    [
        ("std", {"deduplication_scope": qpb.DEDUPLICATION_SCOPE_MESSAGE_GROUP},
         "deduplication_scope message_group is for FIFO queues"),
        ("std", {"fifo_throughput_limit": qpb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID},
         "fifo_throughput_limit is for FIFO queues"),
        ("f.fifo", {"fifo_throughput_limit": qpb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID},
         "per_message_group_id needs deduplication_scope message_group"),
        ("f.fifo", {"deduplication_scope": 7}, "deduplication_scope is 7"),
    ],
)  # fmt: skip
def test_deduplication_scope_and_throughput_limit_rules(queues, name, attributes, says):
    queue = unique_name("bad_scope") + name
    error = error_of(create_queue, queues, queue, **attributes)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    error = error_of(queues.GetQueue, qpb.GetQueueRequest(name=queue))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_duplicates_inside_one_batch(messages, queue):
    entries = [
        pb.SendBatchEntry(body=b, deduplication_id=d)
        for b, d in [(b"a", "1"), (b"b", "2"), (b"c", "1"), (b"d", None)]
    ]
    result = messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
    assert list(result.duplicates) == [False, False, True, False]
    assert result.message_ids[2] == result.message_ids[0]
    assert sorted(m.body for m in receive(messages, queue, count=10)) == [b"a", b"b", b"d"]


def test_dedupe_key_replaces_a_waiting_message(messages, queue):
    first = send(messages, queue, b"v1", dedupe_key="user:7")
    second = send(messages, queue, b"v2", dedupe_key="user:7")
    assert second.message_id == first.message_id
    assert second.duplicate
    (got,) = receive(messages, queue, count=10)
    assert got.body == b"v2"
    # In flight now: the same key makes a new message.
    third = send(messages, queue, b"v3", dedupe_key="user:7")
    assert third.message_id != first.message_id
    assert not third.duplicate
    assert [m.body for m in receive(messages, queue, count=10)] == [b"v3"]


def test_dedupe_key_in_a_batch_keeps_the_last(messages, queue):
    entries = [
        pb.SendBatchEntry(body=b, dedupe_key=k)
        for b, k in [(b"a1", "a"), (b"b1", "b"), (b"a2", "a")]
    ]
    result = messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
    assert result.message_ids[0] == result.message_ids[2]
    assert sorted(m.body for m in receive(messages, queue, count=10)) == [b"a2", b"b1"]


def test_dedupe_key_and_deduplication_id_do_not_mix(messages, queue):
    error = error_of(send, messages, queue, b"x", dedupe_key="k", deduplication_id="d")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_priority_orders_receives(messages, queue):
    for body, priority in [(b"low", 0), (b"mid1", 5), (b"top", 9), (b"mid2", 5), (b"low2", 0)]:
        send(messages, queue, body, priority=priority)
    assert [m.body for m in receive(messages, queue, count=10)] == [
        b"top",
        b"mid1",
        b"mid2",
        b"low",
        b"low2",
    ]


def test_priority_then_visibility_time(messages, queue):
    # 5 s: the first receive comes long before it, on a loaded machine too (0.3 s did not).
    send(messages, queue, b"urgent-but-later", priority=9, delay=seconds(5))
    send(messages, queue, b"normal")
    assert [m.body for m in receive(messages, queue, count=10)] == [b"normal"]
    (got,) = eventually(lambda: receive(messages, queue, count=10), timeout=30)
    assert got.priority == 9


@pytest.mark.parametrize("priority", [-1, 10])
def test_priority_range(messages, queue, priority):
    error = error_of(send, messages, queue, b"x", priority=priority)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_one_batch_comes_out_in_visibility_order_not_id_order(messages, queue):
    # The older message becomes visible later, so a receive claims it second.
    late = send(messages, queue, b"sent first, visible later", delay=seconds(0.4))
    early = send(messages, queue, b"sent second, visible at once")
    assert int(late.message_id) < int(early.message_id)
    time.sleep(0.5)
    assert [m.message_id for m in receive(messages, queue, count=10)] == [
        early.message_id,
        late.message_id,
    ]


def test_a_nacked_older_message_comes_after_the_waiting_ones_in_a_batch(messages, queue):
    for body in [b"older", b"newer1", b"newer2"]:
        send(messages, queue, body)
    (older,) = receive(messages, queue, count=1)
    assert older.body == b"older"
    messages.Nack(pb.NackRequest(queue=queue, receipt=older.receipt, delay=seconds(0)))
    assert [m.body for m in receive(messages, queue, count=10)] == [b"newer1", b"newer2", b"older"]


def test_priority_first_then_visibility_order_within_a_priority(messages, queue):
    send(messages, queue, b"p5 late", priority=5, delay=seconds(0.4))
    send(messages, queue, b"p0")
    send(messages, queue, b"p5 early", priority=5)
    time.sleep(0.5)
    assert [m.body for m in receive(messages, queue, count=10)] == [
        b"p5 early",
        b"p5 late",
        b"p0",
    ]


def test_dedupe_key_after_delivery_and_delete_makes_a_message_that_exists(messages, queue):
    first = send(messages, queue, b"v1", dedupe_key="job:1")
    (got,) = receive(messages, queue)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    again = send(messages, queue, b"v2", dedupe_key="job:1")
    assert again.message_id != first.message_id
    assert not again.duplicate
    (got,) = receive(messages, queue)
    assert (got.message_id, got.body) == (again.message_id, b"v2")


def test_dedupe_key_after_a_purge_makes_a_message_that_exists(messages, queues, queue):
    from postbox.v1 import queue_service_pb2 as qpb

    first = send(messages, queue, b"v1", dedupe_key="job:1")
    queues.PurgeQueue(qpb.PurgeQueueRequest(name=queue))
    again = send(messages, queue, b"v2", dedupe_key="job:1")
    assert again.message_id != first.message_id
    assert not again.duplicate
    assert [m.message_id for m in receive(messages, queue)] == [again.message_id]


async def test_dedupe_key_of_an_expired_message_makes_a_new_message(messages, queues, db):
    queue = create_queue(queues, unique_name("expiring_key"), retention=kept(60)).name
    first = send(messages, queue, b"v1", dedupe_key="job:1")
    # Expired, but not yet removed by the maintenance worker.
    await db.execute(
        "UPDATE postbox.messages SET enqueued_at = enqueued_at - interval '2 min', "
        "visible_at = visible_at - interval '2 min' WHERE id = $1",
        int(first.message_id),
    )
    again = send(messages, queue, b"v2", dedupe_key="job:1")
    assert again.message_id != first.message_id
    assert not again.duplicate
    assert [(m.message_id, m.body) for m in receive(messages, queue)] == [(again.message_id, b"v2")]


def test_dedupe_key_with_content_deduplication_never_returns_a_missing_id(messages, queues):
    queue = create_queue(queues, unique_name("keyed_by_content"), content_based_deduplication=True)
    first = send(messages, queue.name, b"v1", dedupe_key="k")
    replaced = send(messages, queue.name, b"v2", dedupe_key="k")
    assert replaced.message_id == first.message_id
    # The keyed send made no message of v2's own: a plain v2 is no duplicate of it.
    plain = send(messages, queue.name, b"v2")
    assert not plain.duplicate
    received = {m.message_id: m.body for m in receive(messages, queue.name)}
    assert received == {first.message_id: b"v2", plain.message_id: b"v2"}


def test_content_based_deduplication_in_a_batch(messages, queues):
    queue = create_queue(
        queues, unique_name("batch_by_content") + ".fifo", content_based_deduplication=True
    ).name
    earlier = send(messages, queue, b"seen", message_group_id="g")
    entries = [
        pb.SendBatchEntry(body=b, message_group_id="g") for b in [b"new", b"seen", b"new", b"other"]
    ]
    result = messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
    assert list(result.duplicates) == [False, True, True, False]
    assert result.message_ids[1] == earlier.message_id
    assert result.message_ids[2] == result.message_ids[0]
    bodies = []
    while got := receive(messages, queue):
        bodies += [m.body for m in got]
        for m in got:
            messages.Delete(pb.DeleteRequest(queue=queue, receipt=m.receipt))
    assert bodies == [b"seen", b"new", b"other"]
