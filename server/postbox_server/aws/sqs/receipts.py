"""Receipt handles: the opaque token SQS clients hold, carrying a postbox receipt.

A handle names its queue as well, so a handle used with another queue's URL is
refused as SQS refuses it, instead of reaching the wrong queue.
"""

from __future__ import annotations

import base64
import binascii

from postbox_server.aws.errors import AwsError
from postbox_server.aws.sqs.errors import RECEIPT_HANDLE_IS_INVALID
from postbox_server.errors import QUOTED_PREFIX

_VERSION = "1"


def encode(queue: str, receipt: str) -> str:
    raw = f"{_VERSION}\n{queue}\n{receipt}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode(handle: str, queue: str) -> str:
    """The postbox receipt in a handle that belongs to `queue`."""
    try:
        version, owner, receipt = (
            base64.urlsafe_b64decode(handle.encode("ascii")).decode().split("\n")
        )
    except (binascii.Error, UnicodeError, ValueError):
        raise invalid(handle) from None
    if version != _VERSION or owner != queue or not receipt:
        raise invalid(handle)
    return receipt


def invalid(handle: str) -> AwsError:
    # AWS's text, which puts the handle in double quotes; a long one is cut to a prefix
    # with its length, as quoted() cuts input.
    if len(handle) <= QUOTED_PREFIX:
        shown = f'"{handle}"'
    else:
        shown = f'"{handle[:QUOTED_PREFIX]}…" ({len(handle.encode(errors="surrogatepass"))} bytes)'
    return AwsError(
        RECEIPT_HANDLE_IS_INVALID,
        f"The input receipt handle {shown} is not a valid receipt handle.",
    )
