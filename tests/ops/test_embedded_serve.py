"""`postbox serve` without a database URL: an embedded PostgreSQL in --data-dir."""

from __future__ import annotations

import fcntl
import os
import pwd
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import psutil
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from support import ServerProcess, create_queue, eventually, receive


class EmbeddedServerProcess(ServerProcess):
    """`python -m postbox_server serve --data-dir DIR` with DATABASE_URL as given (None: unset)."""

    def __init__(self, data_dir: Path, database_url_env: str | None, *extra_args: str) -> None:
        super().__init__("", *extra_args)
        self.data_dir = data_dir
        self.database_url_env = database_url_env

    def start(self, timeout: float = 60.0) -> EmbeddedServerProcess:
        # initdb alone takes seconds, many more on a loaded machine.
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "POSTBOX_DATA_DIR")}
        if self.database_url_env is not None:
            env["DATABASE_URL"] = self.database_url_env
        # Were DATABASE_URL='' taken as a URL, libpq's defaults would find the
        # PostgreSQL of the machine; here they find none.
        env["PGHOST"] = str(self.data_dir.parent / "no-postgres-here")
        self.spawn(
            "serve",
            "--data-dir", str(self.data_dir),
            "--grpc-host", "127.0.0.1",
            "--grpc-port", str(self.port),
            *self.extra_args,
            env=env,
        )  # fmt: skip
        self.wait_serving(timeout)
        return self

    def postmaster(self) -> psutil.Process:
        """The embedded PostgreSQL's postmaster, from its pid file."""
        pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)

    def stop_with(self, sig: signal.Signals) -> int:
        assert self.process is not None
        self.process.send_signal(sig)
        return self.process.wait(20)


def _stopped_cleanly(server: EmbeddedServerProcess, sig: signal.Signals) -> None:
    postmaster = server.postmaster()
    assert server.stop_with(sig) == 0, server.log()
    # The server stopped its PostgreSQL before exiting: nothing left to wait for.
    assert not postmaster.is_running() or postmaster.status() == psutil.STATUS_ZOMBIE
    assert not (server.data_dir / "postmaster.pid").exists()
    assert "did not stop cleanly" not in server.log()
    assert "fork" not in server.log()  # no stray line from gRPC's fork handlers


def test_embedded_postgres_serves_and_keeps_data_across_restarts(tmp_path):
    data_dir = tmp_path / "pgdata"
    first = EmbeddedServerProcess(data_dir, database_url_env=None).start()
    try:
        with grpc.insecure_channel(first.target) as channel:
            create_queue(queue_service_pb2_grpc.QueueServiceStub(channel), "kept")
            message_service_pb2_grpc.MessageServiceStub(channel).Send(
                pb.SendRequest(queue="kept", body=b"still here")
            )
        assert (data_dir / "PG_VERSION").exists()
        _stopped_cleanly(first, signal.SIGTERM)
    finally:
        first.kill()

    # An empty DATABASE_URL counts as unset: the same embedded database again.
    second = EmbeddedServerProcess(data_dir, database_url_env="").start()
    try:
        with grpc.insecure_channel(second.target) as channel:
            messages = message_service_pb2_grpc.MessageServiceStub(channel)
            assert [m.body for m in receive(messages, "kept")] == [b"still here"]
        _stopped_cleanly(second, signal.SIGINT)  # Ctrl-C
    finally:
        second.kill()


def test_workers_share_one_embedded_postgres_and_stop_it(tmp_path):
    server = EmbeddedServerProcess(tmp_path / "pgdata", None, "--workers", "2").start()
    try:
        workers = psutil.Process(server.process.pid).children()
        postmaster = server.postmaster()
        assert postmaster.pid not in [worker.pid for worker in workers]
        with grpc.insecure_channel(server.target) as channel:
            assert create_queue(queue_service_pb2_grpc.QueueServiceStub(channel), "shared")
        _stopped_cleanly(server, signal.SIGINT)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
    finally:
        server.kill()


