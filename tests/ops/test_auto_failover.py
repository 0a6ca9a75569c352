"""A failover run by an HA engine, not by the test: pg_auto_failover (Debian's
postgresql-15-auto-failover) with its monitor and two nodes on this machine.

The server is given the formation's URI (`pg_autoctl show uri`: both hosts,
target_session_attrs=read-write), as the README's HA section shows. Under load the
primary's machine dies: its pg_autoctl keeper and PostgreSQL get SIGKILL together. The
monitor notices, promotes the standby, and the server follows by itself. No acknowledged
message is lost (pg_auto_failover replicates synchronously while a standby is healthy), and
a schedule due while no primary answered fires each slot once.

The monitor's health checks are shortened (a check a second, unhealthy after 3 s) so the
failover takes seconds rather than its default half-minute; the README says which settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2_grpc
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc, schedule_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as spb
from support import ServerProcess, seconds
from test_failover import (
    CHANNEL_OPTIONS,
    NOT_SERVING,
    SERVING,
    Senders,
    receive_all,
    until,
    wait_for_health,
)

from bench.pg_cluster import PG_BIN, as_owner, scratch_directory
from bench.processes import free_port

PG_AUTOCTL = Path("/usr/bin/pg_autoctl")
pytestmark = pytest.mark.skipif(
    not PG_AUTOCTL.exists(),
    reason="Debian's postgresql-15-auto-failover is not installed (.ci/run installs it)",
)

# The monitor's health checks, in ms: the defaults take about 30 s to call a node dead.
FAST_HEALTH_CHECKS = {
    "pgautofailover.health_check_period": 1000,
    "pgautofailover.health_check_timeout": 1000,
    "pgautofailover.health_check_retry_delay": 500,
    "pgautofailover.node_considered_unhealthy_timeout": 3000,
    "pgautofailover.primary_demote_timeout": 5000,
}
# Generous: on a loaded 2-core machine a node's initdb or base backup takes tens of seconds.
SETUP_TIMEOUT = 180.0
FAILOVER_TIMEOUT = 90.0


@dataclass
class Formation:
    """A pg_auto_failover monitor and its nodes, each a `pg_autoctl ... --run` process
    group of its own, so that killing a group kills a node's keeper and its PostgreSQL."""

    directory: Path
    monitor_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    killed: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def _env(self) -> dict[str, str]:
        # pg_autoctl keeps its configuration and state under XDG directories: the test's own.
        return {
            "PATH": f"{PG_BIN}:{os.environ['PATH']}",
            "HOME": str(self.directory),
            "XDG_CONFIG_HOME": str(self.directory / "config"),
            "XDG_DATA_HOME": str(self.directory / "share"),
        }

    def _command(self, *args: str) -> list[str]:
        env = [f"{k}={v}" for k, v in self._env().items()]
        return as_owner(["env", *env, str(PG_AUTOCTL), *args])

    def _run_node(self, name: str, *args: str) -> None:
        log = (self.directory / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            self._command(*args, "--run"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def ctl(self, *args: str) -> str:
        done = subprocess.run(self._command(*args), capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"pg_autoctl {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout

    def sql(self, port: int, database: str, statement: str) -> str:
        done = subprocess.run(
            [str(PG_BIN / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             f"postgresql://postgres@127.0.0.1:{port}/{database}?connect_timeout=2",
             "-c", statement],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        return done.stdout.strip()

    def wait(self, check, what: str, timeout: float = SETUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except RuntimeError:
                pass  # not up yet
            for name, process in self.processes.items():
                if process.poll() is not None:
                    log = (self.directory / f"{name}.log").read_text(errors="replace")
                    raise RuntimeError(f"pg_autoctl {name} exited:\n{log[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"not after {timeout} s: {what}\n{self.state()}")
            time.sleep(0.2)

    def state(self) -> str:
        try:
            return self.ctl("show", "state", "--pgdata", str(self.directory / "monitor"))
        except RuntimeError as error:
            return str(error)

    def node_states(self) -> dict[str, str]:
        """Each node's state as the monitor reports it (node_1: primary, ...)."""
        rows = self.sql(
            self.monitor_port,
            "pg_auto_failover",
            "SELECT nodename || '=' || reportedstate FROM pgautofailover.node",
        )
        return dict(line.split("=", 1) for line in rows.splitlines() if line)

    @property
    def monitor_uri(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor_port}/pg_auto_failover?sslmode=disable"

    def start(self) -> None:
        self._run_node(
            "monitor",
            "create", "monitor", "--pgdata", str(self.directory / "monitor"),
            "--pgport", str(self.monitor_port), "--hostname", "127.0.0.1",
            "--auth", "trust", "--no-ssl",
        )  # fmt: skip
        self.wait(lambda: self.sql(self.monitor_port, "pg_auto_failover", "SELECT 1"), "monitor")
        for setting, value in FAST_HEALTH_CHECKS.items():
            self.sql(self.monitor_port, "postgres", f"ALTER SYSTEM SET {setting} = {value}")
        self.sql(self.monitor_port, "postgres", "SELECT pg_reload_conf()")
        for index, name in enumerate(("node_1", "node_2")):
            self.ports[name] = free_port()
            self._run_node(
                name,
                "create", "postgres", "--pgdata", str(self.directory / name),
                "--pgport", str(self.ports[name]), "--hostname", "127.0.0.1", "--name", name,
                "--auth", "trust", "--no-ssl", "--dbname", "postbox",
                "--monitor", self.monitor_uri,
            )  # fmt: skip
            # The first node is primary alone (single) before the second joins.
            first = {"node_1": "single"}
            wanted = first if index == 0 else {"node_1": "primary", "node_2": "secondary"}
            self.wait(lambda wanted=wanted: self._joined(wanted), f"{name} joined")

    def _joined(self, wanted: dict[str, str]) -> bool:
        if self.node_states() == wanted:
            return True
        if "node_2" in wanted:
            # The standby's pg_basebackup waits for a spread checkpoint of the primary (a
            # minute and a half here); an immediate one ends the wait.
            self.sql(self.ports["node_1"], "postgres", "CHECKPOINT")
        return False

    def uri(self) -> str:
        """The URI applications use: every node, whichever accepts writes."""
        monitor = str(self.directory / "monitor")
        uri = self.ctl("show", "uri", "--formation", "default", "--pgdata", monitor)
        return uri.strip().replace("postgres://", "postgresql://postgres@", 1)

    def kill(self, name: str) -> None:
        """The node's machine dies: its keeper and its PostgreSQL, at once, by SIGKILL."""
        process = self.processes.pop(name)  # its end is no longer news to wait()
        self.killed.append(process)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self._kill_postmaster(name)

    def _kill_postmaster(self, name: str) -> None:
        """A PostgreSQL the keeper's child started may sit in a process group of its own:
        ended by its pid file."""
        pid_file = self.directory / name / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)

    def remove(self) -> None:
        for process in [*self.processes.values(), *self.killed]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for name in ("monitor", "node_1", "node_2"):
            self._kill_postmaster(name)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def formation() -> Iterator[Formation]:
    formation = Formation(scratch_directory("postbox-auto-failover-"))
    try:
        formation.start()
        yield formation
    finally:
        formation.remove()


async def test_pg_auto_failover_promotes_and_the_server_follows(formation: Formation) -> None:
    server = ServerProcess(
        formation.uri(), "--safety-poll-interval", "1", "--maintenance-interval", "0.2"
    ).start()
    try:
        async with grpc.aio.insecure_channel(server.target, options=CHANNEL_OPTIONS) as channel:
            await _fail_over(formation, channel)
    finally:
        server.stop()
    assert "internal error" not in server.log(), server.log()


async def _fail_over(formation: Formation, channel: grpc.aio.Channel) -> None:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
    checks = health_pb2_grpc.HealthStub(channel)
    for name in ("load", "ticks"):
        await queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    await schedules.CreateSchedule(
        spb.CreateScheduleRequest(
            schedule=spb.Schedule(
                name="tick", target=spb.ScheduleTarget(queue="ticks"), interval=seconds(1)
            )
        )
    )

    async def fire_count() -> int:
        reply = await schedules.GetSchedule(spb.GetScheduleRequest(name="tick"))
        return reply.schedule.fire_count

    load = Senders(messages, "load")
    senders = [asyncio.ensure_future(load.run()) for _ in range(8)]
    await until(lambda: len(load.acknowledged) >= 200, 60, "sends before the failover")
    fires_before = await fire_count()

    killed_at = time.monotonic()
    await asyncio.to_thread(formation.kill, "node_1")
    await wait_for_health(checks, NOT_SERVING, timeout=15)
    await asyncio.to_thread(
        formation.wait,
        lambda: formation.node_states().get("node_2") in ("wait_primary", "primary"),
        "the monitor promoted node_2",
        FAILOVER_TIMEOUT,
    )
    promoted_after = time.monotonic() - killed_at
    acknowledged_at_promotion = len(load.acknowledged)
    await until(lambda: len(load.acknowledged) > acknowledged_at_promotion + 50, 30, "resumed")
    resumed_after = load.last_ack - killed_at
    await wait_for_health(checks, SERVING, timeout=15)

    async def fired_since(count: int) -> bool:
        return await fire_count() > count

    await until(lambda: fired_since(fires_before + 2), 30, "the schedule fires after it")
    await schedules.PauseSchedule(spb.PauseScheduleRequest(name="tick"))
    load.stop.set()
    await asyncio.gather(*senders)
    print(
        f"pg_auto_failover: promoted {promoted_after:.1f} s after the primary died, sends "
        f"resumed {resumed_after:.1f} s after; {len(load.acknowledged)} acknowledged, "
        f"{len(load.refusals)} refused"
    )
    for _took, code, details in load.refusals:
        assert code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), details

    # No acknowledged message is lost.
    received = {int(m.body) for m in await receive_all(messages, "load")}
    assert load.acknowledged <= received, f"lost {sorted(load.acknowledged - received)[:5]}"
    # The slots due while no primary answered fired once each: one message per slot, as
    # many as the fire count (the schedule is paused now).
    ticks = await receive_all(messages, "ticks")
    slots = [m.deduplication_id for m in ticks]
    assert len(set(slots)) == len(slots), slots
    assert len(ticks) == await fire_count()
