"""`postbox serve --workers N`: processes sharing one port, each with its own LISTEN connection."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

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
    try:
        process.wait_workers_listening(2, process.port)
        yield process
    finally:
        process.stop()


async def _connections_by_application(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT application_name, count(*) AS connections FROM pg_stat_activity "
            "WHERE datname = current_database() GROUP BY application_name"
        )
    finally:
        await conn.close()
    return {row["application_name"]: row["connections"] for row in rows}


async def test_each_worker_has_its_pool_and_its_own_listen_connection(workers, database_url):
    children = [child.pid for child in psutil.Process(workers.process.pid).children()]
    assert len(children) == 2
    expected = {f"postbox/{pid}/listen" for pid in children}
    deadline = time.monotonic() + 10
    while True:
        by_name = await _connections_by_application(database_url)
        if expected <= set(by_name) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    for pid in children:
        assert by_name.get(f"postbox/{pid}/listen") == 1, by_name
        assert by_name.get(f"postbox/{pid}", 0) >= 1, by_name  # its pool
    # The parent only supervises: it holds no connection once the SQL is installed.
    assert not [name for name in by_name if name.startswith(f"postbox/{workers.process.pid}")]


def test_every_worker_serves(workers):
    children = psutil.Process(workers.process.pid).children()
    # A channel of its own subchannel pool opens its own connection; the kernel
    # spreads connections over the workers (all 24 on one: 2 ** -23).
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(workers.target, options=options) for _ in range(24)]
    try:
        queues = queue_service_pb2_grpc.QueueServiceStub(channels[0])
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="workers_shared")))
        for channel in channels:
            message_service_pb2_grpc.MessageServiceStub(channel).Send(
                pb.SendRequest(queue="workers_shared", body=b"x")
            )
        # Each worker holds connections from this test, over which calls succeeded.
        for child in children:
            served = [
                c
                for c in child.net_connections(kind="tcp")
                if c.laddr and c.laddr.port == workers.port and c.status == psutil.CONN_ESTABLISHED
            ]
            assert served, f"worker {child.pid} has no connection"
        stats = queues.GetQueue(qpb.GetQueueRequest(name="workers_shared")).queue.stats
        assert stats.visible_messages == len(channels)
        queues.DeleteQueue(qpb.DeleteQueueRequest(name="workers_shared"))
    finally:
        for channel in channels:
            channel.close()


def test_a_busy_port_fails_loudly(workers, database_url):
    result = subprocess.run(
        [
            sys.executable, "-m", "postbox_server", "serve", "--database-url", database_url,
            "--grpc-host", "127.0.0.1", "--grpc-port", str(workers.port), "--workers", "2",
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "cannot listen" in result.stderr


def test_stopping_the_parent_stops_every_worker(database_url):
    process = ServerProcess(database_url, "--workers", "2").start()
    children = process.wait_workers_listening(2, process.port)
    assert process.stop() == 0
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


def test_each_worker_gets_the_opt_in_flags() -> None:
    """A flag that changes what a call does must reach every process sharing the port."""
    from postbox_server.cli.main import build_parser
    from postbox_server.config import Settings
    from postbox_server.processes import worker_command

    settings = Settings(
        auto_create_queues=True,
        insecure_allow_anonymous=True,
        sns_signing_key=Path("/keys/sns-signing.pem"),
    )
    command = worker_command(settings, "info", "text")
    assert "--auto-create-queues" in command
    args = build_parser().parse_args(command[command.index("--log-level") :])
    assert args.auto_create_queues
    assert args.sns_signing_key == Path("/keys/sns-signing.pem")
    assert "--auto-create-queues" not in worker_command(Settings(), "info", "text")
