"""Publish and PublishBatch: a message to a topic, checked as SNS checks it."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws import message_attributes
from postbox_server.aws.call import Call, Result
from postbox_server.aws.errors import AwsError
from postbox_server.aws.refused_entries import send_accepted
from postbox_server.aws.sns import arns
from postbox_server.aws.sns.actions.base import (
    action,
    get_topic,
    is_fifo,
    required,
    rpc,
)
from postbox_server.aws.sns.errors import (
    BATCH_ENTRY_IDS_NOT_DISTINCT,
    BATCH_REQUEST_TOO_LONG,
    EMPTY_BATCH_REQUEST,
    INVALID_BATCH_ENTRY_ID,
    INVALID_PARAMETER_VALUE,
    NOT_FOUND,
    TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
    InvalidParameter,
    not_found,
)

# SNS's limits.
MAX_MESSAGE_BYTES = 256 * 1024
MAX_BATCH_ENTRIES = 10
MAX_SUBJECT = 100

_SQS_EMPTY_VALUE = re.compile(
    r"^Message \(user\) attribute ('.*') must contain a non-empty message attribute value"
)
_SNS_EMPTY_VALUE = r"The message attribute \1 must contain non-empty message attribute value"


def _message_entry(
    params: dict[str, Any], topic: str, content_deduplication: bool
) -> pb.PublishBatchEntry:
    """A Publish's (or a batch entry's) message, checked as SNS checks it."""
    message: str | None = params.get("Message")
    if message is None or message == "":
        raise InvalidParameter("Invalid parameter: Message Reason: Empty message")
    if params.get("MessageStructure") == "json":
        try:
            structure = json.loads(message)
        except ValueError:
            raise InvalidParameter(
                "Invalid parameter: Message Structure - JSON message body failed to parse"
            ) from None
        if not isinstance(structure, dict) or not isinstance(structure.get("default"), str):
            raise InvalidParameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        sqs_message = structure.get("sqs")
        message = sqs_message if isinstance(sqs_message, str) else structure["default"]
    elif params.get("MessageStructure"):
        raise InvalidParameter("Invalid parameter: MessageStructure Reason: only json is supported")
    subject = params.get("Subject") or ""
    if len(subject) > MAX_SUBJECT or any(ord(c) < 32 for c in subject):
        raise InvalidParameter("Invalid parameter: Subject")
    try:
        attributes = message_attributes.to_postbox(params.get("MessageAttributes") or {}, {})
    except AwsError as error:
        # SQS's words, but for an empty value SNS's own (localstack's AWS-validated
        # snapshot of test_empty_or_wrong_message_attributes).
        raise AwsError(
            INVALID_PARAMETER_VALUE, _SQS_EMPTY_VALUE.sub(_SNS_EMPTY_VALUE, error.message)
        ) from None
    body = message.encode("utf-8")
    size = message_attributes.size(body, attributes)
    if size > MAX_MESSAGE_BYTES:
        raise InvalidParameter(
            f"Invalid parameter: Message too long: {size} bytes; the limit is {MAX_MESSAGE_BYTES}"
        )
    group = params.get("MessageGroupId") or ""
    deduplication = params.get("MessageDeduplicationId") or ""
    if is_fifo(topic):
        if not group:
            raise InvalidParameter(
                "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
            )
        if not deduplication:
            if not content_deduplication:
                raise InvalidParameter(
                    "Invalid parameter: The topic should either have ContentBasedDeduplication "
                    "enabled or MessageDeduplicationId provided explicitly"
                )
            deduplication = hashlib.sha256(body).hexdigest()
    elif deduplication:
        raise InvalidParameter(
            "Invalid parameter: MessageDeduplicationId Reason: The request includes "
            "MessageDeduplicationId parameter that is not valid for this topic type"
        )
    return pb.PublishBatchEntry(
        body=body, attributes=attributes, subject=subject, ordering_key=group,
        deduplication_id=deduplication,
    )  # fmt: skip


async def _content_deduplication(call: Call, topic: str, entries: list[dict[str, Any]]) -> bool:
    """Whether a FIFO topic deduplicates by content, asked only when an entry needs to know
    (so that publishing otherwise needs the publish grant alone)."""
    if not is_fifo(topic) or all(e.get("MessageDeduplicationId") for e in entries):
        return False
    attributes = (await get_topic(call, topic)).sns_attributes
    return attributes.get("ContentBasedDeduplication", "false").lower() == "true"


async def _published_call(call: Call, method: Callable[..., Any], request: Any) -> Any:
    """A Publish or PublishBatch call; a topic that is not there is SNS's NotFound."""
    try:
        return await rpc(call, method, request)
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Topic does not exist") from None
        raise


