"""The AWS CLI (`aws sqs ...`) against the shim: create, send, receive, delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import SQS_REGION, unique_name

AWS = Path(sys.executable).with_name("aws")


def aws(endpoint: str, *args: str) -> dict:
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "postbox-cli",
        "AWS_SECRET_ACCESS_KEY": "unchecked",
        "AWS_DEFAULT_REGION": SQS_REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    completed = subprocess.run(
        [str(AWS), "--endpoint-url", endpoint, "--output", "json", "sqs", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout) if completed.stdout.strip() else {}


def test_aws_cli_create_send_receive_delete(sqs_shim, sqs):
    name = unique_name("cli")
    url = aws(sqs_shim.endpoint, "create-queue", "--queue-name", name)["QueueUrl"]
    sent = aws(
        sqs_shim.endpoint,
        "send-message",
        "--queue-url", url,
        "--message-body", "from the cli",
        "--message-attributes", '{"kind": {"DataType": "String", "StringValue": "cli"}}',
    )  # fmt: skip
    received = aws(
        sqs_shim.endpoint,
        "receive-message",
        "--queue-url", url,
        "--message-attribute-names", "All",
        "--wait-time-seconds", "5",
    )  # fmt: skip
    (message,) = received["Messages"]
    assert message["Body"] == "from the cli"
    assert message["MessageAttributes"] == {"kind": {"DataType": "String", "StringValue": "cli"}}
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    aws(
        sqs_shim.endpoint,
        "delete-message",
        "--queue-url", url,
        "--receipt-handle", message["ReceiptHandle"],
    )  # fmt: skip
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "0"
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0"
    sqs.delete_queue(QueueUrl=url)
