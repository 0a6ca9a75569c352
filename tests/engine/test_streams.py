"""Stream topics over gRPC: consumer groups read one retained log, each through its own
cursor, in leased batches; seek replays; the log rotates by TRUNCATE and leaves no dead
tuples while the xmin horizon is pinned, without holding publishers up."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import queue_service_pb2_grpc, stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from postbox_client import AsyncClient, Client
from postbox_client.errors import NotFound
from support import (
    ServerProcess,
    create_database,
    create_queue,
    drop_database,
    error_of,
    eventually,
    publish_bodies,
    receive,
    seconds,
    unique_name,
    until,
)

HOUR = 3600.0


def new_stream(topics, hint: str, retention: float = HOUR) -> str:
    name = unique_name(hint)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(retention)))
    )
    return name


@pytest.fixture
def stream(topics, request: pytest.FixtureRequest) -> str:
    return new_stream(topics, request.node.name)


# Whether every row of the topic is final: no transaction older than its own runs.
FINAL = """
SELECT coalesce(bool_and(l.tx < pg_snapshot_xmin(pg_current_snapshot())), true)
FROM postbox.stream_log l JOIN postbox.topics t ON t.id = l.topic_id WHERE t.name = $1
"""


def create_group(streams, topic: str, name: str, **start) -> spb.ConsumerGroup:
    group = spb.ConsumerGroup(topic=topic, name=name)
    request = spb.CreateConsumerGroupRequest(consumer_group=group, **start)
    return streams.CreateConsumerGroup(request).consumer_group


def read(streams, topic: str, group: str, **options) -> spb.ReadStreamResponse:
    return streams.ReadStream(spb.ReadStreamRequest(topic=topic, consumer_group=group, **options))


def take(streams, topic: str, group: str, n: int, **options) -> spb.ReadStreamResponse:
    """A batch of n messages: it waits for rows whose transactions are still ending (a
    row is read only once every older transaction has ended, see 66_streams.sql)."""
    options.setdefault("max_messages", max(n, 100))
    return read(streams, topic, group, min_messages=n, wait_time=seconds(10), **options)


def ack(streams, topic: str, group: str, batch: str) -> int:
    request = spb.AckStreamRequest(topic=topic, consumer_group=group, batch=batch)
    return streams.AckStream(request).cursor_offset


def get_group(streams, topic: str, group: str) -> spb.ConsumerGroup:
    return streams.GetConsumerGroup(
        spb.GetConsumerGroupRequest(topic=topic, name=group)
    ).consumer_group


def bodies(response: spb.ReadStreamResponse) -> list[bytes]:
    return [m.body for m in response.messages]


def test_two_groups_each_read_everything_once_and_queue_subscriptions_still_get_theirs(
    topics, streams, queues, messages, stream
):
    queue = create_queue(queues, unique_name("beside_stream")).name
    topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="q", topic=stream, queue=queue)
        )
    )
    sent = [f"m{i}".encode() for i in range(15)]
    publish_bodies(topics, stream, *sent[:10])
    for body in sent[10:]:
        topics.Publish(tpb.PublishRequest(topic=stream, body=body, routing_key="a.b"))
    for group in ("one", "two"):
        assert create_group(streams, stream, group).lag_messages == 15
    for group in ("one", "two"):
        batch = take(streams, stream, group, 15)
        assert bodies(batch) == sent
        assert batch.delivery_count == 1
        offsets = [m.offset for m in batch.messages]
        assert offsets == sorted(offsets)
        assert batch.messages[-1].routing_key == "a.b"
        assert ack(streams, stream, group, batch.batch) == offsets[-1]
        assert read(streams, stream, group).batch == ""
        assert get_group(streams, stream, group).lag_messages == 0
    assert sorted(
        m.body for m in receive(messages, queue, 10) + receive(messages, queue, 10)
    ) == sorted(sent)


def test_an_unacked_batch_comes_back_whole_after_its_lease(topics, streams, stream):
    publish_bodies(topics, stream, b"a", b"b", b"c")
    create_group(streams, stream, "g")
    first = take(streams, stream, "g", 2, max_messages=2, lease_duration=seconds(1))
    assert bodies(first) == [b"a", b"b"]
    # Out with the first reader: nobody else gets a batch of the group meanwhile.
    assert read(streams, stream, "g").batch == ""
    assert get_group(streams, stream, "g").HasField("lease_expire_time")
    again = read(streams, stream, "g", max_messages=10, wait_time=seconds(10))
    assert bodies(again) == [b"a", b"b"]  # the same batch, not a bigger one
    assert again.delivery_count == 2
    assert again.batch != first.batch
    error = error_of(ack, streams, stream, "g", first.batch)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "lease ran out" in error.details()
    ack(streams, stream, "g", again.batch)
    assert bodies(take(streams, stream, "g", 1)) == [b"c"]


def test_ack_moves_the_cursor_and_lag_goes_to_zero(topics, streams, stream):
    publish_bodies(topics, stream, *(str(i).encode() for i in range(5)))
    created = create_group(streams, stream, "g")
    assert created.cursor_offset == 0
    assert not created.HasField("ack_time")
    lagging = get_group(streams, stream, "g")
    assert lagging.lag_messages == 5
    assert lagging.lag.ToTimedelta() >= timedelta(0)
    batch = take(streams, stream, "g", 3, max_messages=3)
    assert ack(streams, stream, "g", batch.batch) == batch.messages[-1].offset
    group = get_group(streams, stream, "g")
    assert (group.lag_messages, group.cursor_offset) == (2, batch.messages[-1].offset)
    assert group.HasField("ack_time")
    assert not group.HasField("lease_expire_time")
    ack(streams, stream, "g", read(streams, stream, "g").batch)
    group = get_group(streams, stream, "g")
    assert (group.lag_messages, group.lag.ToTimedelta()) == (0, timedelta(0))
    listed = streams.ListConsumerGroups(spb.ListConsumerGroupsRequest(topic=stream))
    assert [(g.name, g.lag_messages) for g in listed.consumer_groups] == [("g", 0)]


async def test_a_group_starts_at_the_earliest_the_latest_or_a_time(topics, streams, stream, db):
    publish_bodies(topics, stream, b"old")
    # Until then, "latest" errs towards reading it: it may still be held back.
    await until(db, FINAL, stream)
    create_group(streams, stream, "latest", start=spb.STREAM_START_LATEST)
    create_group(streams, stream, "earliest", start=spb.STREAM_START_EARLIEST)
    create_group(streams, stream, "default")
    publish_bodies(topics, stream, b"new1", b"new2")
    assert bodies(take(streams, stream, "latest", 2)) == [b"new1", b"new2"]
    everything = take(streams, stream, "earliest", 3)
    assert bodies(everything) == [b"old", b"new1", b"new2"]
    assert bodies(take(streams, stream, "default", 3)) == [b"old", b"new1", b"new2"]
    since = everything.messages[1].publish_time
    create_group(streams, stream, "timed", start=spb.STREAM_START_TIME, start_time=since)
    assert bodies(take(streams, stream, "timed", 2)) == [b"new1", b"new2"]


def test_seek_back_replays_and_calls_back_the_batch_out(topics, streams, stream):
    for i in range(6):  # one publish each: each its own publish time
        publish_bodies(topics, stream, str(i).encode())
    create_group(streams, stream, "g")
    batch = take(streams, stream, "g", 6)
    ack(streams, stream, "g", batch.batch)
    third = batch.messages[2]

    def seek(**target) -> spb.ConsumerGroup:
        request = spb.SeekConsumerGroupRequest(topic=stream, consumer_group="g", **target)
        return streams.SeekConsumerGroup(request).consumer_group

    assert seek(offset=third.offset).lag_messages == 4
    replay = take(streams, stream, "g", 4)
    assert bodies(replay) == [b"2", b"3", b"4", b"5"]
    # The batch out is called back by a seek: its ack no longer counts.
    assert seek(time=batch.messages[4].publish_time).lag_messages == 2
    assert error_of(ack, streams, stream, "g", replay.batch).code() == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    assert bodies(take(streams, stream, "g", 2)) == [b"4", b"5"]
    # Past the end: what is published from now on.
    past = seek(offset=2**62)
    assert past.lag_messages == 0
    publish_bodies(topics, stream, b"next")
    assert bodies(take(streams, stream, "g", 1)) == [b"next"]


def test_batch_controls_wait_for_min_messages_or_max_batch_wait(topics, streams, stream):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"1", b"2", b"3")
    held = {"min_messages": 5, "max_batch_wait": seconds(HOUR)}
    assert read(streams, stream, "g", **held).batch == ""
    publish_bodies(topics, stream, b"4", b"5")
    assert bodies(read(streams, stream, "g", wait_time=seconds(10), **held)) == [
        b"1",
        b"2",
        b"3",
        b"4",
        b"5",
    ]
    # Ten wanted, but the first has waited max_batch_wait (0): out it goes (all five:
    # group g read them, so their transactions have ended).
    create_group(streams, stream, "h")
    impatient = read(streams, stream, "h", min_messages=10, max_batch_wait=seconds(0))
    assert len(impatient.messages) == 5


def test_a_waiting_read_takes_what_is_published_meanwhile(topics, streams, stream):
    create_group(streams, stream, "g")
    result: list[spb.ReadStreamResponse] = []
    reader = threading.Thread(
        target=lambda: result.append(read(streams, stream, "g", wait_time=seconds(15)))
    )
    reader.start()
    publish_bodies(topics, stream, b"late")
    reader.join(20)
    assert bodies(result[0]) == [b"late"]


async def test_a_streaming_read_hands_out_the_next_batch_once_the_one_before_is_acked(
    topics, streams, stream, aio_channel
):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"a", b"b")
    publish_bodies(topics, stream, b"c")
    stub = stream_service_pb2_grpc.StreamServiceStub(aio_channel)
    call = stub.StreamingReadStream(
        spb.StreamingReadStreamRequest(topic=stream, consumer_group="g", max_messages=2)
    )
    try:
        first = await asyncio.wait_for(call.read(), 15)
        assert [m.body for m in first.messages] == [b"a", b"b"]
        assert get_group(streams, stream, "g").HasField("lease_expire_time")
        ack(streams, stream, "g", first.batch)
        second = await asyncio.wait_for(call.read(), 15)
        assert ([m.body for m in second.messages], second.delivery_count) == ([b"c"], 1)
        ack(streams, stream, "g", second.batch)
    finally:
        call.cancel()
    assert get_group(streams, stream, "g").lag_messages == 0


async def test_concurrent_readers_of_a_group_never_get_the_same_batch(
    topics, streams, stream, database_url
):
    publish_bodies(topics, stream, b"a", b"b")
    create_group(streams, stream, "g")
    first = await asyncpg.connect(database_url)
    try:
        await until(first, FINAL, stream)
        await first.execute("BEGIN")
        rows = await first.fetch("SELECT batch, body FROM postbox.read_stream($1, 'g')", stream)
        assert [r["body"] for r in rows] == [b"a", b"b"]
        # The first reader's transaction holds the group: a second reader gets nothing,
        # rather than waiting for it or reading the same rows...
        assert read(streams, stream, "g").batch == ""
        await first.execute("COMMIT")
        # ...nor once the first reader's batch is out under its lease.
        assert read(streams, stream, "g").batch == ""
        ack(streams, stream, "g", str(rows[0]["batch"]))
    finally:
        await first.close()


def test_many_readers_of_a_group_share_its_messages_without_overlap(topics, streams, stream):
    for round_ in range(6):
        publish_bodies(topics, stream, *(f"{round_}.{i}".encode() for i in range(10)))
    create_group(streams, stream, "g")
    taken: list[list[int]] = []
    lock = threading.Lock()

    def consume() -> None:
        for _ in range(200):
            with lock:
                if sum(map(len, taken)) >= 60:
                    return
            batch = read(streams, stream, "g", max_messages=7, wait_time=seconds(0.2))
            if batch.batch:
                with lock:
                    taken.append([m.offset for m in batch.messages])
                ack(streams, stream, "g", batch.batch)

    readers = [threading.Thread(target=consume) for _ in range(6)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(60)
    offsets = [offset for batch in taken for offset in batch]
    assert len(offsets) == len(set(offsets)) == 60
    assert offsets == sorted(offsets)  # batches went out one after another, in order


async def test_a_publish_in_an_open_transaction_holds_reads_back_rather_than_being_skipped(
    topics, streams, stream, db, database_url
):
    create_group(streams, stream, "g")
    writer = await asyncpg.connect(database_url)
    try:
        await writer.execute("BEGIN")
        await writer.execute("SELECT publish_id FROM postbox.publish($1, 'first')", stream)
        publish_bodies(topics, stream, b"second")  # commits while the first is still open
        assert read(streams, stream, "g").batch == ""
        await writer.execute("COMMIT")
        assert bodies(take(streams, stream, "g", 2)) == [b"first", b"second"]
    finally:
        await writer.close()


async def test_the_sdk_reader_acks_what_its_handler_returns_and_gets_back_what_it_raises(
    topics, streams, stream, server
):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"a", b"b", b"c")
    seen: list[tuple[int, list[bytes]]] = []
    async with AsyncClient(server.target) as client:
        reader = client.stream_reader(
            stream, "g", min_messages=3, lease=timedelta(seconds=1), wait_time=timedelta(seconds=5)
        )

        async def handle(batch) -> None:
            seen.append((batch.delivery_count, [m.body for m in batch.messages]))
            if batch.delivery_count == 1:
                raise RuntimeError("the first delivery fails")
            reader.stop()  # the loop ends after this batch's ack

        await asyncio.wait_for(reader.run(handle), 30)
    assert seen == [(1, [b"a", b"b", b"c"]), (2, [b"a", b"b", b"c"])]
    assert get_group(streams, stream, "g").lag_messages == 0


def test_the_blocking_sdk_reader_acks_what_its_handler_returns_and_gets_back_what_it_raises(
    topics, streams, stream, server
):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"a", b"b", b"c")
    seen: list[tuple[int, list[bytes]]] = []
    with Client(server.target) as client:
        reader = client.stream_reader(
            stream, "g", min_messages=3, lease=timedelta(seconds=1), wait_time=timedelta(seconds=5)
        )

        def handle(batch) -> None:
            seen.append((batch.delivery_count, [m.body for m in batch.messages]))
            if batch.delivery_count == 1:
                raise RuntimeError("the first delivery fails")
            reader.stop()  # the loop ends after this batch's ack

        runner = threading.Thread(target=reader.run, args=(handle,))
        runner.start()
        runner.join(30)
        assert not runner.is_alive()
    assert seen == [(1, [b"a", b"b", b"c"]), (2, [b"a", b"b", b"c"])]
    assert get_group(streams, stream, "g").lag_messages == 0


def test_stopping_the_blocking_reader_cancels_its_waiting_read(streams, stream, server):
    create_group(streams, stream, "g")
    with Client(server.target) as client:
        reader = client.stream_reader(stream, "g", wait_time=timedelta(seconds=20))
        runner = threading.Thread(target=reader.run, args=(lambda batch: None,))
        runner.start()
        # The read is out and waiting (nothing is published): stop() must cut it short
        # rather than let it run its 20 s.
        eventually(lambda: reader._waiting is not None, what="a read waiting for a batch")
        reader.stop()
        runner.join(10)
        assert not runner.is_alive()
        with pytest.raises(NotFound, match="consumer group 'absent'"):
            client.stream_reader(stream, "absent").read()


def read_range(streams, topic: str, after=None, until=None, **options):
    request = spb.ReadStreamRangeRequest(topic=topic, after=after, until=until, **options)
    return streams.ReadStreamRange(request)


def position(streams, topic: str, group: str) -> spb.GetStreamPositionResponse:
    return streams.GetStreamPosition(
        spb.GetStreamPositionRequest(topic=topic, consumer_group=group)
    )


def test_a_range_of_the_log_reads_the_same_again_and_a_position_seek_commits_it(
    topics, streams, stream
):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, *(str(i).encode() for i in range(5)))
    start = position(streams, stream, "g").cursor_position
    assert (start.tx, start.offset) == (0, 0)
    # Rows are read once every older transaction has ended (any database's: the
    # horizon is the cluster's); wait for that rather than assume it.
    end = eventually(
        lambda: (p := position(streams, stream, "g").end_position) != start and p,
        what="the publish below the horizon",
    )
    first = read_range(streams, stream, after=start, max_messages=2)
    assert bodies(first) == [b"0", b"1"]
    rest = read_range(streams, stream, after=first.last_position, until=end)
    assert bodies(rest) == [b"2", b"3", b"4"]
    assert rest.last_position == end
    # Replayed: the same rows, and nothing past `until`.
    again = read_range(streams, stream, after=start, until=first.last_position)
    assert bodies(again) == [b"0", b"1"]
    assert again.last_position == first.last_position
    empty = read_range(streams, stream, after=end)
    assert bodies(empty) == []
    assert empty.last_position == end
    # Nothing leased, nothing acked: the group still lags by all 5.
    assert get_group(streams, stream, "g").lag_messages == 5
    request = spb.SeekConsumerGroupRequest(
        topic=stream, consumer_group="g", position=first.last_position
    )
    assert streams.SeekConsumerGroup(request).consumer_group.lag_messages == 3
    assert position(streams, stream, "g").cursor_position == first.last_position
    assert bodies(take(streams, stream, "g", 3)) == [b"2", b"3", b"4"]


def test_positions_only_gives_where_a_range_ends_and_how_many_it_holds_without_messages(
    topics, streams, stream
):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, *(str(i).encode() for i in range(5)))
    publish_bodies(topics, stream, *(str(i).encode() for i in range(5, 7)))
    start = position(streams, stream, "g").cursor_position
    end = eventually(
        lambda: (p := position(streams, stream, "g").end_position) != start and p,
        what="the publishes below the horizon",
    )
    everything = read_range(streams, stream, after=start, until=end, max_messages=1000)
    assert (len(everything.messages), everything.message_count) == (7, 7)
    # The position of the 3rd message, across the two publishing transactions too:
    # as a read of 3 messages ends, with no message sent.
    three = read_range(streams, stream, after=start, max_messages=3, positions_only=True)
    assert (list(three.messages), three.message_count) == ([], 3)
    read_three = read_range(streams, stream, after=start, max_messages=3)
    assert three.last_position == read_three.last_position
    six = read_range(streams, stream, after=start, max_messages=6, positions_only=True)
    assert six.last_position.tx > three.last_position.tx  # the second publish's
    assert six.message_count == 6
    # From one position to the next: the parts of a range, each read alike.
    rest = read_range(
        streams, stream, after=three.last_position, until=end, max_messages=1_000_000,
        positions_only=True,
    )  # fmt: skip
    assert (rest.last_position, rest.message_count) == (end, 4)
    part = read_range(streams, stream, after=three.last_position, until=six.last_position)
    assert (bodies(part), part.message_count) == ([b"3", b"4", b"5"], 3)
    # until bounds it, and a range without messages ends where it starts.
    bounded = read_range(
        streams, stream, after=start, until=three.last_position, max_messages=10,
        positions_only=True,
    )  # fmt: skip
    assert (bounded.last_position, bounded.message_count) == (three.last_position, 3)
    empty = read_range(streams, stream, after=end, positions_only=True)
    assert (empty.last_position, empty.message_count) == (end, 0)
    # The default, as for messages: 100.
    default = read_range(streams, stream, after=start, positions_only=True)
    assert (default.last_position, default.message_count) == (end, 7)
    assert get_group(streams, stream, "g").lag_messages == 7  # nothing read, nothing moved


def test_bad_positions_get_a_precise_error_and_change_nothing(topics, streams, stream):
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"x")
    far = spb.StreamPosition(tx=2**62, offset=0)
    cases = [
        (lambda: read_range(streams, stream, max_messages=1001),
         grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be from 1 to 1000, not 1001"
                                           " (up to 1000000 with positions_only"),
        (lambda: read_range(streams, stream, max_messages=-1),
         grpc.StatusCode.INVALID_ARGUMENT, "max_messages must be from 1 to 1000, not -1"),
        (lambda: read_range(streams, stream, max_messages=1_000_001, positions_only=True),
         grpc.StatusCode.INVALID_ARGUMENT,
         "max_messages must be from 1 to 1000000 with positions_only, not 1000001"),
        (lambda: read_range(streams, stream, max_messages=-5, positions_only=True),
         grpc.StatusCode.INVALID_ARGUMENT,
         "max_messages must be from 1 to 1000000 with positions_only, not -5"),
        (lambda: read_range(streams, stream, after=spb.StreamPosition(offset=-1),
                            positions_only=True),
         grpc.StatusCode.INVALID_ARGUMENT, "after must be a position of 0 or more"),
        (lambda: read_range(streams, stream, after=spb.StreamPosition(tx=5, offset=1),
                            until=spb.StreamPosition(tx=5, offset=0), positions_only=True),
         grpc.StatusCode.INVALID_ARGUMENT, "the range ends at (5, 0), before it starts at (5, 1)"),
        (lambda: read_range(streams, unique_name("absent"), positions_only=True),
         grpc.StatusCode.NOT_FOUND, "does not exist"),
        (lambda: read_range(streams, stream, after=spb.StreamPosition(tx=-1)),
         grpc.StatusCode.INVALID_ARGUMENT, "after must be a position of 0 or more"),
        (lambda: read_range(streams, stream, after=spb.StreamPosition(tx=5, offset=1),
                            until=spb.StreamPosition(tx=5, offset=0)),
         grpc.StatusCode.INVALID_ARGUMENT, "the range ends at (5, 0), before it starts at (5, 1)"),
        (lambda: read_range(streams, unique_name("absent")),
         grpc.StatusCode.NOT_FOUND, "does not exist"),
        (lambda: position(streams, stream, "absent"),
         grpc.StatusCode.NOT_FOUND, "consumer group 'absent'"),
        (lambda: streams.SeekConsumerGroup(
            spb.SeekConsumerGroupRequest(topic=stream, consumer_group="g", position=far)),
         grpc.StatusCode.INVALID_ARGUMENT, "is past the end readers see now"),
        (lambda: streams.SeekConsumerGroup(spb.SeekConsumerGroupRequest(
            topic=stream, consumer_group="g", position=spb.StreamPosition(offset=-1))),
         grpc.StatusCode.INVALID_ARGUMENT, "the position must be of 0 or more"),
    ]  # fmt: skip
    for call, code, text in cases:
        error = error_of(call)
        assert (error.code(), text in error.details()) == (code, True), error.details()
    assert position(streams, stream, "g").cursor_position == spb.StreamPosition()


def test_bad_input_gets_a_precise_error_and_changes_nothing(topics, streams, stream):
    plain = unique_name("plain")
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=plain)))
    create_group(streams, stream, "g")
    publish_bodies(topics, stream, b"x")
    future = Timestamp()
    future.FromDatetime(datetime.now(timezone.utc) + timedelta(hours=1))
    cases = [
        (lambda: create_group(streams, plain, "g"), grpc.StatusCode.FAILED_PRECONDITION,
         "is not a stream topic"),
        (lambda: create_group(streams, stream, "g"), grpc.StatusCode.ALREADY_EXISTS,
         "already exists"),
        (lambda: create_group(streams, stream, "bad name"), grpc.StatusCode.INVALID_ARGUMENT,
         "consumer group name may only contain"),
        (lambda: create_group(streams, stream, "s", start=99), grpc.StatusCode.INVALID_ARGUMENT,
         "start 99 is not a known StreamStart"),
        (lambda: create_group(streams, stream, "s", start=spb.STREAM_START_TIME),
         grpc.StatusCode.INVALID_ARGUMENT, "start_time is required with start time"),
        (lambda: create_group(streams, stream, "s", start_time=future),
         grpc.StatusCode.INVALID_ARGUMENT, "and only with it"),
        (lambda: create_group(streams, stream, "s", start=spb.STREAM_START_TIME, start_time=future),
         grpc.StatusCode.INVALID_ARGUMENT, "is in the future"),
        (lambda: read(streams, stream, "nope"), grpc.StatusCode.NOT_FOUND,
         f"consumer group 'nope' of topic '{stream}' does not exist"),
        (lambda: read(streams, "nope", "g"), grpc.StatusCode.NOT_FOUND,
         "topic 'nope' does not exist"),
        (lambda: read(streams, stream, "g", max_messages=1001), grpc.StatusCode.INVALID_ARGUMENT,
         "max_messages must be from 1 to 1000, not 1001"),
        (lambda: read(streams, stream, "g", max_messages=5, min_messages=6),
         grpc.StatusCode.INVALID_ARGUMENT, "must be from 1 to max_messages (5), not 6"),
        (lambda: read(streams, stream, "g", wait_time=seconds(21)),
         grpc.StatusCode.INVALID_ARGUMENT, "wait_time must be from"),
        (lambda: read(streams, stream, "g", lease_duration=seconds(0.5)),
         grpc.StatusCode.INVALID_ARGUMENT, "lease_duration must be from 1 second to 12 hours"),
        (lambda: read(streams, stream, "g", max_batch_wait=seconds(2 * HOUR)),
         grpc.StatusCode.INVALID_ARGUMENT, "max_batch_wait must be from"),
        (lambda: ack(streams, stream, "g", "not-a-token"), grpc.StatusCode.INVALID_ARGUMENT,
         "is not a batch token"),
        (lambda: ack(streams, stream, "g", "00000000-0000-0000-0000-000000000000"),
         grpc.StatusCode.FAILED_PRECONDITION, "is not the batch out of consumer group 'g'"),
        (lambda: streams.SeekConsumerGroup(
            spb.SeekConsumerGroupRequest(topic=stream, consumer_group="g", offset=-1)),
         grpc.StatusCode.INVALID_ARGUMENT, "to_offset must be 0 or more, not -1"),
        (lambda: streams.SeekConsumerGroup(
            spb.SeekConsumerGroupRequest(topic=stream, consumer_group="g")),
         grpc.StatusCode.INVALID_ARGUMENT, "offset, time or position is required"),
        (lambda: topics.CreateTopic(tpb.CreateTopicRequest(
            topic=tpb.Topic(name=unique_name("short"), stream_retention=seconds(0.5)))),
         grpc.StatusCode.INVALID_ARGUMENT, "stream_retention must be from 1 second to 30 days"),
        (lambda: topics.CreateTopic(tpb.CreateTopicRequest(
            topic=tpb.Topic(name=unique_name("long"), stream_retention=seconds(31 * 24 * HOUR)))),
         grpc.StatusCode.INVALID_ARGUMENT, "stream_retention must be from 1 second to 30 days"),
        (lambda: topics.UpdateTopic(tpb.UpdateTopicRequest(
            topic=tpb.Topic(name=stream), update_mask={"paths": ["stream_retention"]})),
         grpc.StatusCode.FAILED_PRECONDITION, "has consumer groups"),
    ]  # fmt: skip
    for call, code, text in cases:
        error = error_of(call)
        assert (error.code(), text in error.details()) == (code, True), error.details()
    group = get_group(streams, stream, "g")
    assert (group.lag_messages, group.cursor_offset) == (1, 0)
    listed = streams.ListConsumerGroups(spb.ListConsumerGroupsRequest(topic=stream))
    assert [g.name for g in listed.consumer_groups] == ["g"]
    assert topics.GetTopic(tpb.GetTopicRequest(name=stream)).topic.stream_retention.seconds == HOUR


def test_a_topic_becomes_a_stream_and_stops_being_one(topics, streams):
    name = unique_name("turned")
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=name)))
    publish_bodies(topics, name, b"before")
    mask = {"paths": ["stream_retention"]}
    updated = topics.UpdateTopic(
        tpb.UpdateTopicRequest(
            topic=tpb.Topic(name=name, stream_retention=seconds(60)), update_mask=mask
        )
    ).topic
    assert updated.stream_retention.seconds == 60
    create_group(streams, name, "g")
    publish_bodies(topics, name, b"after")
    assert bodies(take(streams, name, "g", 1)) == [b"after"]
    streams.DeleteConsumerGroup(spb.DeleteConsumerGroupRequest(topic=name, name="g"))
    error = error_of(get_group, streams, name, "g")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    plain = topics.UpdateTopic(tpb.UpdateTopicRequest(topic=tpb.Topic(name=name), update_mask=mask))
    assert not plain.topic.HasField("stream_retention")


# Rotation runs on a database of its own: which slots of the log may go depends on
# every stream topic's groups, and pinning the horizon must disturb no other test.


@pytest.fixture(scope="module")
def own_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_streams")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def own_server(own_database: str) -> Iterator[ServerProcess]:
    # The maintenance worker's rotation passes are an hour apart: the tests run their own.
    process = ServerProcess(own_database, "--expiry-interval", str(HOUR)).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def own_channel(own_server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(own_server.target) as channel:
        yield channel


DEAD_IN_LOG = """
SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
WHERE schemaname = 'postbox' AND relname LIKE 'stream_log_%'
"""


async def flush_stats(conn: asyncpg.Connection) -> None:
    """This session's table statistics, out where pg_stat_user_tables reads them."""
    if await conn.fetchval("SELECT to_regproc('pg_stat_force_next_flush') IS NOT NULL"):
        await conn.execute("SELECT pg_stat_force_next_flush()")


