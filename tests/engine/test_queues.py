"""QueueService through the real server: every RPC's happy path and its errors."""

from __future__ import annotations

from datetime import timedelta

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import queue_service_pb2 as pb
from support import error_of, kept, seconds, unique_name


def test_create_fills_defaults(queues):
    name = unique_name("defaults")
    queue = queues.CreateQueue(pb.CreateQueueRequest(queue=pb.Queue(name=name))).queue
    assert queue.name == name
    assert queue.visibility_timeout.ToTimedelta() == timedelta(seconds=30)
    assert queue.delivery_delay.ToTimedelta() == timedelta(0)
    assert queue.retention.period.ToTimedelta() == timedelta(days=4)
    assert queue.max_message_size == 1024 * 1024
    assert queue.receive_wait_time.ToTimedelta() == timedelta(0)
    assert queue.create_time.seconds > 0


def test_create_with_attributes(queues):
    name = unique_name("attrs")
    request = pb.CreateQueueRequest(
        queue=pb.Queue(
            name=name,
            visibility_timeout=seconds(1.5),
            delivery_delay=seconds(2),
            retention=kept(3600),
            max_message_size=2048,
            receive_wait_time=seconds(20),
        )
    )
    queue = queues.CreateQueue(request).queue
    assert queue.visibility_timeout.ToTimedelta() == timedelta(seconds=1.5)
    assert queue.delivery_delay.ToTimedelta() == timedelta(seconds=2)
    assert queue.retention.period.ToTimedelta() == timedelta(hours=1)
    assert queue.max_message_size == 2048
    assert queue.receive_wait_time.ToTimedelta() == timedelta(seconds=20)


