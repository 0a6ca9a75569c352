"""Group commit of single Sends and single Publishes, through the real server: shared commits,
own ids, own errors."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from support import assert_shared, bodies_by_id, seconds, under_load, unique_name


@pytest.fixture
def stub(aio_channel) -> message_service_pb2_grpc.MessageServiceStub:
    return message_service_pb2_grpc.MessageServiceStub(aio_channel)


async def test_concurrent_sends_share_commits_and_keep_their_own_ids(
    stub, db, queue, server, commit_sizes
):
    bodies = [f"message {i}".encode() for i in range(300)]
    responses = await under_load(
        db, server, lambda: [stub.Send(pb.SendRequest(queue=queue, body=b)) for b in bodies]
    )
    ids = [r.message_id for r in responses]
    assert len(set(ids)) == len(bodies)
    stored = await bodies_by_id(db, queue)
    assert [stored[i] for i in ids] == bodies  # each caller got the id of its own message
    assert_shared(await commit_sizes(ids))


async def test_a_refused_message_fails_only_its_own_caller(stub, db, queue, server, commit_sizes):
    bad_attribute = {"AWS.reserved": msg.AttributeValue(data_type="String", string_value="x")}
    requests = []
    for i in range(120):
        if i % 10 == 3:
            requests.append(pb.SendRequest(queue=queue, body=b"bad", attributes=bad_attribute))
        elif i % 10 == 7:
            requests.append(pb.SendRequest(queue="no_such_queue_gc", body=b"lost"))
        else:
            requests.append(pb.SendRequest(queue=queue, body=f"good {i}".encode()))
    outcomes = await under_load(db, server, lambda: [stub.Send(r) for r in requests])
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
    # The good messages shared their groups' commits with refused ones.
    good = [o.message_id for o in outcomes if isinstance(o, pb.SendResponse)]
    assert_shared(await commit_sizes(good))


async def test_sends_to_several_queues_in_one_group(stub, db, queues, server, commit_sizes):
    from postbox.v1 import queue_service_pb2 as qpb

    names = [f"gc_multi_{i}" for i in range(4)]
    for name in names:
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    try:
        requests = [
            pb.SendRequest(queue=names[i % 4], body=f"{names[i % 4]}:{i}".encode())
            for i in range(200)
        ]
        responses = await under_load(db, server, lambda: [stub.Send(r) for r in requests])
        for name in names:
            stored = await bodies_by_id(db, name)
            mine = [
                (resp.message_id, req.body)
                for req, resp in zip(requests, responses, strict=True)
                if req.queue == name
            ]
            assert dict(mine) == stored
        assert_shared(await commit_sizes([r.message_id for r in responses]))
    finally:
        for name in names:
            queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


async def test_cancelled_callers_do_not_disturb_the_others(stub, db, queue, server, commit_sizes):
    def make_calls() -> list:
        return [stub.Send(pb.SendRequest(queue=queue, body=f"{i}".encode())) for i in range(200)]

    def cancel_every_third(calls: list) -> None:  # waiting in groups, or at the database
        for call in calls[::3]:
            call.cancel()

    outcomes = await under_load(db, server, make_calls, while_held=cancel_every_third)
    stored = await bodies_by_id(db, queue)
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, pb.SendResponse):
            assert stored[outcome.message_id] == f"{i}".encode()
        else:
            assert i % 3 == 0
            assert isinstance(outcome, asyncio.CancelledError)
    sent = [o.message_id for o in outcomes if isinstance(o, pb.SendResponse)]
    assert len(sent) >= 200 - 67
    assert_shared(await commit_sizes(sent))
    # A cancelled Send may or may not have been committed; a later one still works.
    response = await stub.Send(pb.SendRequest(queue=queue, body=b"after"))
    assert (await bodies_by_id(db, queue))[response.message_id] == b"after"


async def test_delayed_and_plain_sends_in_one_group(stub, db, queue, server, commit_sizes):
    requests = [
        pb.SendRequest(queue=queue, body=f"{i}".encode(), delay=seconds(60))
        if i % 2
        else pb.SendRequest(queue=queue, body=f"{i}".encode())
        for i in range(50)
    ]
    responses = await under_load(db, server, lambda: [stub.Send(r) for r in requests])
    assert_shared(await commit_sizes([r.message_id for r in responses]))
    delayed = await db.fetch(
        "SELECT id FROM postbox.messages WHERE id = ANY($1::bigint[]) "
        "AND visible_at > enqueued_at + interval '50 s'",
        [int(r.message_id) for r in responses],
    )
    assert {str(r["id"]) for r in delayed} == {r.message_id for r in responses[1::2]}


@pytest.fixture
def topic_stub(aio_channel) -> topic_service_pb2_grpc.TopicServiceStub:
    return topic_service_pb2_grpc.TopicServiceStub(aio_channel)


@pytest.fixture
async def fan_out(db):
    """A topic whose every message goes to three plain queues and, by routing key
    "small", to a fourth that holds messages of at most 1,024 bytes."""
    topic = unique_name("gc_topic")
    queue_names = [unique_name(f"gc_fan_{i}") for i in range(3)]
    small = unique_name("gc_small")
    await db.execute("SELECT postbox.create_topic($1)", topic)
    for i, name in enumerate(queue_names):
        await db.execute("SELECT postbox.create_queue($1)", name)
        await db.execute(
            "SELECT postbox.create_subscription($1, $2, '#', $3)", topic, f"s{i}", name
        )
    await db.execute("""SELECT postbox.create_queue($1, '{"max_message_size": 1024}')""", small)
    await db.execute("SELECT postbox.create_subscription($1, 'small', 'small', $2)", topic, small)
    yield topic, queue_names, small
    await db.execute("SELECT postbox.delete_topic($1)", topic)
    for name in [*queue_names, small]:
        await db.execute("SELECT postbox.drop_queue($1)", name)


async def test_concurrent_publishes_share_commits_and_keep_their_own_results(
    topic_stub, db, server, commit_sizes, fan_out
):
    topic, queue_names, _ = fan_out
    bodies = [f"published {i}".encode() for i in range(200)]
    responses = await under_load(
        db,
        server,
        lambda: [topic_stub.Publish(tpb.PublishRequest(topic=topic, body=b)) for b in bodies],
        statement="postbox.publish_batch",
    )
    assert len({r.publish_id for r in responses}) == len(bodies)
    for name in queue_names:
        stored = await bodies_by_id(db, name)
        assert len(stored) == len(bodies)
        for body, response in zip(bodies, responses, strict=True):
            assert list(response.queues) == sorted(queue_names)
            # Each caller got the ids its own message took in every queue.
            assert stored[response.message_ids[sorted(queue_names).index(name)]] == body
    ids = [i for r in responses for i in r.message_ids]
    assert_shared(await commit_sizes(ids))


async def test_a_refused_publish_fails_only_its_own_caller(
    topic_stub, db, server, commit_sizes, fan_out
):
    topic, queue_names, small = fan_out
    requests = []
    for i in range(120):
        if i % 10 == 3:  # too big for the small queue: the whole publish is refused
            requests.append(tpb.PublishRequest(topic=topic, body=b"x" * 2000, routing_key="small"))
        elif i % 10 == 7:
            requests.append(tpb.PublishRequest(topic="no_such_topic_gc", body=b"lost"))
        else:
            requests.append(tpb.PublishRequest(topic=topic, body=f"good {i}".encode()))
    outcomes = await under_load(
        db,
        server,
        lambda: [topic_stub.Publish(r) for r in requests],
        statement="postbox.publish_batch",
    )
    for i, outcome in enumerate(outcomes):
        if i % 10 == 3:
            assert outcome.code() == grpc.StatusCode.INVALID_ARGUMENT, outcome
            assert "subscription 'small'" in outcome.details()
        elif i % 10 == 7:
            assert outcome.code() == grpc.StatusCode.NOT_FOUND, outcome
        else:
            assert isinstance(outcome, tpb.PublishResponse), outcome
    good = sorted(r.body for i, r in enumerate(requests) if i % 10 not in (3, 7))
    for name in queue_names:
        assert sorted((await bodies_by_id(db, name)).values()) == good
    assert await bodies_by_id(db, small) == {}  # nothing of a refused publish went anywhere
    ids = [i for o in outcomes if isinstance(o, tpb.PublishResponse) for i in o.message_ids]
    assert_shared(await commit_sizes(ids))


async def test_a_paused_queue_fails_only_the_sends_into_it(
    stub, db, queue, queues, server, commit_sizes
):
    from postbox.v1 import queue_service_pb2 as qpb

    paused = unique_name("gc_paused")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=paused)))
    queues.PauseQueue(qpb.PauseQueueRequest(name=paused, sends=True))
    try:
        requests = [
            pb.SendRequest(queue=paused if i % 5 == 0 else queue, body=f"{i}".encode())
            for i in range(100)
        ]
        outcomes = await under_load(db, server, lambda: [stub.Send(r) for r in requests])
        for i, outcome in enumerate(outcomes):
            if i % 5 == 0:
                assert outcome.code() == grpc.StatusCode.UNAVAILABLE, outcome
                assert "paused" in outcome.details()
            else:
                assert isinstance(outcome, pb.SendResponse), outcome
        sent = [o.message_id for o in outcomes if isinstance(o, pb.SendResponse)]
        assert_shared(await commit_sizes(sent))
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=paused))
