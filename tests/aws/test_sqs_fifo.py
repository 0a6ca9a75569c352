"""FIFO queues through the shim: groups in order, deduplication, SQS's FIFO rules."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from support import unique_name


def error_of(call, **kwargs) -> dict:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response["Error"]


@pytest.fixture
def fifo_queue(sqs, request):
    url = sqs.create_queue(
        QueueName=unique_name(request.node.name)[:70] + ".fifo",
        Attributes={"FifoQueue": "true"},
    )["QueueUrl"]
    yield url
    sqs.delete_queue(QueueUrl=url)


def drain(client, url: str) -> list[dict]:
    """Receives and deletes until the queue is empty; the messages in delivery order."""
    delivered = []
    while True:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["All"]
        ).get("Messages", [])
        if not messages:
            return delivered
        delivered += messages
        for message in messages:
            client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def test_fifo_attributes(sqs_any, fifo_queue):
    got = sqs_any.get_queue_attributes(QueueUrl=fifo_queue, AttributeNames=["All"])["Attributes"]
    assert got["FifoQueue"] == "true"
    assert got["ContentBasedDeduplication"] == "false"
    assert got["DeduplicationScope"] == "queue"
    assert got["FifoThroughputLimit"] == "perQueue"
    sqs_any.set_queue_attributes(
        QueueUrl=fifo_queue, Attributes={"ContentBasedDeduplication": "true", "FifoQueue": "true"}
    )
    got = sqs_any.get_queue_attributes(
        QueueUrl=fifo_queue, AttributeNames=["ContentBasedDeduplication"]
    )
    assert got["Attributes"] == {"ContentBasedDeduplication": "true"}


def test_fifo_rules_on_create(sqs_any, sqs_queue, request):
    name = unique_name(request.node.name)[:60]
    # SQS's codes and texts, as AWS answers them.
    error = error_of(sqs_any.create_queue, QueueName=f"{name}.fifo")
    assert error["Code"] == "InvalidParameterValue"
    assert error["Message"].startswith("Can only include alphanumeric characters")
    error = error_of(sqs_any.create_queue, QueueName=name, Attributes={"FifoQueue": "true"})
    assert error["Code"] == "InvalidParameterValue"
    assert "must end with .fifo suffix" in error["Message"]
    for attribute, value in (
        ("ContentBasedDeduplication", "true"),
        ("FifoThroughputLimit", "perQueue"),
        ("DeduplicationScope", "queue"),
    ):
        refused = error_of(sqs_any.create_queue, QueueName=name, Attributes={attribute: value})
        assert refused["Code"] == "InvalidAttributeName", attribute
        assert refused["Message"] == f"Unknown Attribute {attribute}."
    error = error_of(
        sqs_any.set_queue_attributes,
        QueueUrl=sqs_queue,
        Attributes={"ContentBasedDeduplication": "true"},
    )
    assert error["Code"] == "InvalidAttributeName"
    # High throughput: perMessageGroupId goes with DeduplicationScope messageGroup.
    error = error_of(
        sqs_any.create_queue,
        QueueName=f"{name}.fifo",
        Attributes={"FifoQueue": "true", "FifoThroughputLimit": "perMessageGroupId"},
    )
    assert error["Code"] == "InvalidParameterValue"
    assert error["Message"] == (
        "FifoThroughputLimit perMessageGroupId needs DeduplicationScope messageGroup"
    )
    error = error_of(
        sqs_any.create_queue,
        QueueName=f"{name}.fifo",
        Attributes={"FifoQueue": "true", "DeduplicationScope": "group"},
    )
    assert error["Code"] == "InvalidAttributeValue"
    assert "must be queue or messageGroup, not 'group'" in error["Message"]


def test_high_throughput_fifo_deduplicates_per_message_group(sqs_any, request):
    """DeduplicationScope messageGroup, FifoThroughputLimit perMessageGroupId: SQS's
    high-throughput FIFO settings, kept; a deduplication id is then its group's."""
    name = unique_name(request.node.name)[:60] + ".fifo"
    high = {"FifoQueue": "true", "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId"}  # fmt: skip
    url = sqs_any.create_queue(QueueName=name, Attributes=high)["QueueUrl"]
    try:
        # The same attributes again: the same queue.
        assert sqs_any.create_queue(QueueName=name, Attributes=high)["QueueUrl"] == url
        got = sqs_any.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (got["DeduplicationScope"], got["FifoThroughputLimit"]) == (
            "messageGroup",
            "perMessageGroupId",
        )
        for group in ("a", "b", "a"):
            sqs_any.send_message(
                QueueUrl=url, MessageBody=group, MessageGroupId=group,
                MessageDeduplicationId="same",
            )  # fmt: skip
        delivered = drain(sqs_any, url)
        assert sorted(m["Body"] for m in delivered) == ["a", "b"]
        assert {m["Attributes"]["MessageDeduplicationId"] for m in delivered} == {"same"}
        # Back to normal throughput, per queue.
        sqs_any.set_queue_attributes(
            QueueUrl=url,
            Attributes={"FifoThroughputLimit": "perQueue", "DeduplicationScope": "queue"},
        )
        got = sqs_any.get_queue_attributes(
            QueueUrl=url, AttributeNames=["DeduplicationScope", "FifoThroughputLimit"]
        )["Attributes"]
        assert got == {"DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
    finally:
        sqs_any.delete_queue(QueueUrl=url)


def test_groups_are_delivered_in_order(sqs_any, fifo_queue):
    sent = []
    for i in range(4):
        for group in ("a", "b", "c"):
            body = f"{group}{i}"
            response = sqs_any.send_message(
                QueueUrl=fifo_queue,
                MessageBody=body,
                MessageGroupId=group,
                MessageDeduplicationId=body,
            )
            sent.append(int(response["SequenceNumber"]))
    assert sent == sorted(sent)
    delivered = drain(sqs_any, fifo_queue)
    for group in ("a", "b", "c"):
        in_group = [m for m in delivered if m["Attributes"]["MessageGroupId"] == group]
        assert [m["Body"] for m in in_group] == [f"{group}{i}" for i in range(4)]
        numbers = [int(m["Attributes"]["SequenceNumber"]) for m in in_group]
        assert numbers == sorted(numbers)
    assert {m["Attributes"]["MessageDeduplicationId"] for m in delivered} == {
        m["Body"] for m in delivered
    }


def send_to_group(client, url: str, bodies: list[str], group: str = "g") -> None:
    for body in bodies:
        client.send_message(
            QueueUrl=url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=body
        )


def test_a_group_waits_while_its_message_is_in_flight(sqs_any, fifo_queue):
    send_to_group(sqs_any, fifo_queue, ["first", "second"])
    (first,) = sqs_any.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=1)["Messages"]
    assert first["Body"] == "first"
    assert "Messages" not in sqs_any.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)
    sqs_any.delete_message(QueueUrl=fifo_queue, ReceiptHandle=first["ReceiptHandle"])
    (second,) = sqs_any.receive_message(QueueUrl=fifo_queue)["Messages"]
    assert second["Body"] == "second"


