"""The gRPC side of the Spark data source: channels, retries and a bounded batch sender.

Everything here runs on executors (and in the driver's Python workers for the
stream reader), so it holds only picklable settings until a task opens a channel.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

import grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import (
    queue_service_pb2,
    queue_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)

log = logging.getLogger(__name__)

BatchRequest = pb.SendBatchRequest | topic_service_pb2.PublishBatchRequest
BatchResponse = pb.SendBatchResponse | topic_service_pb2.PublishBatchResponse
# A string: grpc.Future is generic in the type stubs only.
BatchFuture: TypeAlias = "grpc.Future[BatchResponse]"

# The method of each request type, and how its answer is read.
_METHODS: dict[str, tuple[str, Callable[[bytes], BatchResponse]]] = {
    "SendBatch": ("/postbox.v1.MessageService/SendBatch", pb.SendBatchResponse.FromString),
    "PublishBatch": (
        "/postbox.v1.TopicService/PublishBatch",
        topic_service_pb2.PublishBatchResponse.FromString,
    ),
}


@dataclass(frozen=True)
class EncodedRequest:
    """A SendBatch or PublishBatch request already serialized: the encoder builds the
    bytes of a request of bodies alone directly, and gRPC sends them as they are."""

    method: str  # a key of _METHODS
    destination: str  # for messages: "queue 'orders'"
    entries: int
    payload: bytes

    @classmethod
    def of(cls, request: BatchRequest) -> EncodedRequest:
        if isinstance(request, pb.SendBatchRequest):
            method, destination = "SendBatch", f"queue {request.queue!r}"
        else:
            method, destination = "PublishBatch", f"topic {request.topic!r}"
        return cls(method, destination, len(request.entries), request.SerializeToString())


# The server is restarting, failing over or overloaded: the call may or may not
# have committed, so a retry is safe only because sends carry idempotency ids.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

T = TypeVar("T")


class PostboxCallError(RuntimeError):
    """A call failed for good: the task fails with it, and Spark may retry the task."""


@dataclass(frozen=True)
class Connection:
    """Where the server is and how to reach it; read on the driver, used on executors."""

    target: str
    auth_token: str | None = None
    tls: bool = False
    # PEM bytes read on the driver, so executors need no copy of the file.
    root_certificates: bytes | None = None
    # A client certificate and its key, for a server that requires one (mutual TLS).
    certificate_chain: bytes | None = None
    private_key: bytes | None = None
    server_name: str | None = None
    # Deadline of one call, in seconds.
    timeout: float = 60.0

    def open(self) -> grpc.Channel:
        options: list[tuple[str, str | int]] = [
            # Bodies may be large; the server enforces its own limits.
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
        ]
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                self.root_certificates, self.private_key, self.certificate_chain
            )
            return grpc.secure_channel(self.target, credentials, options=options)
        return grpc.insecure_channel(self.target, options=options)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        if not self.auth_token:
            return ()
        return (("authorization", f"Bearer {self.auth_token}"),)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff, with jitter, for calls that failed with a RETRYABLE status."""

    attempts: int = 8
    first_delay: float = 0.2
    max_delay: float = 10.0

    def delays(self) -> Iterator[float]:
        """The pause before each retry (attempts - 1 of them)."""
        ceiling = self.first_delay
        for _ in range(self.attempts - 1):
            yield random.uniform(ceiling / 2, ceiling)
            ceiling = min(ceiling * 2, self.max_delay)


# Refusals of the key: retrying cannot help, and the fix is an option.
_REFUSED_KEY = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def describe(error: grpc.RpcError) -> str:
    code = error.code()
    text = f"{code.name}: {error.details()}"
    if code in _REFUSED_KEY:
        text += "; check option 'auth_token' (the secret of an API key with the grant this needs)"
    return text


