"""Health of stream topics in SQL: postbox.stream_health gives each consumer group's lag,
oldest unacknowledged age, retries, dead letters, pause, stuck state and the log slots
it holds back; postbox.stream_rotation each slot and who holds it; postbox.stream_latency
the publish-to-first-read latency percentiles over recent windows."""

from __future__ import annotations

import math

import asyncpg
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from support import seconds, unique_name

HEALTH = "SELECT * FROM postbox.stream_health WHERE topic = $1 AND consumer_group = $2"


@pytest.fixture
def stream(topics, streams, request: pytest.FixtureRequest) -> str:
    """A stream topic with a, b, c and a group `g` reading from the earliest."""
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    entries = [tpb.PublishBatchEntry(body=body) for body in (b"a", b"b", b"c")]
    topics.PublishBatch(tpb.PublishBatchRequest(topic=name, entries=entries))
    group = spb.ConsumerGroup(topic=name, name="g", max_deliveries=1)
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return name


def take(streams, topic: str, n: int) -> spb.ReadStreamResponse:
    request = spb.ReadStreamRequest(
        topic=topic, consumer_group="g", min_messages=n, wait_time=seconds(10)
    )
    return streams.ReadStream(request)


def ack(streams, topic: str, batch: str, nack=()) -> None:
    request = spb.AckStreamRequest(
        topic=topic, consumer_group="g", batch=batch, nack_offsets=list(nack)
    )
    streams.AckStream(request)


async def test_a_group_that_keeps_up_is_ok_with_its_latency(streams, stream, db):
    row = await db.fetchrow(HEALTH, stream, "g")
    assert (row["status"], row["lag_messages"], row["last_read_at"]) == ("ok", 3, None)
    batch = take(streams, stream, 3)
    ack(streams, stream, batch.batch)
    row = await db.fetchrow(HEALTH, stream, "g")
    assert (row["status"], row["reason"], row["lag_messages"]) == ("ok", "", 0)
    assert row["oldest_unacked_seconds"] == 0
    assert row["last_read_at"] is not None
    latency = await db.fetchrow(
        "SELECT * FROM postbox.stream_latency('1 minute') WHERE topic = $1", stream
    )
    assert latency["messages"] == 3  # first reads only, counted once per message
    assert 0 < latency["p50_seconds"] <= latency["p95_seconds"] <= latency["p99_seconds"]
    assert math.isfinite(latency["p99_seconds"])
    assert row["latency_p99_seconds"] == latency["p99_seconds"]
    with pytest.raises(asyncpg.PostgresError, match="recent must be from 10 seconds to 1 hour"):
        await db.fetch("SELECT * FROM postbox.stream_latency('1 second')")


async def test_latency_percentiles_are_the_bounds_of_their_bins(db, topics, streams, stream):
    group_id = await db.fetchval(
        "SELECT g.id FROM postbox.consumer_groups g JOIN postbox.topics t ON t.id = g.topic_id"
        " WHERE t.name = $1",
        stream,
    )
    # 100 reads: 90 in the 5 ms bin, 9 in the 1 s bin, 1 above 30 minutes.
    counts = [90, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1]
    await db.execute(
        "INSERT INTO postbox.stream_latency (group_id, bucket, counts) VALUES ($1, now(), $2)",
        group_id,
        counts,
    )
    row = await db.fetchrow(
        "SELECT * FROM postbox.stream_latency('1 minute') WHERE topic = $1", stream
    )
    assert (row["messages"], row["p50_seconds"], row["p95_seconds"]) == (100, 0.005, 1.0)
    assert row["p99_seconds"] == 1.0  # the 99th of 100 is in the 1 s bin
    await db.execute(
        "UPDATE postbox.stream_latency SET counts[16] = 2 WHERE group_id = $1", group_id
    )
    row = await db.fetchrow(
        "SELECT * FROM postbox.stream_latency('1 minute') WHERE topic = $1", stream
    )
    assert row["p99_seconds"] == math.inf  # past the last bound: not understated


