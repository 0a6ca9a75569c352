"""The rules every SQS batch action shares: entry count, entry ids, per-entry failures."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from postbox_server.aws.errors import AwsError
from postbox_server.aws.sqs.errors import (
    BATCH_ENTRY_IDS_NOT_DISTINCT,
    EMPTY_BATCH_REQUEST,
    INVALID_BATCH_ENTRY_ID,
    TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
)

MAX_ENTRIES = 10
_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")


def entries(params: Mapping[str, Any], entry_name: str) -> list[dict[str, Any]]:
    """The request's entries, refused as a whole if their number or ids break SQS's rules."""
    found = params.get("Entries") or []
    if not found:
        raise AwsError(
            EMPTY_BATCH_REQUEST, f"There should be at least one {entry_name} in the request."
        )
    if len(found) > MAX_ENTRIES:
        raise AwsError(
            TOO_MANY_ENTRIES_IN_BATCH_REQUEST,
            f"Maximum number of entries per request are {MAX_ENTRIES}. You have sent {len(found)}.",
        )
    seen = set()
    for entry in found:
        entry_id = entry.get("Id")
        if entry_id is None or not _ID.match(entry_id):
            raise AwsError(
                INVALID_BATCH_ENTRY_ID,
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise AwsError(BATCH_ENTRY_IDS_NOT_DISTINCT, f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return found


def failure(entry_id: str, error: AwsError) -> dict[str, Any]:
    return {
        "Id": entry_id,
        "SenderFault": error.kind.sender,
        "Code": error.kind.code,
        "Message": error.message,
    }
