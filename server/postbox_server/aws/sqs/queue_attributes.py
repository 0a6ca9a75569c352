"""Queue attributes: SQS's names and string values, postbox's Queue fields."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.aws import policies
from postbox_server.aws.arns import is_foreign
from postbox_server.aws.errors import AwsError, invalid_parameter, of_another_account
from postbox_server.aws.settings import ShimSettings
from postbox_server.aws.sqs import naming
from postbox_server.aws.sqs.errors import INVALID_ATTRIBUTE_NAME, INVALID_ATTRIBUTE_VALUE
from postbox_server.errors import quoted

Permission = qpb.RedriveAllowPolicy.Permission


def unknown(name: str) -> AwsError:
    return AwsError(INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")


def invalid_value(name: str, why: str) -> AwsError:
    return AwsError(
        INVALID_ATTRIBUTE_VALUE, f"Invalid value for the parameter {name}. Reason: {why}"
    )


def is_fifo(queue_name: str) -> bool:
    return queue_name.endswith(".fifo")


class Attribute:
    """One settable SQS attribute: how its text sets a Queue field, and reads back."""

    def __init__(self, field: str | None = None, fifo_only: bool = False) -> None:
        # The Queue field it sets (the UpdateQueue mask path); None: nothing to store.
        self.field = field
        # SQS knows the attribute on FIFO queues only.
        self.fifo_only = fifo_only

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        raise NotImplementedError

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        raise NotImplementedError


class Whole(Attribute):
    """A whole number within SQS's bounds; seconds when the field is a Duration."""

    field: str

    def __init__(self, field: str, low: int, high: int, seconds: bool = True) -> None:
        super().__init__(field)
        self.low, self.high, self.seconds = low, high, seconds

    def value(self, name: str, text: str) -> int:
        if not text.isascii() or not text.isdigit():
            raise invalid_value(name, f"must be a whole number, not {quoted(text)}.")
        value = int(text)
        if not self.low <= value <= self.high:
            raise invalid_value(name, f"must be {self.low} to {self.high}, not {value}.")
        return value

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        value = self.value(name, text)
        if self.seconds:
            getattr(queue, self.field).FromTimedelta(timedelta(seconds=value))
        else:
            setattr(queue, self.field, value)

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str:
        if self.seconds:
            return str(int(getattr(queue, self.field).ToTimedelta().total_seconds()))
        return str(getattr(queue, self.field))


class RetentionPeriod(Whole):
    """MessageRetentionPeriod: the period of the queue's Retention. A queue that keeps
    messages forever (made through the gRPC API; SQS has no such queue) shows 0."""

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        queue.retention.period.FromTimedelta(timedelta(seconds=self.value(name, text)))

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str:
        return str(int(queue.retention.period.ToTimedelta().total_seconds()))


class Flag(Attribute):
    field: str

    def __init__(self, field: str, fifo_only: bool = False) -> None:
        super().__init__(field, fifo_only)

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text.lower() not in ("true", "false"):
            raise invalid_value(name, f"must be true or false, not {quoted(text)}.")
        setattr(queue, self.field, text.lower() == "true")

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str:
        return "true" if getattr(queue, self.field) else "false"


class Choice(Attribute):
    """One of SQS's words, each a value of the field's enum (the first: its default)."""

    field: str

    def __init__(self, field: str, values: Mapping[str, int], fifo_only: bool = False) -> None:
        super().__init__(field, fifo_only)
        self.values = values

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text not in self.values:
            raise invalid_value(name, f"must be {' or '.join(self.values)}, not {quoted(text)}.")
        setattr(queue, self.field, self.values[text])

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str:
        value = getattr(queue, self.field)
        return next((word for word, known in self.values.items() if known == value),
                    next(iter(self.values)))  # fmt: skip


class Fixed(Attribute):
    """An SQS choice postbox has one answer to: only that value is accepted."""

    def __init__(self, value: str, why: str, fifo_only: bool = False, listed: bool = True) -> None:
        super().__init__(fifo_only=fifo_only)
        self.value = value
        self.why = why
        # Whether GetQueueAttributes shows it; SQS leaves out unset policies and keys.
        self.listed = listed

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text != self.value:
            raise invalid_value(name, f"postbox supports only {self.value!r}: {self.why}")

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        return self.value if self.listed else None


class FifoQueue(Attribute):
    """Whether a queue is FIFO: fixed by its name, so it can only be confirmed."""

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text.lower() not in ("true", "false"):
            raise invalid_value(name, f"must be true or false, not {quoted(text)}.")
        if (text.lower() == "true") != is_fifo(queue.name):
            raise invalid_value(
                name,
                "a FIFO queue's name ends with .fifo, a standard queue's does not, and a queue's "
                "type cannot change.",
            )

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        return "true" if queue.fifo else None


