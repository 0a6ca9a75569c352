"""Queue attributes: SQS's names and string values, postbox's Queue fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from postbox.v1 import queue_service_pb2 as qpb

from server.sqs import naming
from server.sqs.errors import INVALID_ATTRIBUTE_NAME, INVALID_ATTRIBUTE_VALUE, SqsError
from server.sqs.settings import ShimSettings


@dataclass(frozen=True)
class Setting:
    field: str
    low: int
    high: int
    # A Duration field in postbox (seconds in SQS), else a plain integer.
    duration: bool = True


# SQS attribute -> postbox Queue field, with SQS's limits.
SETTINGS = {
    "DelaySeconds": Setting("delivery_delay", 0, 900),
    "MaximumMessageSize": Setting("max_message_size", 1024, 1024 * 1024, duration=False),
    "MessageRetentionPeriod": Setting("retention", 60, 1_209_600),
    "ReceiveMessageWaitTimeSeconds": Setting("receive_wait_time", 0, 20),
    "VisibilityTimeout": Setting("visibility_timeout", 0, 43_200),
}
READ_ONLY = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
    "QueueArn",
)


def unknown(name: str) -> SqsError:
    return SqsError(INVALID_ATTRIBUTE_NAME, f"Unknown Attribute {name}.")


def invalid_value(name: str, why: str) -> SqsError:
    return SqsError(
        INVALID_ATTRIBUTE_VALUE, f"Invalid value for the parameter {name}. Reason: {why}"
    )


def to_queue(name: str, attributes: Mapping[str, str]) -> tuple[qpb.Queue, list[str]]:
    """A Queue carrying the given attributes, and the fields they set (an update mask)."""
    queue = qpb.Queue(name=name)
    paths = []
    for attribute, text in attributes.items():
        setting = SETTINGS.get(attribute)
        if setting is None:
            raise unknown(attribute)
        value = _integer(attribute, text, setting)
        if setting.duration:
            getattr(queue, setting.field).FromTimedelta(timedelta(seconds=value))
        else:
            setattr(queue, setting.field, value)
        paths.append(setting.field)
    return queue, paths


def _integer(attribute: str, text: str, setting: Setting) -> int:
    if not text.isascii() or not text.isdigit():
        raise invalid_value(attribute, f"must be a whole number, not {text!r}.")
    value = int(text)
    if not setting.low <= value <= setting.high:
        raise invalid_value(attribute, f"must be {setting.low} to {setting.high}, not {value}.")
    return value


def _value(queue: qpb.Queue, setting: Setting) -> int:
    if setting.duration:
        return int(getattr(queue, setting.field).ToTimedelta().total_seconds())
    return int(getattr(queue, setting.field))


def conflicting(requested: Mapping[str, str], existing: qpb.Queue) -> str | None:
    """The first requested attribute whose value differs from the existing queue's."""
    for attribute, text in requested.items():
        setting = SETTINGS[attribute]
        if int(text) != _value(existing, setting):
            return attribute
    return None


def describe(queue: qpb.Queue, names: Iterable[str], settings: ShimSettings) -> dict[str, str]:
    """The named attributes of a queue ("All" for every one) as SQS strings."""
    names = list(names)
    for name in names:
        if name != "All" and name not in SETTINGS and name not in READ_ONLY:
            raise unknown(name)
    every = "All" in names
    values = {attribute: str(_value(queue, setting)) for attribute, setting in SETTINGS.items()}
    values.update(
        ApproximateNumberOfMessages=str(queue.stats.visible_messages),
        ApproximateNumberOfMessagesNotVisible=str(queue.stats.in_flight_messages),
        ApproximateNumberOfMessagesDelayed=str(queue.stats.delayed_messages),
        CreatedTimestamp=str(queue.create_time.seconds),
        LastModifiedTimestamp=str(queue.update_time.seconds),
        QueueArn=naming.queue_arn(settings, queue.name),
    )
    return {name: value for name, value in values.items() if every or name in names}
