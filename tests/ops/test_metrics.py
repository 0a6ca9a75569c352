"""Prometheus metrics through the real server: gRPC calls, message flow, queue depths, workers."""

from __future__ import annotations

import contextlib
import time
import urllib.request
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import (
    ServerProcess,
    eventually,
    free_port,
    metric,
    scrape,
    seconds,
    unique_name,
    until,
)


class MetricsServer:
    def __init__(self, database_url: str, *args: str) -> None:
        self.process = ServerProcess(database_url, *args, metrics=True)
        assert self.process.metrics_port is not None
        self.metrics_port = self.process.metrics_port

    def scrape(self) -> dict[tuple[str, frozenset], float]:
        return scrape(self.metrics_port)


@contextlib.contextmanager
def running(server: MetricsServer) -> Iterator[MetricsServer]:
    server.process.start()
    try:
        yield server
    finally:
        server.process.stop()


@pytest.fixture(scope="module")
def observed(database_url: str) -> Iterator[MetricsServer]:
    with running(MetricsServer(database_url, "--metrics-max-queues", "5000")) as server:
        yield server


@pytest.fixture(scope="module")
def stubs(observed: MetricsServer):
    with grpc.insecure_channel(observed.process.target) as channel:
        yield (
            queue_service_pb2_grpc.QueueServiceStub(channel),
            message_service_pb2_grpc.MessageServiceStub(channel),
        )


def test_rpcs_and_messages_are_counted_by_method_code_and_queue(observed, stubs):
    queues, messages = stubs
    name = unique_name("metrics_flow")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    before = observed.scrape()
    messages.Send(pb.SendRequest(queue=name, body=b"one"))
    messages.SendBatch(pb.SendBatchRequest(queue=name, entries=[pb.SendBatchEntry(body=b"x")] * 4))
    received = [
        m
        for batch in messages.Receive(
            pb.ReceiveRequest(queue=name, max_messages=10, wait_time=seconds(0))
        )
        for m in batch.messages
    ]
    assert len(received) == 5
    messages.DeleteBatch(
        pb.DeleteBatchRequest(queue=name, receipts=[m.receipt for m in received[:3]])
    )
    with pytest.raises(grpc.RpcError) as missing:
        messages.Send(pb.SendRequest(queue=unique_name("metrics_missing"), body=b"x"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    send = {
        "grpc_type": "unary",
        "grpc_service": "postbox.v1.MessageService",
        "grpc_method": "Send",
    }

    receive = {
        "grpc_type": "server_stream",
        "grpc_service": "postbox.v1.MessageService",
        "grpc_method": "Receive",
    }

    # A call is counted as handled when its handler has returned, which can be just after
    # the client has its status: an aborted call's status goes out first.
    def all_handled() -> dict | None:
        samples = observed.scrape()
        counted = [
            metric(samples, "grpc_server_handling_seconds_count", **labels)
            - metric(before, "grpc_server_handling_seconds_count", **labels)
            for labels in (send, receive)
        ]
        return samples if counted == [2, 1] else None

    after = eventually(all_handled, what="both Sends and the Receive counted as handled")
    assert isinstance(after, dict)

    def grew(name_: str, **labels: str) -> float:
        return metric(after, name_, **labels) - metric(before, name_, **labels)

    assert grew("grpc_server_started_total", **send) == 2
    assert grew("grpc_server_handled_total", **send, grpc_code="OK") == 1
    assert grew("grpc_server_handled_total", **send, grpc_code="NOT_FOUND") == 1
    assert grew("grpc_server_handling_seconds_count", **send) == 2
    assert grew("grpc_server_handled_total", **receive, grpc_code="OK") == 1
    assert grew("postbox_messages_sent_total", queue=name) == 5
    assert grew("postbox_messages_received_total", queue=name) == 5
    assert grew("postbox_messages_deleted_total", queue=name) == 3
    assert grew("postbox_group_commit_batch_size_count") >= 1  # the single Send went through it
    assert ("postbox_group_commit_pending", frozenset()) in after
    assert metric(after, "postbox_group_commit_pending") == 0  # and was answered
    # Depths come from the database at scrape time: 2 in flight, none visible.
    assert metric(after, "postbox_queue_messages_in_flight", queue=name) == 2
    assert metric(after, "postbox_queue_messages_visible", queue=name) == 0
    assert metric(after, "postbox_queue_paused", queue=name) == 0
    assert metric(after, "postbox_db_pool_connections", state="idle") >= 1


def test_queue_depths_include_the_dead_letter_queue_and_oldest_age(observed, stubs):
    queues, messages = stubs
    dlq, source = unique_name("metrics_dlq"), unique_name("metrics_src")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=dlq)))
    queues.CreateQueue(
        qpb.CreateQueueRequest(
            queue=qpb.Queue(
                name=source,
                dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=1),
            )
        )
    )
    messages.Send(pb.SendRequest(queue=dlq, body=b"dead"))
    messages.Send(pb.SendRequest(queue=source, body=b"later", delay=seconds(300)))
    started = time.monotonic()
    samples = observed.scrape()
    assert metric(samples, "postbox_queue_dead_letter_messages", queue=source) == 1
    # A queue without a dead-letter queue has no such series.
    assert ("postbox_queue_dead_letter_messages", frozenset({("queue", dlq)})) not in samples
    assert metric(samples, "postbox_queue_messages_delayed", queue=source) == 1
    age = metric(samples, "postbox_queue_oldest_message_age_seconds", queue=dlq)
    assert 0 <= age <= time.monotonic() - started + 60


