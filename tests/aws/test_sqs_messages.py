"""Sending, receiving, deleting and changing visibility through the shim, with boto3."""

from __future__ import annotations

import hashlib
import http.client
import json
import threading
import time
from urllib.parse import urlsplit

import pytest
from botocore.exceptions import ClientError
from support import sqs_client, unique_name

# AWS's published digests of these attribute sets (SQS developer guide samples).
AWS_SAMPLE = {
    "City": {"DataType": "String", "StringValue": "Any City"},
    "PostalCode": {"DataType": "String", "StringValue": "99065"},
    "PricePerGallon": {"DataType": "Number", "StringValue": "1.99"},
    "Region": {"DataType": "String", "StringValue": "WA"},
    "SellerName": {"DataType": "String", "StringValue": "Example Store"},
}
AWS_SAMPLE_MD5 = "10809b55e3d9b22c17220b7dbaf283ef"
AWS_BINARY_SAMPLE = {
    "test_attribute_name": {"DataType": "Binary", "BinaryValue": b"test_attribute_value"}
}
AWS_BINARY_SAMPLE_MD5 = "23f6bd27ea87aab7dfeadcc9aebee495"

EVERY_TYPE = {
    "text": {"DataType": "String", "StringValue": "grüße, 世界 🚀"},
    "count": {"DataType": "Number", "StringValue": "-12.5e3"},
    "blob": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
    "ratio": {"DataType": "Number.float", "StringValue": "0.25"},
    "doc": {"DataType": "String.json", "StringValue": '{"a": 1}'},
    "image": {"DataType": "Binary.png", "BinaryValue": b"\x89PNG\r\n"},
}


def error_of(call, *args, **kwargs) -> dict:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value.response["Error"]


def md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def attribute_digest(attributes: dict) -> str:
    """MD5OfMessageAttributes as REFERENCE.md spells it out, apart from the shim's code."""
    buffer = b""
    for name in sorted(attributes):
        value = attributes[name]
        for field in (name.encode(), value["DataType"].encode()):
            buffer += len(field).to_bytes(4, "big") + field
        if "BinaryValue" in value:
            transport, data = 2, value["BinaryValue"]
        else:
            transport, data = 1, value["StringValue"].encode()
        buffer += bytes([transport]) + len(data).to_bytes(4, "big") + data
    return hashlib.md5(buffer).hexdigest()


def receive_all(client, url: str, **kwargs) -> list[dict]:
    return client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, **kwargs).get(
        "Messages", []
    )


def test_send_receive_delete(sqs_any, sqs_queue):
    sent = sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="hello <world> & ünïcode")
    assert sent["MD5OfMessageBody"] == md5("hello <world> & ünïcode")
    assert "MD5OfMessageAttributes" not in sent
    (message,) = receive_all(sqs_any, sqs_queue)
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == "hello <world> & ünïcode"
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"])
    # Deleting a deleted message succeeds, as in SQS.
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"])
    assert receive_all(sqs_any, sqs_queue, VisibilityTimeout=0) == []


@pytest.mark.parametrize(
    ("attributes", "expected_md5"),
    [(AWS_SAMPLE, AWS_SAMPLE_MD5), (AWS_BINARY_SAMPLE, AWS_BINARY_SAMPLE_MD5)],
)
def test_attribute_digests_match_aws_samples(sqs_any, sqs_queue, attributes, expected_md5):
    sent = sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=attributes)
    assert sent["MD5OfMessageAttributes"] == expected_md5
    (message,) = receive_all(sqs_any, sqs_queue, MessageAttributeNames=["All"])
    assert message["MD5OfMessageAttributes"] == expected_md5
    assert message["MessageAttributes"] == attributes


