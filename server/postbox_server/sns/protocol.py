"""SNS's query protocol, read from botocore's own model of the service.

Requests are form parameters that boto3's QuerySerializer flattens (`Tags.member.1.Key`,
`Attributes.entry.1.key`, `MessageAttributes.entry.1.Name`); responses are XML in the
shape its QueryParser reads. Both directions walk the model botocore ships, so every
action's parameters and results are named and typed as AWS names and types them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
from collections.abc import Mapping
from typing import Any
from xml.etree import ElementTree

import botocore.session
from botocore.model import ListShape, MapShape, OperationModel, ServiceModel, Shape, StructureShape

from postbox_server.sqs.errors import SqsError

NAMESPACE = "http://sns.amazonaws.com/doc/2010-03-31/"
VERSION = "2010-03-31"
CONTENT_TYPE = "text/xml"
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@functools.cache
def model() -> ServiceModel:
    return botocore.session.get_session().get_service_model("sns")


def operation(action: str) -> OperationModel | None:
    return model().operation_model(action) if action in model().operation_names else None


def decode(op: OperationModel, form: Mapping[str, str], invalid: type[Exception]) -> dict[str, Any]:
    """The action's parameters, named and typed as boto3 names them."""
    if op.input_shape is None:
        return {}
    return _structure(op.input_shape, form, "", invalid) or {}


def _name(shape: Shape, default: str) -> str:
    return shape.serialization.get("name", default)


def _indices(form: Mapping[str, str], key: str) -> list[int]:
    start = key + "."
    found = {
        int(head)
        for name in form
        if name.startswith(start) and (head := name[len(start) :].split(".", 1)[0]).isdigit()
    }
    return sorted(found)


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
        items = [_value(shape.member, form, f"{base}.{i}", invalid) for i in _indices(form, base)]
        return [item for item in items if item is not None] or None
    if isinstance(shape, MapShape):
        base = key if shape.serialization.get("flattened") else f"{key}.entry"
        key_name, value_name = _name(shape.key, "key"), _name(shape.value, "value")
        result = {}
        for i in _indices(form, base):
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


def encode_result(op: OperationModel, result: Mapping[str, Any], request_id: str) -> bytes:
    root = ElementTree.Element(f"{op.name}Response", xmlns=NAMESPACE)
    shape = op.output_shape
    if shape is not None:
        # The wrapper even when empty: botocore looks for it.
        wrapper = ElementTree.SubElement(
            root, shape.serialization.get("resultWrapper", f"{op.name}Result")
        )
        _members(wrapper, shape, result)
    metadata = ElementTree.SubElement(root, "ResponseMetadata")
    ElementTree.SubElement(metadata, "RequestId").text = request_id
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


def encode_error(error: SqsError, request_id: str) -> bytes:
    root = ElementTree.Element("ErrorResponse", xmlns=NAMESPACE)
    detail = ElementTree.SubElement(root, "Error")
    ElementTree.SubElement(detail, "Type").text = error.kind.fault
    ElementTree.SubElement(detail, "Code").text = error.kind.code
    ElementTree.SubElement(detail, "Message").text = _text(error.message)
    ElementTree.SubElement(root, "RequestId").text = request_id
    return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)


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
            ElementTree.SubElement(entry, _name(shape.key, "key")).text = _text(key)
            _emit(entry, _name(shape.value, "value"), shape.value, item)
    elif isinstance(shape, StructureShape):
        _members(ElementTree.SubElement(parent, name), shape, value)
    elif shape.type_name == "boolean":
        ElementTree.SubElement(parent, name).text = "true" if value else "false"
    elif shape.type_name == "blob":
        ElementTree.SubElement(parent, name).text = base64.b64encode(value).decode("ascii")
    else:
        ElementTree.SubElement(parent, name).text = _text(str(value))


def _text(value: str) -> str:
    return _NOT_XML.sub("\ufffd", value)
