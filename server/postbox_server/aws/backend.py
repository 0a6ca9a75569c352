"""The shim's way to postbox: a grpc.aio channel, the generated stubs, and status mapping."""

from __future__ import annotations

import contextvars
import copy
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox_client import TLS

from postbox_server.auth.interceptor import FAILURE_METADATA
from postbox_server.auth.ratelimits import THROTTLED_METADATA
from postbox_server.aws import errors
from postbox_server.aws.errors import AwsError, ErrorKind

log = logging.getLogger(__name__)

# Receive carries up to 10 messages of up to 1 MiB each; leave room for more.
_MAX_MESSAGE_LENGTH = 64 * 1024 * 1024

# gRPC status -> error, whatever the service: the caller's credentials, and the transient
# failures (SDKs retry a 503). Each service maps the rest (aws/sqs/errors.py, aws/sns/errors.py).
_STATUS_ERRORS: dict[grpc.StatusCode, ErrorKind] = {
    grpc.StatusCode.UNAUTHENTICATED: errors.ACCESS_DENIED,
    grpc.StatusCode.UNAVAILABLE: errors.SERVICE_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.SERVICE_UNAVAILABLE,
    grpc.StatusCode.ABORTED: errors.SERVICE_UNAVAILABLE,
    grpc.StatusCode.CANCELLED: errors.SERVICE_UNAVAILABLE,
}

# Why the server refused a caller (its trailing metadata) -> the error AWS returns.
_AUTH_FAILURES: dict[str, tuple[ErrorKind, str]] = {
    "missing": (errors.MISSING_AUTHENTICATION_TOKEN, "Request is missing Authentication Token"),
    "unknown-key": (
        errors.INVALID_CLIENT_TOKEN_ID,
        "The security token included in the request is invalid.",
    ),
    "expired": (
        errors.INVALID_CLIENT_TOKEN_ID,
        "The security token included in the request is expired.",
    ),
    "signature": (
        errors.SIGNATURE_DOES_NOT_MATCH,
        "The request signature we calculated does not match the signature you provided. "
        "Check your AWS Secret Access Key and signing method.",
    ),
}

# The metadata that authenticates the current request's calls to the server: its
# forwarded signature, or the shim's own key. Set per request by the handler.
CALLER: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "postbox_aws_caller", default=()
)

Response = TypeVar("Response")


def _auth_failure(error: grpc.aio.AioRpcError) -> AwsError | None:
    for name, value in error.trailing_metadata() or ():
        if name == FAILURE_METADATA and value in _AUTH_FAILURES:
            kind, message = _AUTH_FAILURES[value]
            return AwsError(kind, message)
    return None


# postbox's names for what SQS and SNS clients know by AWS's names: a server error's
# details reach the client in AWS's words. Longest first, so that no name is rewritten
# inside a longer one.
_AWS_NAMES = {
    "content_based_deduplication": "ContentBasedDeduplication",
    "redrive_allow_policy": "RedriveAllowPolicy",
    "dead_letter_policy": "RedrivePolicy",
    "dead_letter_queue": "deadLetterTargetArn",
    "max_receive_count": "maxReceiveCount",
    "deduplication_scope": "DeduplicationScope",
    "fifo_throughput_limit": "FifoThroughputLimit",
    "per_message_group_id": "perMessageGroupId",
    "deduplication_id": "MessageDeduplicationId",
    "message_group_id": "MessageGroupId",
    "message_group": "messageGroup",
    "max_message_size": "MaximumMessageSize",
    "visibility_timeout": "VisibilityTimeout",
    "receive_wait_time": "ReceiveMessageWaitTimeSeconds",
    "delivery_delay": "DelaySeconds",
    "filter_policy_scope": "FilterPolicyScope",
    "filter_policy": "FilterPolicy",
    "sns_attributes": "Attributes",
    "retention": "MessageRetentionPeriod",
}
_POSTBOX_NAME = re.compile(r"\b(" + "|".join(_AWS_NAMES) + r")\b")
# Server flags mean nothing to an SQS client: "(--max-message-size)" and the like.
_FLAG = re.compile(r"\s*\(--[a-z-]+\)")


