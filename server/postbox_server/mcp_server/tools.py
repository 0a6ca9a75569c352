"""The tools `postbox mcp` offers: queues, messages, topics, schedules and dead letters.

Each tool is one call (or one listing) of a postbox server through the SDK's blocking
`Client`, made with the caller's API key, so the key's grants decide what an agent may do
exactly as they do for any other client. The MCP SDK runs a tool that is not async on a
worker thread, so a receive that waits does not hold up the others.
"""

from __future__ import annotations

import binascii
import functools
import itertools
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar

from google.protobuf.message import Message
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from postbox_client import Client, PostboxError
from pydantic import Field

from postbox_server.proto_json import as_dict, body_bytes, readable

# Items one listing tool returns at most: enough to see a server at a glance, few enough
# that a listing fits in an agent's context. Larger sets: the CLI or the SDK, which follow
# every page.
MAX_LISTED = 1000
Limit = Annotated[int, Field(ge=1, le=MAX_LISTED, description="how many at most, 1 to 1000")]
Body = Annotated[str, Field(description="the message body: text, or base64 with body_base64")]
BodyIsBase64 = Annotated[bool, Field(description="body is base64 of binary bytes")]
# A duration in seconds: the server checks each one's range; this side, only that it is
# one (not negative, and no more than a protobuf Duration holds: 10,000 years).
Seconds = Annotated[float, Field(ge=0, le=315_576_000_000)]
Attributes = Annotated[
    dict[str, str] | None, Field(description="String attributes by name (optional)")
]

# What each tool does to the server, for the client to show or gate (MCP's hints).
READS = ToolAnnotations(read_only_hint=True)
ADDS = ToolAnnotations(read_only_hint=False, destructive_hint=False)
CHANGES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False)
REMOVES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True)

T = TypeVar("T")


def document(message: Message) -> dict[str, Any]:
    """A resource as the tools return it: fields by proto name; a body as text when it is
    UTF-8, else base64 with `body_base64: true` beside it."""
    shown = as_dict(message)
    body = getattr(message, "body", None)
    if isinstance(body, bytes) and body and readable(body) is None:
        shown["body_base64"] = True
    return shown


def documents(messages: Iterable[Message], limit: int) -> list[dict[str, Any]]:
    return [document(m) for m in itertools.islice(messages, limit)]


def body_of(body: str, body_base64: bool) -> bytes:
    """A tool's body argument as bytes; a ValueError that says so when it is not base64."""
    try:
        return body_bytes(body, is_base64=body_base64)
    except binascii.Error as error:
        raise ValueError(f"body is not base64, as body_base64 says it is ({error})") from None


