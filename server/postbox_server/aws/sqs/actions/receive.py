"""ReceiveMessage, held open on postbox's streaming Receive while it long-polls."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import message_pb2
from postbox.v1 import message_service_pb2 as pb

from postbox_server.aws import message_attributes
from postbox_server.aws.settings import ShimSettings
from postbox_server.aws.sqs import md5, naming, receipts
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.actions.send import sequence_number
from postbox_server.aws.sqs.queue_attributes import is_fifo, unknown
from postbox_server.observability import tracing

MAX_WAIT = 20
# Message system attributes a client may ask for. SqsManagedSseEnabled, which
# postbox does not record, is accepted and not returned; SenderId is the account's.
SYSTEM_ATTRIBUTES = frozenset(
    {
        "All",
        "ApproximateFirstReceiveTimestamp",
        "ApproximateReceiveCount",
        "AWSTraceHeader",
        "DeadLetterQueueSourceArn",
        "MessageDeduplicationId",
        "MessageGroupId",
        "SenderId",
        "SentTimestamp",
        "SequenceNumber",
        "SqsManagedSseEnabled",
    }
)


def _millis(timestamp: Timestamp) -> str:
    return str(timestamp.seconds * 1000 + timestamp.nanos // 1_000_000)


def system_attributes(
    queue: str,
    message: message_pb2.Message,
    stored: Mapping[str, message_pb2.AttributeValue],
    names: Collection[str],
    settings: ShimSettings,
) -> dict[str, str]:
    """The system attributes asked for; `stored` are those the sender set (AWSTraceHeader)."""
    available = {
        "SenderId": settings.account_id,
        "SentTimestamp": _millis(message.enqueue_time),
        "ApproximateReceiveCount": str(message.receive_count),
    }
    trace = stored.get(message_attributes.TRACE_HEADER)
    if trace is not None:
        available[message_attributes.TRACE_HEADER] = trace.string_value
    if message.HasField("first_receive_time"):
        available["ApproximateFirstReceiveTimestamp"] = _millis(message.first_receive_time)
    if message.message_group_id:
        available["MessageGroupId"] = message.message_group_id
    if message.deduplication_id:
        available["MessageDeduplicationId"] = message.deduplication_id
    if is_fifo(queue):
        available["SequenceNumber"] = sequence_number(message.message_id)
    if message.dead_letter_source_queue:
        available["DeadLetterQueueSourceArn"] = naming.queue_arn(
            settings, message.dead_letter_source_queue
        )
    if "All" in names:
        return available
    return {name: value for name, value in available.items() if name in names}


def as_sqs(call: Call, queue: str, message: message_pb2.Message, system: Collection[str]) -> Result:
    # SQS bodies are text; bytes a gRPC producer sent that are not UTF-8 cannot travel
    # as SQS text and arrive as U+FFFD (the digest covers what is delivered).
    body = message.body.decode("utf-8", errors="replace")
    result: Result = {
        "MessageId": message.message_id,
        "ReceiptHandle": receipts.encode(queue, message.receipt),
        "MD5OfBody": md5.of_body(body),
        "Body": body,
    }
    user, stored = message_attributes.split(message.attributes)
    attributes = system_attributes(queue, message, stored, system, call.settings)
    if attributes:
        result["Attributes"] = attributes
    wanted = call.params.get("MessageAttributeNames", [])
    selected = message_attributes.select(user, wanted)
    if selected:
        result["MessageAttributes"] = message_attributes.to_sqs(selected)
        result["MD5OfMessageAttributes"] = md5.of_attributes(selected)
    return result


@action("ReceiveMessage")
async def receive_message(call: Call) -> Result:
    queue = call.queue()
    count = call.integer("MaxNumberOfMessages", 1, 10, default=1)
    visibility = call.integer("VisibilityTimeout", 0, 43_200)
    wait = call.integer("WaitTimeSeconds", 0, MAX_WAIT)
    system = {
        *call.params.get("AttributeNames", []),
        *call.params.get("MessageSystemAttributeNames", []),
    }
    for name in system:
        if name not in SYSTEM_ATTRIBUTES:
            raise unknown(name)
    request = pb.ReceiveRequest(queue=queue, max_messages=count, mode=pb.RECEIVE_MODE_LONG_POLL)
    if visibility is not None:
        request.visibility_timeout.FromSeconds(visibility)
    if wait is not None:
        request.wait_time.FromSeconds(wait)
    # Unset, postbox waits the queue's ReceiveMessageWaitTimeSeconds (20 s at most).
    longest_wait = MAX_WAIT if wait is None else wait
    responses = await call.backend.stream(
        call.backend.messages.Receive, request, timeout=longest_wait + call.settings.grpc_timeout
    )
    delivered = [message for response in responses for message in response.messages]
    tracing.delivered(queue, delivered)
    messages = [as_sqs(call, queue, message, system) for message in delivered]
    return {"Messages": messages} if messages else {}
