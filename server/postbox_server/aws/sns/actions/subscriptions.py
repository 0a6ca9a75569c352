"""The SNS actions on subscriptions: subscribe (and confirm), unsubscribe, list, and
their attributes."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
import uuid
from typing import Any
from urllib.parse import urlencode, urlsplit

from google.protobuf import field_mask_pb2
from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws.arns import queue_arn, queue_from_arn
from postbox_server.aws.call import Call, Result
from postbox_server.aws.errors import QUEUE_DOES_NOT_EXIST, AwsError, of_another_account
from postbox_server.aws.sns import arns, confirmations
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
)
from postbox_server.aws.sns.errors import (
    NOT_FOUND,
    InvalidParameter,
    not_found,
)
from postbox_server.sns_signing import signature_version

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


# Where a confirmed subscription keeps the digest of the token that confirmed it, so
# that only that token confirms it again ("" when none may: a restored subscription
# whose confirming token was not kept).
_CONFIRMED_DIGEST = "postbox:ConfirmedTokenSha256"


# An unsubscribed http/https subscription leaves a suspended copy of the same name,
# hidden from the SNS API, until its UnsubscribeConfirmation's token restores it or
# RESTORE_PERIOD has passed: the copy keeps the digest of that token, and the Unix time
# it stops restoring.
_RESTORE_DIGEST = "postbox:RestoreTokenSha256"
_RESTORE_UNTIL = "postbox:RestoreUntil"


# As long as AWS's confirmation tokens are valid.
RESTORE_PERIOD = 3 * 24 * 3600


PENDING = "PendingConfirmation"


# A confirmation token's shape: the shim's (a subscription's UUID, ".", 64 hex digits),
# or SNS's (a long run of hex digits).
_TOKEN_SHAPE = re.compile(
    r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}\.[0-9a-f]{64}|[0-9a-f]{64,}"
)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def unsubscribed(subscription: pb.Subscription) -> bool:
    """Whether the subscription was unsubscribed and waits only to be restored."""
    return _RESTORE_DIGEST in subscription.sns_delivery.attributes


def _restorable_until(subscription: pb.Subscription) -> float:
    try:
        return float(subscription.sns_delivery.attributes.get(_RESTORE_UNTIL, "0"))
    except ValueError:
        return 0.0


def _visible(subscriptions: list[pb.Subscription]) -> list[pb.Subscription]:
    """The subscriptions the SNS API shows: not the unsubscribed ones."""
    return [s for s in subscriptions if not unsubscribed(s)]


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
            subscription.sns_delivery.raw = boolean(name, value)
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
    topic_arn = required(call, "TopicArn")
    topic = arns.topic_of(topic_arn, call.settings)
    protocol = required(call, "Protocol")
    endpoint = call.params.get("Endpoint") or ""
    topic_attributes = (await get_topic(call, topic)).sns_attributes  # NotFound first, as SNS
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
    for existing in await all_subscriptions(call, topic):
        same = _protocol(existing)[0] == protocol and (
            existing.queue == subscription.queue
            if protocol == "sqs"
            else existing.webhook.url == endpoint
        )
        if unsubscribed(existing):
            # One subscription per endpoint: subscribing again ends the restore of an
            # unsubscribed one; one past its restore period goes too.
            if same or _restorable_until(existing) < time.time():
                await _delete(call, existing)
            continue
        if same:
            # SNS's Subscribe is idempotent for the same endpoint.
            if existing.suspended:
                return {"SubscriptionArn": "pending confirmation"}
            return {"SubscriptionArn": _arn_of(call, existing)}
    token = None
    if protocol != "sqs" and not confirmations.auto_confirmed(endpoint, call.settings):
        token = secrets.token_hex(32)
        subscription.suspended = True
        subscription.sns_delivery.attributes[_TOKEN_DIGEST] = _digest(token)
    await _saved(
        call, call.backend.topics.CreateSubscription,
        pb.CreateSubscriptionRequest(subscription=subscription), "Attributes Reason: ",
    )  # fmt: skip
    if token is None:
        return {"SubscriptionArn": subscription.sns_delivery.subscription_arn}
    confirmation_token = f"{name}.{token}"
    await confirmations.request(
        call.settings, endpoint, topic_arn, confirmation_token,
        _action_url(call, {"Action": "ConfirmSubscription", "TopicArn": topic_arn,
                           "Token": confirmation_token}),
        signature_version(topic_attributes),
    )  # fmt: skip
    if call.params.get("ReturnSubscriptionArn"):
        return {"SubscriptionArn": subscription.sns_delivery.subscription_arn}
    return {"SubscriptionArn": "pending confirmation"}


# The engine's two complexity problems, and AWS's words for them (localstack's
# AWS-validated snapshots of test_policy_complexity and
# test_sub_filter_policy_nested_property_constraints).
_COMPLEXITY = (
    (re.compile(r"filter policy has \d+ keys with conditions; the limit is 5"),
     "Filter policy can not have more than 5 keys"),
    (re.compile(r"filter policy has \d+ combinations of values; the limit is 150"),
     "Filter policy is too complex"),
)  # fmt: skip


async def _saved(call: Call, method: Any, request: Any, prefix: str) -> None:
    """An RPC that stores a subscription, a too complex filter policy in AWS's words:
    prefix is Subscribe's "Attributes Reason: " or SetSubscriptionAttributes' ""."""
    try:
        await rpc(call, method, request)
    except AwsError as error:
        for problem, text in _COMPLEXITY:
            if problem.search(error.message):
                raise InvalidParameter(f"Invalid parameter: {prefix}FilterPolicy: {text}") from None
        raise


def _subscribed_queue(call: Call, endpoint: str, topic: str) -> str:
    """The queue an sqs subscription's Endpoint names, checked as SNS checks it."""
    if not endpoint.startswith("arn:"):
        raise InvalidParameter("Invalid parameter: SQS endpoint ARN")
    try:
        queue = queue_from_arn(endpoint, call.settings, "Endpoint", any_region=True)
    except AwsError as error:
        if error.kind is not QUEUE_DOES_NOT_EXIST:
            raise
        # A queue of another account (another tenant's): no tenant delivers into
        # another's queues, so SNS's NotFound, as for a queue that is not there.
        raise of_another_account(
            not_found("Invalid parameter: Endpoint Reason: the SQS queue does not exist")
        ) from None
    if is_fifo(queue) and not is_fifo(topic):
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
    topic = arns.topic_of(required(call, "TopicArn"), call.settings)
    token = required(call, "Token")
    name, _, secret = token.partition(".")
    # AWS's words (localstack's AWS-validated snapshot): "Invalid token" for a token not
    # of a token's shape, "Invalid parameter: Token" for a well-formed one that confirms
    # nothing (unknown, or of another topic).
    invalid = InvalidParameter(
        "Invalid parameter: Token" if _TOKEN_SHAPE.fullmatch(token) else "Invalid token"
    )
    try:
        response = await rpc(
            call,
            call.backend.topics.GetSubscription,
            pb.GetSubscriptionRequest(topic=topic, name=name),
        )
    except AwsError:
        raise invalid from None
    subscription = response.subscription
    attributes = subscription.sns_delivery.attributes
    given = _digest(secret)
    if unsubscribed(subscription):
        # The UnsubscribeConfirmation's token: restores the subscription as it was.
        if not secrets.compare_digest(attributes[_RESTORE_DIGEST], given):
            raise invalid
        if _restorable_until(subscription) < time.time():
            await _delete(call, subscription)
            raise invalid
        del attributes[_RESTORE_DIGEST]
        attributes.pop(_RESTORE_UNTIL, None)
        attributes.setdefault(_CONFIRMED_DIGEST, "")
        subscription.suspended = False
        await _update_delivery(call, subscription)
    elif subscription.suspended:
        digest = attributes.get(_TOKEN_DIGEST)
        if digest is None or not secrets.compare_digest(digest, given):
            raise invalid
        del attributes[_TOKEN_DIGEST]
        attributes[_CONFIRMED_DIGEST] = given
        subscription.suspended = False
        await _update_delivery(call, subscription)
    elif _CONFIRMED_DIGEST in attributes and not secrets.compare_digest(
        attributes[_CONFIRMED_DIGEST], given
    ):
        # Confirmed: its own token confirms it again, no other (a spent restore token).
        raise invalid
    return {"SubscriptionArn": _arn_of(call, subscription)}