def test_create_twice_is_already_exists(queues, queue):
    error = error_of(queues.CreateQueue, pb.CreateQueueRequest(queue=pb.Queue(name=queue)))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert queue in error.details()


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "required"),
        ("a" * 81, "limit is 80"),
        ("orders.fifo.fifo", "may only contain"),
        ("has space", "may only contain"),
        ("semi;colon", "may only contain"),
        ("quote'); DROP TABLE postbox.queues; --", "may only contain"),
        ("ünïcode", "may only contain"),
    ],
)
def test_create_rejects_bad_names(queues, name, says):
    error = error_of(queues.CreateQueue, pb.CreateQueueRequest(queue=pb.Queue(name=name)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def test_create_without_queue_is_invalid(queues):
    error = error_of(queues.CreateQueue, pb.CreateQueueRequest())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("queue", "says"),
    [
        (pb.Queue(visibility_timeout=seconds(43201)), "visibility_timeout"),
        (pb.Queue(visibility_timeout=seconds(-1)), "visibility_timeout"),
        (pb.Queue(retention=kept(59)), "retention"),
        (pb.Queue(retention=kept(1209601)), "retention"),
        (pb.Queue(retention=kept(60), delivery_delay=seconds(61)), "delivery_delay"),
        (pb.Queue(receive_wait_time=seconds(21)), "receive_wait_time"),
        (pb.Queue(max_message_size=100), "max_message_size"),
        (pb.Queue(max_message_size=2 * 1024 * 1024), "at most 1048576"),
    ],
)
def test_create_rejects_bad_attributes(queues, queue, says):
    queue.name = unique_name("bad_attr")
    error = error_of(queues.CreateQueue, pb.CreateQueueRequest(queue=queue))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    missing = error_of(queues.GetQueue, pb.GetQueueRequest(name=queue.name))
    assert missing.code() == grpc.StatusCode.NOT_FOUND


def test_get_reports_live_stats(queues, messages, queue):
    messages.SendBatch(
        mpb.SendBatchRequest(queue=queue, entries=[mpb.SendBatchEntry(body=b"x")] * 3)
    )
    messages.Send(mpb.SendRequest(queue=queue, body=b"later", delay=seconds(60)))
    received = list(
        messages.Receive(mpb.ReceiveRequest(queue=queue, max_messages=1, wait_time=seconds(0)))
    )
    assert len(received) == 1
    stats = queues.GetQueue(pb.GetQueueRequest(name=queue)).queue.stats
    assert (stats.visible_messages, stats.in_flight_messages, stats.delayed_messages) == (2, 1, 1)
    assert stats.oldest_message_age.ToTimedelta() > timedelta(0)
    full = queues.GetQueue(pb.GetQueueRequest(name=queue, view=pb.QUEUE_VIEW_FULL)).queue
    assert full.stats.visible_messages == stats.visible_messages
    basic = queues.GetQueue(pb.GetQueueRequest(name=queue, view=pb.QUEUE_VIEW_BASIC)).queue
    assert not basic.HasField("stats")  # attributes only: no count of the messages
    assert basic.name == queue
    assert basic.visibility_timeout == full.visibility_timeout
    error = error_of(queues.GetQueue, pb.GetQueueRequest(name=queue, view=7))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "view" in error.details()


def test_get_missing_is_not_found(queues):
    error = error_of(queues.GetQueue, pb.GetQueueRequest(name="no_such_queue"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "no_such_queue" in error.details()


def test_list_pages_through_prefix(queues):
    prefix = unique_name("list") + "_"
    names = sorted(f"{prefix}{i:02}" for i in range(7))
    for name in names:
        queues.CreateQueue(pb.CreateQueueRequest(queue=pb.Queue(name=name)))
    seen, token, pages = [], "", 0
    while True:
        page = queues.ListQueues(
            pb.ListQueuesRequest(page_size=3, page_token=token, name_prefix=prefix)
        )
        seen += [queue.name for queue in page.queues]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert seen == names
    assert pages == 3
    assert not page.queues[0].HasField("stats")


def test_list_full_view_fills_every_queues_stats(queues, messages):
    prefix = unique_name("full") + "_"
    for i, count in enumerate((0, 2, 5)):
        name = f"{prefix}{i}"
        queues.CreateQueue(pb.CreateQueueRequest(queue=pb.Queue(name=name)))
        for _ in range(count):
            messages.Send(mpb.SendRequest(queue=name, body=b"x"))
    listed, token = [], ""
    while True:
        page = queues.ListQueues(
            pb.ListQueuesRequest(
                page_size=2, page_token=token, name_prefix=prefix, view=pb.QUEUE_VIEW_FULL
            )
        )
        listed += page.queues
        token = page.next_page_token
        if not token:
            break
    assert [q.stats.visible_messages for q in listed] == [0, 2, 5]
    for q in listed:
        assert q.HasField("stats")
        alone = queues.GetQueue(pb.GetQueueRequest(name=q.name)).queue.stats
        counts = ("visible_messages", "in_flight_messages", "delayed_messages")
        assert [getattr(q.stats, c) for c in counts] == [getattr(alone, c) for c in counts]
        aged = [s.oldest_message_age.ToTimedelta() > timedelta(0) for s in (q.stats, alone)]
        assert aged == [q.stats.visible_messages > 0] * 2
    basic = queues.ListQueues(pb.ListQueuesRequest(name_prefix=prefix, view=pb.QUEUE_VIEW_BASIC))
    assert not any(q.HasField("stats") for q in basic.queues)


def test_list_rejects_an_unknown_view(queues):
    error = error_of(queues.ListQueues, pb.ListQueuesRequest(view=7))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "QueueView" in error.details()


def test_list_prefix_is_not_a_pattern(queues, queue):
    page = queues.ListQueues(pb.ListQueuesRequest(name_prefix="%"))
    assert list(page.queues) == []
    page = queues.ListQueues(pb.ListQueuesRequest(name_prefix="_"))
    assert all(q.name.startswith("_") for q in page.queues)


@pytest.mark.parametrize(
    "request_",
    [pb.ListQueuesRequest(page_size=1001), pb.ListQueuesRequest(page_size=-1),
     pb.ListQueuesRequest(page_token="!!not-a-token!!")],
)  # fmt: skip
def test_list_rejects_bad_paging(queues, request_):
    assert error_of(queues.ListQueues, request_).code() == grpc.StatusCode.INVALID_ARGUMENT


def test_update_changes_only_masked_fields(queues, queue):
    updated = queues.UpdateQueue(
        pb.UpdateQueueRequest(
            queue=pb.Queue(name=queue, visibility_timeout=seconds(5), retention=kept(120)),
            update_mask=FieldMask(paths=["visibility_timeout"]),
        )
    ).queue
    assert updated.visibility_timeout.ToTimedelta() == timedelta(seconds=5)
    assert updated.retention.period.ToTimedelta() == timedelta(days=4)
    assert updated.update_time.ToDatetime() >= updated.create_time.ToDatetime()


def test_update_unset_masked_field_resets_default(queues, queue):
    queues.UpdateQueue(
        pb.UpdateQueueRequest(
            queue=pb.Queue(name=queue, max_message_size=4096),
            update_mask=FieldMask(paths=["max_message_size"]),
        )
    )
    reset = queues.UpdateQueue(
        pb.UpdateQueueRequest(
            queue=pb.Queue(name=queue), update_mask=FieldMask(paths=["max_message_size"])
        )
    ).queue
    assert reset.max_message_size == 1024 * 1024


@pytest.mark.parametrize(
    ("paths", "code"),
    [
        ([], grpc.StatusCode.INVALID_ARGUMENT),
        (["name"], grpc.StatusCode.INVALID_ARGUMENT),
        (["stats"], grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_update_rejects_bad_masks(queues, queue, paths, code):
    error = error_of(
        queues.UpdateQueue,
        pb.UpdateQueueRequest(queue=pb.Queue(name=queue), update_mask=FieldMask(paths=paths)),
    )
    assert error.code() == code


def test_update_bad_value_changes_nothing(queues, queue):
    error = error_of(
        queues.UpdateQueue,
        pb.UpdateQueueRequest(
            queue=pb.Queue(name=queue, visibility_timeout=seconds(1e6)),
            update_mask=FieldMask(paths=["visibility_timeout"]),
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    current = queues.GetQueue(pb.GetQueueRequest(name=queue)).queue
    assert current.visibility_timeout.ToTimedelta() == timedelta(seconds=30)


def test_update_missing_is_not_found(queues):
    error = error_of(
        queues.UpdateQueue,
        pb.UpdateQueueRequest(
            queue=pb.Queue(name="no_such_queue"), update_mask=FieldMask(paths=["retention"])
        ),
    )
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_delete_removes_queue_and_messages(queues, messages, queue):
    messages.Send(mpb.SendRequest(queue=queue, body=b"x"))
    queues.DeleteQueue(pb.DeleteQueueRequest(name=queue))
    assert (
        error_of(queues.GetQueue, pb.GetQueueRequest(name=queue)).code()
        == grpc.StatusCode.NOT_FOUND
    )
    send_error = error_of(messages.Send, mpb.SendRequest(queue=queue, body=b"x"))
    assert send_error.code() == grpc.StatusCode.NOT_FOUND
    # A new queue of the same name starts empty.
    queues.CreateQueue(pb.CreateQueueRequest(queue=pb.Queue(name=queue)))
    assert queues.GetQueue(pb.GetQueueRequest(name=queue)).queue.stats.visible_messages == 0


def test_delete_missing_is_not_found(queues):
    error = error_of(queues.DeleteQueue, pb.DeleteQueueRequest(name="no_such_queue"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def test_purge_deletes_every_message(queues, messages, queue):
    messages.SendBatch(
        mpb.SendBatchRequest(queue=queue, entries=[mpb.SendBatchEntry(body=b"x")] * 5)
    )
    list(messages.Receive(mpb.ReceiveRequest(queue=queue, max_messages=2)))
    assert queues.PurgeQueue(pb.PurgeQueueRequest(name=queue)).purged_messages == 5
    stats = queues.GetQueue(pb.GetQueueRequest(name=queue)).queue.stats
    assert stats.visible_messages == stats.in_flight_messages == 0


def test_purge_missing_is_not_found(queues):
    error = error_of(queues.PurgeQueue, pb.PurgeQueueRequest(name="no_such_queue"))
    assert error.code() == grpc.StatusCode.NOT_FOUND


MALFORMED_NAMES = ["a;drop", '"x"', "q" * 81, "", "ünïcödé", "a b", "x.fifo.fifo"]
RECEIPT = "1:00000000-0000-0000-0000-000000000000"


def name_calls(queues, messages, name: str, valid: str):
    """Every RPC that names a queue, called with `name` (and `valid` where a second queue
    is named)."""
    return {
        "GetQueue": lambda: queues.GetQueue(pb.GetQueueRequest(name=name)),
        "UpdateQueue": lambda: queues.UpdateQueue(
            pb.UpdateQueueRequest(
                queue=pb.Queue(name=name, visibility_timeout=seconds(5)),
                update_mask=FieldMask(paths=["visibility_timeout"]),
            )
        ),
        "DeleteQueue": lambda: queues.DeleteQueue(pb.DeleteQueueRequest(name=name)),
        "PurgeQueue": lambda: queues.PurgeQueue(pb.PurgeQueueRequest(name=name)),
        "PauseQueue": lambda: queues.PauseQueue(pb.PauseQueueRequest(name=name)),
        "ResumeQueue": lambda: queues.ResumeQueue(pb.ResumeQueueRequest(name=name)),
        "ListDeadLetterSourceQueues": lambda: queues.ListDeadLetterSourceQueues(
            pb.ListDeadLetterSourceQueuesRequest(dead_letter_queue=name)
        ),
        "RedriveMessages": lambda: queues.RedriveMessages(
            pb.RedriveMessagesRequest(dead_letter_queue=name)
        ),
        "RedriveMessages destination": lambda: queues.RedriveMessages(
            pb.RedriveMessagesRequest(dead_letter_queue=valid, destination=name)
        ),
        "ListRedriveTasks": lambda: queues.ListRedriveTasks(
            pb.ListRedriveTasksRequest(dead_letter_queue=name)
        ),
        "Send": lambda: messages.Send(mpb.SendRequest(queue=name, body=b"x")),
        "SendBatch": lambda: messages.SendBatch(
            mpb.SendBatchRequest(queue=name, entries=[mpb.SendBatchEntry(body=b"x")])
        ),
        "Receive": lambda: list(messages.Receive(mpb.ReceiveRequest(queue=name, max_messages=1))),
        "Delete": lambda: messages.Delete(mpb.DeleteRequest(queue=name, receipt=RECEIPT)),
        "DeleteBatch": lambda: messages.DeleteBatch(
            mpb.DeleteBatchRequest(queue=name, receipts=[RECEIPT])
        ),
        "ChangeVisibility": lambda: messages.ChangeVisibility(
            mpb.ChangeVisibilityRequest(queue=name, receipt=RECEIPT, visibility_timeout=seconds(1))
        ),
        "Nack": lambda: messages.Nack(mpb.NackRequest(queue=name, receipt=RECEIPT)),
        "PeekMessages": lambda: messages.PeekMessages(mpb.PeekMessagesRequest(queue=name)),
        "GetMessage": lambda: messages.GetMessage(
            mpb.GetMessageRequest(queue=name, message_id="1")
        ),
        "ListArchivedMessages": lambda: messages.ListArchivedMessages(
            mpb.ListArchivedMessagesRequest(queue=name)
        ),
    }


@pytest.mark.parametrize("name", MALFORMED_NAMES)
def test_a_malformed_queue_name_is_invalid_for_every_rpc(queues, messages, queue, name):
    wrong = {}
    calls = name_calls(queues, messages, name, queue)
    if name == "":
        del calls["RedriveMessages destination"]  # empty: each message's source queue
    for rpc, call in calls.items():
        error = error_of(call)
        if error.code() != grpc.StatusCode.INVALID_ARGUMENT or "does not exist" in error.details():
            wrong[rpc] = (error.code(), error.details())
    assert wrong == {}


def test_a_well_formed_missing_queue_is_still_not_found(queues, messages, queue):
    for rpc, call in name_calls(queues, messages, "no_such_queue_x", queue).items():
        assert error_of(call).code() == grpc.StatusCode.NOT_FOUND, rpc


def test_a_purge_is_remembered_on_the_queue(queues, queue):
    assert not queues.GetQueue(pb.GetQueueRequest(name=queue)).queue.HasField("purge_time")
    queues.PurgeQueue(pb.PurgeQueueRequest(name=queue))
    purged = queues.GetQueue(pb.GetQueueRequest(name=queue)).queue
    assert purged.HasField("purge_time")
    assert purged.purge_time.ToDatetime() >= purged.create_time.ToDatetime()
