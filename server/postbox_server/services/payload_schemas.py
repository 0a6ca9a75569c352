"""Payload schemas: what a queue's or topic's message bodies must be, compiled once.

A schema is a JSON Schema (draft 2020-12) document, checked by jsonschema-rs, or a
protobuf message type from a FileDescriptorSet the caller uploads, checked by parsing
the body with the protobuf runtime. The engine keeps the schema as jsonb (the shape
is in sql/src/12_payload_schemas.sql) and never looks inside it; the server compiles
it when it is set, so that a schema that cannot check anything is refused then, and
again per process when a send first needs it (payload_schema_cache.py).
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol

import jsonschema_rs
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError, Message
from postbox.v1 import message_pb2

from postbox_server.errors import invalid, quoted

# Limits of a schema, the engine's too (postbox._payload_schema_problem).
MAX_JSON_SCHEMA = 65536  # bytes of UTF-8
MAX_DESCRIPTOR_SET = 262144  # bytes
MAX_MESSAGE_TYPE = 512  # characters
# What a refusal tells of the violation: a path and a reason, each cut to this many
# characters, so that no body or schema makes the message long.
MAX_VIOLATION_PATH = 120
MAX_VIOLATION_REASON = 240
_DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
# jsonschema-rs shows this in place of the offending value: a body's values are the
# caller's data, and may be long.
_MASK = "the value"


class BodyCheck(Protocol):
    def violation(self, body: bytes) -> str | None:
        """The first way `body` breaks the schema, as "at <path>: <reason>"; None if it
        matches."""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} characters)"


def _violation(path: str, reason: str) -> str:
    return f"at {_cut(path or '/', MAX_VIOLATION_PATH)}: {_cut(reason, MAX_VIOLATION_REASON)}"


def _pointer(parts: list[str | int]) -> str:
    """A JSON Pointer (RFC 6901) to a place in the body."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


class JsonSchemaCheck:
    """Bodies must be UTF-8 JSON that a JSON Schema 2020-12 document accepts."""

    def __init__(self, document: str, field: str = "payload_schema.json_schema") -> None:
        size = len(document.encode("utf-8", "surrogatepass"))
        if not 0 < size <= MAX_JSON_SCHEMA:
            raise invalid(f"{field} is {size} bytes; it must be 1 to {MAX_JSON_SCHEMA} bytes")
        try:
            schema = json.loads(document)
        except ValueError as error:
            raise invalid(f"{field} is not JSON: {error}") from None
        if not isinstance(schema, dict | bool):
            raise invalid(
                f"{field} must be a JSON object (or true or false), not {quoted(document)}"
            )
        if isinstance(schema, dict) and schema.get("$schema", _DRAFT_2020_12) != _DRAFT_2020_12:
            raise invalid(
                f"{field} names $schema {quoted(str(schema['$schema']))}; postbox checks JSON "
                f"Schema 2020-12 only: name {_DRAFT_2020_12!r} or leave $schema out"
            )
        try:
            jsonschema_rs.meta.validate(schema)
            # offline: a $ref outside the document is refused, never fetched.
            self._validator = jsonschema_rs.Draft202012Validator(schema, offline=True, mask=_MASK)
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as error:
            reason = str(error).split("\n", 1)[0]
            raise invalid(
                f"{field} is not a valid JSON Schema 2020-12: {_cut(reason, 240)}"
            ) from None

    def violation(self, body: bytes) -> str | None:
        try:
            instance = _parsed(body)
        except ValueError as error:  # UnicodeDecodeError is a ValueError too
            return _violation("/", f"the body is not UTF-8 JSON ({error})")
        if self._validator.is_valid(instance):
            return None
        first = next(self._validator.iter_errors(instance))
        return _violation(_pointer(list(first.instance_path)), first.message)