async def _update_delivery(call: Call, subscription: pb.Subscription) -> None:
    await rpc(
        call, call.backend.topics.UpdateSubscription,
        pb.UpdateSubscriptionRequest(
            subscription=subscription,
            update_mask=field_mask_pb2.FieldMask(paths=["suspended", "sns_delivery"]),
        ),
    )  # fmt: skip


async def _delete(call: Call, subscription: pb.Subscription) -> None:
    try:
        await rpc(
            call, call.backend.topics.DeleteSubscription,
            pb.DeleteSubscriptionRequest(topic=subscription.topic, name=subscription.name),
        )  # fmt: skip
    except AwsError as error:
        if error.kind is not NOT_FOUND:  # gone already: as wanted
            raise


async def _subscription(call: Call) -> pb.Subscription:
    topic, name = arns.subscription_of(required(call, "SubscriptionArn"), call.settings)
    try:
        response = await rpc(
            call,
            call.backend.topics.GetSubscription,
            pb.GetSubscriptionRequest(topic=topic, name=name),
        )
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Subscription does not exist") from None
        raise
    if unsubscribed(response.subscription):
        raise not_found("Subscription does not exist")
    return response.subscription


@action("Unsubscribe")
async def unsubscribe(call: Call) -> Result:
    subscription = await _subscription(call)
    await _delete(call, subscription)  # and its pending deliveries, as on AWS
    if subscription.HasField("webhook") and not subscription.suspended:
        # As SNS: the endpoint hears that it was unsubscribed, and the token it gets
        # restores the subscription within RESTORE_PERIOD. Till then a copy stays, of
        # the same name (so ARN), suspended (publishes pass it by), with the token's
        # digest, hidden from the SNS API; Subscribe drops it once the period is over.
        # Its webhook secret is a new one, which the SNS API never shows anyway.
        secret = secrets.token_hex(32)
        kept = pb.Subscription()
        kept.CopyFrom(subscription)
        kept.ClearField("create_time")
        kept.webhook.secret = ""
        kept.sns_delivery.attributes[_RESTORE_DIGEST] = _digest(secret)
        kept.sns_delivery.attributes[_RESTORE_UNTIL] = str(int(time.time()) + RESTORE_PERIOD)
        kept.suspended = True
        await rpc(
            call, call.backend.topics.CreateSubscription,
            pb.CreateSubscriptionRequest(subscription=kept),
        )  # fmt: skip
        topic_arn = subscription.sns_delivery.topic_arn or arns.topic_arn(
            call.settings, subscription.topic
        )
        token = f"{subscription.name}.{secret}"
        topic_attributes = (await get_topic(call, subscription.topic)).sns_attributes
        await confirmations.unsubscribed(
            call.settings, subscription.webhook.url, topic_arn, _arn_of(call, subscription),
            token,
            _action_url(call, {"Action": "ConfirmSubscription", "TopicArn": topic_arn,
                               "Token": token}),
            signature_version(topic_attributes),
        )  # fmt: skip
    return {}


