"""The SNS actions, each over TopicService calls."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

from google.protobuf import field_mask_pb2
from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws import message_attributes, policies
from postbox_server.aws.arns import queue_arn, queue_from_arn
from postbox_server.aws.call import Actions, Call, Result
from postbox_server.aws.errors import AwsError
from postbox_server.aws.sns import arns, confirmations
from postbox_server.aws.sns.errors import (
    BATCH_ENTRY_IDS_NOT_DISTINCT,
    BATCH_REQUEST_TOO_LONG,
    EMPTY_BATCH_REQUEST,
    INVALID_BATCH_ENTRY_ID,
    INVALID_PARAMETER_VALUE,
    NOT_FOUND,
    RESOURCE_NOT_FOUND,
    STATUS_ERRORS,
    TAG_LIMIT_EXCEEDED,
    TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
    InvalidParameter,
    not_found,
)

HANDLERS = Actions()
action = HANDLERS.action

# SNS's limits.
MAX_MESSAGE_BYTES = 256 * 1024
MAX_BATCH_ENTRIES = 10
MAX_SUBJECT = 100
MAX_TAGS = 50
_PAGE = 100
# Topic attributes SNS lets SetTopicAttributes change, kept as they are given.
_KEPT_TOPIC_ATTRIBUTES = {
    "DisplayName", "Policy", "DeliveryPolicy", "KmsMasterKeyId", "TracingConfig",
    "SignatureVersion", "ContentBasedDeduplication", "ArchivePolicy", "FifoThroughputScope",
    "DataProtectionPolicy",
}  # fmt: skip
# Subscription attributes kept as they are given (the rest are acted on).
_KEPT_SUBSCRIPTION_ATTRIBUTES = {
    "DeliveryPolicy",
    "RedrivePolicy",
    "SubscriptionRoleArn",
    "ReplayPolicy",
}
_SUBSCRIPTION_ATTRIBUTES = {
    "RawMessageDelivery",
    "FilterPolicy",
    "FilterPolicyScope",
    *_KEPT_SUBSCRIPTION_ATTRIBUTES,
}
_SCOPES = {
    "MessageAttributes": pb.FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES,
    "MessageBody": pb.FILTER_POLICY_SCOPE_MESSAGE_BODY,
}
_SCOPE_NAMES = {value: name for name, value in _SCOPES.items()}
# Where a pending subscription keeps the digest of its confirmation token.
_TOKEN_DIGEST = "postbox:ConfirmationTokenSha256"
PENDING = "PendingConfirmation"


async def _call(call: Call, method: Callable[..., Any], request: Any) -> Any:
    return await call.backend.call(method, request, STATUS_ERRORS)


def _required(call: Call, name: str) -> Any:
    value = call.params.get(name)
    if value is None or value == "":
        raise InvalidParameter(f"Invalid parameter: {name} Reason: it is required")
    return value


def _boolean(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise InvalidParameter(
            f"Invalid parameter: Attributes Reason: {name} must be true or false"
        )
    return value.lower() == "true"


def _is_fifo(topic: str) -> bool:
    return topic.endswith(".fifo")


# Topics.


async def _topic(call: Call, topic: str) -> pb.Topic:
    try:
        response = await _call(call, call.backend.topics.GetTopic, pb.GetTopicRequest(name=topic))
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Topic does not exist") from None
        raise
    return response.topic


@action("CreateTopic")
async def create_topic(call: Call) -> Result:
    name = _required(call, "Name")
    attributes = dict(call.params.get("Attributes") or {})
    fifo = _boolean("FifoTopic", attributes.pop("FifoTopic", "false"))
    if fifo != _is_fifo(name):
        raise InvalidParameter(
            "Invalid parameter: Topic Name" if not fifo else
            "Invalid parameter: Fifo Topic names must end with .fifo and must be made up of only "
            "uppercase and lowercase ASCII letters, numbers, underscores, and hyphens, and must "
            "be between 1 and 256 characters long."
        )  # fmt: skip
    _check_topic_attributes(attributes, fifo)
    tags = {tag["Key"]: tag.get("Value", "") for tag in call.params.get("Tags") or []}
    topic = pb.Topic(name=name, tags=tags, sns_attributes=attributes)
    try:
        await _call(call, call.backend.topics.CreateTopic, pb.CreateTopicRequest(topic=topic))
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
            _boolean(name, value)


@action("DeleteTopic")
async def delete_topic(call: Call) -> Result:
    topic = arns.topic_of(_required(call, "TopicArn"), call.settings)
    try:
        await _call(call, call.backend.topics.DeleteTopic, pb.DeleteTopicRequest(name=topic))
    except AwsError as error:
        if error.kind is not NOT_FOUND:  # deleting a missing topic is no error in SNS
            raise
    return {}


def _token(call: Call) -> str:
    return call.params.get("NextToken") or ""


@action("ListTopics")
async def list_topics(call: Call) -> Result:
    response = await _call(
        call, call.backend.topics.ListTopics,
        pb.ListTopicsRequest(page_size=_PAGE, page_token=_token(call)),
    )  # fmt: skip
    result: Result = {
        "Topics": [{"TopicArn": arns.topic_arn(call.settings, t.name)} for t in response.topics]
    }
    if response.next_page_token:
        result["NextToken"] = response.next_page_token
    return result


async def _all_subscriptions(call: Call, topic: str) -> list[pb.Subscription]:
    found: list[pb.Subscription] = []
    token = ""
    while True:
        response = await _call(
            call, call.backend.topics.ListSubscriptions,
            pb.ListSubscriptionsRequest(topic=topic, page_size=1000, page_token=token),
        )  # fmt: skip
        found.extend(response.subscriptions)
        token = response.next_page_token
        if not token:
            return found


@action("GetTopicAttributes")
async def get_topic_attributes(call: Call) -> Result:
    name = arns.topic_of(_required(call, "TopicArn"), call.settings)
    topic = await _topic(call, name)
    subscriptions = await _all_subscriptions(call, name)
    pending = sum(1 for s in subscriptions if s.suspended)
    arn = arns.topic_arn(call.settings, name)
    attributes = {
        "TopicArn": arn,
        "Owner": call.settings.account_id,
        "DisplayName": "",
        "Policy": _default_policy(call, arn),
        "SubscriptionsConfirmed": str(len(subscriptions) - pending),
        "SubscriptionsPending": str(pending),
        "SubscriptionsDeleted": "0",
        "EffectiveDeliveryPolicy": json.dumps(
            {"http": {"defaultHealthyRetryPolicy": {"numRetries": 20}}}, separators=(",", ":")
        ),
    }
    if _is_fifo(name):
        attributes["FifoTopic"] = "true"
        attributes["ContentBasedDeduplication"] = "false"
    attributes.update(topic.sns_attributes)
    return {"Attributes": attributes}


# The actions a topic's policy may grant, in the order of SNS's default policy.
_TOPIC_ACTIONS = (
    "GetTopicAttributes", "SetTopicAttributes", "AddPermission", "RemovePermission",
    "DeleteTopic", "Subscribe", "ListSubscriptionsByTopic", "Publish",
)  # fmt: skip


def _default_policy(call: Call, arn: str) -> str:
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
    name = arns.topic_of(_required(call, "TopicArn"), call.settings)
    topic = await _topic(call, name)
    arn = arns.topic_arn(call.settings, name)
    kept = dict(topic.sns_attributes)
    document = policies.load(kept.get("Policy", "")) or policies.load(_default_policy(call, arn))
    assert document is not None
    kept["Policy"] = policies.dump(edit(document, arn))
    await _update_topic(call, pb.Topic(name=name, sns_attributes=kept), "sns_attributes")


@action("AddPermission")
async def add_permission(call: Call) -> Result:
    label = _required(call, "Label")
    accounts = _required(call, "AWSAccountId")
    actions = _required(call, "ActionName")
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
    label = _required(call, "Label")
    # Removing a label the policy does not have succeeds, as in SNS.
    await _edit_policy(call, lambda document, _arn: policies.remove_statement(document, label))
    return {}


async def _update_topic(call: Call, topic: pb.Topic, path: str) -> None:
    await _call(
        call, call.backend.topics.UpdateTopic,
        pb.UpdateTopicRequest(topic=topic, update_mask=field_mask_pb2.FieldMask(paths=[path])),
    )  # fmt: skip


@action("SetTopicAttributes")
async def set_topic_attributes(call: Call) -> Result:
    name = arns.topic_of(_required(call, "TopicArn"), call.settings)
    attribute = _required(call, "AttributeName")
    value = call.params.get("AttributeValue") or ""
    _check_topic_attributes({attribute: value}, _is_fifo(name))
    topic = await _topic(call, name)
    kept = dict(topic.sns_attributes)
    if value:
        kept[attribute] = value
    else:
        kept.pop(attribute, None)
    await _update_topic(call, pb.Topic(name=name, sns_attributes=kept), "sns_attributes")
    return {}


# Tags.


def _tagged_topic(call: Call) -> str:
    arn = _required(call, "ResourceArn")
    try:
        return arns.topic_of(arn, call.settings, "ResourceArn")
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise AwsError(RESOURCE_NOT_FOUND, "Resource does not exist") from None
        raise


async def _tags(call: Call, name: str) -> dict[str, str]:
    try:
        return dict((await _topic(call, name)).tags)
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise AwsError(RESOURCE_NOT_FOUND, "Resource does not exist") from None
        raise


@action("TagResource")
async def tag_resource(call: Call) -> Result:
    name = _tagged_topic(call)
    tags = await _tags(call, name)
    tags.update({tag["Key"]: tag.get("Value", "") for tag in _required(call, "Tags")})
    if len(tags) > MAX_TAGS:
        raise AwsError(
            TAG_LIMIT_EXCEEDED, "Could not complete request: tag quota of per resource exceeded"
        )
    await _update_topic(call, pb.Topic(name=name, tags=tags), "tags")
    return {}


@action("UntagResource")
async def untag_resource(call: Call) -> Result:
    name = _tagged_topic(call)
    tags = await _tags(call, name)
    for key in _required(call, "TagKeys"):
        tags.pop(key, None)
    await _update_topic(call, pb.Topic(name=name, tags=tags), "tags")
    return {}


@action("ListTagsForResource")
async def list_tags_for_resource(call: Call) -> Result:
    tags = await _tags(call, _tagged_topic(call))
    return {"Tags": [{"Key": key, "Value": value} for key, value in sorted(tags.items())]}


# Subscriptions.


def _protocol(subscription: pb.Subscription) -> tuple[str, str]:
    """(Protocol, Endpoint) of a subscription, as SNS shows them."""
    if subscription.WhichOneof("destination") == "queue":
        return "sqs", ""
    return urlsplit(subscription.webhook.url).scheme, subscription.webhook.url


def _entry(call: Call, subscription: pb.Subscription) -> Result:
    protocol, endpoint = _protocol(subscription)
    if protocol == "sqs":
        endpoint = queue_arn(call.settings, subscription.queue)
    return {
        "SubscriptionArn": PENDING if subscription.suspended else _arn_of(call, subscription),
        "Owner": call.settings.account_id,
        "Protocol": protocol,
        "Endpoint": endpoint,
        "TopicArn": arns.topic_arn(call.settings, subscription.topic),
    }


def _arn_of(call: Call, subscription: pb.Subscription) -> str:
    return arns.subscription_arn(call.settings, subscription.topic, subscription.name)


def _apply_attributes(subscription: pb.Subscription, attributes: dict[str, str]) -> None:
    """Subscription attributes of SNS, into the subscription's fields."""
    for name, value in attributes.items():
        if name not in _SUBSCRIPTION_ATTRIBUTES:
            raise InvalidParameter(
                f"Invalid parameter: Attributes Reason: Unknown attribute {name[:100]}"
            )
        if name == "RawMessageDelivery":
            subscription.sns_delivery.raw = _boolean(name, value)
        elif name == "FilterPolicy":
            if value:
                try:
                    json.loads(value)
                except ValueError:
                    raise InvalidParameter(
                        "Invalid parameter: FilterPolicy: failed to parse JSON"
                    ) from None
            subscription.filter_policy = value
        elif name == "FilterPolicyScope":
            if value not in _SCOPES:
                raise InvalidParameter(
                    "Invalid parameter: Attributes Reason: FilterPolicyScope: Invalid value "
                    f"[{value[:40]}]. Please use either MessageBody or MessageAttributes"
                )
            subscription.filter_policy_scope = _SCOPES[value]
        elif value:
            subscription.sns_delivery.attributes[name] = value
        else:
            subscription.sns_delivery.attributes.pop(name, None)


