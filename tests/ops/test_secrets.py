"""No password on any command line of a server's process tree."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import pytest
from support import ServerProcess, free_port

PASSWORD = "s3cret-do-not-show"


def with_password(url: str) -> str:
    parts = urlsplit(url)
    user = parts.username or "postgres"
    host = parts.hostname or ""
    netloc = f"{user}:{PASSWORD}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def test_no_process_of_a_server_shows_the_database_password(database_url, tmp_path):
    # The test databases trust their clients, so a password in the URL still connects.
    url_file = tmp_path / "database-url"
    url_file.write_text(with_password(database_url) + "\n")
    url_file.chmod(0o600)
    server = ServerProcess(database_url)
    port = free_port()
    server.port = port
    server.spawn(
        "serve", "--database-url-file", str(url_file), "--grpc-host", "127.0.0.1",
        "--grpc-port", str(port), "--workers", "2",
    )  # fmt: skip
    try:
        server.wait_serving(60)
        tree = psutil.Process(server.process.pid)
        deadline = time.monotonic() + 30
        while len(tree.children()) < 2:  # both workers up
            assert time.monotonic() < deadline
            time.sleep(0.05)
        processes = [tree, *tree.children(recursive=True)]
        for process in processes:
            cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes()
            assert PASSWORD.encode() not in cmdline, process.cmdline()
    finally:
        server.stop()
    assert PASSWORD not in server.log()


def _unreachable(database_url: str) -> str:
    """The URL with its host and port where nothing listens."""
    parts = urlsplit(with_password(database_url))
    return urlunsplit(
        parts._replace(netloc=f"postgres:{PASSWORD}@127.0.0.1:{free_port()}", query="")
    )


def _no_such_role(database_url: str) -> str:
    parts = urlsplit(with_password(database_url))
    return urlunsplit(parts._replace(netloc=parts.netloc.replace("postgres:", "nobody_here:", 1)))


@pytest.mark.parametrize(
    ("broken", "said"),
    [(_unreachable, "'postgres@127.0.0.1:"), (_no_such_role, "'nobody_here@")],
    ids=["unreachable", "no_role"],
)
def test_a_server_that_cannot_connect_says_so_without_the_password(database_url, broken, said):
    url = broken(database_url)
    assert PASSWORD in url
    server = ServerProcess(url)
    server.spawn(
        "serve", "--grpc-host", "127.0.0.1", "--grpc-port", str(server.port),
        env={**os.environ, "DATABASE_URL": url},
    )  # fmt: skip
    try:
        assert server.process.wait(60) == 2
    finally:
        server.stop()
    assert f"postbox serve: cannot connect to the database {said}" in server.log(), server.log()
    assert PASSWORD not in server.log()
    assert "Traceback" not in server.log()