def _receive(messages, queue: str, **fields) -> list:
    request = pb.ReceiveRequest(queue=queue, max_messages=10, wait_time=seconds(0), **fields)
    return [m for batch in messages.Receive(request) for m in batch.messages]


async def test_expired_and_dead_lettered_messages_are_counted_by_queue(
    observed, stubs, database_url
):
    """By the engine, wherever it happens: a receive that meets expired messages on its
    way, the expiry sweep, and a receive that buries messages received too often."""
    queues, messages = stubs
    met, swept, dlq, source = (
        unique_name(f"metrics_{kind}") for kind in ("met", "swept", "dlq", "source")
    )
    for name in (met, swept, dlq):
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    policy = qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=1)
    queues.CreateQueue(
        qpb.CreateQueueRequest(queue=qpb.Queue(name=source, dead_letter_policy=policy))
    )
    for name, count in ((met, 3), (swept, 2), (source, 2)):
        entries = [pb.SendBatchEntry(body=b"x", ttl=seconds(3600))] * count
        messages.SendBatch(pb.SendBatchRequest(queue=name, entries=entries))

    # On the messages, and where maintenance looks for due ones.
    expire = (
        "WITH m AS (UPDATE postbox.messages SET expires_at = now() - interval '1 s' "
        "WHERE queue_id = (SELECT id FROM postbox.queues WHERE name = $1) "
        "RETURNING id, expires_at) "
        "UPDATE postbox.message_expiries e SET expires_at = m.expires_at FROM m "
        "WHERE e.message_id = m.id"
    )
    conn = await asyncpg.connect(database_url)
    try:
        # In one transaction, so that only this receive can meet them (a sweep
        # would wait for the rows): it delivers nothing and removes all three.
        async with conn.transaction():
            await conn.execute(expire, met)
            assert await conn.fetch("SELECT * FROM postbox.receive($1, 10)", met) == []
        async with conn.transaction():  # and only this sweep
            await conn.execute(expire, swept)
            assert await conn.fetchval("SELECT postbox.expire_messages(1000)") >= 2
    finally:
        await conn.close()
    # Received once (visible again at once), then buried by the next receive.
    assert len(_receive(messages, source, visibility_timeout=seconds(0))) == 2
    assert _receive(messages, source) == []

    samples = observed.scrape()
    assert metric(samples, "postbox_messages_expired_total", queue=met) == 3
    assert metric(samples, "postbox_messages_expired_total", queue=swept) == 2
    assert metric(samples, "postbox_messages_dead_lettered_total", queue=source) == 2
    assert metric(samples, "postbox_messages_expired_total", queue=source) == 0
    assert metric(samples, "postbox_messages_dead_lettered_total", queue=dlq) == 0
    assert metric(samples, "postbox_queue_dead_letter_messages", queue=source) == 2


def test_open_streams_are_counted_while_they_wait(observed, stubs):
    queues, messages = stubs
    name = unique_name("metrics_streams")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    before = metric(observed.scrape(), "postbox_open_streams")
    call = messages.Receive(pb.ReceiveRequest(queue=name, wait_time=seconds(20)))
    try:
        deadline = time.monotonic() + 10
        while metric(observed.scrape(), "postbox_open_streams") < before + 1:
            assert time.monotonic() < deadline, "the waiting stream was never counted"
            time.sleep(0.05)
    finally:
        call.cancel()
    deadline = time.monotonic() + 10
    while metric(observed.scrape(), "postbox_open_streams") > before:
        assert time.monotonic() < deadline, "the cancelled stream stayed counted"
        time.sleep(0.05)


