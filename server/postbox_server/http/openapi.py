"""The OpenAPI 3 document of the HTTP/JSON API, from the services' descriptors.

Every RPC is POST /<package>.<Service>/<Method> with its request and response messages
as schemas in the proto3 JSON mapping (the JSON names, int64 as strings, enums by name,
bytes in base64, the well-known types as their JSON forms), and the protos' comments as
descriptions. The comments are in the protos' source only, which grpcio-tools (a dev
dependency) compiles: `python -m postbox_server.http.openapi` prints the document
(scripts/generate-openapi writes api/openapi.json, which the wheel carries), and the
server serves that committed file at GET /openapi.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    ServiceDescriptor,
)
from google.protobuf.descriptor_pb2 import FileDescriptorSet

from postbox_server.http import connect
from postbox_server.http.constraints import (
    field_constraints,
    is_required,
    is_required_on_create,
    map_value_constraints,
    named_resource,
)

OPENAPI_VERSION = "3.1.0"
ERROR_SCHEMA = "connect.error"

# Decimal 64-bit integers (18 digits always fit), as proto3 JSON writes them.
_INT64 = r"^-?[0-9]{1,18}$"
_UINT64 = r"^[0-9]{1,18}$"
_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number", "format": "double"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number", "format": "float"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "uint32", "minimum": 0},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "format": "uint32", "minimum": 0},
    # proto3 JSON writes 64-bit integers as strings: JavaScript's numbers lose them.
    FieldDescriptor.TYPE_INT64: {"type": "string", "format": "int64", "pattern": _INT64},
    FieldDescriptor.TYPE_SINT64: {"type": "string", "format": "int64", "pattern": _INT64},
    FieldDescriptor.TYPE_SFIXED64: {"type": "string", "format": "int64", "pattern": _INT64},
    FieldDescriptor.TYPE_UINT64: {"type": "string", "format": "uint64", "pattern": _UINT64},
    FieldDescriptor.TYPE_FIXED64: {"type": "string", "format": "uint64", "pattern": _UINT64},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "format": "byte"},
}

# The well-known types' JSON forms (protobuf's JSON mapping), inline wherever they are used.
_WELL_KNOWN: dict[str, dict[str, Any]] = {
    "google.protobuf.Duration": {
        "type": "string",
        # protobuf's range is ±315,576,000,000 s; 11 digits always fit.
        "pattern": r"^-?[0-9]{1,11}(\.[0-9]{1,9})?s$",
        "description": "A duration in seconds with an `s` suffix, e.g. `30s` or `1.5s`.",
    },
    "google.protobuf.Timestamp": {
        "type": "string",
        "format": "date-time",
        "description": "An RFC 3339 time in UTC, e.g. `2026-01-02T03:04:05Z`.",
    },
    "google.protobuf.FieldMask": {
        "type": "string",
        "description": "Field paths in lowerCamelCase, comma-separated: `name,maxDepth`.",
    },
    "google.protobuf.Empty": {"type": "object"},
    "google.protobuf.Struct": {"type": "object", "additionalProperties": True},
    "google.protobuf.Value": {"description": "Any JSON value."},
    "google.protobuf.ListValue": {"type": "array", "items": {}},
    "google.protobuf.Any": {
        "type": "object",
        "properties": {"@type": {"type": "string"}},
        "required": ["@type"],
        "additionalProperties": True,
    },
    "google.protobuf.DoubleValue": {"type": ["number", "null"], "format": "double"},
    "google.protobuf.FloatValue": {"type": ["number", "null"], "format": "float"},
    "google.protobuf.Int64Value": {"type": ["string", "null"], "format": "int64"},
    "google.protobuf.UInt64Value": {"type": ["string", "null"], "format": "uint64"},
    "google.protobuf.Int32Value": {"type": ["integer", "null"], "format": "int32"},
    "google.protobuf.UInt32Value": {"type": ["integer", "null"], "format": "uint32"},
    "google.protobuf.BoolValue": {"type": ["boolean", "null"]},
    "google.protobuf.StringValue": {"type": ["string", "null"]},
    "google.protobuf.BytesValue": {"type": ["string", "null"], "format": "byte"},
}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


# Where FileDescriptorProto and DescriptorProto keep what (descriptor.proto's field
# numbers), as source_code_info's location paths spell them.
_FILE_MESSAGES, _FILE_ENUMS, _FILE_SERVICES = 4, 5, 6
_MESSAGE_FIELDS, _MESSAGE_NESTED, _MESSAGE_ENUMS, _MESSAGE_ONEOFS = 2, 3, 4, 8
_ENUM_VALUES, _SERVICE_METHODS = 2, 2


def _text(comment: str) -> str:
    """A proto comment as prose: its lines unindented, paragraphs kept."""
    lines = [line[1:] if line.startswith(" ") else line for line in comment.strip().split("\n")]
    return "\n".join(lines).strip()


def _enum_names(names: dict[tuple[int, ...], str], path: tuple[int, ...], scope: str,
                enum_list: Any) -> None:  # fmt: skip
    for i, enum in enumerate(enum_list):
        here = (*path, i)
        names[here] = f"{scope}{enum.name}"
        for j, value in enumerate(enum.value):
            value_path = (*here, _ENUM_VALUES, j)
            names[value_path] = f"{scope}{enum.name}.{value.name}"


def _message_names(names: dict[tuple[int, ...], str], path: tuple[int, ...], scope: str,
                   message_list: Any) -> None:  # fmt: skip
    for i, message in enumerate(message_list):
        name = f"{scope}{message.name}"
        here = (*path, i)
        names[here] = name
        for j, field in enumerate(message.field):
            field_path = (*here, _MESSAGE_FIELDS, j)
            names[field_path] = f"{name}.{field.name}"
        for j, oneof in enumerate(message.oneof_decl):
            oneof_path = (*here, _MESSAGE_ONEOFS, j)
            names[oneof_path] = f"{name}.{oneof.name}"
        _message_names(names, (*here, _MESSAGE_NESTED), f"{name}.", message.nested_type)
        _enum_names(names, (*here, _MESSAGE_ENUMS), f"{name}.", message.enum_type)


def comments_of(files: FileDescriptorSet) -> dict[str, str]:
    """The leading comment of every message, field, oneof, enum, enum value, service and
    method, by full name (an enum value under its enum's name: postbox.v1.ReceiveMode.X)."""
    found: dict[str, str] = {}
    for file in files.file:
        names: dict[tuple[int, ...], str] = {}
        prefix = f"{file.package}." if file.package else ""
        _message_names(names, (_FILE_MESSAGES,), prefix, file.message_type)
        _enum_names(names, (_FILE_ENUMS,), prefix, file.enum_type)
        for i, service in enumerate(file.service):
            names[(_FILE_SERVICES, i)] = f"{prefix}{service.name}"
            for j, method in enumerate(service.method):
                names[(_FILE_SERVICES, i, _SERVICE_METHODS, j)] = (
                    f"{prefix}{service.name}.{method.name}"
                )
        for location in file.source_code_info.location:
            name = names.get(tuple(location.path))
            if name is not None and location.leading_comments.strip():
                found[name] = _text(location.leading_comments)
    return found


class _Schemas:
    """The components/schemas of every message and enum the methods reach."""

    def __init__(self, comments: Mapping[str, str], responses: frozenset[str] = frozenset()):
        self.schemas: dict[str, dict[str, Any]] = {}
        self.comments = comments
        # Messages a response may hold: their "Required." fields are not listed as
        # required, since proto3 JSON leaves out a field at its default (a 0 offset).
        self.responses = responses

    def message(self, descriptor: Descriptor) -> dict[str, Any]:
        if descriptor.full_name in _WELL_KNOWN:
            return dict(_WELL_KNOWN[descriptor.full_name])
        if descriptor.full_name not in self.schemas:
            schema: dict[str, Any] = {"type": "object", "properties": {}}
            self.schemas[descriptor.full_name] = schema  # before the fields: recursion
            required = []
            for field in descriptor.fields:
                comment = self.comments.get(field.full_name, "")
                property_schema = self.constrained(field, comment)
                if comment:
                    property_schema["description"] = comment
                schema["properties"][field.json_name] = self.created(
                    descriptor, field, property_schema
                )
                if is_required(comment) and (
                    descriptor.full_name not in self.responses or _never_zero(property_schema)
                ):
                    required.append(field.json_name)
            if required:
                schema["required"] = required
            oneofs = [o for o in descriptor.oneofs if not o.name.startswith("_")]
            # At most one member of a oneof; at least one when its comment says "Required."
            rules: list[dict[str, Any]] = [
                {"not": {"required": [first.json_name, second.json_name]}}
                for oneof in oneofs
                for i, first in enumerate(oneof.fields)
                for second in oneof.fields[i + 1 :]
            ]
            rules += [
                {"anyOf": [{"required": [member.json_name]} for member in oneof.fields]}
                for oneof in oneofs
                if is_required(self.comments.get(oneof.full_name, ""))
            ]
            if rules:
                schema["allOf"] = rules
            notes = [self.comments.get(descriptor.full_name, "")]
            notes += [
                f"At most one of {', '.join(f.json_name for f in o.fields)} is set."
                for o in descriptor.oneofs
                if not o.name.startswith("_")  # proto3 `optional` fields' synthetic oneofs
            ]
            if any(notes):
                schema["description"] = "\n\n".join(note for note in notes if note)
            schema["additionalProperties"] = False
        return _ref(descriptor.full_name)

    def enum(self, descriptor: EnumDescriptor) -> dict[str, Any]:
        if descriptor.full_name not in self.schemas:
            schema: dict[str, Any] = {
                "type": "string",
                "enum": [value.name for value in descriptor.values],
            }
            lines = [self.comments.get(descriptor.full_name, "")]
            for value in descriptor.values:
                comment = self.comments.get(f"{descriptor.full_name}.{value.name}")
                if comment:
                    lines.append(f"- `{value.name}`: {' '.join(comment.split())}")
            if any(lines):
                schema["description"] = "\n".join(line for line in lines if line).strip()
            self.schemas[descriptor.full_name] = schema
        return _ref(descriptor.full_name)

    def created(
        self, request: Descriptor, field: FieldDescriptor, property_schema: dict[str, Any]
    ) -> dict[str, Any]:
        """In a Create request, the resource with its "Required on create" fields required
        (the resource's own schema cannot say so: Get and Update share it)."""
        resource = field.message_type
        if not request.name.startswith("Create") or resource is None or field.is_repeated:
            return property_schema
        on_create = [
            f.json_name
            for f in resource.fields
            if is_required_on_create(self.comments.get(f.full_name, ""))
        ]
        if not on_create:
            return property_schema
        description = property_schema.pop("description", None)
        given = {"required": on_create, "properties": {n: {"minLength": 1} for n in on_create}}
        schema: dict[str, Any] = {"allOf": [property_schema, given]}
        if description:
            schema["description"] = description
        return schema

    def constrained(self, field: FieldDescriptor, comment: str) -> dict[str, Any]:
        """A field's schema with the limits its comment states (postbox_server/http/constraints)."""
        property_schema = self.field(field)
        property_schema.update(field_constraints(field, comment, self.comments))
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            if message.fields_by_name["value"].type == FieldDescriptor.TYPE_STRING:
                property_schema["additionalProperties"].update(map_value_constraints(comment))
        elif field.enum_type is not None and not field.is_repeated and is_required(comment):
            unspecified = field.enum_type.values_by_number.get(0)
            if unspecified is not None:  # "Required": the zero value, unset, is refused
                property_schema["not"] = {"const": unspecified.name}
        return property_schema

    def single(self, field: FieldDescriptor) -> dict[str, Any]:
        if field.message_type is not None:
            return self.message(field.message_type)
        if field.enum_type is not None:
            return self.enum(field.enum_type)
        return dict(_SCALARS[field.type])

    def field(self, field: FieldDescriptor) -> dict[str, Any]:
        message = field.message_type
        if message is not None and message.GetOptions().map_entry:
            return {
                "type": "object",
                "additionalProperties": self.single(message.fields_by_name["value"]),
            }
        if field.is_repeated:
            return {"type": "array", "items": self.single(field)}
        return self.single(field)


def _link(
    paths: dict[str, Any], services: Sequence[ServiceDescriptor], comments: Mapping[str, str]
) -> None:
    """OpenAPI links, for clients and stateful fuzzers that chain calls: from every answer
    that holds a resource (CreateQueueResponse.queue) to every call that names one of
    its kind ("Name of the queue"), with the name, and the topic when both have one."""
    methods = [
        (f"/{service.full_name}/{method.name}", service, method)
        for service in services
        for method in service.methods
        if not method.client_streaming
    ]
    for path, _, producer in methods:
        links: dict[str, Any] = {}
        for held in producer.output_type.fields:
            resource = held.message_type
            if resource is None or held.is_repeated or "name" not in resource.fields_by_name:
                continue
            for _, service, consumer in methods:
                body = {}
                for field in consumer.input_type.fields:
                    if named_resource(comments.get(field.full_name, "")) == resource.full_name:
                        body[field.json_name] = f"$response.body#/{held.json_name}/name"
                topic = consumer.input_type.fields_by_name.get("topic")
                if body and topic is not None and "topic" in resource.fields_by_name:
                    body.setdefault("topic", f"$response.body#/{held.json_name}/topic")
                if body:
                    links[f"{consumer.name}With{resource.name}"] = {
                        "operationId": f"{service.name}_{consumer.name}",
                        "requestBody": body,
                    }
        if links:
            paths[path]["post"]["responses"]["200"]["links"] = links


def _never_zero(schema: dict[str, Any]) -> bool:
    """Whether a required field's own rules refuse its zero value ("" or 0 or an empty
    list), so that proto3 JSON, which leaves out zero values, always writes it."""
    if "$ref" in schema or schema.get("minItems", 0) >= 1:
        return True
    if schema.get("type") == "string" and "format" not in schema:
        pattern = schema.get("pattern", "^(")  # an optional field's pattern allows ""
        return schema.get("minLength", 0) >= 1 or not pattern.startswith("^(")
    return schema.get("type") == "integer" and schema.get("minimum", 0) >= 1


def _reachable(descriptor: Descriptor, seen: set[str] | None = None) -> set[str]:
    """The full names of a message and of every message its fields hold, at any depth."""
    seen = set() if seen is None else seen
    if descriptor.full_name not in seen:
        seen.add(descriptor.full_name)
        for field in descriptor.fields:
            if field.message_type is not None:
                _reachable(field.message_type, seen)
    return seen


def _error_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "A Connect error; the HTTP status follows from its code.",
        "properties": {
            "code": {"type": "string", "enum": list(connect.CODES)},
            "message": {"type": "string"},
            "details": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "type": {"type": "string"},
                        "value": {"type": "string", "format": "byte"},
                    },
                },
            },
        },
        "required": ["code"],
    }


