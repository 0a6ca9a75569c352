"""SendMessage and SendMessageBatch."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from postbox.v1 import message_service_pb2 as pb

from postbox_server.aws import message_attributes
from postbox_server.aws.errors import (
    INVALID_PARAMETER_VALUE,
    AwsError,
    invalid_parameter,
    missing_parameter,
)
from postbox_server.aws.refused_entries import send_accepted
from postbox_server.aws.sqs import batches, md5
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.actions.queues import get_queue
from postbox_server.aws.sqs.errors import BATCH_REQUEST_TOO_LONG, INVALID_MESSAGE_CONTENTS
from postbox_server.aws.sqs.queue_attributes import is_fifo
from postbox_server.errors import quoted
from postbox_server.services.payload_schema_cache import SCHEMA_VIOLATION

_TOKEN = re.compile(r"^[\x21-\x7e]{1,128}$")
# SQS's limit on the sum of a batch's message sizes.
MAX_BATCH_BYTES = 1024 * 1024
_MAX_DELAY = 900


def _not_for_this_queue(name: str, value: int | str) -> AwsError:
    # A number is shown bare, as SQS shows it; a string as every error quotes input.
    shown = str(value) if isinstance(value, int) else quoted(value)
    return invalid_parameter(
        f"Value {shown} for parameter {name} is invalid. "
        "Reason: The request include parameter "
        "that is not valid for this queue type."
    )


def _token(params: Mapping[str, Any], name: str) -> str:
    """A MessageGroupId or MessageDeduplicationId: 1-128 printable ASCII characters."""
    value = params.get(name) or ""
    if value and not _TOKEN.match(value):
        raise invalid_parameter(
            f"Value {quoted(str(value))} for parameter {name} is invalid. "
            "Reason: it must be 1 to 128 "
            "alphanumeric or punctuation characters."
        )
    return value


def prepare(params: Mapping[str, Any], fifo: bool) -> pb.SendBatchEntry:
    """A message to send to a FIFO or standard queue, checked as SQS checks it."""
    body = params.get("MessageBody")
    if not body:
        raise missing_parameter("MessageBody")
    bad = message_attributes.invalid_character(body)
    if bad is not None:
        raise AwsError(
            INVALID_MESSAGE_CONTENTS,
            f"Invalid binary character '#x{ord(bad):X}' was found in the message body, the set "
            "of allowed characters is #x9 | #xA | #xD | #x20 to #xD7FF | #xE000 to #xFFFD | "
            "#x10000 to #x10FFFF",
        )
    delay = params.get("DelaySeconds")
    if delay is not None and not 0 <= delay <= _MAX_DELAY:
        raise invalid_parameter(  # SQS's words
            f"Value {delay} for parameter DelaySeconds is invalid. "
            f"Reason: DelaySeconds must be >= 0 and <= {_MAX_DELAY}."
        )
    group = _token(params, "MessageGroupId")
    deduplication = _token(params, "MessageDeduplicationId")
    if fifo:
        if not group:
            raise missing_parameter("MessageGroupId")
        # FIFO messages keep their group's order: no per-message delay. SQS accepts 0,
        # which leaves the queue's delay to apply, as postbox does with none given.
        if delay:
            raise _not_for_this_queue("DelaySeconds", delay)
        delay = None
    elif deduplication:
        raise _not_for_this_queue("MessageDeduplicationId", deduplication)
    entry = pb.SendBatchEntry(
        body=body.encode("utf-8"),
        attributes=message_attributes.to_postbox(
            params.get("MessageAttributes", {}), params.get("MessageSystemAttributes", {})
        ),
        message_group_id=group,
        deduplication_id=deduplication,
    )
    if delay is not None:
        entry.delay.FromSeconds(delay)
    return entry


def _too_long(limit: int) -> AwsError:
    return invalid_parameter(
        f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes."
    )


def _no_deduplication() -> AwsError:
    return invalid_parameter(
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )


def sequence_number(message_id: str) -> str:
    """A FIFO message's SequenceNumber: postbox ids grow in send order, as SQS's do."""
    return message_id.zfill(20)


def sent(entry: pb.SendBatchEntry, message_id: str, fifo: bool) -> Result:
    """What SQS answers for a sent message: its id and the digests of what it received."""
    result: Result = {
        "MessageId": message_id,
        "MD5OfMessageBody": md5.of_body(entry.body.decode("utf-8")),
    }
    user, system = message_attributes.split(entry.attributes)
    for field, attributes in (
        ("MD5OfMessageAttributes", user),
        ("MD5OfMessageSystemAttributes", system),
    ):
        digest = md5.of_attributes(attributes)
        if digest is not None:
            result[field] = digest
    if fifo:
        result["SequenceNumber"] = sequence_number(message_id)
    return result


@action("SendMessage")
async def send_message(call: Call) -> Result:
    queue = call.queue()
    fifo = is_fifo(queue)
    entry = prepare(call.params, fifo)
    # Asked only when it matters, so that a send otherwise needs the send grant alone.
    if (
        fifo
        and not entry.deduplication_id
        and not (await get_queue(call, queue)).content_based_deduplication
    ):
        raise _no_deduplication()
    request = pb.SendRequest(
        queue=queue,
        body=entry.body,
        attributes=entry.attributes,
        message_group_id=entry.message_group_id,
        deduplication_id=entry.deduplication_id,
    )
    if entry.HasField("delay"):
        request.delay.CopyFrom(entry.delay)
    try:
        response = await call.backend.call(call.backend.messages.Send, request)
    except AwsError as error:
        # The queue's size limit is asked only once a send failed: SQS's words for it.
        # Not for a body the queue's payload schema refused, which says why itself.
        if error.kind is INVALID_PARAMETER_VALUE and SCHEMA_VIOLATION not in error.metadata:
            limit = (await get_queue(call, queue)).max_message_size
            if message_attributes.size(entry.body, entry.attributes) > limit:
                raise _too_long(limit) from None
        raise
    return sent(entry, response.message_id, fifo)


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
    fifo = is_fifo(queue)
    entries = batches.entries(call.params, "SendMessageBatchRequestEntry")
    total = sum(_raw_size(entry) for entry in entries)
    if total > MAX_BATCH_BYTES:
        raise AwsError(
            BATCH_REQUEST_TOO_LONG,
            f"Batch requests cannot be longer than {MAX_BATCH_BYTES} bytes. "
            f"You have sent {total} bytes.",
        )
    described = await get_queue(call, queue)
    limit = described.max_message_size
    if fifo:
        # What a FIFO queue needs of every entry fails the whole call, as SQS does.
        for params in entries:
            if not params.get("MessageGroupId"):
                raise missing_parameter("MessageGroupId")
            if not params.get("MessageDeduplicationId") and not (
                described.content_based_deduplication
            ):
                raise _no_deduplication()
    valid: list[tuple[str, pb.SendBatchEntry]] = []
    failed = []
    for params in entries:
        try:
            entry = prepare(params, fifo)
            if message_attributes.size(entry.body, entry.attributes) > limit:
                raise _too_long(limit)
        except AwsError as error:
            failed.append(batches.failure(params["Id"], error))
        else:
            valid.append((params["Id"], entry))
    successful = []
    # One transaction: the valid entries are committed together or not at all.
    response = await send_accepted(
        valid,
        lambda accepted: call.backend.call(
            call.backend.messages.SendBatch, pb.SendBatchRequest(queue=queue, entries=accepted)
        ),
        lambda entry_id, error: failed.append(batches.failure(entry_id, error)),
    )
    if response is not None:
        for (entry_id, entry), message_id in zip(valid, response.message_ids, strict=True):
            successful.append({"Id": entry_id, **sent(entry, message_id, fifo)})
    return {"Successful": successful, "Failed": failed}
