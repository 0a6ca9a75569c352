"""A server refuses a database whose engine is newer than any it knows, with a message
that says what to run instead, and changes nothing in it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import asyncpg
import pytest
from support import create_database, drop_database, free_port

from postbox_server.db.migrate import Scripts, format_version, migrate

NEWER = "99.0.0"


async def _versions(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT version FROM postbox.schema_version ORDER BY version")
        return [row["version"] for row in rows]
    finally:
        await conn.close()


@pytest.fixture
def newer_engine(admin_url: str) -> Iterator[str]:
    """A database whose engine says it is NEWER: as if a newer server had upgraded it."""
    url = create_database(admin_url, "postbox_newer")

    async def install() -> None:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            await conn.execute("UPDATE postbox.schema_version SET version = $1", NEWER)
        finally:
            await conn.close()

    asyncio.run(install())
    yield url
    drop_database(admin_url, url)


@pytest.mark.parametrize(
    "verb",
    [
        pytest.param(["migrate"], id="migrate"),
        pytest.param(["serve", "--grpc-host", "127.0.0.1", "--grpc-port"], id="serve"),
    ],
)
def test_a_newer_engine_is_refused_by_name(newer_engine: str, verb: list[str]) -> None:
    args = [*verb, str(free_port())] if verb[0] == "serve" else verb
    result = subprocess.run(
        [sys.executable, "-m", "postbox_server", *args, "--database-url", newer_engine],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    known = format_version(Scripts.load().latest)
    assert f"the database holds postbox SQL {NEWER}, newer than {known}" in result.stderr
    assert "postbox --version" in result.stderr
    assert "Traceback" not in result.stderr
    assert asyncio.run(_versions(newer_engine)) == [NEWER]