def test_every_attribute_type_round_trips(sqs_any, sqs_queue):
    sent = sqs_any.send_message(
        QueueUrl=sqs_queue, MessageBody="typed", MessageAttributes=EVERY_TYPE
    )
    (message,) = receive_all(sqs_any, sqs_queue, MessageAttributeNames=["All"])
    assert message["MessageAttributes"] == EVERY_TYPE
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]


@pytest.mark.parametrize(
    ("wanted", "names"),
    [
        ([".*"], set(EVERY_TYPE)),
        (["text", "blob", "absent"], {"text", "blob"}),
        # A prefix wildcard: "im.*" selects every name starting with "im", as moto's
        # test_message_attributes_with_wildcards has "Custom.*" select "Custom1".
        (["im.*", "count"], {"image", "count"}),
        (["*"], set(EVERY_TYPE)),
        (["doc"], {"doc"}),
    ],
)
def test_message_attribute_names_select(sqs_any, sqs_queue, wanted, names):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=EVERY_TYPE)
    (message,) = receive_all(sqs_any, sqs_queue, MessageAttributeNames=wanted)
    assert set(message.get("MessageAttributes", {})) == names
    if names:
        only = {name: EVERY_TYPE[name] for name in names}
        digest = sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=only)
        assert message["MD5OfMessageAttributes"] == digest["MD5OfMessageAttributes"]
    else:
        assert "MD5OfMessageAttributes" not in message


def test_system_attributes(sqs_any, sqs_queue):
    before = int(time.time() * 1000)
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (first,) = receive_all(sqs_any, sqs_queue, AttributeNames=["All"], VisibilityTimeout=0)
    (second,) = receive_all(
        sqs_any, sqs_queue, AttributeNames=["ApproximateReceiveCount", "SentTimestamp"]
    )
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    assert second["Attributes"] == {
        "ApproximateReceiveCount": "2",
        "SentTimestamp": first["Attributes"]["SentTimestamp"],
    }
    sent_at = int(first["Attributes"]["SentTimestamp"])
    first_received = int(first["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert before - 1000 <= sent_at <= first_received <= int(time.time() * 1000) + 1000


def test_message_system_attribute_names(sqs, sqs_queue):
    sqs.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (message,) = receive_all(sqs, sqs_queue, MessageSystemAttributeNames=["SentTimestamp"])
    assert set(message["Attributes"]) == {"SentTimestamp"}


def test_visibility_timeout_and_change(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (message,) = receive_all(sqs_any, sqs_queue, VisibilityTimeout=600)
    assert receive_all(sqs_any, sqs_queue) == []
    sqs_any.change_message_visibility(
        QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
    )
    (again,) = receive_all(sqs_any, sqs_queue, AttributeNames=["ApproximateReceiveCount"])
    assert again["MessageId"] == message["MessageId"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    # The first receipt is stale now: the message was delivered again since. A standard
    # queue answers success and deletes nothing; the current holder keeps its lease.
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"])
    counts = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])
    assert counts["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "1"
    error = error_of(
        sqs_any.change_message_visibility,
        QueueUrl=sqs_queue,
        ReceiptHandle=message["ReceiptHandle"],
        VisibilityTimeout=10,
    )
    assert error["Code"] == "InvalidParameterValue"
    assert "not available for visibility timeout change" in error["Message"]
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=again["ReceiptHandle"])
    error = error_of(
        sqs_any.change_message_visibility,
        QueueUrl=sqs_queue,
        ReceiptHandle=again["ReceiptHandle"],
        VisibilityTimeout=10,
    )
    assert error["Code"] == "InvalidParameterValue"


def test_receipt_handles_are_checked(sqs_any, sqs_queue, sqs):
    error = error_of(sqs_any.delete_message, QueueUrl=sqs_queue, ReceiptHandle="not-a-handle")
    assert error["Code"] == "ReceiptHandleIsInvalid"
    # A handle of another queue is not valid for this one.
    other = sqs.create_queue(QueueName=unique_name("other"))
    try:
        sqs.send_message(QueueUrl=other["QueueUrl"], MessageBody="x")
        (message,) = receive_all(sqs, other["QueueUrl"])
        error = error_of(
            sqs_any.delete_message, QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"]
        )
        assert error["Code"] == "ReceiptHandleIsInvalid"
    finally:
        sqs.delete_queue(QueueUrl=other["QueueUrl"])


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"MessageBody": ""}, "MissingParameter"),
        ({"MessageBody": "a\x01b"}, "InvalidMessageContents"),
        ({"MessageBody": "x" * (1024 * 1024 + 1)}, "InvalidParameterValue"),
        ({"MessageBody": "x", "DelaySeconds": 901}, "InvalidParameterValue"),
        (
            {
                "MessageBody": "x",
                "MessageAttributes": {
                    f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)
                },
            },
            "InvalidParameterValue",
        ),
        *[
            ({"MessageBody": "x", "MessageAttributes": {name: value}}, "InvalidParameterValue")
            for name, value in [
                ("AWS.reserved", {"DataType": "String", "StringValue": "v"}),
                ("n", {"DataType": "Number", "StringValue": "twelve"}),
                ("n", {"DataType": "Date", "StringValue": "today"}),
                ("b", {"DataType": "Binary", "StringValue": "text"}),
                ("s", {"DataType": "String", "StringValue": ""}),
            ]
        ],
    ],
)
def test_bad_messages_are_refused_and_nothing_is_sent(sqs_any, sqs_queue, kwargs, code):
    assert error_of(sqs_any.send_message, QueueUrl=sqs_queue, **kwargs)["Code"] == code
    assert receive_all(sqs_any, sqs_queue) == []


