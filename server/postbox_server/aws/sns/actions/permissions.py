"""A topic's access policy, as AddPermission and RemovePermission edit it (stored, not
enforced: postbox_server/aws/policies.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws import policies
from postbox_server.aws.call import Call, Result
from postbox_server.aws.sns import arns
from postbox_server.aws.sns.actions.base import (
    action,
    get_topic,
    required,
    update_topic,
)
from postbox_server.aws.sns.errors import (
    InvalidParameter,
)

# The actions a topic's policy may grant, in the order of SNS's default policy.
_TOPIC_ACTIONS = (
    "GetTopicAttributes", "SetTopicAttributes", "AddPermission", "RemovePermission",
    "DeleteTopic", "Subscribe", "ListSubscriptionsByTopic", "Publish",
)  # fmt: skip


def default_policy(call: Call, arn: str) -> str:
    """The policy SNS gives a new topic: its owner's account may do everything."""
    owner = call.settings.account_id
    return policies.dump({
        "Version": "2008-10-17",
        "Id": "__default_policy_ID",
        "Statement": [{
            "Effect": "Allow",
            "Sid": "__default_statement_ID",
            "Principal": {"AWS": "*"},
            "Action": [f"SNS:{name}" for name in _TOPIC_ACTIONS],
            "Resource": arn,
            "Condition": {"StringEquals": {"AWS:SourceOwner": owner}},
        }],
    })  # fmt: skip


async def _edit_policy(call: Call, edit: Callable[[dict[str, Any], str], dict[str, Any]]) -> None:
    """Changes a topic's Policy attribute (SNS's default policy while none is set)."""
    name = arns.topic_of(required(call, "TopicArn"), call.settings)
    topic = await get_topic(call, name)
    arn = arns.topic_arn(call.settings, name)
    kept = dict(topic.sns_attributes)
    document = policies.load(kept.get("Policy", "")) or policies.load(default_policy(call, arn))
    assert document is not None
    kept["Policy"] = policies.dump(edit(document, arn))
    await update_topic(call, pb.Topic(name=name, sns_attributes=kept), "sns_attributes")


@action("AddPermission")
async def add_permission(call: Call) -> Result:
    label = required(call, "Label")
    accounts = required(call, "AWSAccountId")
    actions = required(call, "ActionName")
    if any(name not in _TOPIC_ACTIONS for name in actions):
        raise InvalidParameter("Policy statement action out of service scope!")

    await _edit_policy(
        call,
        lambda document, arn: policies.add_statement(
            document, label, accounts, actions, arn,
            service="SNS", taken=InvalidParameter("Statement already exists"),
        ),
    )  # fmt: skip
    return {}


@action("RemovePermission")
async def remove_permission(call: Call) -> Result:
    label = required(call, "Label")
    # Removing a label the policy does not have succeeds, as in SNS.
    await _edit_policy(call, lambda document, _arn: policies.remove_statement(document, label))
    return {}
