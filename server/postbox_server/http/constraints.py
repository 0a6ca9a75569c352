"""The API's constraints as JSON Schema, read from the protos' field comments.

Every field comment says "Required." or "Optional." and its limits in a few fixed
phrasings ("1-80 characters of [A-Za-z0-9_-]", "1-1000; default 100", "at most 50, keys
1-128 characters, values at most 256 characters", "Output only."). The comments are the
one place the limits are written for people; this module reads the same sentences so
that the OpenAPI document carries them too, and generated clients and fuzzers send what
the server accepts. A phrasing this module does not know adds no constraint: the
document then accepts more than the server, never less.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

_NUMBER = r"[0-9][0-9,]*"
# "1-80", "1 to 1,000", "0-9"
_RANGE = re.compile(rf"\b({_NUMBER})\s*(?:-|to)\s*({_NUMBER})\b")
# "1-80 characters of [A-Za-z0-9_-]" (the class as written, "*" and all)
_CHARACTERS_OF = re.compile(rf"({_NUMBER})\s*(?:-|to)\s*({_NUMBER}) characters of (\[[^\]]+\])")
_PRINTABLE = re.compile(rf"({_NUMBER})\s*(?:-|to)\s*({_NUMBER}) printable ASCII characters")
_AT_MOST_CHARACTERS = re.compile(
    rf"(?:up to|at most|of up to|of at most)\s+({_NUMBER}) characters", re.IGNORECASE
)
_CHARACTERS_RANGE = re.compile(rf"({_NUMBER})\s*(?:-|to)\s*({_NUMBER}) characters")
_AT_MOST_ITEMS = re.compile(rf"(?:up to|at most)\s+({_NUMBER})\b", re.IGNORECASE)
_MAP_KEYS = re.compile(
    rf"(?:keys|Names:)\s+({_NUMBER})-({_NUMBER}) characters(?: of (\[[^\]]+\]))?", re.IGNORECASE
)
_MAP_VALUES = re.compile(rf"values at most ({_NUMBER}) characters")
# "Name of the queue": a field naming a resource, whose name rule is its own name field's.
_NAME_OF = re.compile(
    r"Name of (?:the|a) (?:stream |dead-letter |webhook )?"
    r"(queue|topic|schedule|consumer group|subscription|key)\b"
)
_NAMED = {
    "queue": "postbox.v1.Queue.name",
    "topic": "postbox.v1.Topic.name",
    "schedule": "postbox.v1.Schedule.name",
    "consumer group": "postbox.v1.ConsumerGroup.name",
    "subscription": "postbox.v1.Subscription.name",
    "key": "postbox.v1.Key.name",
}
_INTEGER_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT32,
        FieldDescriptor.TYPE_UINT32,
        FieldDescriptor.TYPE_SINT32,
        FieldDescriptor.TYPE_FIXED32,
        FieldDescriptor.TYPE_SFIXED32,
    }
)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def _first_sentence(comment: str) -> str:
    return " ".join(comment.split()).split(". ")[0].rstrip(".")


def is_required(comment: str) -> bool:
    """A field the caller must always give: "Required." (not "Required on create" or
    "Required for FIFO queues", which depend on the call)."""
    return _first_sentence(comment) == "Required"


def is_required_on_create(comment: str) -> bool:
    """A resource's field a Create call must give: "Required on create, then immutable"."""
    return _first_sentence(comment).startswith("Required on create")


def is_output_only(comment: str) -> bool:
    return comment.lstrip().startswith("Output only")


def named_resource(comment: str) -> str | None:
    """The full name of the resource message a field names ("Name of the queue": the
    Queue), or None."""
    named = _NAME_OF.match(" ".join(comment.split()).removeprefix("Required. "))
    return _NAMED[named[1]].rpartition(".")[0] if named else None


