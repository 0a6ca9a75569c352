"""Nacks inside a stream batch: AckStream's nack_offsets give some of a batch's messages
back, to go out to the group again after nack_delay, while the rest of the batch is
acknowledged and the cursor moves past it; each message keeps its own delivery count.
Two readers of one group never both get a message given back."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import grpc
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from postbox_client import AsyncClient, Client
from support import error_of, publish_bodies, seconds, unique_name, until

# Whether every row of the topic is final: no transaction older than its own runs.
FINAL = """
SELECT coalesce(bool_and(l.tx < pg_snapshot_xmin(pg_current_snapshot())), true)
FROM postbox.stream_log l JOIN postbox.topics t ON t.id = l.topic_id WHERE t.name = $1
"""


@pytest.fixture
def stream(topics, streams, request: pytest.FixtureRequest) -> str:
    """A stream topic with messages a, b, c, d and a group `g` reading from the earliest."""
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    publish_bodies(topics, name, b"a", b"b", b"c", b"d")
    group = spb.ConsumerGroup(topic=name, name="g")
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return name


def take(streams, topic: str, n: int, **options) -> spb.ReadStreamResponse:
    """A batch of at least n messages (min_messages waits for publishes to be final)."""
    request = spb.ReadStreamRequest(
        topic=topic, consumer_group="g", min_messages=n, wait_time=seconds(10), **options
    )
    return streams.ReadStream(request)


def read_now(streams, topic: str) -> spb.ReadStreamResponse:
    return streams.ReadStream(spb.ReadStreamRequest(topic=topic, consumer_group="g"))


def ack(streams, topic: str, batch: str, nack=(), delay: float | None = None) -> int:
    request = spb.AckStreamRequest(
        topic=topic, consumer_group="g", batch=batch, nack_offsets=list(nack)
    )
    if delay is not None:
        request.nack_delay.CopyFrom(seconds(delay))
    return streams.AckStream(request).cursor_offset


def group(streams, topic: str) -> spb.ConsumerGroup:
    return streams.GetConsumerGroup(
        spb.GetConsumerGroupRequest(topic=topic, name="g")
    ).consumer_group


def of(batch: spb.ReadStreamResponse, *bodies: bytes) -> list[int]:
    return [m.offset for m in batch.messages if m.body in bodies]


def test_nacked_messages_come_back_and_the_rest_of_the_batch_is_acked(streams, stream):
    first = take(streams, stream, 4)
    assert [(m.body, m.delivery_count) for m in first.messages] == [
        (b"a", 1), (b"b", 1), (b"c", 1), (b"d", 1),
    ]  # fmt: skip
    cursor = ack(streams, stream, first.batch, nack=of(first, b"b", b"d"))
    assert cursor == first.messages[-1].offset  # the cursor moved past the whole batch
    state = group(streams, stream)
    assert (state.lag_messages, state.retry_messages) == (0, 2)
    again = read_now(streams, stream)
    assert [(m.body, m.delivery_count) for m in again.messages] == [(b"b", 2), (b"d", 2)]
    assert again.messages[0].offset == first.messages[1].offset
    ack(streams, stream, again.batch)
    state = group(streams, stream)
    assert (state.lag_messages, state.retry_messages) == (0, 0)
    assert read_now(streams, stream).batch == ""


async def test_a_nacked_message_waits_its_delay_while_the_group_reads_on(
    topics, streams, stream, db
):
    first = take(streams, stream, 4)
    ack(streams, stream, first.batch, nack=of(first, b"a"), delay=3600)
    assert read_now(streams, stream).batch == ""  # a waits an hour
    publish_bodies(topics, stream, b"e")
    later = take(streams, stream, 1)
    assert [m.body for m in later.messages] == [b"e"]  # the group reads on past a
    ack(streams, stream, later.batch)
    # The hour passes (moved, not waited): a leads the next batch, with new messages after.
    moved = await db.execute(
        "UPDATE postbox.stream_retries SET visible_at = now() - interval '1 second'"
        " WHERE group_id = (SELECT g.id FROM postbox.consumer_groups g"
        " JOIN postbox.topics t ON t.id = g.topic_id WHERE t.name = $1)",
        stream,
    )
    assert moved == "UPDATE 1"
    publish_bodies(topics, stream, b"f")
    await until(db, FINAL, stream)  # a, being due, goes out at once: f must be readable
    back = take(streams, stream, 2)
    assert [(m.body, m.delivery_count) for m in back.messages] == [(b"a", 2), (b"f", 1)]
    assert back.delivery_count == 1  # the batch is new; a's own count goes on


async def test_a_given_back_message_outlives_the_rotation_of_its_slot(topics, streams, stream, db):
    first = take(streams, stream, 4)
    ack(streams, stream, first.batch, nack=of(first, b"c"))
    # Every group has acked the log's rows: rotation may truncate them, and does.
    await db.execute(
        "DELETE FROM postbox.stream_log l USING postbox.topics t"
        " WHERE t.id = l.topic_id AND t.name = $1",
        stream,
    )
    back = read_now(streams, stream)
    assert [(m.body, m.delivery_count) for m in back.messages] == [(b"c", 2)]


async def test_an_expired_lease_brings_given_back_messages_back_with_the_batch(
    streams, stream, topics, db
):
    first = take(streams, stream, 4)
    ack(streams, stream, first.batch, nack=of(first, b"b"))
    publish_bodies(topics, stream, b"e")
    await until(db, FINAL, stream)  # b, being due, goes out at once: e must be readable
    out = take(streams, stream, 2, lease_duration=seconds(1))
    assert [m.body for m in out.messages] == [b"b", b"e"]
    # Not acked: once the lease runs out the whole batch, b included, goes out again.
    again = take(streams, stream, 1)  # waits up to 10 s for the lease to run out
    assert [(m.body, m.delivery_count) for m in again.messages] == [(b"b", 3), (b"e", 2)]
    assert error_of(ack, streams, stream, out.batch).code() == (grpc.StatusCode.FAILED_PRECONDITION)
    ack(streams, stream, again.batch)
    assert group(streams, stream).retry_messages == 0


def test_a_nack_of_an_offset_outside_the_batch_is_refused_and_changes_nothing(streams, stream):
    first = take(streams, stream, 2, max_messages=2)
    outside = first.messages[-1].offset + 1  # c: in the log, not in the batch
    error = error_of(ack, streams, stream, first.batch, nack=[outside])
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"nack_offsets: {outside} is not the offset of a message of batch" in error.details()
    error = error_of(ack, streams, stream, first.batch, nack=[first.messages[0].offset], delay=-1)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nack_delay must be from 0 s to 43200 s, not -1 s" in error.details()
    error = error_of(ack, streams, stream, first.batch, delay=43201)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = error_of(ack, streams, stream, first.batch, nack=range(1001))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "nack_offsets holds 1001 offsets; a batch has at most 1000" in error.details()
    state = group(streams, stream)
    assert (state.cursor_offset, state.retry_messages) == (0, 0)
    assert state.HasField("lease_expire_time")  # the batch is still out, unacked
    ack(streams, stream, first.batch, nack=[first.messages[0].offset])


async def test_two_readers_never_both_get_a_given_back_message(streams, stream, database_url):
    first = take(streams, stream, 4)
    nacker = await asyncpg.connect(database_url)
    reader = await asyncpg.connect(database_url)
    try:
        await until(reader, FINAL, stream)
        # The nack is under way, its transaction open: it holds the group, so a reader
        # neither waits for it nor reads the message it is giving back.
        await nacker.execute("BEGIN")
        await nacker.execute(
            "SELECT postbox.ack_stream($1, 'g', $2::uuid, $3)",
            stream, first.batch, of(first, b"c"),
        )  # fmt: skip
        assert read_now(streams, stream).batch == ""
        await nacker.execute("COMMIT")
        # Two readers race for c: the first holds the group in its open transaction...
        await reader.execute("BEGIN")
        rows = await reader.fetch("SELECT batch, body FROM postbox.read_stream($1, 'g')", stream)
        assert [r["body"] for r in rows] == [b"c"]
        # ...so the second gets nothing, neither now nor once c is out under a lease.
        assert read_now(streams, stream).batch == ""
        await reader.execute("COMMIT")
        assert read_now(streams, stream).batch == ""
        ack(streams, stream, str(rows[0]["batch"]))
        assert read_now(streams, stream).batch == ""
        assert group(streams, stream).retry_messages == 0
    finally:
        await nacker.close()
        await reader.close()


async def test_the_sdk_reader_nacks_what_its_handler_gives_back(streams, stream, server):
    seen: list[tuple[bytes, int]] = []
    async with AsyncClient(server.target) as client:
        reader = client.stream_reader(stream, "g", min_messages=4, wait_time=timedelta(seconds=5))

        async def handle(batch) -> None:
            seen.extend((m.body, m.delivery_count) for m in batch.messages)
            if batch.delivery_count == 1 and len(batch.messages) == 4:
                await batch.ack(nack=[m.offset for m in batch.messages if m.body == b"c"])
            else:
                reader.stop()  # run() acks this one

        await asyncio.wait_for(reader.run(handle), 30)
    assert seen == [(b"a", 1), (b"b", 1), (b"c", 1), (b"d", 1), (b"c", 2)]
    assert group(streams, stream).retry_messages == 0


def test_the_blocking_sdk_reader_nacks_with_a_delay(streams, stream, server):
    with Client(server.target) as client:
        reader = client.stream_reader(stream, "g", min_messages=4, wait_time=timedelta(seconds=5))
        batch = reader.read()
        assert batch is not None
        batch.ack(nack=[batch.messages[0].offset], nack_delay=timedelta(hours=1))
        assert batch.settled
    assert read_now(streams, stream).batch == ""  # the nacked message waits its hour
    state = group(streams, stream)
    assert (state.lag_messages, state.retry_messages) == (0, 1)
