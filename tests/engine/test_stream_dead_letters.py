"""A consumer group's dead letters: with max_deliveries, a message the group fails on that
many times (nacked, or left until its batch's lease ran out) goes to the group's dead
letters, which can be listed page by page, replayed into the group's reads and purged
older than a time. A replayed message goes to one reader of the group only."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from support import error_of, publish_bodies, seconds, unique_name, until

FINAL = """
SELECT coalesce(bool_and(l.tx < pg_snapshot_xmin(pg_current_snapshot())), true)
FROM postbox.stream_log l JOIN postbox.topics t ON t.id = l.topic_id WHERE t.name = $1
"""
# The lease of the group's batch runs out now (rather than after a wait).
EXPIRE = """
UPDATE postbox.consumer_groups g SET lease_expires_at = now() - interval '1 second'
FROM postbox.topics t WHERE t.id = g.topic_id AND t.name = $1 AND g.name = 'g'
"""


@pytest.fixture
def stream(topics, streams, request: pytest.FixtureRequest) -> str:
    """A stream topic with a, b, c and a group `g` that gives up after 2 deliveries."""
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    publish_bodies(topics, name, b"a", b"b", b"c")
    group = spb.ConsumerGroup(topic=name, name="g", max_deliveries=2)
    created = streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    assert created.consumer_group.max_deliveries == 2
    return name


def take(streams, topic: str, n: int, **options) -> spb.ReadStreamResponse:
    request = spb.ReadStreamRequest(
        topic=topic, consumer_group="g", min_messages=n, wait_time=seconds(10), **options
    )
    return streams.ReadStream(request)


def read_now(streams, topic: str) -> spb.ReadStreamResponse:
    return streams.ReadStream(spb.ReadStreamRequest(topic=topic, consumer_group="g"))


def ack(streams, topic: str, batch: str, nack=()) -> int:
    request = spb.AckStreamRequest(
        topic=topic, consumer_group="g", batch=batch, nack_offsets=list(nack)
    )
    return streams.AckStream(request).cursor_offset


def group(streams, topic: str) -> spb.ConsumerGroup:
    return streams.GetConsumerGroup(
        spb.GetConsumerGroupRequest(topic=topic, name="g")
    ).consumer_group


def dead_letters(streams, topic: str, **options) -> spb.ListStreamDeadLettersResponse:
    request = spb.ListStreamDeadLettersRequest(topic=topic, consumer_group="g", **options)
    return streams.ListStreamDeadLetters(request)


def replay(streams, topic: str, *offsets: int) -> int:
    request = spb.ReplayStreamDeadLettersRequest(
        topic=topic, consumer_group="g", offsets=list(offsets)
    )
    return streams.ReplayStreamDeadLetters(request).replayed_count


def purge(streams, topic: str, older_than: datetime) -> int:
    stamp = Timestamp()
    stamp.FromDatetime(older_than)
    request = spb.PurgeStreamDeadLettersRequest(topic=topic, consumer_group="g", older_than=stamp)
    return streams.PurgeStreamDeadLetters(request).purged_count


def test_a_message_nacked_max_deliveries_times_becomes_a_dead_letter(streams, stream):
    first = take(streams, stream, 3)
    ack(streams, stream, first.batch, nack=[m.offset for m in first.messages if m.body != b"b"])
    second = read_now(streams, stream)
    assert [(m.body, m.delivery_count) for m in second.messages] == [(b"a", 2), (b"c", 2)]
    ack(streams, stream, second.batch, nack=[m.offset for m in second.messages])
    state = group(streams, stream)
    assert (state.lag_messages, state.retry_messages, state.dead_letter_messages) == (0, 0, 2)
    assert read_now(streams, stream).batch == ""  # no third delivery
    listed = dead_letters(streams, stream)
    assert [(d.message.body, d.message.delivery_count, d.reason) for d in listed.dead_letters] == [
        (b"a", 2, "nacked"), (b"c", 2, "nacked"),
    ]  # fmt: skip
    assert listed.dead_letters[0].message.offset == first.messages[0].offset
    assert listed.dead_letters[0].dead_time.ToDatetime() > datetime(2020, 1, 1)
    assert listed.next_page_token == ""


async def test_a_batch_whose_lease_ran_out_max_deliveries_times_is_dead_and_the_group_reads_on(
    topics, streams, stream, db
):
    first = take(streams, stream, 3)
    assert await db.execute(EXPIRE, stream) == "UPDATE 1"
    second = read_now(streams, stream)
    assert second.delivery_count == 2
    assert [m.delivery_count for m in second.messages] == [2, 2, 2]
    assert await db.execute(EXPIRE, stream) == "UPDATE 1"
    publish_bodies(topics, stream, b"d")
    await until(db, FINAL, stream)
    third = read_now(streams, stream)
    # a, b and c went out twice and were never acked: dead; the group reads on at d.
    assert [(m.body, m.delivery_count) for m in third.messages] == [(b"d", 1)]
    assert group(streams, stream).cursor_offset == first.messages[-1].offset
    listed = dead_letters(streams, stream)
    assert [(d.message.body, d.reason) for d in listed.dead_letters] == [
        (b"a", "lease expired"), (b"b", "lease expired"), (b"c", "lease expired"),
    ]  # fmt: skip
    error = error_of(ack, streams, stream, second.batch)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_dead_letters_come_in_pages(streams, stream):
    first = take(streams, stream, 3)
    ack(streams, stream, first.batch, nack=[m.offset for m in first.messages])
    second = read_now(streams, stream)
    ack(streams, stream, second.batch, nack=[m.offset for m in second.messages])
    pages, token = [], ""
    while True:
        page = dead_letters(streams, stream, page_size=2, page_token=token)
        pages.append([d.message.body for d in page.dead_letters])
        token = page.next_page_token
        if not token:
            break
    assert pages == [[b"a", b"b"], [b"c"]]
    error = error_of(dead_letters, streams, stream, page_size=1001)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_replayed_dead_letters_go_out_to_the_group_again_with_fresh_deliveries(streams, stream):
    first = take(streams, stream, 3)
    ack(streams, stream, first.batch, nack=[m.offset for m in first.messages])
    second = read_now(streams, stream)
    ack(streams, stream, second.batch, nack=[m.offset for m in second.messages])
    b = first.messages[1].offset
    assert replay(streams, stream, b, 999_999_999) == 1  # not a dead letter: passed over
    state = group(streams, stream)
    assert (state.retry_messages, state.dead_letter_messages) == (1, 2)
    back = read_now(streams, stream)
    assert [(m.body, m.delivery_count) for m in back.messages] == [(b"b", 1)]
    ack(streams, stream, back.batch)
    assert replay(streams, stream) == 2  # the rest
    back = read_now(streams, stream)
    assert [(m.body, m.delivery_count) for m in back.messages] == [(b"a", 1), (b"c", 1)]
    ack(streams, stream, back.batch)
    state = group(streams, stream)
    assert (state.retry_messages, state.dead_letter_messages) == (0, 0)
    assert replay(streams, stream) == 0


def test_purge_deletes_the_dead_letters_older_than_a_time(streams, stream):
    first = take(streams, stream, 3)
    ack(streams, stream, first.batch, nack=[m.offset for m in first.messages])
    second = read_now(streams, stream)
    ack(streams, stream, second.batch, nack=[m.offset for m in second.messages])
    died = dead_letters(streams, stream).dead_letters[0].dead_time.ToDatetime(timezone.utc)
    assert purge(streams, stream, died) == 0  # died at that time, not before it
    assert purge(streams, stream, died + timedelta(microseconds=1)) == 3
    assert group(streams, stream).dead_letter_messages == 0
    request = spb.PurgeStreamDeadLettersRequest(topic=stream, consumer_group="g")
    error = error_of(streams.PurgeStreamDeadLetters, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "older_than is required" in error.details()


def test_update_sets_max_deliveries_and_refuses_bad_values(streams, stream):
    def update(value: int, paths=("max_deliveries",)) -> spb.ConsumerGroup:
        request = spb.UpdateConsumerGroupRequest(
            consumer_group=spb.ConsumerGroup(topic=stream, name="g", max_deliveries=value),
            update_mask=FieldMask(paths=list(paths)),
        )
        return streams.UpdateConsumerGroup(request).consumer_group

    assert update(7).max_deliveries == 7
    assert update(0).max_deliveries == 0  # never
    error = error_of(update, 1001)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_deliveries must be from 1 to 1000 (or none: never), not 1001" in error.details()
    error = error_of(update, 3, paths=("paused",))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "update_mask must name max_deliveries" in error.details()
    assert group(streams, stream).max_deliveries == 0
    request = spb.UpdateConsumerGroupRequest(
        consumer_group=spb.ConsumerGroup(topic=stream, name="nobody", max_deliveries=3),
        update_mask=FieldMask(paths=["max_deliveries"]),
    )
    assert error_of(streams.UpdateConsumerGroup, request).code() == grpc.StatusCode.NOT_FOUND
    for call in (dead_letters, replay):
        error = error_of(call, streams, unique_name("absent"))
        assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_two_readers_never_both_get_a_replayed_dead_letter(streams, stream, database_url):
    first = take(streams, stream, 3)
    ack(streams, stream, first.batch, nack=[first.messages[0].offset])
    second = read_now(streams, stream)
    ack(streams, stream, second.batch, nack=[second.messages[0].offset])
    assert group(streams, stream).dead_letter_messages == 1
    replayer = await asyncpg.connect(database_url)
    reader = await asyncpg.connect(database_url)
    try:
        # The replay is under way, its transaction open: it holds the group, so a reader
        # neither waits for it nor sees the message it is putting back.
        await replayer.execute("BEGIN")
        assert await replayer.fetchval(
            "SELECT postbox.replay_stream_dead_letters($1, 'g')", stream
        ) == 1  # fmt: skip
        assert read_now(streams, stream).batch == ""
        await replayer.execute("COMMIT")
        # Two readers race for it: the first holds the group in its open transaction...
        await reader.execute("BEGIN")
        rows = await reader.fetch("SELECT batch, body FROM postbox.read_stream($1, 'g')", stream)
        assert [r["body"] for r in rows] == [b"a"]
        # ...so the second gets nothing, neither now nor once it is out under a lease.
        assert read_now(streams, stream).batch == ""
        await reader.execute("COMMIT")
        assert read_now(streams, stream).batch == ""
        ack(streams, stream, str(rows[0]["batch"]))
        assert read_now(streams, stream).batch == ""
        state = group(streams, stream)
        assert (state.retry_messages, state.dead_letter_messages) == (0, 0)
    finally:
        await replayer.close()
        await reader.close()
