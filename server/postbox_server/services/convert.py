"""Conversions between API messages and the values the SQL engine takes and returns."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, overload

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message as ProtoMessage
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import status_pb2
from postbox.v1 import message_pb2

from postbox_server.db.engine import OutgoingMessage, Row
from postbox_server.errors import invalid, quoted

# The range google.protobuf.Duration defines (about 10,000 years).
_MAX_DURATION_SECONDS = 315_576_000_000


def optional_timedelta(message: ProtoMessage, field: str) -> timedelta | None:
    """The Duration field as a timedelta, None when unset; INVALID_ARGUMENT when malformed."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    # The wire carries any int64/int32: check what Duration allows before converting.
    if (
        abs(value.seconds) > _MAX_DURATION_SECONDS
        or abs(value.nanos) > 999_999_999
        or value.seconds * value.nanos < 0
    ):
        raise invalid(
            f"{field} is not a valid duration: seconds within ±{_MAX_DURATION_SECONDS:,} and "
            "nanos within ±999,999,999, both of the same sign"
        )
    return value.ToTimedelta()


# The range google.protobuf.Timestamp defines: 0001-01-01 to 9999-12-31.
_MIN_TIMESTAMP_SECONDS, _MAX_TIMESTAMP_SECONDS = -62_135_596_800, 253_402_300_799


def optional_datetime(message: ProtoMessage, field: str) -> datetime | None:
    """The Timestamp field as an aware datetime, None when unset; INVALID_ARGUMENT if malformed."""
    if not message.HasField(field):
        return None
    value = getattr(message, field)
    if (
        not _MIN_TIMESTAMP_SECONDS <= value.seconds <= _MAX_TIMESTAMP_SECONDS
        or not 0 <= value.nanos <= 999_999_999
    ):
        raise invalid(f"{field} is not a valid timestamp: it must lie in the years 1 to 9999")
    return value.ToDatetime(timezone.utc)


