"""Regions: the shim answers a request in the region it is signed for.

AWS's answers name the region of the endpoint a request reached; the shim's name the
region of the request's SigV4 credential scope (the shim's `--region` for an unsigned
request). Every region sees the caller's one set of queues and topics, each under that
region's ARNs. Real boto3 clients, each signing for its own region, against a real
shim and server.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import boto3
import pytest
from botocore import UNSIGNED
from botocore.config import Config
from support import SQS_ACCOUNT, SQS_REGION, SqsShimProcess, sqs_client, unique_name
from test_sns import _Endpoint, _error, _receive, sns_client

from postbox_server.aws.sigv4 import credential_region


@pytest.fixture(scope="module")
def loopback_webhooks_shim(server) -> Iterator[SqsShimProcess]:
    """A shim whose confirmations may reach loopback endpoints."""
    process = SqsShimProcess(server.target, "--webhook-allow-cidr", "127.0.0.0/8").start()
    yield process
    process.stop()


def _queue_arn(sqs, url: str) -> str:
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attributes["Attributes"]["QueueArn"]


def test_a_queue_made_in_one_region_is_named_in_each_region_by_its_own_arn(sqs_shim, request):
    west = sqs_client(sqs_shim.endpoint, region="eu-west-1")
    east = sqs_client(sqs_shim.endpoint)
    name = unique_name(request.node.name)
    url = west.create_queue(QueueName=name)["QueueUrl"]
    try:
        assert _queue_arn(west, url) == f"arn:aws:sqs:eu-west-1:{SQS_ACCOUNT}:{name}"
        # The same queue, seen from the shim's own region.
        assert east.get_queue_url(QueueName=name)["QueueUrl"] == url
        assert _queue_arn(east, url) == f"arn:aws:sqs:{SQS_REGION}:{SQS_ACCOUNT}:{name}"
    finally:
        east.delete_queue(QueueUrl=url)


def test_a_redrive_policy_takes_the_arn_its_caller_builds_for_its_region(sqs_shim, request):
    """Code that builds its dead-letter queue's ARN from its own region works, whatever the
    shim's --region; an ARN of another region than the request's names no queue there."""
    west = sqs_client(sqs_shim.endpoint, region="eu-west-1")
    name = unique_name(request.node.name)
    dead = west.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    source = west.create_queue(QueueName=name)["QueueUrl"]
    try:
        policy = {
            "deadLetterTargetArn": f"arn:aws:sqs:eu-west-1:{SQS_ACCOUNT}:{name}-dlq",
            "maxReceiveCount": 3,
        }
        west.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": json.dumps(policy)})
        stored = west.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])
        assert json.loads(stored["Attributes"]["RedrivePolicy"]) == policy

        elsewhere = {
            **policy,
            "deadLetterTargetArn": f"arn:aws:sqs:us-west-2:{SQS_ACCOUNT}:{name}-dlq",
        }
        error = _error(
            west.set_queue_attributes,
            QueueUrl=source,
            Attributes={"RedrivePolicy": json.dumps(elsewhere)},
        )
        assert error.response["Error"]["Code"] == "InvalidParameterValue"
        # Nothing changed.
        stored = west.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])
        assert json.loads(stored["Attributes"]["RedrivePolicy"]) == policy
    finally:
        west.delete_queue(QueueUrl=source)
        west.delete_queue(QueueUrl=dead)


def test_a_topic_arn_names_its_region_and_another_region_does_not_find_it(sqs_shim, request):
    west = sns_client(sqs_shim.endpoint, region="us-west-1")
    north = sns_client(sqs_shim.endpoint, region="eu-north-1")
    name = unique_name(request.node.name)
    arn = west.create_topic(Name=name)["TopicArn"]
    try:
        assert arn == f"arn:aws:sns:us-west-1:{SQS_ACCOUNT}:{name}"
        assert west.get_topic_attributes(TopicArn=arn)["Attributes"]["TopicArn"] == arn
        # As AWS's eu-north-1 endpoint answers for a us-west-1 topic.
        error = _error(north.get_topic_attributes, TopicArn=arn)
        assert error.response["Error"]["Code"] == "NotFound"
        assert error.response["Error"]["Message"] == "Topic does not exist"
        # The same topic, under eu-north-1's ARN.
        listed = [t["TopicArn"] for t in north.list_topics()["Topics"]]
        assert f"arn:aws:sns:eu-north-1:{SQS_ACCOUNT}:{name}" in listed
    finally:
        west.delete_topic(TopicArn=arn)


def test_a_topic_delivers_to_a_queue_named_by_its_arn_in_another_region(sqs_shim, request):
    sns = sns_client(sqs_shim.endpoint, region="us-west-1")
    sqs = sqs_client(sqs_shim.endpoint, region="us-west-2")
    name = unique_name(request.node.name)
    topic = sns.create_topic(Name=name)["TopicArn"]
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    try:
        endpoint = f"arn:aws:sqs:us-west-2:{SQS_ACCOUNT}:{name}"
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=endpoint)
        published = sns.publish(TopicArn=topic, Message="across regions", Subject="hello")
        (message,) = _receive(sqs, url)
        notification = json.loads(message["Body"])
        assert notification["MessageId"] == published["MessageId"]
        assert notification["Message"] == "across regions"
        assert notification["TopicArn"] == topic
        # A queue of another account stays out of reach, in any region.
        other_account = f"arn:aws:sqs:us-west-2:111122223333:{name}"
        error = _error(sns.subscribe, TopicArn=topic, Protocol="sqs", Endpoint=other_account)
        assert error.response["Error"]["Code"] == "NotFound"
    finally:
        sns.delete_topic(TopicArn=topic)
        sqs.delete_queue(QueueUrl=url)


def test_the_urls_a_subscription_made_in_another_region_sends_work_unsigned(
    loopback_webhooks_shim, request
):
    """An endpoint visits its SubscribeURL and UnsubscribeURL without signing: those
    requests are in the region of the ARN they name, as AWS's are in their host's."""
    sns = sns_client(loopback_webhooks_shim.endpoint, region="ap-southeast-2")
    topic = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
    assert ":ap-southeast-2:" in topic
    try:
        with _Endpoint() as endpoint:
            sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            confirmation = endpoint.only("SubscriptionConfirmation")
            assert confirmation["TopicArn"] == topic
            with urllib.request.urlopen(confirmation["SubscribeURL"], timeout=10) as visit:
                assert visit.status == 200
            (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert listed["SubscriptionArn"].startswith(f"{topic}:")

            sns.publish(TopicArn=topic, Message="hello")
            notification = endpoint.only("Notification")
            assert notification["TopicArn"] == topic
            with urllib.request.urlopen(notification["UnsubscribeURL"], timeout=10) as visit:
                assert visit.status == 200
            listed = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert not any(s["SubscriptionArn"].startswith(f"{topic}:") for s in listed)
    finally:
        sns.delete_topic(TopicArn=topic)


def test_an_unsigned_request_is_answered_in_the_shims_region(sqs_shim, sqs_queue):
    unsigned = boto3.client(
        "sqs",
        endpoint_url=sqs_shim.endpoint,
        region_name="ap-south-1",  # not in the request: nothing signs it
        config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
    )
    arn = _queue_arn(unsigned, sqs_queue)
    assert arn.startswith(f"arn:aws:sqs:{SQS_REGION}:{SQS_ACCOUNT}:")


def test_only_a_region_an_arn_can_hold_is_taken_from_a_signature():
    def authorization(region: str) -> str:
        return (
            f"AWS4-HMAC-SHA256 Credential=AKID/20261129/{region}/sqs/aws4_request, "
            f"SignedHeaders=host;x-amz-date, Signature={'0' * 64}"
        )

    assert credential_region(authorization("us-west-2")) == "us-west-2"
    assert credential_region(authorization("local")) == "local"
    assert credential_region(authorization("us:west")) is None
    assert credential_region(authorization("-west")) is None
    assert credential_region(authorization("w" * 51)) is None
    assert credential_region("Bearer abc") is None
    assert credential_region("") is None
