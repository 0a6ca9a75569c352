"""SendBatch's request_id: one row per batch makes a retried batch answer the first
attempt's ids and store nothing (issue 48). Real server, real PostgreSQL."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest
from google.protobuf import duration_pb2
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import unique_name, until

from postbox_server.services.convert import PlainBatch, plain_batch


def send_batch(messages, queue: str, bodies: list[bytes], request_id: str, **entry_fields):
    entries = [pb.SendBatchEntry(body=body, **entry_fields) for body in bodies]
    request = pb.SendBatchRequest(queue=queue, entries=entries, request_id=request_id)
    return messages.SendBatch(request)


async def stored(db: asyncpg.Connection, queue: str) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )


async def test_a_repeated_request_id_stores_nothing_and_answers_the_first_ids(messages, queue, db):
    first = send_batch(messages, queue, [b"a", b"b", b"c"], "batch-1")
    assert list(first.duplicates) == [False] * 3
    again = send_batch(messages, queue, [b"a", b"b", b"c"], "batch-1")
    assert list(again.message_ids) == list(first.message_ids)
    assert list(again.duplicates) == [True] * 3
    # The entries are not compared: the id is a retry token, as a deduplication id is.
    other_bodies = send_batch(messages, queue, [b"x", b"y", b"z"], "batch-1")
    assert list(other_bodies.message_ids) == list(first.message_ids)
    assert await stored(db, queue) == 3
    # A batch without an id, or with another, is a batch of its own.
    assert not any(send_batch(messages, queue, [b"d"], "batch-2").duplicates)
    messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"e")]))
    assert await stored(db, queue) == 5


async def test_the_same_request_id_in_another_queue_is_independent(messages, queues, queue, db):
    other = f"{queue}-other"
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=other)))
    try:
        here = send_batch(messages, queue, [b"a", b"b"], "shared")
        there = send_batch(messages, other, [b"a", b"b"], "shared")
        assert not any(there.duplicates)
        assert set(here.message_ids).isdisjoint(there.message_ids)
        assert (await stored(db, queue), await stored(db, other)) == (2, 2)
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=other))


def test_a_repeat_with_another_number_of_entries_is_refused(messages, queue):
    send_batch(messages, queue, [b"a", b"b", b"c"], "three")
    with pytest.raises(grpc.RpcError) as refused:
        send_batch(messages, queue, [b"a", b"b"], "three")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        "request_id 'three' named a batch of 3 entries within the queue's deduplication window; "
        "this one has 2: a retry repeats its batch, a new batch takes a new request_id"
    )


@pytest.mark.parametrize(
    ("request_id", "quoted"),
    [
        ("x" * 129, "'" + "x" * 80 + "'… (129 bytes)"),
        ("has space", "'has space'"),
        ("tab\there", "'tab\there'"),
        ("é", "'é'"),
    ],
)
def test_a_malformed_request_id_is_invalid_argument(messages, queue, request_id, quoted):
    with pytest.raises(grpc.RpcError) as refused:
        send_batch(messages, queue, [b"a"], request_id)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == (
        f"request_id {quoted} is not 1 to 128 printable ASCII characters"
    )


def test_the_longest_request_id_is_taken(messages, queue):
    longest = "".join(chr(c) for c in range(ord("!"), ord("~") + 1))[:128].ljust(128, "~")
    first = send_batch(messages, queue, [b"a"], longest)
    assert list(send_batch(messages, queue, [b"a"], longest).message_ids) == list(first.message_ids)


async def test_a_request_id_is_forgotten_after_the_deduplication_window(messages, queues, db):
    name = unique_name("short_window")
    queues.CreateQueue(
        qpb.CreateQueueRequest(
            queue=qpb.Queue(name=name, deduplication_window=duration_pb2.Duration(seconds=1))
        )
    )
    try:
        first = send_batch(messages, name, [b"a"], "once")
        # The maintenance worker deletes the row once the window is over...
        await until(
            db,
            "SELECT NOT EXISTS (SELECT FROM postbox.batch_requests r JOIN postbox.queues q "
            "ON q.id = r.queue_id WHERE q.name = $1)",
            name,
        )
        # ...and the same id then names a new batch.
        later = send_batch(messages, name, [b"a"], "once")
        assert not any(later.duplicates)
        assert later.message_ids != first.message_ids
        assert await stored(db, name) == 2
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


async def test_an_expired_row_not_yet_cleaned_is_claimed_anew(messages, queue, db):
    first = send_batch(messages, queue, [b"a"], "stale")
    # As if the window ended before the maintenance worker came by.
    await db.execute(
        "UPDATE postbox.batch_requests SET expires_at = now() - interval '1 s' "
        "WHERE request_id = 'stale'"
    )
    later = send_batch(messages, queue, [b"a"], "stale")
    assert not any(later.duplicates)
    assert later.message_ids != first.message_ids
    again = send_batch(messages, queue, [b"a"], "stale")
    assert list(again.message_ids) == list(later.message_ids)


def test_fifo_queues_take_request_ids_beside_deduplication_ids(messages, queues):
    name = unique_name("request_id_fifo") + ".fifo"
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name, fifo=True)))
    try:
        fields = {"message_group_id": "g"}
        entries = [pb.SendBatchEntry(body=b"a", deduplication_id="d1", **fields)]
        request = pb.SendBatchRequest(queue=name, entries=entries, request_id="fifo-1")
        first = messages.SendBatch(request)
        assert list(messages.SendBatch(request).message_ids) == list(first.message_ids)
        # Per-message deduplication ids still hold across batches of other request ids.
        request.request_id = "fifo-2"
        assert list(messages.SendBatch(request).duplicates) == [True]
        # And FIFO queues still need them.
        with pytest.raises(grpc.RpcError) as refused:
            send_batch(messages, name, [b"b"], "fifo-3", **fields)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


async def test_purging_a_queue_forgets_its_request_ids(messages, queues, queue, db):
    first = send_batch(messages, queue, [b"a"], "purged")
    queues.PurgeQueue(qpb.PurgeQueueRequest(name=queue))
    later = send_batch(messages, queue, [b"a"], "purged")
    assert later.message_ids != first.message_ids


def test_a_request_id_keeps_the_short_way_of_plain_bodies():
    request = pb.SendBatchRequest(
        queue="orders", entries=[pb.SendBatchEntry(body=b"a")], request_id="r" * 128
    )
    assert plain_batch(request, 1 << 20) == PlainBatch([b"a"], None)


async def test_a_plain_batch_writes_its_request_id_row_once_with_its_ids(database_url, queue):
    """Bodies alone into a plain queue take send_batch's straight path: the row is
    inserted with the batch's ids, never written empty and filled (issue 48). The
    transaction's own statistics count its writes at once."""
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            rows = await conn.fetch(
                "SELECT * FROM postbox.send_batch($1, ARRAY['a', 'b', 'c']::bytea[], "
                "request_id => 'once')",
                queue,
            )
            written = await conn.fetchrow(
                "SELECT n_tup_ins, n_tup_upd FROM pg_stat_xact_user_tables "
                "WHERE relid = 'postbox.batch_requests'::regclass"
            )
            ids = await conn.fetchval(
                "SELECT r.message_ids FROM postbox.batch_requests r "
                "JOIN postbox.queues q ON q.id = r.queue_id "
                "WHERE q.name = $1 AND r.request_id = 'once'",
                queue,
            )
        assert [row["duplicate"] for row in rows] == [False] * 3
        assert ids == [row["message_id"] for row in rows]
        assert ids == sorted(ids)  # drawn in input order
        assert tuple(written) == (1, 0)
    finally:
        await conn.close()


