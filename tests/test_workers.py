"""`postbox serve --workers N`: processes sharing one port, each with its own LISTEN connection."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import asyncpg
import grpc
import psutil
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ROOT, ServerProcess


@pytest.fixture(scope="module")
def workers(database_url):
    process = ServerProcess(database_url, "--workers", "2").start()
    yield process
    process.stop()


async def test_workers_share_the_port_and_each_listens(workers, database_url):
    children = psutil.Process(workers.process.pid).children()
    assert len(children) == 2
    conn = await asyncpg.connect(database_url)
    try:
        deadline = time.monotonic() + 10
        while True:
            listeners = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'postbox-listen' "
                "AND datname = current_database()"
            )
            if len(listeners) >= 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    assert len(listeners) >= 2  # the session server of this run listens too
    # Many connections: the kernel spreads them over both workers; every call is served.
    channels = [grpc.insecure_channel(workers.target) for _ in range(8)]
    try:
        queues = queue_service_pb2_grpc.QueueServiceStub(channels[0])
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="workers_shared")))
        for channel in channels:
            message_service_pb2_grpc.MessageServiceStub(channel).Send(
                pb.SendRequest(queue="workers_shared", body=b"x")
            )
        stats = queues.GetQueue(qpb.GetQueueRequest(name="workers_shared")).queue.stats
        assert stats.visible_messages == 8
        queues.DeleteQueue(qpb.DeleteQueueRequest(name="workers_shared"))
    finally:
        for channel in channels:
            channel.close()


def test_a_busy_port_fails_loudly(workers, database_url):
    result = subprocess.run(
        [
            sys.executable, "-m", "server", "serve", "--database-url", database_url,
            "--grpc-host", "127.0.0.1", "--grpc-port", str(workers.port), "--workers", "2",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "cannot listen" in result.stderr


def test_stopping_the_parent_stops_every_worker(database_url):
    process = ServerProcess(database_url, "--workers", "2").start()
    children = psutil.Process(process.process.pid).children()
    assert process.stop() == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