def test_message_larger_than_the_queue_allows(sqs_any, sqs_queue):
    sqs_any.set_queue_attributes(QueueUrl=sqs_queue, Attributes={"MaximumMessageSize": "1024"})
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x" * 1024)
    error = error_of(sqs_any.send_message, QueueUrl=sqs_queue, MessageBody="x" * 1025)
    assert error["Code"] == "InvalidParameterValue"


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"MaxNumberOfMessages": 11}, "InvalidParameterValue"),
        ({"MaxNumberOfMessages": 0}, "InvalidParameterValue"),
        ({"WaitTimeSeconds": 21}, "InvalidParameterValue"),
        ({"VisibilityTimeout": 43201}, "InvalidParameterValue"),
        ({"AttributeNames": ["NoSuchAttribute"]}, "InvalidAttributeName"),
    ],
)
def test_bad_receives_are_refused(sqs_any, sqs_queue, kwargs, code):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="stays")
    assert error_of(sqs_any.receive_message, QueueUrl=sqs_queue, **kwargs)["Code"] == code
    assert len(receive_all(sqs_any, sqs_queue)) == 1


def test_delay_seconds(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="later", DelaySeconds=1)
    assert receive_all(sqs_any, sqs_queue) == []
    started = time.monotonic()
    (message,) = receive_all(sqs_any, sqs_queue, WaitTimeSeconds=10)
    assert message["Body"] == "later"
    assert time.monotonic() - started < 5


def test_empty_long_poll_waits_its_time(sqs_any, sqs_queue):
    started = time.monotonic()
    assert receive_all(sqs_any, sqs_queue, WaitTimeSeconds=1) == []
    assert 0.9 <= time.monotonic() - started < 5