async def test_a_concurrent_repeat_waits_for_the_first_and_answers_its_ids(database_url, db, queue):
    """The first attempt's transaction is held open on purpose: the repeat waits on the
    request id's row, and once the first commits answers its ids and stores nothing."""
    first_conn = await asyncpg.connect(database_url)
    second_conn = await asyncpg.connect(database_url)
    statement = (
        "SELECT array_agg(s.message_id ORDER BY s.n), array_agg(s.duplicate ORDER BY s.n) "
        "FROM postbox.send_batch($1, ARRAY['a', 'b']::bytea[], request_id => $2) "
        "WITH ORDINALITY AS s(message_id, duplicate, n)"
    )
    try:
        first = first_conn.transaction()
        await first.start()
        first_ids, first_duplicates = await first_conn.fetchrow(statement, queue, "held")
        assert first_duplicates == [False, False]
        repeat = asyncio.create_task(second_conn.fetchrow(statement, queue, "held"))
        await until(
            db,
            "SELECT $1 = ANY (pg_blocking_pids($2))",
            first_conn.get_server_pid(),
            second_conn.get_server_pid(),
        )
        assert not repeat.done()
        await first.commit()
        repeat_ids, repeat_duplicates = await asyncio.wait_for(repeat, 30)
        assert (repeat_ids, repeat_duplicates) == (first_ids, [True, True])
        assert await stored(db, queue) == 2
    finally:
        await first_conn.close()
        await second_conn.close()


async def test_a_concurrent_repeat_of_a_rolled_back_batch_is_the_first(database_url, db, queue):
    first_conn = await asyncpg.connect(database_url)
    second_conn = await asyncpg.connect(database_url)
    statement = (
        "SELECT array_agg(s.message_id ORDER BY s.n), array_agg(s.duplicate ORDER BY s.n) "
        "FROM postbox.send_batch($1, ARRAY['a']::bytea[], request_id => $2) "
        "WITH ORDINALITY AS s(message_id, duplicate, n)"
    )
    try:
        first = first_conn.transaction()
        await first.start()
        await first_conn.fetchrow(statement, queue, "rolled-back")
        repeat = asyncio.create_task(second_conn.fetchrow(statement, queue, "rolled-back"))
        await until(
            db,
            "SELECT $1 = ANY (pg_blocking_pids($2))",
            first_conn.get_server_pid(),
            second_conn.get_server_pid(),
        )
        await first.rollback()
        _, repeat_duplicates = await asyncio.wait_for(repeat, 30)
        assert repeat_duplicates == [False]
        assert await stored(db, queue) == 1
    finally:
        await first_conn.close()
        await second_conn.close()
