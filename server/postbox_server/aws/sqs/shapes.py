"""The inputs and outputs of the SQS actions (the shapes: postbox_server/aws/shapes.py)."""

from __future__ import annotations

from postbox_server.aws.shapes import (
    BLOB,
    BOOLEAN,
    INTEGER,
    LONG,
    STRING,
    ListOf,
    MapOf,
    Member,
    Structure,
    m,
    struct,
)

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
