"""scripts/test-postgres-versions: the suites it is given run against a private cluster of
each version, a failing suite fails the run, and nothing is left behind.

Run here on Debian's PostgreSQL 15 (its bin directory, one of the script's two kinds of
version; .ci/run installs it), with a probe suite in place of the engine's, so that the
test takes seconds and never needs PyPI.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-postgres-versions"
DEBIAN_15 = Path("/usr/lib/postgresql/15/bin")

PROBE = """
import asyncio, os, shutil
from pathlib import Path

import asyncpg


def test_the_suite_reaches_the_versions_own_cluster():
    async def look():
        conn = await asyncpg.connect(os.environ["POSTBOX_TEST_DATABASE_URL"])
        try:
            return await conn.fetchval(
                "SELECT current_setting('data_directory') || ' '"
                " || current_setting('server_version_num')"
            )
        finally:
            await conn.close()

    seen = f"{os.environ['POSTBOX_TEST_DATABASE_URL']} {asyncio.run(look())} {shutil.which('psql')}"
    Path(os.environ["PROBE_SEEN"]).write_text(seen)


def test_that_fails_on_purpose():
    assert False, "failed on purpose"
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    # Not pytest's tmp_path: as root the script's cluster runs as `postgres`, which must
    # reach its directory, and pytest's base directory is private to its user.
    directory = Path(tempfile.mkdtemp(prefix="postbox-versions-test-"))
    directory.chmod(0o755)
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def run_script(*args: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(scratch), "PROBE_SEEN": str(scratch / "seen")}
    env.pop("POSTBOX_TEST_DATABASE_URL", None)  # the script's own cluster, not this run's
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # initdb, start and stop on a loaded machine take seconds each
    )


async def refused(url: str) -> bool:
    try:
        conn = await asyncpg.connect(url, timeout=10)
    except OSError:
        return True
    await conn.close()
    return False


def test_a_failing_suite_fails_the_run_and_the_cluster_is_gone(scratch):
    probe = scratch / "test_probe.py"
    probe.write_text(PROBE)
    run = run_script(str(DEBIAN_15), "--", "-q", "-p", "no:cacheprovider", str(probe),
                     scratch=scratch)  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr
    assert "1 failed, 1 passed" in run.stdout
    # The table's row: version, binaries, result, seconds, and why.
    row = run.stdout.splitlines()[-1].split()
    assert row[0].startswith("15.")
    assert row[1:3] == [str(DEBIAN_15), "FAILED"]
    assert row[4:] == ["pytest", "exit", "status", "1"]
    url, data_directory, version, psql = (scratch / "seen").read_text().split()
    assert version.startswith("15")
    assert psql == str(DEBIAN_15 / "psql")  # the version's own client first on PATH
    assert Path(data_directory).is_relative_to(scratch)  # a cluster of its own
    assert not Path(data_directory).exists()
    assert list(scratch.glob("postbox-pg*")) == []
    assert asyncio.run(refused(url))


def test_a_version_that_is_neither_a_major_nor_an_installation_is_refused(scratch):
    run = run_script("/nowhere/bin", "16", scratch=scratch)
    assert run.returncode == 2
    assert "'/nowhere/bin' is neither a major version nor a PostgreSQL bin directory" in (
        run.stderr
    )
    assert list(scratch.iterdir()) == []  # refused before anything was fetched or started
