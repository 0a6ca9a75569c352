"""One version scheme: the server and the client share a version, the server pins the
client's stubs to it, and `postbox --version` names the engine versions and API the server
works with, read from what it ships."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

import postbox_client
from support import ROOT

import postbox_server


def test_the_server_and_the_client_share_one_version() -> None:
    version = metadata.version("postbox")
    assert metadata.version("postbox-client") == version
    assert postbox_server.__version__ == postbox_client.__version__ == version
    # The server runs on the client's stubs: exactly its own version of them.
    pins = [r for r in metadata.requires("postbox") or [] if r.startswith("postbox-client")]
    assert pins, "postbox does not depend on postbox-client"
    assert all(re.search(rf"=={re.escape(version)}\b", pin) for pin in pins), pins


def test_version_names_the_engine_versions_and_the_api_it_works_with() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "postbox_server", "--version"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    control = (ROOT / "sql" / "postbox.control").read_text()
    engine = re.search(r"default_version\s*=\s*'([\d.]+)'", control)
    assert engine is not None
    # The oldest engine an upgrade script starts from, read from the file names here.
    starts = [p.name.split("--")[1] for p in (ROOT / "sql").glob("postbox--*--*.sql")]
    oldest = min(starts, key=lambda v: tuple(map(int, v.split("."))))
    assert result.stdout.splitlines() == [
        f"postbox {postbox_server.__version__}",
        f"SQL engine: installs {engine.group(1)}; upgrades {oldest} and later; refuses a newer one",
        "API: postbox.v1; serves every postbox.v1 client (postbox-client, any version)",
        f"postbox-client {postbox_client.__version__}: this server's stubs, which must be of "
        "its own version (postbox.v1)",
    ]
