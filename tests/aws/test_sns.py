"""The SNS API of the shim, through boto3 and the AWS CLI against a real server.

SNS speaks the query protocol on the shim's own port (the same endpoint_url as SQS).
Topics are postbox topics; `sqs` subscriptions deliver into postbox queues, read back
here through the SQS API as an AWS user would; `http` subscriptions are webhooks that
go through SNS's confirmation handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from botocore.config import Config
from botocore.exceptions import ClientError
from support import ROOT, SQS_ACCOUNT, SQS_REGION, SqsShimProcess, eventually, unique_name

AWS = Path(sys.executable).with_name("aws")


def sns_client(endpoint: str, region: str = SQS_REGION):
    import boto3

    return boto3.client(
        "sns",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="postbox-test",
        aws_secret_access_key="unchecked",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )


@pytest.fixture(scope="module")
def sns(sqs_shim):
    return sns_client(sqs_shim.endpoint)


@pytest.fixture
def topic(sns, request) -> Iterator[str]:
    arn = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
    yield arn
    sns.delete_topic(TopicArn=arn)


def _queue(sqs, name: str, **attributes: str) -> tuple[str, str]:
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]
    return url, arn["QueueArn"]


def _receive(sqs, url: str, count: int = 1, wait: int = 10) -> list[dict[str, Any]]:
    """`count` messages, long-polling until they are there (fewer fail the test)."""
    found: list[dict[str, Any]] = []
    for _ in range(count + 5):
        response = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=wait,
            MessageAttributeNames=["All"], AttributeNames=["All"],
        )  # fmt: skip
        found.extend(response.get("Messages", []))
        if len(found) >= count:
            return found
    raise AssertionError(f"{len(found)} of {count} messages arrived")


def _empty(sqs, url: str) -> bool:
    return not sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages")


def _error(call, *args, **kwargs) -> ClientError:
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value


def test_topics_are_created_listed_described_and_deleted(sns, request):
    name = unique_name(request.node.name)
    arn = sns.create_topic(Name=name, Tags=[{"Key": "team", "Value": "a"}])["TopicArn"]
    assert arn == f"arn:aws:sns:{SQS_REGION}:000000000000:{name}"
    # CreateTopic is idempotent, as in SNS.
    assert sns.create_topic(Name=name)["TopicArn"] == arn
    assert arn in {t["TopicArn"] for t in sns.list_topics()["Topics"]}
    sns.set_topic_attributes(TopicArn=arn, AttributeName="DisplayName", AttributeValue="Orders")
    attributes = sns.get_topic_attributes(TopicArn=arn)["Attributes"]
    assert attributes["TopicArn"] == arn
    assert attributes["DisplayName"] == "Orders"
    assert attributes["SubscriptionsConfirmed"] == "0"
    assert json.loads(attributes["Policy"])["Statement"][0]["Resource"] == arn
    sns.delete_topic(TopicArn=arn)
    sns.delete_topic(TopicArn=arn)  # a missing topic is no error
    error = _error(sns.get_topic_attributes, TopicArn=arn)
    assert error.response["Error"]["Code"] == "NotFound"
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_bad_names_and_attributes_are_invalid_parameter(sns):
    for call in (
        lambda: sns.create_topic(Name="bad name"),
        lambda: sns.create_topic(Name="plain", Attributes={"FifoTopic": "true"}),
        lambda: sns.create_topic(Name="x.fifo"),
        lambda: sns.create_topic(Name="plain", Attributes={"NoSuchAttribute": "1"}),
        lambda: sns.create_topic(Name="plain", Attributes={"ContentBasedDeduplication": "true"}),
    ):
        error = _error(call)
        assert error.response["Error"]["Code"] == "InvalidParameter", error.response
        assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_a_fifo_name_mismatch_is_aws_topic_name_error(sns):
    # AWS's words for both directions (localstack's AWS-validated snapshot of
    # test_create_topic_name_constraints): no topic is made.
    for name, attributes in (("plain", {"FifoTopic": "true"}), ("x.fifo", {})):
        error = _error(sns.create_topic, Name=name, Attributes=attributes)
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "InvalidParameter",
            "Invalid parameter: Topic Name",
        )
        assert name not in {t["TopicArn"].rsplit(":", 1)[1] for t in sns.list_topics()["Topics"]}


def test_publish_json_structure_errors_in_aws_words(sns, topic):
    # AWS's words (localstack's AWS-validated snapshot of test_message_structure_json_exc).
    prefix = "Invalid parameter: Message Structure - "
    for message, text in (
        ("invalid-json", prefix + "JSON message body failed to parse"),
        (json.dumps({"sqs": "x"}), prefix + "No default entry in JSON message body"),
    ):
        error = _error(sns.publish, TopicArn=topic, Message=message, MessageStructure="json")
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "InvalidParameter",
            text,
        )


def test_an_arn_of_another_service_names_no_subscription(sns, topic):
    # SNS checks a SubscriptionArn's shape, then looks it up: a well-formed sqs: ARN is
    # NotFound (moto's answer; AWS validates only the count of elements, see
    # docs/reference/aws-compatibility.md), a malformed one InvalidParameter.
    arn = f"arn:aws:sqs:{SQS_REGION}:000000000000:q:66d97e76-31e5-444f-8fa7-b60b680d0d39"
    error = _error(sns.get_subscription_attributes, SubscriptionArn=arn)
    assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
        "NotFound",
        "Subscription does not exist",
    )
    assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    # A malformed one in AWS's words.
    for call, name, arn in (
        (sns.get_subscription_attributes, "SubscriptionArn", "not-an-arn"),
        (sns.unsubscribe, "SubscriptionArn", f"arn:aws:sns:{SQS_REGION}:random"),
        (sns.publish, "TopicArn", "arn:aws"),
    ):
        extra = {"Message": "m"} if call == sns.publish else {}
        error = _error(call, **{name: arn}, **extra)
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "InvalidParameter",
            f"Invalid parameter: {name} Reason: An ARN must have at least 6 elements, "
            f"not {len(arn.split(':'))}",
        )


def test_tags(sns, topic):
    sns.tag_resource(
        ResourceArn=topic, Tags=[{"Key": "a", "Value": "1"}, {"Key": "b", "Value": "2"}]
    )
    sns.untag_resource(ResourceArn=topic, TagKeys=["a"])
    assert sns.list_tags_for_resource(ResourceArn=topic)["Tags"] == [{"Key": "b", "Value": "2"}]
    missing = topic + "-missing"
    error = _error(sns.list_tags_for_resource, ResourceArn=missing)
    assert error.response["Error"]["Code"] == "ResourceNotFound"
    # A ResourceArn that is no ARN names no resource either (moto's answer).
    for call, extra in (
        (sns.list_tags_for_resource, {}),
        (sns.tag_resource, {"Tags": [{"Key": "a", "Value": "1"}]}),
        (sns.untag_resource, {"TagKeys": ["b"]}),
    ):
        error = _error(call, ResourceArn="not-existing-topic", **extra)
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "ResourceNotFound",
            "Resource does not exist",
        )
        assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    too_many = [{"Key": f"k{n}", "Value": "v"} for n in range(50)]  # 51 with "b"
    error = _error(sns.tag_resource, ResourceArn=topic, Tags=too_many)
    assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
        "TagLimitExceeded",
        "Could not complete request: tag quota of per resource exceeded",
    )
    assert sns.list_tags_for_resource(ResourceArn=topic)["Tags"] == [{"Key": "b", "Value": "2"}]


def test_publish_fans_out_to_two_queues_one_filtered_in_sns_envelopes(sns, sqs, topic, request):
    name = unique_name(request.node.name)
    every_url, every_arn = _queue(sqs, name + "-every")
    red_url, red_arn = _queue(sqs, name + "-red")
    every = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=every_arn)["SubscriptionArn"]
    red = sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=red_arn,
        Attributes={
            "FilterPolicy": json.dumps({"color": ["red"], "size": [{"numeric": [">", 5]}]})
        },
    )["SubscriptionArn"]  # fmt: skip
    assert every.startswith(topic + ":")
    assert red.startswith(topic + ":")
    attributes = {
        "color": {"DataType": "String", "StringValue": "red"},
        "size": {"DataType": "Number", "StringValue": "10"},
    }
    matching = sns.publish(
        TopicArn=topic, Message="hello red", Subject="greeting", MessageAttributes=attributes
    )["MessageId"]
    blue = sns.publish(
        TopicArn=topic, Message="hello blue",
        MessageAttributes={**attributes, "color": {"DataType": "String", "StringValue": "blue"}},
    )["MessageId"]  # fmt: skip

    envelopes = {
        json.loads(m["Body"])["MessageId"]: json.loads(m["Body"])
        for m in _receive(sqs, every_url, 2)
    }
    assert set(envelopes) == {matching, blue}
    envelope = envelopes[matching]
    assert envelope["Type"] == "Notification"
    assert envelope["TopicArn"] == topic
    assert envelope["Subject"] == "greeting"
    assert envelope["Message"] == "hello red"
    assert envelope["MessageAttributes"] == {
        "color": {"Type": "String", "Value": "red"},
        "size": {"Type": "Number", "Value": "10"},
    }
    assert envelope["Timestamp"].endswith("Z")
    assert "Action=Unsubscribe" in envelope["UnsubscribeURL"]
    assert "Subject" not in envelopes[blue]

    (only,) = _receive(sqs, red_url)
    assert json.loads(only["Body"])["MessageId"] == matching
    assert not only.get("MessageAttributes")  # inside the envelope, as SNS puts them
    assert _empty(sqs, red_url)


def test_raw_message_delivery_and_body_filters(sns, sqs, topic, request):
    url, arn = _queue(sqs, unique_name(request.node.name))
    subscription = sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=arn,
        Attributes={
            "RawMessageDelivery": "true",
            "FilterPolicyScope": "MessageBody",
            "FilterPolicy": json.dumps({"order": {"total": [{"numeric": [">=", 100]}]}}),
        },
    )["SubscriptionArn"]  # fmt: skip
    attributes = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"]
    assert attributes["RawMessageDelivery"] == "true"
    assert attributes["FilterPolicyScope"] == "MessageBody"
    assert attributes["Protocol"] == "sqs"
    assert attributes["Endpoint"] == arn
    assert attributes["PendingConfirmation"] == "false"
    sns.publish(TopicArn=topic, Message=json.dumps({"order": {"total": 5}}))
    big = json.dumps({"order": {"total": 250}})
    sns.publish(
        TopicArn=topic, Message=big,
        MessageAttributes={"kind": {"DataType": "String", "StringValue": "order"}},
    )  # fmt: skip
    (message,) = _receive(sqs, url)
    assert message["Body"] == big  # raw: no envelope
    assert message["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "order"}}
    assert _empty(sqs, url)

    sns.set_subscription_attributes(
        SubscriptionArn=subscription, AttributeName="RawMessageDelivery", AttributeValue="false"
    )
    sns.publish(TopicArn=topic, Message=big)
    (message,) = _receive(sqs, url)
    assert json.loads(message["Body"])["Message"] == big


def test_subscriptions_are_listed_and_unsubscribed(sns, sqs, topic, request):
    _url, arn = _queue(sqs, unique_name(request.node.name))
    subscription = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
    # Subscribing the same endpoint again gives the same subscription, as in SNS.
    assert (
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
        == subscription
    )
    expected = {
        "SubscriptionArn": subscription, "Owner": "000000000000", "Protocol": "sqs",
        "Endpoint": arn, "TopicArn": topic,
    }  # fmt: skip
    assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == [expected]
    everything: list[dict[str, str]] = []
    kwargs: dict[str, str] = {}
    while True:
        page = sns.list_subscriptions(**kwargs)
        everything.extend(page["Subscriptions"])
        if "NextToken" not in page:
            break
        kwargs = {"NextToken": page["NextToken"]}
    assert expected in everything
    sns.unsubscribe(SubscriptionArn=subscription)
    assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []
    error = _error(sns.get_subscription_attributes, SubscriptionArn=subscription)
    assert error.response["Error"]["Code"] == "NotFound"
    error = _error(sns.subscribe, TopicArn=topic, Protocol="email", Endpoint="a@example.com")
    assert error.response["Error"]["Code"] == "InvalidParameter"
    error = _error(sns.subscribe, TopicArn=topic + "-missing", Protocol="sqs", Endpoint=arn)
    assert error.response["Error"]["Code"] == "NotFound"


def test_fifo_topic_delivers_groups_in_order_once(sns, sqs, request):
    name = unique_name(request.node.name)
    topic = sns.create_topic(
        Name=name + ".fifo",
        Attributes={"FifoTopic": "true", "ContentBasedDeduplication": "true"},
    )["TopicArn"]  # fmt: skip
    try:
        url, arn = _queue(sqs, name + "-q.fifo", FifoQueue="true", ContentBasedDeduplication="true")
        sns.subscribe(
            TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
        )
        error = _error(sns.publish, TopicArn=topic, Message="no group")
        assert error.response["Error"]["Code"] == "InvalidParameter"
        assert "MessageGroupId" in error.response["Error"]["Message"]
        sequence = []
        for i in range(5):
            published = sns.publish(TopicArn=topic, Message=f"m{i}", MessageGroupId="g")
            sequence.append(published["SequenceNumber"])
        # The same content again inside the window: deduplicated.
        sns.publish(TopicArn=topic, Message="m0", MessageGroupId="g")
        assert sequence == sorted(sequence)
        bodies = []
        while len(bodies) < 5:
            for message in _receive(sqs, url):
                bodies.append(message["Body"])
                sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        assert bodies == [f"m{i}" for i in range(5)]
        assert _empty(sqs, url)
    finally:
        sns.delete_topic(TopicArn=topic)


def test_publish_batch_reports_bad_entries_and_publishes_the_rest(sns, sqs, topic, request):
    url, arn = _queue(sqs, unique_name(request.node.name))
    sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=arn, Attributes={"RawMessageDelivery": "true"}
    )
    result = sns.publish_batch(
        TopicArn=topic,
        PublishBatchRequestEntries=[
            {"Id": "one", "Message": "first"},
            {"Id": "bad", "Message": "x", "Subject": "a" * 101},
            {"Id": "two", "Message": "second"},
        ],
    )
    assert [s["Id"] for s in result["Successful"]] == ["one", "two"]
    assert [(f["Id"], f["Code"], f["SenderFault"]) for f in result["Failed"]] == [
        ("bad", "InvalidParameter", True)
    ]
    assert sorted(m["Body"] for m in _receive(sqs, url, 2)) == ["first", "second"]
    for entries, code in (
        ([], "EmptyBatchRequest"),
        ([{"Id": str(i), "Message": "m"} for i in range(11)], "TooManyEntriesInBatchRequest"),
        ([{"Id": "a", "Message": "m"}, {"Id": "a", "Message": "m"}], "BatchEntryIdsNotDistinct"),
        ([{"Id": "a b", "Message": "m"}], "InvalidBatchEntryId"),
    ):
        error = _error(sns.publish_batch, TopicArn=topic, PublishBatchRequestEntries=entries)
        assert error.response["Error"]["Code"] == code


class _Endpoint:
    """An HTTP endpoint on 127.0.0.1 that records the POSTs SNS makes to it."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        # While set, notifications get a 500 (so their deliveries stay, retrying).
        self.failing = False
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.port = 0

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()

        async def record(request: web.Request) -> web.Response:
            self.posts.append((dict(request.headers), await request.read()))
            if self.failing and request.headers.get("x-amz-sns-message-type") == "Notification":
                return web.Response(status=500)
            return web.Response(text="ok")

        app.router.add_post("/hook", record)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> _Endpoint:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def of_type(self, kind: str) -> list[tuple[dict[str, str], bytes]]:
        return [p for p in self.posts if p[0].get("x-amz-sns-message-type") == kind]

    def only(self, kind: str) -> dict[str, Any]:
        """The one POST of this type, parsed, once it came."""
        ((_, body),) = eventually(lambda: self.of_type(kind), what=f"the {kind} POST")
        return json.loads(body)