def test_queue_wait_time_is_the_default(sqs_any, sqs_queue):
    sqs_any.set_queue_attributes(
        QueueUrl=sqs_queue, Attributes={"ReceiveMessageWaitTimeSeconds": "1"}
    )
    started = time.monotonic()
    assert receive_all(sqs_any, sqs_queue) == []
    assert 0.9 <= time.monotonic() - started < 5
    started = time.monotonic()
    assert receive_all(sqs_any, sqs_queue, WaitTimeSeconds=0) == []
    assert time.monotonic() - started < 0.9


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_long_poll_wakes_within_100_ms_of_a_send(sqs, sqs_shim, sqs_queue, protocol):
    receiver = sqs_client(sqs_shim.endpoint, protocol)  # its own connection
    receiver.list_queues()  # connected before timing starts
    delays = []
    for round_ in range(5):
        result: dict = {}
        waiting = threading.Event()

        def receive(result=result, waiting=waiting) -> None:
            waiting.set()
            result["messages"] = receive_all(receiver, sqs_queue, WaitTimeSeconds=10)
            result["returned"] = time.monotonic()

        thread = threading.Thread(target=receive)
        thread.start()
        waiting.wait()
        # Give the request time to reach the server's wait; if it is slower, the
        # receive finds the message at once, which the timing below also covers.
        time.sleep(0.3)
        sqs.send_message(QueueUrl=sqs_queue, MessageBody=f"wake {round_}")
        sent = time.monotonic()
        thread.join(15)
        (message,) = result["messages"]
        assert message["Body"] == f"wake {round_}"
        sqs.delete_message(QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"])
        delays.append(result["returned"] - sent)
    # The typical wake-up is the promise; every one is checked too, with room for a
    # busy machine's scheduling: a poll that missed the send's notification would
    # wait out its 10 s and show here.
    assert sorted(delays)[len(delays) // 2] < 0.1, f"wake-up delays after send: {delays}"
    assert max(delays) < 0.5, f"wake-up delays after send: {delays}"


def test_client_disconnect_cancels_the_long_poll(sqs, sqs_queue):
    """An abandoned long poll must not claim a later message (SQS would not deliver it)."""
    url = urlsplit(sqs_queue)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=0.5)
    body = json.dumps({"QueueUrl": sqs_queue, "WaitTimeSeconds": 20})
    connection.request(
        "POST",
        "/",
        body,
        {"X-Amz-Target": "AmazonSQS.ReceiveMessage", "Content-Type": "application/x-amz-json-1.0"},
    )
    with pytest.raises(TimeoutError):
        connection.getresponse()
    connection.close()
    # The shim sees the closed socket at once and cancels the gRPC stream; nothing
    # shows when that is done, so allow it a generous second. Without the cancel the
    # abandoned poll (waiting 20 s) would claim the next message before we ask.
    time.sleep(1)
    sqs.send_message(QueueUrl=sqs_queue, MessageBody="after")
    # A live abandoned poll would claim the message within milliseconds of the send.
    time.sleep(1)
    counts = sqs.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "1"
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_binary_body_from_grpc_arrives_as_text(sqs, sqs_queue, messages):
    """A gRPC producer may send bytes that are not UTF-8; SQS clients get valid text."""
    from postbox.v1 import message_service_pb2 as pb

    messages.Send(pb.SendRequest(queue=sqs_queue.rsplit("/", 1)[1], body=b"ok \xff\xfe"))
    (message,) = receive_all(sqs, sqs_queue)
    assert message["Body"] == "ok \ufffd\ufffd"
    assert message["MD5OfBody"] == md5(message["Body"])


def test_carriage_returns_arrive_as_sent(sqs_any, sqs_queue):
    """XML parsers fold CR and CRLF into LF: the query protocol must send CR escaped."""
    body = "line one\r\nline two\rend\n"
    attributes = {"note": {"DataType": "String", "StringValue": "a\r\nb\r"}}
    sent = sqs_any.send_message(QueueUrl=sqs_queue, MessageBody=body, MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == md5(body)
    assert sent["MD5OfMessageAttributes"] == attribute_digest(attributes)
    (message,) = receive_all(sqs_any, sqs_queue, MessageAttributeNames=["All"])
    assert message["Body"] == body
    assert message["MD5OfBody"] == md5(body)
    assert message["MessageAttributes"] == attributes
    assert message["MD5OfMessageAttributes"] == attribute_digest(attributes)


TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
TRACE_ATTRIBUTE = {"AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}}


def test_aws_trace_header_is_kept_and_returned(sqs_any, sqs_queue):
    user = {"a": {"DataType": "String", "StringValue": "v"}}
    sent = sqs_any.send_message(
        QueueUrl=sqs_queue,
        MessageBody="traced",
        MessageAttributes=user,
        MessageSystemAttributes=TRACE_ATTRIBUTE,
    )
    assert sent["MD5OfMessageSystemAttributes"] == attribute_digest(TRACE_ATTRIBUTE)
    assert sent["MD5OfMessageAttributes"] == attribute_digest(user)
    batch = sqs_any.send_message_batch(
        QueueUrl=sqs_queue,
        Entries=[
            {"Id": "traced", "MessageBody": "batch", "MessageSystemAttributes": TRACE_ATTRIBUTE},
            {"Id": "plain", "MessageBody": "plain"},
        ],
    )
    digests = {e["Id"]: e.get("MD5OfMessageSystemAttributes") for e in batch["Successful"]}
    assert digests == {"traced": attribute_digest(TRACE_ATTRIBUTE), "plain": None}

    messages = receive_all(
        sqs_any,
        sqs_queue,
        VisibilityTimeout=0,
        AttributeNames=["AWSTraceHeader"],
        MessageAttributeNames=["All"],
    )
    by_body = {message["Body"]: message for message in messages}
    assert by_body["traced"]["Attributes"] == {"AWSTraceHeader": TRACE}
    # The trace header is no message attribute, and not in their digest.
    assert by_body["traced"]["MessageAttributes"] == user
    assert by_body["traced"]["MD5OfMessageAttributes"] == attribute_digest(user)
    assert by_body["batch"]["Attributes"] == {"AWSTraceHeader": TRACE}
    assert "MessageAttributes" not in by_body["batch"]
    assert "Attributes" not in by_body["plain"]
    everything = receive_all(sqs_any, sqs_queue, AttributeNames=["All"])
    traces = {m["Body"]: m["Attributes"].get("AWSTraceHeader") for m in everything}
    assert traces == {"traced": TRACE, "batch": TRACE, "plain": None}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"MessageSystemAttributes": {"SenderId": {"DataType": "String", "StringValue": "me"}}},
        {
            "MessageSystemAttributes": {
                "AWSTraceHeader": {"DataType": "Binary", "BinaryValue": b"x"}
            }
        },
        {"MessageSystemAttributes": {"AWSTraceHeader": {"DataType": "Number", "StringValue": "1"}}},
        # The shim keeps system attributes under this prefix: senders cannot forge them.
        {"MessageAttributes": {"postbox-sqs.AWSTraceHeader": TRACE_ATTRIBUTE["AWSTraceHeader"]}},
    ],
)
def test_bad_system_attributes_are_refused(sqs_any, sqs_queue, kwargs):
    error = error_of(sqs_any.send_message, QueueUrl=sqs_queue, MessageBody="x", **kwargs)
    assert error["Code"] == "InvalidParameterValue"
    assert receive_all(sqs_any, sqs_queue) == []