async def test_rotation_under_load_with_a_pinned_horizon_truncates_and_leaves_no_dead_tuples(
    own_database, own_channel
):
    topics = topic_service_pb2_grpc.TopicServiceStub(own_channel)
    streams = stream_service_pb2_grpc.StreamServiceStub(own_channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(own_channel)
    stream = new_stream(topics, "rotated", retention=1)
    queue = create_queue(queues, unique_name("fanned")).name
    topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="q", topic=stream, queue=queue)
        )
    )
    create_group(streams, stream, "fast")
    create_group(streams, stream, "slow")
    conn = await asyncpg.connect(own_database)
    pin = await asyncpg.connect(own_database)
    try:
        # A snapshot held on purpose: nothing deleted from now on can be vacuumed.
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.fetchval("SELECT count(*) FROM postbox.queues")
        pinned = await conn.fetchval(
            "SELECT backend_xmin FROM pg_stat_activity WHERE pid = $1", pin.get_server_pid()
        )
        assert pinned is not None

        truncated = 0
        rounds = 0
        while truncated < 3:
            rounds += 1
            assert rounds < 400, f"only {truncated} truncations in {rounds} rounds"
            publish_bodies(topics, stream, *(b"x" * 100 for _ in range(50)))
            batch = read(streams, stream, "fast", max_messages=1000)
            if batch.batch:  # empty while an older transaction is still ending
                ack(streams, stream, "fast", batch.batch)
            # The queue subscription's copies are received and deleted: dead tuples there.
            await conn.execute(
                "SELECT postbox.delete_batch($1, array_agg(r.receipt)) "
                "FROM postbox.receive($1, 1000) r",
                queue,
            )
            if rounds % 5 == 0:
                # The slow group catches up now and then: until it does, its rows stay.
                while (slow := read(streams, stream, "slow", max_messages=1000)).batch:
                    ack(streams, stream, "slow", slow.batch)
            truncated += await conn.fetchval("SELECT postbox.rotate_streams('0')")

        await conn.execute("VACUUM postbox.messages")
        for slot in range(4):
            await conn.execute(f"VACUUM postbox.stream_log_{slot}")
        await flush_stats(conn)
        assert await conn.fetchval(DEAD_IN_LOG) == 0
        # The horizon really was pinned: the queue's deleted copies could not be vacuumed.
        dead_messages = await conn.fetchval(
            "SELECT n_dead_tup FROM pg_stat_user_tables "
            "WHERE schemaname = 'postbox' AND relname = 'messages'"
        )
        assert dead_messages > 0
        assert (
            await conn.fetchval(
                "SELECT backend_xmin FROM pg_stat_activity WHERE pid = $1",
                pin.get_server_pid(),
            )
            == pinned
        )
    finally:
        await pin.close()
        await conn.close()
        # Its rows no longer wait for its groups: the next test's slots can go.
        topics.DeleteTopic(tpb.DeleteTopicRequest(name=stream))


