"""Time and flow control through the real server: delivery times, retention, archive,
pause, max_depth, rate limits, and browsing without claiming."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import create_queue, error_of, kept, receive, seconds, stats, unique_name


def at(delta: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.now(timezone.utc) + timedelta(seconds=delta))
    return stamp


def wait_until(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


async def backdate(db: asyncpg.Connection, queue: str, age: timedelta) -> None:
    """Makes a queue's messages look `age` older, as if sent long ago."""
    await db.execute(
        "UPDATE postbox.messages "
        "SET enqueued_at = enqueued_at - $2::interval, visible_at = visible_at - $2::interval "
        "WHERE queue_id = (SELECT id FROM postbox.queues WHERE name = $1)",
        queue,
        age,
    )


def test_deliver_at_sets_the_delivery_time(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"later", deliver_at=at(0.4)))
    messages.Send(pb.SendRequest(queue=queue, body=b"past", deliver_at=at(-3600)))
    assert [m.body for m in receive(messages, queue)] == [b"past"]
    time.sleep(0.5)
    assert [m.body for m in receive(messages, queue)] == [b"later"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"deliver_at": at(5 * 86400)}, "retention"),
        ({"delay": seconds(5 * 86400)}, "retention"),
        ({"delay": seconds(1), "deliver_at": at(1)}, "not both"),
    ],
)
def test_bad_delivery_times(messages, queue, options, says):
    error = error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x", **options))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


@pytest.fixture
def minute_queue(queues) -> str:
    """A queue whose messages expire after 60 s."""
    return create_queue(queues, unique_name("minute"), retention=kept(60)).name


@pytest.mark.parametrize(
    ("field", "after"),
    [
        ("delay", 60),  # exactly the retention: expired when it turns visible
        ("delay", 61),
        ("deliver_at", 60.5),
        ("deliver_at", 3600),
    ],
)
def test_a_delay_must_be_shorter_than_the_retention(messages, queues, minute_queue, field, after):
    options = {field: seconds(after) if field == "delay" else at(after)}
    request = pb.SendRequest(queue=minute_queue, body=b"x", **options)
    error = error_of(messages.Send, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "retention" in error.details()
    assert "expire" in error.details()
    batch = pb.SendBatchRequest(
        queue=minute_queue,
        entries=[pb.SendBatchEntry(body=b"ok"), pb.SendBatchEntry(body=b"x", **options)],
    )
    error = error_of(messages.SendBatch, batch)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "entry 1" in error.details()
    assert stats(queues, minute_queue).delayed_messages == 0
    assert stats(queues, minute_queue).visible_messages == 0


def test_a_delay_just_under_the_retention_is_taken(messages, queues, minute_queue):
    messages.Send(pb.SendRequest(queue=minute_queue, body=b"x", delay=seconds(59)))
    messages.Send(pb.SendRequest(queue=minute_queue, body=b"y", deliver_at=at(58)))
    assert stats(queues, minute_queue).delayed_messages == 2


@pytest.mark.parametrize("delay", [60, 61])
def test_a_queue_delivery_delay_must_be_shorter_than_its_retention(queues, delay):
    name = unique_name("late_queue")
    error = error_of(
        queues.CreateQueue,
        qpb.CreateQueueRequest(
            queue=qpb.Queue(name=name, retention=kept(60), delivery_delay=seconds(delay))
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delivery_delay must be shorter than retention" in error.details()
    assert error_of(queues.GetQueue, qpb.GetQueueRequest(name=name)).code() == (
        grpc.StatusCode.NOT_FOUND
    )


@pytest.mark.parametrize(
    "change",
    [
        {"delivery_delay": seconds(300)},  # as long as the retention
        {"retention": kept(120)},  # down to the delivery_delay
        {"retention": kept(100), "delivery_delay": seconds(100)},
    ],
)
def test_update_queue_keeps_the_delivery_delay_below_the_retention(queues, change):
    name = create_queue(
        queues, unique_name("updated_delay"), retention=kept(300), delivery_delay=seconds(120)
    ).name
    error = error_of(
        queues.UpdateQueue,
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=name, **change), update_mask=FieldMask(paths=list(change))
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "delivery_delay must be shorter than retention" in error.details()
    after = queues.GetQueue(qpb.GetQueueRequest(name=name)).queue
    assert after.retention.period.ToTimedelta() == timedelta(seconds=300)
    assert after.delivery_delay.ToTimedelta() == timedelta(seconds=120)


def test_delays_beyond_15_minutes_are_fine(messages, queues, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x", delay=seconds(3 * 3600)))
    assert stats(queues, queue).delayed_messages == 1


async def test_expired_messages_are_never_delivered_and_get_removed(messages, queues, db):
    queue = create_queue(
        queues, unique_name("expiring"), retention=kept(60), archive_on_delete=True
    ).name
    messages.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"old")] * 3)
    )
    await backdate(db, queue, timedelta(minutes=2))
    messages.Send(pb.SendRequest(queue=queue, body=b"new"))
    assert [m.body for m in receive(messages, queue, count=10)] == [b"new"]
    # The server's maintenance worker (every 0.5 s in the test server) archives them.
    await asyncio.to_thread(wait_until, lambda: len(_archived(messages, queue)) == 3)
    assert {a.reason for a in _archived(messages, queue)} == {msg.ARCHIVE_REASON_EXPIRED}
    assert stats(queues, queue).in_flight_messages == 1
    assert stats(queues, queue).visible_messages == 0