def _parsed(body: bytes) -> Any:
    """A JSON body's value: by orjson (half the cost of a check of 1 KiB); what orjson
    refuses is read again by the standard library, which takes integers beyond 64 bits
    and says where a body stops being JSON. NaN and Infinity are not JSON: refused."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body, parse_constant=_not_json)


def _not_json(constant: str) -> None:
    raise ValueError(f"{constant} is not a JSON value")


class ProtobufCheck:
    """Bodies must be one message of a protobuf type in the binary wire format, with
    every required field and no field the type does not declare.

    Unknown fields are refused: the wire format is so lenient that bytes of another
    type (or many non-protobuf bodies) parse as a message of only unknown fields, and a
    check that let them through would check next to nothing. A producer that adds
    fields updates the queue's schema first.
    """

    def __init__(self, descriptor_set: bytes, message_type: str) -> None:
        field = "payload_schema.protobuf"
        if not 0 < len(descriptor_set) <= MAX_DESCRIPTOR_SET:
            raise invalid(
                f"{field}.file_descriptor_set is {len(descriptor_set)} bytes; it must be 1 to "
                f"{MAX_DESCRIPTOR_SET} bytes"
            )
        if not 0 < len(message_type) <= MAX_MESSAGE_TYPE:
            raise invalid(
                f"{field}.message_type is {len(message_type)} characters; it must be the full "
                f"name of a message type, 1 to {MAX_MESSAGE_TYPE} characters"
            )
        files = descriptor_pb2.FileDescriptorSet()
        try:
            files.ParseFromString(descriptor_set)
        except DecodeError:
            raise invalid(
                f"{field}.file_descriptor_set is not a serialized "
                "google.protobuf.FileDescriptorSet (protoc --descriptor_set_out)"
            ) from None
        pool = _pool_of(files)
        try:
            descriptor = pool.FindMessageTypeByName(message_type)
        except KeyError:
            held = sorted(m for f in files.file for m in _message_names(f))
            raise invalid(
                f"{field}.message_type {quoted(message_type)} is not in the descriptor set, "
                f"which holds {len(held)} message types: {_cut(', '.join(held), 300) or 'none'}"
            ) from None
        self._type = message_type
        self._class = message_factory.GetMessageClass(descriptor)

    def violation(self, body: bytes) -> str | None:
        message = self._class()
        try:
            message.ParseFromString(body)
        except DecodeError as error:
            return _violation("/", f"the body is not a {self._type} in the wire format ({error})")
        if not message.IsInitialized():
            # Every message class has it; the stubs of Message leave it out.
            missing: list[str] = message.FindInitializationErrors()  # type: ignore[attr-defined]
            return _violation("/" + missing[0].replace(".", "/"), "a required field is missing")
        return _unknown_field(message, "")


def _pool_of(files: descriptor_pb2.FileDescriptorSet) -> descriptor_pool.DescriptorPool:
    """A pool of the set's files, added in dependency order; the well-known types
    (google/protobuf/*.proto) come from the runtime when the set leaves them out."""
    pool = descriptor_pool.DescriptorPool()
    pending = {f.name: f for f in files.file}
    added: set[str] = set()

    def add(name: str, chain: tuple[str, ...]) -> None:
        if name in added:
            return
        if name in chain:
            raise invalid(
                f"payload_schema.protobuf: the files import each other in a cycle ({name})"
            )
        proto = pending.get(name)
        if proto is None:
            proto = _well_known(name)
        for dependency in proto.dependency:
            add(dependency, (*chain, name))
        try:
            pool.Add(proto)
        except (TypeError, ValueError) as error:
            reason = _cut(str(error), MAX_VIOLATION_REASON)
            raise invalid(
                f"payload_schema.protobuf: file {quoted(name)} does not build: {reason}"
            ) from None
        added.add(name)

    for name in pending:
        add(name, ())
    return pool


def _well_known(name: str) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    try:
        if not name.startswith("google/protobuf/"):
            raise KeyError(name)
        descriptor_pool.Default().FindFileByName(name).CopyToProto(proto)
    except KeyError:
        raise invalid(
            f"payload_schema.protobuf: the descriptor set lacks {quoted(name)}, which one of "
            "its files imports: build it with protoc --include_imports"
        ) from None
    return proto


def _message_names(file: descriptor_pb2.FileDescriptorProto) -> list[str]:
    prefix = f"{file.package}." if file.package else ""
    names = []
    stack = [(prefix, m) for m in file.message_type]
    while stack:
        scope, message = stack.pop()
        names.append(scope + message.name)
        stack.extend((f"{scope}{message.name}.", nested) for nested in message.nested_type)
    return names


def _unknown_field(message: Message, path: str) -> str | None:
    """The first field that `message` (or a message within) holds but does not declare."""
    unknown = unknown_fields.UnknownFieldSet(message)
    if len(unknown):
        number = unknown[0].field_number
        return _violation(
            path or "/", f"field number {number} is not a field of {message.DESCRIPTOR.full_name}"
        )
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        here = f"{path}/{field.name}"
        if field.message_type.GetOptions().map_entry:
            values = (
                value.values() if field.message_type.fields_by_name["value"].message_type else ()
            )
            items = [
                (f"{here}/{key}", item) for key, item in zip(value.keys(), values, strict=False)
            ]
        elif field.is_repeated:
            items = [(f"{here}/{index}", item) for index, item in enumerate(value)]
        else:
            items = [(here, value)]
        for item_path, item in items:
            found = _unknown_field(item, item_path)
            if found is not None:
                return found
    return None


# The engine's jsonb form of a PayloadSchema, and back.


def setting(schema: message_pb2.PayloadSchema) -> dict[str, Any]:
    """A PayloadSchema as the engine keeps it, once it compiles (INVALID_ARGUMENT if not)."""
    kind = schema.WhichOneof("kind")
    if kind == "json_schema":
        JsonSchemaCheck(schema.json_schema)
        return {"json_schema": schema.json_schema}
    if kind == "protobuf":
        ProtobufCheck(schema.protobuf.file_descriptor_set, schema.protobuf.message_type)
        return {
            "protobuf": {
                "file_descriptor_set": base64.b64encode(schema.protobuf.file_descriptor_set).decode(
                    "ascii"
                ),
                "message_type": schema.protobuf.message_type,
            }
        }
    raise invalid(
        "payload_schema needs one of json_schema and protobuf; to remove a schema, name "
        "payload_schema in the update_mask and leave it unset"
    )


def resource(stored: Any) -> message_pb2.PayloadSchema | None:
    """The engine's payload_schema (jsonb text, or None) as the API shows it."""
    if stored is None:
        return None
    value = json.loads(stored) if isinstance(stored, str) else stored
    if "json_schema" in value:
        return message_pb2.PayloadSchema(json_schema=value["json_schema"])
    protobuf = value["protobuf"]
    return message_pb2.PayloadSchema(
        protobuf=message_pb2.ProtobufSchema(
            file_descriptor_set=base64.b64decode(protobuf["file_descriptor_set"]),
            message_type=protobuf["message_type"],
        )
    )


def compiled(stored: dict[str, Any]) -> BodyCheck:
    """The check of a stored schema; ApiError if it does not compile (one set in SQL)."""
    if "json_schema" in stored:
        return JsonSchemaCheck(stored["json_schema"])
    protobuf = stored["protobuf"]
    return ProtobufCheck(
        base64.b64decode(protobuf["file_descriptor_set"]), protobuf["message_type"]
    )