def test_one_receive_returns_several_messages_of_a_group_in_order(sqs_any, fifo_queue):
    send_to_group(sqs_any, fifo_queue, ["a1", "a2", "a3"], group="a")
    send_to_group(sqs_any, fifo_queue, ["b1", "b2"], group="b")
    got = sqs_any.receive_message(
        QueueUrl=fifo_queue, MaxNumberOfMessages=4, AttributeNames=["MessageGroupId"]
    )["Messages"]
    assert [m["Body"] for m in got] == ["a1", "a2", "a3", "b1"]
    # Group a is in flight, and b1 too: nothing more until they are deleted.
    assert "Messages" not in sqs_any.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)
    for message in got[:2]:
        sqs_any.delete_message(QueueUrl=fifo_queue, ReceiptHandle=message["ReceiptHandle"])
    assert "Messages" not in sqs_any.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)
    # a3 made visible again comes back first in its group; b2 waits for b1.
    sqs_any.change_message_visibility(
        QueueUrl=fifo_queue, ReceiptHandle=got[2]["ReceiptHandle"], VisibilityTimeout=0
    )
    (again,) = sqs_any.receive_message(QueueUrl=fifo_queue, MaxNumberOfMessages=10)["Messages"]
    assert again["Body"] == "a3"


def test_deduplication_id_drops_repeats_even_after_delete(sqs_any, fifo_queue):
    kwargs = {"QueueUrl": fifo_queue, "MessageGroupId": "g", "MessageDeduplicationId": "once"}
    original = sqs_any.send_message(MessageBody="one", **kwargs)
    repeat = sqs_any.send_message(MessageBody="one", **kwargs)
    assert repeat["MessageId"] == original["MessageId"]
    assert [m["Body"] for m in drain(sqs_any, fifo_queue)] == ["one"]
    sqs_any.send_message(MessageBody="one", **kwargs)
    assert drain(sqs_any, fifo_queue) == []