@pytest.fixture(scope="module")
def webhook_shim(server) -> Iterator[SqsShimProcess]:
    """A shim whose confirmations may reach loopback endpoints."""
    process = SqsShimProcess(server.target, "--webhook-allow-cidr", "127.0.0.0/8").start()
    yield process
    process.stop()


def test_http_subscription_confirms_by_its_subscribe_url_then_gets_signed_posts(
    webhook_shim, request
):
    import urllib.request

    sns = sns_client(webhook_shim.endpoint)
    topic = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
    try:
        with _Endpoint() as endpoint:
            pending = sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            assert pending["SubscriptionArn"] == "pending confirmation"
            (headers, body), = eventually(
                lambda: endpoint.of_type("SubscriptionConfirmation"), what="the confirmation POST"
            )  # fmt: skip
            confirmation = json.loads(body)
            assert confirmation["Type"] == "SubscriptionConfirmation"
            assert confirmation["TopicArn"] == topic
            assert headers["x-amz-sns-topic-arn"] == topic
            # Pending: publishes pass it by.
            sns.publish(TopicArn=topic, Message="before confirmation")
            (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert listed["SubscriptionArn"] == "PendingConfirmation"
            # A wrong token confirms nothing.
            error = _error(
                sns.confirm_subscription, TopicArn=topic, Token=confirmation["Token"] + "0"
            )
            assert error.response["Error"]["Code"] == "InvalidParameter"
            # In AWS's words: one of a token's shape that confirms nothing, and one not.
            wrong = confirmation["Token"][:-1] + ("0" if confirmation["Token"][-1] != "0" else "1")
            for token, text in (
                (wrong, "Invalid parameter: Token"),
                ("f" * 64, "Invalid parameter: Token"),
                ("randomtoken", "Invalid token"),
            ):
                error = _error(sns.confirm_subscription, TopicArn=topic, Token=token)
                assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
                    "InvalidParameter",
                    text,
                )
            # The endpoint visits SubscribeURL, unsigned, as SNS's endpoints do.
            with urllib.request.urlopen(confirmation["SubscribeURL"], timeout=10) as visit:
                assert visit.status == 200
                assert b"ConfirmSubscriptionResult" in visit.read()
            (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert listed["SubscriptionArn"].startswith(topic + ":")

            published = sns.publish(
                TopicArn=topic, Message="after", Subject="s",
                MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}},
            )["MessageId"]  # fmt: skip
            (headers, body), = eventually(
                lambda: endpoint.of_type("Notification"), what="the notification POST"
            )  # fmt: skip
            notification = json.loads(body)
            assert notification["MessageId"] == published
            assert notification["Message"] == "after"
            assert notification["Subject"] == "s"
            assert notification["MessageAttributes"] == {"k": {"Type": "String", "Value": "v"}}
            assert headers["x-amz-sns-message-id"] == published
            assert headers["x-amz-sns-subscription-arn"] == listed["SubscriptionArn"]
            assert headers["Content-Type"].startswith("text/plain")
            # Signed as every postbox webhook is (Standard Webhooks).
            assert headers["webhook-signature"].startswith("v1,")
    finally:
        sns.delete_topic(TopicArn=topic)