def _published(response: Any, fifo: bool) -> Result:
    result: Result = {"MessageId": response.publish_id}
    if fifo:
        # SNS numbers a FIFO topic's messages; postbox's ids grow in publish order.
        result["SequenceNumber"] = str(time.time_ns()).zfill(20)
    return result


@action("Publish")
async def publish(call: Call) -> Result:
    arn = call.params.get("TopicArn") or call.params.get("TargetArn")
    if not arn:
        raise InvalidParameter(
            "Invalid parameter: TopicArn or TargetArn Reason: no value for required parameter"
        )
    if call.params.get("PhoneNumber"):
        raise InvalidParameter("Invalid parameter: PhoneNumber Reason: postbox sends no SMS")
    topic = arns.topic_of(arn, call.settings)
    entry = _message_entry(
        call.params, topic, await _content_deduplication(call, topic, [call.params])
    )
    request = pb.PublishRequest(
        topic=topic, body=entry.body, attributes=entry.attributes, subject=entry.subject,
        ordering_key=entry.ordering_key, deduplication_id=entry.deduplication_id,
    )  # fmt: skip
    response = await _published_call(call, call.backend.topics.Publish, request)
    return _published(response, is_fifo(topic))


@action("PublishBatch")
async def publish_batch(call: Call) -> Result:
    topic = arns.topic_of(required(call, "TopicArn"), call.settings)
    entries = call.params.get("PublishBatchRequestEntries") or []
    if not entries:
        raise AwsError(EMPTY_BATCH_REQUEST, "The batch request doesn't contain any entries")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise AwsError(
            TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
            "The batch request contains more entries than permissible.",
        )
    ids = [entry.get("Id") or "" for entry in entries]
    if len(set(ids)) != len(ids):
        raise AwsError(
            BATCH_ENTRY_IDS_NOT_DISTINCT,
            "Two or more batch entries in the request have the same Id.",
        )
    for entry_id in ids:
        if (
            not entry_id
            or len(entry_id) > 80
            or not all(c.isalnum() or c in "-_" for c in entry_id)
        ):
            raise AwsError(
                INVALID_BATCH_ENTRY_ID,
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
    total = sum(len((entry.get("Message") or "").encode()) for entry in entries)
    if total > MAX_MESSAGE_BYTES:
        raise AwsError(
            BATCH_REQUEST_TOO_LONG,
            f"The length of all the messages put together is more than the limit ({total} bytes).",
        )
    if is_fifo(topic) and not all(entry.get("MessageGroupId") for entry in entries):
        raise InvalidParameter(
            "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
        )
    valid: list[tuple[str, pb.PublishBatchEntry]] = []
    failed: list[Result] = []
    content_deduplication = await _content_deduplication(call, topic, entries)

    def fail(entry_id: str, error: AwsError) -> None:
        failed.append(
            {"Id": entry_id, "Code": error.kind.code, "Message": error.message, "SenderFault": True}
        )

    for entry in entries:
        try:
            valid.append((entry["Id"], _message_entry(entry, topic, content_deduplication)))
        except AwsError as error:
            fail(entry["Id"], error)
    successful: list[Result] = []
    # One transaction: the valid entries are published together or not at all.
    response = await send_accepted(
        valid,
        lambda accepted: _published_call(
            call,
            call.backend.topics.PublishBatch,
            pb.PublishBatchRequest(topic=topic, entries=accepted),
        ),
        fail,
    )
    if response is not None:
        for (entry_id, _), result in zip(valid, response.results, strict=True):
            successful.append({"Id": entry_id, **_published(result, is_fifo(topic))})
    return {"Successful": successful, "Failed": failed}
