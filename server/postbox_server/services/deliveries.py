"""Deliveries named by number: the REST API's `id` of a received message, which
beyond-queue's clients delete and change the visibility of a message by.

Each receive of a message raises its receive count, so (message id, receive count)
names one delivery. The number packs both: message id * 4096 + receive count mod
4096, below 2^53 (JavaScript reads it exactly) for message ids below 2^41. The
servicers take it as a receipt of its own form, "<message id>#<receive count mod
4096>", and trade it in the engine for the message's receipt while that delivery
holds it (postbox.delivery_receipts), so every server process resolves it and the
lease check still applies: a number whose message was delivered again since is
stale, as its receipt is. The one exception is the wrap: 4096 deliveries later the
same number names the newest delivery again.

The REST API keeps the receive-count part 0 for the message itself: a send answers
message id * 4096 (a delivery whose receive count is a multiple of 4096 is named by
its receipt instead), so a send's id and a receive's never name the same thing.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from typing import Protocol

from postbox_server.errors import ApiError

# Receive counts a number tells apart: a stale number acts again only 4096 deliveries on.
COUNTS = 4096
# The numbers JavaScript holds exactly (Number.MAX_SAFE_INTEGER + 1).
LIMIT = 2**53
_FORM = re.compile(r"([0-9]{1,19})#([0-9]{1,4})")


def number(message_id: int, receive_count: int) -> int | None:
    """The delivery's number, or None for a message id too large to pack below 2^53 and
    for a receive count whose part is 0, which names the message (message_number)."""
    packed = message_id * COUNTS + receive_count % COUNTS
    return packed if packed < LIMIT and packed % COUNTS else None


def message_number(message_id: int) -> int | None:
    """The number naming the message itself (receive-count part 0), or None for a
    message id too large to pack below 2^53."""
    packed = message_id * COUNTS
    return packed if packed < LIMIT else None


def message_of(number: int) -> int | None:
    """The message id a number names the message by, or None for a delivery's number."""
    return None if number % COUNTS else number // COUNTS


def receipt_of(number: int) -> str:
    """The receipt form a delivery number stands for."""
    return f"{number // COUNTS}#{number % COUNTS}"


def parse_number(text: str) -> int | None:
    """The delivery number a path segment is, or None (a receipt, or out of range)."""
    if text.isascii() and text.isdigit() and len(text) <= 16 and int(text) < LIMIT:
        return int(text)
    return None


class _Resolver(Protocol):
    async def delivery_receipts(
        self, queue: str, message_ids: Sequence[int], receive_counts: Sequence[int]
    ) -> list[str]: ...


async def resolved(engine: _Resolver, queue: str, receipts: Sequence[str]) -> list[str]:
    """The receipts with each delivery form traded for the receipt its delivery holds
    now (or one no delivery holds: stale or gone). One round trip, only if any is."""
    # Receipts have no "#": the common case skips the pattern.
    found = [(i, _FORM.fullmatch(r)) for i, r in enumerate(receipts) if "#" in r]
    named = [(i, m) for i, m in found if m is not None and int(m[2]) < COUNTS]
    if not named:
        return list(receipts)
    current = await engine.delivery_receipts(
        queue, [int(m[1]) for _, m in named], [int(m[2]) for _, m in named]
    )
    out = list(receipts)
    for (i, _), receipt in zip(named, current, strict=True):
        out[i] = receipt
    return out


@contextlib.contextmanager
def quoting(given: str, receipt: str) -> Iterator[None]:
    """Errors name the delivery as the caller did, not the receipt it was traded for."""
    try:
        yield
    except ApiError as error:
        if receipt != given:
            error.message = error.message.replace(receipt, given)
            error.args = (error.message,)
        raise
