"""Wake-ups cost one claim per delivery: a stream woken by its own server's send claims once,
and changes made on the server's own sessions that it does not wake for itself (here a move
to a dead-letter queue) still wake its streams, by their NOTIFY, long before the safety poll."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess, create_database, drop_database, run_sql, seconds, unique_name

# PostgreSQL reports a backend's function counts when it goes idle, up to 10 s later
# (PGSTAT_IDLE_INTERVAL): waiting that out is not a wait on the server.
STATS_DELAY = 11.0
MESSAGES = 200
RATE = 100.0  # sends per second, one at a time, as a steady producer sends (issue 17)
# At most 1.2 receive calls per delivered message (the goal is 1.1; 1.01-1.05 here on a
# machine shared with other work). One is the claim that delivers it; the rest is slack
# for a loaded run: a send that commits just before a claim begins wakes the stream just
# after, for a message that claim has delivered already. Before the hub skipped its own
# sends' NOTIFYs (counted exactly, see OwnSessions) it was 2.5-2.7, and 1.06-1.25
# while it forgot a session's sends at the session's next call.
MAX_RECEIVES_PER_MESSAGE = 1.2
# Far longer than the test: only a NOTIFY or a local wake-up can deliver in time.
SAFETY_POLL = 120.0


@pytest.fixture(scope="module")
def counted_url(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_calls")
    run_sql(
        url,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_functions = ''pl''', "
        "current_database()); END $$",
    )
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def counted_server(counted_url: str) -> Iterator[ServerProcess]:
    process = ServerProcess(counted_url, "--safety-poll-interval", str(SAFETY_POLL)).start()
    yield process
    process.stop()


async def _received(messages: message_service_pb2_grpc.MessageServiceStub, queue: str) -> list:
    request = pb.ReceiveRequest(queue=queue, max_messages=1)
    return [m async for response in messages.Receive(request) for m in response.messages]


async def _receive_calls(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(
        """SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
           WHERE schemaname = 'postbox' AND funcname = 'receive'"""
    )


async def test_a_stream_claims_once_per_message_sent_at_a_steady_rate(counted_server, counted_url):
    queue = unique_name("steady")
    async with grpc.aio.insecure_channel(counted_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)))
        stream = messages.StreamingReceive()
        await stream.write(pb.StreamingReceiveRequest(queue=queue, max_messages=10))
        conn = await asyncpg.connect(counted_url)
        try:
            await asyncio.sleep(STATS_DELAY)  # the stream's opening claims are counted
            before = await _receive_calls(conn)

            async def produce() -> None:
                for i in range(MESSAGES):
                    started = time.monotonic()
                    await messages.Send(pb.SendRequest(queue=queue, body=b"m%d" % i))
                    await asyncio.sleep(max(0.0, 1 / RATE - (time.monotonic() - started)))

            producing = asyncio.create_task(produce())
            delivered = 0
            while delivered < MESSAGES:
                response = await asyncio.wait_for(stream.read(), 10)
                batch = response.batch.messages
                delivered += len(batch)
                if batch:  # a consumer that keeps up: each delivery is deleted
                    receipts = [m.receipt for m in batch]
                    await stream.write(pb.StreamingReceiveRequest(delete_receipts=receipts))
            await producing
            await asyncio.sleep(STATS_DELAY)
            calls = await _receive_calls(conn) - before
        finally:
            stream.cancel()
            await conn.close()
    print(f"{calls} receive calls for {MESSAGES} messages")
    assert calls / MESSAGES <= MAX_RECEIVES_PER_MESSAGE, f"{calls} receives for {MESSAGES}"


async def _until_waited_on(url: str, queue: str) -> None:
    """Until a stream of the server waits on the queue (its hub lists it as waited on):
    what wakes it from then on is the path under test, not its first claim."""
    conn = await asyncpg.connect(url)
    try:
        for _ in range(1500):
            if await conn.fetchval(
                """SELECT EXISTS (SELECT FROM postbox.queue_listeners l
                                  JOIN postbox.queues q ON q.id = l.queue_id WHERE q.name = $1)""",
                queue,
            ):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"no stream waited on {queue} within 30 s")
    finally:
        await conn.close()


async def test_a_move_to_a_dead_letter_queue_on_the_servers_own_session_wakes_its_stream(
    counted_server, counted_url
):
    source, dead = unique_name("source"), unique_name("dead")
    async with grpc.aio.insecure_channel(counted_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=dead)))
        policy = qpb.DeadLetterPolicy(dead_letter_queue=dead, max_receive_count=1)
        await queues.CreateQueue(
            qpb.CreateQueueRequest(queue=qpb.Queue(name=source, dead_letter_policy=policy))
        )
        waiting = messages.StreamingReceive()
        await waiting.write(pb.StreamingReceiveRequest(queue=dead))
        await _until_waited_on(counted_url, dead)
        await messages.Send(pb.SendRequest(queue=source, body=b"poison"))
        (first,) = await _received(messages, source)
        # Back at once, received once already: the next receive moves it to `dead`.
        await messages.ChangeVisibility(
            pb.ChangeVisibilityRequest(
                queue=source, receipt=first.receipt, visibility_timeout=seconds(0)
            )
        )
        assert await _received(messages, source) == []
        try:
            response = await asyncio.wait_for(waiting.read(), SAFETY_POLL / 4)
            assert [m.body for m in response.batch.messages] == [b"poison"]
        finally:
            waiting.cancel()


async def test_a_fifo_promotion_on_the_servers_own_session_wakes_its_stream(
    counted_server, counted_url
):
    queue = unique_name("promoted") + ".fifo"
    async with grpc.aio.insecure_channel(counted_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)))
        for body in (b"head", b"next"):
            await messages.Send(
                pb.SendRequest(
                    queue=queue, body=body, message_group_id="g", deduplication_id=body.decode()
                )
            )
        (head,) = await _received(messages, queue)
        waiting = messages.StreamingReceive()
        await waiting.write(pb.StreamingReceiveRequest(queue=queue))
        await _until_waited_on(counted_url, queue)  # "next" is parked behind "head"
        await messages.Delete(pb.DeleteRequest(queue=queue, receipt=head.receipt))
        try:
            response = await asyncio.wait_for(waiting.read(), SAFETY_POLL / 4)
            assert [m.body for m in response.batch.messages] == [b"next"]
        finally:
            waiting.cancel()
