"""Retries and dead letters through the real server: nack, backoff, DLQ, redrive."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import create_queue, error_of, receive, seconds, stats, unique_name


def nack(messages, queue: str, receipt: str, delay: float | None = None, error: str = "") -> None:
    request = pb.NackRequest(queue=queue, receipt=receipt, error=error)
    if delay is not None:
        request.delay.CopyFrom(seconds(delay))
    messages.Nack(request)


def wait_until(predicate, timeout: float = 10.0, step: float = 0.05):
    """Polls until predicate() is truthy; returns its value, or fails after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(step)


@pytest.fixture
def dlq_pair(queues):
    """A source queue whose messages dead-letter after 3 receives, and its DLQ."""
    dlq = create_queue(queues, unique_name("dlq")).name
    source = create_queue(
        queues,
        unique_name("src"),
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=3),
    ).name
    yield source, dlq
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=source))
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=dlq))


def test_nack_with_delay_hides_then_redelivers(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    nack(messages, queue, got.receipt, delay=0.4, error="database timeout")
    assert receive(messages, queue) == []
    time.sleep(0.5)
    (again,) = receive(messages, queue)
    assert again.receive_count == 2
    assert again.last_error == "database timeout"


def test_nack_without_delay_follows_the_retry_policy(messages, queues):
    policy = qpb.RetryPolicy(minimum_backoff=seconds(0.4), maximum_backoff=seconds(0.4))
    queue = create_queue(queues, unique_name("backoff"), retry_policy=policy).name
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    nacked_at = time.monotonic()
    nack(messages, queue, got.receipt)
    assert receive(messages, queue) == []  # at least 0.2 s (half the backoff, the jitter floor)
    (again,) = receive(messages, queue, wait=2)
    waited = time.monotonic() - nacked_at
    assert 0.18 <= waited <= 0.8, waited
    assert again.receive_count == 2


async def test_backoff_grows_with_deliveries_up_to_the_maximum(db, queues):
    policy = qpb.RetryPolicy(minimum_backoff=seconds(10), maximum_backoff=seconds(60))
    queue = create_queue(queues, unique_name("growth"), retry_policy=policy).name
    # After delivery n: 10 * 2^(n-1) seconds, at most 60, times 0.5 to 1.
    for deliveries, (low, high) in [(1, (5, 10)), (2, (10, 20)), (3, (20, 40)), (4, (30, 60))]:
        backoff = await db.fetchval(
            "SELECT extract(epoch FROM postbox._backoff(q, $2)) FROM postbox.queues q "
            "WHERE name = $1",
            queue,
            deliveries,
        )
        assert low <= backoff <= high, (deliveries, backoff)


def test_nack_spends_the_receipt(messages, queue):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    nack(messages, queue, got.receipt, delay=60)
    for call, request in [
        (messages.Nack, pb.NackRequest(queue=queue, receipt=got.receipt)),
        (messages.Delete, pb.DeleteRequest(queue=queue, receipt=got.receipt)),
    ]:
        assert error_of(call, request).code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("delay", "error", "says"),
    [(-1, "", "delay"), (43201, "", "delay"), (None, "e" * 4097, "4096")],
)
def test_nack_rejects_bad_input(messages, queue, delay, error, says):
    messages.Send(pb.SendRequest(queue=queue, body=b"x"))
    (got,) = receive(messages, queue)
    request = pb.NackRequest(queue=queue, receipt=got.receipt, error=error)
    if delay is not None:
        request.delay.CopyFrom(seconds(delay))
    failure = error_of(messages.Nack, request)
    assert failure.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in failure.details()