@action("Subscribe")
async def subscribe(call: Call) -> Result:
    topic_arn = _required(call, "TopicArn")
    topic = arns.topic_of(topic_arn, call.settings)
    protocol = _required(call, "Protocol")
    endpoint = call.params.get("Endpoint") or ""
    await _topic(call, topic)  # NotFound before anything else, as SNS checks
    name = str(uuid.uuid4())
    subscription = pb.Subscription(name=name, topic=topic)
    subscription.sns_delivery.topic_arn = topic_arn
    subscription.sns_delivery.subscription_arn = arns.subscription_arn(call.settings, topic, name)
    subscription.sns_delivery.unsubscribe_url = _action_url(
        call,
        {"Action": "Unsubscribe", "SubscriptionArn": subscription.sns_delivery.subscription_arn},
    )
    if protocol == "sqs":
        subscription.queue = _subscribed_queue(call, endpoint, topic)
    elif protocol in ("http", "https"):
        if urlsplit(endpoint).scheme != protocol:
            raise InvalidParameter(
                f"Invalid parameter: Endpoint must be an {protocol}:// URL for protocol {protocol}"
            )
        subscription.webhook.url = endpoint
    else:
        raise InvalidParameter(
            "Invalid parameter: Protocol Reason: postbox delivers to sqs, http and https "
            f"endpoints, not {protocol[:40]}"
        )
    _apply_attributes(subscription, dict(call.params.get("Attributes") or {}))
    for existing in await _all_subscriptions(call, topic):
        if _protocol(existing)[0] == protocol and (
            existing.queue == subscription.queue
            if protocol == "sqs"
            else existing.webhook.url == endpoint
        ):
            # SNS's Subscribe is idempotent for the same endpoint.
            if existing.suspended:
                return {"SubscriptionArn": "pending confirmation"}
            return {"SubscriptionArn": _arn_of(call, existing)}
    token = None
    if protocol != "sqs" and not confirmations.auto_confirmed(endpoint, call.settings):
        token = secrets.token_hex(32)
        subscription.suspended = True
        subscription.sns_delivery.attributes[_TOKEN_DIGEST] = hashlib.sha256(
            token.encode()
        ).hexdigest()
    await _call(
        call, call.backend.topics.CreateSubscription,
        pb.CreateSubscriptionRequest(subscription=subscription),
    )  # fmt: skip
    if token is None:
        return {"SubscriptionArn": subscription.sns_delivery.subscription_arn}
    confirmation_token = f"{name}.{token}"
    await confirmations.request(
        call.settings, endpoint, topic_arn, confirmation_token,
        _action_url(call, {"Action": "ConfirmSubscription", "TopicArn": topic_arn,
                           "Token": confirmation_token}),
    )  # fmt: skip
    if call.params.get("ReturnSubscriptionArn"):
        return {"SubscriptionArn": subscription.sns_delivery.subscription_arn}
    return {"SubscriptionArn": "pending confirmation"}


