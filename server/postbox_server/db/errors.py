"""Translates database failures into the API's error vocabulary (gRPC status codes)."""

from __future__ import annotations

import asyncio
import logging
import uuid

import asyncpg
import grpc

from postbox_server.db.disk_space import DISK_FULL, DISK_SPACE
from postbox_server.errors import ApiError

log = logging.getLogger(__name__)

# SQLSTATEs the engine raises (class PB, see sql/postbox--*.sql).
_ENGINE_CODES = {
    "PB400": grpc.StatusCode.INVALID_ARGUMENT,
    "PB404": grpc.StatusCode.NOT_FOUND,
    "PB409": grpc.StatusCode.ALREADY_EXISTS,
    "PB412": grpc.StatusCode.FAILED_PRECONDITION,
    "PB429": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "PB503": grpc.StatusCode.UNAVAILABLE,
}

DISK_FULL_MESSAGE = (
    "the database is out of disk space (SQLSTATE 53100, disk_full): nothing of this call "
    "was committed; retry with backoff once space is freed on the database's data or WAL "
    "disk (the server's health is NOT_SERVING until then)"
)
UNAVAILABLE_MESSAGE = (
    "the database is unavailable (restarting, or failing over to a standby); retry with backoff"
)


class DiskFull(ApiError):
    """RESOURCE_EXHAUSTED: the database had no disk space for a write. Not the fault of
    any one write of a group commit, so the group is not written again item by item."""

    def __init__(self) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, DISK_FULL_MESSAGE)


def _is_unavailable(exc: BaseException) -> bool:
    if isinstance(
        exc,
        (
            OSError,
            asyncio.TimeoutError,
            asyncpg.InterfaceError,
            asyncpg.ConnectionDoesNotExistError,
            asyncpg.CannotConnectNowError,
            # asyncpg's protocol state after the server dropped the connection mid-call
            # ("cannot switch to state ...; another operation is in progress").
            asyncpg.InternalClientError,
        ),
    ):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    # 08: connection exception, 53: insufficient resources, 57P: server shutting down,
    # 25006: a read-only session, on a standby (a failover under way, say).
    return state.startswith(("08", "53", "57P")) or state == "25006"


def pool_exhausted(timeout: float, size: int) -> ApiError:
    """No pooled connection came free within `timeout`: the caller may retry."""
    return ApiError(
        grpc.StatusCode.UNAVAILABLE,
        f"no database connection came free within {timeout:g} s: all {size} of the pool "
        "are busy (--pool-size, --pool-acquire-timeout); retry",
    )


def translate(exc: BaseException) -> ApiError:
    """The ApiError to report for a failure of a database call."""
    if isinstance(exc, ApiError):
        return exc
    state = getattr(exc, "sqlstate", None) or ""
    if state in _ENGINE_CODES:
        return ApiError(
            _ENGINE_CODES[state], exc.args[0] if exc.args else str(exc), paused=state == "PB503"
        )
    if state == DISK_FULL:
        DISK_SPACE.refused(exc.args[0] if exc.args else str(exc))
        return DiskFull()
    if _is_unavailable(exc):
        log.warning("database call failed: %r", exc)
        return ApiError(grpc.StatusCode.UNAVAILABLE, UNAVAILABLE_MESSAGE)
    if state.startswith("22"):
        # Data exceptions: values PostgreSQL cannot store, e.g. a NUL character in
        # text, or invalid UTF-8. The message names the value's problem, not SQL.
        return ApiError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"a value was rejected: {exc.args[0] if exc.args else exc}; text fields must be "
            "valid UTF-8 without NUL characters",
        )
    if state.startswith("23"):
        # An integrity rule caught a race with a concurrent change (say, a queue
        # named as dead-letter queue while being deleted).
        return ApiError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "the call conflicted with a concurrent change; read the current state and retry",
        )
    if state in ("40001", "40P01"):
        return ApiError(grpc.StatusCode.ABORTED, "the call conflicted with another; retry it")
    incident = uuid.uuid4().hex[:12]
    log.error("internal error %s", incident, exc_info=exc)
    return ApiError(grpc.StatusCode.INTERNAL, f"internal error {incident}; see the server log")
