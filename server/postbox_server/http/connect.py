"""The Connect protocol's wire (connectrpc.com/docs/protocol): codes, errors, envelopes.

Unary calls carry one bare message in the body (application/json or application/proto);
streaming calls carry enveloped messages (application/connect+json, +proto), each a flag
byte and a 4-byte big-endian length, and end with an end-of-stream envelope holding the
error, if any, as JSON.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from postbox_server.errors import quoted

# The spec's HTTP status of each code, for unary responses (streams always answer 200).
HTTP_STATUS = {
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
CODES = tuple(
    # Connect spells gRPC's CANCELLED the American way.
    "canceled" if code is grpc.StatusCode.CANCELLED else code.name.lower()
    for code in HTTP_STATUS
)

UNARY_TYPES = {"application/json": "json", "application/proto": "proto"}
STREAM_TYPES = {"application/connect+json": "json", "application/connect+proto": "proto"}
END_STREAM = 0x02
COMPRESSED = 0x01
_PREFIX = struct.Struct(">BI")
# Connect-Timeout-Ms: at most 10 digits, says the spec.
MAX_TIMEOUT_DIGITS = 10
_TIMEOUT = re.compile(rf"[0-9]{{1,{MAX_TIMEOUT_DIGITS}}}")


def code_name(code: grpc.StatusCode) -> str:
    return "canceled" if code is grpc.StatusCode.CANCELLED else code.name.lower()


@dataclass(frozen=True)
class ConnectError(Exception):
    """A call's failure as the client will see it."""

    code: grpc.StatusCode
    message: str

    @property
    def status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)

    def json(self) -> dict[str, Any]:
        return {"code": code_name(self.code), "message": self.message}

    def body(self) -> bytes:
        return json.dumps(self.json()).encode()


def invalid(message: str) -> ConnectError:
    return ConnectError(grpc.StatusCode.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class Codec:
    """proto3 JSON or binary protobuf, for one content type."""

    name: str

    def decode(self, data: bytes, message_class: type[Message]) -> Message:
        """The request, or ValueError saying what is wrong with it."""
        message = message_class()
        if self.name == "proto":
            try:
                message.ParseFromString(data)
            except DecodeError as error:
                raise ValueError(f"not a valid protobuf message: {error}") from None
            return message
        if not data.strip():
            # As connect-go: a message in JSON is an object, "{}" when empty.
            raise ValueError("the body is empty; an empty message is {} in JSON")
        try:
            text = data.decode()
        except UnicodeDecodeError as error:
            raise ValueError(f"the body is not UTF-8: {error}") from None
        if not text.lstrip().startswith("{"):
            raise ValueError("the body is not a JSON object; a message in JSON is one")
        try:
            json_format.Parse(text, message, ignore_unknown_fields=False)
        except json_format.ParseError as error:
            raise ValueError(f"not the request message in proto3 JSON: {error}") from None
        return message

    def encode(self, message: Message) -> bytes:
        if self.name == "proto":
            return message.SerializeToString()
        return json_format.MessageToJson(message, indent=None).encode()


def envelope(flags: int, payload: bytes) -> bytes:
    return _PREFIX.pack(flags, len(payload)) + payload


def end_of_stream(error: ConnectError | None) -> bytes:
    body: dict[str, Any] = {} if error is None else {"error": error.json()}
    return envelope(END_STREAM, json.dumps(body).encode())


def single_envelope(data: bytes) -> bytes:
    """The one message a server-streaming request's body holds, or ValueError."""
    if len(data) < _PREFIX.size:
        raise ValueError(
            f"the body holds {len(data)} bytes; a streaming request is one enveloped message "
            "(a flag byte, a 4-byte big-endian length, the message)"
        )
    flags, length = _PREFIX.unpack_from(data)
    if flags & COMPRESSED:
        raise ValueError("the request envelope is compressed; this server takes it uncompressed")
    if flags & ~COMPRESSED:
        raise ValueError(f"the request envelope has unknown flags {flags:#04x}")
    if len(data) != _PREFIX.size + length:
        raise ValueError(
            f"the envelope says {length} bytes but {len(data) - _PREFIX.size} follow it; "
            "a server-streaming request is exactly one message"
        )
    return data[_PREFIX.size :]


def timeout_seconds(header: str | None) -> float | None:
    """Connect-Timeout-Ms as seconds (None: no deadline), or a ConnectError."""
    if header is None:
        return None
    if not _TIMEOUT.fullmatch(header):
        raise invalid(
            f"Connect-Timeout-Ms is {quoted(header)}; it must be a positive integer of at "
            f"most {MAX_TIMEOUT_DIGITS} digits"
        )
    return int(header) / 1000