def _subscribed_queue(call: Call, endpoint: str, topic: str) -> str:
    """The queue an sqs subscription's Endpoint names, checked as SNS checks it."""
    if not endpoint.startswith("arn:"):
        raise InvalidParameter("Invalid parameter: SQS endpoint ARN")
    queue = queue_from_arn(endpoint, call.settings, "Endpoint")
    if _is_fifo(queue) and not _is_fifo(topic):
        raise InvalidParameter(
            "Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can not be "
            "subscribed to standard SNS topics"
        )
    return queue


def _action_url(call: Call, params: dict[str, str]) -> str:
    base = (call.settings.public_url or call.base_url).rstrip("/")
    return f"{base}/?{urlencode(params)}"


@action("ConfirmSubscription")
async def confirm_subscription(call: Call) -> Result:
    topic = arns.topic_of(_required(call, "TopicArn"), call.settings)
    token = _required(call, "Token")
    name, _, secret = token.partition(".")
    invalid = InvalidParameter("Invalid token")
    try:
        response = await _call(
            call,
            call.backend.topics.GetSubscription,
            pb.GetSubscriptionRequest(topic=topic, name=name),
        )
    except AwsError:
        raise invalid from None
    subscription = response.subscription
    digest = subscription.sns_delivery.attributes.get(_TOKEN_DIGEST)
    if subscription.suspended:
        if digest is None or not secrets.compare_digest(
            digest, hashlib.sha256(secret.encode()).hexdigest()
        ):
            raise invalid
        subscription.suspended = False
        del subscription.sns_delivery.attributes[_TOKEN_DIGEST]
        await _call(
            call, call.backend.topics.UpdateSubscription,
            pb.UpdateSubscriptionRequest(
                subscription=subscription,
                update_mask=field_mask_pb2.FieldMask(paths=["suspended", "sns_delivery"]),
            ),
        )  # fmt: skip
    return {"SubscriptionArn": _arn_of(call, subscription)}


