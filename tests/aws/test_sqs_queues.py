"""SQS queue actions through the shim, with boto3 on both protocols."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from botocore.exceptions import ClientError
from support import SQS_ACCOUNT, unique_name


def error_code(call, *args, **kwargs) -> str:
    """The SQS error code a call fails with."""
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value.response["Error"]["Code"]


def test_create_get_url_list_and_delete(sqs_any, sqs_shim, request):
    name = unique_name(request.node.name)
    url = sqs_any.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{sqs_shim.endpoint}/{SQS_ACCOUNT}/{name}"
    assert sqs_any.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert url in sqs_any.list_queues(QueueNamePrefix=name)["QueueUrls"]
    sqs_any.delete_queue(QueueUrl=url)
    assert "QueueUrls" not in sqs_any.list_queues(QueueNamePrefix=name)
    with pytest.raises(sqs_any.exceptions.QueueDoesNotExist):
        sqs_any.get_queue_url(QueueName=name)


def test_create_is_idempotent_unless_attributes_differ(sqs_any, request):
    name = unique_name(request.node.name)
    url = sqs_any.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})["QueueUrl"]
    try:
        again = sqs_any.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "45"})
        assert again["QueueUrl"] == url
        assert sqs_any.create_queue(QueueName=name)["QueueUrl"] == url
        with pytest.raises(sqs_any.exceptions.QueueNameExists) as caught:
            sqs_any.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "46"})
        assert caught.value.response["Error"]["Code"] == "QueueAlreadyExists"
        assert "VisibilityTimeout" in caught.value.response["Error"]["Message"]
    finally:
        sqs_any.delete_queue(QueueUrl=url)


BAD_NAMES = ["has space", "x" * 81, "x" * 76 + ".fifo", "dot.ted", "a.fifo.fifo", "new\nline"]


@pytest.mark.parametrize("name", ["", *BAD_NAMES])
def test_create_with_a_bad_name_is_refused(sqs_any, name):
    expected = "MissingParameter" if name == "" else "InvalidParameterValue"
    attributes = {"FifoQueue": "true"} if name.endswith(".fifo") else {}
    assert error_code(sqs_any.create_queue, QueueName=name, Attributes=attributes) == expected


@pytest.mark.parametrize("name", [*BAD_NAMES, "x" * 75 + ".FIFO", "ünïcode"])
def test_a_bad_name_names_no_queue(sqs_any, sqs_shim, name):
    """SQS's answer for a name no queue can have, whatever postbox says of it."""
    url = f"{sqs_shim.endpoint}/{SQS_ACCOUNT}/{quote(name)}"
    for call in (
        lambda: sqs_any.get_queue_url(QueueName=name),
        lambda: sqs_any.send_message(QueueUrl=url, MessageBody="x"),
        lambda: sqs_any.get_queue_attributes(QueueUrl=url),
        lambda: sqs_any.delete_queue(QueueUrl=url),
    ):
        assert error_code(call) == "AWS.SimpleQueueService.NonExistentQueue", name


def test_list_queues_pages_with_max_results(sqs_any, request):
    prefix = unique_name(request.node.name)
    urls = [sqs_any.create_queue(QueueName=f"{prefix}-{i}")["QueueUrl"] for i in range(5)]
    try:
        seen, token, pages = [], None, 0
        while True:
            kwargs = {"QueueNamePrefix": prefix, "MaxResults": 2}
            if token:
                kwargs["NextToken"] = token
            page = sqs_any.list_queues(**kwargs)
            seen += page["QueueUrls"]
            pages += 1
            token = page.get("NextToken")
            if not token:
                break
        assert seen == urls
        assert pages == 3
        # Without MaxResults SQS does not page.
        assert "NextToken" not in sqs_any.list_queues(QueueNamePrefix=prefix)
        code = error_code(sqs_any.list_queues, QueueNamePrefix=prefix, MaxResults=1001)
        assert code == "InvalidParameterValue"
    finally:
        for url in urls:
            sqs_any.delete_queue(QueueUrl=url)