def in_aws_words(details: str) -> str:
    """A postbox server's error text with postbox's field names and flags in AWS's terms."""
    return _POSTBOX_NAME.sub(lambda found: _AWS_NAMES[found.group(1)], _FLAG.sub("", details))


def translate(
    error: grpc.aio.AioRpcError, overrides: Mapping[grpc.StatusCode, ErrorKind]
) -> AwsError:
    translated = _translate(error, overrides)
    translated.metadata = {
        name: value for name, value in error.trailing_metadata() or () if isinstance(value, str)
    }
    return translated


def _translate(
    error: grpc.aio.AioRpcError, overrides: Mapping[grpc.StatusCode, ErrorKind]
) -> AwsError:
    code = error.code()
    if code == grpc.StatusCode.UNAUTHENTICATED:
        failure = _auth_failure(error)
        if failure is not None:
            return failure
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        name == THROTTLED_METADATA for name, _ in error.trailing_metadata() or ()
    ):
        # The caller's key is over its rate limit (auth/ratelimits.py).
        return AwsError(errors.THROTTLING, error.details() or "Rate exceeded")
    kind = overrides.get(code) or _STATUS_ERRORS.get(code)
    if kind is errors.QUEUE_DOES_NOT_EXIST:
        return errors.queue_does_not_exist()
    if kind is None:
        incident = uuid.uuid4().hex[:12]
        log.error("postbox call failed (incident %s): %s %s", incident, code, error.details())
        return AwsError(
            errors.INTERNAL_FAILURE, f"Internal failure {incident}; see the shim's log."
        )
    if kind is errors.SERVICE_UNAVAILABLE:
        return AwsError(kind, f"Service is unable to handle the request: {error.details()}")
    return AwsError(kind, in_aws_words(error.details() or code.name))


class Backend:
    """The postbox server the shim calls."""

    def __init__(self, target: str, timeout: float, tls: TLS | None = None) -> None:
        self.timeout = timeout
        self.status_errors: Mapping[grpc.StatusCode, ErrorKind] = {}
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE_LENGTH),
            ("grpc.max_send_message_length", _MAX_MESSAGE_LENGTH),
        ]
        if tls is None:
            self.channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self.channel = grpc.aio.secure_channel(target, tls.credentials(), options=options)
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.messages = message_service_pb2_grpc.MessageServiceStub(self.channel)
        self.topics = topic_service_pb2_grpc.TopicServiceStub(self.channel)
        # Only to ask which tenant's account a caller's URLs and ARNs carry (aws/accounts.py).
        self.access = access_service_pb2_grpc.AccessServiceStub(self.channel)

    def speaking(self, status_errors: Mapping[grpc.StatusCode, ErrorKind]) -> Backend:
        """This backend (the same channel), its failures reported as one service reports
        them: `status_errors` maps the statuses the shared table leaves to the service."""
        view = copy.copy(self)
        view.status_errors = status_errors
        return view

    async def call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        overrides: Mapping[grpc.StatusCode, ErrorKind] | None = None,
    ) -> Response:
        """A unary call; its failure as the AWS error to report."""
        try:
            return await method(request, timeout=self.timeout, metadata=CALLER.get())
        except grpc.aio.AioRpcError as error:
            raise translate(error, {**self.status_errors, **(overrides or {})}) from None

    async def stream(self, method: Callable[..., Any], request: Any, timeout: float) -> list[Any]:
        """Every response of a server-streaming call; cancelling the caller cancels the call."""
        call = method(request, timeout=timeout, metadata=CALLER.get())
        try:
            return [response async for response in call]
        except grpc.aio.AioRpcError as error:
            raise translate(error, self.status_errors) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        await self.channel.close()
