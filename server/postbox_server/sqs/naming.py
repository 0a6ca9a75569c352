"""Queue URLs and ARNs: how SQS names a postbox queue, and back."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from postbox_server.errors import quoted
from postbox_server.queue_names import MAX_QUEUE_NAME
from postbox_server.sqs.errors import SqsError, invalid_parameter, queue_does_not_exist
from postbox_server.sqs.settings import ShimSettings

# The engine's rule (postbox.queue_name_problem), which is SQS's.
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]+(\.fifo)?")


def is_queue_name(name: str) -> bool:
    return len(name) <= MAX_QUEUE_NAME and _QUEUE_NAME.fullmatch(name) is not None


def new_queue_name(name: str) -> str:
    """A name for a queue to create; InvalidParameterValue, as SQS says, if it cannot be one."""
    if not is_queue_name(name):
        raise invalid_parameter(  # SQS's words, verbatim
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    return name


def existing_queue_name(name: str) -> str:
    """A name to look a queue up by; one no queue can have is QueueDoesNotExist, as in SQS."""
    if not is_queue_name(name):
        raise queue_does_not_exist()
    return name


def queue_url(base_url: str, settings: ShimSettings, name: str) -> str:
    return f"{base_url.rstrip('/')}/{settings.account_id}/{name}"


def queue_arn(settings: ShimSettings, name: str) -> str:
    return f"arn:aws:sqs:{settings.region}:{settings.account_id}:{name}"


def queue_from_path(path: str, settings: ShimSettings) -> str:
    """The queue of a URL path `/<account>/<name>`; QueueDoesNotExist for another account."""
    parts = path.strip("/").split("/")
    if len(parts) != 2 or not parts[1]:
        raise queue_does_not_exist()
    account, name = parts
    if account != settings.account_id:
        raise queue_does_not_exist()
    return existing_queue_name(name)


def queue_from_url(url: str, settings: ShimSettings) -> str:
    """The queue a QueueUrl names, whatever host it uses (clients may reach us by any).
    A bare queue name is accepted too, as SQS accepts it (boto3's Queue resource made
    from a name sends the name as its URL)."""
    if "/" not in url:
        return existing_queue_name(url)
    return queue_from_path(urlsplit(url).path, settings)


def queue_from_arn(arn: str, settings: ShimSettings, parameter: str) -> str:
    """The queue an SQS ARN names; InvalidParameterValue if it is not one of ours."""
    parts = arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", "aws", "sqs"] or not parts[5]:
        raise invalid_parameter(
            f"Value {quoted(arn)} for parameter {parameter} is invalid. "
            "Reason: not an SQS queue ARN."
        )
    if parts[3] != settings.region or parts[4] != settings.account_id:
        raise SqsError(
            queue_does_not_exist().kind,
            f"The specified queue does not exist: {quoted(arn)} "
            f"is not in region {settings.region}, "
            f"account {settings.account_id}.",
        )
    return existing_queue_name(parts[5])