async def test_a_truncate_waiting_for_its_lock_holds_no_publisher_up(own_database, own_channel):
    topics = topic_service_pb2_grpc.TopicServiceStub(own_channel)
    streams = stream_service_pb2_grpc.StreamServiceStub(own_channel)
    stream = new_stream(topics, "locked", retention=1)
    create_group(streams, stream, "g")
    conn = await asyncpg.connect(own_database)
    reader = await asyncpg.connect(own_database)
    rotator = await asyncpg.connect(own_database)
    try:
        publish_bodies(topics, stream, b"old")
        ack(streams, stream, "g", take(streams, stream, "g", 1).batch)
        await conn.fetchval("SELECT postbox.rotate_streams('0')")  # retires the slot "old" is in
        retired = await conn.fetchval(
            "SELECT slot FROM postbox.stream_slots WHERE state = 'retired' "
            "ORDER BY since DESC LIMIT 1"
        )
        # A long reader of the retired slot: its lock keeps TRUNCATE out.
        await reader.execute("BEGIN")
        await reader.fetchval(f"SELECT count(*) FROM postbox.stream_log_{retired}")
        # Wait out the retention, without sleeping blind: until the slot is done.
        await until(
            conn, "SELECT postbox._stream_slot_done(slot, since) FROM postbox.stream_slots "
            "WHERE slot = $1", retired,
        )  # fmt: skip
        # With a short lock_wait, the pass leaves the slot for later and returns.
        assert await conn.fetchval("SELECT postbox.rotate_streams(NULL, '10 milliseconds')") == 0
        # With a long one, it waits for the lock...
        await rotator.execute("BEGIN")
        rotating = asyncio.ensure_future(
            rotator.fetchval("SELECT postbox.rotate_streams(NULL, '10 seconds')")
        )
        await until(
            conn, "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)",
            rotator.get_server_pid(),
        )  # fmt: skip
        # ...and publishers go on meanwhile: they append to the current slot only.
        publish_bodies(topics, stream, b"during")
        assert not rotating.done()
        await reader.execute("COMMIT")
        assert await rotating == 1
        await rotator.execute("COMMIT")
        assert bodies(take(streams, stream, "g", 1)) == [b"during"]
        assert (
            await conn.fetchval("SELECT state FROM postbox.stream_slots WHERE slot = $1", retired)
            == "empty"
        )
    finally:
        for c in (conn, reader, rotator):
            await c.close()
        topics.DeleteTopic(tpb.DeleteTopicRequest(name=stream))


async def test_the_maintenance_worker_rotates_the_log(own_database):
    worker = ServerProcess(own_database, "--expiry-interval", "0.2").start()
    conn = await asyncpg.connect(own_database)
    try:
        with grpc.insecure_channel(worker.target) as channel:
            topics = topic_service_pb2_grpc.TopicServiceStub(channel)
            streams = stream_service_pb2_grpc.StreamServiceStub(channel)
            stream = new_stream(topics, "by_worker", retention=1)
            create_group(streams, stream, "g")
            publish_bodies(topics, stream, b"a", b"b")
            ack(streams, stream, "g", take(streams, stream, "g", 2).batch)
            # Retired once its slot is half a retention old, truncated a retention later.
            await until(
                conn, "SELECT NOT EXISTS (SELECT FROM postbox.stream_log l "
                "JOIN postbox.topics t ON t.id = l.topic_id WHERE t.name = $1)", stream,
            )  # fmt: skip
            assert get_group(streams, stream, "g").lag_messages == 0
    finally:
        await conn.close()
        worker.stop()
