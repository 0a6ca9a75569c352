"""SQS behaviours AWS records (moto's aws_verified tests and AWS's documentation), each
forced through boto3 against the shim: queue URLs, access policies and permissions,
queue-type attribute rules, tag lists, FIFO sends and purges."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from botocore.exceptions import ClientError
from support import SQS_ACCOUNT, SQS_REGION, unique_name


def error_of(call, *args, **kwargs) -> dict:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return {**caught.value.response["Error"], **caught.value.response["ResponseMetadata"]}


@pytest.fixture
def fifo_queue(sqs, request) -> Iterator[str]:
    name = unique_name(request.node.name)[:60] + ".fifo"
    url = sqs.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    yield url
    sqs.delete_queue(QueueUrl=url)


def test_a_bare_queue_name_is_accepted_as_queue_url(sqs_any, sqs_queue):
    name = sqs_queue.rsplit("/", 1)[1]
    sqs_any.send_message(QueueUrl=name, MessageBody="by name")
    (message,) = sqs_any.receive_message(QueueUrl=name, WaitTimeSeconds=5)["Messages"]
    assert message["Body"] == "by name"
    sqs_any.delete_message(QueueUrl=name, ReceiptHandle=message["ReceiptHandle"])
    with pytest.raises(sqs_any.exceptions.QueueDoesNotExist):
        sqs_any.get_queue_attributes(QueueUrl="no_such_queue_by_name", AttributeNames=["All"])


def test_attribute_names_are_taken_without_the_spaces_around_them(sqs_any, request):
    """ "VisibilityTimeout " sets VisibilityTimeout: code written against AWS sends it so,
    and moto's suites do (six of their tests)."""
    name = unique_name(request.node.name)
    url = sqs_any.create_queue(QueueName=name, Attributes={"VisibilityTimeout ": "7"})["QueueUrl"]
    try:
        sqs_any.set_queue_attributes(QueueUrl=url, Attributes={" DelaySeconds": "3"})
        got = sqs_any.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert (got["VisibilityTimeout"], got["DelaySeconds"]) == ("7", "3")
        # The same again is the same queue; two spellings of one name are refused.
        again = sqs_any.create_queue(QueueName=name, Attributes={"VisibilityTimeout ": "7"})
        assert again["QueueUrl"] == url
        error = error_of(
            sqs_any.set_queue_attributes,
            QueueUrl=url,
            Attributes={"DelaySeconds": "1", "DelaySeconds ": "2"},
        )
        assert error["Code"] == "InvalidAttributeName"
        assert error["Message"] == "Attribute DelaySeconds is given more than once."
        got = sqs_any.get_queue_attributes(QueueUrl=url, AttributeNames=["DelaySeconds"])
        assert got["Attributes"]["DelaySeconds"] == "3"  # unchanged
    finally:
        sqs_any.delete_queue(QueueUrl=url)


def test_fifo_queue_attribute_is_unknown_on_a_standard_queue(sqs_any, sqs_queue, request):
    for attributes in ({"FifoQueue": "false"}, {"ContentBasedDeduplication": "true"}):
        error = error_of(
            sqs_any.create_queue, QueueName=unique_name(request.node.name), Attributes=attributes
        )
        assert error["Code"] == "InvalidAttributeName"
        assert error["Message"] == f"Unknown Attribute {next(iter(attributes))}."
        error = error_of(sqs_any.set_queue_attributes, QueueUrl=sqs_queue, Attributes=attributes)
        assert error["Code"] == "InvalidAttributeName"
    assert sqs_any.list_queues(QueueNamePrefix=unique_name(request.node.name)[:40]).get(
        "QueueUrls", [sqs_queue]
    ) == [sqs_queue]


def test_empty_tag_lists_are_refused(sqs_any, sqs_queue):
    sqs_any.tag_queue(QueueUrl=sqs_queue, Tags={"kept": "1"})
    error = error_of(sqs_any.tag_queue, QueueUrl=sqs_queue, Tags={})
    assert (error["Code"], error["Message"]) == (
        "MissingParameter",
        "The request must contain the parameter Tags.",
    )
    error = error_of(sqs_any.untag_queue, QueueUrl=sqs_queue, TagKeys=[])
    assert (error["Code"], error["Message"]) == (
        "InvalidParameterValue",
        "Tag keys must be between 1 and 128 characters in length.",
    )
    too_many = {f"k{i}": "v" for i in range(50)}
    error = error_of(sqs_any.tag_queue, QueueUrl=sqs_queue, Tags=too_many)
    assert error["Message"] == f"Too many tags added for queue {sqs_queue.rsplit('/', 1)[1]}."
    assert sqs_any.list_queue_tags(QueueUrl=sqs_queue)["Tags"] == {"kept": "1"}


