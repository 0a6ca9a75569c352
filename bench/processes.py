"""Server processes a bench run talks to: postbox itself and the empty-handler ceiling."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent


class HealthChecks(Protocol):
    """grpc_health's sync HealthStub: its stubs (types-grpcio-health-checking) declare no
    methods on it."""

    def Check(
        self, request: health_pb2.HealthCheckRequest, *, timeout: float | None = None
    ) -> health_pb2.HealthCheckResponse: ...


def health_stub(channel: grpc.Channel) -> HealthChecks:
    return cast(HealthChecks, health_pb2_grpc.HealthStub(channel))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class GroupCommits:
    """A postbox server's group commits so far: the groups, and the single Sends and
    Publishes they carried (postbox_group_commit_batch_size)."""

    groups: float
    calls: float

    def mean_since(self, before: GroupCommits) -> float:
        """Calls per group between two samples; 0 when no group committed."""
        groups = self.groups - before.groups
        return (self.calls - before.calls) / groups if groups else 0.0


@dataclass
class CpuSample:
    cpu_seconds: float
    at: float


class Served:
    """A server in a subprocess on a free port of 127.0.0.1, up once it answers.

    gRPC servers are up when health says SERVING; HTTP ones (the SQS shim) when
    any HTTP response comes back.
    """

    def __init__(self, command: list[str], *, name: str, http: bool = False) -> None:
        self.port = free_port()
        host, port = ("--host", "--port") if http else ("--grpc-host", "--grpc-port")
        self.command = [*command, host, "127.0.0.1", port, str(self.port)]
        self.name = name
        self.http = http
        self.log_path = Path(tempfile.mkstemp(prefix=f"postbox-bench-{name}-", suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None
        self.metrics_port: int | None = None

    @classmethod
    def postbox(cls, database_url: str, *extra: str, name: str = "postbox") -> Served:
        metrics_port = free_port()
        served = cls(
            [
                sys.executable, "-m", "postbox_server", "serve",
                "--database-url", database_url, *extra,
                "--metrics-host", "127.0.0.1", "--metrics-port", str(metrics_port),
            ],
            name=name,
        )  # fmt: skip
        served.metrics_port = metrics_port
        return served

    @classmethod
    def empty(cls) -> Served:
        return cls([sys.executable, "-m", "bench.empty_server"], name="empty")

    @classmethod
    def sqs(cls, grpc_target: str) -> Served:
        """The SQS shim (`postbox sqs`) calling the postbox server at grpc_target."""
        command = [sys.executable, "-m", "postbox_server", "sqs", "--grpc-target", grpc_target]
        return cls(command, name="sqs", http=True)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def __enter__(self) -> Served:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "POSTBOX_LOG_LEVEL": "WARNING"},
            )
        self._wait_serving(60.0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _wait_serving(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with grpc.insecure_channel(self.target) as channel:
            health = health_stub(channel)
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.name} server exited:\n{self.log_path.read_text()}")
                if self._http_answers() if self.http else self._grpc_serving(health):
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.name} server not serving after {timeout} s")
                time.sleep(0.05)

    @staticmethod
    def _grpc_serving(health: HealthChecks) -> bool:
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def _http_answers(self) -> bool:
        try:
            urllib.request.urlopen(self.url, timeout=1)
        except urllib.error.HTTPError:
            return True  # an error response is still a response: the shim listens
        except OSError:
            return False
        return True

    def _processes(self) -> list[psutil.Process]:
        assert self.process is not None
        parent = psutil.Process(self.process.pid)
        return [parent, *parent.children(recursive=True)]

    def group_commits(self) -> GroupCommits:
        """The group commits of a postbox server (all its workers) so far."""
        if self.metrics_port is None:
            raise RuntimeError(f"{self.name} serves no metrics")
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        samples = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "postbox_group_commit_batch_size"
            for sample in family.samples
        }
        return GroupCommits(
            samples.get("postbox_group_commit_batch_size_count", 0.0),
            samples.get("postbox_group_commit_batch_size_sum", 0.0),
        )

    def cpu(self) -> CpuSample:
        """CPU seconds used so far by the server and its worker processes."""
        return CpuSample(sum(self.cpu_by_process().values()), time.monotonic())

    def cpu_by_process(self) -> dict[int, float]:
        """CPU seconds used so far by each process of the server, by pid."""
        used = {}
        for process in self._processes():
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used[process.pid] = times.user + times.system
        return used

    def connections_by_process(self) -> dict[int, int]:
        """Established TCP connections on the server's port, by pid of the process holding them."""
        held = {}
        for process in self._processes():
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            held[process.pid] = sum(
                1
                for c in connections
                if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == self.port
            )
        return held

    def rss(self) -> int:
        """Resident memory of the server and its worker processes, in bytes."""
        total = 0
        for process in self._processes():
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total


def machine_cpu() -> CpuSample:
    """CPU time of the whole machine, every process and core, so far."""
    times = psutil.cpu_times()
    return CpuSample(
        times.user + times.system + times.nice + times.irq + times.softirq, time.monotonic()
    )


def cpu_share(before: CpuSample, after: CpuSample) -> float:
    """CPU used between two samples as a share of one core (1.0 = one core busy)."""
    return (after.cpu_seconds - before.cpu_seconds) / max(after.at - before.at, 1e-9)
