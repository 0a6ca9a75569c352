"""beyond-queue's JSON shapes and postbox's messages, both ways.

A message's `message` is any JSON value, stored as its JSON text; a body that is not
JSON (sent over gRPC or SQS) reads back as a string when it is UTF-8, else as null with
`body_base64`. `headers` are attributes: string values are String attributes, numbers
are Number attributes; they read back the same way (Binary ones as base64 strings), and
a String.json attribute (as `_schedule`, which a schedule's fire adds) reads back as
the JSON value its text holds.
"""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import message_pb2

from postbox_server.http.rest.framework import BadInput, json_type, quoted
from postbox_server.services import deliveries

# What a message's `headers` hold: any JSON values, as beyond-queue's (a jsonb object).
HEADERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "description": "At most 10; names as SendRequest.attributes takes them. A string is a "
    "String attribute, a number a Number one, any other value a String.json one.",
}
# What a received message's `headers` hold: the same values, and the `_schedule` object
# of a schedule's fire.
RECEIVED_HEADERS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "description": "As sent; a schedule's fire adds _schedule: {name, scheduled_for, out_of_band}.",
}
# The data type of attributes whose text is JSON, read back as the JSON value.
_JSON_TYPE = "String.json"
MESSAGE_SCHEMA: dict[str, Any] = {"description": "Any JSON value: the message."}


def body_of(value: Any) -> bytes:
    """A message's body: the JSON text of its value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def message_fields(body: bytes) -> dict[str, Any]:
    """`message` (and `body_base64` for a body that is not text) of a stored body."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return {"message": None, "body_base64": base64.b64encode(body).decode()}
    try:
        return {"message": json.loads(text)}
    except ValueError:
        return {"message": text}


def attributes_of(headers: Any, where: str = "headers") -> dict[str, message_pb2.AttributeValue]:
    if headers is None:
        return {}
    if not isinstance(headers, dict):
        raise BadInput(f"{where} is a JSON {json_type(headers)}; it must be an object")
    attributes = {}
    for name, value in headers.items():
        if isinstance(value, str) and value:
            attributes[name] = message_pb2.AttributeValue(data_type="String", string_value=value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            attributes[name] = message_pb2.AttributeValue(
                data_type="Number", string_value=json.dumps(value)
            )
        else:
            # true, null, an object, an array or "", as beyond-queue's headers may hold
            # them (an attribute's string is never empty): its JSON text, read back as
            # the value (headers_of).
            attributes[name] = message_pb2.AttributeValue(
                data_type=_JSON_TYPE, string_value=json.dumps(value, separators=(",", ":"))
            )
    return attributes


def headers_of(attributes: Any) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    for name, value in attributes.items():
        if value.WhichOneof("value") == "binary_value":
            headers[name] = base64.b64encode(value.binary_value).decode()
        elif value.data_type.split(".")[0] == "Number" or value.data_type == _JSON_TYPE:
            try:
                headers[name] = json.loads(value.string_value)
            except ValueError:
                headers[name] = value.string_value
        else:
            headers[name] = value.string_value
    return headers


def whole_seconds(value: Any, name: str) -> int:
    """A count of seconds: a whole number, 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadInput(
            f"{name} is {quoted(json.dumps(value))}; it must be a whole number of seconds, "
            "0 or more"
        )
    return value


def duration(seconds: int) -> Duration:
    return Duration(seconds=seconds)


def message_id(text: str) -> int | str:
    """A message's id as the REST API writes it, a number as beyond-queue's: the
    message's receive-count part 0 (deliveries.message_number), which deletes and changes
    the visibility of the message, where a receive's `id` names one delivery of it. Past
    2^41 messages, "<message id>#0", which those routes take too."""
    if not text.isdigit():
        return text
    number = deliveries.message_number(int(text))
    return f"{text}#0" if number is None else number


def time_text(stamp: Timestamp) -> str | None:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return None
    return stamp.ToDatetime(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")


def parse_time(value: Any, name: str) -> Timestamp:
    if not isinstance(value, str):
        raise BadInput(f"{name} is a JSON {json_type(value)}; it must be an RFC 3339 time")
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(
            f"{name} is {quoted(value)}; it must be an RFC 3339 time such as 2026-01-02T03:04:05Z"
        ) from None
    if when.tzinfo is None:
        raise BadInput(f"{name} is {quoted(value)}; give its offset, e.g. Z for UTC")
    stamp = Timestamp()
    stamp.FromDatetime(when.astimezone(timezone.utc))
    return stamp


def now_plus(seconds: int) -> str:
    later = datetime.now(timezone.utc) + timedelta(seconds=seconds)
    return later.isoformat().replace("+00:00", "Z")