async def _subscription(call: Call) -> pb.Subscription:
    topic, name = arns.subscription_of(_required(call, "SubscriptionArn"), call.settings)
    try:
        response = await _call(
            call,
            call.backend.topics.GetSubscription,
            pb.GetSubscriptionRequest(topic=topic, name=name),
        )
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Subscription does not exist") from None
        raise
    return response.subscription


@action("Unsubscribe")
async def unsubscribe(call: Call) -> Result:
    subscription = await _subscription(call)
    await _call(
        call, call.backend.topics.DeleteSubscription,
        pb.DeleteSubscriptionRequest(topic=subscription.topic, name=subscription.name),
    )  # fmt: skip
    return {}


@action("ListSubscriptionsByTopic")
async def list_subscriptions_by_topic(call: Call) -> Result:
    topic = arns.topic_of(_required(call, "TopicArn"), call.settings)
    await _topic(call, topic)
    response = await _call(
        call, call.backend.topics.ListSubscriptions,
        pb.ListSubscriptionsRequest(topic=topic, page_size=_PAGE, page_token=_token(call)),
    )  # fmt: skip
    result: Result = {"Subscriptions": [_entry(call, s) for s in response.subscriptions]}
    if response.next_page_token:
        result["NextToken"] = response.next_page_token
    return result


