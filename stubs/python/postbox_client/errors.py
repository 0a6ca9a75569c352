"""Typed errors: one class per gRPC status a postbox server answers with."""

from __future__ import annotations

import grpc
from google.rpc import status_pb2


class PostboxError(Exception):
    """A call the server refused or could not serve; `code` is its gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(PostboxError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(PostboxError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(PostboxError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(PostboxError):
    """Often a stale receipt: the message was delivered again since."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(PostboxError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(PostboxError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(PostboxError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(PostboxError):
    """The server or its database is away (or a queue is paused); worth a retry."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(PostboxError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


_BY_CODE: dict[grpc.StatusCode, type[PostboxError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
    )
}


def from_rpc_error(error: grpc.RpcError) -> PostboxError:
    """The typed error for a failed call."""
    code = error.code()
    details = error.details() or code.name
    cls = _BY_CODE.get(code, PostboxError)
    return cls(details, code)


_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}


def from_status(status: status_pb2.Status) -> PostboxError:
    """The typed error for a google.rpc.Status that a stream answered one request with."""
    code = _BY_NUMBER.get(status.code, grpc.StatusCode.UNKNOWN)
    return _BY_CODE.get(code, PostboxError)(status.message or code.name, code)
