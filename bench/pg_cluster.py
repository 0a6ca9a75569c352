"""PostgreSQL servers and a PgBouncer of a run's own, from Debian's packages.

The failover and PgBouncer tests stop, promote and kill servers, and the replication
bench needs a standby, so they run their own on loopback ports in a temporary
directory, whatever database the suite or the bench is otherwise given;
scripts/test-postgres-versions runs one per major version from other binaries. PostgreSQL
and PgBouncer refuse to run as root: as root (CI), they run as the `postgres` user
that the Debian packages create. `.ci/run` installs both packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.processes import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PGBOUNCER = Path("/usr/sbin/pgbouncer")


def as_owner(command: list[str]) -> list[str]:
    # runuser rather than subprocess's user=: that forks without exec in a process
    # with gRPC threads, whose fork handlers can crash the child.
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _run(command: list[str], timeout: float = 60) -> str:
    done = subprocess.run(as_owner(command), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def scratch_directory(prefix: str) -> Path:
    """A temporary directory the servers' user may write."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        shutil.chown(directory, "postgres", "postgres")
    return directory


class Postgres:
    """One PostgreSQL server on a loopback port, trust auth, fsync on: Debian's 15 unless
    given another installation's bin directory."""

    def __init__(self, data: Path, port: int | None = None, bin_dir: Path = PG_BIN) -> None:
        self.data = data
        self.port = port or free_port()
        self.bin_dir = bin_dir

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@{self.address}/{database}"

    def initdb(self, *settings: str, options: tuple[str, ...] = ()) -> Postgres:
        """`options`: initdb's own (a WAL directory elsewhere, a WAL segment size)."""
        # --no-sync: initdb's own files need no flush for a test; the server keeps fsync on.
        _run([str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres",
              "--auth=trust", "--no-sync", "--no-instructions", *options])  # fmt: skip
        self.configure(
            "listen_addresses = '127.0.0.1'",
            "unix_socket_directories = ''",
            "shared_buffers = 16MB",
            "max_connections = 60",
            "wal_level = replica",
            "max_wal_senders = 4",
            *settings,
        )
        return self

    def configure(self, *lines: str) -> None:
        """Appends to postgresql.conf (the last setting of a name wins)."""
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("".join(f"{line}\n" for line in lines))

    def base_backup_to(self, data: Path) -> None:
        """Makes `data` a standby of this server: pg_basebackup -R (primary_conninfo,
        standby.signal)."""
        _run([str(self.bin_dir / "pg_basebackup"), "-D", str(data), "-d", self.url(),
              "-R", "-X", "stream", "-c", "fast", "--no-sync"])  # fmt: skip

    def _pg_ctl(self, *args: str) -> None:
        _run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-w", *args])

    def start(self) -> Postgres:
        self._pg_ctl("-o", f"-p {self.port}", "-l", str(self.data / "server.log"), "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._pg_ctl("-m", mode, "stop")

    def stop_if_running(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop")

    def reload(self) -> None:
        self._pg_ctl("reload")

    def promote(self) -> None:
        self._pg_ctl("promote")

    def sql(self, statement: str, database: str = "postgres") -> str:
        return _run(
            [str(self.bin_dir / "psql"), "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1",
             "-d", self.url(database), "-c", statement],
            timeout=30,
        ).strip()  # fmt: skip


class PgBouncer:
    """Debian's PgBouncer in transaction mode, in front of one PostgreSQL."""

    def __init__(self, directory: Path, backend: Postgres, pool_size: int = 4) -> None:
        self.directory = directory
        self.port = free_port()
        (directory / "users.txt").write_text('"postgres" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={backend.port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {directory / 'users.txt'}\n"
            "pool_mode = transaction\n"
            # Fewer server connections than the postbox pool has: every client
            # connection is served by several server connections in turn.
            f"default_pool_size = {pool_size}\n"
            f"logfile = {directory / 'pgbouncer.log'}\n"
            f"pidfile = {directory / 'pgbouncer.pid'}\n"
        )
        if os.geteuid() == 0:
            for name in ("users.txt", "pgbouncer.ini"):
                shutil.chown(directory / name, "postgres", "postgres")

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> PgBouncer:
        _run([str(PGBOUNCER), "-d", str(self.directory / "pgbouncer.ini")])
        deadline = time.monotonic() + 10  # it daemonizes at once; its pid file follows
        while not (self.directory / "pgbouncer.pid").exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"pgbouncer did not start:\n{self.log()}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        pid_file = self.directory / "pgbouncer.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), 15)

    def log(self) -> str:
        path = self.directory / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@dataclass
class Pair:
    """A primary and its synchronous standby, streaming, with a database `postbox`."""

    directory: Path
    primary: Postgres
    standby: Postgres

    @classmethod
    def build(cls, directory: Path) -> Pair:
        pair = cls(directory, Postgres(directory / "primary"), Postgres(directory / "standby"))
        try:
            pair._build()
        except BaseException:
            pair.remove()
            raise
        return pair

    def _build(self) -> None:
        primary, standby = self.primary, self.standby
        primary.initdb()
        primary.start()
        # Before the standby exists: with synchronous_standby_names set, it would wait for one.
        primary.sql("CREATE DATABASE postbox")
        primary.configure("synchronous_standby_names = '*'", "synchronous_commit = on")
        primary.base_backup_to(standby.data)
        # The copied setting would make the promoted standby wait for a standby of its
        # own, forever, on every commit.
        standby.configure("synchronous_standby_names = ''")
        standby.start()
        primary.reload()  # from now on, every commit waits for the standby
        deadline = time.monotonic() + 30
        while primary.sql("SELECT sync_state FROM pg_stat_replication") != "sync":
            if time.monotonic() > deadline:
                raise TimeoutError("the standby does not stream synchronously after 30 s")
            time.sleep(0.05)

    def url(self, database: str = "postbox") -> str:
        """Both hosts; the client picks whichever accepts writes."""
        hosts = f"{self.primary.address},{self.standby.address}"
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def fail_over(self) -> None:
        """The primary dies; the standby is promoted."""
        self.primary.stop("immediate")
        self.standby.promote()

    def remove(self) -> None:
        self.primary.stop_if_running()
        self.standby.stop_if_running()
        shutil.rmtree(self.directory, ignore_errors=True)