@action("ListSubscriptions")
async def list_subscriptions(call: Call) -> Result:
    # Every topic's subscriptions, in topic order; NextToken is the next topic's name.
    start = _token(call)
    entries: list[Result] = []
    page_token = ""
    while True:
        response = await _call(
            call, call.backend.topics.ListTopics,
            pb.ListTopicsRequest(page_size=1000, page_token=page_token),
        )  # fmt: skip
        for topic in response.topics:
            if topic.name < start:
                continue
            if len(entries) >= _PAGE:
                return {"Subscriptions": entries, "NextToken": topic.name}
            entries.extend(_entry(call, s) for s in await _all_subscriptions(call, topic.name))
        page_token = response.next_page_token
        if not page_token:
            return {"Subscriptions": entries}


@action("GetSubscriptionAttributes")
async def get_subscription_attributes(call: Call) -> Result:
    subscription = await _subscription(call)
    entry = _entry(call, subscription)
    attributes = {
        "SubscriptionArn": _arn_of(call, subscription),
        "TopicArn": entry["TopicArn"],
        "Owner": entry["Owner"],
        "Protocol": entry["Protocol"],
        "Endpoint": entry["Endpoint"],
        "ConfirmationWasAuthenticated": "true",
        "PendingConfirmation": "true" if subscription.suspended else "false",
        "RawMessageDelivery": "true" if subscription.sns_delivery.raw else "false",
        "SubscriptionPrincipal": f"arn:aws:iam::{call.settings.account_id}:user/postbox",
    }
    if subscription.filter_policy:
        attributes["FilterPolicy"] = subscription.filter_policy
        attributes["FilterPolicyScope"] = _SCOPE_NAMES.get(
            subscription.filter_policy_scope, "MessageAttributes"
        )
    attributes.update(
        (k, v) for k, v in subscription.sns_delivery.attributes.items() if k != _TOKEN_DIGEST
    )
    return {"Attributes": attributes}