def test_fifo_send_needs_a_group_and_a_deduplication_id(sqs_any, fifo_queue):
    error = error_of(sqs_any.send_message, QueueUrl=fifo_queue, MessageBody="x")
    assert (error["Code"], error["Message"]) == (
        "MissingParameter",
        "The request must contain the parameter MessageGroupId.",
    )
    error = error_of(sqs_any.send_message, QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g")
    assert (error["Code"], error["Message"]) == (
        "InvalidParameterValue",
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly",
    )
    assert "Messages" not in sqs_any.receive_message(QueueUrl=fifo_queue)


def test_purge_forgets_fifo_deduplication_ids(sqs, fifo_queue):
    sent = {"QueueUrl": fifo_queue, "MessageGroupId": "g", "MessageDeduplicationId": "d1"}
    sqs.send_message(MessageBody="before", **sent)
    sqs.purge_queue(QueueUrl=fifo_queue)
    sqs.send_message(MessageBody="after", **sent)  # within the 5-minute window
    (message,) = sqs.receive_message(QueueUrl=fifo_queue, WaitTimeSeconds=5)["Messages"]
    assert message["Body"] == "after"


def test_policy_is_stored_returned_and_removed(sqs_any, sqs_queue):
    arn = f"arn:aws:sqs:{SQS_REGION}:{SQS_ACCOUNT}:{sqs_queue.rsplit('/', 1)[1]}"
    policy = json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow", "Principal": {"Service": "sns.amazonaws.com"},
            "Action": "sqs:SendMessage", "Resource": arn,
        }],
    })  # fmt: skip
    sqs_any.set_queue_attributes(QueueUrl=sqs_queue, Attributes={"Policy": policy})
    got = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["Policy"])
    assert got["Attributes"] == {"Policy": policy}
    every = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])
    assert every["Attributes"]["Policy"] == policy
    sqs_any.set_queue_attributes(QueueUrl=sqs_queue, Attributes={"Policy": ""})
    got = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])
    assert "Policy" not in got["Attributes"]


def test_add_and_remove_permission_edit_the_policy(sqs_any, sqs_queue):
    arn = f"arn:aws:sqs:{SQS_REGION}:{SQS_ACCOUNT}:{sqs_queue.rsplit('/', 1)[1]}"
    sqs_any.add_permission(
        QueueUrl=sqs_queue, Label="one", AWSAccountIds=["111111111111"], Actions=["*"]
    )
    sqs_any.add_permission(
        QueueUrl=sqs_queue,
        Label="two",
        AWSAccountIds=["222222222222", "333333333333"],
        Actions=["SendMessage", "ReceiveMessage"],
    )

    def policy() -> dict:
        got = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["Policy"])
        return json.loads(got["Attributes"]["Policy"])

    one = {
        "Sid": "one", "Effect": "Allow",
        "Principal": {"AWS": "arn:aws:iam::111111111111:root"},
        "Action": "SQS:*", "Resource": arn,
    }  # fmt: skip
    two = {
        "Sid": "two", "Effect": "Allow",
        "Principal": {"AWS": ["arn:aws:iam::222222222222:root", "arn:aws:iam::333333333333:root"]},
        "Action": ["SQS:SendMessage", "SQS:ReceiveMessage"], "Resource": arn,
    }  # fmt: skip
    assert policy() == {
        "Version": "2012-10-17",
        "Id": f"{arn}/SQSDefaultPolicy",
        "Statement": [one, two],
    }
    sqs_any.remove_permission(QueueUrl=sqs_queue, Label="two")
    assert policy()["Statement"] == [one]