async def test_retention_forever_keeps_old_messages(messages, queues, db):
    queue = create_queue(queues, unique_name("forever"), retention=kept(None))
    assert not queue.retention.HasField("period")  # forever
    messages.Send(pb.SendRequest(queue=queue.name, body=b"ancient"))
    await backdate(db, queue.name, timedelta(days=30))
    await asyncio.sleep(0.7)  # a maintenance sweep has run
    assert [m.body for m in receive(messages, queue.name)] == [b"ancient"]


def _archived(messages, queue: str, page_size: int = 100) -> list[msg.ArchivedMessage]:
    request = pb.ListArchivedMessagesRequest(queue=queue, page_size=page_size)
    return list(messages.ListArchivedMessages(request).messages)


def test_archive_keeps_deleted_messages(messages, queues):
    queue = create_queue(queues, unique_name("archived"), archive_on_delete=True).name
    messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue, entries=[pb.SendBatchEntry(body=str(i).encode()) for i in range(3)]
        )
    )
    got = receive(messages, queue, count=10)
    messages.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in got]))
    first = messages.ListArchivedMessages(pb.ListArchivedMessagesRequest(queue=queue, page_size=2))
    rest = messages.ListArchivedMessages(
        pb.ListArchivedMessagesRequest(queue=queue, page_token=first.next_page_token)
    )
    archived = list(first.messages) + list(rest.messages)
    assert [a.message.body for a in archived] == [b"0", b"1", b"2"]
    assert {a.reason for a in archived} == {msg.ARCHIVE_REASON_DELETED}
    assert all(a.message.receive_count == 1 and a.archive_time.seconds > 0 for a in archived)
    assert not rest.next_page_token


async def test_archive_retention_forgets(messages, queues, db):
    queue = create_queue(
        queues, unique_name("forgetful"), archive_on_delete=True, archive_retention=kept(60)
    ).name
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    assert len(_archived(messages, queue)) == 1
    await db.execute(
        "UPDATE postbox.archive SET archived_at = archived_at - interval '2 minutes' "
        "WHERE queue_id = (SELECT id FROM postbox.queues WHERE name = $1)",
        queue,
    )
    await asyncio.to_thread(wait_until, lambda: _archived(messages, queue) == [])


def test_pausing_sends(messages, queues, queue):
    paused = queues.PauseQueue(qpb.PauseQueueRequest(name=queue, sends=True)).queue
    assert (paused.send_paused, paused.receive_paused) == (True, False)
    error = error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "paused" in error.details()
    assert receive(messages, queue) == []  # receiving still works
    queues.ResumeQueue(qpb.ResumeQueueRequest(name=queue, sends=True))
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))


def test_pausing_both_by_default(queues, queue):
    paused = queues.PauseQueue(qpb.PauseQueueRequest(name=queue)).queue
    assert (paused.send_paused, paused.receive_paused) == (True, True)
    resumed = queues.ResumeQueue(qpb.ResumeQueueRequest(name=queue)).queue
    assert (resumed.send_paused, resumed.receive_paused) == (False, False)


