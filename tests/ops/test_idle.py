"""An idle server is quiet, and still wakes up at once.

A server with its default intervals, 100 queues and 1,000 open StreamingReceive
streams, and no traffic, runs at most one statement a second in its database,
averaged over 30 s and counted by PostgreSQL itself (pg_stat_database.xact_commit
of a database of its own, read from another database so the reads do not count).
Its workers sleep until their next due time or until a NOTIFY says that work
arrived; the streams' safety net is one statement for all queues.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess, create_database, drop_database

QUEUES = 100
STREAMS = 1000
WINDOW = 30.0  # seconds
MAX_RATE = 1.0  # statements per second
# PostgreSQL reports a backend's counts when it goes idle, but at most once a second: a
# backend that reported less than a second before it went idle reports the rest up to
# 10 s later (PGSTAT_IDLE_INTERVAL). So the count has settled once it has stayed within
# the limit for longer than that.
SETTLED = 12.0  # seconds
SETTLE_WITHIN = 120.0  # seconds


@pytest.fixture(scope="module")
def quiet_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_idle")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def quiet_server(quiet_database: str) -> Iterator[ServerProcess]:
    process = ServerProcess(quiet_database).start()  # default intervals
    yield process
    process.stop()


async def _commits(admin: asyncpg.Connection, database: str) -> int:
    return await admin.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database
    )


async def _until_settled(admin: asyncpg.Connection, database: str) -> None:
    """Until the streams' opening statements have run and PostgreSQL has reported them.
    The server runs them after the client has written the openings, on a loaded machine
    many seconds after; counted late, they landed in the window (a fixed 11 s wait read
    5-12 statements/s there, with or without wake-up changes, from an idle server whose
    log showed 7 statements per 10 s in the window)."""
    samples: list[tuple[float, int]] = []
    deadline = time.monotonic() + SETTLE_WITHIN
    while True:
        now = time.monotonic()
        samples.append((now, await _commits(admin, database)))
        earlier = [(at, count) for at, count in samples if at <= now - SETTLED]
        if earlier:
            at, count = earlier[-1]
            if samples[-1][1] - count <= MAX_RATE * (now - at):
                return
        assert now < deadline, f"still busy {SETTLE_WITHIN:.0f} s after opening the streams"
        await asyncio.sleep(0.5)  # a look at PostgreSQL's counts, not a wait on the server


@pytest.fixture
async def admin(admin_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(admin_url)
    yield conn
    await conn.close()


async def test_an_idle_server_with_a_thousand_streams_runs_under_a_statement_a_second(
    quiet_server, quiet_database, admin
):
    database = urlsplit(quiet_database).path.lstrip("/")
    async with grpc.aio.insecure_channel(quiet_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        names = [f"idle_{i}" for i in range(QUEUES)]
        for name in names:
            await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        streams = []
        for i in range(STREAMS):
            call = messages.StreamingReceive()
            await call.write(pb.StreamingReceiveRequest(queue=names[i % QUEUES]))
            streams.append(call)
        try:
            # Keeps the streams' opening statements out of the window.
            await _until_settled(admin, database)
            before = await _commits(admin, database)
            started = time.monotonic()
            await asyncio.sleep(WINDOW)  # the measurement window itself
            rate = (await _commits(admin, database) - before) / (time.monotonic() - started)
            assert rate <= MAX_RATE, f"{rate:.2f} statements per second while idle"
            # Still awake: a send reaches a waiting stream at once (one of the queue's
            # ten: the longest waiting, whichever that is).
            await messages.Send(pb.SendRequest(queue=names[7], body=b"wake"))
            reads = [asyncio.ensure_future(call.read()) for call in streams[7::QUEUES]]
            done, _ = await asyncio.wait(reads, timeout=5, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1, "no stream of the queue was woken within 5 s"
            assert [m.body for m in done.pop().result().batch.messages] == [b"wake"]
        finally:
            for call in streams:
                call.cancel()


@pytest.fixture
async def sql(quiet_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A producer's own connection: what it does reaches the server only as NOTIFYs."""
    conn = await asyncpg.connect(quiet_database)
    yield conn
    await conn.close()


async def _within(check, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while not (result := await check()):
        assert time.monotonic() < deadline, f"not within {seconds} s: {what}"
        await asyncio.sleep(0.05)
    return result


# Generous for a wake-up (milliseconds), far below the sleeping workers' 60 s fallback.
PROMPT = 5.0


async def test_a_schedule_made_elsewhere_fires_on_time(quiet_server, sql):
    await sql.execute("SELECT postbox.create_queue('scheduled_elsewhere')")
    await sql.execute(
        "SELECT postbox.create_schedule('elsewhere', now() + interval '1 second', 'tick', "
        "target_queue => 'scheduled_elsewhere', every => interval '1 hour')"
    )

    async def fired():
        return await sql.fetchval(
            "SELECT fire_count FROM postbox.schedules WHERE name = 'elsewhere'"
        )

    await _within(fired, 1 + PROMPT, "the schedule fired")


async def test_a_redrive_started_elsewhere_runs_at_once(quiet_server, sql):
    for name in ("source_elsewhere", "dlq_elsewhere"):
        await sql.execute("SELECT postbox.create_queue($1)", name)
    await sql.execute(
        "SELECT postbox.update_queue('source_elsewhere', $1::jsonb)",
        '{"dead_letter_policy": {"dead_letter_queue": "dlq_elsewhere", "max_receive_count": 1}}',
    )
    await sql.execute("SELECT postbox.send('source_elsewhere', 'dead')")
    await sql.fetch("SELECT * FROM postbox.receive('source_elsewhere', 1, interval '0')")
    await sql.fetch("SELECT * FROM postbox.receive('source_elsewhere', 1)")  # buries it
    await sql.execute("SELECT postbox.start_redrive('dlq_elsewhere')")

    async def moved():
        return await sql.fetchval(
            "SELECT status = 'completed' FROM postbox.redrive_tasks "
            "ORDER BY created_at DESC LIMIT 1"
        )

    await _within(moved, PROMPT, "the redrive ran")


async def test_a_webhook_published_elsewhere_is_delivered_at_once(quiet_server, sql):
    from receiver import Receiver

    receiver = Receiver().start()
    try:
        await sql.execute("SELECT postbox.create_topic('hooked_elsewhere')")
        await sql.execute(
            "SELECT postbox.create_subscription('hooked_elsewhere', 'hook', '#', "
            "webhook_url => $1)",
            receiver.url("/elsewhere"),
        )
        await sql.execute("SELECT postbox.publish('hooked_elsewhere', 'hello')")
        await asyncio.to_thread(receiver.wait_for, "/elsewhere", 1, PROMPT)
    finally:
        receiver.stop()