@pytest.mark.parametrize(
    ("kwargs", "code", "message"),
    [
        (
            {"Label": "one", "AWSAccountIds": ["1"], "Actions": ["SendMessage"]},
            "InvalidParameterValue",
            "Value one for parameter Label is invalid. Reason: Already exists.",
        ),
        (
            {"Label": "x", "AWSAccountIds": ["1"], "Actions": ["RemovePermission"]},
            "InvalidParameterValue",
            "Value SQS:RemovePermission for parameter ActionName is invalid. "
            "Reason: Only the queue owner is allowed to invoke this action.",
        ),
        (
            {"Label": "x", "AWSAccountIds": ["1"], "Actions": []},
            "MissingParameter",
            "The request must contain the parameter Actions.",
        ),
        (
            {"Label": "x", "AWSAccountIds": [], "Actions": ["SendMessage"]},
            "InvalidParameterValue",
            "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
        ),
        (
            {
                "Label": "x",
                "AWSAccountIds": ["1"],
                "Actions": [
                    "SendMessage",
                    "ReceiveMessage",
                    "DeleteMessage",
                    "PurgeQueue",
                    "GetQueueUrl",
                    "GetQueueAttributes",
                    "ChangeMessageVisibility",
                    "ListDeadLetterSourceQueues",
                ],
            },
            "OverLimit",
            "8 Actions were found, maximum allowed is 7.",
        ),
    ],
)
def test_bad_permissions_are_refused_and_change_nothing(sqs_any, sqs_queue, kwargs, code, message):
    sqs_any.add_permission(
        QueueUrl=sqs_queue, Label="one", AWSAccountIds=["111111111111"], Actions=["SendMessage"]
    )
    before = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["Policy"])
    error = error_of(sqs_any.add_permission, QueueUrl=sqs_queue, **kwargs)
    assert (error["Code"], error["Message"]) == (code, message)
    assert error["HTTPStatusCode"] == (403 if code == "OverLimit" else 400)
    after = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["Policy"])
    assert after["Attributes"] == before["Attributes"]


def test_removing_an_unknown_label_is_refused(sqs_any, sqs_queue):
    error = error_of(sqs_any.remove_permission, QueueUrl=sqs_queue, Label="absent")
    assert (error["Code"], error["Message"]) == (
        "InvalidParameterValue",
        "Value absent for parameter Label is invalid. Reason: can't find label on existing policy.",
    )


def test_an_expired_handle_with_no_receive_since_still_works(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    # Visibility 0: the lease has run out at once, and nobody has received it since.
    (message,) = sqs_any.receive_message(QueueUrl=sqs_queue, VisibilityTimeout=0)["Messages"]
    handle = message["ReceiptHandle"]
    sqs_any.change_message_visibility(QueueUrl=sqs_queue, ReceiptHandle=handle, VisibilityTimeout=0)
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=handle)
    attributes = sqs_any.get_queue_attributes(
        QueueUrl=sqs_queue, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"


def test_a_stale_handle_deletes_nothing_and_answers_success(sqs_any, sqs_queue):
    """AWS: "the request succeeds, but the message might not be deleted". postbox keeps
    the redelivered message: only its current holder can delete it."""
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (first,) = sqs_any.receive_message(QueueUrl=sqs_queue, VisibilityTimeout=0)["Messages"]
    (second,) = sqs_any.receive_message(QueueUrl=sqs_queue, VisibilityTimeout=60)["Messages"]
    assert second["MessageId"] == first["MessageId"]
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=first["ReceiptHandle"])
    attributes = sqs_any.get_queue_attributes(
        QueueUrl=sqs_queue, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "1"
    sqs_any.delete_message(QueueUrl=sqs_queue, ReceiptHandle=second["ReceiptHandle"])


def test_server_errors_reach_sqs_clients_in_aws_words(sqs, request):
    """A refusal the server words (here: deleting a queue that is another's dead-letter
    queue) names SQS's attributes, not postbox's fields or server flags."""
    dead = sqs.create_queue(QueueName=unique_name(request.node.name + "_dlq"))["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])
    policy = json.dumps(
        {"deadLetterTargetArn": dead_arn["Attributes"]["QueueArn"], "maxReceiveCount": 3}
    )
    source = sqs.create_queue(
        QueueName=unique_name(request.node.name), Attributes={"RedrivePolicy": policy}
    )["QueueUrl"]
    try:
        error = error_of(sqs.delete_queue, QueueUrl=dead)
        assert "RedrivePolicy" in error["Message"]
        assert "dead_letter_policy" not in error["Message"]
        small = sqs.create_queue(
            QueueName=unique_name(request.node.name + "_small"),
            Attributes={"MaximumMessageSize": "1024"},
        )["QueueUrl"]
        error = error_of(sqs.send_message, QueueUrl=small, MessageBody="x" * 1025)
        assert (error["Code"], error["Message"]) == (
            "InvalidParameterValue",
            "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes.",
        )
        sqs.delete_queue(QueueUrl=small)
    finally:
        sqs.delete_queue(QueueUrl=source)
        sqs.delete_queue(QueueUrl=dead)


@pytest.mark.parametrize("name", ["p" * 81, "/my/test", "!@£$%^&*()queue"])
def test_a_bad_queue_name_is_refused_in_sqs_words(sqs_any, name):
    error = error_of(sqs_any.create_queue, QueueName=name)
    assert (error["Code"], error["Message"]) == (
        "InvalidParameterValue",
        "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
    )


def test_a_fifo_handle_whose_lease_ran_out_has_expired(sqs_any, fifo_queue):
    sqs_any.send_message(
        QueueUrl=fifo_queue, MessageBody="x", MessageGroupId="g", MessageDeduplicationId="d"
    )
    # Visibility 0: the lease has run out at once; the message heads its group again.
    (expired,) = sqs_any.receive_message(QueueUrl=fifo_queue, VisibilityTimeout=0)["Messages"]
    error = error_of(
        sqs_any.delete_message, QueueUrl=fifo_queue, ReceiptHandle=expired["ReceiptHandle"]
    )
    assert error["Code"] == "InvalidParameterValue"
    # AWS's words, with the handle quoted as every error quotes input: a short prefix and
    # its length (docs/reference/errors-and-limits.md), not the whole handle.
    handle = expired["ReceiptHandle"]
    assert error["Message"] == (
        f"Value '{handle[:80]}'… ({len(handle)} bytes) for parameter ReceiptHandle is invalid. "
        "Reason: The receipt handle has expired."
    )
    (current,) = sqs_any.receive_message(QueueUrl=fifo_queue, VisibilityTimeout=60)["Messages"]
    assert current["MessageId"] == expired["MessageId"]
    sqs_any.delete_message(QueueUrl=fifo_queue, ReceiptHandle=current["ReceiptHandle"])
    assert "Messages" not in sqs_any.receive_message(QueueUrl=fifo_queue)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        (
            {"öther": {"DataType": "String", "StringValue": "x"}},
            "The message attribute name 'öther' is invalid. Attribute name can contain A-Z, "
            "a-z, 0-9, underscore (_), hyphen (-), and period (.) characters.",
        ),
        (
            {"when": {"DataType": "Timestamp", "StringValue": "1"}},
            "The message attribute 'when' has an invalid message attribute type, the set of "
            "supported type prefixes is Binary, Number, and String.",
        ),
    ],
)
def test_bad_message_attributes_are_refused_in_sqs_words(sqs_any, sqs_queue, attributes, message):
    error = error_of(
        sqs_any.send_message, QueueUrl=sqs_queue, MessageBody="x", MessageAttributes=attributes
    )
    assert (error["Code"], error["Message"]) == ("InvalidParameterValue", message)


