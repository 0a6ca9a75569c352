"""SQS batch actions: per-entry Successful/Failed, and the errors that refuse a whole batch."""

from __future__ import annotations

import hashlib

import pytest
from botocore.exceptions import ClientError


def error_of(call, *args, **kwargs) -> dict:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value.response["Error"]


def bodies(client, url: str) -> list[str]:
    messages = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return sorted(message["Body"] for message in messages)


def receive(client, url: str, **kwargs) -> list[dict]:
    return client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kwargs)["Messages"]


def failures(response: dict) -> dict[str, str]:
    for entry in response.get("Failed", []):
        assert entry["SenderFault"] is True
    return {entry["Id"]: entry["Code"] for entry in response.get("Failed", [])}


def test_send_batch_reports_each_entry(sqs_any, sqs_queue):
    sqs_any.set_queue_attributes(QueueUrl=sqs_queue, Attributes={"MaximumMessageSize": "1024"})
    response = sqs_any.send_message_batch(
        QueueUrl=sqs_queue,
        Entries=[
            {"Id": "plain", "MessageBody": "one"},
            {
                "Id": "typed",
                "MessageBody": "two",
                "MessageAttributes": {"n": {"DataType": "Number.int", "StringValue": "2"}},
            },
            {"Id": "late", "MessageBody": "three", "DelaySeconds": 901},
            {"Id": "bad_char", "MessageBody": "four\x00"},
            {"Id": "too-big", "MessageBody": "x" * 1025},
            {
                "Id": "bad_attr",
                "MessageBody": "six",
                "MessageAttributes": {"n": {"DataType": "Number", "StringValue": "NaN"}},
            },
        ],
    )
    assert failures(response) == {
        "late": "InvalidParameterValue",
        "bad_char": "InvalidMessageContents",
        "too-big": "InvalidParameterValue",
        "bad_attr": "InvalidParameterValue",
    }
    successful = {entry["Id"]: entry for entry in response["Successful"]}
    assert set(successful) == {"plain", "typed"}
    assert successful["plain"]["MD5OfMessageBody"] == hashlib.md5(b"one").hexdigest()
    assert "MD5OfMessageAttributes" not in successful["plain"]
    typed = sqs_any.send_message(
        QueueUrl=sqs_queue,
        MessageBody="two",
        MessageAttributes={"n": {"DataType": "Number.int", "StringValue": "2"}},
    )
    assert successful["typed"]["MD5OfMessageAttributes"] == typed["MD5OfMessageAttributes"]
    assert bodies(sqs_any, sqs_queue) == ["one", "two", "two"]


def test_send_batch_of_ten(sqs_any, sqs_queue):
    entries = [{"Id": f"m{i}", "MessageBody": f"body {i}"} for i in range(10)]
    response = sqs_any.send_message_batch(QueueUrl=sqs_queue, Entries=entries)
    assert [entry["Id"] for entry in response["Successful"]] == [f"m{i}" for i in range(10)]
    assert response.get("Failed", []) == []  # the query protocol omits empty lists
    assert len({entry["MessageId"] for entry in response["Successful"]}) == 10


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            [{"Id": f"m{i}", "MessageBody": "x"} for i in range(11)],
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            [{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}],
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
        ([{"Id": "no spaces", "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
        ([{"Id": "x" * 81, "MessageBody": "x"}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
        (
            [{"Id": f"m{i}", "MessageBody": "x" * 300_000} for i in range(4)],
            "AWS.SimpleQueueService.BatchRequestTooLong",
        ),
    ],
)
def test_send_batch_errors_refuse_the_whole_batch(sqs_any, sqs_queue, entries, code):
    error = error_of(sqs_any.send_message_batch, QueueUrl=sqs_queue, Entries=entries)
    assert error["Code"] == code
    assert "Messages" not in sqs_any.receive_message(QueueUrl=sqs_queue)


def test_delete_batch_reports_each_entry(sqs_any, sqs_queue):
    for i in range(3):
        sqs_any.send_message(QueueUrl=sqs_queue, MessageBody=f"m{i}")
    first, second, third = receive(sqs_any, sqs_queue, VisibilityTimeout=600)
    # Deliver `second` again so that its first handle is stale.
    sqs_any.change_message_visibility(
        QueueUrl=sqs_queue, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    (current,) = receive(sqs_any, sqs_queue)
    assert current["MessageId"] == second["MessageId"]
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=third["ReceiptHandle"])
    response = sqs_any.delete_message_batch(
        QueueUrl=sqs_queue,
        Entries=[
            {"Id": "ok", "ReceiptHandle": first["ReceiptHandle"]},
            {"Id": "stale", "ReceiptHandle": second["ReceiptHandle"]},
            {"Id": "deleted_already", "ReceiptHandle": third["ReceiptHandle"]},
            {"Id": "garbage", "ReceiptHandle": "garbage"},
        ],
    )
    # A standard queue takes a stale handle as success, and deletes nothing with it.
    assert sorted(entry["Id"] for entry in response["Successful"]) == [
        "deleted_already",
        "ok",
        "stale",
    ]
    assert failures(response) == {"garbage": "ReceiptHandleIsInvalid"}
    counts = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])
    assert counts["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
    response = sqs_any.delete_message_batch(
        QueueUrl=sqs_queue, Entries=[{"Id": "current", "ReceiptHandle": current["ReceiptHandle"]}]
    )
    assert response["Successful"] == [{"Id": "current"}]
    counts = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])
    assert counts["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"
    assert counts["Attributes"]["ApproximateNumberOfMessages"] == "0"


def test_change_visibility_batch_reports_each_entry(sqs_any, sqs_queue):
    for i in range(3):
        sqs_any.send_message(QueueUrl=sqs_queue, MessageBody=f"m{i}")
    first, second, third = receive(sqs_any, sqs_queue, VisibilityTimeout=600)
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=third["ReceiptHandle"])
    response = sqs_any.change_message_visibility_batch(
        QueueUrl=sqs_queue,
        Entries=[
            {"Id": "release", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 0},
            {
                "Id": "too_long",
                "ReceiptHandle": second["ReceiptHandle"],
                "VisibilityTimeout": 43201,
            },
            {"Id": "gone", "ReceiptHandle": third["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "garbage", "ReceiptHandle": "garbage", "VisibilityTimeout": 0},
        ],
    )
    assert response["Successful"] == [{"Id": "release"}]
    assert failures(response) == {
        "too_long": "InvalidParameterValue",
        "gone": "InvalidParameterValue",
        "garbage": "ReceiptHandleIsInvalid",
    }
    # Only the released message is visible again; `second` kept its 600 s.
    assert bodies(sqs_any, sqs_queue) == [first["Body"]]


@pytest.mark.parametrize("action", ["delete_message_batch", "change_message_visibility_batch"])
def test_receipt_batch_errors(sqs_any, sqs_queue, action):
    call = getattr(sqs_any, action)
    extra = {"VisibilityTimeout": 0} if action == "change_message_visibility_batch" else {}
    entry = {"ReceiptHandle": "h", **extra}
    cases = [
        ([], "AWS.SimpleQueueService.EmptyBatchRequest"),
        (
            [{"Id": f"e{i}", **entry} for i in range(11)],
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        ),
        (
            [{"Id": "a", **entry}, {"Id": "a", **entry}],
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        ),
        ([{"Id": "a.b", **entry}], "AWS.SimpleQueueService.InvalidBatchEntryId"),
    ]
    for entries, code in cases:
        assert error_of(call, QueueUrl=sqs_queue, Entries=entries)["Code"] == code
