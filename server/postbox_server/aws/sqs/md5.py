"""MD5 digests of message bodies and attributes, computed exactly as SQS computes them.

SDKs check these against what they sent or received and fail on a mismatch.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping

from postbox.v1 import message_pb2

# Transport type bytes of the attribute digest.
_STRING, _BINARY = 1, 2


def of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8")).hexdigest()


def of_attributes(attributes: Mapping[str, message_pb2.AttributeValue]) -> str | None:
    """The digest over the attributes sorted by name; None when there are none.

    Per attribute: name, data type and value, each as a 4-byte big-endian length and
    its bytes, with one transport byte (1 string or number, 2 binary) before the value.
    """
    if not attributes:
        return None
    digest = hashlib.md5()
    for name in sorted(attributes):
        value = attributes[name]
        _field(digest, name.encode("utf-8"))
        _field(digest, value.data_type.encode("utf-8"))
        if value.WhichOneof("value") == "binary_value":
            digest.update(bytes([_BINARY]))
            _field(digest, value.binary_value)
        else:
            digest.update(bytes([_STRING]))
            _field(digest, value.string_value.encode("utf-8"))
    return digest.hexdigest()


def _field(digest: hashlib._Hash, data: bytes) -> None:
    digest.update(struct.pack(">I", len(data)))
    digest.update(data)