def test_queues_shown_are_capped_in_one_scrape(database_url):
    with running(MetricsServer(database_url, "--metrics-max-queues", "3")) as server:
        samples = server.scrape()
        shown = {
            dict(labels)["queue"]
            for (name, labels) in samples
            if name == "postbox_queue_messages_visible"
        }
        assert len(shown) == 3
        assert metric(samples, "postbox_queues_omitted") == 1  # other tests' queues exist


def test_workers_are_scraped_as_one(database_url):
    grpc_port = free_port()
    server = MetricsServer(database_url, "--workers", "2")
    server.process.port = grpc_port
    with running(server):
        name = unique_name("metrics_workers")
        # Channels of their own: SO_REUSEPORT spreads connections, not calls.
        channels = [grpc.insecure_channel(server.process.target) for _ in range(8)]
        try:
            queue_service_pb2_grpc.QueueServiceStub(channels[0]).CreateQueue(
                qpb.CreateQueueRequest(queue=qpb.Queue(name=name))
            )
            for channel in channels:
                message_service_pb2_grpc.MessageServiceStub(channel).Send(
                    pb.SendRequest(queue=name, body=b"x")
                )
        finally:
            for channel in channels:
                channel.close()
        samples = server.scrape()
        assert metric(samples, "postbox_messages_sent_total", queue=name) == 8
        assert metric(samples, "postbox_queue_messages_visible", queue=name) == 8


def test_the_grafana_dashboard_asks_only_for_families_the_server_serves(observed, stubs):
    import json
    import re
    from pathlib import Path

    import postbox_server.observability

    dashboard = Path(postbox_server.observability.__file__).parent / "grafana-dashboard.json"
    panels = json.loads(dashboard.read_text())["panels"]
    asked = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"\b(?:grpc_server|postbox)_[a-z_]+", target["expr"])
    }
    url = f"http://127.0.0.1:{observed.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        # Every family is declared, with or without samples yet.
        served = set(re.findall(r"^# TYPE (\S+) ", response.read().decode(), re.MULTILINE))
    histogram_parts = re.compile(r"_(bucket|sum|count)$")
    unknown = {name for name in asked if histogram_parts.sub("", name) not in served}
    assert not unknown, unknown


def test_the_sqs_shim_counts_requests_by_action_and_error(observed):
    from support import SqsShimProcess, sqs_client

    metrics_port = free_port()
    shim = SqsShimProcess(
        observed.process.target, "--metrics-port", str(metrics_port), "--metrics-host", "127.0.0.1"
    ).start()
    try:
        sqs = sqs_client(shim.endpoint, "json")
        url = sqs.create_queue(QueueName=unique_name("metrics_sqs"))["QueueUrl"]
        sqs.send_message(QueueUrl=url, MessageBody="x")
        with pytest.raises(sqs.exceptions.QueueDoesNotExist):
            sqs.get_queue_url(QueueName=unique_name("metrics_sqs_missing"))
        samples = scrape(metrics_port)
    finally:
        shim.stop()
    assert metric(samples, "postbox_sqs_requests_total", action="SendMessage", code="OK") == 1
    assert metric(samples, "postbox_sqs_requests_total", action="CreateQueue", code="OK") == 1
    missing = {"action": "GetQueueUrl", "code": "AWS.SimpleQueueService.NonExistentQueue"}
    assert metric(samples, "postbox_sqs_requests_total", **missing) == 1
    assert metric(samples, "postbox_sqs_request_seconds_count", action="SendMessage") == 1