def test_ten_attributes_and_a_trace_header_fit_as_on_aws(sqs_any, sqs_queue):
    """SQS's 10 are the message's own: the trace header, a system attribute, comes on top."""
    ten = {f"a{i}": {"DataType": "String", "StringValue": f"v{i}"} for i in range(10)}
    sqs_any.send_message(
        QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=ten,
        MessageSystemAttributes=TRACE_ATTRIBUTE,
    )  # fmt: skip
    (got,) = receive_all(sqs_any, sqs_queue, MessageAttributeNames=["All"], AttributeNames=["All"])
    assert got["MessageAttributes"] == ten
    assert got["Attributes"]["AWSTraceHeader"] == TRACE


def test_receive_selects_attributes_by_prefix_and_all(sqs_any, sqs_queue):
    sent = {
        name: {"DataType": "String", "StringValue": name}
        for name in ("order.id", "order.total", "orderly", "other")
    }
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=sent)
    for wanted, names in [
        (["order.*"], {"order.id", "order.total", "orderly"}),
        (["order.*", "other"], {"order.id", "order.total", "orderly", "other"}),
        (["orderl.*"], {"orderly"}),
        (["All"], set(sent)),
        ([".*"], set(sent)),
        (["*"], set(sent)),
        (["orderly", "order"], {"orderly"}),
        ([], set()),
    ]:
        (message,) = receive_all(
            sqs_any, sqs_queue, VisibilityTimeout=0, MessageAttributeNames=wanted
        )
        assert set(message.get("MessageAttributes", {})) == names, wanted
        expected = attribute_digest({name: sent[name] for name in names}) if names else None
        assert message.get("MD5OfMessageAttributes") == expected, wanted