def check_auth_token(connection: Connection, queue: str | None, topic: str | None) -> None:
    """Fails the job at once, on the driver, when the server refuses option 'auth_token'
    (or needs one), rather than in every task. One call that any key with a grant on
    the queue passes (a topic's needs `read`: a refusal of the grant is left to tasks)."""
    with connection.open() as channel:
        try:
            if queue is not None:
                queue_service_pb2_grpc.QueueServiceStub(channel).GetQueue(
                    queue_service_pb2.GetQueueRequest(name=queue),
                    timeout=connection.timeout,
                    metadata=connection.metadata,
                )
            elif topic is not None:
                topic_service_pb2_grpc.TopicServiceStub(channel).GetTopic(
                    topic_service_pb2.GetTopicRequest(name=topic),
                    timeout=connection.timeout,
                    metadata=connection.metadata,
                )
        except grpc.RpcError as error:
            # Anything else (no such queue, the server restarting) is the tasks' to meet.
            if error.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise PostboxCallError(f"the server refused the key: {describe(error)}") from None


def call_with_retries(
    what: str,
    retry: RetryPolicy,
    call: Callable[[], T],
    on_retry: Callable[[], None] | None = None,
) -> T:
    """`call()`, again after a pause while it fails with a RETRYABLE status."""
    delays = retry.delays()
    while True:
        try:
            return call()
        except grpc.RpcError as error:
            delay = next(delays, None) if error.code() in RETRYABLE else None
            if delay is None:
                raise PostboxCallError(f"{what} failed: {describe(error)}") from error
            log.warning("%s failed (%s); retrying in %.1f s", what, describe(error), delay)
            if on_retry is not None:
                on_retry()
            time.sleep(delay)


def _duplicates(response: BatchResponse) -> int:
    """Entries the server had already committed: SendBatch or PublishBatch responses."""
    if isinstance(response, pb.SendBatchResponse):
        return sum(response.duplicates)
    return sum(1 for result in response.results if any(result.duplicates))


class BatchSender:
    """Sends the SendBatch (or PublishBatch) requests of one task, at most `max_in_flight`
    unanswered.

    A request that fails with a RETRYABLE status is sent again after a pause; any
    other failure, or running out of attempts, raises PostboxCallError so the task
    fails rather than dropping the batch.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        connection: Connection,
        retry: RetryPolicy,
        max_in_flight: int,
    ) -> None:
        # Requests arrive serialized: no request_serializer, gRPC sends the bytes.
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable[bytes, BatchResponse]] = {
            method: channel.unary_unary(path, response_deserializer=read)
            for method, (path, read) in _METHODS.items()
        }
        self._connection = connection
        self._retry = retry
        self._max_in_flight = max_in_flight
        self._in_flight: deque[tuple[EncodedRequest, BatchFuture]] = deque()
        self.messages = 0
        # Entries the server had already committed (an earlier attempt sent them).
        self.duplicates = 0
        self.batches = 0
        self.retries = 0

    def submit(self, request: EncodedRequest) -> None:
        while len(self._in_flight) >= self._max_in_flight:
            self._settle(*self._in_flight.popleft())
        self._in_flight.append((request, self._start(request)))

    def finish(self) -> None:
        """Waits until every submitted request is committed; raises if one cannot be."""
        while self._in_flight:
            self._settle(*self._in_flight.popleft())

    def _start(self, request: EncodedRequest) -> BatchFuture:
        return self._calls[request.method].future(
            request.payload, timeout=self._connection.timeout, metadata=self._connection.metadata
        )

    def _settle(self, request: EncodedRequest, future: BatchFuture) -> None:
        started = [future]

        def wait() -> BatchResponse:
            # The first wait is for the call already under way; a retry starts a new one.
            return (started.pop() if started else self._start(request)).result()

        def count_retry() -> None:
            self.retries += 1

        response = call_with_retries(
            f"{request.method} of {request.entries} messages to {request.destination}",
            self._retry,
            wait,
            count_retry,
        )
        self.messages += request.entries
        self.duplicates += _duplicates(response)
        self.batches += 1