def test_unsubscribe_confirmation_s_subscribe_url_restores_the_subscription_once(
    webhook_shim, request
):
    import urllib.error
    import urllib.request

    sns = sns_client(webhook_shim.endpoint)
    topic = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
    policy = json.dumps({"k": ["v"]})
    matching = {"k": {"DataType": "String", "StringValue": "v"}}
    try:
        with _Endpoint() as endpoint:
            sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            ((_, body),) = eventually(
                lambda: endpoint.of_type("SubscriptionConfirmation"), what="the confirmation"
            )
            token = json.loads(body)["Token"]
            arn = sns.confirm_subscription(TopicArn=topic, Token=token)["SubscriptionArn"]
            sns.set_subscription_attributes(
                SubscriptionArn=arn, AttributeName="RawMessageDelivery", AttributeValue="true"
            )
            sns.set_subscription_attributes(
                SubscriptionArn=arn, AttributeName="FilterPolicy", AttributeValue=policy
            )
            sns.unsubscribe(SubscriptionArn=arn)
            ((_, body),) = eventually(
                lambda: endpoint.of_type("UnsubscribeConfirmation"), what="the unsubscribe"
            )
            unsubscribed = json.loads(body)
            # Gone for the SNS API until restored; publishes pass it by meanwhile.
            assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []
            assert arn not in [
                s["SubscriptionArn"] for s in sns.list_subscriptions()["Subscriptions"]
            ]
            error = _error(sns.get_subscription_attributes, SubscriptionArn=arn)
            assert error.response["Error"]["Code"] == "NotFound"
            assert _error(sns.unsubscribe, SubscriptionArn=arn).response["Error"]["Code"] == (
                "NotFound"
            )
            counts = sns.get_topic_attributes(TopicArn=topic)["Attributes"]
            assert (counts["SubscriptionsConfirmed"], counts["SubscriptionsDeleted"]) == ("0", "1")
            sns.publish(TopicArn=topic, Message="while away", MessageAttributes=matching)

            # The endpoint visits SubscribeURL, as AWS's message says to restore it.
            with urllib.request.urlopen(unsubscribed["SubscribeURL"], timeout=10) as visit:
                assert visit.status == 200
                assert arn.encode() in visit.read()
            (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert (listed["SubscriptionArn"], listed["Endpoint"]) == (arn, endpoint.url)
            attributes = sns.get_subscription_attributes(SubscriptionArn=arn)["Attributes"]
            assert attributes["RawMessageDelivery"] == "true"
            assert json.loads(attributes["FilterPolicy"]) == {"k": ["v"]}
            assert attributes["PendingConfirmation"] == "false"
            assert not [k for k in attributes if k.startswith("postbox:")]

            # Delivers again, raw and filtered as before.
            sns.publish(TopicArn=topic, Message="filtered out")
            sns.publish(TopicArn=topic, Message="back", MessageAttributes=matching)
            ((headers, body),) = eventually(
                lambda: endpoint.of_type("Notification"), what="the notification"
            )
            assert (body, headers["x-amz-sns-subscription-arn"]) == (b"back", arn)

            # The token restores once: then, as an unknown token, in AWS's words.
            for visit in (
                lambda: sns.confirm_subscription(TopicArn=topic, Token=unsubscribed["Token"]),
                lambda: urllib.request.urlopen(unsubscribed["SubscribeURL"], timeout=10),
            ):
                with pytest.raises((ClientError, urllib.error.HTTPError)) as caught:
                    visit()
                if isinstance(caught.value, ClientError):
                    assert caught.value.response["Error"]["Message"] == "Invalid parameter: Token"
                else:
                    assert caught.value.code == 400
                    assert b"Invalid parameter: Token" in caught.value.read()
            # The SubscriptionConfirmation's own token still answers the subscription.
            assert sns.confirm_subscription(TopicArn=topic, Token=token)["SubscriptionArn"] == arn

            # A topic deleted meanwhile: the token restores nothing.
            sns.unsubscribe(SubscriptionArn=arn)
            again = json.loads(
                eventually(
                    lambda: (
                        (found := endpoint.of_type("UnsubscribeConfirmation"))
                        and len(found) == 2
                        and found
                    ),
                    what="the second unsubscribe",
                )[1][1]
            )
            sns.delete_topic(TopicArn=topic)
            sns.create_topic(Name=topic.rsplit(":", 1)[1])
            error = _error(sns.confirm_subscription, TopicArn=topic, Token=again["Token"])
            assert error.response["Error"]["Message"] == "Invalid parameter: Token"
            assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []
            assert [p for p in endpoint.posts if b"while away" in p[1]] == []
    finally:
        sns.delete_topic(TopicArn=topic)


def test_an_unsubscribe_token_restores_nothing_once_expired_or_subscribed_again(
    webhook_shim, channel, request
):
    import grpc
    from google.protobuf import field_mask_pb2
    from postbox.v1 import topic_service_pb2 as pb
    from postbox.v1 import topic_service_pb2_grpc

    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    sns = sns_client(webhook_shim.endpoint)
    topic = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
    name = topic.rsplit(":", 1)[1]

    def unsubscribed_token(endpoint: _Endpoint) -> tuple[str, str]:
        """Subscribes, confirms and unsubscribes the endpoint: (ARN, the restore token)."""
        seen = len(endpoint.of_type("UnsubscribeConfirmation"))
        asked = len(endpoint.of_type("SubscriptionConfirmation"))
        sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
        confirmation = eventually(
            lambda: endpoint.of_type("SubscriptionConfirmation")[asked:], what="a confirmation"
        )[0]
        token = json.loads(confirmation[1])["Token"]
        arn = sns.confirm_subscription(TopicArn=topic, Token=token)["SubscriptionArn"]
        sns.unsubscribe(SubscriptionArn=arn)
        posted = eventually(
            lambda: endpoint.of_type("UnsubscribeConfirmation")[seen:], what="the unsubscribe"
        )[0]
        return arn, json.loads(posted[1])["Token"]

    def deliveries(subscription: str) -> list:
        request = pb.ListWebhookDeliveriesRequest(topic=name, subscription=subscription)
        return list(topics.ListWebhookDeliveries(request).deliveries)

    try:
        with _Endpoint() as endpoint:
            # A delivery retrying at Unsubscribe goes, as the subscription's did before
            # (its restore brings back the subscription, not what it was sent).
            endpoint.failing = True
            sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            ((_, body),) = eventually(
                lambda: endpoint.of_type("SubscriptionConfirmation"), what="a confirmation"
            )
            arn = sns.confirm_subscription(TopicArn=topic, Token=json.loads(body)["Token"])[
                "SubscriptionArn"
            ]
            sns.publish(TopicArn=topic, Message="refused")
            eventually(lambda: endpoint.of_type("Notification"), what="a refused attempt")
            assert len(deliveries(arn.rsplit(":", 1)[1])) == 1
            sns.unsubscribe(SubscriptionArn=arn)
            assert deliveries(arn.rsplit(":", 1)[1]) == []
            endpoint.failing = False
            ((_, body),) = eventually(
                lambda: endpoint.of_type("UnsubscribeConfirmation"), what="the unsubscribe"
            )
            token = json.loads(body)["Token"]

            # Past its restore period (set so through the gRPC API, as 3 days would be).
            kept = topics.GetSubscription(
                pb.GetSubscriptionRequest(topic=name, name=arn.rsplit(":", 1)[1])
            ).subscription
            assert kept.suspended
            kept.sns_delivery.attributes["postbox:RestoreUntil"] = "1"
            topics.UpdateSubscription(
                pb.UpdateSubscriptionRequest(
                    subscription=kept,
                    update_mask=field_mask_pb2.FieldMask(paths=["sns_delivery"]),
                )
            )
            error = _error(sns.confirm_subscription, TopicArn=topic, Token=token)
            assert error.response["Error"]["Message"] == "Invalid parameter: Token"
            with pytest.raises(grpc.RpcError) as gone:
                topics.GetSubscription(pb.GetSubscriptionRequest(topic=name, name=kept.name))
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND

            # Subscribing the endpoint again ends the restore of the unsubscribed one.
            arn, token = unsubscribed_token(endpoint)
            sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            error = _error(sns.confirm_subscription, TopicArn=topic, Token=token)
            assert error.response["Error"]["Message"] == "Invalid parameter: Token"
            (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
            assert listed["SubscriptionArn"] == "PendingConfirmation"
    finally:
        sns.delete_topic(TopicArn=topic)


def test_auto_confirmed_endpoints_skip_the_handshake(server, request):
    with _Endpoint() as endpoint:
        shim = SqsShimProcess(
            server.target, "--sns-auto-confirm", f"http://127.0.0.1:{endpoint.port}/"
        ).start()
        try:
            sns = sns_client(shim.endpoint)
            topic = sns.create_topic(Name=unique_name(request.node.name))["TopicArn"]
            subscription = sns.subscribe(
                TopicArn=topic, Protocol="http", Endpoint=endpoint.url,
                Attributes={"RawMessageDelivery": "true"},
            )["SubscriptionArn"]  # fmt: skip
            assert subscription.startswith(topic + ":")
            sns.publish(TopicArn=topic, Message="raw body")
            (headers, body), = eventually(lambda: endpoint.of_type("Notification"))  # fmt: skip
            assert body == b"raw body"
            assert headers["x-amz-sns-rawdelivery"] == "true"
            assert not endpoint.of_type("SubscriptionConfirmation")
            sns.delete_topic(TopicArn=topic)
        finally:
            shim.stop()


def aws_sns(endpoint: str, *args: str) -> dict:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "postbox-cli",
        "AWS_SECRET_ACCESS_KEY": "unchecked",
        "AWS_DEFAULT_REGION": SQS_REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    completed = subprocess.run(
        [str(AWS), "--endpoint-url", endpoint, "--output", "json", "sns", *args],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout) if completed.stdout.strip() else {}


def test_aws_cli_topic_subscribe_publish(sqs_shim, sqs, request):
    name = unique_name(request.node.name)
    url, arn = _queue(sqs, name)
    topic = aws_sns(sqs_shim.endpoint, "create-topic", "--name", name)["TopicArn"]
    try:
        aws_sns(
            sqs_shim.endpoint, "subscribe", "--topic-arn", topic, "--protocol", "sqs",
            "--notification-endpoint", arn,
            "--attributes", json.dumps({"FilterPolicy": json.dumps({"kind": ["cli"]})}),
        )  # fmt: skip
        listed = aws_sns(sqs_shim.endpoint, "list-subscriptions-by-topic", "--topic-arn", topic)
        assert [s["Endpoint"] for s in listed["Subscriptions"]] == [arn]
        skipped = aws_sns(sqs_shim.endpoint, "publish", "--topic-arn", topic, "--message", "no")
        published = aws_sns(
            sqs_shim.endpoint, "publish", "--topic-arn", topic, "--message", "from the cli",
            "--message-attributes", '{"kind": {"DataType": "String", "StringValue": "cli"}}',
        )  # fmt: skip
        assert skipped["MessageId"] != published["MessageId"]
        (message,) = _receive(sqs, url)
        envelope = json.loads(message["Body"])
        assert (envelope["MessageId"], envelope["Message"]) == (
            published["MessageId"],
            "from the cli",
        )
        assert _empty(sqs, url)
        tags = aws_sns(sqs_shim.endpoint, "list-tags-for-resource", "--resource-arn", topic)
        assert tags == {"Tags": []}
    finally:
        aws_sns(sqs_shim.endpoint, "delete-topic", "--topic-arn", topic)
        with contextlib.suppress(ClientError):
            sqs.delete_queue(QueueUrl=url)


def test_the_compatibility_table_names_every_action_of_both_apis():
    import re

    from postbox_server.aws.sns.actions import HANDLERS as SNS
    from postbox_server.aws.sqs.actions import HANDLERS as SQS

    page = ROOT / "docs" / "reference" / "aws-compatibility.md"
    table = page.read_text().split("<!-- aws actions -->")[1].split("<!-- /aws actions -->")[0]
    listed: dict[str, set[str]] = {"SQS": set(), "SNS": set()}
    for api, actions in re.findall(r"^\| (SQS|SNS) \| (.*?) \|", table, re.MULTILINE):
        listed[api].update(re.findall(r"`(\w+)`", actions))
    assert listed == {"SQS": set(SQS), "SNS": set(SNS)}


def test_api_keys_sign_sns_calls_and_grants_apply(admin_url):
    """SigV4 by API keys, checked by the server, and the key's grants on topics."""
    import boto3
    import grpc
    from auth_support import bearer, wait_until
    from postbox.v1 import access_service_pb2 as access_pb
    from postbox.v1 import access_service_pb2_grpc
    from support import ServerProcess, bootstrap_key, create_database, drop_database

    url = create_database(admin_url, "postbox_sns_keys")
    server = shim = None
    try:
        server = ServerProcess(url).start()
        admin_secret = bootstrap_key(url, "sns-admin", "admin:*")
        shim = SqsShimProcess(server.target).start()

        def client(name: str, secret: str):
            return boto3.client(
                "sns", endpoint_url=shim.endpoint, region_name=SQS_REGION,
                aws_access_key_id=name, aws_secret_access_key=secret,
                config=Config(retries={"max_attempts": 1, "mode": "standard"}),
            )  # fmt: skip

        with grpc.insecure_channel(server.target) as channel:
            access = access_service_pb2_grpc.AccessServiceStub(channel)

            made: dict[str, Any] = {}
            for name, permission, pattern in (
                ("sns-root", "admin", "*"), ("publisher", "publish", "sns-*"),
            ):  # fmt: skip

                def attempt(name=name, permission=permission, pattern=pattern) -> bool:
                    try:
                        made[name] = access.CreateKey(
                            access_pb.CreateKeyRequest(key=access_pb.Key(name=name, grants=[
                                access_pb.Grant(permission=access_pb.Permission.Value(
                                    f"PERMISSION_{permission.upper()}"), pattern=pattern)
                            ])),
                            metadata=bearer(admin_secret),
                        )  # fmt: skip
                    except grpc.RpcError:
                        return False
                    return True

                wait_until(attempt, 5, f"key {name}")
        admin = client("sns-root", made["sns-root"].sigv4_secret_access_key)
        publisher = client("publisher", made["publisher"].sigv4_secret_access_key)
        topic = admin.create_topic(Name="sns-orders")["TopicArn"]
        assert publisher.publish(TopicArn=topic, Message="m")["MessageId"]
        for call in (
            lambda: publisher.create_topic(Name="sns-other"),
            lambda: publisher.delete_topic(TopicArn=topic),
            lambda: publisher.tag_resource(ResourceArn=topic, Tags=[{"Key": "a", "Value": "b"}]),
        ):
            error = _error(call)
            assert error.response["Error"]["Code"] == "AuthorizationError", error.response
            assert error.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        error = _error(client("nobody", "whatever").list_topics)
        assert error.response["Error"]["Code"] == "InvalidClientTokenId"
        error = _error(client("sns-root", "not-its-secret").list_topics)
        assert error.response["Error"]["Code"] == "SignatureDoesNotMatch"
    finally:
        if shim is not None:
            shim.stop()
        if server is not None:
            server.stop()
        drop_database(admin_url, url)


def test_filter_policy_scope_set_before_the_policy_is_kept(sns, sqs, topic, request):
    url, arn = _queue(sqs, unique_name(request.node.name))
    subscription = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
    for name, value in (
        ("RawMessageDelivery", "true"),
        ("FilterPolicyScope", "MessageBody"),  # on its own, before any policy
        ("FilterPolicy", json.dumps({"store": ["example_corp"]})),
    ):
        sns.set_subscription_attributes(
            SubscriptionArn=subscription, AttributeName=name, AttributeValue=value
        )
    attributes = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"]
    assert attributes["FilterPolicyScope"] == "MessageBody"
    # Matched on the body, not on attributes: the first passes, the second does not.
    sns.publish(TopicArn=topic, Message=json.dumps({"store": "example_corp"}))
    sns.publish(
        TopicArn=topic, Message=json.dumps({"store": "other"}),
        MessageAttributes={"store": {"DataType": "String", "StringValue": "example_corp"}},
    )  # fmt: skip
    (message,) = _receive(sqs, url)
    assert json.loads(message["Body"]) == {"store": "example_corp"}
    assert _empty(sqs, url)
    # Unsetting the policy hides the scope with it, as SNS does.
    sns.set_subscription_attributes(
        SubscriptionArn=subscription, AttributeName="FilterPolicy", AttributeValue=""
    )
    attributes = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"]
    assert "FilterPolicy" not in attributes
    assert "FilterPolicyScope" not in attributes


def test_subscribe_checks_the_topic_then_the_sqs_endpoint(sns, sqs, topic, request):
    name = unique_name(request.node.name)
    fifo_url, fifo_arn = _queue(sqs, name[:60] + ".fifo", FifoQueue="true")
    try:
        # The topic is checked first, whatever the endpoint.
        error = _error(sns.subscribe, TopicArn=topic + "-missing", Protocol="sqs", Endpoint="x")
        assert error.response["Error"] == {
            "Type": "Sender", "Code": "NotFound", "Message": "Topic does not exist"
        }  # fmt: skip
        for endpoint in ("unknown", fifo_url):  # a name or a URL is no ARN
            error = _error(sns.subscribe, TopicArn=topic, Protocol="sqs", Endpoint=endpoint)
            assert error.response["Error"]["Code"] == "InvalidParameter"
            assert error.response["Error"]["Message"] == "Invalid parameter: SQS endpoint ARN"
        error = _error(sns.subscribe, TopicArn=topic, Protocol="sqs", Endpoint=fifo_arn)
        assert error.response["Error"]["Code"] == "InvalidParameter"
        assert error.response["Error"]["Message"] == (
            "Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can not be "
            "subscribed to standard SNS topics"
        )
        assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []
    finally:
        sqs.delete_queue(QueueUrl=fifo_url)


def test_a_queue_that_does_not_exist_yet_is_subscribed_and_delivered_to_once_made(
    sns, sqs, topic, request
):
    """As on AWS, Subscribe takes an SQS ARN whose queue does not exist; publishes then
    deliver nothing to it, until the queue is made, which gets the later ones."""
    name = unique_name(request.node.name)
    arn = f"arn:aws:sqs:{SQS_REGION}:{SQS_ACCOUNT}:{name}"
    subscription = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
    assert subscription.startswith(topic + ":")
    (listed,) = sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"]
    assert listed["Endpoint"] == arn
    # Idempotent for the same endpoint, as for a queue that exists.
    assert sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"] == (
        subscription
    )
    sns.set_subscription_attributes(
        SubscriptionArn=subscription, AttributeName="RawMessageDelivery", AttributeValue="true"
    )
    published = sns.publish(TopicArn=topic, Message="before the queue")
    assert published["MessageId"]
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    try:
        sns.publish(TopicArn=topic, Message="after the queue")
        assert [m["Body"] for m in _receive(sqs, url)] == ["after the queue"]
        assert _empty(sqs, url)
        attributes = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"]
        assert attributes["Endpoint"] == arn
        sns.unsubscribe(SubscriptionArn=subscription)
    finally:
        sqs.delete_queue(QueueUrl=url)
    # Unsubscribing one that still waits works too.
    waiting = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn + "-other")
    sns.unsubscribe(SubscriptionArn=waiting["SubscriptionArn"])
    assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []


