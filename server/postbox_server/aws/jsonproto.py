"""The awsJson 1.0 protocol with query compatibility (SQS's): JSON in, JSON out."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from postbox_server.aws.errors import INVALID_ACTION, AwsError, invalid_parameter
from postbox_server.aws.shapes import ListOf, MapOf, Scalar, Shape, Structure, decode_blob
from postbox_server.errors import quoted

CONTENT_TYPE = "application/x-amz-json-1.0"


def action_of(target: str, prefix: str) -> str:
    """The action an X-Amz-Target header names (`prefix`: the service's, "AmazonSQS.")."""
    if not target.startswith(prefix):
        raise AwsError(
            INVALID_ACTION, f"The action {quoted(target)} is not valid for this endpoint."
        )
    return target[len(prefix) :]


def decode(shape: Structure, body: bytes) -> dict[str, Any]:
    """The parameters of an action, checked against its input shape."""
    if not body.strip():
        return {}
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise invalid_parameter(f"The request body is not valid JSON: {error}.") from None
    if not isinstance(document, dict):
        raise invalid_parameter("The request body must be a JSON object of the parameters.")
    return _coerce(shape, document, "") or {}


def _coerce(shape: Shape, value: Any, path: str) -> Any:
    if value is None:
        return None
    if isinstance(shape, Structure):
        _expect(isinstance(value, dict), path, "an object")
        result = {}
        for member in shape.members:
            item = _coerce(member.shape, value.get(member.name), _join(path, member.name))
            if item is not None:
                result[member.name] = item
        return result
    if isinstance(shape, ListOf):
        _expect(isinstance(value, list), path, "a list")
        return [_coerce(shape.member, item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(shape, MapOf):
        _expect(isinstance(value, dict), path, "an object")
        return {key: _coerce(shape.value, item, f"{path}.{key}") for key, item in value.items()}
    if shape in (Scalar.INTEGER, Scalar.LONG):
        _expect(isinstance(value, int) and not isinstance(value, bool), path, "an integer")
    elif shape is Scalar.BOOLEAN:
        _expect(isinstance(value, bool), path, "true or false")
    else:
        _expect(isinstance(value, str), path, "a string")
        if shape is Scalar.BLOB:
            return decode_blob(value, path)
    return value


def _expect(ok: bool, path: str, what: str) -> None:
    if not ok:
        raise invalid_parameter(f"Value for parameter {path} is invalid. Reason: must be {what}.")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def encode_result(result: Mapping[str, Any]) -> bytes:
    return json.dumps(result, default=_blob, separators=(",", ":")).encode()


def _blob(value: Any) -> str:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    raise TypeError(f"cannot encode {type(value).__name__} in a response")


def encode_error(error: AwsError, namespace: str) -> tuple[bytes, dict[str, str]]:
    """The error's body and headers; `namespace` prefixes its shape ("com.amazonaws.sqs#")."""
    body = {"__type": namespace + error.kind.shape, "message": error.message}
    headers = {"x-amzn-query-error": f"{error.kind.code};{error.kind.fault}"}
    return json.dumps(body).encode(), headers
