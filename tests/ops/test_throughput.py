"""Recent throughput and receive latency per queue: each server process's counts, flushed
into postbox.queue_activity, read through the postbox.queue_throughput view, GetQueue's
rates and `postbox status`, with two real server processes whose counts must add up."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import grpc
import pytest
import yaml
from postbox.v1 import (
    message_service_pb2 as mpb,
)
from postbox.v1 import (
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)
from support import ServerProcess, create_queue, eventually, receive, stats, unique_name

POSTBOX = Path(sys.executable).with_name("postbox")
# Flushes this often, so a figure shows within a second; the waits below allow far more
# (a loaded machine), and end as soon as the figure is there.
FLUSH = "0.2"
DEADLINE = 30.0
MINUTE = timedelta(minutes=1)


@pytest.fixture(scope="module")
def two_servers(database_url: str) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two server processes on one database, as two replicas are; one after the other, so
    that only the first installs the engine."""
    flags = ("--activity-interval", FLUSH, "--expiry-interval", "0.5")
    first = ServerProcess(database_url, *flags).start()
    second = ServerProcess(database_url, *flags).start()
    yield first, second
    second.stop()
    first.stop()


def _throughput(database_url: str, queue: str, span: timedelta = MINUTE) -> dict | None:
    async def read() -> dict | None:
        conn = await asyncpg.connect(database_url)
        try:
            row = await conn.fetchrow(
                "SELECT * FROM postbox.queue_throughput WHERE queue_name = $1 AND span = $2",
                queue,
                span,
            )
        finally:
            await conn.close()
        return None if row is None else dict(row)

    return asyncio.run(read())


