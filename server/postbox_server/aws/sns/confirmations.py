"""SNS's subscription and unsubscribe confirmations for http and https endpoints.

Subscribe makes the subscription suspended and POSTs a SubscriptionConfirmation to the
endpoint; the endpoint proves it wants the messages by calling the SubscribeURL (or
ConfirmSubscription with the token). Only the token's digest is stored. Endpoints the
operator names with --sns-auto-confirm skip the handshake. Unsubscribe of a confirmed
http or https subscription POSTs an UnsubscribeConfirmation to its endpoint, signed as
the SubscriptionConfirmation is, whose token restores the subscription for 3 days.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from datetime import datetime, timezone

import aiohttp

from postbox_server.aws.settings import ShimSettings
from postbox_server.aws.sns.errors import InvalidParameter
from postbox_server.egress import EgressPolicy, Refused
from postbox_server.sns_signing import certificate_url

log = logging.getLogger(__name__)

# How long the endpoint may take to answer the confirmation POST.
_TIMEOUT = aiohttp.ClientTimeout(total=15)


def auto_confirmed(endpoint: str, settings: ShimSettings) -> bool:
    """Whether the operator lets this endpoint's subscriptions start confirmed."""
    return any(endpoint.startswith(prefix) for prefix in settings.sns_auto_confirm)


async def request(
    settings: ShimSettings,
    endpoint: str,
    topic_arn: str,
    token: str,
    subscribe_url: str,
    version: str,
) -> None:
    """POSTs the SubscriptionConfirmation; InvalidParameter if the egress policy refuses
    the endpoint. A failed POST is logged: the subscription stays pending, as in SNS."""
    policy = EgressPolicy(settings.webhook_allow_cidrs)
    try:
        policy.check_literal_url(endpoint)
        await policy.check_url(endpoint)
    except Refused as refused:
        raise InvalidParameter(f"Invalid parameter: Endpoint Reason: {refused}") from None
    text = (
        f"You have chosen to subscribe to the topic {topic_arn}.\n"
        "To confirm the subscription, visit the SubscribeURL included in this message."
    )
    await _post(
        settings, policy, endpoint, "SubscriptionConfirmation", topic_arn, token, subscribe_url,
        text, version,
    )  # fmt: skip


async def unsubscribed(
    settings: ShimSettings,
    endpoint: str,
    topic_arn: str,
    subscription_arn: str,
    token: str,
    subscribe_url: str,
    version: str,
) -> None:
    """POSTs the UnsubscribeConfirmation of an unsubscribed subscription, as SNS does. The
    subscription is unsubscribed whatever happens: a refused endpoint or a failed POST is
    logged (its token, never delivered, then restores nothing)."""
    policy = EgressPolicy(settings.webhook_allow_cidrs)
    try:
        policy.check_literal_url(endpoint)
        await policy.check_url(endpoint)
    except Refused as refused:
        log.warning("unsubscribe confirmation to %s refused: %s", endpoint[:200], refused)
        return
    text = (
        f"You have chosen to deactivate subscription {subscription_arn}.\n"
        "To cancel this operation and restore the subscription, visit the SubscribeURL "
        "included in this message."
    )
    await _post(
        settings, policy, endpoint, "UnsubscribeConfirmation", topic_arn, token, subscribe_url,
        text, version, subscription_arn,
    )  # fmt: skip


async def _post(
    settings: ShimSettings,
    policy: EgressPolicy,
    endpoint: str,
    message_type: str,
    topic_arn: str,
    token: str,
    subscribe_url: str,
    text: str,
    version: str,
    subscription_arn: str | None = None,
) -> None:
    """POSTs a confirmation message, signed when the shim has a signing key; a failure
    is logged."""
    message_id = str(uuid.uuid4())
    message = {
        "Type": message_type,
        "MessageId": message_id,
        "Token": token,
        "TopicArn": topic_arn,
        "Message": text,
        "SubscribeURL": subscribe_url,
        "Timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
    }
    if settings.sns_signing_key is not None:
        # SNS signs confirmations with the topic's SignatureVersion too.
        message = settings.sns_signing_key.signed(
            message, version, certificate_url(subscribe_url.split("/?", 1)[0])
        )
    body = json.dumps(message)
    headers = {
        "content-type": "text/plain; charset=UTF-8",
        "x-amz-sns-message-type": message_type,
        "x-amz-sns-message-id": message_id,
        "x-amz-sns-topic-arn": topic_arn,
    }
    if subscription_arn is not None:
        headers["x-amz-sns-subscription-arn"] = subscription_arn
    what = "subscription confirmation" if subscription_arn is None else "unsubscribe confirmation"
    connector = aiohttp.TCPConnector(resolver=policy.resolver(), use_dns_cache=False)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(
                endpoint,
                data=body.encode(),
                headers=headers,
                timeout=_TIMEOUT,
                allow_redirects=False,
            ) as response,
        ):
            if response.status >= 300:
                log.warning("%s to %s: HTTP %d", what, endpoint[:200], response.status)
    except (aiohttp.ClientError, OSError, ValueError, asyncio.TimeoutError) as error:
        log.warning("%s to %s failed: %s", what, endpoint[:200], error)
