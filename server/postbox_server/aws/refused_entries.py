"""A batch whose bodies a payload schema refuses one by one: SQS's SendMessageBatch and
SNS's PublishBatch report each entry's failure, while postbox refuses a SendBatch or
PublishBatch whole, naming the first bad entry (in trailing metadata) and storing
nothing. So the shim sends again without that entry, at most once per entry; each
refusal comes before any write."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from postbox_server.aws.errors import AwsError
from postbox_server.services.payload_schema_cache import REJECTED_ENTRY

Entry = TypeVar("Entry")
Response = TypeVar("Response")

# How the server's refusal names the entry: its postbox index, which means nothing to
# the AWS client, whose failure names the entry's Id.
_ENTRY_PREFIX = re.compile(r"^entry \d+: ")


async def send_accepted(
    valid: list[tuple[str, Entry]],
    send: Callable[[list[Entry]], Awaitable[Response]],
    failed: Callable[[str, AwsError], None],
) -> Response | None:
    """`send`s the entries of `valid` (id, entry) whose bodies the schema accepts, in one
    call; removes the others from `valid`, telling `failed` of each. None when none
    was sent."""
    while valid:
        try:
            return await send([entry for _, entry in valid])
        except AwsError as error:
            rejected = error.metadata.get(REJECTED_ENTRY)
            if rejected is None:
                raise
            entry_id, _ = valid.pop(int(rejected))
            error.message = _ENTRY_PREFIX.sub("", error.message)
            failed(entry_id, error)
    return None
