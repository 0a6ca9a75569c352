"""The fields of a message to send, as the SendRequest and SendBatchEntry protos take them;
shared by the clients (client.py) and the Producer, which imports no client at runtime."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from postbox.v1 import message_pb2

Attributes = Mapping[str, str | bytes]


def attribute_values(attributes: Attributes | None) -> dict[str, message_pb2.AttributeValue]:
    """str values become String attributes, bytes values Binary ones."""
    values = {}
    for name, value in (attributes or {}).items():
        if isinstance(value, bytes):
            values[name] = message_pb2.AttributeValue(data_type="Binary", binary_value=value)
        else:
            values[name] = message_pb2.AttributeValue(data_type="String", string_value=value)
    return values


def send_fields(
    body: bytes | str,
    *,
    attributes: Attributes | None = None,
    delay: timedelta | None = None,
    message_group_id: str | None = None,
    deduplication_id: str | None = None,
    priority: int | None = None,
    ttl: timedelta | None = None,
    expire_time: datetime | None = None,
) -> dict[str, Any]:
    """The fields of a SendRequest or SendBatchEntry."""
    fields: dict[str, Any] = {
        "body": body.encode() if isinstance(body, str) else body,
        "attributes": attribute_values(attributes),
    }
    if delay is not None:
        fields["delay"] = delay
    if ttl is not None:
        fields["ttl"] = ttl
    if expire_time is not None:
        fields["expire_time"] = expire_time
    if message_group_id:
        fields["message_group_id"] = message_group_id
    if deduplication_id:
        fields["deduplication_id"] = deduplication_id
    if priority is not None:
        fields["priority"] = priority
    return fields