def _json(name: str, text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise invalid_value(name, "must be a JSON object.") from None
    if not isinstance(value, dict):
        raise invalid_value(name, "must be a JSON object.")
    return value


class RedrivePolicy(Attribute):
    def __init__(self) -> None:
        super().__init__("dead_letter_policy")

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text == "":
            return  # unset: no dead-letter queue
        policy = _json(name, text)
        target, count = policy.get("deadLetterTargetArn"), policy.get("maxReceiveCount")
        if not isinstance(target, str):
            raise invalid_value(name, "deadLetterTargetArn is required.")
        if isinstance(count, str) and count.isdigit():
            count = int(count)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
            raise invalid_value(name, "maxReceiveCount must be 1 to 1000.")
        if is_foreign(target, settings):
            # Another account's (another tenant's): SQS's refusal, whether it exists or not.
            raise of_another_account(
                invalid_parameter(
                    f"Value {quoted(target)} for parameter {name} is invalid. "
                    "Reason: Dead-letter target owner should be same as the source."
                )
            )
        dead_letter_queue = naming.queue_from_arn(target, settings, "deadLetterTargetArn")
        queue.dead_letter_policy.CopyFrom(
            qpb.DeadLetterPolicy(dead_letter_queue=dead_letter_queue, max_receive_count=count)
        )

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        if not queue.HasField("dead_letter_policy"):
            return None
        policy = queue.dead_letter_policy
        return json.dumps(
            {
                "deadLetterTargetArn": naming.queue_arn(settings, policy.dead_letter_queue),
                "maxReceiveCount": policy.max_receive_count,
            },
            separators=(",", ":"),
        )


_PERMISSIONS = {
    "allowAll": qpb.RedriveAllowPolicy.PERMISSION_ALLOW_ALL,
    "denyAll": qpb.RedriveAllowPolicy.PERMISSION_DENY_ALL,
    "byQueue": qpb.RedriveAllowPolicy.PERMISSION_BY_QUEUE,
}


class RedriveAllowPolicy(Attribute):
    def __init__(self) -> None:
        super().__init__("redrive_allow_policy")

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text == "":
            return  # unset: every queue may use this one
        policy = _json(name, text)
        permission = policy.get("redrivePermission")
        if permission not in _PERMISSIONS:
            raise invalid_value(name, "redrivePermission must be allowAll, denyAll or byQueue.")
        arns = policy.get("sourceQueueArns", [])
        if not isinstance(arns, list) or not all(isinstance(arn, str) for arn in arns):
            raise invalid_value(name, "sourceQueueArns must be a list of queue ARNs.")
        if (permission == "byQueue") != bool(arns) or len(arns) > 10:
            raise invalid_value(
                name, "byQueue takes 1 to 10 sourceQueueArns; allowAll and denyAll take none."
            )
        sources = [naming.queue_from_arn(arn, settings, "sourceQueueArns") for arn in arns]
        queue.redrive_allow_policy.CopyFrom(
            qpb.RedriveAllowPolicy(permission=_PERMISSIONS[permission], source_queues=sources)
        )

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        policy = queue.redrive_allow_policy
        # postbox's default (every queue may) is what SQS means by no policy.
        if policy.permission in (
            qpb.RedriveAllowPolicy.PERMISSION_UNSPECIFIED,
            qpb.RedriveAllowPolicy.PERMISSION_ALLOW_ALL,
        ):
            return None
        value: dict[str, Any] = {
            "redrivePermission": next(k for k, v in _PERMISSIONS.items() if v == policy.permission)
        }
        if policy.source_queues:
            value["sourceQueueArns"] = [
                naming.queue_arn(settings, source) for source in policy.source_queues
            ]
        return json.dumps(value, separators=(",", ":"))


class Policy(Attribute):
    """The queue's access policy document: kept and returned, not enforced (see
    postbox_server/aws/policies.py); an empty value removes it."""

    def __init__(self) -> None:
        super().__init__("access_policy")

    def put(self, name: str, text: str, queue: qpb.Queue, settings: ShimSettings) -> None:
        if text and policies.load(text) is None:
            raise invalid_value(name, "must be a JSON object (a policy document).")
        size = len(text.encode())
        if size > policies.MAX_POLICY_BYTES:
            raise invalid_value(
                name, f"must be at most {policies.MAX_POLICY_BYTES} bytes, not {size}."
            )
        queue.access_policy = text

    def get(self, queue: qpb.Queue, settings: ShimSettings) -> str | None:
        return queue.access_policy or None


# Settable SQS attributes, in the order GetQueueAttributes lists them.
SETTABLE: dict[str, Attribute] = {
    "DelaySeconds": Whole("delivery_delay", 0, 900),
    "MaximumMessageSize": Whole("max_message_size", 1024, 1024 * 1024, seconds=False),
    "MessageRetentionPeriod": RetentionPeriod("retention", 60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": Whole("receive_wait_time", 0, 20),
    "VisibilityTimeout": Whole("visibility_timeout", 0, 43_200),
    "RedrivePolicy": RedrivePolicy(),
    "RedriveAllowPolicy": RedriveAllowPolicy(),
    # SQS knows FifoQueue on FIFO queues only: on a standard queue, even "false" is
    # InvalidAttributeName ("Unknown Attribute FifoQueue.").
    "FifoQueue": FifoQueue(fifo_only=True),
    "ContentBasedDeduplication": Flag("content_based_deduplication", fifo_only=True),
    "DeduplicationScope": Choice(
        "deduplication_scope",
        {
            "queue": qpb.DEDUPLICATION_SCOPE_QUEUE,
            "messageGroup": qpb.DEDUPLICATION_SCOPE_MESSAGE_GROUP,
        },
        fifo_only=True,
    ),
    "FifoThroughputLimit": Choice(
        "fifo_throughput_limit",
        {
            "perQueue": qpb.FIFO_THROUGHPUT_LIMIT_PER_QUEUE,
            "perMessageGroupId": qpb.FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID,
        },
        fifo_only=True,
    ),
    "Policy": Policy(),
    # Known to SQS, so not InvalidAttributeName; the values that mean "none" are
    # accepted (tools such as Terraform send them), any other is InvalidAttributeValue.
    "SqsManagedSseEnabled": Fixed(
        "false", "encryption at rest is the database's, not the queue's."
    ),
    "KmsMasterKeyId": Fixed("", "queues are not encrypted with KMS keys.", listed=False),
    "KmsDataKeyReusePeriodSeconds": Fixed(
        "300", "queues are not encrypted with KMS keys (300 is SQS's default).", listed=False
    ),
}
READ_ONLY = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)


def named(attributes: Mapping[str, str]) -> dict[str, str]:
    """The attributes of a CreateQueue or SetQueueAttributes, their names without the
    spaces around them ("VisibilityTimeout " sets VisibilityTimeout, as code written
    against AWS and moto's suites both send it)."""
    trimmed: dict[str, str] = {}
    for name, text in attributes.items():
        if name.strip() in trimmed:
            raise AwsError(
                INVALID_ATTRIBUTE_NAME, f"Attribute {name.strip()} is given more than once."
            )
        trimmed[name.strip()] = text
    return trimmed


def _attribute(name: str, queue_name: str) -> Attribute:
    attribute = SETTABLE.get(name)
    if attribute is None or (attribute.fifo_only and not is_fifo(queue_name)):
        raise unknown(name)
    return attribute


def to_queue(
    name: str, attributes: Mapping[str, str], settings: ShimSettings
) -> tuple[qpb.Queue, list[str]]:
    """A Queue carrying the given attributes, and the fields they set (an update mask)."""
    queue = qpb.Queue(name=name)
    paths = []
    for attribute_name, text in attributes.items():
        attribute = _attribute(attribute_name, name)
        attribute.put(attribute_name, text, queue, settings)
        if attribute.field is not None:
            paths.append(attribute.field)
    return queue, paths


def conflicting(
    requested: Mapping[str, str], existing: qpb.Queue, settings: ShimSettings
) -> str | None:
    """The first requested attribute whose value differs from the existing queue's."""
    wanted, _ = to_queue(existing.name, requested, settings)
    wanted.fifo = existing.fifo
    for name in requested:
        attribute = SETTABLE[name]
        if attribute.get(wanted, settings) != attribute.get(existing, settings):
            return name
    return None


def describe(queue: qpb.Queue, names: Iterable[str], settings: ShimSettings) -> dict[str, str]:
    """The named attributes of a queue ("All" for every one) as SQS strings."""
    names = list(names)
    for name in names:
        if name not in ("All", *READ_ONLY):
            _attribute(name, queue.name)
    every = "All" in names
    values: dict[str, str | None] = {
        name: attribute.get(queue, settings)
        for name, attribute in SETTABLE.items()
        if not attribute.fifo_only or queue.fifo
    }
    values.update(
        ApproximateNumberOfMessages=str(queue.stats.visible_messages),
        ApproximateNumberOfMessagesNotVisible=str(queue.stats.in_flight_messages),
        ApproximateNumberOfMessagesDelayed=str(queue.stats.delayed_messages),
        CreatedTimestamp=str(queue.create_time.seconds),
        LastModifiedTimestamp=str(queue.update_time.seconds),
        QueueArn=naming.queue_arn(settings, queue.name),
    )
    return {
        name: value
        for name, value in values.items()
        if value is not None and (every or name in names)
    }