def test_message_moves_to_dlq_after_exactly_max_receive_count(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    attributes = {"k": msg.AttributeValue(data_type="String", string_value="v")}
    sent = messages.Send(pb.SendRequest(queue=source, body=b"poison", attributes=attributes))
    for attempt in range(1, 4):
        (got,) = receive(messages, source)
        assert got.receive_count == attempt
        nack(messages, source, got.receipt, delay=0, error=f"failure {attempt}")
    assert receive(messages, source) == []  # the 4th receive moved it instead
    assert stats(queues, source).visible_messages == 0
    (dead,) = receive(messages, dlq)
    assert dead.message_id == sent.message_id
    assert dead.body == b"poison"
    assert dict(dead.attributes) == attributes
    assert dead.dead_letter_source_queue == source
    assert dead.last_error == "failure 3"
    assert dead.receive_count == 4  # three on the source, this one on the DLQ


def test_visibility_timeouts_count_toward_dead_lettering(messages, dlq_pair):
    source, dlq = dlq_pair
    messages.Send(pb.SendRequest(queue=source, body=b"slow"))
    for _ in range(3):
        assert len(receive(messages, source, visibility=0)) == 1
    assert receive(messages, source) == []
    assert len(receive(messages, dlq)) == 1


@pytest.mark.parametrize("problem", ["missing", "self", "fifo_mismatch", "deny_all", "not_listed"])
def test_bad_dead_letter_policies_are_invalid(queues, problem):
    name = unique_name("policy")
    dlq = unique_name("policy_dlq")
    if problem == "fifo_mismatch":
        create_queue(queues, dlq)
        name += ".fifo"
    elif problem == "deny_all":
        create_queue(
            queues,
            dlq,
            redrive_allow_policy=qpb.RedriveAllowPolicy(
                permission=qpb.RedriveAllowPolicy.PERMISSION_DENY_ALL
            ),
        )
    elif problem == "not_listed":
        create_queue(
            queues,
            dlq,
            redrive_allow_policy=qpb.RedriveAllowPolicy(
                permission=qpb.RedriveAllowPolicy.PERMISSION_BY_QUEUE, source_queues=["other"]
            ),
        )
    elif problem == "self":
        dlq = name
    policy = qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=2)
    error = error_of(
        queues.CreateQueue,
        qpb.CreateQueueRequest(queue=qpb.Queue(name=name, dead_letter_policy=policy)),
    )
    # A dead-letter queue that does not exist is NOT_FOUND, as any absent resource a field names.
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert error.code() == (grpc.StatusCode.NOT_FOUND if problem == "missing" else invalid)
    assert "dead-letter" in error.details()


def test_redrive_allow_policy_by_queue_admits_listed_sources(queues):
    source = unique_name("listed")
    dlq = create_queue(
        queues,
        unique_name("guarded"),
        redrive_allow_policy=qpb.RedriveAllowPolicy(
            permission=qpb.RedriveAllowPolicy.PERMISSION_BY_QUEUE, source_queues=[source]
        ),
    ).name
    created = create_queue(
        queues,
        source,
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=5),
    )
    assert created.dead_letter_policy.dead_letter_queue == dlq
    assert created.dead_letter_policy.max_receive_count == 5


@pytest.mark.parametrize("count", [0, 1001])
def test_max_receive_count_limits(queues, count):
    dlq = create_queue(queues, unique_name("limits_dlq")).name
    error = error_of(
        queues.CreateQueue,
        qpb.CreateQueueRequest(
            queue=qpb.Queue(
                name=unique_name("limits"),
                dead_letter_policy=qpb.DeadLetterPolicy(
                    dead_letter_queue=dlq, max_receive_count=count
                ),
            )
        ),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_dead_letter_queue_in_use_cannot_be_deleted(queues, dlq_pair):
    source, dlq = dlq_pair
    error = error_of(queues.DeleteQueue, qpb.DeleteQueueRequest(name=dlq))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert source in error.details()


def test_list_dead_letter_source_queues(queues, dlq_pair):
    source, dlq = dlq_pair
    second = create_queue(
        queues,
        source + "_2",
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=1),
    ).name
    first_page = queues.ListDeadLetterSourceQueues(
        qpb.ListDeadLetterSourceQueuesRequest(dead_letter_queue=dlq, page_size=1)
    )
    assert list(first_page.queue_names) == [source]
    second_page = queues.ListDeadLetterSourceQueues(
        qpb.ListDeadLetterSourceQueuesRequest(
            dead_letter_queue=dlq, page_token=first_page.next_page_token
        )
    )
    assert list(second_page.queue_names) == [second]
    assert not second_page.next_page_token
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=second))


def _fill_dlq(messages, source: str, dlq: str, count: int) -> None:
    messages.SendBatch(
        pb.SendBatchRequest(
            queue=source, entries=[pb.SendBatchEntry(body=str(i).encode()) for i in range(count)]
        )
    )
    for _ in range(3):
        got = receive(messages, source, count=count, visibility=0)
        assert len(got) == count
    assert receive(messages, source, count=count) == []
    assert wait_until(lambda: len(_peek(messages, dlq)) == count)


