"""Dead-letter queues through the shim: RedrivePolicy, RedriveAllowPolicy, move tasks."""

from __future__ import annotations

import json
import time

import pytest
from botocore.exceptions import ClientError
from support import unique_name


def error_of(call, **kwargs) -> dict:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response["Error"]


def arn_of(client, url: str) -> str:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return attributes["Attributes"]["QueueArn"]


@pytest.fixture
def queues(sqs, request):
    """A factory of queues for one test, all deleted afterwards."""
    made = []

    def make(suffix: str, fifo: bool = False, **attributes: str) -> str:
        name = unique_name(f"{request.node.name[:40]}_{suffix}")
        if fifo:
            name += ".fifo"
            attributes["FifoQueue"] = "true"
        url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        made.append(url)
        return url

    yield make
    for url in reversed(made):  # sources before their dead-letter queues
        sqs.delete_queue(QueueUrl=url)


def receive_body(client, url: str, **kwargs) -> list[str]:
    messages = client.receive_message(QueueUrl=url, **kwargs).get("Messages", [])
    return [message["Body"] for message in messages]


@pytest.mark.parametrize("fifo", [False, True])
def test_message_moves_to_the_dead_letter_queue_after_max_receive_count(sqs_any, queues, fifo):
    dlq = queues("dlq", fifo)
    policy = {"deadLetterTargetArn": arn_of(sqs_any, dlq), "maxReceiveCount": 2}
    source = queues("src", fifo, RedrivePolicy=json.dumps(policy))
    got = sqs_any.get_queue_attributes(QueueUrl=source, AttributeNames=["RedrivePolicy"])
    assert json.loads(got["Attributes"]["RedrivePolicy"]) == policy
    extra = {"MessageGroupId": "g", "MessageDeduplicationId": "d"} if fifo else {}
    sqs_any.send_message(QueueUrl=source, MessageBody="poison", **extra)
    for _ in range(2):
        assert receive_body(sqs_any, source, VisibilityTimeout=0) == ["poison"]
    # The third receive moves it instead of delivering it.
    assert receive_body(sqs_any, source) == []
    (dead,) = sqs_any.receive_message(QueueUrl=dlq, AttributeNames=["All"])["Messages"]
    assert dead["Body"] == "poison"
    assert dead["Attributes"]["DeadLetterQueueSourceArn"] == arn_of(sqs_any, source)
    listed = sqs_any.list_dead_letter_source_queues(QueueUrl=dlq)
    assert listed["queueUrls"] == [source]


def test_redrive_policy_errors_and_removal(sqs_any, queues, sqs_shim):
    dlq = queues("dlq")
    source = queues("src")
    arn = arn_of(sqs_any, dlq)
    for bad in (
        "not json",
        json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 0}),
        json.dumps({"maxReceiveCount": 3}),
    ):
        error = error_of(
            sqs_any.set_queue_attributes, QueueUrl=source, Attributes={"RedrivePolicy": bad}
        )
        assert error["Code"] == "InvalidAttributeValue"
    missing = json.dumps({"deadLetterTargetArn": arn + "_missing", "maxReceiveCount": 3})
    error = error_of(
        sqs_any.set_queue_attributes, QueueUrl=source, Attributes={"RedrivePolicy": missing}
    )
    assert error["Code"] == "InvalidParameterValue"
    # maxReceiveCount may come as a string, as the SQS docs write it.
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "3"})
    sqs_any.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": policy})
    assert sqs_any.list_dead_letter_source_queues(QueueUrl=dlq)["queueUrls"] == [source]
    sqs_any.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": ""})
    got = sqs_any.get_queue_attributes(QueueUrl=source, AttributeNames=["All"])["Attributes"]
    assert "RedrivePolicy" not in got
    assert sqs_any.list_dead_letter_source_queues(QueueUrl=dlq).get("queueUrls", []) == []


def test_redrive_allow_policy(sqs_any, queues):
    dlq = queues("dlq", RedriveAllowPolicy=json.dumps({"redrivePermission": "denyAll"}))
    source = queues("src")
    policy = json.dumps({"deadLetterTargetArn": arn_of(sqs_any, dlq), "maxReceiveCount": 1})
    error = error_of(
        sqs_any.set_queue_attributes, QueueUrl=source, Attributes={"RedrivePolicy": policy}
    )
    assert error["Code"] == "InvalidParameterValue"
    allow = {"redrivePermission": "byQueue", "sourceQueueArns": [arn_of(sqs_any, source)]}
    sqs_any.set_queue_attributes(QueueUrl=dlq, Attributes={"RedriveAllowPolicy": json.dumps(allow)})
    got = sqs_any.get_queue_attributes(QueueUrl=dlq, AttributeNames=["RedriveAllowPolicy"])
    assert json.loads(got["Attributes"]["RedriveAllowPolicy"]) == allow
    sqs_any.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": policy})
    error = error_of(
        sqs_any.set_queue_attributes,
        QueueUrl=dlq,
        Attributes={"RedriveAllowPolicy": json.dumps({"redrivePermission": "byQueue"})},
    )
    assert error["Code"] == "InvalidAttributeValue"


