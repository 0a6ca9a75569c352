"""Group commit of single Sends, through the real server: shared commits, own ids, own errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import seconds


@pytest.fixture
def stub(aio_channel) -> message_service_pb2_grpc.MessageServiceStub:
    return message_service_pb2_grpc.MessageServiceStub(aio_channel)


async def bodies_by_id(db, queue: str) -> dict[str, bytes]:
    rows = await db.fetch(
        "SELECT m.id, m.body FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )
    return {str(row["id"]): row["body"] for row in rows}


async def test_concurrent_sends_share_commits_and_keep_their_own_ids(stub, db, queue):
    bodies = [f"message {i}".encode() for i in range(300)]
    # Hold inserts back so the sends meet a busy database, as under real load;
    # without this, how many share a commit depends on the machine's speed.
    held = db.transaction()
    await held.start()
    try:
        await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
        sends = asyncio.gather(
            *(stub.Send(pb.SendRequest(queue=queue, body=body)) for body in bodies)
        )
        blocked = 0
        for _ in range(500):
            # Activity is a snapshot per transaction: clear it to see the waits now.
            blocked = await db.fetchval(
                "SELECT count(*) FROM pg_stat_clear_snapshot(), pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE '%postbox.send_batch%'"
            )
            if blocked >= 2:
                break
            await asyncio.sleep(0.01)
        assert blocked >= 2, "the first groups never reached the database"
        await asyncio.sleep(0.5)  # the remaining sends arrive and queue up meanwhile
    finally:
        await held.rollback()
    responses = await sends
    ids = [r.message_id for r in responses]
    assert len(set(ids)) == len(bodies)
    stored = await bodies_by_id(db, queue)
    assert [stored[i] for i in ids] == bodies  # each caller got the id of its own message
    # Rows committed by one transaction share its xmin: the waiting sends went in
    # a few shared transactions (two were in flight, the rest grouped by max size).
    transactions = await db.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM postbox.messages WHERE id = ANY($1::bigint[])",
        [int(i) for i in ids],
    )
    assert transactions <= 6, transactions


async def test_a_refused_message_fails_only_its_own_caller(stub, db, queue):
    bad_attribute = {"AWS.reserved": msg.AttributeValue(data_type="String", string_value="x")}
    requests = []
    for i in range(120):
        if i % 10 == 3:
            requests.append(pb.SendRequest(queue=queue, body=b"bad", attributes=bad_attribute))
        elif i % 10 == 7:
            requests.append(pb.SendRequest(queue="no_such_queue_gc", body=b"lost"))
        else:
            requests.append(pb.SendRequest(queue=queue, body=f"good {i}".encode()))
    outcomes = await asyncio.gather(*(stub.Send(r) for r in requests), return_exceptions=True)
    stored = await bodies_by_id(db, queue)
    for i, (request, outcome) in enumerate(zip(requests, outcomes, strict=True)):
        if i % 10 == 3:
            assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, outcome
            assert "AWS." in outcome.details()
        elif i % 10 == 7:
            assert outcome.code() == grpc.StatusCode.NOT_FOUND, outcome
        else:
            assert isinstance(outcome, pb.SendResponse), outcome
            assert stored[outcome.message_id] == request.body
    assert sorted(stored.values()) == sorted(
        r.body for i, r in enumerate(requests) if i % 10 not in (3, 7)
    )


async def test_sends_to_several_queues_in_one_group(stub, db, queues):
    from postbox.v1 import queue_service_pb2 as qpb

    names = [f"gc_multi_{i}" for i in range(4)]
    for name in names:
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    try:
        requests = [
            pb.SendRequest(queue=names[i % 4], body=f"{names[i % 4]}:{i}".encode())
            for i in range(200)
        ]
        responses = await asyncio.gather(*(stub.Send(r) for r in requests))
        for name in names:
            stored = await bodies_by_id(db, name)
            mine = [
                (resp.message_id, req.body)
                for req, resp in zip(requests, responses, strict=True)
                if req.queue == name
            ]
            assert dict(mine) == stored
    finally:
        for name in names:
            queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


async def test_cancelled_callers_do_not_disturb_the_others(stub, db, queue):
    calls = [stub.Send(pb.SendRequest(queue=queue, body=f"{i}".encode())) for i in range(200)]
    await asyncio.sleep(0)
    for call in calls[::3]:
        call.cancel()
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    stored = await bodies_by_id(db, queue)
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, pb.SendResponse):
            assert stored[outcome.message_id] == f"{i}".encode()
        else:
            assert i % 3 == 0
            assert isinstance(outcome, asyncio.CancelledError)
    assert sum(isinstance(o, pb.SendResponse) for o in outcomes) >= 200 - 67
    # A cancelled Send may or may not have been committed; a later one still works.
    response = await stub.Send(pb.SendRequest(queue=queue, body=b"after"))
    assert (await bodies_by_id(db, queue))[response.message_id] == b"after"


async def test_delayed_and_plain_sends_in_one_group(stub, db, queue):
    requests = [
        pb.SendRequest(queue=queue, body=f"{i}".encode(), delay=seconds(60))
        if i % 2
        else pb.SendRequest(queue=queue, body=f"{i}".encode())
        for i in range(50)
    ]
    responses = await asyncio.gather(*(stub.Send(r) for r in requests))
    delayed = await db.fetch(
        "SELECT id FROM postbox.messages WHERE id = ANY($1::bigint[]) "
        "AND visible_at > enqueued_at + interval '50 s'",
        [int(r.message_id) for r in responses],
    )
    assert {str(r["id"]) for r in delayed} == {r.message_id for r in responses[1::2]}