async def test_pausing_receives_keeps_waiting_streams_waiting(aio_channel, messages, queues, queue):
    stub = message_service_pb2_grpc.MessageServiceStub(aio_channel)
    waiting = stub.Receive(pb.ReceiveRequest(queue=queue, wait_time=seconds(10)))
    first = asyncio.ensure_future(waiting.read())
    await asyncio.sleep(0.3)
    queues.PauseQueue(qpb.PauseQueueRequest(name=queue, receives=True))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in stub.Receive(pb.ReceiveRequest(queue=queue, wait_time=seconds(1))):
            pass
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    continuous = pb.ReceiveRequest(queue=queue, mode=pb.RECEIVE_MODE_CONTINUOUS)
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # a new stream fails, long-lived or not
        async for _ in stub.Receive(continuous, timeout=5):
            pass
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "paused" in caught.value.details()
    messages.Send(pb.SendRequest(queue=queue, body=b"held"))
    await asyncio.sleep(0.5)
    assert not first.done()  # paused: the stream waits, without the message
    queues.ResumeQueue(qpb.ResumeQueueRequest(name=queue, receives=True))
    response = await asyncio.wait_for(first, 3)
    assert [m.body for m in response.messages] == [b"held"]


def test_max_depth_refuses_what_does_not_fit(messages, queues):
    queue = create_queue(queues, unique_name("bounded"), max_depth=4).name
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 3))
    error = error_of(
        messages.SendBatch,
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"y")] * 2),
    )
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_depth" in error.details()
    assert stats(queues, queue).visible_messages == 3  # all or nothing
    messages.Send(pb.SendRequest(queue=queue, body=b"fits"))
    assert error_of(messages.Send, pb.SendRequest(queue=queue, body=b"full")).code() == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
    (got,) = receive(messages, queue, count=1)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt))
    messages.Send(pb.SendRequest(queue=queue, body=b"room again"))


def test_receive_rate_limit_returns_fewer_messages(messages, queues):
    queue = create_queue(queues, unique_name("throttled"), receive_rate_limit=5).name
    messages.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 50)
    )
    started = time.monotonic()
    got = 0
    while time.monotonic() - started < 1.0:
        got += len(receive(messages, queue, count=10))
    elapsed = time.monotonic() - started
    # A full bucket (5) plus 5 per second.
    assert 5 <= got <= 5 + 5 * elapsed + 1, (got, elapsed)


async def test_rate_limited_stream_waits_for_tokens_without_spinning(aio_channel, messages, queues):
    queue = create_queue(queues, unique_name("paced"), receive_rate_limit=4).name
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 8))
    stub = message_service_pb2_grpc.MessageServiceStub(aio_channel)
    started = time.monotonic()
    got = 0
    async for response in stub.Receive(
        pb.ReceiveRequest(
            queue=queue, mode=pb.RECEIVE_MODE_CONTINUOUS, max_messages=10, max_total_messages=8
        )
    ):
        got += len(response.messages)
    assert got == 8
    assert 0.7 <= time.monotonic() - started < 3  # 4 at once, then 4 more over a second


def _peek(messages, queue: str, **fields) -> pb.PeekMessagesResponse:
    return messages.PeekMessages(pb.PeekMessagesRequest(queue=queue, **fields))


def test_peek_browses_by_state_without_claiming(messages, queues, queue):
    messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue,
            entries=[
                pb.SendBatchEntry(body=b"taken"),
                pb.SendBatchEntry(body=b"visible"),
                pb.SendBatchEntry(body=b"later", delay=seconds(60)),
            ],
        )
    )
    (taken,) = receive(messages, queue, count=1)
    assert taken.body == b"taken"
    everything = _peek(messages, queue).messages
    assert [m.body for m in everything] == [b"taken", b"visible", b"later"]
    assert [m.state for m in everything] == [
        msg.MESSAGE_STATE_IN_FLIGHT,
        msg.MESSAGE_STATE_VISIBLE,
        msg.MESSAGE_STATE_DELAYED,
    ]
    assert all(not m.receipt for m in everything)
    assert everything[0].visible_time.seconds > 0
    for state, body in [
        (msg.MESSAGE_STATE_VISIBLE, b"visible"),
        (msg.MESSAGE_STATE_IN_FLIGHT, b"taken"),
        (msg.MESSAGE_STATE_DELAYED, b"later"),
    ]:
        assert [m.body for m in _peek(messages, queue, state=state).messages] == [body]
    assert _peek(messages, queue, state=msg.MESSAGE_STATE_DEAD).messages == []
    (still,) = receive(messages, queue, count=10)
    assert still.receive_count == 1  # peeking claimed nothing