@pytest.mark.parametrize(
    ("ages", "counts"),
    [
        # 40 s, 100 s and 2 hours: the (30 s, 60 s], (60 s, 300 s] and last (past 30
        # minutes) bins, one message each, with room for a slow read.
        (("40 seconds", "100 seconds", "2 hours"), [0] * 12 + [1, 1, 0, 1]),
        # All three in one bin: it takes the batch's count.
        (("100 seconds", "110 seconds", "120 seconds"), [0] * 13 + [3, 0, 0]),
    ],
)
async def test_a_read_counts_each_message_in_the_bin_of_its_latency(
    db, streams, stream, ages, counts
):
    await db.execute(
        "UPDATE postbox.stream_log l SET published_at = now() - CASE convert_from(l.body, 'UTF8')"
        " WHEN 'a' THEN $2::text::interval WHEN 'b' THEN $3::text::interval"
        " ELSE $4::text::interval END"
        " FROM postbox.topics t WHERE t.id = l.topic_id AND t.name = $1",
        stream,
        *ages,
    )
    take(streams, stream, 3)
    counted = await db.fetchval(
        "SELECT s.counts FROM postbox.stream_latency s JOIN postbox.consumer_groups g"
        " ON g.id = s.group_id JOIN postbox.topics t ON t.id = g.topic_id WHERE t.name = $1",
        stream,
    )
    assert counted == counts


async def test_pause_dead_letters_stuck_and_age_show_in_status_and_reason(streams, stream, db):
    batch = take(streams, stream, 3)
    ack(streams, stream, batch.batch, nack=[batch.messages[0].offset])  # max_deliveries 1
    row = await db.fetchrow(HEALTH, stream, "g")
    assert (row["status"], row["reason"], row["dead_letters"]) == ("warning", "1 dead letters", 1)
    streams.PauseConsumerGroup(spb.PauseConsumerGroupRequest(topic=stream, name="g"))
    row = await db.fetchrow(HEALTH, stream, "g")
    assert row["reason"] == "1 dead letters; paused"
    streams.ResumeConsumerGroup(spb.ResumeConsumerGroupRequest(topic=stream, name="g"))
    await db.execute("SELECT FROM postbox.publish($1, 'd')", stream)
    # No batch for an hour while d waits: stuck (moved back, not waited for).
    await db.execute(
        "UPDATE postbox.consumer_groups g SET read_at = now() - interval '1 hour'"
        " FROM postbox.topics t WHERE t.id = g.topic_id AND t.name = $1",
        stream,
    )
    row = await db.fetchrow(HEALTH, stream, "g")
    assert row["status"] == "warning"
    assert "stuck: no batch taken for 3600 s while 1 messages wait" in row["reason"]
    async with db.transaction():
        await db.execute("SET LOCAL postbox.health_critical_age = '1 microsecond'")
        row = await db.fetchrow(HEALTH, stream, "g")
        assert row["status"] == "critical"
        assert row["reason"].startswith("oldest unacknowledged message ")
        assert row["oldest_unacked_seconds"] > 0


async def test_rotation_shows_which_groups_hold_a_retired_slot(streams, stream, db):
    # A rotation pass with no period retires the current slot, which holds a, b, c.
    await db.execute("SELECT postbox.rotate_streams('0 seconds')")
    rotation = await db.fetch("SELECT * FROM postbox.stream_rotation")
    held = [r for r in rotation if f"{stream}/g" in r["held_by"]]
    assert len(held) == 1
    assert held[0]["state"] == "retired"
    assert held[0]["messages"] >= 3
    assert [r["state"] for r in rotation].count("current") == 1
    assert (await db.fetchrow(HEALTH, stream, "g"))["held_slots"] == 1
    ack(streams, stream, take(streams, stream, 3).batch)
    assert (await db.fetchrow(HEALTH, stream, "g"))["held_slots"] == 0
    rotation = await db.fetch("SELECT * FROM postbox.stream_rotation")
    assert not [r for r in rotation if f"{stream}/g" in r["held_by"]]
