"""Clients of a postbox server: `AsyncClient` (asyncio) and `Client` (blocking).

Both wrap the generated stubs (reachable as `.queues`, `.messages`, `.topics`,
`.schedules`, and `.streams` on AsyncClient, for everything the helpers here do not
cover), present an API key when given one, map failures to the typed errors of
`postbox_client.errors`, and retry UNAVAILABLE with exponential backoff on calls that are
safe to repeat: reads, deletes by receipt, and sends that carry a deduplication id.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, cast

import grpc
from postbox.v1 import (
    message_pb2,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)

from postbox_client.consumer import Consumer, ConsumerOptions
from postbox_client.errors import PostboxError, Unavailable, from_rpc_error
from postbox_client.fields import Attributes, attribute_values, send_fields
from postbox_client.operations import Operations, nack_request
from postbox_client.producer import Producer, ProducerOptions
from postbox_client.send_stream import TaggedStream
from postbox_client.streams import BlockingStreamReader, StreamReader

# Named here as well, where callers of earlier releases imported them from.
__all__ = ["TLS", "AsyncClient", "Attributes", "Client", "Retry", "attribute_values", "send_fields"]

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """Backoff for UNAVAILABLE on repeatable calls: initial, doubled up to maximum, with
    jitter, for at most `attempts` attempts."""

    attempts: int = 5
    initial: float = 0.1
    maximum: float = 5.0

    def delays(self) -> Iterator[float]:
        delay = self.initial
        for _ in range(self.attempts - 1):
            yield delay * random.uniform(0.5, 1.0)
            delay = min(delay * 2, self.maximum)


@dataclass(frozen=True)
class TLS:
    """TLS to the server: a CA bundle (None: the system's), and a client certificate for
    mutual TLS."""

    root_certificates: bytes | None = None
    certificate_chain: bytes | None = None
    private_key: bytes | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            self.root_certificates, self.private_key, self.certificate_chain
        )


Metadata = tuple[tuple[str, str], ...]


def _metadata(api_key: str | None) -> Metadata:
    return (("authorization", f"Bearer {api_key}"),) if api_key else ()


class AsyncClient:
    """An asyncio client; use `async with AsyncClient(...) as client`."""

    def __init__(
        self,
        target: str = "localhost:50051",
        *,
        api_key: str | None = None,
        tls: TLS | None = None,
        retry: Retry = Retry(),
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if tls is None:
            self.channel = grpc.aio.insecure_channel(target, options=list(options))
        else:
            self.channel = grpc.aio.secure_channel(target, tls.credentials(), options=list(options))
        self.metadata = _metadata(api_key)
        self.retry = retry
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.messages = message_service_pb2_grpc.MessageServiceStub(self.channel)
        self.topics = topic_service_pb2_grpc.TopicServiceStub(self.channel)
        self.schedules = schedule_service_pb2_grpc.ScheduleServiceStub(self.channel)
        self.streams = stream_service_pb2_grpc.StreamServiceStub(self.channel)
        self.send_stream = TaggedStream.of_sends(self.messages, self.metadata)
        self.batch_stream = TaggedStream.of_batches(self.messages, self.metadata)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.send_stream.close()
        await self.batch_stream.close()
        await self.channel.close()

    async def call(
        self, method: Callable[..., Awaitable[T]], request: Any, *, repeatable: bool = False
    ) -> T:
        """One unary call, with the key, typed errors and retries when `repeatable`."""
        delays = self.retry.delays() if repeatable else iter(())
        while True:
            try:
                return await method(request, metadata=self.metadata)
            except grpc.RpcError as error:
                failure = from_rpc_error(error)
            except PostboxError as error:  # typed already: a send of the send stream
                failure = error
            if not isinstance(failure, Unavailable) or (wait := next(delays, None)) is None:
                raise failure
            await asyncio.sleep(wait)

    # Queues.

    async def create_queue(
        self,
        name: str,
        *,
        with_dead_letter_queue: bool = False,
        dead_letter_max_receive_count: int = 0,
        **fields: Any,
    ) -> queue_service_pb2.Queue:
        """Creates a queue; `fields` are Queue's (visibility_timeout=timedelta(...), ...).
        with_dead_letter_queue creates `<name>-dlq` with it, as its dead-letter queue."""
        request = queue_service_pb2.CreateQueueRequest(
            queue=queue_service_pb2.Queue(name=name, **fields),
            with_dead_letter_queue=with_dead_letter_queue,
            dead_letter_max_receive_count=dead_letter_max_receive_count,
        )
        return (await self.call(self.queues.CreateQueue, request)).queue

    async def get_queue(self, name: str) -> queue_service_pb2.Queue:
        request = queue_service_pb2.GetQueueRequest(name=name)
        return (await self.call(self.queues.GetQueue, request, repeatable=True)).queue

    async def list_queues(self, page_size: int = 100) -> AsyncIterator[queue_service_pb2.Queue]:
        request = queue_service_pb2.ListQueuesRequest(page_size=page_size)
        while True:
            page = await self.call(self.queues.ListQueues, request, repeatable=True)
            for queue in page.queues:
                yield queue
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    async def delete_queue(self, name: str) -> None:
        await self.call(self.queues.DeleteQueue, queue_service_pb2.DeleteQueueRequest(name=name))

    # Messages.

    async def send(self, queue: str, body: bytes | str, **fields: Any) -> str:
        """Sends one message; returns its id once committed. Retried only with a
        deduplication_id. Every send of the client goes over one stream (see
        postbox_client.send_stream), or as a unary Send to a server without it.
        relaxed_durability=True: committed but perhaps not yet flushed (see SendRequest)."""
        relaxed = bool(fields.pop("relaxed_durability", False))
        request = message_service_pb2.SendRequest(
            queue=queue, relaxed_durability=relaxed, **send_fields(body, **fields)
        )
        repeatable = bool(fields.get("deduplication_id"))
        return (await self.call(self._send, request, repeatable=repeatable)).message_id

    async def _send(
        self, request: message_service_pb2.SendRequest, metadata: Metadata
    ) -> message_service_pb2.SendResponse:
        return await _over(self.send_stream, self.messages.Send, request, metadata)

    async def send_batch(
        self, queue: str, entries: Sequence[message_service_pb2.SendBatchEntry]
    ) -> message_service_pb2.SendBatchResponse:
        """Sends up to 1,000 entries at once; retried when every entry has a deduplication id."""
        request = message_service_pb2.SendBatchRequest(queue=queue, entries=entries)
        repeatable = all(entry.deduplication_id for entry in entries)
        return await self.call(self.send_batch_request, request, repeatable=repeatable)

    async def send_batch_request(
        self, request: message_service_pb2.SendBatchRequest, metadata: Metadata
    ) -> message_service_pb2.SendBatchResponse:
        """One SendBatchRequest, as it is: over the client's SendBatchStream (see
        postbox_client.send_stream), or as a unary SendBatch to a server without it. For
        `call`, which adds retries and typed errors."""
        return await _over(self.batch_stream, self.messages.SendBatch, request, metadata)

    async def receive(
        self,
        queue: str,
        max_messages: int = 10,
        *,
        wait: timedelta = timedelta(0),
        visibility_timeout: timedelta | None = None,
        consumer_id: str = "",
    ) -> list[message_pb2.Message]:
        """One batch, waiting up to `wait` for the first message; [] when none came.
        `consumer_id` names the receiver in the messages' state (GetMessage)."""
        request = message_service_pb2.ReceiveRequest(
            queue=queue, max_messages=max_messages, wait_time=wait, consumer_id=consumer_id
        )
        if visibility_timeout is not None:
            request.visibility_timeout.FromTimedelta(visibility_timeout)
        try:
            return [
                message
                async for response in self.messages.Receive(request, metadata=self.metadata)
                for message in response.messages
            ]
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    async def delete(self, queue: str, receipt: str, *, result: bytes = b"") -> None:
        """Acknowledges a received message; `result` is what the job produced, kept where
        the queue keeps history (GetMessage returns it)."""
        request = message_service_pb2.DeleteRequest(queue=queue, receipt=receipt, result=result)
        await self.call(self.messages.Delete, request, repeatable=True)

    async def cancel(self, queue: str, message_id: str) -> None:
        """Removes a message no consumer holds; FailedPrecondition while one does."""
        request = message_service_pb2.CancelMessageRequest(queue=queue, message_id=message_id)
        await self.call(self.messages.CancelMessage, request, repeatable=True)

    async def nack(
        self,
        queue: str,
        receipt: str,
        *,
        delay: timedelta | None = None,
        error: str = "",
        dead_letter: bool = False,
    ) -> None:
        """Gives a message back: visible after `delay`, or the queue's retry backoff;
        `error` says why (its last_error). With dead_letter, its tries end now: to the
        dead-letter queue, or failed where the queue has none."""
        request = nack_request(queue, receipt, delay=delay, error=error, dead_letter=dead_letter)
        await self.call(self.messages.Nack, request)

    async def publish(
        self, topic: str, body: bytes | str, *, routing_key: str = "", **fields: Any
    ) -> topic_service_pb2.PublishResponse:
        request = topic_service_pb2.PublishRequest(
            topic=topic,
            routing_key=routing_key,
            body=body.encode() if isinstance(body, str) else body,
            attributes=attribute_values(fields.pop("attributes", None)),
            **fields,
        )
        return await self.call(self.topics.Publish, request)

    def producer(self, queue: str, **options: Unpack[ProducerOptions]) -> Producer:
        """A batching producer for `queue` (options: see postbox_client.Producer)."""
        return Producer(self, queue, **options)

    def consumer(self, queue: str, **options: Unpack[ConsumerOptions]) -> Consumer:
        """A streaming consumer of `queue` (options: see postbox_client.Consumer)."""
        return Consumer(self, queue, **options)

    def stream_reader(self, topic: str, group: str, **options: Any) -> StreamReader:
        """A reader of a stream topic's consumer group (see postbox_client.streams)."""
        return StreamReader(self, topic, group, **options)


