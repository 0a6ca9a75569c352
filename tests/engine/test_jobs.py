"""Jobs: a message's life (results, failures, dead-lettering, lookups), consumer ids,
per-message max_receive_count; through the real server's gRPC API and the SQL engine."""

from __future__ import annotations

import queue as queue_module

import asyncpg
import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import (
    ServerProcess,
    create_database,
    create_queue,
    drop_database,
    error_of,
    eventually,
    metric,
    receive,
    scrape,
    seconds,
    unique_name,
)

RESULT_LIMIT = 65536  # bytes a Delete's result may hold


@pytest.fixture
def history(queues):
    """A queue that keeps history (archive_on_delete), without a dead-letter queue."""
    name = create_queue(queues, unique_name("history"), archive_on_delete=True).name
    yield name
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


@pytest.fixture
def with_dlq(queues):
    """A history queue whose messages dead-letter after 5 receives, and its DLQ."""
    dlq = create_queue(queues, unique_name("jobs_dlq"), archive_on_delete=True).name
    source = create_queue(
        queues,
        unique_name("jobs_src"),
        archive_on_delete=True,
        dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=5),
    ).name
    yield source, dlq
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=source))
    queues.DeleteQueue(qpb.DeleteQueueRequest(name=dlq))


def send(messages, queue: str, body: bytes = b"job", **fields) -> str:
    return messages.Send(pb.SendRequest(queue=queue, body=body, **fields)).message_id


def take(messages, queue: str, consumer_id: str = "", visibility: float | None = None):
    """One message, received under consumer_id."""
    request = pb.ReceiveRequest(queue=queue, max_messages=1, consumer_id=consumer_id)
    if visibility is not None:
        request.visibility_timeout.CopyFrom(seconds(visibility))
    (got,) = [m for response in messages.Receive(request) for m in response.messages]
    return got


def get(messages, queue: str, message_id: str) -> msg.Message:
    return messages.GetMessage(pb.GetMessageRequest(queue=queue, message_id=message_id)).message


def listed(messages, queue: str = "", state: int = 0, page_size: int = 100) -> list[msg.Message]:
    """Every page of ListMessages."""
    request = pb.ListMessagesRequest(queue=queue, state=state, page_size=page_size)
    found = []
    while True:
        response = messages.ListMessages(request)
        found += response.messages
        if not response.next_page_token:
            return found
        request.page_token = response.next_page_token


def test_a_job_goes_from_queued_to_in_flight_to_succeeded_with_its_result(messages, history):
    message_id = send(messages, history)
    queued = get(messages, history, message_id)
    assert queued.state == msg.MESSAGE_STATE_VISIBLE
    assert (queued.receive_count, queued.consumer_id, queued.queue) == (0, "", history)
    assert not queued.HasField("receive_time")
    assert not queued.HasField("finish_time")

    got = take(messages, history, consumer_id="worker-1@host-a")
    held = get(messages, history, message_id)
    assert held.state == msg.MESSAGE_STATE_IN_FLIGHT
    assert held.consumer_id == "worker-1@host-a"
    assert held.receive_count == 1
    assert held.receive_time.ToDatetime() >= held.enqueue_time.ToDatetime()
    # The first delivery is the latest (the two are read from the clock one after the other).
    since_first = held.receive_time.ToDatetime() - held.first_receive_time.ToDatetime()
    assert 0 <= since_first.total_seconds() < 1
    (peeked,) = messages.PeekMessages(pb.PeekMessagesRequest(queue=history)).messages
    assert peeked.consumer_id == "worker-1@host-a"

    messages.Delete(pb.DeleteRequest(queue=history, receipt=got.receipt, result=b'{"rows": 42}'))
    done = get(messages, history, message_id)
    assert done.state == msg.MESSAGE_STATE_SUCCEEDED
    assert done.result == b'{"rows": 42}'
    assert done.consumer_id == "worker-1@host-a"
    assert done.receive_count == 1
    assert done.finish_time.ToDatetime() >= held.receive_time.ToDatetime()
    assert done.first_receive_time == held.first_receive_time
    assert done.enqueue_time == queued.enqueue_time
    assert done.body == b"job"
    assert [m.message_id for m in listed(messages, history, msg.MESSAGE_STATE_SUCCEEDED)] == [
        message_id
    ]
    (archived,) = messages.ListArchivedMessages(
        pb.ListArchivedMessagesRequest(queue=history)
    ).messages
    assert archived.reason == msg.ARCHIVE_REASON_DELETED


