"""The SNS actions on topics: create, delete, list, and their attributes."""

from __future__ import annotations

import json

from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws.call import Call, Result
from postbox_server.aws.errors import AwsError
from postbox_server.aws.sns import arns
from postbox_server.aws.sns.actions.base import (
    PAGE,
    action,
    all_subscriptions,
    boolean,
    get_topic,
    is_fifo,
    next_token,
    required,
    rpc,
    update_topic,
)
from postbox_server.aws.sns.actions.permissions import default_policy
from postbox_server.aws.sns.actions.subscriptions import unsubscribed
from postbox_server.aws.sns.errors import (
    NOT_FOUND,
    InvalidParameter,
)
from postbox_server.errors import quoted
from postbox_server.sns_signing import SIGNATURE_VERSIONS

# Topic attributes SNS lets SetTopicAttributes change, kept as they are given.
_KEPT_TOPIC_ATTRIBUTES = {
    "DisplayName", "Policy", "DeliveryPolicy", "KmsMasterKeyId", "TracingConfig",
    "SignatureVersion", "ContentBasedDeduplication", "ArchivePolicy", "FifoThroughputScope",
    "DataProtectionPolicy",
}  # fmt: skip


@action("CreateTopic")
async def create_topic(call: Call) -> Result:
    name = required(call, "Name")
    attributes = dict(call.params.get("Attributes") or {})
    fifo = boolean("FifoTopic", attributes.pop("FifoTopic", "false"))
    if fifo != is_fifo(name):
        # AWS's words for a FIFO name without .fifo and for .fifo on a standard topic alike.
        raise InvalidParameter("Invalid parameter: Topic Name")
    _check_topic_attributes(attributes, fifo)
    tags = {tag["Key"]: tag.get("Value", "") for tag in call.params.get("Tags") or []}
    topic = pb.Topic(name=name, tags=tags, sns_attributes=attributes)
    try:
        await rpc(call, call.backend.topics.CreateTopic, pb.CreateTopicRequest(topic=topic))
    except AwsError as error:
        # CreateTopic is idempotent in SNS: the existing topic's ARN.
        if "already exists" not in error.message:
            raise
    return {"TopicArn": arns.topic_arn(call.settings, name)}


def _check_topic_attributes(attributes: dict[str, str], fifo: bool) -> None:
    for name, value in attributes.items():
        if name not in _KEPT_TOPIC_ATTRIBUTES:
            raise InvalidParameter(
                f"Invalid parameter: AttributeName Reason: {name[:100]} is not a topic attribute"
            )
        if name in ("ContentBasedDeduplication", "FifoThroughputScope") and not fifo:
            raise InvalidParameter(
                f"Invalid parameter: Attributes Reason: {name} is for FIFO topics only"
            )
        if name == "ContentBasedDeduplication":
            boolean(name, value)
        if name == "SignatureVersion" and value and value not in SIGNATURE_VERSIONS:
            raise InvalidParameter(
                "Invalid parameter: Attributes Reason: SignatureVersion must be 1 or 2, "
                f"not {quoted(value)}"
            )


@action("DeleteTopic")
async def delete_topic(call: Call) -> Result:
    try:
        # Another account's topic (another tenant's) is, to the caller, a missing one.
        topic = arns.topic_of(required(call, "TopicArn"), call.settings)
        await rpc(call, call.backend.topics.DeleteTopic, pb.DeleteTopicRequest(name=topic))
    except AwsError as error:
        if error.kind is not NOT_FOUND:  # deleting a missing topic is no error in SNS
            raise
    return {}


@action("ListTopics")
async def list_topics(call: Call) -> Result:
    response = await rpc(
        call, call.backend.topics.ListTopics,
        pb.ListTopicsRequest(page_size=PAGE, page_token=next_token(call)),
    )  # fmt: skip
    result: Result = {
        "Topics": [{"TopicArn": arns.topic_arn(call.settings, t.name)} for t in response.topics]
    }
    if response.next_page_token:
        result["NextToken"] = response.next_page_token
    return result


@action("GetTopicAttributes")
async def get_topic_attributes(call: Call) -> Result:
    name = arns.topic_of(required(call, "TopicArn"), call.settings)
    topic = await get_topic(call, name)
    every = await all_subscriptions(call, name)
    subscriptions = [s for s in every if not unsubscribed(s)]
    pending = sum(1 for s in subscriptions if s.suspended)
    arn = arns.topic_arn(call.settings, name)
    attributes = {
        "TopicArn": arn,
        "Owner": call.settings.account_id,
        "DisplayName": "",
        "Policy": default_policy(call, arn),
        "SubscriptionsConfirmed": str(len(subscriptions) - pending),
        "SubscriptionsPending": str(pending),
        # Unsubscribed, still restorable by the UnsubscribeConfirmation's token.
        "SubscriptionsDeleted": str(len(every) - len(subscriptions)),
        "EffectiveDeliveryPolicy": json.dumps(
            {"http": {"defaultHealthyRetryPolicy": {"numRetries": 20}}}, separators=(",", ":")
        ),
    }
    if is_fifo(name):
        attributes["FifoTopic"] = "true"
        attributes["ContentBasedDeduplication"] = "false"
    attributes.update(topic.sns_attributes)
    return {"Attributes": attributes}


@action("SetTopicAttributes")
async def set_topic_attributes(call: Call) -> Result:
    name = arns.topic_of(required(call, "TopicArn"), call.settings)
    attribute = required(call, "AttributeName")
    value = call.params.get("AttributeValue") or ""
    _check_topic_attributes({attribute: value}, is_fifo(name))
    topic = await get_topic(call, name)
    kept = dict(topic.sns_attributes)
    if value:
        kept[attribute] = value
    else:
        kept.pop(attribute, None)
    await update_topic(call, pb.Topic(name=name, sns_attributes=kept), "sns_attributes")
    return {}