@action("SetSubscriptionAttributes")
async def set_subscription_attributes(call: Call) -> Result:
    subscription = await _subscription(call)
    name = _required(call, "AttributeName")
    value = call.params.get("AttributeValue") or ""
    if name not in _SUBSCRIPTION_ATTRIBUTES:
        raise InvalidParameter(
            f"Invalid parameter: AttributeName Reason: {name[:100]} is not a subscription attribute"
        )
    _apply_attributes(subscription, {name: value})
    # Each attribute changes its own field only: a scope set before (or without) a
    # policy is kept when the policy comes.
    paths = {"FilterPolicy": ["filter_policy"], "FilterPolicyScope": ["filter_policy_scope"]}
    await _call(
        call, call.backend.topics.UpdateSubscription,
        pb.UpdateSubscriptionRequest(
            subscription=subscription,
            update_mask=field_mask_pb2.FieldMask(paths=paths.get(name, ["sns_delivery"])),
        ),
    )  # fmt: skip
    return {}


# Publishing.


def _message_entry(
    params: dict[str, Any], topic: str, content_deduplication: bool
) -> pb.PublishBatchEntry:
    """A Publish's (or a batch entry's) message, checked as SNS checks it."""
    message: str | None = params.get("Message")
    if message is None or message == "":
        raise InvalidParameter("Invalid parameter: Message Reason: Empty message")
    if params.get("MessageStructure") == "json":
        try:
            structure = json.loads(message)
        except ValueError:
            structure = None
        if not isinstance(structure, dict) or not isinstance(structure.get("default"), str):
            raise InvalidParameter(
                "Invalid parameter: Message Structure - No default entry in JSON message body"
            )
        sqs_message = structure.get("sqs")
        message = sqs_message if isinstance(sqs_message, str) else structure["default"]
    elif params.get("MessageStructure"):
        raise InvalidParameter("Invalid parameter: MessageStructure Reason: only json is supported")
    subject = params.get("Subject") or ""
    if len(subject) > MAX_SUBJECT or any(ord(c) < 32 for c in subject):
        raise InvalidParameter("Invalid parameter: Subject")
    try:
        attributes = message_attributes.to_postbox(params.get("MessageAttributes") or {}, {})
    except AwsError as error:
        raise AwsError(INVALID_PARAMETER_VALUE, error.message) from None
    body = message.encode("utf-8")
    size = message_attributes.size(body, attributes)
    if size > MAX_MESSAGE_BYTES:
        raise InvalidParameter(
            f"Invalid parameter: Message too long: {size} bytes; the limit is {MAX_MESSAGE_BYTES}"
        )
    group = params.get("MessageGroupId") or ""
    deduplication = params.get("MessageDeduplicationId") or ""
    if _is_fifo(topic):
        if not group:
            raise InvalidParameter(
                "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
            )
        if not deduplication:
            if not content_deduplication:
                raise InvalidParameter(
                    "Invalid parameter: The topic should either have ContentBasedDeduplication "
                    "enabled or MessageDeduplicationId provided explicitly"
                )
            deduplication = hashlib.sha256(body).hexdigest()
    elif deduplication:
        raise InvalidParameter(
            "Invalid parameter: MessageDeduplicationId Reason: The request includes "
            "MessageDeduplicationId parameter that is not valid for this topic type"
        )
    return pb.PublishBatchEntry(
        body=body, attributes=attributes, subject=subject, ordering_key=group,
        deduplication_id=deduplication,
    )  # fmt: skip


async def _content_deduplication(call: Call, topic: str, entries: list[dict[str, Any]]) -> bool:
    """Whether a FIFO topic deduplicates by content, asked only when an entry needs to know
    (so that publishing otherwise needs the publish grant alone)."""
    if not _is_fifo(topic) or all(e.get("MessageDeduplicationId") for e in entries):
        return False
    attributes = (await _topic(call, topic)).sns_attributes
    return attributes.get("ContentBasedDeduplication", "false").lower() == "true"