def test_queue_attributes_round_trip(sqs_any, sqs_queue):
    before = time.time()
    settings = {
        "VisibilityTimeout": "120",
        "DelaySeconds": "5",
        "MessageRetentionPeriod": "3600",
        "MaximumMessageSize": "2048",
        "ReceiveMessageWaitTimeSeconds": "3",
    }
    sqs_any.set_queue_attributes(QueueUrl=sqs_queue, Attributes=settings)
    got = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["All"])["Attributes"]
    assert {name: got[name] for name in settings} == settings
    assert got["QueueArn"] == f"arn:aws:sqs:us-east-1:{SQS_ACCOUNT}:{sqs_queue.rsplit('/', 1)[1]}"
    assert int(got["LastModifiedTimestamp"]) >= int(before) - 1
    assert int(got["CreatedTimestamp"]) <= int(got["LastModifiedTimestamp"])
    named = sqs_any.get_queue_attributes(
        QueueUrl=sqs_queue, AttributeNames=["VisibilityTimeout", "QueueArn"]
    )["Attributes"]
    assert set(named) == {"VisibilityTimeout", "QueueArn"}
    assert "Attributes" not in sqs_any.get_queue_attributes(QueueUrl=sqs_queue)


def test_approximate_counts(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="visible")
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="delayed", DelaySeconds=60)
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="in flight")
    # Receive one of the two visible ones.
    assert len(sqs_any.receive_message(QueueUrl=sqs_queue)["Messages"]) == 1
    got = sqs_any.get_queue_attributes(
        QueueUrl=sqs_queue,
        AttributeNames=[
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )["Attributes"]
    assert got == {
        "ApproximateNumberOfMessages": "1",
        "ApproximateNumberOfMessagesNotVisible": "1",
        "ApproximateNumberOfMessagesDelayed": "1",
    }


@pytest.mark.parametrize(
    ("attributes", "code"),
    [
        ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
        ({"DelaySeconds": "-1"}, "InvalidAttributeValue"),
        ({"MessageRetentionPeriod": "59"}, "InvalidAttributeValue"),
        ({"MaximumMessageSize": "1048577"}, "InvalidAttributeValue"),
        ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue"),
        ({"VisibilityTimeout": "ten"}, "InvalidAttributeValue"),
        ({"NoSuchAttribute": "1"}, "InvalidAttributeName"),
        ({"QueueArn": "arn:aws:sqs:us-east-1:000000000000:x"}, "InvalidAttributeName"),
        ({"Policy": "not a policy"}, "InvalidAttributeValue"),
        ({"Policy": '{"Statement": "' + "x" * 20480 + '"}'}, "InvalidAttributeValue"),
        # Known to SQS, beyond postbox: values other than "none" are refused.
        ({"SqsManagedSseEnabled": "true"}, "InvalidAttributeValue"),
        ({"KmsMasterKeyId": "alias/aws/sqs"}, "InvalidAttributeValue"),
        ({"KmsDataKeyReusePeriodSeconds": "60"}, "InvalidAttributeValue"),
    ],
)
def test_bad_attributes_are_refused_and_change_nothing(sqs_any, sqs_queue, attributes, code):
    both = {"VisibilityTimeout": "99", **attributes}
    assert error_code(sqs_any.set_queue_attributes, QueueUrl=sqs_queue, Attributes=both) == code
    got = sqs_any.get_queue_attributes(QueueUrl=sqs_queue, AttributeNames=["VisibilityTimeout"])
    assert got["Attributes"]["VisibilityTimeout"] == "30"


def test_unknown_attribute_name_on_get(sqs_any, sqs_queue):
    code = error_code(sqs_any.get_queue_attributes, QueueUrl=sqs_queue, AttributeNames=["Nope"])
    assert code == "InvalidAttributeName"


def test_purge_removes_every_message(sqs_any, sqs_queue):
    for i in range(3):
        sqs_any.send_message(QueueUrl=sqs_queue, MessageBody=f"m{i}")
    sqs_any.receive_message(QueueUrl=sqs_queue)
    sqs_any.purge_queue(QueueUrl=sqs_queue)
    assert "Messages" not in sqs_any.receive_message(QueueUrl=sqs_queue, MaxNumberOfMessages=10)


@pytest.mark.parametrize(
    "call",
    [
        lambda c, url: c.delete_queue(QueueUrl=url),
        lambda c, url: c.purge_queue(QueueUrl=url),
        lambda c, url: c.get_queue_attributes(QueueUrl=url, AttributeNames=["All"]),
        lambda c, url: c.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "1"}),
        lambda c, url: c.send_message(QueueUrl=url, MessageBody="x"),
        lambda c, url: c.receive_message(QueueUrl=url),
    ],
)
def test_missing_queue(sqs_any, sqs_shim, call):
    url = f"{sqs_shim.endpoint}/{SQS_ACCOUNT}/no_such_queue_anywhere"
    with pytest.raises(sqs_any.exceptions.QueueDoesNotExist) as caught:
        call(sqs_any, url)
    error = caught.value.response["Error"]
    assert error["Code"] == "AWS.SimpleQueueService.NonExistentQueue"
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_queue_of_another_account_does_not_exist(sqs_any, sqs_queue):
    other = sqs_queue.replace(f"/{SQS_ACCOUNT}/", "/123456789012/")
    with pytest.raises(sqs_any.exceptions.QueueDoesNotExist):
        sqs_any.get_queue_attributes(QueueUrl=other, AttributeNames=["All"])
    with pytest.raises(sqs_any.exceptions.QueueDoesNotExist):
        sqs_any.get_queue_url(QueueName=other.rsplit("/", 1)[1], QueueOwnerAWSAccountId="1")