def _operation(schemas: _Schemas, service: ServiceDescriptor, method: Any) -> dict[str, Any]:
    request = schemas.message(method.input_type)
    response = schemas.message(method.output_type)
    error = {"application/json": {"schema": _ref(ERROR_SCHEMA)}}
    operation: dict[str, Any] = {
        "operationId": f"{service.name}_{method.name}",
        "tags": [service.name],
        "description": schemas.comments.get(method.full_name, ""),
        "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
        "responses": {
            "200": {
                "description": "The response message.",
                "content": {"application/json": {"schema": response}},
            },
            "default": {"description": "A Connect error.", "content": error},
        },
    }
    transport = ""
    if method.server_streaming:
        transport = (
            "Server streaming. With `application/json` the answer comes when the stream "
            "ends: its responses merged into one (repeated fields concatenated). With "
            "`application/connect+json` each response is an enveloped message of the "
            "Connect streaming protocol."
        )
    operation["description"] = "\n\n".join(t for t in (operation["description"], transport) if t)
    if not operation["description"]:
        del operation["description"]
    return operation


def document(
    services: Sequence[ServiceDescriptor], comments: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The OpenAPI document of `services`, their methods in the order the protos declare,
    described by `comments` (comments_of); its version is their package's (v1 of
    postbox.v1), which changes only additively."""
    version = services[0].file.package.rpartition(".")[2]
    responses = frozenset(
        name
        for service in services
        for method in service.methods
        for name in _reachable(method.output_type)
    )
    schemas = _Schemas(comments or {}, responses)
    paths: dict[str, Any] = {}
    for service in services:
        for method in service.methods:
            if method.client_streaming:
                continue  # gRPC only: over HTTP it answers 501, so the document leaves it out
            paths[f"/{service.full_name}/{method.name}"] = {
                "post": _operation(schemas, service, method)
            }
    _link(paths, services, schemas.comments)
    components = {name: schemas.schemas[name] for name in sorted(schemas.schemas)}
    components[ERROR_SCHEMA] = _error_schema()
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "postbox",
            "version": version,
            "description": (
                "The postbox API over HTTP: the Connect protocol's unary JSON wire. POST the "
                "request message as JSON (Content-Type: application/json); the answer is the "
                "response message, or a Connect error with its HTTP status. Generated from "
                "protos/postbox/v1 by scripts/generate-openapi."
            ),
        },
        "security": [{"bearer": []}],
        "tags": [
            {"name": service.name, "description": schemas.comments.get(service.full_name, "")}
            for service in services
        ],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key: `Authorization: Bearer <secret>`, when the "
                    "server has keys.",
                }
            },
        },
    }


_PACKAGE = Path(__file__).resolve().parent
# server/postbox_server/http in a checkout: the checkout's root is three folders up.
_CHECKOUT = _PACKAGE.parent.parent.parent
PROTOS = _CHECKOUT / "protos"


def source_comments(protos: Path = PROTOS) -> dict[str, str]:
    """The comments of the protos under `protos`, compiled with their source info by
    grpcio-tools (the generator's dependency, not the server's)."""
    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "protos.binpb"
        subprocess.run(
            [sys.executable, "-m", "grpc_tools.protoc", f"-I{protos}", "--include_source_info",
             f"--descriptor_set_out={out}",
             *sorted(str(p.relative_to(protos)) for p in protos.glob("postbox/v1/*.proto"))],
            check=True,
        )  # fmt: skip
        return comments_of(FileDescriptorSet.FromString(out.read_bytes()))


def postbox_document() -> dict[str, Any]:
    """The document of postbox's five services, described by the protos' comments."""
    from postbox_server.services.catalog import SERVICES

    return document(SERVICES, source_comments())


def render(openapi: dict[str, Any]) -> str:
    return json.dumps(openapi, indent=2) + "\n"


def committed_document() -> bytes:
    """api/openapi.json: the checkout's, or the copy the wheel carries beside this module."""
    for candidate in (_CHECKOUT / "api" / "openapi.json", _PACKAGE / "openapi.json"):
        if candidate.is_file():
            return candidate.read_bytes()
    raise FileNotFoundError("api/openapi.json not found next to the server package")


def main() -> None:
    sys.stdout.write(render(postbox_document()))


if __name__ == "__main__":
    main()
