"""SQS's own errors, with the codes and statuses of the SQS service model."""

from __future__ import annotations

import grpc

from postbox_server.aws import errors
from postbox_server.aws.errors import ErrorKind, error_kind

# Errors the SQS service model declares: codes and statuses as in its query-protocol form.
QUEUE_NAME_EXISTS = error_kind("QueueAlreadyExists", shape="QueueNameExists")
RECEIPT_HANDLE_IS_INVALID = error_kind("ReceiptHandleIsInvalid")
INVALID_ATTRIBUTE_NAME = error_kind("InvalidAttributeName")
INVALID_ATTRIBUTE_VALUE = error_kind("InvalidAttributeValue")
INVALID_MESSAGE_CONTENTS = error_kind("InvalidMessageContents")
EMPTY_BATCH_REQUEST = error_kind(
    "AWS.SimpleQueueService.EmptyBatchRequest", shape="EmptyBatchRequest"
)
TOO_MANY_ENTRIES_IN_BATCH_REQUEST = error_kind(
    "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", shape="TooManyEntriesInBatchRequest"
)
BATCH_ENTRY_IDS_NOT_DISTINCT = error_kind(
    "AWS.SimpleQueueService.BatchEntryIdsNotDistinct", shape="BatchEntryIdsNotDistinct"
)
INVALID_BATCH_ENTRY_ID = error_kind(
    "AWS.SimpleQueueService.InvalidBatchEntryId", shape="InvalidBatchEntryId"
)
BATCH_REQUEST_TOO_LONG = error_kind(
    "AWS.SimpleQueueService.BatchRequestTooLong", shape="BatchRequestTooLong"
)
RESOURCE_NOT_FOUND = error_kind("ResourceNotFoundException", 404)
OVER_LIMIT = error_kind("OverLimit", 403)
PURGE_QUEUE_IN_PROGRESS = error_kind(
    "AWS.SimpleQueueService.PurgeQueueInProgress", 403, shape="PurgeQueueInProgress"
)

UNSUPPORTED_OPERATION = error_kind(
    "AWS.SimpleQueueService.UnsupportedOperation", shape="UnsupportedOperation"
)

# gRPC status -> SQS error, for calls that name a queue. NOT_FOUND then means the queue:
# the shim uses the batch RPCs, which report a vanished message per entry instead.
STATUS_ERRORS: dict[grpc.StatusCode, ErrorKind] = {
    grpc.StatusCode.NOT_FOUND: errors.QUEUE_DOES_NOT_EXIST,
    grpc.StatusCode.ALREADY_EXISTS: QUEUE_NAME_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT: errors.INVALID_PARAMETER_VALUE,
    grpc.StatusCode.OUT_OF_RANGE: errors.INVALID_PARAMETER_VALUE,
    grpc.StatusCode.FAILED_PRECONDITION: errors.INVALID_PARAMETER_VALUE,
    grpc.StatusCode.RESOURCE_EXHAUSTED: OVER_LIMIT,
    grpc.StatusCode.PERMISSION_DENIED: errors.ACCESS_DENIED,
    grpc.StatusCode.UNIMPLEMENTED: UNSUPPORTED_OPERATION,
}
