"""SendMessage and SendMessageBatch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from postbox.v1 import message_service_pb2 as pb

from server.sqs import batches, md5, message_attributes
from server.sqs.actions.base import Call, Result, action, bounded
from server.sqs.actions.queues import get_queue
from server.sqs.errors import (
    BATCH_REQUEST_TOO_LONG,
    INVALID_MESSAGE_CONTENTS,
    SqsError,
    invalid_parameter,
    missing_parameter,
)

# SQS's limit on the sum of a batch's message sizes.
MAX_BATCH_BYTES = 1024 * 1024
_MAX_DELAY = 900


def prepare(params: Mapping[str, Any]) -> pb.SendBatchEntry:
    """A message to send, checked as SQS checks it."""
    body = params.get("MessageBody")
    if not body:
        raise missing_parameter("MessageBody")
    bad = message_attributes.invalid_character(body)
    if bad is not None:
        raise SqsError(
            INVALID_MESSAGE_CONTENTS,
            f"Invalid binary character '#x{ord(bad):X}' was found in the message body, the set "
            "of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | "
            "#x10000 to #x10FFFF",
        )
    delay = bounded(dict(params), "DelaySeconds", 0, _MAX_DELAY)
    if params.get("MessageSystemAttributes"):
        raise invalid_parameter(
            "MessageSystemAttributes (AWSTraceHeader) are not supported by postbox."
        )
    entry = pb.SendBatchEntry(
        body=body.encode("utf-8"),
        attributes=message_attributes.to_postbox(params.get("MessageAttributes", {})),
    )
    if delay is not None:
        entry.delay.FromSeconds(delay)
    return entry


def sent(entry: pb.SendBatchEntry, message_id: str) -> Result:
    """What SQS answers for a sent message: its id and the digests of what it received."""
    result: Result = {
        "MessageId": message_id,
        "MD5OfMessageBody": md5.of_body(entry.body.decode("utf-8")),
    }
    attributes_md5 = md5.of_attributes(entry.attributes)
    if attributes_md5 is not None:
        result["MD5OfMessageAttributes"] = attributes_md5
    return result


@action("SendMessage")
async def send_message(call: Call) -> Result:
    queue = call.queue()
    entry = prepare(call.params)
    request = pb.SendRequest(queue=queue, body=entry.body, attributes=entry.attributes)
    if entry.HasField("delay"):
        request.delay.CopyFrom(entry.delay)
    response = await call.backend.call(call.backend.messages.Send, request)
    return sent(entry, response.message_id)


def _raw_size(params: Mapping[str, Any]) -> int:
    """An entry's size as SQS adds it up for the batch limit, valid or not."""
    total = len(str(params.get("MessageBody") or "").encode())
    for name, value in (params.get("MessageAttributes") or {}).items():
        total += len(name.encode()) + len(str(value.get("DataType", "")).encode())
        total += len(str(value.get("StringValue", "")).encode())
        total += len(value.get("BinaryValue") or b"")
    return total


@action("SendMessageBatch")
async def send_message_batch(call: Call) -> Result:
    queue = call.queue()
    entries = batches.entries(call.params, "SendMessageBatchRequestEntry")
    total = sum(_raw_size(entry) for entry in entries)
    if total > MAX_BATCH_BYTES:
        raise SqsError(
            BATCH_REQUEST_TOO_LONG,
            f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. "
            f"You have sent {total} bytes.",
        )
    limit = (await get_queue(call, queue)).max_message_size
    valid: list[tuple[str, pb.SendBatchEntry]] = []
    failed = []
    for params in entries:
        try:
            entry = prepare(params)
            if message_attributes.size(entry.body, entry.attributes) > limit:
                raise invalid_parameter(
                    f"One or more parameters are invalid. Reason: Message must be shorter than "
                    f"{limit} bytes."
                )
        except SqsError as error:
            failed.append(batches.failure(params["Id"], error))
        else:
            valid.append((params["Id"], entry))
    successful = []
    if valid:
        # One transaction: the valid entries are committed together or not at all.
        response = await call.backend.call(
            call.backend.messages.SendBatch,
            pb.SendBatchRequest(queue=queue, entries=[entry for _, entry in valid]),
        )
        for (entry_id, entry), message_id in zip(valid, response.message_ids, strict=True):
            successful.append({"Id": entry_id, **sent(entry, message_id)})
    return {"Successful": successful, "Failed": failed}
