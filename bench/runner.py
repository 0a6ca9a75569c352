"""Scenario registry, the shared context of a run, and the table and JSON the run produces.

A scenario is an async function taking the Context and returning Rows; it registers
with @scenario. Scenarios that depend on features not built yet register with
pending(), so the table says what is not measurable rather than leaving it out.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import psutil
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2, queue_service_pb2_grpc

from bench.database import RAW_TABLE, BenchDatabase
from bench.processes import Served, free_port


@dataclass
class Row:
    """One figure: ours, the raw figure for the same work in the same run, and the verdict."""

    scenario: str
    unit: str
    ours: float
    raw: float | None = None
    raw_label: str = ""
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.raw is None or self.raw == 0:
            return None
        return self.ours / self.raw


Run = Callable[["Context"], Awaitable[list[Row]]]


@dataclass
class Scenario:
    name: str
    description: str
    run: Run | None = None
    pending: str = ""  # why it cannot be measured yet


SCENARIOS: dict[str, Scenario] = {}


def median_range(values: list[float], unit: str = "") -> str:
    """A median with its range, as the performance pages give every figure of several rounds."""
    return f"{statistics.median(values):.2f}{unit} ({min(values):.2f}-{max(values):.2f})"


def scenario(name: str, description: str) -> Callable[[Run], Run]:
    def register(run: Run) -> Run:
        SCENARIOS[name] = Scenario(name, description, run)
        return run

    return register


def pending(name: str, description: str, reason: str) -> None:
    SCENARIOS[name] = Scenario(name, description, pending=reason)


@dataclass
class Context:
    """What scenarios share: the database, the servers (started on first use), the knobs."""

    db: BenchDatabase
    seconds: float
    body_size: int
    sustained_seconds: float
    sustained_rate: float
    sustained_pin: bool = True
    soak_seconds: float = 3600.0
    spark_rows: int = 1_000_000
    spiral_phase_seconds: float = 600.0
    spiral_rate: float = 1000.0
    # Scenario output beyond the table (e.g. the sustained run's windows), kept in the JSON.
    extra: dict[str, Any] = field(default_factory=dict)
    _servers: dict[str, Served] = field(default_factory=dict)
    _http_urls: dict[str, str] = field(default_factory=dict)
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def postbox(self, workers: int = 1) -> Served:
        """A postbox server with `workers` processes on the run's database, shared by scenarios."""
        key = f"postbox-{workers}"
        if key not in self._servers:
            extra = ("--workers", str(workers)) if workers > 1 else ()
            served = Served.postbox(self.db.url, *extra, name=key)
            self._servers[key] = self._stack.enter_context(served)
        return self._servers[key]

    def postbox_http(self) -> tuple[Served, str]:
        """A one-worker postbox server with its HTTP/JSON port on too; that port's URL."""
        if "postbox-http" not in self._servers:
            http_port = free_port()
            served = Served.postbox(self.db.url, "--http-port", str(http_port), name="postbox-http")
            self._servers["postbox-http"] = self._stack.enter_context(served)
            self._http_urls["postbox-http"] = f"http://127.0.0.1:{http_port}"
        return self._servers["postbox-http"], self._http_urls["postbox-http"]

    def empty(self) -> Served:
        if "empty" not in self._servers:
            self._servers["empty"] = self._stack.enter_context(Served.empty())
        return self._servers["empty"]

    def sqs(self) -> Served:
        """The SQS shim in front of the one-worker postbox server."""
        if "sqs" not in self._servers:
            served = Served.sqs(self.postbox().target)
            self._servers["sqs"] = self._stack.enter_context(served)
        return self._servers["sqs"]

    def stop_servers(self) -> None:
        self._stack.close()
        self._servers.clear()

    async def clean(self) -> None:
        """Empties the database between scenarios, so one's leftovers do not slow the next."""
        conn = await asyncpg.connect(self.db.url)
        try:
            await conn.execute(f"TRUNCATE postbox.messages, postbox.stream_log, {RAW_TABLE}")
            # One transaction each: a drop takes locks until its commit, and console_overview's
            # 1,000 queues dropped in one statement ran out of max_locks_per_transaction.
            for topic in await conn.fetch("SELECT name FROM postbox.topics"):
                await conn.execute("SELECT postbox.delete_topic($1)", topic["name"])
            for queue in await conn.fetch("SELECT name FROM postbox.queues"):
                await conn.execute("SELECT postbox.drop_queue($1)", queue["name"])
            await conn.execute(f"VACUUM ANALYZE postbox.messages, {RAW_TABLE}")
        finally:
            await conn.close()

    def body(self) -> bytes:
        return os.urandom(self.body_size // 2).hex().encode()[: self.body_size]

    async def new_queue(
        self, target: str, hint: str, *, fifo: bool = False, **settings: Any
    ) -> str:
        name = f"{hint}_{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
        async with grpc.aio.insecure_channel(target) as channel:
            await queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
                queue_service_pb2.CreateQueueRequest(
                    queue=queue_service_pb2.Queue(name=name, **settings)
                )
            )
        return name


def message_stub(channel: grpc.aio.Channel) -> message_service_pb2_grpc.MessageServiceAsyncStub:
    return message_service_pb2_grpc.MessageServiceStub(channel)


def machine_load() -> dict[str, Any]:
    """How busy the machine is right now: load averages and CPU use over one second."""
    return {
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "cpu_percent": psutil.cpu_percent(interval=1.0),
    }


@dataclass
class Report:
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    machine: dict[str, Any] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    not_measurable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for row, entry in zip(self.rows, data["rows"], strict=True):
            entry["ratio"] = row.ratio
        return data

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(report: Report) -> str:
    header = ("scenario", "unit", "ours", "raw", "ratio", "raw is", "target", "met", "note")
    lines = [header]
    for row in report.rows:
        met = "" if row.met is None else ("yes" if row.met else "NO")
        lines.append(
            (
                row.scenario,
                row.unit,
                _fmt(row.ours),
                _fmt(row.raw),
                _fmt(row.ratio),
                row.raw_label,
                row.target,
                met,
                row.note,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header) - 1)]
    out = []
    for line in lines:
        cells = [cell.ljust(width) for cell, width in zip(line, widths, strict=False)]
        out.append("  ".join([*cells, line[-1]]).rstrip())
    for name, reason in report.not_measurable.items():
        out.append(f"not measurable yet: {name}: {reason}")
    for name, error in report.failed.items():
        out.append(f"FAILED: {name}: {error}")
    return "\n".join(out)


def describe_machine(db: BenchDatabase) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": db.server_version,
        "before": machine_load(),
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
