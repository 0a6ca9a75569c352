"""The error every layer raises toward the client: a gRPC status code and a message."""

from __future__ import annotations

import grpc


class ApiError(Exception):
    """A call refused or failed, with the status to report and a message saying what to fix."""

    def __init__(self, code: grpc.StatusCode, message: str, *, paused: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # UNAVAILABLE because the queue is paused, not because the database is down.
        self.paused = paused


def invalid(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message)
