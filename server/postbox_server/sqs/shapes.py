"""The inputs and outputs of the SQS actions, with their member names in both protocols.

The JSON protocol names members as the service model does; the query protocol (and its
XML responses) renames some of them and flattens every list and map: a list member
`AttributeNames` travels as `AttributeName.1`, `AttributeName.2`, ...; a map member
`Attributes` as `Attribute.1.Name` / `Attribute.1.Value`. Actions read and write the
JSON names; the codecs in `jsonproto` and `query` use these shapes to translate.
"""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass

from postbox_server.sqs.errors import invalid_parameter


class Scalar(enum.Enum):
    STRING = "string"
    INTEGER = "integer"
    LONG = "long"
    BOOLEAN = "boolean"
    # Raw bytes, base64 on the wire in both protocols.
    BLOB = "blob"


@dataclass(frozen=True)
class Member:
    name: str
    shape: Shape
    # Query/XML name, when it differs from the JSON name.
    query_name: str | None = None
    # Further query names accepted on input (SDKs have sent more than one spelling).
    aliases: tuple[str, ...] = ()

    @property
    def wire_name(self) -> str:
        return self.query_name or self.name


@dataclass(frozen=True)
class Structure:
    members: tuple[Member, ...]


@dataclass(frozen=True)
class ListOf:
    member: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape
    key_name: str = "Name"
    value_name: str = "Value"


Shape = Scalar | Structure | ListOf | MapOf

STRING, INTEGER, LONG, BOOLEAN, BLOB = Scalar