def test_consumer_group_lag_is_shown_at_scrape_time(observed):
    from postbox.v1 import stream_service_pb2 as spb
    from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
    from postbox.v1 import topic_service_pb2 as tpb

    topic = unique_name("metrics_stream")
    with grpc.insecure_channel(observed.process.target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        created = tpb.Topic(name=topic, stream_retention=seconds(3600))
        topics.CreateTopic(tpb.CreateTopicRequest(topic=created))
        group = spb.ConsumerGroup(topic=topic, name="lagging")
        stream_service_pb2_grpc.StreamServiceStub(channel).CreateConsumerGroup(
            spb.CreateConsumerGroupRequest(consumer_group=group)
        )
        entries = [tpb.PublishBatchEntry(body=b"x")] * 3
        topics.PublishBatch(tpb.PublishBatchRequest(topic=topic, entries=entries))
    samples = observed.scrape()
    labels = {"topic": topic, "group": "lagging"}
    assert metric(samples, "postbox_consumer_group_lag_messages", **labels) == 3
    assert metric(samples, "postbox_consumer_group_lag_seconds", **labels) >= 0


def test_a_fan_out_counts_what_each_queue_took(observed, stubs):
    from postbox.v1 import topic_service_pb2 as tpb
    from postbox.v1 import topic_service_pb2_grpc

    queues = stubs[0]
    topic = unique_name("metrics_fan")
    names = [unique_name(f"metrics_fan_{i}") for i in range(2)]
    for name in names:
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    before = observed.scrape()
    with grpc.insecure_channel(observed.process.target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
        topics.CreateSubscription(
            tpb.CreateSubscriptionRequest(
                subscription=tpb.Subscription(name="all", topic=topic, queue=names[0])
            )
        )
        topics.CreateSubscription(
            tpb.CreateSubscriptionRequest(
                subscription=tpb.Subscription(
                    name="even", topic=topic, pattern="even", queue=names[1]
                )
            )
        )
        entries = [
            tpb.PublishBatchEntry(body=b"x", routing_key="even" if i % 2 == 0 else "odd")
            for i in range(5)
        ]
        topics.PublishBatch(tpb.PublishBatchRequest(topic=topic, entries=entries))
        topics.Publish(tpb.PublishRequest(topic=topic, body=b"y", routing_key="even"))
        # A duplicate adds nothing.
        for _ in range(2):
            topics.Publish(tpb.PublishRequest(topic=topic, body=b"z", deduplication_id="once"))
    after = observed.scrape()

    def grew(queue: str) -> float:
        return metric(after, "postbox_messages_sent_total", queue=queue) - metric(
            before, "postbox_messages_sent_total", queue=queue
        )

    assert grew(names[0]) == 5 + 1 + 1
    assert grew(names[1]) == 3 + 1


def test_redeliveries_and_age_at_first_receive_are_counted_by_queue(observed, stubs):
    queues, messages = stubs
    queue = unique_name("metrics_redelivered")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)), timeout=10)
    messages.Send(pb.SendRequest(queue=queue, body=b"again"), timeout=10)
    receive = pb.ReceiveRequest(
        queue=queue, max_messages=1, visibility_timeout=seconds(0), wait_time=seconds(5)
    )
    # A lease of 0 s makes the message visible again at once: the second receive is a
    # redelivery, and only the first delivery has an age at receive.
    for expected_count in (1, 2):
        [response] = list(messages.Receive(receive, timeout=30))
        assert response.messages[0].receive_count == expected_count
    samples = observed.scrape()
    assert metric(samples, "postbox_messages_received_total", queue=queue) == 2
    assert metric(samples, "postbox_messages_redelivered_total", queue=queue) == 1
    assert metric(samples, "postbox_message_age_at_receive_seconds_count", queue=queue) == 1
    assert metric(samples, "postbox_message_age_at_receive_seconds_sum", queue=queue) >= 0


async def test_a_pool_acquire_timeout_is_refused_and_counted(database_url):
    # One pooled connection, held by a call waiting on the test's lock: the next call finds
    # none free within 0.5 s. No workers, so nothing else of the server takes the pool.
    server = MetricsServer(
        database_url, "--pool-size", "1", "--pool-acquire-timeout", "0.5", "--no-workers"
    )
    queue = unique_name("metrics_pool")
    with running(server), grpc.insecure_channel(server.process.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)), timeout=10)
        before = metric(server.scrape(), "postbox_db_pool_acquire_timeouts_total")
        holder = await asyncpg.connect(database_url)
        try:
            async with holder.transaction():
                await holder.execute("SELECT FROM postbox.queues WHERE name = $1 FOR UPDATE", queue)
                held = queues.UpdateQueue.future(
                    qpb.UpdateQueueRequest(
                        queue=qpb.Queue(name=queue, visibility_timeout=seconds(45)),
                        update_mask={"paths": ["visibility_timeout"]},
                    ),
                    timeout=30,
                )
                await until(
                    holder,
                    "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()",
                )
                with pytest.raises(grpc.RpcError) as refused:
                    queues.GetQueue(qpb.GetQueueRequest(name=queue), timeout=30)
        finally:
            await holder.close()
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "--pool-acquire-timeout" in refused.value.details()
        assert held.result().queue.visibility_timeout.seconds == 45
        assert metric(server.scrape(), "postbox_db_pool_acquire_timeouts_total") >= before + 1
