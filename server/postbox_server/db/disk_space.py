"""Whether the database is out of disk space, as its refusals say (SQLSTATE 53100).

A database whose disk is full still answers a ping (reads need no space), so the
health check cannot see it; the writes it refuses can. The first refusal marks the
database full, says so once in the log, and wakes the health watcher, which answers
NOT_SERVING (and /readyz `degraded`, with the reason) and tries a small write of its
own every second (`disk_probe` in queries.sql) until one succeeds: space is back.
One per process: each process of `serve --workers N` sees its own calls' refusals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

# PostgreSQL's SQLSTATE disk_full: a write needed a new block or file and the
# filesystem had none. The statement failed and its transaction rolled back.
DISK_FULL = "53100"


class DiskSpace:
    """The last disk-full refusal of this process's database, until space is back."""

    def __init__(self) -> None:
        # PostgreSQL's message of the refusal that marked the database full.
        self.refusal: str | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def full(self) -> bool:
        return self.refusal is not None

    def on_refusal(self, callback: Callable[[], None]) -> None:
        """Calls `callback` (no I/O in it) when a refusal marks the database full."""
        self._listeners.append(callback)

    def refused(self, detail: str) -> None:
        if self.refusal is not None:
            return
        self.refusal = detail
        log.warning(
            "the database is out of disk space (%s): writes fail with RESOURCE_EXHAUSTED "
            "and health is NOT_SERVING until space is freed on its data or WAL disk",
            detail,
        )
        for listener in self._listeners:
            listener()

    def freed(self) -> None:
        if self.refusal is not None:
            self.refusal = None
            log.info("the database has disk space again: writes succeed")


DISK_SPACE = DiskSpace()
