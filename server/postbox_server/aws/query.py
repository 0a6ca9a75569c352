"""The query protocol of AWS's older services (SQS, SNS): form parameters in, XML out.

One reader of forms for both services (`form_text`, `parse_form`), one XML envelope and
one error document; the parameters are decoded by the shapes of `postbox_server.aws.shapes`
here (SQS) or by botocore's model in `modelquery` (SNS).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl
from xml.etree import ElementTree

from postbox_server.aws.errors import MISSING_ACTION, AwsError, invalid_parameter
from postbox_server.aws.shapes import ListOf, MapOf, Scalar, Shape, Structure, decode_blob
from postbox_server.errors import quoted

CONTENT_TYPE = "text/xml"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"

# Characters XML 1.0 cannot carry at all; SQS never accepts them in a message, but a
# message sent through gRPC may hold them.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")


def form_text(body: bytes) -> str:
    """A form body as text. Bytes that are not UTF-8 are refused, not replaced: the
    message would differ from what the client sent, and so would its MD5OfMessageBody."""
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise invalid_parameter(f"The request body is not valid UTF-8: {error}.") from None


def parse_form(text: str) -> dict[str, str]:
    """Form parameters; a name given twice keeps its first value."""
    form: dict[str, str] = {}
    try:
        pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
    except (UnicodeDecodeError, ValueError) as error:
        raise invalid_parameter(
            f"The request parameters are not valid form data: {error}."
        ) from None
    for key, value in pairs:
        form.setdefault(key, value)
    return form


def decode(shape: Structure, form: Mapping[str, str]) -> dict[str, Any]:
    """The parameters of an action as the JSON protocol names and types them."""
    return _structure(shape, form, "") or {}


def _structure(shape: Structure, form: Mapping[str, str], prefix: str) -> dict[str, Any] | None:
    result = {}
    for member in shape.members:
        for name in (member.wire_name, *member.aliases):
            value = _value(member.shape, form, prefix + name)
            if value is not None:
                result[member.name] = value
                break
    return result or None


def indices(form: Mapping[str, str], key: str) -> list[int]:
    """The N of every `key.N` or `key.N.<more>` in the form, in order."""
    start = key + "."
    found = set()
    for name in form:
        if name.startswith(start):
            head = name[len(start) :].split(".", 1)[0]
            if head.isdigit():
                found.add(int(head))
    return sorted(found)


def _value(shape: Shape, form: Mapping[str, str], key: str) -> Any:
    if isinstance(shape, Scalar):
        return _scalar(shape, form[key], key) if key in form else None
    if isinstance(shape, Structure):
        return _structure(shape, form, key + ".")
    if isinstance(shape, ListOf):
        items = [_value(shape.member, form, f"{key}.{i}") for i in indices(form, key)]
        return [item for item in items if item is not None] or None
    result = {}
    for i in indices(form, key):
        entry = f"{key}.{i}."
        name = form.get(entry + shape.key_name)
        if name is None:
            raise invalid_parameter(
                f"The request must contain the parameter {entry}{shape.key_name}."
            )
        value = _value(shape.value, form, entry + shape.value_name)
        if value is None:
            raise invalid_parameter(
                f"The request must contain the parameter {entry}{shape.value_name}."
            )
        result[name] = value
    return result or None


def _scalar(kind: Scalar, text: str, key: str) -> Any:
    if kind in (Scalar.INTEGER, Scalar.LONG):
        if not _INTEGER.match(text):
            raise invalid_parameter(
                f"Value {quoted(text)} for parameter {key} is invalid. Reason: must be an integer."
            )
        return int(text)
    if kind is Scalar.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise invalid_parameter(
                f"Value {quoted(text)} for parameter {key} is invalid. "
                "Reason: must be true or false."
            )
        return text.lower() == "true"
    if kind is Scalar.BLOB:
        return decode_blob(text, key)
    return text


def action(form: Mapping[str, str]) -> str:
    """The action a form names; MissingAction without one."""
    name = form.get("Action", "")
    if not name:
        raise AwsError(MISSING_ACTION, "The request must contain the parameter Action.")
    return name


def envelope(
    action: str, namespace: str, request_id: str, result: str | None
) -> tuple[ElementTree.Element, ElementTree.Element | None]:
    """An action's response document: `<ActionResponse>`, its result element (named
    `result`, None for none) and its ResponseMetadata; the caller fills the result."""
    root = ElementTree.Element(f"{action}Response", xmlns=namespace)
    wrapper = None if result is None else ElementTree.SubElement(root, result)
    metadata = ElementTree.SubElement(root, "ResponseMetadata")
    ElementTree.SubElement(metadata, "RequestId").text = request_id
    return root, wrapper


def encode_result(
    action: str, shape: Structure, result: Mapping[str, Any], request_id: str, namespace: str
) -> bytes:
    root, wrapper = envelope(
        action, namespace, request_id, f"{action}Result" if shape.members else None
    )
    if wrapper is not None:
        _members(wrapper, shape, result)
    return serialize(root)


def encode_error(error: AwsError, request_id: str, namespace: str, detail: bool = True) -> bytes:
    """The error document; `detail`: with the empty Detail element SQS sends (SNS does not)."""
    root = ElementTree.Element("ErrorResponse", xmlns=namespace)
    element = ElementTree.SubElement(root, "Error")
    ElementTree.SubElement(element, "Type").text = error.kind.fault
    ElementTree.SubElement(element, "Code").text = error.kind.code
    ElementTree.SubElement(element, "Message").text = text(error.message)
    if detail:
        ElementTree.SubElement(element, "Detail")
    ElementTree.SubElement(root, "RequestId").text = request_id
    return serialize(root)


def serialize(root: ElementTree.Element) -> bytes:
    # XML parsers turn a literal CR (and CRLF) into LF; SQS sends CR as a character
    # reference so that a body arrives as sent and matches its MD5OfBody.
    document = ElementTree.tostring(root, encoding="utf-8", xml_declaration=True)
    return document.replace(b"\r", b"&#13;")


def _members(parent: ElementTree.Element, shape: Structure, values: Mapping[str, Any]) -> None:
    for member in shape.members:
        if values.get(member.name) is not None:
            _emit(parent, member.wire_name, member.shape, values[member.name])


def _emit(parent: ElementTree.Element, name: str, shape: Shape, value: Any) -> None:
    if isinstance(shape, ListOf):  # flattened: one element per item
        for item in value:
            _emit(parent, name, shape.member, item)
    elif isinstance(shape, MapOf):  # flattened: one element per entry
        for key, item in value.items():
            entry = ElementTree.SubElement(parent, name)
            ElementTree.SubElement(entry, shape.key_name).text = text(key)
            _emit(entry, shape.value_name, shape.value, item)
    elif isinstance(shape, Structure):
        _members(ElementTree.SubElement(parent, name), shape, value)
    else:
        ElementTree.SubElement(parent, name).text = _scalar_text(shape, value)


def _scalar_text(kind: Scalar, value: Any) -> str:
    if kind is Scalar.BOOLEAN:
        return "true" if value else "false"
    if kind is Scalar.BLOB:
        return base64.b64encode(value).decode("ascii")
    return text(str(value))


def text(value: str) -> str:
    """Text XML can carry: what it cannot becomes U+FFFD."""
    return _NOT_XML.sub("\ufffd", value)