def test_db_url_and_psql_reach_the_embedded_database_of_a_running_server(tmp_path):
    data_dir = tmp_path / "pgdata"
    cli = [sys.executable, "-m", "postbox_server"]
    server = EmbeddedServerProcess(data_dir, database_url_env=None).start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            create_queue(queue_service_pb2_grpc.QueueServiceStub(channel), "seen_from_psql")
        url = subprocess.run(
            [*cli, "db", "url", "--data-dir", str(data_dir)],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()  # fmt: skip
        query = "SELECT name FROM postbox.queues"
        assert (
            "seen_from_psql"
            in subprocess.run(
                ["psql", url, "-Atc", query], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        )
        through_verb = subprocess.run(
            [*cli, "psql", "--data-dir", str(data_dir), "-Atc", query],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert through_verb.returncode == 0, through_verb.stderr
        assert "seen_from_psql" in through_verb.stdout
        _stopped_cleanly(server, signal.SIGTERM)
    finally:
        server.kill()
    stopped = subprocess.run(
        [*cli, "db", "url", "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=30
    )
    assert stopped.returncode == 2
    assert "no embedded PostgreSQL runs in" in stopped.stderr


def test_a_killed_server_does_not_leave_its_postgres_running(tmp_path):
    """SIGKILL gives the server no chance to stop its PostgreSQL; its watchdog does."""
    server = EmbeddedServerProcess(tmp_path / "pgdata", None).start()
    try:
        postmaster = server.postmaster()
        server.process.kill()
        server.process.wait(20)
        # 30 s: a fast shutdown takes well under a second; a machine under load, more.
        postmaster.wait(30)
        assert not (server.data_dir / "postmaster.pid").exists()
        assert "died without stopping its embedded PostgreSQL" in server.log()
    finally:
        server.kill()


def _watchdog(server: subprocess.Popen[bytes], postmaster: int) -> subprocess.CompletedProcess[str]:
    watchdog = [sys.executable, "-m", "postbox_server.embedded_watchdog"]
    return subprocess.run(
        [*watchdog, str(server.pid), str(postmaster)], capture_output=True, text=True, timeout=30
    )


def test_the_watchdog_leaves_a_stopped_but_unreaped_postmaster_alone():
    """A cleanly stopped postmaster that nobody has reaped yet is a zombie, not a survivor."""
    stopped = subprocess.Popen(["true"])  # not waited for until the end: it stays a zombie
    server = subprocess.Popen(["true"])
    server.wait()
    try:
        # The zombie state is what the watchdog must see: wait for it, not a fixed time.
        deadline = time.monotonic() + 30  # a process that runs `true` exits at once
        while psutil.Process(stopped.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the child never exited"
            time.sleep(0.01)
        done = _watchdog(server, stopped.pid)
    finally:
        stopped.wait()
    assert done.returncode == 0
    assert "died without stopping" not in done.stderr


def test_the_watchdog_stops_a_postmaster_its_server_left_running():
    survivor = subprocess.Popen(["sleep", "60"])
    server = subprocess.Popen(["true"])
    server.wait()
    try:
        done = _watchdog(server, survivor.pid)
        assert survivor.wait(10) == -signal.SIGINT
    finally:
        survivor.kill()
        survivor.wait()
    assert done.returncode == 0
    assert f"stopped it (postmaster {survivor.pid})" in done.stderr


_MAKE_USER = """
import pwd, sys
from postbox_server import embedded
embedded._SYSTEM_USER, embedded._USER_LOCK = sys.argv[1], sys.argv[2]
embedded._ensure_system_user()
print(pwd.getpwnam(sys.argv[1]).pw_uid)
"""


def _waiting_on(path: Path) -> int:
    """How many processes wait for a lock on this file (/proc/locks marks them "->")."""
    inode = f":{path.stat().st_ino} "
    return sum(
        "->" in line for line in Path("/proc/locks").read_text().splitlines() if inode in line
    )


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="only root makes the embedded PostgreSQL's system user (CI runs as root)",
)
def test_the_embedded_postgres_system_user_is_made_once_by_servers_starting_together(tmp_path):
    """Two servers starting at once on a machine without the user both find it missing;
    the lock lets one make it and the other find it made (a user of its own name here,
    removed afterwards, so that no other test's embedded PostgreSQL loses its user)."""
    user = f"pbtest{uuid.uuid4().hex[:10]}"
    lock = tmp_path / "user.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        starts = [
            subprocess.Popen(
                [sys.executable, "-c", _MAKE_USER, user, str(lock)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            # Both at the lock, neither past it: the race, held open.
            eventually(lambda: _waiting_on(lock) == 2, what="both starts waiting for the lock")
            with pytest.raises(KeyError):
                pwd.getpwnam(user)
            fcntl.flock(held, fcntl.LOCK_UN)
            outcomes = [start.communicate(timeout=60) for start in starts]
        finally:
            for start in starts:
                start.kill()
                start.wait()
    try:
        assert [start.returncode for start in starts] == [0, 0], outcomes
        uid = pwd.getpwnam(user).pw_uid
        assert [out.strip() for out, _ in outcomes] == [str(uid)] * 2
        entries = Path("/etc/passwd").read_text().splitlines()
        assert sum(line.startswith(f"{user}:") for line in entries) == 1
    finally:
        subprocess.run(["userdel", user], capture_output=True)