def decode_blob(text: str, parameter: str) -> bytes:
    """A BLOB parameter's bytes from its base64 text, as both protocols carry it."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_parameter(
            f"Value for parameter {parameter} is invalid. Reason: must be base64-encoded."
        ) from None


def struct(*members: Member) -> Structure:
    return Structure(members)


def m(name: str, shape: Shape, query_name: str | None = None, *aliases: str) -> Member:
    return Member(name, shape, query_name, aliases)


_MESSAGE_ATTRIBUTE_VALUE = struct(
    m("StringValue", STRING),
    m("BinaryValue", BLOB),
    m("StringListValues", ListOf(STRING), "StringListValue"),
    m("BinaryListValues", ListOf(BLOB), "BinaryListValue"),
    m("DataType", STRING),
)
MESSAGE_ATTRIBUTES = MapOf(_MESSAGE_ATTRIBUTE_VALUE)
_STRINGS = MapOf(STRING)
_TAGS = MapOf(STRING, "Key", "Value")
_QUEUE_URL = m("QueueUrl", STRING)
_FAILED = m(
    "Failed",
    ListOf(
        struct(m("Id", STRING), m("SenderFault", BOOLEAN), m("Code", STRING), m("Message", STRING))
    ),
    "BatchResultErrorEntry",
)


def _message_fields() -> tuple[Member, ...]:
    return (
        m("MessageBody", STRING),
        m("DelaySeconds", INTEGER),
        m("MessageAttributes", MESSAGE_ATTRIBUTES, "MessageAttribute"),
        m("MessageSystemAttributes", MESSAGE_ATTRIBUTES, "MessageSystemAttribute"),
        m("MessageDeduplicationId", STRING),
        m("MessageGroupId", STRING),
    )


def _sent_fields() -> tuple[Member, ...]:
    return (
        m("MD5OfMessageBody", STRING),
        m("MD5OfMessageAttributes", STRING),
        m("MD5OfMessageSystemAttributes", STRING),
        m("MessageId", STRING),
        m("SequenceNumber", STRING),
    )


def _receipt_batch(entry: str, *fields: Member) -> tuple[Structure, Structure]:
    request = struct(
        _QUEUE_URL,
        m("Entries", ListOf(struct(m("Id", STRING), m("ReceiptHandle", STRING), *fields)), entry),
    )
    result = struct(
        m("Successful", ListOf(struct(m("Id", STRING))), entry.replace("Request", "Result")),
        _FAILED,
    )
    return request, result


_MESSAGE = struct(
    m("MessageId", STRING),
    m("ReceiptHandle", STRING),
    m("MD5OfBody", STRING),
    m("Body", STRING),
    m("Attributes", _STRINGS, "Attribute"),
    m("MD5OfMessageAttributes", STRING),
    m("MessageAttributes", MESSAGE_ATTRIBUTES, "MessageAttribute"),
)
_MOVE_TASK = struct(
    m("TaskHandle", STRING),
    m("Status", STRING),
    m("SourceArn", STRING),
    m("DestinationArn", STRING),
    m("MaxNumberOfMessagesPerSecond", INTEGER),
    m("ApproximateNumberOfMessagesMoved", LONG),
    m("ApproximateNumberOfMessagesToMove", LONG),
    m("FailureReason", STRING),
    m("StartedTimestamp", LONG),
)
_EMPTY = struct()
_QUEUE_ONLY = struct(_QUEUE_URL)

# action -> (input, output); an empty output structure is a response without a result.
ACTIONS: dict[str, tuple[Structure, Structure]] = {
    "CreateQueue": (
        struct(
            m("QueueName", STRING),
            m("Attributes", _STRINGS, "Attribute"),
            m("tags", _TAGS, "Tag", "Tags"),
        ),
        struct(_QUEUE_URL),
    ),
    "GetQueueUrl": (
        struct(m("QueueName", STRING), m("QueueOwnerAWSAccountId", STRING)),
        struct(_QUEUE_URL),
    ),
    "ListQueues": (
        struct(m("QueueNamePrefix", STRING), m("NextToken", STRING), m("MaxResults", INTEGER)),
        struct(m("QueueUrls", ListOf(STRING), "QueueUrl"), m("NextToken", STRING)),
    ),
    "DeleteQueue": (_QUEUE_ONLY, _EMPTY),
    "PurgeQueue": (_QUEUE_ONLY, _EMPTY),
    "GetQueueAttributes": (
        struct(_QUEUE_URL, m("AttributeNames", ListOf(STRING), "AttributeName")),
        struct(m("Attributes", _STRINGS, "Attribute")),
    ),
    "SetQueueAttributes": (struct(_QUEUE_URL, m("Attributes", _STRINGS, "Attribute")), _EMPTY),
    "SendMessage": (struct(_QUEUE_URL, *_message_fields()), struct(*_sent_fields())),
    "SendMessageBatch": (
        struct(
            _QUEUE_URL,
            m(
                "Entries",
                ListOf(struct(m("Id", STRING), *_message_fields())),
                "SendMessageBatchRequestEntry",
            ),
        ),
        struct(
            m(
                "Successful",
                ListOf(struct(m("Id", STRING), *_sent_fields())),
                "SendMessageBatchResultEntry",
            ),
            _FAILED,
        ),
    ),
    "ReceiveMessage": (
        struct(
            _QUEUE_URL,
            m("AttributeNames", ListOf(STRING), "AttributeName"),
            m("MessageSystemAttributeNames", ListOf(STRING), "MessageSystemAttributeName"),
            m("MessageAttributeNames", ListOf(STRING), "MessageAttributeName"),
            m("MaxNumberOfMessages", INTEGER),
            m("VisibilityTimeout", INTEGER),
            m("WaitTimeSeconds", INTEGER),
            m("ReceiveRequestAttemptId", STRING),
        ),
        struct(m("Messages", ListOf(_MESSAGE), "Message")),
    ),
    "DeleteMessage": (struct(_QUEUE_URL, m("ReceiptHandle", STRING)), _EMPTY),
    "DeleteMessageBatch": _receipt_batch("DeleteMessageBatchRequestEntry"),
    "ChangeMessageVisibility": (
        struct(_QUEUE_URL, m("ReceiptHandle", STRING), m("VisibilityTimeout", INTEGER)),
        _EMPTY,
    ),
    "ChangeMessageVisibilityBatch": _receipt_batch(
        "ChangeMessageVisibilityBatchRequestEntry", m("VisibilityTimeout", INTEGER)
    ),
    "TagQueue": (struct(_QUEUE_URL, m("Tags", _TAGS, None, "Tag")), _EMPTY),
    "UntagQueue": (struct(_QUEUE_URL, m("TagKeys", ListOf(STRING), "TagKey")), _EMPTY),
    "ListQueueTags": (_QUEUE_ONLY, struct(m("Tags", _TAGS, "Tag"))),
    "ListDeadLetterSourceQueues": (
        struct(_QUEUE_URL, m("NextToken", STRING), m("MaxResults", INTEGER)),
        struct(m("queueUrls", ListOf(STRING), "QueueUrl"), m("NextToken", STRING)),
    ),
    "StartMessageMoveTask": (
        struct(
            m("SourceArn", STRING),
            m("DestinationArn", STRING),
            m("MaxNumberOfMessagesPerSecond", INTEGER),
        ),
        struct(m("TaskHandle", STRING)),
    ),
    "ListMessageMoveTasks": (
        struct(m("SourceArn", STRING), m("MaxResults", INTEGER)),
        struct(m("Results", ListOf(_MOVE_TASK), "ListMessageMoveTasksResultEntry")),
    ),
    "CancelMessageMoveTask": (
        struct(m("TaskHandle", STRING)),
        struct(m("ApproximateNumberOfMessagesMoved", LONG)),
    ),
    "AddPermission": (
        struct(
            _QUEUE_URL,
            m("Label", STRING),
            m("AWSAccountIds", ListOf(STRING), "AWSAccountId"),
            m("Actions", ListOf(STRING), "ActionName"),
        ),
        _EMPTY,
    ),
    "RemovePermission": (struct(_QUEUE_URL, m("Label", STRING)), _EMPTY),
}
