"""Protobuf messages as JSON documents for people and agents: fields by their proto
names, bodies as text when they are UTF-8 (the CLI's output, the MCP tools' results)."""

from __future__ import annotations

import base64
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message


def as_dict(message: Message, *, raw_bodies: bool = False) -> dict[str, Any]:
    """A message's fields by their proto names; `body` (and binary attribute values) as text
    when they decode as UTF-8, else, or with raw_bodies, in base64 (as protobuf JSON has
    them)."""
    document = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _texts(message, document, raw_bodies)
    return document


def _texts(message: Message, document: dict[str, Any], raw_bodies: bool) -> None:
    for field, value in message.ListFields():
        if field.type == field.TYPE_BYTES and not field.is_repeated and not raw_bodies:
            text = readable(value)
            if text is not None:
                document[field.name] = text
        elif field.type == field.TYPE_MESSAGE:
            name = field.name
            entry = field.message_type  # set on every message field
            if entry is not None and entry.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(item, Message):
                        _texts(item, document[name][key], raw_bodies)
            elif field.is_repeated:
                for item, sub in zip(value, document.get(name, []), strict=False):
                    if isinstance(sub, dict):
                        _texts(item, sub, raw_bodies)
            elif isinstance(document.get(name), dict):
                _texts(value, document[name], raw_bodies)


def readable(data: bytes) -> str | None:
    """The bytes as text when they are UTF-8 without control characters but whitespace."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return None
    return text


def body_bytes(text: str, *, is_base64: bool) -> bytes:
    """A body given as text: its UTF-8, or with is_base64 the bytes it encodes (a
    binascii.Error, which is a ValueError, when it is not base64)."""
    return base64.b64decode(text, validate=True) if is_base64 else text.encode()