def _string(comment: str, required: bool, comments: Mapping[str, str]) -> dict[str, Any]:
    text = " ".join(comment.split())
    named = _NAME_OF.match(text.removeprefix("Required. "))
    if named and named[1] in _NAMED:
        # "Name of the queue": the rule is the one Queue.name's comment states.
        return _string(comments.get(_NAMED[named[1]], ""), required, comments)
    match = _CHARACTERS_OF.search(text)
    if match:
        low, high = _number(match[1]), _number(match[2])
        characters = match[3]
        if 'and "*"' in text:
            characters = "[*" + characters[1:]  # grant patterns: "*" is a wildcard too
        suffix = r"(\.fifo)?" if '".fifo"' in text else ""  # FIFO queues' and topics' names
        core = f"{characters}{{{low},{high}}}{suffix}"
        return {"pattern": f"^{core}$" if required else f"^({core})?$"}
    match = _PRINTABLE.search(text)
    if match:
        core = f"[!-~]{{{_number(match[1])},{_number(match[2])}}}"
        return {"pattern": f"^{core}$" if required else f"^({core})?$"}
    match = _AT_MOST_CHARACTERS.search(text)
    if match:
        schema: dict[str, Any] = {"maxLength": _number(match[1])}
        if required:
            schema["minLength"] = 1
        return schema
    match = _CHARACTERS_RANGE.search(text)
    if match:
        schema = {"maxLength": _number(match[2])}
        if required:
            schema["minLength"] = _number(match[1])
        return schema
    return {"minLength": 1} if required else {}


def _integer(comment: str, required: bool) -> dict[str, Any]:
    text = " ".join(comment.split())
    match = _RANGE.search(text)
    if not match:
        return {}
    low, high = _number(match[1]), _number(match[2])
    # Optional: 0 is the field unset, which takes the default.
    return {"minimum": low if required else min(low, 0), "maximum": high}


def _repeated(comment: str, required: bool) -> dict[str, Any]:
    text = " ".join(comment.split())
    schema: dict[str, Any] = {}
    match = _RANGE.search(text)
    if match and _number(match[1]) <= 1:
        schema = {"maxItems": _number(match[2])}
    else:
        match = _AT_MOST_ITEMS.search(text)
        if match:
            schema = {"maxItems": _number(match[1])}
    if required:
        schema["minItems"] = 1
    return schema


def _map(comment: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the map's own constraints, its values' constraints)."""
    text = " ".join(comment.split())
    schema: dict[str, Any] = {}
    values: dict[str, Any] = {}
    match = _AT_MOST_ITEMS.search(text)
    if match:
        schema["maxProperties"] = _number(match[1])
    match = _MAP_KEYS.search(text)
    if match:
        names: dict[str, Any] = {"minLength": _number(match[1]), "maxLength": _number(match[2])}
        if match[3]:
            names["pattern"] = f"^{match[3]}*$"
        schema["propertyNames"] = names
    match = _MAP_VALUES.search(text)
    if match:
        values["maxLength"] = _number(match[1])
    return schema, values


def field_constraints(
    field: FieldDescriptor, comment: str, comments: Mapping[str, str]
) -> dict[str, Any]:
    """The JSON Schema keywords a field's comment implies, for its property schema (for
    a map, those of the object; map_value_constraints gives its values'). `comments`,
    every comment by full name, gives the rule of a name that a comment refers to."""
    required = is_required(comment)
    if is_output_only(comment):
        return {"readOnly": True}
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        return _map(comment)[0]
    if field.is_repeated:
        return _repeated(comment, required)
    if field.type == FieldDescriptor.TYPE_STRING:
        return _string(comment, required, comments)
    if message is not None and message.full_name == "google.protobuf.FieldMask":
        return _field_mask(field)
    if field.type in _INTEGER_TYPES:
        return _integer(comment, required)
    return {}


def map_value_constraints(comment: str) -> dict[str, Any]:
    return _map(comment)[1]


def _field_mask(field: FieldDescriptor) -> dict[str, Any]:
    """An update_mask: comma-separated JSON names of the fields of the message it updates
    (the request's one other message field)."""
    request = field.containing_type
    if request is None:
        return {}
    updated = [
        other.message_type
        for other in request.fields
        if other is not field and other.message_type is not None
    ]
    if len(updated) != 1:
        return {}
    names = "|".join(sorted(f.json_name for f in updated[0].fields))
    return {"pattern": f"^({names})(,({names}))*$"}