def test_a_delay_over_15_minutes_fails_its_batch_entry_alone(sqs_any, sqs_queue):
    response = sqs_any.send_message_batch(
        QueueUrl=sqs_queue,
        Entries=[
            {"Id": "ok", "MessageBody": "body"},
            {"Id": "late", "MessageBody": "body", "DelaySeconds": 901},
        ],
    )
    assert [entry["Id"] for entry in response["Successful"]] == ["ok"]
    assert response["Failed"] == [
        {
            "Id": "late",
            "SenderFault": True,
            "Code": "InvalidParameterValue",
            "Message": "Value 901 for parameter DelaySeconds is invalid. "
            "Reason: DelaySeconds must be >= 0 and <= 900.",
        }
    ]


def test_a_malformed_receipt_handle_is_quoted_as_aws_quotes_it(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    (message,) = sqs_any.receive_message(QueueUrl=sqs_queue)["Messages"]
    long_handle = "h" * 200
    entries = [
        {"Id": "bad", "ReceiptHandle": "fake-receipt-handle"},
        {"Id": "good", "ReceiptHandle": message["ReceiptHandle"]},
        {"Id": "long", "ReceiptHandle": long_handle},
    ]
    result = sqs_any.delete_message_batch(QueueUrl=sqs_queue, Entries=entries)
    assert result["Successful"] == [{"Id": "good"}]
    failed = {entry["Id"]: entry for entry in result["Failed"]}
    assert failed["bad"]["Code"] == "ReceiptHandleIsInvalid"
    assert failed["bad"]["Message"] == (
        'The input receipt handle "fake-receipt-handle" is not a valid receipt handle.'
    )
    # A long handle is quoted as a prefix with its length, never whole.
    assert failed["long"]["Message"] == (
        f'The input receipt handle "{long_handle[:80]}…" (200 bytes) is not a valid receipt handle.'
    )
    error = error_of(sqs_any.delete_message, QueueUrl=sqs_queue, ReceiptHandle="not-existing")
    assert error["Code"] == "ReceiptHandleIsInvalid"
    assert error["Message"] == (
        'The input receipt handle "not-existing" is not a valid receipt handle.'
    )
