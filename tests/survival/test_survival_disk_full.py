"""PostgreSQL's disk fills under a stream of sends, then space comes back.

The test runs its own PostgreSQL (Debian's 15, fsync on) whose data directory, WAL
included, lies on a tmpfs of 64 MiB of its own, and fills that filesystem with a file
while eight clients send. It shows that sends fail with RESOURCE_EXHAUSTED saying
the database is out of disk space (PostgreSQL's disk_full, SQLSTATE 53100), that the
server stays up and says why (gRPC health NOT_SERVING, /readyz `degraded` with the
reason, a warning in its log), that it serves again by itself once the file is
deleted, and that every acknowledged message is there. Mounting needs root, as CI
runs; elsewhere the test is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from faults import (
    CHANNEL_OPTIONS,
    NOT_SERVING,
    SERVING,
    Senders,
    receive_numbers,
    wait_for,
    wait_for_health,
)
from grpc_health.v1 import health_pb2_grpc
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess

from bench.pg_cluster import PG_BIN, Postgres, scratch_directory

pytestmark = [
    pytest.mark.skipif(
        not (PG_BIN / "initdb").exists(),
        reason="Debian's postgresql-15 is not installed (.ci/run installs it)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root (CI runs as root)"),
]
# initdb's files take about 39 MiB of it (16 of them the first WAL segment).
FILESYSTEM_SIZE = "64m"
# pg_wal alone, in 1 MiB segments: room for the WAL that the load writes between
# checkpoints once space is back (the filler takes all of it before).
WAL_FILESYSTEM_SIZE = "32m"
BODY = b"x" * 1000


@dataclass
class SmallDisk:
    """A tmpfs of its own, mounted on a scratch directory, holding a PostgreSQL's data."""

    mount: Path
    postgres: Postgres
    filler: Path = field(init=False)

    def __post_init__(self) -> None:
        self.filler = self.mount / "filler"

    def fill(self) -> None:
        """Writes a file until the filesystem has no byte left."""
        with self.filler.open("wb", buffering=0) as file:
            chunk = b"\0" * 65536
            with contextlib.suppress(OSError):  # ENOSPC: full
                while True:
                    file.write(chunk)
            with contextlib.suppress(OSError):  # the last bytes, a block at a time
                while True:
                    file.write(b"\0" * 4096)

    def free(self) -> None:
        self.filler.unlink()


@contextlib.contextmanager
def _small_disk(size: str, wal_only: bool) -> Iterator[SmallDisk]:
    """A PostgreSQL whose data directory, or only its WAL (pg_wal, in 1 MiB segments),
    lies on a tmpfs of `size`."""
    directory = scratch_directory("postbox-disk-full-")
    mount = directory / "fs"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(mount)], check=True
    )
    try:
        shutil.chown(mount, "postgres", "postgres")
        if wal_only:
            postgres = Postgres(directory / "data")
            postgres.initdb(
                "min_wal_size = 2MB",
                "max_wal_size = 4MB",
                options=("--waldir", str(mount / "pg_wal"), "--wal-segsize", "1"),
            )
        else:
            postgres = Postgres(mount / "data")
            postgres.initdb()
        try:
            postgres.start()
            yield SmallDisk(mount, postgres)
        finally:
            postgres.stop_if_running()
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def small_disk() -> Iterator[SmallDisk]:
    with _small_disk(FILESYSTEM_SIZE, wal_only=False) as disk:
        yield disk


@pytest.fixture
def small_wal_disk() -> Iterator[SmallDisk]:
    with _small_disk(WAL_FILESYSTEM_SIZE, wal_only=True) as disk:
        yield disk


