"""The real server behind Debian's PgBouncer in transaction mode.

Behind transaction pooling, consecutive transactions of one client connection run
on different server connections: a named prepared statement made on one is missing
on the next (asyncpg's `__asyncpg_stmt_N__ does not exist`), and LISTEN hears
nothing. With --listen-database-url the server LISTENs (and migrates) on a direct
connection and prepares only unnamed statements through the pooler. PgBouncer here
has fewer server connections (4) than the server's pool (8), and several clients
call at once, so transactions of one pool connection do change server connections.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import (
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import topic_service_pb2 as tpb
from support import ServerProcess, seconds

from bench.pg_cluster import PGBOUNCER, PgBouncer, Postgres, scratch_directory

pytestmark = pytest.mark.skipif(
    not PGBOUNCER.exists(), reason="Debian's pgbouncer is not installed (.ci/run installs it)"
)
CLIENTS = 8


@pytest.fixture(scope="module")
def bouncer() -> Iterator[tuple[Postgres, PgBouncer]]:
    directory = scratch_directory("postbox-pgbouncer-")
    postgres = Postgres(directory / "data").initdb()
    postgres.start()
    bouncer = None
    try:
        postgres.sql("CREATE DATABASE postbox")
        bouncer = PgBouncer(directory, postgres, pool_size=4).start()
        yield postgres, bouncer
    finally:
        if bouncer is not None:
            bouncer.stop()
        postgres.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)


async def test_server_behind_pgbouncer_in_transaction_mode(bouncer):
    postgres, pooler = bouncer
    server = ServerProcess(
        pooler.url("postbox"),
        "--listen-database-url", postgres.url("postbox"),
        "--pool-size", "8",
        # Only a wake-up, not the safety poll, ends a long poll within the test's waits.
        "--safety-poll-interval", "60",
    ).start()  # fmt: skip
    try:
        async with grpc.aio.insecure_channel(server.target) as channel:
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)
            messages = message_service_pb2_grpc.MessageServiceStub(channel)
            topics = topic_service_pb2_grpc.TopicServiceStub(channel)
            await asyncio.gather(*(_client(n, queues, messages) for n in range(CLIENTS)))
            await _publish(queues, messages, topics)
    finally:
        server.stop()
    log = server.log()
    assert "internal error" not in log, log


async def _client(number: int, queues, messages) -> None:
    """Create, send, long-poll receive (woken by a send), delete, delete the queue."""
    name = f"bounced_{number}"
    await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    for i in range(10):
        await messages.Send(pb.SendRequest(queue=name, body=f"{number}/{i}".encode()))
    bodies = []
    while len(bodies) < 10:
        reply = [
            m
            async for r in messages.Receive(
                pb.ReceiveRequest(queue=name, max_messages=10, wait_time=seconds(0))
            )
            for m in r.messages
        ]
        for message in reply:
            await messages.Delete(pb.DeleteRequest(queue=name, receipt=message.receipt))
        bodies += [m.body for m in reply]
    assert sorted(bodies) == sorted(f"{number}/{i}".encode() for i in range(10))

    # A long poll on the empty queue, woken by the wake-up the send's NOTIFY carries
    # over the direct LISTEN connection (20 s: far beyond a wake-up, well within the wait).
    waiting = messages.Receive(pb.ReceiveRequest(queue=name, max_messages=1, wait_time=seconds(20)))
    first = asyncio.ensure_future(waiting.read())
    await asyncio.sleep(0)  # the call is on its way before the send
    await messages.Send(pb.SendRequest(queue=name, body=b"late"))
    response = await asyncio.wait_for(first, 20)
    assert [m.body for m in response.messages] == [b"late"]
    await queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))


async def _publish(queues, messages, topics) -> None:
    for name in ("bounced_orders", "bounced_all"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    await topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name="bounced")))
    for name, pattern in (("orders", "orders.*"), ("all", "#")):
        await topics.CreateSubscription(
            tpb.CreateSubscriptionRequest(
                subscription=tpb.Subscription(
                    name=name, topic="bounced", pattern=pattern, queue=f"bounced_{name}"
                )
            )
        )
    reply = await topics.Publish(
        tpb.PublishRequest(topic="bounced", body=b"order 1", routing_key="orders.created")
    )
    assert list(reply.queues) == ["bounced_all", "bounced_orders"]
    for queue in reply.queues:
        got = [
            m
            async for r in messages.Receive(
                pb.ReceiveRequest(queue=queue, max_messages=10, wait_time=seconds(5))
            )
            for m in r.messages
        ]
        assert [m.body for m in got] == [b"order 1"]