def test_content_based_deduplication(sqs_any, request):
    url = sqs_any.create_queue(
        QueueName=unique_name(request.node.name)[:70] + ".fifo",
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
    )["QueueUrl"]
    try:
        for body in ("same", "same", "other", "same"):
            sqs_any.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
        assert [m["Body"] for m in drain(sqs_any, url)] == ["same", "other"]
    finally:
        sqs_any.delete_queue(QueueUrl=url)


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"MessageDeduplicationId": "d"}, "MissingParameter"),
        ({"MessageGroupId": "g"}, "InvalidParameterValue"),  # no id, no content-based
        (
            {"MessageGroupId": "g", "MessageDeduplicationId": "d", "DelaySeconds": 5},
            "InvalidParameterValue",
        ),
        ({"MessageGroupId": "g" * 129, "MessageDeduplicationId": "d"}, "InvalidParameterValue"),
    ],
)
def test_fifo_send_rules(sqs_any, fifo_queue, kwargs, code):
    assert (
        error_of(sqs_any.send_message, QueueUrl=fifo_queue, MessageBody="x", **kwargs)["Code"]
        == code
    )
    assert drain(sqs_any, fifo_queue) == []


def test_standard_queue_send_rules(sqs_any, sqs_queue):
    error = error_of(
        sqs_any.send_message, QueueUrl=sqs_queue, MessageBody="x", MessageDeduplicationId="d"
    )
    assert error["Code"] == "InvalidParameterValue"
    # Standard queues keep a message group id (SQS fair queues) without ordering by it.
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageGroupId="tenant-1")
    (message,) = sqs_any.receive_message(QueueUrl=sqs_queue, AttributeNames=["All"])["Messages"]
    assert message["Attributes"]["MessageGroupId"] == "tenant-1"
    assert "SequenceNumber" not in message["Attributes"]


@pytest.mark.parametrize(
    ("missing", "code", "says"),
    [
        ("MessageGroupId", "MissingParameter", "MessageGroupId"),
        ("MessageDeduplicationId", "InvalidParameterValue", "ContentBasedDeduplication"),
    ],
)
def test_a_fifo_batch_entry_without_its_ids_fails_the_whole_call(
    sqs_any, fifo_queue, missing, code, says
):
    entries = [
        {
            "Id": f"e{i}",
            "MessageBody": str(i),
            "MessageGroupId": "g",
            "MessageDeduplicationId": str(i),
        }
        for i in range(3)
    ]
    del entries[1][missing]
    error = error_of(sqs_any.send_message_batch, QueueUrl=fifo_queue, Entries=entries)
    assert error["Code"] == code
    assert says in error["Message"]
    assert drain(sqs_any, fifo_queue) == []  # nothing of the batch was sent


def test_fifo_batch_reports_each_entry(sqs_any, fifo_queue):
    response = sqs_any.send_message_batch(
        QueueUrl=fifo_queue,
        Entries=[
            {"Id": "ok", "MessageBody": "1", "MessageGroupId": "g", "MessageDeduplicationId": "1"},
            {"Id": "bad_group", "MessageBody": "2", "MessageGroupId": "g" * 129,
             "MessageDeduplicationId": "2"},
            {"Id": "ok2", "MessageBody": "4", "MessageGroupId": "g", "MessageDeduplicationId": "4"},
        ],
    )  # fmt: skip
    assert sorted(e["Id"] for e in response["Successful"]) == ["ok", "ok2"]
    assert all("SequenceNumber" in e for e in response["Successful"])
    assert {e["Id"]: e["Code"] for e in response["Failed"]} == {
        "bad_group": "InvalidParameterValue",
    }
    assert [m["Body"] for m in drain(sqs_any, fifo_queue)] == ["1", "4"]