def seconds(duration: Duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def duration(value: timedelta) -> Duration:
    result = Duration()
    result.FromTimedelta(value)
    return result


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@overload
def timestamp(value: datetime) -> Timestamp: ...
@overload
def timestamp(value: None) -> None: ...
def timestamp(value: datetime | None) -> Timestamp | None:
    """The datetime as a Timestamp; naive ones are UTC (asyncpg gives ±infinity so)."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    # By hand: Timestamp.FromDatetime costs three times as much, and receive
    # converts two per message.
    since = value - _EPOCH
    return Timestamp(seconds=since.days * 86_400 + since.seconds, nanos=since.microseconds * 1000)


def attributes_json(attributes: Mapping[str, message_pb2.AttributeValue]) -> str | None:
    """Attributes in the engine's JSON form; the engine checks names, types and values."""
    if not attributes:
        return None
    encoded: dict[str, dict[str, Any]] = {}
    for name, value in attributes.items():
        # JSON in PostgreSQL cannot hold NUL, so say so before it gets there.
        if "\x00" in name:
            raise invalid("attribute names must not contain NUL characters")
        entry: dict[str, Any] = {"data_type": value.data_type}
        kind = value.WhichOneof("value")
        if kind == "string_value":
            if "\x00" in value.string_value:
                raise invalid(
                    f"attribute {quoted(name)}: string values must not contain NUL characters"
                )
            entry["string_value"] = value.string_value
        elif kind == "binary_value":
            entry["binary_value"] = base64.b64encode(value.binary_value).decode("ascii")
        encoded[name] = entry
    return json.dumps(encoded, ensure_ascii=False, separators=(",", ":"))


def attributes_from_json(text: str | None) -> dict[str, message_pb2.AttributeValue]:
    if not text:
        return {}
    result = {}
    for name, entry in json.loads(text).items():
        if "binary_value" in entry:
            result[name] = message_pb2.AttributeValue(
                data_type=entry["data_type"], binary_value=base64.b64decode(entry["binary_value"])
            )
        else:
            result[name] = message_pb2.AttributeValue(
                data_type=entry["data_type"], string_value=entry["string_value"]
            )
    return result


# The engine's states of a message's life (postbox._message_lives), as the API has them.
_STATES = {
    "visible": message_pb2.MESSAGE_STATE_VISIBLE,
    "in_flight": message_pb2.MESSAGE_STATE_IN_FLIGHT,
    "delayed": message_pb2.MESSAGE_STATE_DELAYED,
    "succeeded": message_pb2.MESSAGE_STATE_SUCCEEDED,
    "failed": message_pb2.MESSAGE_STATE_FAILED,
    "dead_lettered": message_pb2.MESSAGE_STATE_DEAD_LETTERED,
    "expired": message_pb2.MESSAGE_STATE_EXPIRED,
    "cancelled": message_pb2.MESSAGE_STATE_CANCELLED,
}
# What ListMessages filters by: any state, or the dead letters a queue holds.
LIFE_STATE_FILTERS: dict[int, str | None] = {
    message_pb2.MESSAGE_STATE_UNSPECIFIED: None,
    message_pb2.MESSAGE_STATE_DEAD: "dead",
    **{value: name for name, value in _STATES.items()},
}
# PeekMessages sees only the messages a queue holds.
STATE_FILTERS = {
    value: name
    for value, name in LIFE_STATE_FILTERS.items()
    if name in (None, "visible", "in_flight", "delayed", "dead")
}
# States in which a message is still in a queue, and has a visibility time.
_WAITING = ("in_flight", "delayed")


def message(row: Row) -> message_pb2.Message:
    """A message row of the engine (receive, peek_messages, ...) as an API Message."""
    result = message_pb2.Message(
        message_id=str(row["message_id"]),
        body=row["body"],
        attributes=attributes_from_json(row["attributes"]),
        enqueue_time=timestamp(row["enqueued_at"]),
        receive_count=row["receive_count"],
        first_receive_time=timestamp(row["first_received_at"]),
        priority=row["priority"],
        message_group_id=row["message_group_id"] or "",
        deduplication_id=row["deduplication_id"] or "",
        dead_letter_source_queue=row["dead_letter_source"] or "",
        last_error=row["last_error"] or "",
    )
    if "receipt" in row:
        result.receipt = row["receipt"]
    if "state" in row:
        result.state = _STATES[row["state"]]
        if row["state"] in _WAITING:
            result.visible_time.CopyFrom(timestamp(row["visible_at"]))
    if row.get("expires_at") is not None:
        result.expire_time.CopyFrom(timestamp(row["expires_at"]))
    if "consumer_id" in row:  # peek_messages, get_message, list_messages
        _life(result, row)
    return result


def _life(result: message_pb2.Message, row: Row) -> None:
    """The job's side of a message: who took it, since when, how it ended."""
    result.consumer_id = row["consumer_id"] or ""
    result.max_receive_count = row["max_receive_count"] or 0
    if row["received_at"] is not None:
        result.receive_time.CopyFrom(timestamp(row["received_at"]))
    if row.get("finished_at") is not None:
        result.finish_time.CopyFrom(timestamp(row["finished_at"]))
    if row.get("result") is not None:
        result.result = row["result"]
    if row.get("queue") is not None:
        result.queue = row["queue"]


# The engine's outcome of one receipt of a batch settle, as the API reports it.
_OUTCOME_STATUS = {
    "ok": (grpc.StatusCode.OK, ""),
    "invalid": (grpc.StatusCode.INVALID_ARGUMENT, "receipt is malformed"),
    "stale": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "receipt is stale: the message was delivered again since",
    ),
    "not_found": (grpc.StatusCode.NOT_FOUND, "message is gone (deleted or expired)"),
    "unavailable": (
        grpc.StatusCode.UNAVAILABLE,
        "the database did not answer; nothing was changed, settle again",
    ),
}


def batch_results(outcomes: Sequence[str]) -> list[status_pb2.Status]:
    results = []
    for outcome in outcomes:
        code, text = _OUTCOME_STATUS[outcome]
        results.append(status_pb2.Status(code=code.value[0], message=text))
    return results


_ARCHIVE_REASONS = {
    "deleted": message_pb2.ARCHIVE_REASON_DELETED,
    "expired": message_pb2.ARCHIVE_REASON_EXPIRED,
    "cancelled": message_pb2.ARCHIVE_REASON_CANCELLED,
    "failed": message_pb2.ARCHIVE_REASON_FAILED,
}


