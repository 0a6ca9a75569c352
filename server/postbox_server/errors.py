"""The error every layer raises toward the client: a gRPC status code and a message."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import grpc

from postbox_server.tenant_names import without_caller_prefix

log = logging.getLogger(__name__)

# What an error may quote of the caller's input, and how long a message may get: a
# status travels in metadata, which clients cap at 16 KiB.
QUOTED_PREFIX = 80  # a whole name (80 characters at most) is quoted whole
MAX_MESSAGE = 1000
# A quoted value in a message, as quote_literal() or repr() writes it, longer than a prefix.
_LONG_QUOTED = re.compile(rf"'((?:[^'\\]|''|\\.){{{QUOTED_PREFIX + 1},}})'", re.DOTALL)


def quoted(value: str) -> str:
    """The caller's input as an error quotes it: whole when short, else its first
    QUOTED_PREFIX characters and its length, so no input can make a message long."""
    if len(value) <= QUOTED_PREFIX:
        return repr(value)
    return f"{value[:QUOTED_PREFIX]!r}… ({_byte_length(value)} bytes)"


def _byte_length(text: str) -> int:
    """Bytes of text in UTF-8. surrogatepass: text decoded leniently (HTTP headers with
    surrogateescape, JSON's lone "\\udc80") holds lone surrogates that strict UTF-8
    cannot encode; a message about it must not fail for that."""
    return len(text.encode("utf-8", "surrogatepass"))


def bounded(message: str) -> str:
    """A message fit to send: every long quoted value cut to a prefix with its length, and
    the whole at most MAX_MESSAGE characters whatever it holds."""
    message = _LONG_QUOTED.sub(
        lambda m: f"'{m.group(1)[:QUOTED_PREFIX]}…' ({_byte_length(m.group(1))} bytes)", message
    )
    if len(message) > MAX_MESSAGE:
        message = f"{message[: MAX_MESSAGE - 60]}… (message cut from {len(message)} characters)"
    return message


class ApiError(Exception):
    """A call refused or failed, with the status to report and a message saying what to fix."""

    def __init__(self, code: grpc.StatusCode, message: str, *, paused: bool = False) -> None:
        # Whoever wrote it, input never makes it oversized, and a tenant's caller reads
        # the names it sent, not their stored <tenant>/<name>.
        message = bounded(without_caller_prefix(message))
        super().__init__(message)
        self.code = code
        self.message = message
        # UNAVAILABLE because the queue is paused, not because the database is down.
        self.paused = paused
        # Trailing metadata for the caller, with the status (a batch's refused entry).
        self.metadata: tuple[tuple[str, str], ...] = ()


def invalid(message: str) -> ApiError:
    return ApiError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class Refused:
    """A request of a stream whose method answers each request on its own (Rule.per_request)
    that the authorisation interceptor refused: passed on in its place, with the error, for
    the method to answer, so one refused request does not end the stream."""

    request: Any
    error: ApiError


def crashed(error: BaseException) -> ApiError:
    """What a caller is told of a call that raised something unexpected: UNKNOWN and the
    exception's type, never its text (which may hold the caller's input whole, as an
    OSError quotes a file name); the whole of it goes to the server's log."""
    log.error("%s failed", type(error).__name__, exc_info=error)
    return ApiError(grpc.StatusCode.UNKNOWN, f"Unexpected {type(error).__name__}")