def test_delete_batch_keeps_each_result_beside_its_receipt(messages, history):
    ids = [send(messages, history, body=f"{i}".encode()) for i in range(3)]
    got = receive(messages, history, count=3)
    by_id = {m.message_id: m.receipt for m in got}
    receipts = [by_id[i] for i in ids]
    response = messages.DeleteBatch(
        pb.DeleteBatchRequest(queue=history, receipts=receipts, results=[b"r0", b"", b"r2"])
    )
    assert [r.code for r in response.results] == [0, 0, 0]
    assert [get(messages, history, i).result for i in ids] == [b"r0", b"", b"r2"]


def test_a_queue_without_history_forgets_a_finished_job(messages, queue):
    message_id = send(messages, queue)
    got = take(messages, queue)
    messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt, result=b"dropped"))
    error = error_of(messages.GetMessage, pb.GetMessageRequest(queue=queue, message_id=message_id))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "archive_on_delete" in error.details()


def test_a_result_over_64_kib_is_refused_and_the_job_stays_in_flight(messages, history):
    message_id = send(messages, history)
    got = take(messages, history)
    error = error_of(
        messages.Delete,
        pb.DeleteRequest(queue=history, receipt=got.receipt, result=b"x" * (RESULT_LIMIT + 1)),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "result is 65537 bytes; at most 65536 (64 KiB)" in error.details()
    assert get(messages, history, message_id).state == msg.MESSAGE_STATE_IN_FLIGHT
    too_many = error_of(
        messages.DeleteBatch,
        pb.DeleteBatchRequest(queue=history, receipts=[got.receipt], results=[b"a", b"b"]),
    )
    assert too_many.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "2 results for 1 receipts" in too_many.details()
    # Exactly the limit is kept.
    big = b"y" * RESULT_LIMIT
    messages.Delete(pb.DeleteRequest(queue=history, receipt=got.receipt, result=big))
    assert get(messages, history, message_id).result == big


def test_a_dead_letter_nack_moves_the_job_to_the_dlq_at_once(messages, with_dlq):
    source, dlq = with_dlq
    message_id = send(messages, source)
    got = take(messages, source, consumer_id="w1")
    messages.Nack(
        pb.NackRequest(queue=source, receipt=got.receipt, error="bad input", dead_letter=True)
    )
    # Seen from the source: dead-lettered, into the DLQ, with the reason.
    seen = get(messages, source, message_id)
    assert seen.state == msg.MESSAGE_STATE_DEAD_LETTERED
    assert (seen.queue, seen.last_error, seen.receive_count) == (dlq, "bad input", 1)
    assert seen.HasField("finish_time")
    # In the DLQ it waits, with its source and error, at once (one delivery of five).
    dead = take(messages, dlq)
    assert (dead.message_id, dead.dead_letter_source_queue) == (message_id, source)
    assert dead.last_error == "bad input"
    assert [m.message_id for m in listed(messages, source, msg.MESSAGE_STATE_DEAD_LETTERED)] == [
        message_id
    ]
    # Finished in the DLQ, it still reads as dead-lettered from its source queue.
    messages.Delete(pb.DeleteRequest(queue=dlq, receipt=dead.receipt))
    assert get(messages, source, message_id).state == msg.MESSAGE_STATE_DEAD_LETTERED
    assert get(messages, dlq, message_id).state == msg.MESSAGE_STATE_SUCCEEDED


def test_a_dead_letter_nack_without_a_dlq_fails_the_job_for_good(messages, history):
    message_id = send(messages, history)
    got = take(messages, history)
    messages.Nack(
        pb.NackRequest(queue=history, receipt=got.receipt, error="no such user", dead_letter=True)
    )
    failed = get(messages, history, message_id)
    assert failed.state == msg.MESSAGE_STATE_FAILED
    assert failed.last_error == "no such user"
    assert failed.HasField("finish_time")
    assert receive(messages, history) == []
    (archived,) = messages.ListArchivedMessages(
        pb.ListArchivedMessagesRequest(queue=history)
    ).messages
    assert archived.reason == msg.ARCHIVE_REASON_FAILED
    # The receipt is spent.
    again = error_of(
        messages.Nack, pb.NackRequest(queue=history, receipt=got.receipt, dead_letter=True)
    )
    assert again.code() == grpc.StatusCode.NOT_FOUND


def test_a_dead_letter_nack_takes_no_delay(messages, history):
    message_id = send(messages, history)
    got = take(messages, history)
    request = pb.NackRequest(queue=history, receipt=got.receipt, dead_letter=True)
    request.delay.CopyFrom(seconds(1))
    error = error_of(messages.Nack, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "takes no delay" in error.details()
    assert get(messages, history, message_id).state == msg.MESSAGE_STATE_IN_FLIGHT


def test_a_messages_own_max_receive_count_overrides_the_queues(messages, with_dlq, history):
    source, dlq = with_dlq
    once = send(messages, source, max_receive_count=1)
    take(messages, source, visibility=0)  # delivery 1 of 1, back at once
    # The next receive finds it out of deliveries: into the DLQ (the queue's is 5).
    assert receive(messages, source) == []
    assert get(messages, source, once).state == msg.MESSAGE_STATE_DEAD_LETTERED
    assert take(messages, dlq).message_id == once
    # Without a dead-letter queue it fails for good after its own limit.
    twice = send(messages, history, max_receive_count=2)
    assert get(messages, history, twice).max_receive_count == 2
    take(messages, history, visibility=0)
    take(messages, history, visibility=0)
    assert receive(messages, history) == []
    failed = get(messages, history, twice)
    assert (failed.state, failed.receive_count) == (msg.MESSAGE_STATE_FAILED, 2)


def test_a_bad_max_receive_count_is_refused_and_nothing_is_sent(messages, history):
    for bad in (-1, 1001):
        error = error_of(messages.Send, pb.SendRequest(queue=history, max_receive_count=bad))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"max_receive_count is {bad}; it must be 1 to 1000" in error.details()
    entries = [pb.SendBatchEntry(body=b"ok"), pb.SendBatchEntry(body=b"x", max_receive_count=5000)]
    error = error_of(messages.SendBatch, pb.SendBatchRequest(queue=history, entries=entries))
    assert "entry 1: max_receive_count is 5000" in error.details()
    assert listed(messages, history) == []


@pytest.mark.parametrize(
    ("consumer_id", "shown"),
    [("bad id", "'bad id' (6 characters)"), ("w" * 129, f"'{'w' * 40}' (129 characters)")],
)
def test_a_bad_consumer_id_is_refused(messages, queue, consumer_id, shown):
    send(messages, queue)
    request = pb.ReceiveRequest(queue=queue, consumer_id=consumer_id)
    error = error_of(lambda: list(messages.Receive(request)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"consumer_id {shown} must be 1 to 128 characters" in error.details()
    assert receive(messages, queue)[0].receive_count == 1  # nothing was claimed


def test_a_streaming_receive_names_its_consumer(messages, history):
    message_id = send(messages, history)
    requests: queue_module.Queue = queue_module.Queue()
    requests.put(pb.StreamingReceiveRequest(queue=history, consumer_id="streamer.7"))
    stream = messages.StreamingReceive(iter(requests.get, None))
    try:
        first = next(stream)
        assert [m.message_id for m in first.batch.messages] == [message_id]
        held = get(messages, history, message_id)
        assert (held.state, held.consumer_id) == (msg.MESSAGE_STATE_IN_FLIGHT, "streamer.7")
    finally:
        stream.cancel()
        requests.put(None)


def test_expired_and_cancelled_jobs_keep_their_ends(messages, history):
    short = send(messages, history, ttl=seconds(0.2))
    cancelled = send(messages, history)
    messages.CancelMessage(pb.CancelMessageRequest(queue=history, message_id=cancelled))
    assert get(messages, history, cancelled).state == msg.MESSAGE_STATE_CANCELLED
    # Expired as soon as its time passes, whether or not maintenance has removed it yet.
    expired = eventually(
        lambda: (m := get(messages, history, short)).state == msg.MESSAGE_STATE_EXPIRED and m,
        what="the message to expire",
    )
    assert expired.HasField("finish_time")


def test_list_messages_filters_by_state_and_pages_across_every_queue(messages, queues, history):
    other = create_queue(queues, unique_name("history_b"), archive_on_delete=True).name
    try:
        succeeded = []
        for queue in (history, other, history):
            send(messages, queue)
            got = take(messages, queue)
            messages.Delete(pb.DeleteRequest(queue=queue, receipt=got.receipt, result=b"ok"))
            succeeded.append(got.message_id)
        waiting = send(messages, other)
        everywhere = listed(messages, state=msg.MESSAGE_STATE_SUCCEEDED, page_size=1)
        mine = [m for m in everywhere if m.message_id in succeeded]
        assert [m.message_id for m in mine] == sorted(succeeded, key=int)
        assert [m.queue for m in mine] == [history, other, history]
        assert all(m.state == msg.MESSAGE_STATE_SUCCEEDED for m in everywhere)
        in_other = listed(messages, other)
        assert [(m.message_id, m.state) for m in in_other] == [
            (succeeded[1], msg.MESSAGE_STATE_SUCCEEDED),
            (waiting, msg.MESSAGE_STATE_VISIBLE),
        ]
        bad = error_of(messages.ListMessages, pb.ListMessagesRequest(queue=other, state=99))
        assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        missing = error_of(messages.ListMessages, pb.ListMessagesRequest(queue=unique_name("no")))
        assert missing.code() == grpc.StatusCode.NOT_FOUND
        # PeekMessages sees only what a queue holds: a finished state is no filter there.
        peek = pb.PeekMessagesRequest(queue=other, state=msg.MESSAGE_STATE_SUCCEEDED)
        assert error_of(messages.PeekMessages, peek).code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=other))


@pytest.fixture
def server_alone(admin_url: str):
    """A server on a database of its own: the metric shows the busiest consumers of the
    whole database, so messages other tests leave in flight would crowd these out."""
    url = create_database(admin_url)
    process = ServerProcess(url, metrics=True).start()
    try:
        yield process
    finally:
        process.stop()
        drop_database(admin_url, url)


def test_metrics_count_in_flight_messages_per_consumer(server_alone):
    channel = grpc.insecure_channel(server_alone.target)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queue = create_queue(
        queue_service_pb2_grpc.QueueServiceStub(channel), unique_name("inflight")
    ).name
    server = server_alone
    for _ in range(3):
        send(messages, queue)
    take(messages, queue, consumer_id="alpha")
    take(messages, queue, consumer_id="alpha")
    take(messages, queue)
    samples = eventually(
        lambda: (
            (s := scrape(server.metrics_port))
            and metric(s, "postbox_consumer_messages_in_flight", queue=queue, consumer="alpha") == 2
            and s
        ),
        what="the consumer's in-flight messages on /metrics",
    )
    unnamed = metric(samples, "postbox_consumer_messages_in_flight", queue=queue, consumer="(none)")
    assert unnamed == 1
    channel.close()


# The SQL door.


async def test_sql_callers_live_a_jobs_whole_life(db):
    name = unique_name("sql_jobs")
    await db.execute("SELECT postbox.create_queue($1, '{\"archive_on_delete\": true}')", name)
    try:
        first = await db.fetchval("SELECT postbox.send($1, 'a', max_receive_count => 3)", name)
        second = await db.fetchval("SELECT postbox.send($1, 'b')", name)
        rows = await db.fetch(
            "SELECT message_id, receipt FROM postbox.receive($1, 2, consumer_id => 'sql-worker')",
            name,
        )
        receipts = {row["message_id"]: row["receipt"] for row in rows}
        life = await db.fetchrow("SELECT * FROM postbox.get_message($1, $2)", name, first)
        assert (life["state"], life["consumer_id"], life["max_receive_count"]) == (
            "in_flight",
            "sql-worker",
            3,
        )
        await db.execute("SELECT postbox.delete($1, $2, 'done'::bytea)", name, receipts[first])
        await db.execute(
            "SELECT postbox.nack($1, $2, error => 'broken', dead_letter => true)",
            name,
            receipts[second],
        )
        states = await db.fetch(
            "SELECT message_id, state, result, last_error FROM postbox.list_messages($1)", name
        )
        assert [tuple(r) for r in states] == [
            (first, "succeeded", b"done", None),
            (second, "failed", None, "broken"),
        ]
        failed = await db.fetch("SELECT message_id FROM postbox.list_messages(NULL, 'failed')")
        assert second in [r["message_id"] for r in failed]
        with pytest.raises(asyncpg.PostgresError, match="state 'finished' is none of"):
            await db.fetch("SELECT * FROM postbox.list_messages($1, 'finished')", name)
        with pytest.raises(asyncpg.PostgresError, match="consumer_id 'a b'"):
            await db.fetch("SELECT * FROM postbox.receive($1, consumer_id => 'a b')", name)
    finally:
        await db.execute("SELECT postbox.drop_queue($1)", name)


async def test_sql_consumer_metrics_keep_the_top_consumers_and_fold_the_rest(db):
    name = unique_name("sql_consumers")
    await db.execute("SELECT postbox.create_queue($1)", name)
    try:
        await db.execute("SELECT postbox.send_batch($1, array_fill('x'::bytea, ARRAY[6]))", name)
        # c3 holds three, c2 two, c1 one; only the largest holder gets a series of its own.
        for consumer, count in (("c3", 3), ("c2", 2), ("c1", 1)):
            await db.fetch("SELECT * FROM postbox.receive($1, $2, consumer_id => $3)",
                           name, count, consumer)  # fmt: skip
        rows = await db.fetch(
            "SELECT consumer_id, in_flight FROM postbox.consumer_metrics(1) WHERE queue_name = $1",
            name,
        )
        # With other queues' consumers about, this queue's c3 may or may not be the top one.
        shown = {r["consumer_id"]: r["in_flight"] for r in rows}
        assert sum(shown.values()) == 6
        assert set(shown) <= {"c3", "(other)"}
        everything = await db.fetch(
            "SELECT consumer_id, in_flight FROM postbox.consumer_metrics(1000) "
            "WHERE queue_name = $1 ORDER BY consumer_id",
            name,
        )
        assert [tuple(r) for r in everything] == [("c1", 1), ("c2", 2), ("c3", 3)]
    finally:
        await db.execute("SELECT postbox.drop_queue($1)", name)


async def test_a_dead_letter_nack_and_a_receive_race_for_nothing(db, database_url):
    """A nack that dead-letters holds the message's row: a receive meanwhile skips it,
    and after the commit nobody can receive it."""
    name = unique_name("sql_race")
    await db.execute("SELECT postbox.create_queue($1, '{\"archive_on_delete\": true}')", name)
    other = await asyncpg.connect(database_url)
    try:
        await db.execute("SELECT postbox.send($1, 'x')", name)
        receipt = await db.fetchval(
            "SELECT receipt FROM postbox.receive($1, visibility_timeout => '0')", name
        )
        async with db.transaction():
            await db.execute("SELECT postbox.nack($1, $2, dead_letter => true)", name, receipt)
            # Visible (timeout 0) but locked by the nack: the receive skips it.
            assert await other.fetch("SELECT * FROM postbox.receive($1)", name) == []
        assert await other.fetch("SELECT * FROM postbox.receive($1)", name) == []
        state = await other.fetchval("SELECT state FROM postbox.list_messages($1)", name)
        assert state == "failed"
    finally:
        await other.close()
        await db.execute("SELECT postbox.drop_queue($1)", name)
