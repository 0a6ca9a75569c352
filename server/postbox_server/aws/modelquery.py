"""The query protocol driven by botocore's own model of a service (SNS's).

Requests are form parameters that boto3's QuerySerializer flattens (`Tags.member.1.Key`,
`Attributes.entry.1.key`, `MessageAttributes.entry.1.Name`); responses are XML in the
shape its QueryParser reads. Both directions walk the model botocore ships, so every
action's parameters and results are named and typed as AWS names and types them. The
form reader, the envelope and the error document are the query protocol's (`query`).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

from botocore.model import ListShape, MapShape, OperationModel, Shape, StructureShape

from postbox_server.aws import query

_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def decode(op: OperationModel, form: Mapping[str, str], invalid: type[Exception]) -> dict[str, Any]:
    """The action's parameters, named and typed as boto3 names them."""
    if op.input_shape is None:
        return {}
    return _structure(op.input_shape, form, "", invalid) or {}


def _name(shape: Shape, default: str) -> str:
    return shape.serialization.get("name", default)


def _structure(
    shape: StructureShape, form: Mapping[str, str], prefix: str, invalid: type[Exception]
) -> dict[str, Any] | None:
    result = {}
    for name, member in shape.members.items():
        value = _value(member, form, prefix + _name(member, name), invalid)
        if value is not None:
            result[name] = value
    return result or None


def _value(shape: Shape, form: Mapping[str, str], key: str, invalid: type[Exception]) -> Any:
    if isinstance(shape, StructureShape):
        return _structure(shape, form, key + ".", invalid)
    if isinstance(shape, ListShape):
        base = (
            key
            if shape.serialization.get("flattened")
            else f"{key}.{_name(shape.member, 'member')}"
        )
        items = [
            _value(shape.member, form, f"{base}.{i}", invalid) for i in query.indices(form, base)
        ]
        return [item for item in items if item is not None] or None
    if isinstance(shape, MapShape):
        base = key if shape.serialization.get("flattened") else f"{key}.entry"
        key_name, value_name = _name(shape.key, "key"), _name(shape.value, "value")
        result = {}
        for i in query.indices(form, base):
            name = form.get(f"{base}.{i}.{key_name}")
            value = _value(shape.value, form, f"{base}.{i}.{value_name}", invalid)
            if name is None or value is None:
                raise invalid(
                    f"Invalid parameter: {base}.{i} needs a {key_name} and a {value_name}"
                )
            result[name] = value
        return result or None
    if key not in form:
        return None
    text = form[key]
    if shape.type_name in ("integer", "long"):
        if not _INTEGER.match(text):
            raise invalid(f"Invalid parameter: {key} must be an integer")
        return int(text)
    if shape.type_name == "boolean":
        if text.lower() not in ("true", "false"):
            raise invalid(f"Invalid parameter: {key} must be true or false")
        return text.lower() == "true"
    if shape.type_name == "blob":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise invalid(f"Invalid parameter: {key} must be base64") from None
    return text


def encode_result(
    op: OperationModel, result: Mapping[str, Any], request_id: str, namespace: str
) -> bytes:
    shape = op.output_shape
    # The wrapper even when empty: botocore looks for it.
    wrapper_name = (
        None if shape is None else shape.serialization.get("resultWrapper", f"{op.name}Result")
    )
    root, wrapper = query.envelope(op.name, namespace, request_id, wrapper_name)
    if shape is not None and wrapper is not None:
        _members(wrapper, shape, result)
    return query.serialize(root)


def _members(parent: ElementTree.Element, shape: StructureShape, values: Mapping[str, Any]) -> None:
    for name, member in shape.members.items():
        if values.get(name) is not None:
            _emit(parent, _name(member, name), member, values[name])


def _emit(parent: ElementTree.Element, name: str, shape: Shape, value: Any) -> None:
    if isinstance(shape, ListShape):
        element = ElementTree.SubElement(parent, name)
        for item in value:
            _emit(element, _name(shape.member, "member"), shape.member, item)
    elif isinstance(shape, MapShape):
        element = ElementTree.SubElement(parent, name)
        for key, item in value.items():
            entry = ElementTree.SubElement(element, "entry")
            ElementTree.SubElement(entry, _name(shape.key, "key")).text = query.text(key)
            _emit(entry, _name(shape.value, "value"), shape.value, item)
    elif isinstance(shape, StructureShape):
        _members(ElementTree.SubElement(parent, name), shape, value)
    elif shape.type_name == "boolean":
        ElementTree.SubElement(parent, name).text = "true" if value else "false"
    elif shape.type_name == "blob":
        ElementTree.SubElement(parent, name).text = base64.b64encode(value).decode("ascii")
    else:
        ElementTree.SubElement(parent, name).text = query.text(str(value))