def _peek(messages, queue: str, state=msg.MESSAGE_STATE_UNSPECIFIED):
    return list(messages.PeekMessages(pb.PeekMessagesRequest(queue=queue, state=state)).messages)


def _task(queues, dlq: str) -> qpb.RedriveTask:
    (task,) = queues.ListRedriveTasks(qpb.ListRedriveTasksRequest(dead_letter_queue=dlq)).tasks
    return task


def test_redrive_moves_dead_letters_back_with_fresh_counts(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 5)
    task = queues.RedriveMessages(qpb.RedriveMessagesRequest(dead_letter_queue=dlq)).task
    assert task.state == qpb.RedriveTask.STATE_RUNNING
    assert task.messages_to_move == 5
    done = wait_until(
        lambda: (t := _task(queues, dlq)).state == qpb.RedriveTask.STATE_COMPLETED and t
    )
    assert done.moved_messages == 5
    back = receive(messages, source, count=10)
    assert sorted(m.body for m in back) == [b"0", b"1", b"2", b"3", b"4"]
    assert {m.receive_count for m in back} == {1}
    assert {m.dead_letter_source_queue for m in back} == {""}
    assert _peek(messages, dlq) == []


def test_redrive_to_a_named_queue_with_a_limit(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 4)
    elsewhere = create_queue(queues, unique_name("elsewhere")).name
    queues.RedriveMessages(
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, destination=elsewhere, max_messages=3)
    )
    done = wait_until(
        lambda: (t := _task(queues, dlq)).state == qpb.RedriveTask.STATE_COMPLETED and t
    )
    assert done.moved_messages == 3
    assert done.destination == elsewhere
    assert len(receive(messages, elsewhere, count=10)) == 3
    assert len(_peek(messages, dlq)) == 1
    assert receive(messages, source) == []


def test_redrive_of_chosen_dead_letters_moves_only_those(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 4)
    chosen = [m.message_id for m in _peek(messages, dlq) if m.body in (b"1", b"3")]
    task = queues.RedriveMessages(
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, message_ids=chosen)
    ).task
    assert (task.messages_to_move, list(task.message_ids)) == (2, chosen)
    done = wait_until(
        lambda: (t := _task(queues, dlq)).state == qpb.RedriveTask.STATE_COMPLETED and t
    )
    assert done.moved_messages == 2
    assert sorted(m.body for m in receive(messages, source, count=10)) == [b"1", b"3"]
    assert sorted(m.body for m in _peek(messages, dlq)) == [b"0", b"2"]


def test_redrive_by_id_names_what_is_not_a_dead_letter_there(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 1)
    stranger = messages.Send(pb.SendRequest(queue=source, body=b"alive")).message_id
    missing = error_of(
        queues.RedriveMessages,
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, message_ids=[stranger]),
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert f"message {stranger} is not in queue" in missing.details()
    too_many = error_of(
        queues.RedriveMessages,
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, message_ids=["1"] * 1001),
    )
    assert too_many.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "1 to 1000" in too_many.details()
    assert queues.ListRedriveTasks(qpb.ListRedriveTasksRequest(dead_letter_queue=dlq)).tasks == []


def test_redrive_tasks_page_newest_first(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 3)
    started = []
    for message in _peek(messages, dlq):
        task = queues.RedriveMessages(
            qpb.RedriveMessagesRequest(dead_letter_queue=dlq, message_ids=[message.message_id])
        ).task
        started.append(task.task_id)
        wait_until(lambda: _tasks(queues, dlq)[0].state == qpb.RedriveTask.STATE_COMPLETED)
    pages, token = [], ""
    while True:
        page = queues.ListRedriveTasks(
            qpb.ListRedriveTasksRequest(dead_letter_queue=dlq, page_size=2, page_token=token)
        )
        pages.append([t.task_id for t in page.tasks])
        if not (token := page.next_page_token):
            break
    assert pages == [started[::-1][:2], started[::-1][2:]]


