"""The event loop of every long-running postbox process: uvloop.

A served message passes through gRPC's handlers, two asyncpg calls and their
socket writes, all callbacks of the loop, and uvloop runs those callbacks for
less CPU than asyncio's own loop: the server spent about a seventh less CPU per
message of Receive+Delete (bench receive_delete_10, five and six alternating runs).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

T = TypeVar("T")


def run(main: Coroutine[Any, Any, T]) -> T:
    """Runs `main` to its end on a new uvloop loop, as asyncio.run would."""
    return uvloop.run(main)