def archive_reason(reason: str) -> message_pb2.ArchiveReason:
    return _ARCHIVE_REASONS[reason]


def check_message_size(entry: Any, limit: int) -> None:
    """Refuses a message whose body and attributes, counted as the engine counts them
    (postbox.message_size), exceed the server's --max-message-size."""
    size = len(entry.body)
    for name, value in entry.attributes.items():
        size += len(name.encode()) + len(value.data_type.encode())
        kind = value.WhichOneof("value")
        if kind == "string_value":
            size += len(value.string_value.encode())
        elif kind == "binary_value":
            size += len(value.binary_value)
    if size > limit:
        raise invalid(
            f"message is {size} bytes (body and attributes); this server accepts messages "
            f"of at most {limit} bytes (--max-message-size)"
        )


# Fields of a send that need no conversion: a message with no others takes the short way.
_PLAIN = frozenset({"queue", "body"})


def _field_size(length: int) -> int:
    """Bytes a length-delimited field with a one-byte tag takes on the wire."""
    if length < 0x80:
        return 2 + length
    if length < 0x4000:
        return 3 + length
    if length < 0x200000:
        return 4 + length
    return 5 + length if length < 0x10000000 else 6 + length


@dataclass(slots=True)
class PlainBatch:
    """A SendBatchRequest's entries that set nothing but a body and, for some, a
    deduplication id (as the SDK's Producer sends them)."""

    bodies: list[bytes]
    deduplication_ids: list[str | None] | None  # None when no entry has one


def plain_batch(request: Any, max_message_size: int) -> PlainBatch | None:
    """The bodies (and deduplication ids) of a SendBatchRequest whose entries set nothing
    but a non-empty body within the size limit and perhaps a deduplication id, or None:
    then each entry takes outgoing(). Told by the request's wire size, which upb computes
    without building a Python object per field (ListFields() per entry cost more than
    the rest of a plain send). An id is counted in characters: one that is not ASCII
    (which the engine refuses) makes the sizes differ, so it goes the long way."""
    entries = request.entries
    bodies = [entry.body for entry in entries]
    lengths = list(map(len, bodies))
    if not lengths or min(lengths) == 0 or max(lengths) > max_message_size:
        return None
    size = _field_size
    actual = request.ByteSize()
    if request.queue:
        actual -= size(len(request.queue.encode()))
    if request.request_id:
        actual -= size(len(request.request_id.encode()))
    if actual == sum(size(size(length)) for length in lengths):
        return PlainBatch(bodies, None)
    ids = [entry.deduplication_id for entry in entries]
    with_ids = sum(
        size(size(length) + (size(len(id_)) if id_ else 0))
        for length, id_ in zip(lengths, ids, strict=True)
    )
    if actual != with_ids:
        return None
    return PlainBatch(bodies, [id_ or None for id_ in ids])


def outgoing(entry: Any, max_message_size: int) -> OutgoingMessage:
    """A SendRequest or SendBatchEntry as the engine takes it."""
    if all(field.name in _PLAIN for field, _ in entry.ListFields()):  # most messages
        body = entry.body
        if len(body) > max_message_size:
            check_message_size(entry, max_message_size)
        return OutgoingMessage(body=body)
    check_message_size(entry, max_message_size)
    if entry.HasField("delay") and entry.HasField("deliver_at"):
        raise invalid("give delay or deliver_at, not both")
    ttl = optional_timedelta(entry, "ttl")
    if ttl is not None and ttl <= timedelta(0):
        raise invalid(f"ttl is {ttl.total_seconds()} s; it must be above 0")
    return OutgoingMessage(
        max_receive_count=entry.max_receive_count or None,
        ttl=ttl,
        expire_at=optional_datetime(entry, "expire_time"),
        body=entry.body,
        attributes=attributes_json(entry.attributes),
        delay=optional_timedelta(entry, "delay"),
        deliver_at=optional_datetime(entry, "deliver_at"),
        message_group_id=entry.message_group_id or None,
        deduplication_id=entry.deduplication_id or None,
        dedupe_key=entry.dedupe_key or None,
        priority=entry.priority or None,
    )