def test_add_and_remove_permission_edit_the_topic_policy(sns, topic):
    def statements() -> list[dict[str, Any]]:
        policy = sns.get_topic_attributes(TopicArn=topic)["Attributes"]["Policy"]
        return json.loads(policy)["Statement"]

    (default,) = statements()
    assert default["Sid"] == "__default_statement_ID"
    assert "SNS:AddPermission" in default["Action"]
    sns.add_permission(
        TopicArn=topic, Label="partners", AWSAccountId=["888888888888", "999999999999"],
        ActionName=["Publish", "Subscribe"],
    )  # fmt: skip
    assert statements() == [
        default,
        {
            "Sid": "partners", "Effect": "Allow",
            "Principal": {"AWS": ["arn:aws:iam::888888888888:root",
                                  "arn:aws:iam::999999999999:root"]},
            "Action": ["SNS:Publish", "SNS:Subscribe"], "Resource": topic,
        },
    ]  # fmt: skip
    error = _error(
        sns.add_permission, TopicArn=topic, Label="partners", AWSAccountId=["1"],
        ActionName=["Publish"],
    )  # fmt: skip
    assert error.response["Error"]["Message"] == "Statement already exists"
    error = _error(
        sns.add_permission, TopicArn=topic, Label="other", AWSAccountId=["1"],
        ActionName=["NotExistingAction"],
    )  # fmt: skip
    assert error.response["Error"]["Message"] == "Policy statement action out of service scope!"
    sns.remove_permission(TopicArn=topic, Label="partners")
    sns.remove_permission(TopicArn=topic, Label="absent")  # no error, as in SNS
    assert statements() == [default]
    error = _error(sns.remove_permission, TopicArn=topic + "-missing", Label="partners")
    assert error.response["Error"]["Code"] == "NotFound"