def wait_for_status(client, source_arn: str, status: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        (task,) = client.list_message_move_tasks(SourceArn=source_arn)["Results"]
        if task["Status"] == status:
            return task
        assert time.monotonic() < deadline, task
        time.sleep(0.1)


def test_message_move_task_returns_dead_letters(sqs_any, queues):
    dlq = queues("dlq")
    dlq_arn = arn_of(sqs_any, dlq)
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    source = queues("src", RedrivePolicy=policy)
    for i in range(3):
        sqs_any.send_message(QueueUrl=source, MessageBody=f"m{i}")
    receive_body(sqs_any, source, MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert receive_body(sqs_any, source, MaxNumberOfMessages=10) == []  # all moved
    handle = sqs_any.start_message_move_task(SourceArn=dlq_arn)["TaskHandle"]
    task = wait_for_status(sqs_any, dlq_arn, "COMPLETED")
    assert task["ApproximateNumberOfMessagesMoved"] == 3
    assert task["SourceArn"] == dlq_arn
    assert "TaskHandle" not in task  # only running tasks carry one
    assert sorted(receive_body(sqs_any, source, MaxNumberOfMessages=10)) == ["m0", "m1", "m2"]
    error = error_of(sqs_any.cancel_message_move_task, TaskHandle=handle)
    assert error["Code"] == "AWS.SimpleQueueService.UnsupportedOperation"


def test_message_move_task_at_a_rate_can_be_cancelled(sqs_any, queues):
    dlq = queues("dlq")
    dlq_arn = arn_of(sqs_any, dlq)
    destination = queues("dest")
    policy = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 1})
    source = queues("src", RedrivePolicy=policy)
    sqs_any.send_message_batch(
        QueueUrl=source, Entries=[{"Id": f"m{i}", "MessageBody": f"m{i}"} for i in range(10)]
    )
    while receive_body(sqs_any, source, MaxNumberOfMessages=10, VisibilityTimeout=0):
        pass  # each message's second receive moves it
    handle = sqs_any.start_message_move_task(
        SourceArn=dlq_arn,
        DestinationArn=arn_of(sqs_any, destination),
        MaxNumberOfMessagesPerSecond=1,
    )["TaskHandle"]
    running = wait_for_status(sqs_any, dlq_arn, "RUNNING")
    assert running["TaskHandle"] == handle
    assert running["MaxNumberOfMessagesPerSecond"] == 1
    assert running["DestinationArn"] == arn_of(sqs_any, destination)
    error = error_of(sqs_any.start_message_move_task, SourceArn=dlq_arn)
    assert error["Code"] == "AWS.SimpleQueueService.UnsupportedOperation"  # one at a time
    moved = sqs_any.cancel_message_move_task(TaskHandle=handle)["ApproximateNumberOfMessagesMoved"]
    assert moved < 10
    assert (
        wait_for_status(sqs_any, dlq_arn, "CANCELLED")["ApproximateNumberOfMessagesMoved"] >= moved
    )


def test_message_move_task_errors(sqs_any, queues):
    plain = queues("plain")
    error = error_of(sqs_any.start_message_move_task, SourceArn=arn_of(sqs_any, plain))
    assert error["Code"] == "InvalidParameterValue"
    missing = arn_of(sqs_any, plain) + "_missing"
    error = error_of(sqs_any.start_message_move_task, SourceArn=missing)
    assert error["Code"] == "ResourceNotFoundException"
    error = error_of(sqs_any.list_message_move_tasks, SourceArn=missing)
    assert error["Code"] == "ResourceNotFoundException"
    error = error_of(sqs_any.start_message_move_task, SourceArn="arn:aws:sqs:eu-west-1:1:x")
    assert error["Code"] == "ResourceNotFoundException"
    error = error_of(sqs_any.cancel_message_move_task, TaskHandle="bm90IGEgaGFuZGxl")
    assert error["Code"] == "ResourceNotFoundException"
    error = error_of(sqs_any.start_message_move_task, SourceArn="not an arn")
    assert error["Code"] == "InvalidParameterValue"
