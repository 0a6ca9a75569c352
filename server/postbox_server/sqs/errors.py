"""SQS errors: the code, HTTP status and fault that each protocol reports."""

from __future__ import annotations

from dataclasses import dataclass

from postbox_server.errors import bounded


@dataclass(frozen=True)
class ErrorKind:
    # The query-protocol code; the JSON protocol sends it in x-amzn-query-error.
    code: str
    status: int
    # The JSON protocol's shape name (`__type` is "com.amazonaws.sqs#<shape>").
    shape: str
    # Whether the caller is at fault ("Sender") or the service ("Receiver").
    sender: bool = True

    @property
    def fault(self) -> str:
        return "Sender" if self.sender else "Receiver"


class SqsError(Exception):
    """A refused or failed action, as the client is to see it."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        message = bounded(message)  # input never makes an oversized error
        super().__init__(message)
        self.kind = kind
        self.message = message


def _kind(code: str, status: int = 400, shape: str | None = None, sender: bool = True) -> ErrorKind:
    return ErrorKind(code, status, shape or code, sender)


# Errors the SQS service model declares: codes and statuses as in its query-protocol form.
QUEUE_DOES_NOT_EXIST = _kind("AWS.SimpleQueueService.NonExistentQueue", shape="QueueDoesNotExist")
QUEUE_NAME_EXISTS = _kind("QueueAlreadyExists", shape="QueueNameExists")
RECEIPT_HANDLE_IS_INVALID = _kind("ReceiptHandleIsInvalid")
INVALID_ATTRIBUTE_NAME = _kind("InvalidAttributeName")
INVALID_ATTRIBUTE_VALUE = _kind("InvalidAttributeValue")
INVALID_MESSAGE_CONTENTS = _kind("InvalidMessageContents")
EMPTY_BATCH_REQUEST = _kind("AWS.SimpleQueueService.EmptyBatchRequest", shape="EmptyBatchRequest")
TOO_MANY_ENTRIES_IN_BATCH_REQUEST = _kind(
    "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", shape="TooManyEntriesInBatchRequest"
)
BATCH_ENTRY_IDS_NOT_DISTINCT = _kind(
    "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", shape="BatchEntryIdsNotDistinct"
)
INVALID_BATCH_ENTRY_ID = _kind(
    "AWS.SimpleQueueService.InvalidBatchEntryId", shape="InvalidBatchEntryId"
)
BATCH_REQUEST_TOO_LONG = _kind(
    "AWS.SimpleQueueService.BatchRequestTooLong", shape="BatchRequestTooLong"
)
UNSUPPORTED_OPERATION = _kind(
    "AWS.SimpleQueueService.UnsupportedOperation", shape="UnsupportedOperation"
)
RESOURCE_NOT_FOUND = _kind("ResourceNotFoundException", 404)
OVER_LIMIT = _kind("OverLimit", 403)
# AWS's common error for a caller over its request rate (HTTP 400).
THROTTLING = _kind("ThrottlingException")
PURGE_QUEUE_IN_PROGRESS = _kind(
    "AWS.SimpleQueueService.PurgeQueueInProgress", 403, shape="PurgeQueueInProgress"
)

# Errors common to all AWS query services.
INVALID_PARAMETER_VALUE = _kind("InvalidParameterValue")
MISSING_PARAMETER = _kind("MissingParameter")
INVALID_ACTION = _kind("InvalidAction")
# A request that is no SQS call at all: another path, method or content type.
INVALID_ADDRESS = _kind("InvalidAddress", 404)
INVALID_HTTP_REQUEST = _kind("InvalidHttpRequest")
MISSING_ACTION = _kind("MissingAction")
ACCESS_DENIED = _kind("AccessDenied", 403)
INCOMPLETE_SIGNATURE = _kind("IncompleteSignature")
MISSING_AUTHENTICATION_TOKEN = _kind("MissingAuthenticationToken", 403)
INVALID_CLIENT_TOKEN_ID = _kind("InvalidClientTokenId", 403)
SIGNATURE_DOES_NOT_MATCH = _kind("SignatureDoesNotMatch", 403)
REQUEST_EXPIRED = _kind("RequestExpired")
REQUEST_ENTITY_TOO_LARGE = _kind("RequestEntityTooLarge", 413)
SERVICE_UNAVAILABLE = _kind("ServiceUnavailable", 503, sender=False)
INTERNAL_FAILURE = _kind("InternalFailure", 500, sender=False)


def invalid_parameter(message: str) -> SqsError:
    return SqsError(INVALID_PARAMETER_VALUE, message)


def missing_parameter(name: str) -> SqsError:
    return SqsError(MISSING_PARAMETER, f"The request must contain the parameter {name}.")


def queue_does_not_exist() -> SqsError:
    return SqsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")
