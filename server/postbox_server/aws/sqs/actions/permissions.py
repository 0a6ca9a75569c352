"""AddPermission and RemovePermission: a queue's access policy, stored as SQS edits it and
returned, not enforced (postbox_server/aws/policies.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.aws import policies
from postbox_server.aws.errors import (
    AwsError,
    invalid_parameter,
    missing_parameter,
)
from postbox_server.aws.sqs import naming
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.actions.queues import get_queue, update_queue
from postbox_server.aws.sqs.errors import OVER_LIMIT

# The actions AddPermission may grant (SQS's own; the queue owner keeps the rest), and
# how many one statement may name.
_GRANTABLE = (
    "*", "ChangeMessageVisibility", "DeleteMessage", "GetQueueAttributes", "GetQueueUrl",
    "ListDeadLetterSourceQueues", "PurgeQueue", "ReceiveMessage", "SendMessage",
)  # fmt: skip
_MAX_ACTIONS = 7


async def _edit_policy(call: Call, edit: Callable[[dict[str, Any], str], dict[str, Any]]) -> None:
    """Changes the queue's Policy; SQS starts an empty one as below."""
    name = call.queue()
    queue = await get_queue(call, name)
    arn = naming.queue_arn(call.settings, name)
    document = policies.load(queue.access_policy) or {
        "Version": "2012-10-17",
        "Id": f"{arn}/SQSDefaultPolicy",
        "Statement": [],
    }
    edited = policies.dump(edit(document, arn))
    if len(edited.encode()) > policies.MAX_POLICY_BYTES:
        raise invalid_parameter(
            f"Value for parameter Policy is invalid. Reason: the policy would be "
            f"{len(edited.encode())} bytes; the limit is {policies.MAX_POLICY_BYTES}."
        )
    await update_queue(call, qpb.Queue(name=name, access_policy=edited), ["access_policy"])


@action("AddPermission")
async def add_permission(call: Call) -> Result:
    label = call.required("Label")
    accounts = call.params.get("AWSAccountIds") or []
    actions = call.params.get("Actions") or []
    if not actions:
        raise missing_parameter("Actions")
    if not accounts:
        raise invalid_parameter(
            "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify."
        )
    if len(actions) > _MAX_ACTIONS:
        raise AwsError(
            OVER_LIMIT, f"{len(actions)} Actions were found, maximum allowed is {_MAX_ACTIONS}."
        )
    for name in actions:
        if name not in _GRANTABLE:
            raise invalid_parameter(
                f"Value SQS:{name[:64]} for parameter ActionName is invalid. "
                "Reason: Only the queue owner is allowed to invoke this action."
            )

    taken = invalid_parameter(
        f"Value {label} for parameter Label is invalid. Reason: Already exists."
    )
    await _edit_policy(
        call,
        lambda document, arn: policies.add_statement(
            document, label, accounts, actions, arn, service="SQS", taken=taken
        ),
    )
    return {}


@action("RemovePermission")
async def remove_permission(call: Call) -> Result:
    label = call.required("Label")

    def edit(document: dict[str, Any], _arn: str) -> dict[str, Any]:
        if not policies.has_label(document, label):
            raise invalid_parameter(
                f"Value {label} for parameter Label is invalid. "
                "Reason: can't find label on existing policy."
            )
        return policies.remove_statement(document, label)

    await _edit_policy(call, edit)
    return {}
