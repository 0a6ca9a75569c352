"""SNS's errors: codes and HTTP statuses as the SNS service model declares them."""

from __future__ import annotations

import grpc

from postbox_server.aws.errors import AwsError, ErrorKind


def _kind(code: str, status: int = 400) -> ErrorKind:
    return ErrorKind(code, status, code)


INVALID_PARAMETER = _kind("InvalidParameter")
INVALID_PARAMETER_VALUE = _kind("ParameterValueInvalid")
NOT_FOUND = _kind("NotFound", 404)
RESOURCE_NOT_FOUND = _kind("ResourceNotFound", 404)
AUTHORIZATION_ERROR = _kind("AuthorizationError", 403)
FILTER_POLICY_LIMIT_EXCEEDED = _kind("FilterPolicyLimitExceeded", 403)
EMPTY_BATCH_REQUEST = _kind("EmptyBatchRequest")
TOO_MANY_ENTRIES_IN_BATCH_REQUEST = _kind("TooManyEntriesInBatchRequest")
BATCH_ENTRY_IDS_NOT_DISTINCT = _kind("BatchEntryIdsNotDistinct")
INVALID_BATCH_ENTRY_ID = _kind("InvalidBatchEntryId")
BATCH_REQUEST_TOO_LONG = _kind("BatchRequestTooLong")
INVALID_ACTION = _kind("InvalidAction")
TAG_LIMIT_EXCEEDED = _kind("TagLimitExceeded")
THROTTLED = ErrorKind("Throttled", 429, "ThrottledException", sender=False)

# gRPC status -> SNS error, for calls on topics and subscriptions.
STATUS_ERRORS: dict[grpc.StatusCode, ErrorKind] = {
    grpc.StatusCode.NOT_FOUND: NOT_FOUND,
    grpc.StatusCode.INVALID_ARGUMENT: INVALID_PARAMETER,
    grpc.StatusCode.OUT_OF_RANGE: INVALID_PARAMETER,
    grpc.StatusCode.FAILED_PRECONDITION: INVALID_PARAMETER,
    grpc.StatusCode.ALREADY_EXISTS: INVALID_PARAMETER,
    grpc.StatusCode.PERMISSION_DENIED: AUTHORIZATION_ERROR,
    grpc.StatusCode.RESOURCE_EXHAUSTED: THROTTLED,
}


class InvalidParameter(AwsError):
    """SNS's InvalidParameter, with the message given."""

    def __init__(self, message: str) -> None:
        super().__init__(INVALID_PARAMETER, message)


def not_found(message: str) -> AwsError:
    return AwsError(NOT_FOUND, message)