def test_publish_batch_refusals_in_sns_words(sns, topic, request):
    missing = topic + "-missing"
    for call, code, message in (
        (
            lambda: sns.publish_batch(
                TopicArn=missing, PublishBatchRequestEntries=[{"Id": "a", "Message": "1"}]
            ),
            "NotFound", "Topic does not exist",
        ),
        (
            lambda: sns.publish(TopicArn=missing, Message="1"),
            "NotFound", "Topic does not exist",
        ),
        (
            lambda: sns.publish_batch(
                TopicArn=topic,
                PublishBatchRequestEntries=[{"Id": f"i{n}", "Message": "1"} for n in range(11)],
            ),
            "TooManyEntriesInBatchRequest",
            "The batch request contains more entries than permissible.",
        ),
        (
            lambda: sns.publish_batch(
                TopicArn=topic,
                PublishBatchRequestEntries=[{"Id": "same", "Message": "1"}] * 2,
            ),
            "BatchEntryIdsNotDistinct",
            "Two or more batch entries in the request have the same Id.",
        ),
    ):  # fmt: skip
        error = _error(call)
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            code,
            message,
        )
    fifo = sns.create_topic(
        Name=unique_name(request.node.name)[:60] + ".fifo",
        Attributes={"FifoTopic": "true", "ContentBasedDeduplication": "true"},
    )["TopicArn"]
    try:
        error = _error(
            sns.publish_batch, TopicArn=fifo,
            PublishBatchRequestEntries=[
                {"Id": "a", "Message": "1", "MessageGroupId": "g"}, {"Id": "b", "Message": "2"},
            ],
        )  # fmt: skip
        assert error.response["Error"]["Code"] == "InvalidParameter"
        assert error.response["Error"]["Message"] == (
            "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
        )
    finally:
        sns.delete_topic(TopicArn=fifo)