def _postbox(*args: str) -> str:
    result = subprocess.run(
        [str(POSTBOX), *args], capture_output=True, text=True, timeout=30, env=os.environ
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_two_servers_counts_add_up_in_the_view_and_in_status(two_servers, database_url):
    first, second = two_servers
    with grpc.insecure_channel(first.target) as a, grpc.insecure_channel(second.target) as b:
        queues_a = queue_service_pb2_grpc.QueueServiceStub(a)
        messages_a = message_service_pb2_grpc.MessageServiceStub(a)
        messages_b = message_service_pb2_grpc.MessageServiceStub(b)
        name = create_queue(queues_a, unique_name("throughput")).name
        # Sent: 3 single Sends through the first server, a batch of 4 through the second.
        for i in range(3):
            messages_a.Send(mpb.SendRequest(queue=name, body=f"a{i}".encode()))
        messages_b.SendBatch(
            mpb.SendBatchRequest(
                queue=name, entries=[mpb.SendBatchEntry(body=f"b{i}".encode()) for i in range(4)]
            )
        )
        # Received: 5 through the first; deleted: 2 through each server (one batch).
        got = eventually(lambda: receive(messages_a, name, count=5, visibility=300), DEADLINE)
        while len(got) < 5:
            got += receive(messages_a, name, count=5 - len(got), visibility=300)
        messages_a.Delete(mpb.DeleteRequest(queue=name, receipt=got[0].receipt))
        messages_a.Delete(mpb.DeleteRequest(queue=name, receipt=got[1].receipt))
        messages_b.DeleteBatch(
            mpb.DeleteBatchRequest(queue=name, receipts=[m.receipt for m in got[2:4]])
        )

        # Both processes' flushes land in the same rows, neither overwriting the other.
        row = eventually(
            lambda: (
                (r := _throughput(database_url, name))
                and (r["sent"], r["received"], r["deleted"]) == (7, 5, 4)
                and r
            ),
            DEADLINE,
            "7 sent, 5 received, 4 deleted in the last minute",
        )
        assert row["sent_per_second"] > 0
        assert row["received_per_second"] > 0
        assert row["deleted_per_second"] > 0
        # The first deliveries' waits from enqueue: measured, and the mean within the max.
        assert row["receive_latency_avg_seconds"] is not None
        assert 0 <= row["receive_latency_avg_seconds"] <= row["receive_latency_max_seconds"] < 60
        # Every window holds what the last minute holds; the rate is over a longer span.
        longer = _throughput(database_url, name, 15 * MINUTE)
        assert (longer["sent"], longer["received"], longer["deleted"]) == (7, 5, 4)
        assert longer["sent_per_second"] < row["sent_per_second"]

        # GetQueue reports the last minute's rates, whichever server answers.
        for channel in (a, b):
            figures = stats(queue_service_pb2_grpc.QueueServiceStub(channel), name)
            assert figures.sent_per_second == pytest.approx(row["sent_per_second"], rel=0.5)
            assert figures.received_per_second > 0

    target = ["--target", second.target]
    rows = {r["name"]: r for r in json.loads(_postbox("status", "-o", "json", *target))}
    assert rows[name]["sent_per_s"] > 0
    assert rows[name]["received_per_s"] > 0
    assert set(rows[name]) >= {"sent_per_s", "received_per_s", "paused"}
    documents = yaml.safe_load(_postbox("status", "-o", "yaml", *target))
    assert {d["name"]: d for d in documents}[name]["received_per_s"] > 0
    table = _postbox("status", *target)
    header = table.splitlines()[0]
    assert "sent_per_s" in header
    assert "received_per_s" in header


def test_status_watch_shows_the_rates_each_round(two_servers):
    first, _ = two_servers
    with grpc.insecure_channel(first.target) as channel:
        name = create_queue(queue_service_pb2_grpc.QueueServiceStub(channel), unique_name("w")).name
    # --watch runs until stopped: read two rounds of JSON, then end it.
    watch = subprocess.Popen(
        [str(POSTBOX), "status", "--watch", "0.2", "-o", "json", "--target", first.target],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        decoder, text, rounds = json.JSONDecoder(), "", []
        assert watch.stdout is not None
        while len(rounds) < 2:
            line = watch.stdout.readline()
            assert line, "status --watch ended"
            text += line
            if line.startswith("]"):  # the end of one round's list
                rounds.append(decoder.decode(text))
                text = ""
    finally:
        watch.terminate()
        watch.wait(10)
    for listed in rounds:
        row = {r["name"]: r for r in listed}[name]
        assert (row["sent_per_s"], row["received_per_s"]) == (0, 0)  # zeros are shown


def test_topic_fan_out_counts_as_sent_and_sql_sends_do_not(two_servers, database_url):
    first, _ = two_servers
    with grpc.insecure_channel(first.target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        name = create_queue(queues, unique_name("fanout")).name
        topic = unique_name("fanout_topic")
        topics.CreateTopic(
            topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name=topic))
        )
        topics.CreateSubscription(
            topic_service_pb2.CreateSubscriptionRequest(
                subscription=topic_service_pb2.Subscription(name="s", topic=topic, queue=name)
            )
        )

        async def send_in_sql() -> None:
            conn = await asyncpg.connect(database_url)
            try:
                await conn.execute("SELECT postbox.send($1, 'from sql')", name)
            finally:
                await conn.close()

        # First the SQL send, the limit docs/operations/monitoring.md states: it passes no server.
        asyncio.run(send_in_sql())
        for _ in range(2):
            topics.Publish(topic_service_pb2.PublishRequest(topic=topic, body=b"x"))
        eventually(
            lambda: (r := _throughput(database_url, name)) and r["sent"] == 2,
            DEADLINE,
            "the 2 published messages counted as sent",
        )
        assert stats(queues, name).visible_messages == 3


def test_the_maintenance_worker_forgets_activity_older_than_an_hour(two_servers, database_url):
    first, _ = two_servers
    with grpc.insecure_channel(first.target) as channel:
        name = create_queue(
            queue_service_pb2_grpc.QueueServiceStub(channel), unique_name("old")
        ).name

    async def run(statement: str, *args: object) -> object:
        conn = await asyncpg.connect(database_url)
        try:
            return await conn.fetchval(statement, *args)
        finally:
            await conn.close()

    # An hour and a bit ago, and now: only the first is past keeping.
    for age in (61 * MINUTE, timedelta()):
        asyncio.run(
            run(
                "INSERT INTO postbox.queue_activity (queue_id, bucket, sent) "
                "SELECT id, date_bin('10 seconds', now() - $2::interval, 'epoch'), 1 "
                "FROM postbox.queues WHERE name = $1",
                name,
                age,
            )
        )
    count = (
        "SELECT count(*) FROM postbox.queue_activity a"
        " JOIN postbox.queues q ON q.id = a.queue_id WHERE q.name = $1"
    )
    # The servers sweep every 0.5 s (--expiry-interval).
    eventually(lambda: asyncio.run(run(count, name)) == 1, DEADLINE, "the old row swept")
    assert _throughput(database_url, name)["sent"] == 1
    with pytest.raises(asyncpg.InvalidParameterValueError, match="30 seconds to 1 hour"):
        asyncio.run(run("SELECT count(*) FROM postbox.queue_rates('10 seconds')"))