def readyz(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def test_full_disk_under_load(small_disk: SmallDisk):
    server = ServerProcess(small_disk.postgres.url(), "--safety-poll-interval", "1", metrics=True)
    server.start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _fill_under_load(small_disk, server, channel)
        assert server.process is not None
        assert server.process.poll() is None, "the server died"
    finally:
        server.stop()
    log = server.log()
    assert "the database is out of disk space (could not extend file" in log, log
    assert "database is out of disk space" in log
    assert "NOT_SERVING" in log
    assert "the database has disk space again" in log
    assert "internal error" not in log, log
    assert "Traceback" not in log, log


async def _fill_under_load(disk: SmallDisk, server: ServerProcess, channel) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="filling")))
    load = Senders(messages, "filling", padding=BODY)
    senders = load.start(8)

    await wait_for(lambda: len(load.acknowledged) > 100, 30, "sends before the disk fills")
    assert not load.failures, load.failures[:3]

    await asyncio.to_thread(disk.fill)
    # The first refusals, health and readiness; 15 s: this machine is shared and loaded.
    await wait_for(lambda: bool(load.failures), 15, "a send refused for the full disk")
    _, code, details = load.failures[0]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    assert "the database is out of disk space (SQLSTATE 53100, disk_full)" in details
    assert "nothing of this call was committed" in details
    down = await wait_for_health(checks, NOT_SERVING, 15)
    assert server.metrics_port is not None
    status, body = await asyncio.to_thread(readyz, server.metrics_port)
    assert status == 503, body
    assert body["status"] == "degraded", body
    assert body["reason"].startswith("the database is out of disk space (could not extend"), body
    # Load against the full disk for a while: refused each time, the server up.
    refused = len(load.failures)
    await wait_for(lambda: len(load.failures) > refused + 20, 30, "more refusals")
    acknowledged_while_full = len(load.acknowledged)
    codes = load.codes()
    assert codes == {grpc.StatusCode.RESOURCE_EXHAUSTED}, codes

    await asyncio.to_thread(disk.free)
    freed_at = time.monotonic()
    # The health watcher tries a write every second while the disk is full.
    await wait_for_health(checks, SERVING, 15)  # once space is back
    serving_after = time.monotonic() - freed_at
    await wait_for(
        lambda: len(load.acknowledged) > acknowledged_while_full + 50,
        30,
        "sends after space is back",
    )
    status, body = await asyncio.to_thread(readyz, server.metrics_port)
    assert status == 200, body
    load.stop.set()
    await asyncio.gather(*senders)

    received = await receive_numbers(messages, "filling")
    lost = load.acknowledged - received
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    print(
        f"NOT_SERVING {down:.1f} s after the fill; {len(load.failures)} sends refused; "
        f"SERVING {serving_after:.1f} s after space came back; "
        f"{len(load.acknowledged)} acknowledged, all received"
    )


async def test_full_wal_disk_crashes_postgres(small_wal_disk: SmallDisk):
    """pg_wal fills: PostgreSQL cannot write a WAL segment, PANICs, restarts itself,
    finds no room for its end-of-recovery checkpoint and shuts down. The server stays
    up, refusing calls UNAVAILABLE with health NOT_SERVING; once space is freed and
    PostgreSQL started again (as its supervisor would), it serves again by itself and
    every acknowledged message is there. A replication slot holds the WAL back, as a
    lost standby's does, so checkpoints cannot recycle it."""
    postgres = small_wal_disk.postgres
    postgres.sql("SELECT pg_create_physical_replication_slot('postbox_test_hold', true)")
    server = ServerProcess(postgres.url(), "--safety-poll-interval", "1").start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _fill_wal_under_load(small_wal_disk, channel)
        assert server.process is not None
        assert server.process.poll() is None, "the server died"
    finally:
        server.stop()
    log = server.log()
    assert "does not answer: NOT_SERVING" in log, log
    assert "internal error" not in log, log
    assert " ERROR " not in log, log


async def _fill_wal_under_load(disk: SmallDisk, channel) -> None:
    postgres = disk.postgres
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="walfill")))
    load = Senders(messages, "walfill", padding=BODY)
    senders = load.start(8)
    await wait_for(lambda: len(load.acknowledged) > 100, 30, "sends before the WAL fills")

    await asyncio.to_thread(disk.fill)
    pid_file = postgres.data / "postmaster.pid"
    # 60 s: the PANIC comes once the current segment is used up, then a restart.
    down = await wait_for(lambda: not pid_file.exists(), 60, "PostgreSQL to shut down")
    await wait_for_health(checks, NOT_SERVING, 15)
    refused = len(load.failures)
    await wait_for(lambda: len(load.failures) > refused + 10, 30, "refusals while it is down")
    acknowledged_while_down = len(load.acknowledged)

    await asyncio.to_thread(disk.free)
    await asyncio.to_thread(postgres.start)
    restarted_at = time.monotonic()
    # The slot would fill the WAL again.
    await asyncio.to_thread(postgres.sql, "SELECT pg_drop_replication_slot('postbox_test_hold')")
    await wait_for_health(checks, SERVING, 30)  # after PostgreSQL's start
    serving_after = time.monotonic() - restarted_at
    await wait_for(
        lambda: len(load.acknowledged) > acknowledged_while_down + 50, 30, "sends after it"
    )
    load.stop.set()
    await asyncio.gather(*senders)

    codes = load.codes()
    assert codes <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
    assert grpc.StatusCode.UNAVAILABLE in codes
    received = await receive_numbers(messages, "walfill")
    lost = load.acknowledged - received
    assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {sorted(lost)[:5]}"
    print(
        f"PostgreSQL down {down:.1f} s after the fill; {len(load.failures)} sends refused "
        f"({', '.join(sorted(code.name for code in codes))}); SERVING {serving_after:.1f} s "
        f"after its start; {len(load.acknowledged)} acknowledged, all received"
    )