def _sns_json(endpoint: str, action: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """A call in SNS's JSON protocol (X-Amz-Target: AmazonSNS.<Action>), as beyond-queue's
    clients make it, with a plain HTTP client."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        endpoint + "/", data=json.dumps(params).encode(), method="POST",
        headers={"X-Amz-Target": f"AmazonSNS.{action}",
                 "Content-Type": "application/x-amz-json-1.0"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_json_protocol_serves_the_same_actions(sqs_shim, sqs, request):
    name = unique_name(request.node.name)
    url, queue_arn = _queue(sqs, name)
    status, created = _sns_json(sqs_shim.endpoint, "CreateTopic", {"Name": name})
    assert status == 200
    topic = created["TopicArn"]
    try:
        status, subscribed = _sns_json(
            sqs_shim.endpoint, "Subscribe",
            {"TopicArn": topic, "Protocol": "sqs", "Endpoint": queue_arn,
             "Attributes": {"RawMessageDelivery": "true"}},
        )  # fmt: skip
        assert status == 200
        assert subscribed["SubscriptionArn"].startswith(topic + ":")
        status, published = _sns_json(
            sqs_shim.endpoint, "Publish",
            {"TopicArn": topic, "Message": "over json",
             "MessageAttributes": {"k": {"DataType": "String", "StringValue": "v"}}},
        )  # fmt: skip
        assert status == 200
        assert published["MessageId"]
        (message,) = _receive(sqs, url)
        assert message["Body"] == "over json"
        assert message["MessageAttributes"]["k"]["StringValue"] == "v"
        status, listed = _sns_json(
            sqs_shim.endpoint, "ListSubscriptionsByTopic", {"TopicArn": topic}
        )
        assert status == 200
        assert [s["Endpoint"] for s in listed["Subscriptions"]] == [queue_arn]
        # Errors as the JSON protocol has them: the shape in __type, the code in a header.
        status, missing = _sns_json(
            sqs_shim.endpoint, "Publish", {"TopicArn": topic + "-missing", "Message": "m"}
        )
        assert status == 404
        assert missing["__type"] == "com.amazonaws.sns#NotFound"
        status, wrong = _sns_json(sqs_shim.endpoint, "Publish", {"TopicArn": 7, "Message": "m"})
        assert status == 400
        assert "TopicArn" in wrong["message"]
        status, unknown = _sns_json(sqs_shim.endpoint, "LaunchRockets", {})
        assert status == 400
        assert unknown["__type"] == "com.amazonaws.sns#InvalidAction"
    finally:
        _sns_json(sqs_shim.endpoint, "DeleteTopic", {"TopicArn": topic})


def test_filter_numbers_match_to_five_decimals_and_string_array_numbers(sns, sqs, topic, request):
    # SNS documents five digits of accuracy after the point: a policy number with more is
    # taken, and compared at five (it is not refused). A String.Array attribute holding a
    # bare JSON number matches as that number (moto's test of SNS's behaviour).
    url, arn = _queue(sqs, unique_name(request.node.name))
    sns.subscribe(
        TopicArn=topic, Protocol="sqs", Endpoint=arn,
        Attributes={"FilterPolicy": json.dumps({"price": [100.123456789, 500]}),
                    "RawMessageDelivery": "true"},
    )  # fmt: skip
    for body, data_type, value in (
        ("digits", "Number", "100.1234567"),
        ("array", "String.Array", json.dumps([100.1234567, 50])),
        ("bare", "String.Array", "500"),
        ("fifth digit differs", "Number", "100.12346"),
        ("a string", "String", "500"),
    ):
        sns.publish(
            TopicArn=topic, Message=body,
            MessageAttributes={"price": {"DataType": data_type, "StringValue": value}},
        )  # fmt: skip
    # Published in order to one queue: the three that match arrive, then none (the two
    # that do not are filtered at publish, before this receive starts).
    assert sorted(m["Body"] for m in _receive(sqs, url, 3)) == ["array", "bare", "digits"]
    assert _empty(sqs, url)


def test_too_complex_filter_policies_in_aws_words(sns, sqs, topic, request):
    # AWS's words (localstack's AWS-validated snapshots): Subscribe says "Attributes
    # Reason: ", SetSubscriptionAttributes not. Nothing is subscribed or changed.
    _url, arn = _queue(sqs, unique_name(request.node.name))
    too_complex = {"store": [str(i) for i in range(151)]}
    too_many_keys = {f"key_{k}": ["v"] for k in "abcdef"}
    for policy, text in (
        (too_complex, "Filter policy is too complex"),
        (too_many_keys, "Filter policy can not have more than 5 keys"),
    ):
        error = _error(
            sns.subscribe, TopicArn=topic, Protocol="sqs", Endpoint=arn,
            Attributes={"FilterPolicy": json.dumps(policy)},
        )  # fmt: skip
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "InvalidParameter",
            f"Invalid parameter: Attributes Reason: FilterPolicy: {text}",
        )
    assert sns.list_subscriptions_by_topic(TopicArn=topic)["Subscriptions"] == []
    subscription = sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)["SubscriptionArn"]
    for policy, text in (
        (too_complex, "Filter policy is too complex"),
        (too_many_keys, "Filter policy can not have more than 5 keys"),
    ):
        error = _error(
            sns.set_subscription_attributes, SubscriptionArn=subscription,
            AttributeName="FilterPolicy", AttributeValue=json.dumps(policy),
        )  # fmt: skip
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "InvalidParameter",
            f"Invalid parameter: FilterPolicy: {text}",
        )
    attributes = sns.get_subscription_attributes(SubscriptionArn=subscription)["Attributes"]
    assert "FilterPolicy" not in attributes


def test_an_empty_message_attribute_value_in_sns_words(sns, topic):
    # SNS's code and words, not SQS's (localstack's AWS-validated snapshot of
    # test_empty_or_wrong_message_attributes).
    for data_type, value in (("String", {"StringValue": ""}), ("Binary", {"BinaryValue": b""})):
        error = _error(
            sns.publish, TopicArn=topic, Message="m",
            MessageAttributes={"attr1": {"DataType": data_type, **value}},
        )  # fmt: skip
        assert (error.response["Error"]["Code"], error.response["Error"]["Message"]) == (
            "ParameterValueInvalid",
            "The message attribute 'attr1' must contain non-empty message attribute value "
            f"for message attribute type '{data_type}'.",
        )