class Client(Operations):
    """A blocking client; use `with Client(...) as client`. Beyond the calls here, it
    manages queues, topics, schedules and keys (postbox_client.operations)."""

    def __init__(
        self,
        target: str = "localhost:50051",
        *,
        api_key: str | None = None,
        tls: TLS | None = None,
        retry: Retry = Retry(),
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if tls is None:
            self.channel = grpc.insecure_channel(target, options=list(options))
        else:
            self.channel = grpc.secure_channel(target, tls.credentials(), options=list(options))
        self.metadata = _metadata(api_key)
        self.retry = retry
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.messages = message_service_pb2_grpc.MessageServiceStub(self.channel)
        self.topics = topic_service_pb2_grpc.TopicServiceStub(self.channel)
        self.schedules = schedule_service_pb2_grpc.ScheduleServiceStub(self.channel)
        self.streams = stream_service_pb2_grpc.StreamServiceStub(self.channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def call(self, method: Callable[..., T], request: Any, *, repeatable: bool = False) -> T:
        delays = self.retry.delays() if repeatable else iter(())
        while True:
            try:
                return method(request, metadata=self.metadata)
            except grpc.RpcError as error:
                failure = from_rpc_error(error)
            if not isinstance(failure, Unavailable) or (wait := next(delays, None)) is None:
                raise failure
            time.sleep(wait)

    def create_queue(
        self,
        name: str,
        *,
        with_dead_letter_queue: bool = False,
        dead_letter_max_receive_count: int = 0,
        **fields: Any,
    ) -> queue_service_pb2.Queue:
        request = queue_service_pb2.CreateQueueRequest(
            queue=queue_service_pb2.Queue(name=name, **fields),
            with_dead_letter_queue=with_dead_letter_queue,
            dead_letter_max_receive_count=dead_letter_max_receive_count,
        )
        return self.call(self.queues.CreateQueue, request).queue

    def get_queue(self, name: str) -> queue_service_pb2.Queue:
        request = queue_service_pb2.GetQueueRequest(name=name)
        return self.call(self.queues.GetQueue, request, repeatable=True).queue

    def delete_queue(self, name: str) -> None:
        self.call(self.queues.DeleteQueue, queue_service_pb2.DeleteQueueRequest(name=name))

    def send(self, queue: str, body: bytes | str, **fields: Any) -> str:
        return self.send_message(queue, body, **fields).message_id

    def send_message(
        self, queue: str, body: bytes | str, **fields: Any
    ) -> message_service_pb2.SendResponse:
        """As `send`, returning the whole answer: the id, and whether it was a duplicate."""
        relaxed = bool(fields.pop("relaxed_durability", False))
        request = message_service_pb2.SendRequest(
            queue=queue, relaxed_durability=relaxed, **send_fields(body, **fields)
        )
        repeatable = bool(fields.get("deduplication_id"))
        return self.call(self.messages.Send, request, repeatable=repeatable)

    def receive(
        self,
        queue: str,
        max_messages: int = 10,
        *,
        wait: timedelta = timedelta(0),
        visibility_timeout: timedelta | None = None,
        consumer_id: str = "",
    ) -> list[message_pb2.Message]:
        """One batch, waiting up to `wait` for the first message; [] when none came.
        `consumer_id` names the receiver in the messages' state (GetMessage)."""
        request = message_service_pb2.ReceiveRequest(
            queue=queue, max_messages=max_messages, wait_time=wait, consumer_id=consumer_id
        )
        if visibility_timeout is not None:
            request.visibility_timeout.FromTimedelta(visibility_timeout)
        try:
            return [
                message
                for response in self.messages.Receive(request, metadata=self.metadata)
                for message in response.messages
            ]
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def delete(self, queue: str, receipt: str, *, result: bytes = b"") -> None:
        """Acknowledges a received message; `result` is what the job produced, kept where
        the queue keeps history (GetMessage returns it)."""
        request = message_service_pb2.DeleteRequest(queue=queue, receipt=receipt, result=result)
        self.call(self.messages.Delete, request, repeatable=True)

    def cancel(self, queue: str, message_id: str) -> None:
        """Removes a message no consumer holds; FailedPrecondition while one does."""
        request = message_service_pb2.CancelMessageRequest(queue=queue, message_id=message_id)
        self.call(self.messages.CancelMessage, request, repeatable=True)

    def publish(
        self, topic: str, body: bytes | str, *, routing_key: str = "", **fields: Any
    ) -> topic_service_pb2.PublishResponse:
        request = topic_service_pb2.PublishRequest(
            topic=topic,
            routing_key=routing_key,
            body=body.encode() if isinstance(body, str) else body,
            attributes=attribute_values(fields.pop("attributes", None)),
            **fields,
        )
        return self.call(self.topics.Publish, request)

    def stream_reader(self, topic: str, group: str, **options: Any) -> BlockingStreamReader:
        """A blocking reader of a stream topic's consumer group (see postbox_client.streams)."""
        return BlockingStreamReader(self, topic, group, **options)


async def _over(
    stream: TaggedStream, unary: Callable[..., Awaitable[T]], request: Any, metadata: Metadata
) -> T:
    """The request's response over the stream, or by the unary call to a server that has
    no such stream."""
    if stream.supported:
        try:
            return cast(T, await stream.send(request))
        except PostboxError as error:
            # The server has no such stream, so it sent nothing: unary from now on.
            if error.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
    return await unary(request, metadata=metadata)
