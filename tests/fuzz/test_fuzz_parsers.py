"""A short coverage-guided pass (atheris) over each parser of outside input.

Each target runs in its own process, from the committed seeds in tests/fuzz/corpus, for
FUZZ_SECONDS or FUZZ_RUNS inputs, whichever ends first; a finding fails the test with
the input and the traceback. Long passes: docs/reference/fuzzing.md.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from support import create_database, drop_database

from postbox_server.db.migrate import migrate

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from harnesses import ENGINE_TARGETS, TARGETS  # noqa: E402

# Bounded by time on a loaded CI box; the runs bound it on a fast one.
FUZZ_SECONDS = int(os.environ.get("POSTBOX_FUZZ_SECONDS", "8"))
FUZZ_RUNS = int(os.environ.get("POSTBOX_FUZZ_RUNS", "20000"))


@pytest.fixture(scope="module")
def engine_database(admin_url: str) -> Iterator[str]:
    """A database with the engine installed, for the parsers written in SQL."""
    url = create_database(admin_url, "postbox_fuzz")

    async def install() -> None:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
        finally:
            await conn.close()

    asyncio.run(install())
    yield url
    drop_database(admin_url, url)


def test_every_target_has_seeds():
    for target in TARGETS:
        seeds = list((HERE / "corpus" / target).iterdir())
        assert seeds, f"tests/fuzz/corpus/{target} has no seed inputs"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_short_pass_finds_nothing(request, target, tmp_path):
    env = dict(os.environ)
    if target in ENGINE_TARGETS:
        env["POSTBOX_FUZZ_DATABASE_URL"] = request.getfixturevalue("engine_database")
    result = subprocess.run(
        [
            sys.executable,
            str(HERE / "run.py"),
            target,
            f"-max_total_time={FUZZ_SECONDS}",
            f"-runs={FUZZ_RUNS}",
            "--keep",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=FUZZ_SECONDS * 10 + 60,  # start-up and instrumentation on a loaded box
    )
    assert result.returncode == 0, f"{target} found a failure:\n{result.stderr[-4000:]}"
    assert "Done" in result.stderr, result.stderr[-2000:]
