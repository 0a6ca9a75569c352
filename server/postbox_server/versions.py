"""Which versions of the others this server works with: the SQL engine it installs and
the ones it upgrades, and the clients it serves (docs/operations/versions.md)."""

from __future__ import annotations

from importlib import metadata

import postbox_client

from postbox_server import __version__
from postbox_server.db.migrate import Scripts, format_version

# The gRPC package this server serves; postbox.v1 only ever gains fields and RPCs.
API = "postbox.v1"


def report() -> str:
    """`postbox --version`: this server, the engine range it works with, the API and client."""
    scripts = Scripts.load()
    return "\n".join(
        (
            f"postbox {__version__}",
            f"SQL engine: installs {format_version(scripts.latest)}; upgrades "
            f"{format_version(scripts.oldest)} and later; refuses a newer one",
            f"API: {API}; serves every {API} client (postbox-client, any version)",
            f"postbox-client {metadata.version('postbox-client')}: this server's stubs, "
            f"which must be of its own version ({postbox_client.API})",
        )
    )
