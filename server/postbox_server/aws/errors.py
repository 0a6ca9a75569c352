"""The errors SQS and SNS share: what an error is (its code, HTTP status and fault in each
protocol), and the errors every AWS query service reports."""

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


class AwsError(Exception):
    """A refused or failed action, as the client is to see it."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        message = bounded(message)  # input never makes an oversized error
        super().__init__(message)
        self.kind = kind
        self.message = message
        # The trailing metadata of the postbox call that failed, if one did.
        self.metadata: dict[str, str] = {}
        # Refused for naming another account than the caller's, before the server saw
        # the caller: answered only once the server has authenticated it (aws/app.py).
        self.other_account = False


def of_another_account(error: AwsError) -> AwsError:
    """The error, marked as the refusal of a URL or ARN of another account."""
    error.other_account = True
    return error


def error_kind(
    code: str, status: int = 400, shape: str | None = None, sender: bool = True
) -> ErrorKind:
    return ErrorKind(code, status, shape or code, sender)


# Errors common to all AWS query services.
INVALID_PARAMETER_VALUE = error_kind("InvalidParameterValue")
MISSING_PARAMETER = error_kind("MissingParameter")
INVALID_ACTION = error_kind("InvalidAction")
# A request that is no AWS call at all: another path, method or content type.
INVALID_ADDRESS = error_kind("InvalidAddress", 404)
INVALID_HTTP_REQUEST = error_kind("InvalidHttpRequest")
MISSING_ACTION = error_kind("MissingAction")
ACCESS_DENIED = error_kind("AccessDenied", 403)
INCOMPLETE_SIGNATURE = error_kind("IncompleteSignature")
MISSING_AUTHENTICATION_TOKEN = error_kind("MissingAuthenticationToken", 403)
INVALID_CLIENT_TOKEN_ID = error_kind("InvalidClientTokenId", 403)
SIGNATURE_DOES_NOT_MATCH = error_kind("SignatureDoesNotMatch", 403)
REQUEST_EXPIRED = error_kind("RequestExpired")
REQUEST_ENTITY_TOO_LARGE = error_kind("RequestEntityTooLarge", 413)
SERVICE_UNAVAILABLE = error_kind("ServiceUnavailable", 503, sender=False)
INTERNAL_FAILURE = error_kind("InternalFailure", 500, sender=False)
# AWS's common error for a caller over its request rate (HTTP 400): the key's rate
# limit (auth/ratelimits.py), for SQS and SNS alike.
THROTTLING = error_kind("ThrottlingException")


# A queue the call names is missing: SQS's error, which SNS reports too when a
# subscription's endpoint names a queue of another account or region.
QUEUE_DOES_NOT_EXIST = error_kind(
    "AWS.SimpleQueueService.NonExistentQueue", shape="QueueDoesNotExist"
)


def invalid_parameter(message: str) -> AwsError:
    return AwsError(INVALID_PARAMETER_VALUE, message)


def missing_parameter(name: str) -> AwsError:
    return AwsError(MISSING_PARAMETER, f"The request must contain the parameter {name}.")


def queue_does_not_exist() -> AwsError:
    return AwsError(QUEUE_DOES_NOT_EXIST, "The specified queue does not exist.")
