"""Background work of a server process."""

from __future__ import annotations

import logging

from postbox_server.errors import ApiError


class OutageLog:
    """Logs that a worker cannot reach the database once per outage, not once per tick."""

    def __init__(self, log: logging.Logger, what: str) -> None:
        self.log = log
        self.what = what
        self.failing = False

    def failed(self, error: ApiError) -> None:
        if not self.failing:
            self.log.warning("%s failed: %s", self.what, error.message)
        self.failing = True

    def worked(self) -> None:
        if self.failing:
            self.log.info("%s works again", self.what)
        self.failing = False