async def _published_call(call: Call, method: Callable[..., Any], request: Any) -> Any:
    """A Publish or PublishBatch call; a topic that is not there is SNS's NotFound."""
    try:
        return await _call(call, method, request)
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Topic does not exist") from None
        raise


def _published(response: Any, fifo: bool) -> Result:
    result: Result = {"MessageId": response.publish_id}
    if fifo:
        # SNS numbers a FIFO topic's messages; postbox's ids grow in publish order.
        result["SequenceNumber"] = str(time.time_ns()).zfill(20)
    return result


@action("Publish")
async def publish(call: Call) -> Result:
    arn = call.params.get("TopicArn") or call.params.get("TargetArn")
    if not arn:
        raise InvalidParameter(
            "Invalid parameter: TopicArn or TargetArn Reason: no value for required parameter"
        )
    if call.params.get("PhoneNumber"):
        raise InvalidParameter("Invalid parameter: PhoneNumber Reason: postbox sends no SMS")
    topic = arns.topic_of(arn, call.settings)
    entry = _message_entry(
        call.params, topic, await _content_deduplication(call, topic, [call.params])
    )
    request = pb.PublishRequest(
        topic=topic, body=entry.body, attributes=entry.attributes, subject=entry.subject,
        ordering_key=entry.ordering_key, deduplication_id=entry.deduplication_id,
    )  # fmt: skip
    response = await _published_call(call, call.backend.topics.Publish, request)
    return _published(response, _is_fifo(topic))


@action("PublishBatch")
async def publish_batch(call: Call) -> Result:
    topic = arns.topic_of(_required(call, "TopicArn"), call.settings)
    entries = call.params.get("PublishBatchRequestEntries") or []
    if not entries:
        raise AwsError(EMPTY_BATCH_REQUEST, "The batch request doesn't contain any entries")
    if len(entries) > MAX_BATCH_ENTRIES:
        raise AwsError(
            TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
            "The batch request contains more entries than permissible.",
        )
    ids = [entry.get("Id") or "" for entry in entries]
    if len(set(ids)) != len(ids):
        raise AwsError(
            BATCH_ENTRY_IDS_NOT_DISTINCT,
            "Two or more batch entries in the request have the same Id.",
        )
    for entry_id in ids:
        if (
            not entry_id
            or len(entry_id) > 80
            or not all(c.isalnum() or c in "-_" for c in entry_id)
        ):
            raise AwsError(
                INVALID_BATCH_ENTRY_ID,
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
    total = sum(len((entry.get("Message") or "").encode()) for entry in entries)
    if total > MAX_MESSAGE_BYTES:
        raise AwsError(
            BATCH_REQUEST_TOO_LONG,
            f"The length of all the messages put together is more than the limit ({total} bytes).",
        )
    if _is_fifo(topic) and not all(entry.get("MessageGroupId") for entry in entries):
        raise InvalidParameter(
            "Invalid parameter: The MessageGroupId parameter is required for FIFO topics"
        )
    valid: list[tuple[str, pb.PublishBatchEntry]] = []
    failed: list[Result] = []
    content_deduplication = await _content_deduplication(call, topic, entries)
    for entry in entries:
        try:
            valid.append((entry["Id"], _message_entry(entry, topic, content_deduplication)))
        except AwsError as error:
            failed.append(
                {
                    "Id": entry["Id"],
                    "Code": error.kind.code,
                    "Message": error.message,
                    "SenderFault": True,
                }
            )
    successful: list[Result] = []
    if valid:
        # One transaction: the valid entries are published together or not at all.
        response = await _published_call(
            call, call.backend.topics.PublishBatch,
            pb.PublishBatchRequest(topic=topic, entries=[e for _, e in valid]),
        )  # fmt: skip
        for (entry_id, _), result in zip(valid, response.results, strict=True):
            successful.append({"Id": entry_id, **_published(result, _is_fifo(topic))})
    return {"Successful": successful, "Failed": failed}