def test_attribute_names_and_message_system_attribute_names_combine(sqs, sqs_queue):
    # The query model botocore ships has no MessageSystemAttributeNames; test_sqs_wire
    # sends its query form (MessageSystemAttributeName.N) directly.
    sqs.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (first,) = receive_all(
        sqs,
        sqs_queue,
        VisibilityTimeout=0,
        AttributeNames=["SentTimestamp"],
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    assert set(first["Attributes"]) == {"SentTimestamp", "ApproximateReceiveCount"}
    (second,) = receive_all(
        sqs,
        sqs_queue,
        MessageSystemAttributeNames=[
            "ApproximateFirstReceiveTimestamp",
            "ApproximateReceiveCount",
            "SentTimestamp",
        ],
    )
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert second["Attributes"]["SentTimestamp"] == first["Attributes"]["SentTimestamp"]
    assert int(second["Attributes"]["ApproximateFirstReceiveTimestamp"]) >= int(
        first["Attributes"]["SentTimestamp"]
    )


def test_aws_trace_header_by_message_system_attribute_names(sqs, sqs_queue):
    sqs.send_message(QueueUrl=sqs_queue, MessageBody="x", MessageSystemAttributes=TRACE_ATTRIBUTE)
    (message,) = receive_all(
        sqs, sqs_queue, MessageSystemAttributeNames=["AWSTraceHeader", "SentTimestamp"]
    )
    assert message["Attributes"]["AWSTraceHeader"] == TRACE
    assert set(message["Attributes"]) == {"AWSTraceHeader", "SentTimestamp"}


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("delete_message", {"ReceiptHandle": "not a receipt handle"}),
        ("change_message_visibility", {"ReceiptHandle": "bad", "VisibilityTimeout": 99_999}),
        ("send_message", {"MessageBody": "x", "DelaySeconds": 10_000}),
        ("receive_message", {"MaxNumberOfMessages": 99}),
    ],
)
def test_a_missing_queue_is_reported_before_anything_else_wrong(
    sqs_any, sqs_queue, action, arguments
):
    missing = sqs_queue.rsplit("/", 1)[0] + "/" + unique_name("gone")
    error = error_of(getattr(sqs_any, action), QueueUrl=missing, **arguments)
    assert error["Code"] in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")
    # On the queue that exists, the same call is refused for what is wrong with it.
    error = error_of(getattr(sqs_any, action), QueueUrl=sqs_queue, **arguments)
    assert error["Code"] not in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def test_an_expired_receipt_still_deletes_while_nobody_received_since(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    # VisibilityTimeout=0: the receive's lease has run out at once; nobody received since.
    (message,) = sqs_any.receive_message(QueueUrl=sqs_queue, VisibilityTimeout=0)["Messages"]
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=message["ReceiptHandle"])
    attributes = sqs_any.get_queue_attributes(
        QueueUrl=sqs_queue, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert "Messages" not in sqs_any.receive_message(QueueUrl=sqs_queue)