@action("ListSubscriptionsByTopic")
async def list_subscriptions_by_topic(call: Call) -> Result:
    topic = arns.topic_of(required(call, "TopicArn"), call.settings)
    await get_topic(call, topic)
    response = await rpc(
        call, call.backend.topics.ListSubscriptions,
        pb.ListSubscriptionsRequest(topic=topic, page_size=PAGE, page_token=next_token(call)),
    )  # fmt: skip
    result: Result = {
        "Subscriptions": [_entry(call, s) for s in _visible(list(response.subscriptions))]
    }
    if response.next_page_token:
        result["NextToken"] = response.next_page_token
    return result


@action("ListSubscriptions")
async def list_subscriptions(call: Call) -> Result:
    # Every topic's subscriptions, in topic order; NextToken is the next topic's name.
    start = next_token(call)
    entries: list[Result] = []
    page_token = ""
    while True:
        response = await rpc(
            call, call.backend.topics.ListTopics,
            pb.ListTopicsRequest(page_size=1000, page_token=page_token),
        )  # fmt: skip
        for topic in response.topics:
            if topic.name < start:
                continue
            if len(entries) >= PAGE:
                return {"Subscriptions": entries, "NextToken": topic.name}
            subscriptions = _visible(await all_subscriptions(call, topic.name))
            entries.extend(_entry(call, s) for s in subscriptions)
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
        (k, v)
        for k, v in subscription.sns_delivery.attributes.items()
        if not k.startswith("postbox:")
    )
    return {"Attributes": attributes}


@action("SetSubscriptionAttributes")
async def set_subscription_attributes(call: Call) -> Result:
    subscription = await _subscription(call)
    name = required(call, "AttributeName")
    value = call.params.get("AttributeValue") or ""
    if name not in _SUBSCRIPTION_ATTRIBUTES:
        raise InvalidParameter(
            f"Invalid parameter: AttributeName Reason: {name[:100]} is not a subscription attribute"
        )
    _apply_attributes(subscription, {name: value})
    # Each attribute changes its own field only: a scope set before (or without) a
    # policy is kept when the policy comes.
    paths = {"FilterPolicy": ["filter_policy"], "FilterPolicyScope": ["filter_policy_scope"]}
    await _saved(
        call, call.backend.topics.UpdateSubscription,
        pb.UpdateSubscriptionRequest(
            subscription=subscription,
            update_mask=field_mask_pb2.FieldMask(paths=paths.get(name, ["sns_delivery"])),
        ),
        "",
    )  # fmt: skip
    return {}
