"""SQS queue ARNs, which both services use: SQS in its attributes and redrive policies,
SNS in the endpoints of its sqs subscriptions."""

from __future__ import annotations

import re

from postbox_server.aws.errors import invalid_parameter, of_another_account, queue_does_not_exist
from postbox_server.aws.settings import ShimSettings
from postbox_server.errors import quoted
from postbox_server.queue_names import MAX_QUEUE_NAME

# The engine's rule (postbox.queue_name_problem), which is SQS's.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]+(\.fifo)?")


def is_queue_name(name: str) -> bool:
    return len(name) <= MAX_QUEUE_NAME and _QUEUE_NAME.fullmatch(name) is not None


def existing_queue_name(name: str) -> str:
    """A name to look a queue up by; one no queue can have is QueueDoesNotExist, as in SQS."""
    if not is_queue_name(name):
        raise queue_does_not_exist()
    return name


def queue_arn(settings: ShimSettings, name: str) -> str:
    """The ARN of a queue of the caller's account (settings of its request: aws/accounts.py)."""
    return f"arn:aws:sqs:{settings.region}:{settings.account_id}:{name}"


def is_foreign(arn: str, settings: ShimSettings) -> bool:
    """Whether an SQS ARN names another region or account than the caller's."""
    parts = arn.split(":")
    return len(parts) == 6 and (parts[3], parts[4]) != (settings.region, settings.account_id)


def queue_from_arn(
    arn: str, settings: ShimSettings, parameter: str, *, any_region: bool = False
) -> str:
    """The queue an SQS ARN names; InvalidParameterValue if it is not one of ours.

    any_region: an ARN of another region than the request's names the caller's queue
    of that name too (every region sees the same queues), as an SNS subscription may
    deliver to a queue of another region; SQS's own references stay in their region."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not (parts[3] and parts[5]):
        raise invalid_parameter(
            f"Value {quoted(arn)} for parameter {parameter} is invalid. "
            "Reason: not an SQS queue ARN."
        )
    if (parts[3] != settings.region and not any_region) or parts[4] != settings.account_id:
        # Another region or account (another tenant's, or none): as a missing queue is,
        # so that nothing tells whether a queue of that name is there.
        raise of_another_account(queue_does_not_exist())
    return existing_queue_name(parts[5])