def test_peek_pages(messages, queue):
    messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue, entries=[pb.SendBatchEntry(body=str(i).encode()) for i in range(5)]
        )
    )
    bodies, token = [], ""
    while True:
        page = _peek(messages, queue, page_size=2, page_token=token)
        bodies += [m.body for m in page.messages]
        token = page.next_page_token
        if not token:
            break
    assert bodies == [b"0", b"1", b"2", b"3", b"4"]
    error = error_of(messages.PeekMessages, pb.PeekMessagesRequest(queue=queue, page_token="x!"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_peek_takes_the_largest_page(messages, queue):
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 3))
    page = _peek(messages, queue, page_size=1000)
    assert len(page.messages) == 3
    assert not page.next_page_token
    archived = messages.ListArchivedMessages(
        pb.ListArchivedMessagesRequest(queue=queue, page_size=1000)
    )
    assert list(archived.messages) == []


def test_get_message(messages, queue):
    sent = messages.Send(pb.SendRequest(queue=queue, body=b"find me", priority=2))
    found = messages.GetMessage(
        pb.GetMessageRequest(queue=queue, message_id=sent.message_id)
    ).message
    assert (found.body, found.priority, found.state) == (b"find me", 2, msg.MESSAGE_STATE_VISIBLE)
    missing = error_of(
        messages.GetMessage, pb.GetMessageRequest(queue=queue, message_id="999999999")
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    bad = error_of(messages.GetMessage, pb.GetMessageRequest(queue=queue, message_id="12; DROP"))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_new_attributes_round_trip_through_update(queues, queue):
    dlq = create_queue(queues, unique_name("rt_dlq")).name
    update = qpb.Queue(
        name=queue,
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=7),
        retry_policy=qpb.RetryPolicy(maximum_backoff=seconds(30)),
        deduplication_window=seconds(60),
        max_depth=100,
        receive_rate_limit=2.5,
        tags={"team": "payments", "env": "test"},
        retention=kept(None),
    )
    paths = [
        "dead_letter_policy",
        "retry_policy",
        "deduplication_window",
        "max_depth",
        "receive_rate_limit",
        "tags",
        "retention",
    ]
    result = queues.UpdateQueue(
        qpb.UpdateQueueRequest(queue=update, update_mask=FieldMask(paths=paths))
    )
    q = result.queue
    assert q.dead_letter_policy.dead_letter_queue == dlq
    assert q.dead_letter_policy.max_receive_count == 7
    assert q.retry_policy.minimum_backoff.ToTimedelta() == timedelta(seconds=1)  # default kept
    assert q.retry_policy.maximum_backoff.ToTimedelta() == timedelta(seconds=30)
    assert q.deduplication_window.ToTimedelta() == timedelta(minutes=1)
    assert (q.max_depth, q.receive_rate_limit) == (100, 2.5)
    assert dict(q.tags) == {"team": "payments", "env": "test"}
    assert q.HasField("retention")
    assert not q.retention.HasField("period")  # forever
    cleared = queues.UpdateQueue(
        qpb.UpdateQueueRequest(queue=qpb.Queue(name=queue), update_mask=FieldMask(paths=paths))
    ).queue
    assert not cleared.HasField("dead_letter_policy")
    assert cleared.retention.period.ToTimedelta() == timedelta(days=4)
    assert not cleared.HasField("max_depth")
    assert not cleared.HasField("receive_rate_limit")
    assert dict(cleared.tags) == {}
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=dlq))


@pytest.mark.parametrize(
    ("queue_fields", "says"),
    [
        ({"deduplication_window": seconds(0)}, "deduplication_window"),
        ({"archive_retention": kept(30)}, "archive_retention"),
        ({"max_depth": -1}, "max_depth"),
        ({"receive_rate_limit": -1}, "receive_rate_limit"),
        (
            {
                "retry_policy": qpb.RetryPolicy(
                    minimum_backoff=seconds(9), maximum_backoff=seconds(1)
                )
            },
            "minimum_backoff",
        ),
        ({"tags": {f"k{i}": "v" for i in range(51)}}, "tags"),
        (
            {
                "redrive_allow_policy": qpb.RedriveAllowPolicy(
                    permission=qpb.RedriveAllowPolicy.PERMISSION_BY_QUEUE
                )
            },
            "source_queues",
        ),
    ],
)
def test_bad_new_attributes(queues, queue_fields, says):
    error = error_of(
        queues.CreateQueue,
        qpb.CreateQueueRequest(queue=qpb.Queue(name=unique_name("bad_new"), **queue_fields)),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
