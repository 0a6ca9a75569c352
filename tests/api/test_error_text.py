"""Oversized input never makes an oversized error: every RPC, every string field, 1 MiB."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from support import api_methods, call_method

HUGE = "a" * (1 << 20)
# The client's own limit on a status's metadata is 16 KiB: a message must stay far below.
MAX_MESSAGE = 1024


def string_fields(descriptor: d.Descriptor, prefix: str = "", depth: int = 0):
    """Paths of the singular string fields of a message and its message fields."""
    for field in descriptor.fields:
        if field.type == d.FieldDescriptor.TYPE_STRING and not field.is_repeated:
            yield (*prefix, field.name) if prefix else (field.name,)
        elif (
            field.type == d.FieldDescriptor.TYPE_MESSAGE
            and not field.is_repeated
            and depth < 2
            and not field.message_type.full_name.startswith("google.")
        ):
            yield from string_fields(
                field.message_type, (*prefix, field.name) if prefix else (field.name,), depth + 1
            )


CASES = [
    pytest.param(method, path, id=f"{method.name}.{'.'.join(path)}")
    for method in api_methods()
    for path in string_fields(method.input_type)
]


def test_every_rpc_is_covered():
    assert len({method.full_name for method, _ in (c.values for c in CASES)}) >= 40


@pytest.mark.parametrize(("method", "path"), CASES)
def test_a_huge_string_gets_the_intended_status_with_a_short_message(channel, method, path):
    request = message_factory.GetMessageClass(method.input_type)()
    target = request
    for name in path[:-1]:
        target = getattr(target, name)
    setattr(target, path[-1], HUGE)
    code, details = call_method(channel, method, request)
    if code == grpc.StatusCode.OK:
        return  # accepted: a field whose length the API does not bound (a body, say)
    assert code != grpc.StatusCode.RESOURCE_EXHAUSTED or "metadata" not in details.lower(), details[
        :200
    ]
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), details[:300]
    assert len(details.encode()) < MAX_MESSAGE, f"{code.name}: {details[:200]}… ({len(details)})"


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("get_queue_url", {"QueueName": HUGE}),
        ("create_queue", {"QueueName": HUGE}),
        ("delete_message", {"QueueUrl": "QUEUE", "ReceiptHandle": HUGE}),
        ("send_message", {"QueueUrl": "QUEUE", "MessageBody": "x", "MessageGroupId": HUGE}),
    ],
)
def test_the_sqs_shim_bounds_its_errors_too(sqs_any, sqs_queue, action, arguments):
    from botocore.exceptions import ClientError

    arguments = {k: sqs_queue if v == "QUEUE" else v for k, v in arguments.items()}
    with pytest.raises(ClientError) as caught:
        getattr(sqs_any, action)(**arguments)
    error = caught.value.response["Error"]
    assert error["Code"] not in ("InternalFailure", "InternalError")
    assert len(error["Message"].encode()) < MAX_MESSAGE, error["Message"][:200]