def _tasks(queues, dlq: str) -> list[qpb.RedriveTask]:
    return list(queues.ListRedriveTasks(qpb.ListRedriveTasksRequest(dead_letter_queue=dlq)).tasks)


def test_redrive_rate_limit_paces_the_move(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 6)
    started = time.monotonic()
    queues.RedriveMessages(
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, max_messages_per_second=4)
    )
    wait_until(lambda: _task(queues, dlq).state == qpb.RedriveTask.STATE_COMPLETED)
    # A burst of at most one second's worth (4), then 4 per second.
    assert time.monotonic() - started >= 0.4


def test_redrive_cancel_and_one_at_a_time(messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 3)
    task = queues.RedriveMessages(
        qpb.RedriveMessagesRequest(dead_letter_queue=dlq, max_messages_per_second=0.001)
    ).task
    second = error_of(queues.RedriveMessages, qpb.RedriveMessagesRequest(dead_letter_queue=dlq))
    assert second.code() == grpc.StatusCode.FAILED_PRECONDITION
    cancelled = queues.CancelRedriveTask(qpb.CancelRedriveTaskRequest(task_id=task.task_id)).task
    assert cancelled.state == qpb.RedriveTask.STATE_CANCELLED
    again = error_of(queues.CancelRedriveTask, qpb.CancelRedriveTaskRequest(task_id=task.task_id))
    assert again.code() == grpc.StatusCode.FAILED_PRECONDITION
    unknown = error_of(
        queues.CancelRedriveTask,
        qpb.CancelRedriveTaskRequest(task_id="00000000-0000-0000-0000-000000000000"),
    )
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    bad = error_of(queues.CancelRedriveTask, qpb.CancelRedriveTaskRequest(task_id="nope"))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_redrive_of_a_plain_queue_is_refused(queues, queue):
    error = error_of(queues.RedriveMessages, qpb.RedriveMessagesRequest(dead_letter_queue=queue))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_redrives_go_on_while_cleanup_is_held_up(db, messages, queues, dlq_pair):
    source, dlq = dlq_pair
    _fill_dlq(messages, source, dlq, 3)
    held = db.transaction()
    await held.start()
    try:
        # The cleanup of expired records waits on this lock for as long as we hold it.
        await db.execute("LOCK TABLE postbox.archive IN SHARE MODE")
        cleanup_waiting = 0
        for _ in range(600):
            cleanup_waiting = await db.fetchval(
                "SELECT count(*) FROM pg_stat_clear_snapshot(), pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%postbox.expire_records%' "
                "AND datname = current_database()"
            )
            if cleanup_waiting:
                break
            await asyncio.sleep(0.05)
        assert cleanup_waiting, "the cleanup never ran"
        queues.RedriveMessages(qpb.RedriveMessagesRequest(dead_letter_queue=dlq))
        done = wait_until(
            lambda: (t := _task(queues, dlq)).state == qpb.RedriveTask.STATE_COMPLETED and t
        )
        assert done.moved_messages == 3
    finally:
        await held.rollback()


def test_dead_letter_moves_ignore_the_dlqs_pause_and_max_depth(messages, queues):
    # A dead letter must never be lost or stuck in its source: the move is not a send.
    dlq = create_queue(queues, unique_name("full_dlq"), max_depth=1).name
    source = create_queue(
        queues,
        unique_name("src"),
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=1),
    ).name
    messages.Send(pb.SendRequest(queue=dlq, body=b"already there"))
    queues.PauseQueue(qpb.PauseQueueRequest(name=dlq, sends=True))
    messages.SendBatch(
        pb.SendBatchRequest(queue=source, entries=[pb.SendBatchEntry(body=b"x")] * 3)
    )
    for got in receive(messages, source):
        nack(messages, source, got.receipt, delay=0)
    assert receive(messages, source) == []  # all three moved on this receive
    assert stats(queues, dlq).visible_messages == 4
    assert stats(queues, source).visible_messages == 0
    # A redrive back into a paused, full source works the same way.
    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=source, max_depth=1), update_mask={"paths": ["max_depth"]}
        )
    )
    queues.PauseQueue(qpb.PauseQueueRequest(name=source, sends=True))
    queues.RedriveMessages(qpb.RedriveMessagesRequest(dead_letter_queue=dlq))
    wait_until(lambda: stats(queues, source).visible_messages == 3)
