"""Where a measured turn's CPU went: the bench's clients, the server, PostgreSQL, the rest.

On this machine the clients, the server and PostgreSQL share two cores. When a load
keeps them all busy, its rate is the cores divided by the CPU that one operation
costs all processes together, so the split per operation says which part holds the
rate down, and how much CPU a part may take for a target rate. When it does not (the
busy share says so), a wait holds the rate down instead, such as a commit that the
next calls queue behind; and a share the host stole leaves the machine fewer cores.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import psutil

from bench.load import Load
from bench.processes import Served, machine_cpu
from bench.runner import Row

DATABASE_PROCESSES = frozenset({"postgres", "postmaster"})


@dataclass(frozen=True)
class CpuTotals:
    """CPU seconds used so far, by part."""

    client: float  # this process: the bench's own clients
    server: float  # the server measured (0 when none)
    database: float  # every PostgreSQL process of the machine
    machine: float  # every process of the machine
    stolen: float  # time the host ran something else while this machine's cores wanted to run
    at: float


def seconds_of(names: frozenset[str]) -> float:
    """CPU seconds used so far by every process of the machine with one of these names."""
    used = 0.0
    for process in psutil.process_iter(["name"]):
        if process.info["name"] not in names:
            continue
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # ended meanwhile: its last moments go uncounted
        used += times.user + times.system
    return used


def cpu_totals(server: Served | None) -> CpuTotals:
    own = os.times()
    machine = machine_cpu()
    return CpuTotals(
        client=own.user + own.system,
        server=server.cpu().cpu_seconds if server is not None else 0.0,
        database=seconds_of(DATABASE_PROCESSES),
        machine=machine.cpu_seconds,
        stolen=psutil.cpu_times().steal,
        at=machine.at,
    )


@dataclass(frozen=True)
class CpuPerOperation:
    """Milliseconds of CPU per operation of a turn, by part; busy is the share of all
    cores the machine used meanwhile."""

    client: float
    server: float
    database: float
    other: float  # the kernel's share not charged to a process, other processes
    busy: float
    stolen: float  # share of all cores the host took meanwhile (a shared machine's noise)

    @property
    def total(self) -> float:
        return self.client + self.server + self.database + self.other

    def __str__(self) -> str:
        return (
            f"client {self.client:.2f} + server {self.server:.2f} + PostgreSQL "
            f"{self.database:.2f} + other {self.other:.2f} = {self.total:.2f} ms "
            f"(machine {self.busy:.0%} busy, {self.stolen:.0%} stolen by its host)"
        )


def per_operation(before: CpuTotals, after: CpuTotals, operations: int) -> CpuPerOperation:
    per = 1000 / max(operations, 1)
    client = (after.client - before.client) * per
    server = (after.server - before.server) * per
    database = (after.database - before.database) * per
    machine = (after.machine - before.machine) * per
    cores = psutil.cpu_count() or 1
    seconds = max(after.at - before.at, 1e-9)
    return CpuPerOperation(
        client=client,
        server=server,
        database=database,
        other=max(machine - client - server - database, 0.0),
        busy=(after.machine - before.machine) / seconds / cores,
        stolen=(after.stolen - before.stolen) / seconds / cores,
    )


class CpuWindow:
    """The CPU each part spends over a load's measured interval (see load.Window)."""

    def __init__(self, server: Served | None) -> None:
        self._server = server
        self._opened: CpuTotals | None = None
        self._closed: CpuTotals | None = None

    def open(self) -> None:
        self._opened = cpu_totals(self._server)

    def close(self) -> None:
        self._closed = cpu_totals(self._server)

    def per_operation(self, operations: int) -> CpuPerOperation:
        if self._opened is None or self._closed is None:
            raise RuntimeError("the load ended before its measured interval did")
        return per_operation(self._opened, self._closed, operations)


async def metered(
    server: Served | None, work: Callable[[CpuWindow], Awaitable[Load]]
) -> tuple[Load, CpuPerOperation]:
    """Runs the work, which opens and closes the window around its measured interval;
    returns its Load and the CPU each part spent per operation meanwhile."""
    window = CpuWindow(server)
    load = await work(window)
    return load, window.per_operation(load.operations)


def median_split(splits: list[CpuPerOperation]) -> CpuPerOperation:
    """Each part's median over turns (so the parts need not add up to the median total)."""
    return CpuPerOperation(
        client=statistics.median([s.client for s in splits]),
        server=statistics.median([s.server for s in splits]),
        database=statistics.median([s.database for s in splits]),
        other=statistics.median([s.other for s in splits]),
        busy=statistics.median([s.busy for s in splits]),
        stolen=statistics.median([s.stolen for s in splits]),
    )


def server_budget(
    cores: int, target_rate: float, ours: CpuPerOperation, transport: CpuPerOperation
) -> tuple[float, float]:
    """What the server's own work beyond gRPC (ms of CPU per operation) may cost for
    target_rate on a machine whose cores are all busy, with the other parts as ours
    spent them and gRPC's server side as the empty server spent it; and what it costs
    now. The first is negative when the other parts alone already exceed the budget."""
    budget = cores * 1000 / target_rate
    fixed = ours.client + ours.database + ours.other + transport.server
    return budget - fixed, ours.server - transport.server


def cpu_row(
    label: str,
    operation: str,
    parts: tuple[CpuPerOperation, CpuPerOperation, CpuPerOperation],
    target: float,
    raw_rate: float,
    measured: str,
) -> Row:
    """CPU per operation of ours, raw and the transport alone, and what `target` (of
    raw's rate) leaves the server's own work were the cores all busy."""
    ours, theirs, transport = parts
    left, now = server_budget(psutil.cpu_count() or 1, target * raw_rate, ours, transport)
    return Row(
        f"{label}, CPU per {operation}",
        "ms",
        ours.total,
        theirs.total,
        "raw's, all processes",
        note=(
            f"{measured}; ours {ours}; raw {theirs}; transport {transport}. For {target} of "
            f"raw, were the cores all busy, with the client, PostgreSQL and other as ours "
            f"spent them and gRPC's server side as the empty server's, the server's own work "
            f"could take {left:.2f} ms per {operation}; it takes {now:.2f}"
        ),
    )
