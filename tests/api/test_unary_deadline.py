"""The server's default deadline for unary calls (--unary-deadline): a call whose client
set none ends with DEADLINE_EXCEEDED, changing nothing, over gRPC and HTTP alike; a
client's own deadline is the client's. The call is made to wait by a lock the test holds
on the queue's row."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator

import asyncpg
import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import queue_service_pb2_grpc
from support import HttpServerProcess, ServerProcess, seconds, unique_name, until

DEADLINE = 1.0


@pytest.fixture(scope="module")
def deadline_server(database_url: str) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(database_url, "--unary-deadline", str(DEADLINE)).start()
    yield process
    process.stop()


@pytest.fixture
async def locked_queue(
    deadline_server: HttpServerProcess, database_url: str
) -> AsyncIterator[tuple[str, asyncpg.Connection]]:
    """A queue whose row the test holds locked until the test ends."""
    name = unique_name("deadline")
    with grpc.insecure_channel(deadline_server.target) as channel:
        queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
            qpb.CreateQueueRequest(queue=qpb.Queue(name=name)), timeout=10
        )
    holder = await asyncpg.connect(database_url)
    transaction = holder.transaction()
    await transaction.start()
    await holder.execute("SELECT FROM postbox.queues WHERE name = $1 FOR UPDATE", name)
    yield name, holder
    await transaction.rollback()
    await holder.close()


def update(name: str) -> qpb.UpdateQueueRequest:
    return qpb.UpdateQueueRequest(
        queue=qpb.Queue(name=name, visibility_timeout=seconds(99)),
        update_mask=FieldMask(paths=["visibility_timeout"]),
    )


async def waiting_on_lock(holder: asyncpg.Connection) -> None:
    """Returns once a session of the server waits for the test's lock."""
    await until(
        holder,
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()",
    )


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as error:  # the call's failure is what the test reads
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


async def visibility_timeout(server: ServerProcess, name: str) -> int:
    with grpc.insecure_channel(server.target) as channel:
        got = queue_service_pb2_grpc.QueueServiceStub(channel).GetQueue(
            qpb.GetQueueRequest(name=name), timeout=10
        )
    return got.queue.visibility_timeout.seconds


async def test_a_grpc_call_without_a_deadline_ends_at_the_servers(
    deadline_server: HttpServerProcess, locked_queue: tuple[str, asyncpg.Connection]
) -> None:
    name, holder = locked_queue
    with grpc.insecure_channel(deadline_server.target) as channel:
        stub = queue_service_pb2_grpc.QueueServiceStub(channel)
        thread, outcome = in_thread(lambda: stub.UpdateQueue(update(name)))  # no deadline
        await waiting_on_lock(holder)
        await asyncio.to_thread(thread.join, 30)
    [error] = outcome
    assert isinstance(error, grpc.RpcError)
    assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert "--unary-deadline" in error.details()
    assert f"{DEADLINE:g} s" in error.details()


async def test_an_http_call_ends_alike_and_changes_nothing(
    deadline_server: HttpServerProcess,
    locked_queue: tuple[str, asyncpg.Connection],
    database_url: str,
) -> None:
    name, holder = locked_queue
    port = deadline_server.http_port
    body = json.dumps({"queue": {"name": name, "visibilityTimeout": "99s"},
                       "updateMask": "visibilityTimeout"}).encode()  # fmt: skip
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/postbox.v1.QueueService/UpdateQueue",
        data=body,
        headers={"Content-Type": "application/json"},
    )

    def post() -> tuple[int, dict[str, str]]:
        try:
            urllib.request.urlopen(request, timeout=30)
        except urllib.error.HTTPError as refusal:
            return refusal.code, json.loads(refusal.read())
        return 200, {}

    thread, outcome = in_thread(post)
    await waiting_on_lock(holder)
    await asyncio.to_thread(thread.join, 30)
    [(status, answer)] = outcome  # type: ignore[misc]
    assert status == 504
    assert answer["code"] == "deadline_exceeded"
    # The update was rolled back: once the lock is gone, the queue is as it was.
    await holder.execute("ROLLBACK")
    assert await visibility_timeout(deadline_server, name) == 30


async def test_a_clients_own_deadline_is_the_clients(
    deadline_server: HttpServerProcess, locked_queue: tuple[str, asyncpg.Connection]
) -> None:
    name, holder = locked_queue
    with grpc.insecure_channel(deadline_server.target) as channel:
        stub = queue_service_pb2_grpc.QueueServiceStub(channel)
        began = time.monotonic()
        thread, outcome = in_thread(lambda: stub.UpdateQueue(update(name), timeout=30))
        await waiting_on_lock(holder)
        # Time passing beyond the server's default is what this test is about: the call
        # must still be waiting then (twice the default, for a loaded machine's slack).
        await asyncio.sleep(max(0.0, 2 * DEADLINE - (time.monotonic() - began)))
        assert thread.is_alive()
        await holder.execute("ROLLBACK")
        await asyncio.to_thread(thread.join, 30)
    [response] = outcome
    assert isinstance(response, qpb.UpdateQueueResponse)
    assert response.queue.visibility_timeout.seconds == 99