def test_fifo_messages_carry_sender_id_and_sequence_number(sqs_any, fifo_queue):
    sent = sqs_any.send_message(
        QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="x"
    )
    (message,) = sqs_any.receive_message(QueueUrl=fifo_queue, AttributeNames=["All"])["Messages"]
    assert message["Attributes"]["SenderId"] == "000000000000"
    assert message["Attributes"]["SequenceNumber"] == sent["SequenceNumber"]


def test_stale_receipt_is_refused_on_a_fifo_queue(sqs_any, fifo_queue):
    sqs_any.send_message(
        QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="x"
    )
    (stale,) = sqs_any.receive_message(QueueUrl=fifo_queue, VisibilityTimeout=0)["Messages"]
    (current,) = sqs_any.receive_message(QueueUrl=fifo_queue, VisibilityTimeout=600)["Messages"]
    assert current["MessageId"] == stale["MessageId"]
    error = error_of(
        sqs_any.delete_message, QueueUrl=fifo_queue, ReceiptHandle=stale["ReceiptHandle"]
    )
    assert error["Code"] == "InvalidParameterValue"
    assert "The receipt handle has expired" in error["Message"]
    response = sqs_any.delete_message_batch(
        QueueUrl=fifo_queue, Entries=[{"Id": "stale", "ReceiptHandle": stale["ReceiptHandle"]}]
    )
    assert [(e["Id"], e["Code"]) for e in response["Failed"]] == [
        ("stale", "InvalidParameterValue")
    ]
    # Nothing was deleted: the current handle still deletes the message.
    sqs_any.delete_message(QueueUrl=fifo_queue, ReceiptHandle=current["ReceiptHandle"])
    assert drain(sqs_any, fifo_queue) == []


def test_fifo_receive_attributes_and_attempt_id(sqs_any, fifo_queue):
    sent = sqs_any.send_message(
        QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g1", MessageDeduplicationId="d1"
    )
    # ReceiveRequestAttemptId is accepted; postbox does not replay a receive by it.
    (message,) = sqs_any.receive_message(
        QueueUrl=fifo_queue,
        ReceiveRequestAttemptId="attempt-1",
        VisibilityTimeout=0,
        AttributeNames=["MessageGroupId", "SequenceNumber", "ApproximateReceiveCount"],
    )["Messages"]
    assert message["Attributes"] == {
        "MessageGroupId": "g1",
        "SequenceNumber": sent["SequenceNumber"],
        "ApproximateReceiveCount": "1",
    }
    (again,) = sqs_any.receive_message(QueueUrl=fifo_queue, AttributeNames=["All"])["Messages"]
    assert again["Attributes"]["MessageDeduplicationId"] == "d1"
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    assert {"SentTimestamp", "ApproximateFirstReceiveTimestamp"} <= set(again["Attributes"])


def test_fifo_message_system_attribute_names(sqs, fifo_queue):
    sqs.send_message(
        QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g1", MessageDeduplicationId="d1"
    )
    (message,) = sqs.receive_message(
        QueueUrl=fifo_queue, MessageSystemAttributeNames=["MessageGroupId", "SentTimestamp"]
    )["Messages"]
    assert set(message["Attributes"]) == {"MessageGroupId", "SentTimestamp"}


def test_fifo_delay_seconds_zero_is_no_delay(sqs_any, fifo_queue):
    sqs_any.send_message(
        QueueUrl=fifo_queue,
        MessageBody="now",
        MessageGroupId="g",
        MessageDeduplicationId="now",
        DelaySeconds=0,
    )
    response = sqs_any.send_message_batch(
        QueueUrl=fifo_queue,
        Entries=[
            {
                "Id": "zero",
                "MessageBody": "also now",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "also",
                "DelaySeconds": 0,
            },
            {
                "Id": "later",
                "MessageBody": "later",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "later",
                "DelaySeconds": 1,
            },
        ],
    )
    assert [e["Id"] for e in response["Successful"]] == ["zero"]
    assert [(e["Id"], e["Code"]) for e in response["Failed"]] == [
        ("later", "InvalidParameterValue")
    ]
    assert [m["Body"] for m in drain(sqs_any, fifo_queue)] == ["now", "also now"]