def seconds(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def reporting_errors(tool: Callable[..., T]) -> Callable[..., T]:
    """The tool, its failures turned into MCP tool errors the agent reads: a refused call
    names the server's gRPC status and message; input this side refuses (not base64, two
    timings) reads as INVALID_ARGUMENT, and nothing was sent."""

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> T:
        try:
            return tool(*args, **kwargs)
        except PostboxError as error:
            raise ToolError(str(error)) from None
        except ValueError as error:
            raise ToolError(f"INVALID_ARGUMENT: {error}") from None

    return call


class PostboxTools:
    """The tools, bound to one client of the server; `TOOLS` lists them."""

    def __init__(self, client: Client) -> None:
        self.client = client

    # Queues.

    def list_queues(self, limit: Limit = 100) -> dict[str, Any]:
        """Queues by name, with their settings (no message counts: see queue_stats)."""
        return {"queues": documents(self.client.list_queues(limit), limit)}

    def get_queue(self, name: str) -> dict[str, Any]:
        """A queue's settings and live stats."""
        return document(self.client.get_queue(name))

    def create_queue(
        self,
        name: str,
        visibility_timeout_seconds: Seconds | None = None,
        with_dead_letter_queue: bool = False,
        max_receive_count: int = 5,
        keep_history: bool = False,
    ) -> dict[str, Any]:
        """Creates a queue (a name ending in .fifo makes a FIFO queue). with_dead_letter_queue
        also creates <name>-dlq, where a message goes after max_receive_count receives;
        keep_history keeps finished messages so get_message finds them."""
        fields: dict[str, Any] = {"archive_on_delete": keep_history}
        if visibility_timeout_seconds is not None:
            fields["visibility_timeout"] = seconds(visibility_timeout_seconds)
        if with_dead_letter_queue:
            fields["with_dead_letter_queue"] = True
            fields["dead_letter_max_receive_count"] = max_receive_count
        return document(self.client.create_queue(name, **fields))

    def delete_queue(self, name: str) -> dict[str, Any]:
        """Deletes a queue and every message in it."""
        self.client.delete_queue(name)
        return {"deleted": name}

    def purge_queue(self, name: str) -> dict[str, Any]:
        """Deletes every message of a queue, keeping the queue; says how many."""
        return document(self.client.purge_queue(name))

    def queue_stats(self, name: str) -> dict[str, Any]:
        """A queue's live counts: visible, in flight and delayed messages, the oldest
        and newest message's age, messages sent since it was made, and sends and
        receives per second over the last minute."""
        return document(self.client.get_queue(name).stats)

    # Messages.

    def send_message(
        self,
        queue: str,
        body: Body,
        body_base64: BodyIsBase64 = False,
        attributes: Attributes = None,
        delay_seconds: Seconds | None = None,
        message_group_id: str | None = None,
        deduplication_id: str | None = None,
    ) -> dict[str, Any]:
        """Sends a message to a queue; answers once it is committed, with its message_id.
        A FIFO queue needs message_group_id."""
        sent = self.client.send_message(
            queue,
            body_of(body, body_base64),
            attributes=attributes,
            delay=seconds(delay_seconds),
            message_group_id=message_group_id,
            deduplication_id=deduplication_id,
        )
        return document(sent)

    def receive_messages(
        self,
        queue: str,
        max_messages: int = 1,
        wait_seconds: Seconds = 0,
        visibility_timeout_seconds: Seconds | None = None,
        consumer_id: str = "",
    ) -> dict[str, Any]:
        """Receives up to max_messages, waiting up to wait_seconds (at most 20) for the
        first. Each comes with a receipt: ack_message it when done, or nack_message it;
        otherwise it is delivered again after the visibility timeout."""
        received = self.client.receive(
            queue,
            max_messages,
            wait=timedelta(seconds=wait_seconds),
            visibility_timeout=seconds(visibility_timeout_seconds),
            consumer_id=consumer_id,
        )
        return {"messages": [document(m) for m in received]}

    def ack_message(self, queue: str, receipt: str, result: str = "") -> dict[str, Any]:
        """Acknowledges (deletes) a received message by its receipt; `result` is what the
        job produced, kept where the queue keeps history."""
        self.client.delete(queue, receipt, result=result.encode())
        return {"acknowledged": True}

    def nack_message(
        self,
        queue: str,
        receipt: str,
        error: str = "",
        delay_seconds: Seconds | None = None,
        dead_letter: bool = False,
    ) -> dict[str, Any]:
        """Gives a received message back to be tried again, after delay_seconds or the
        queue's backoff; `error` says why. dead_letter ends its tries now: it moves to the
        dead-letter queue (or fails, where the queue has none)."""
        self.client.nack(
            queue, receipt, delay=seconds(delay_seconds), error=error, dead_letter=dead_letter
        )
        return {"returned": True}

    def peek_messages(self, queue: str, limit: Limit = 10) -> dict[str, Any]:
        """Looks at a queue's messages without receiving them."""
        return {"messages": documents(self.client.peek_messages(queue, limit), limit)}

    def get_message(self, queue: str, message_id: str) -> dict[str, Any]:
        """Where a message stands in its life: state, attempts, consumer, result, error."""
        return document(self.client.get_message(queue, message_id))

    # Topics.

    def list_topics(self, limit: Limit = 100) -> dict[str, Any]:
        """Topics by name."""
        return {"topics": documents(self.client.list_topics(page_size=limit), limit)}

    def publish(
        self,
        topic: str,
        body: Body,
        body_base64: BodyIsBase64 = False,
        routing_key: str = "",
        attributes: Attributes = None,
    ) -> dict[str, Any]:
        """Publishes a message to a topic: every subscription whose pattern matches
        routing_key gets it."""
        published = self.client.publish(
            topic,
            body_of(body, body_base64),
            routing_key=routing_key,
            attributes=attributes,
        )
        return document(published)

    # Schedules.

    def list_schedules(self, limit: Limit = 100) -> dict[str, Any]:
        """Schedules by name, with their timing, target and next fire time."""
        listed = self.client.list_schedules(page_size=limit)
        return {"schedules": documents(listed, limit)}

    def create_schedule(
        self,
        name: str,
        body: Body,
        queue: str = "",
        topic: str = "",
        routing_key: str = "",
        body_base64: BodyIsBase64 = False,
        cron: str | None = None,
        time_zone: str = "UTC",
        interval_seconds: Seconds | None = None,
        run_at: datetime | None = None,
    ) -> dict[str, Any]:
        """Creates a schedule that sends body to a queue, or publishes it to a topic (give
        one), on exactly one timing: a five-field cron expression read in time_zone, an
        interval, or once at run_at (RFC 3339)."""
        schedule = self.client.create_schedule(
            name,
            body_of(body, body_base64),
            queue=queue,
            topic=topic,
            routing_key=routing_key,
            cron=cron,
            time_zone=time_zone,
            interval=seconds(interval_seconds),
            run_at=run_at,
        )
        return document(schedule)

    def delete_schedule(self, name: str) -> dict[str, Any]:
        """Deletes a schedule."""
        self.client.delete_schedule(name)
        return {"deleted": name}

    # Dead letters.

    def list_dead_letters(self, queue: str, limit: Limit = 10) -> dict[str, Any]:
        """The messages of a dead-letter queue, without receiving them, each with its
        source queue and last error."""
        return self.peek_messages(queue, limit)

    def redrive_dead_letters(
        self,
        queue: str,
        destination: str = "",
        max_messages: int | None = None,
        message_ids: list[str] | None = None,
    ) -> dict[str, Any]:
        """Starts moving a dead-letter queue's messages back: to destination, or each to
        the queue it came from; all of them, max_messages, or only message_ids. Answers
        with the redrive task, which runs on in the server."""
        task = self.client.redrive_messages(
            queue, destination=destination, max_messages=max_messages,
            message_ids=message_ids or (),
        )  # fmt: skip
        return document(task)


# Every tool, by method name, with what it does to the server.
TOOLS = {
    "list_queues": READS,
    "get_queue": READS,
    "create_queue": ADDS,
    "delete_queue": REMOVES,
    "purge_queue": REMOVES,
    "queue_stats": READS,
    "send_message": ADDS,
    "receive_messages": CHANGES,
    "ack_message": REMOVES,
    "nack_message": CHANGES,
    "peek_messages": READS,
    "get_message": READS,
    "list_topics": READS,
    "publish": ADDS,
    "list_schedules": READS,
    "create_schedule": ADDS,
    "delete_schedule": REMOVES,
    "list_dead_letters": READS,
    "redrive_dead_letters": CHANGES,
}
