"""The `postbox` command's verbs, run as a user runs them, against a real server."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from support import create_database, drop_database, unique_name

# The console script pip installs with the package.
POSTBOX = Path(sys.executable).with_name("postbox")


def postbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(POSTBOX), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    result = postbox(*args, env=env)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _json_documents(text: str) -> list[dict]:
    """The JSON objects the client verbs print, one after another."""
    decoder = json.JSONDecoder()
    documents, position = [], 0
    while (position := _skip_space(text, position)) < len(text):
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
    return documents


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


async def _installed_version(url: str) -> str | None:
    from server.db.migrate import format_version, installed_version

    conn = await asyncpg.connect(url)
    try:
        version = await installed_version(conn)
    finally:
        await conn.close()
    return None if version is None else format_version(version)


def test_migrate_installs_the_engine_once(admin_url):
    url = create_database(admin_url, "postbox_cli")
    try:
        assert asyncio.run(_installed_version(url)) is None
        first = ok("migrate", "--database-url", url)
        version = asyncio.run(_installed_version(url))
        assert version is not None
        assert first == f"postbox SQL {version} installed\n"
        # Again, from DATABASE_URL: nothing to do, the same version.
        assert ok("migrate", env={"DATABASE_URL": url}) == first
        result = postbox("migrate", env={"DATABASE_URL": ""})
        assert result.returncode == 2
        assert "give --database-url or set DATABASE_URL" in result.stderr
    finally:
        drop_database(admin_url, url)


def test_queues_send_and_receive(server):
    target = ["--target", server.target]
    name = unique_name("cli")
    created = json.loads(ok("queues", "create", name, "--visibility-timeout", "5", *target))
    assert created["queue"]["name"] == name
    assert created["queue"]["visibilityTimeout"] == "5s"
    listed = json.loads(ok("queues", "list", *target))
    assert name in [queue["name"] for queue in listed["queues"]]
    assert json.loads(ok("queues", "get", name, *target))["queue"]["name"] == name

    sent = json.loads(ok("send", name, "hello from the shell", *target))
    assert sent["messageId"]
    (received,) = _json_documents(ok("receive", name, "--delete", "--wait", "1", *target))
    assert base64.b64decode(received["body"]) == b"hello from the shell"
    assert received["messageId"] == sent["messageId"]
    # Deleted with --delete: nothing left to receive.
    assert ok("receive", name, *target).strip() == ""

    assert ok("queues", "delete", name, *target).strip() == f"deleted {name}"
    missing = postbox("send", name, "x", *target)
    assert missing.returncode == 1
    assert missing.stderr.startswith("NOT_FOUND: ")
    assert name in missing.stderr


def test_the_target_comes_from_the_environment(server):
    env = {"POSTBOX_TARGET": server.target}
    name = unique_name("cli_env")
    ok("queues", "create", name, env=env)
    listed = json.loads(ok("queues", "list", env=env))
    assert name in [queue["name"] for queue in listed["queues"]]
    ok("queues", "delete", name, env=env)


@pytest.mark.parametrize("verb", [["queues", "list"], ["send", "q", "x"], ["receive", "q"]])
def test_an_unreachable_server_is_an_error_not_a_traceback(verb):
    result = postbox(*verb, "--target", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("UNAVAILABLE: ")
    assert "Traceback" not in result.stderr
