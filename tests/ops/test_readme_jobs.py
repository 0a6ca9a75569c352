"""The README's "A job's life": each block (SQL in psql, the Python SDK, curl, the CLI)
runs as written against a real server on its own database, only the ports replaced by
the test server's, and what each prints shows the job in flight with its consumer, then
succeeded with its result. Each door starts from no queue `emails`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import ROOT, HttpServerProcess, create_database, drop_database, run_sql

SECTION = "## A job's life"
RESULT = '{"sent": true}'


def readme_blocks() -> dict[str, str]:
    """The section's blocks, by the door their `<!-- job life: ... -->` marker names."""
    text = (ROOT / "README.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"<!-- job life: (\w+) -->\n```\w+\n(.*?)```", section, re.S))


@pytest.fixture(scope="module")
def blocks() -> dict[str, str]:
    found = readme_blocks()
    assert sorted(found) == ["cli", "curl", "python", "sql"], sorted(found)
    return found


@pytest.fixture(scope="module")
def database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_readme_jobs")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def server(database: str) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(database).start()
    yield process
    process.stop()


@pytest.fixture
def fresh(database: str) -> str:
    """No queue `emails`, whatever door ran before."""
    run_sql(database, "SELECT postbox.drop_queue(name) FROM postbox.queues WHERE name = 'emails'")
    return database


def run(command: list[str], script: str, server: HttpServerProcess) -> str:
    """Runs a README block with the README's ports pointed at the test server."""
    script = script.replace("localhost:50051", server.target)
    script = script.replace("localhost:8080", f"127.0.0.1:{server.http_port}")
    env = {
        **os.environ,
        "POSTBOX_TARGET": server.target,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    done = subprocess.run(
        command, input=script, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_sql(blocks, fresh, server):
    out = run(
        ["psql", fresh, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"], blocks["sql"], server
    )
    lines = [line for line in out.splitlines() if line]
    assert "in_flight|1|worker-1" in lines
    assert f"succeeded|{RESULT}" in lines


def test_python_sdk(blocks, fresh, server):
    out = run([sys.executable, "-"], blocks["python"], server).splitlines()
    assert out[0] == "MESSAGE_STATE_IN_FLIGHT worker-1"
    assert out[1] == f"MESSAGE_STATE_SUCCEEDED b'{RESULT}'"
    assert re.fullmatch(r"\['\d+'\]", out[2]), out[2]  # the succeeded job, listed


def test_curl(blocks, fresh, server):
    out = run(["bash", "-euo", "pipefail"], blocks["curl"], server).splitlines()
    assert out[-5:-1] == ["MESSAGE_STATE_IN_FLIGHT", "worker-1", "MESSAGE_STATE_SUCCEEDED", RESULT]
    assert out[-1].isdigit()  # the succeeded job's id, listed


def test_cli(blocks, fresh, server):
    out = run(["bash", "-euo", "pipefail"], blocks["cli"], server)
    # `list --state in_flight`, then `get -o json`, then `list --state succeeded`.
    assert re.search(r"^\d+ +emails +MESSAGE_STATE_IN_FLIGHT +1 +worker-1 ", out, re.M), out
    assert '"state": "MESSAGE_STATE_SUCCEEDED"' in out
    assert '"result": "{\\"sent\\": true}"' in out
    assert re.search(r"^\d+ +emails +MESSAGE_STATE_SUCCEEDED +1 +worker-1 ", out, re.M), out
