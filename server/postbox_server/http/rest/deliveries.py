"""Numeric delivery ids for the REST API: beyond-queue's clients delete and change the
visibility of a received message by a number, postbox's engine by a receipt
("<message id>:<lease>").

A REST receive gives each message it hands out a delivery id: a number derived from
its receipt (53 bits of a hash, so JavaScript reads it exactly), and remembers the
receipt under (queue, delivery id) in this server process. DELETE and PATCH by that
number act on that receipt, so the engine's lease check still applies: once the
message is delivered again the number is stale, as its receipt is, and a consumer
whose lease ran out cannot delete the message another now holds. The id is not the
message's id, which answers that: two deliveries of one message need two numbers.

A settled delivery stays remembered, so a second DELETE hears the engine's 404 (gone)
or 400 (stale), as a receipt's would. The memory is per process and bounded (least
recently used out first): a delivery id
that this process did not hand out (another server behind the same address) or has
forgotten resolves to nothing, and the request is answered 410 naming the receipt,
which every process takes.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from aiohttp import web

# Deliveries remembered per process: about 300 bytes each with its receipt, so some
# 30 MB when full (measured: 100,000 entries, 20 MB besides the receipts).
CAPACITY = 100_000
# Largest id a JSON number holds exactly in JavaScript (Number.MAX_SAFE_INTEGER).
_ID_BITS = 53


def delivery_id(receipt: str) -> int:
    """The number that stands for a receipt: the same in every process."""
    digest = hashlib.blake2b(receipt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _ID_BITS)


def parse_delivery_id(text: str) -> int | None:
    """The delivery id a path segment or body entry is, or None for a receipt."""
    if text.isascii() and text.isdigit() and len(text) <= 16:
        return int(text)
    return None


class Deliveries:
    """The receipts this process's REST receives handed out, by (queue, delivery id)."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._receipts: OrderedDict[tuple[str, int], str] = OrderedDict()

    def hand_out(self, queue: str, receipt: str) -> int | str:
        """The id a receive gives for `receipt`: its delivery id, or the receipt itself
        when that number already stands for another receipt of the queue (a hash
        collision, about one in 2^53 per pair), so one number never means two."""
        key = (queue, delivery_id(receipt))
        held = self._receipts.get(key)
        if held is not None and held != receipt:
            return receipt
        self._receipts[key] = receipt
        self._receipts.move_to_end(key)
        while len(self._receipts) > self._capacity:
            self._receipts.popitem(last=False)
        return key[1]

    def receipt(self, queue: str, number: int) -> str | None:
        """The receipt a delivery id stands for; None if this process does not know it."""
        key = (queue, number)
        receipt = self._receipts.get(key)
        if receipt is not None:
            self._receipts.move_to_end(key)
        return receipt

    def __len__(self) -> int:
        return len(self._receipts)


DELIVERIES = web.AppKey("rest_deliveries", Deliveries)


def of(request: web.Request) -> Deliveries:
    return request.app[DELIVERIES]
