"""Queue names and URLs: how SQS names a postbox queue, and back (ARNs: aws/arns.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

from postbox_server.aws.arns import existing_queue_name, is_queue_name, queue_arn, queue_from_arn
from postbox_server.aws.errors import invalid_parameter, of_another_account, queue_does_not_exist
from postbox_server.aws.settings import ShimSettings


def new_queue_name(name: str) -> str:
    """A name for a queue to create; InvalidParameterValue, as SQS says, if it cannot be one."""
    if not is_queue_name(name):
        raise invalid_parameter(  # SQS's words, verbatim
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
        )
    return name


def queue_url(base_url: str, settings: ShimSettings, name: str) -> str:
    return f"{base_url.rstrip('/')}/{settings.account_id}/{name}"


def queue_from_path(path: str, settings: ShimSettings) -> str:
    """The queue of a URL path `/<account>/<name>`; QueueDoesNotExist for another account."""
    parts = path.strip("/").split("/")
    if len(parts) != 2 or not parts[1]:
        raise queue_does_not_exist()
    account, name = parts
    if account != settings.account_id:
        raise of_another_account(queue_does_not_exist())
    return existing_queue_name(name)


def queue_from_url(url: str, settings: ShimSettings) -> str:
    """The queue a QueueUrl names, whatever host it uses (clients may reach us by any).
    A bare queue name is accepted too, as SQS accepts it (boto3's Queue resource made
    from a name sends the name as its URL)."""
    if "/" not in url:
        return existing_queue_name(url)
    return queue_from_path(urlsplit(url).path, settings)


__all__ = [
    "existing_queue_name", "is_queue_name", "new_queue_name", "queue_arn", "queue_from_arn",
    "queue_from_path", "queue_from_url", "queue_url",
]  # fmt: skip
