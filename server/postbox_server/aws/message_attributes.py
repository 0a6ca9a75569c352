"""Message attributes: SQS's MessageAttributeValue to postbox's AttributeValue and back.

The shim checks attributes itself, before postbox does, so that one bad entry of a
SendMessageBatch fails alone with SQS's error, as SQS reports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from postbox.v1 import message_pb2

from postbox_server.aws.errors import invalid_parameter
from postbox_server.errors import quoted

# SQS's limit on a message's own attributes (postbox's is 100: with AWSTraceHeader, kept
# as one more, a message of SQS always fits).
MAX_ATTRIBUTES = 10
# postbox has no field for SQS's message system attributes: the shim keeps them as
# postbox attributes under this prefix, which SQS clients cannot use for their own.
RESERVED_PREFIX = "postbox-sqs."
# The one message system attribute a sender may set.
TRACE_HEADER = "AWSTraceHeader"
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,256}$")
_RESERVED = re.compile(r"^(aws|amazon)\.", re.IGNORECASE)
_DATA_TYPE = re.compile(r"^(String|Number|Binary)(\.[^\x00-\x1f\x7f]+)?$")
_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
# What SQS accepts in message text: the characters XML 1.0 allows.
_INVALID_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def invalid_character(text: str) -> str | None:
    """The first character SQS would refuse in a message body or attribute, if any."""
    found = _INVALID_TEXT.search(text)
    return None if found is None else found.group()


def to_postbox(
    attributes: Mapping[str, Mapping[str, Any]],
    system: Mapping[str, Mapping[str, Any]],
) -> dict[str, message_pb2.AttributeValue]:
    """Checks SQS message (and system) attributes and converts them to postbox's;
    InvalidParameterValue if one is bad or there are more than SQS takes."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise invalid_parameter(
            f"Number of message attributes [{len(attributes)}] exceeds the allowed maximum "
            f"[{MAX_ATTRIBUTES}]."
        )
    converted = {name: _attribute(name, value) for name, value in attributes.items()}
    for name, value in system.items():
        converted[RESERVED_PREFIX + name] = _system_attribute(name, value)
    return converted


def _system_attribute(name: str, value: Mapping[str, Any]) -> message_pb2.AttributeValue:
    if name != TRACE_HEADER:
        raise invalid_parameter(
            f"Message system attribute name {quoted(name)} is invalid. Supported: {TRACE_HEADER}."
        )
    text = value.get("StringValue")
    if value.get("DataType") != "String" or set(value) - {"DataType", "StringValue"}:
        raise invalid_parameter(
            f"Message system attribute {quoted(name)} must be of type String with a StringValue."
        )
    if not text or invalid_character(text) is not None:
        raise invalid_parameter(
            f"Message system attribute {quoted(name)} must contain a non-empty value of characters "
            "SQS allows."
        )
    return message_pb2.AttributeValue(data_type="String", string_value=text)


def split(
    attributes: Mapping[str, message_pb2.AttributeValue],
) -> tuple[dict[str, message_pb2.AttributeValue], dict[str, message_pb2.AttributeValue]]:
    """A postbox message's attributes as SQS's message attributes and system attributes."""
    user, system = {}, {}
    for name, value in attributes.items():
        if name.startswith(RESERVED_PREFIX):
            system[name[len(RESERVED_PREFIX) :]] = value
        else:
            user[name] = value
    return user, system


def _attribute(name: str, value: Mapping[str, Any]) -> message_pb2.AttributeValue:
    if not _NAME.match(name):
        raise invalid_parameter(  # SQS's words
            f"The message attribute name '{name[:80]}' is invalid. Attribute name can contain "
            "A-Z, a-z, 0-9, underscore (_), hyphen (-), and period (.) characters."
        )
    if _RESERVED.match(name) or ".." in name:
        raise invalid_parameter(
            f"Message (user) attribute name {quoted(name)} is invalid: "
            "names are 1 to 256 characters "
            "of A-Z, a-z, 0-9, '_', '-' and '.', must not start with 'AWS.' or 'Amazon.', "
            "start or end with '.', nor contain '..'."
        )
    if name.lower().startswith(RESERVED_PREFIX):
        raise invalid_parameter(
            f"Message (user) attribute name {quoted(name)} is invalid: names starting with "
            f"'{RESERVED_PREFIX}' are reserved by postbox for message system attributes."
        )
    if name.startswith(".") or name.endswith("."):
        raise invalid_parameter(
            f"Message (user) attribute name '{name}' must not start or end with a period."
        )
    data_type = value.get("DataType")
    if not data_type:
        raise invalid_parameter(f"The message attribute '{name}' must contain a data type.")
    if not _DATA_TYPE.match(data_type) or len(data_type) > 256:
        raise invalid_parameter(  # SQS's words
            f"The message attribute '{name}' has an invalid message attribute type, the set of "
            "supported type prefixes is Binary, Number, and String."
        )
    if "StringListValues" in value or "BinaryListValues" in value:
        raise invalid_parameter(
            f"Message (user) attribute '{name}': list values are not supported; use StringValue "
            "or BinaryValue."
        )
    string, binary = value.get("StringValue"), value.get("BinaryValue")
    if data_type.startswith("Binary"):
        if string is not None or not binary:
            raise invalid_parameter(
                f"Message (user) attribute '{name}' must contain a non-empty message attribute "
                f"value for message attribute type '{data_type}'."
            )
        return message_pb2.AttributeValue(data_type=data_type, binary_value=binary)
    if binary is not None or not string:
        raise invalid_parameter(
            f"Message (user) attribute '{name}' must contain a non-empty message attribute "
            f"value for message attribute type '{data_type}'."
        )
    if invalid_character(string) is not None:
        raise invalid_parameter(
            f"Message (user) attribute '{name}' contains a character SQS does not allow."
        )
    if data_type.startswith("Number") and not _NUMBER.match(string):
        raise invalid_parameter(
            f"Can't cast the value of message (user) attribute '{name}' to a number."
        )
    return message_pb2.AttributeValue(data_type=data_type, string_value=string)


def to_sqs(attributes: Mapping[str, message_pb2.AttributeValue]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    for name, value in attributes.items():
        if value.WhichOneof("value") == "binary_value":
            result[name] = {"DataType": value.data_type, "BinaryValue": value.binary_value}
        else:
            result[name] = {"DataType": value.data_type, "StringValue": value.string_value}
    return result


def size(body: bytes, attributes: Mapping[str, message_pb2.AttributeValue]) -> int:
    """A message's size as SQS counts it: body, and each attribute's name, type and value."""
    total = len(body)
    for name, value in attributes.items():
        total += len(name.encode()) + len(value.data_type.encode())
        if value.WhichOneof("value") == "binary_value":
            total += len(value.binary_value)
        else:
            total += len(value.string_value.encode())
    return total


def select(
    attributes: Mapping[str, message_pb2.AttributeValue], wanted: Iterable[str]
) -> dict[str, message_pb2.AttributeValue]:
    """The attributes a ReceiveMessage asked for: names, "All", ".*" or "*" (every one), or
    "prefix.*" (those whose names start with the prefix, such as Custom1 for Custom.*)."""
    names, prefixes = set(), []
    for pattern in wanted:
        if pattern in ("All", ".*", "*"):
            return dict(attributes)
        if pattern.endswith(".*"):
            prefixes.append(pattern[:-2])
        else:
            names.add(pattern)
    return {
        name: value
        for name, value in attributes.items()
        if name in names or any(name.startswith(prefix) for prefix in prefixes)
    }
