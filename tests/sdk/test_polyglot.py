"""The generated TypeScript and Go clients (stubs/ts, stubs/go) against the real server:
each runs the same conformance scenario (tests/sdk/polyglot/) as a child process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from support import ROOT, ServerProcess, unique_name

# Generous: a cold Node start and a few round trips take ~1 s; the long-poll step
# waits at most 20 s by its own request.
TIMEOUT = 120


def run_scenario(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_typescript_scenario(server: ServerProcess) -> None:
    assert (ROOT / "stubs/ts/node_modules").is_dir(), "run `npm ci --prefix stubs/ts` first"
    scenario = ROOT / "tests" / "sdk" / "polyglot" / "ts" / "scenario.mjs"
    out = run_scenario(["node", str(scenario), server.target, unique_name("poly")], ROOT)
    assert "7 passed, 0 failed" in out


def test_go_scenario(server: ServerProcess, tmp_path: Path) -> None:
    # GOPATH mode with Debian's Go libraries, no module proxy: the repo is linked in
    # as $GOPATH/src/postbox, the import path buf.gen.yaml gives stubs/go.
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "postbox").symlink_to(ROOT)
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{tmp_path}:/usr/share/gocode",
        "GOFLAGS": "",
    }
    scenario = ROOT / "tests" / "sdk" / "polyglot" / "go" / "scenario.go"
    out = run_scenario(["go", "run", str(scenario), server.target, unique_name("poly")], ROOT, env)
    assert "7 passed, 0 failed" in out
