"""Topic and subscription ARNs: how SNS names postbox topics and subscriptions, and back."""

from __future__ import annotations

from postbox_server.aws.errors import of_another_account
from postbox_server.aws.settings import ShimSettings
from postbox_server.aws.sns.errors import InvalidParameter, not_found
from postbox_server.errors import quoted


def topic_arn(settings: ShimSettings, topic: str) -> str:
    return f"arn:aws:sns:{settings.region}:{settings.account_id}:{topic}"


def subscription_arn(settings: ShimSettings, topic: str, subscription: str) -> str:
    return f"{topic_arn(settings, topic)}:{subscription}"


def _parts(arn: str, parameter: str, count: int) -> list[str]:
    parts = arn.split(":")
    if (
        len(parts) == count
        and parts[0] == "arn"
        and all(parts[1:])
        and parts[1:3] != ["aws", "sns"]
    ):
        # SNS checks an ARN's shape only, then looks it up: a well-formed ARN of another
        # service (an sqs: one given as a SubscriptionArn) names nothing there.
        raise not_found(f"{'Topic' if count == 6 else 'Subscription'} does not exist")
    if len(parts) < 6:
        # AWS's words (localstack's AWS-validated snapshots of test_publish_wrong_arn_format
        # and test_unsubscribe_wrong_arn_format).
        raise InvalidParameter(
            f"Invalid parameter: {parameter} Reason: An ARN must have at least 6 elements, "
            f"not {len(parts)}"
        )
    if len(parts) != count or parts[:3] != ["arn", "aws", "sns"] or not all(parts[3:]):
        raise InvalidParameter(
            f"Invalid parameter: {parameter} Reason: {quoted(arn)} is not an ARN of "
            f"{'a topic' if count == 6 else 'a subscription'}"
        )
    return parts


def _ours(parts: list[str], settings: ShimSettings, what: str) -> None:
    """NotFound for an ARN of another region or account (another tenant's, or none), in
    SNS's words for a missing one: nothing tells whether it is there."""
    if parts[3] != settings.region or parts[4] != settings.account_id:
        raise of_another_account(not_found(f"{what} does not exist"))


def topic_of(arn: str, settings: ShimSettings, parameter: str = "TopicArn") -> str:
    """The topic a topic ARN names."""
    parts = _parts(arn, parameter, 6)
    _ours(parts, settings, "Topic")
    return parts[5]


def subscription_of(
    arn: str, settings: ShimSettings, parameter: str = "SubscriptionArn"
) -> tuple[str, str]:
    """(topic, subscription) of a subscription ARN."""
    parts = _parts(arn, parameter, 7)
    _ours(parts, settings, "Subscription")
    return parts[5], parts[6]
