"""The shapes of an AWS action's input and output, with member names in both protocols.

The JSON protocol names members as the service model does; the query protocol (and its
XML responses) renames some of them and flattens every list and map: a list member
`AttributeNames` travels as `AttributeName.1`, `AttributeName.2`, ...; a map member
`Attributes` as `Attribute.1.Name` / `Attribute.1.Value`. Actions read and write the
JSON names; the codecs in `jsonproto` and `query` use these shapes to translate.
"""

from __future__ import annotations

import base64
import binascii
import enum
from dataclasses import dataclass

from postbox_server.aws.errors import invalid_parameter


class Scalar(enum.Enum):
    STRING = "string"
    INTEGER = "integer"
    LONG = "long"
    BOOLEAN = "boolean"
    # Raw bytes, base64 on the wire in both protocols.
    BLOB = "blob"


@dataclass(frozen=True)
class Member:
    name: str
    shape: Shape
    # Query/XML name, when it differs from the JSON name.
    query_name: str | None = None
    # Further query names accepted on input (SDKs have sent more than one spelling).
    aliases: tuple[str, ...] = ()

    @property
    def wire_name(self) -> str:
        return self.query_name or self.name


@dataclass(frozen=True)
class Structure:
    members: tuple[Member, ...]


@dataclass(frozen=True)
class ListOf:
    member: Shape


@dataclass(frozen=True)
class MapOf:
    value: Shape
    key_name: str = "Name"
    value_name: str = "Value"


Shape = Scalar | Structure | ListOf | MapOf

STRING, INTEGER, LONG, BOOLEAN, BLOB = Scalar


def decode_blob(text: str, parameter: str) -> bytes:
    """A BLOB parameter's bytes from its base64 text, as both protocols carry it."""
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid_parameter(
            f"Value for parameter {parameter} is invalid. Reason: must be base64-encoded."
        ) from None


def struct(*members: Member) -> Structure:
    return Structure(members)


def m(name: str, shape: Shape, query_name: str | None = None, *aliases: str) -> Member:
    return Member(name, shape, query_name, aliases)