def test_tags(sqs_any, request):
    name = unique_name(request.node.name)
    url = sqs_any.create_queue(QueueName=name, tags={"team": "core", "env": "test"})["QueueUrl"]
    try:
        assert sqs_any.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core", "env": "test"}
        sqs_any.tag_queue(QueueUrl=url, Tags={"env": "prod", "cost": "42"})
        sqs_any.untag_queue(QueueUrl=url, TagKeys=["team", "absent"])
        assert sqs_any.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "prod", "cost": "42"}
        sqs_any.untag_queue(QueueUrl=url, TagKeys=["env", "cost"])
        assert "Tags" not in sqs_any.list_queue_tags(QueueUrl=url)
        too_many = {f"k{i}": "v" for i in range(51)}
        assert error_code(sqs_any.tag_queue, QueueUrl=url, Tags=too_many) == (
            "InvalidParameterValue"
        )
        assert "Tags" not in sqs_any.list_queue_tags(QueueUrl=url)
    finally:
        sqs_any.delete_queue(QueueUrl=url)


@pytest.mark.parametrize("fifo", [False, True])
def test_attributes_meaning_none_are_accepted(sqs_any, request, fifo):
    """Tools such as Terraform send SQS's "none" values for policy and encryption."""
    none = {
        "Policy": "",
        "SqsManagedSseEnabled": "false",
        "KmsMasterKeyId": "",
        "KmsDataKeyReusePeriodSeconds": "300",
    }
    name = unique_name(request.node.name)[:70] + (".fifo" if fifo else "")
    attributes = {**none, **({"FifoQueue": "true"} if fifo else {})}
    url = sqs_any.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    try:
        # The same again is the same queue.
        assert sqs_any.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"] == url
        sqs_any.set_queue_attributes(QueueUrl=url, Attributes=none)
        got = sqs_any.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        assert got["SqsManagedSseEnabled"] == "false"
        assert not {"Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds"} & set(got)
    finally:
        sqs_any.delete_queue(QueueUrl=url)


def test_a_second_purge_within_60_seconds_is_refused(sqs_any, sqs_queue):
    sqs_any.send_message(QueueUrl=sqs_queue, MessageBody="x")
    sqs_any.purge_queue(QueueUrl=sqs_queue)
    with pytest.raises(ClientError) as caught:
        sqs_any.purge_queue(QueueUrl=sqs_queue)
    error = caught.value.response["Error"]
    assert error["Code"] in ("AWS.SimpleQueueService.PurgeQueueInProgress", "PurgeQueueInProgress")
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "60 seconds" in error["Message"]
