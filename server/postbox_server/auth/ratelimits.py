"""Per-key and per-tenant rate limits: token buckets for sends, receives and calls.

A key's limits (RateLimits in access_service.proto, postbox.api_keys.rate_limits) and
its tenant's (the same message, postbox.tenants.rate_limits) come with the key cache,
which a change to either reloads. Every call of a tenant's key draws from its key's
buckets and from its tenant's, which all the tenant's keys share; it goes only when
both have the tokens (and then takes from both), and a refusal names the key or the
tenant whose limit was short.

Each server process keeps its own buckets in memory and enforces an equal share of
each limit, a key's and a tenant's alike: the rate and the burst divided by the number
of server processes on the database, which the key cache counts (their key listeners
in pg_stat_activity). So a call costs no database round trip, and N servers together
let through about what one would, provided clients spread their calls over them (as a
load balancer does); a tenant whose keys all call one server of N gets 1/N of its
limit. A process that has not yet seen a new server (up to the key cache's liveness
interval, or the next key or tenant change) allows its old, larger share.

A bucket that lacks tokens refuses a unary call with RESOURCE_EXHAUSTED and a
google.rpc.RetryInfo (the time until enough tokens are back); streams wait for their
tokens instead, which slows them down rather than ending them.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from postbox_server.errors import ApiError

MAX_RATE = 1_000_000
KINDS = ("send", "receive", "call")
# What each kind counts, in the words of the errors.
_UNITS = {"send": "sends", "receive": "receives", "call": "calls"}
_PREFIX = "/postbox.v1."
# Methods whose every call sends: the number of messages a request sends.
SENDS: dict[str, Any] = {
    f"{_PREFIX}MessageService/Send": lambda request: 1,
    f"{_PREFIX}MessageService/SendBatch": lambda request: len(request.entries),
    f"{_PREFIX}TopicService/Publish": lambda request: 1,
    f"{_PREFIX}TopicService/PublishBatch": lambda request: len(request.entries),
}
RECEIVES = {
    f"{_PREFIX}MessageService/Receive",
    f"{_PREFIX}StreamService/ReadStream",
    f"{_PREFIX}StreamService/ReadStreamRange",
}
# Streams whose every request counts: as one send or receive, or a batch as its messages.
STREAMED: dict[str, tuple[str, Any]] = {
    f"{_PREFIX}MessageService/SendStream": ("send", lambda request: 1),
    f"{_PREFIX}MessageService/SendBatchStream": (
        "send",
        lambda request: len(request.batch.entries),
    ),
    f"{_PREFIX}MessageService/StreamingReceive": ("receive", lambda request: 1),
    f"{_PREFIX}StreamService/StreamingReadStream": ("receive", lambda request: 1),
}
# Not counted: the SQS/SNS shim asks it for the caller's account before serving the
# caller's own request (cached per key), so counting it would charge every shim user one
# call they did not make, and a key with a burst of 1 could never get through the shim.
UNCOUNTED = {f"{_PREFIX}AccessService/GetCallerTenant"}
# Trailing metadata of a throttled call: the seconds to wait (for the SQS shim).
THROTTLED_METADATA = "postbox-throttled"
_STATUS_DETAILS = "grpc-status-details-bin"


@dataclass(frozen=True)
class Limit:
    rate: float  # tokens per second
    burst: float  # most tokens held


@dataclass(frozen=True)
class Limits:
    """A key's or a tenant's limits by kind; a kind without one is not limited."""

    by_kind: dict[str, Limit]

    @classmethod
    def from_json(cls, text: str | None) -> Limits | None:
        """The limits stored as RateLimits JSON (proto field names); None for none."""
        if not text:
            return None
        values = json.loads(text)
        by_kind = {}
        for kind in KINDS:
            rate = float(values.get(f"{kind}s_per_second", 0) or 0)
            if rate > 0:
                burst = float(values.get(f"{kind}_burst", 0) or 0) or max(1.0, math.ceil(rate))
                by_kind[kind] = Limit(rate, burst)
        return cls(by_kind) if by_kind else None


class Throttled(ApiError):
    """RESOURCE_EXHAUSTED for a key, or its tenant, over one of its limits, with when to
    retry."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self.retry_after = retry_after

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        """google.rpc.Status with a RetryInfo (as grpcio-status sends it), and the wait
        in seconds for clients that read metadata rather than status details."""
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(1, int(self.retry_after * 1e9)))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=[detail])
        return (
            (_STATUS_DETAILS, status.SerializeToString()),
            (THROTTLED_METADATA, f"{self.retry_after:.3f}"),
        )


class Bucket:
    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.tokens = limit.burst
        self.updated = time.monotonic()

    def _refill(self, now: float) -> None:
        self.tokens = min(self.limit.burst, self.tokens + (now - self.updated) * self.limit.rate)
        self.updated = now

    def wait(self, cost: float) -> float:
        """0 when `cost` tokens may be taken now, else the seconds until they could.

        A cost above the burst (a large batch) goes through on a full bucket and leaves
        it in debt, so the average rate still holds."""
        self._refill(time.monotonic())
        needed = min(cost, self.limit.burst)
        return 0.0 if self.tokens >= needed else (needed - self.tokens) / self.limit.rate

    def take(self, cost: float) -> None:
        self.tokens -= cost


@dataclass(frozen=True)
class Limited:
    """Who a call counts against, with its limits: its API key, or the key's tenant."""

    holder: str  # "API key" or "tenant", in the words of the errors
    name: str
    limits: Limits


@dataclass(frozen=True)
class Shortfall:
    """The limit a call found short of tokens, and the seconds until it would not be."""

    limited: Limited
    kind: str
    wait: float


class RateLimiter:
    """This process's buckets, by holder (key or tenant), name and kind."""

    def __init__(self) -> None:
        self._buckets: dict[tuple[str, str, str], Bucket] = {}
        # Server processes sharing the database (the key cache keeps it current).
        self.processes = 1

    def _bucket(self, limited: Limited, kind: str, limit: Limit) -> Bucket:
        shares = max(1, self.processes)
        share = Limit(limit.rate / shares, max(1.0, limit.burst / shares))
        at = (limited.holder, limited.name, kind)
        bucket = self._buckets.get(at)
        if bucket is None or bucket.limit != share:
            # New, or the limits or the number of servers changed.
            bucket = self._buckets[at] = Bucket(share)
        return bucket

    def shortfall(self, limited: Iterable[Limited], kind: str, cost: float) -> Shortfall | None:
        """Takes `cost` tokens of `kind` from every bucket the call counts against, or,
        when any lacks them, takes none and returns the longest wait: a call refused by
        its tenant's limit costs its key nothing, and the other way round."""
        buckets = []
        worst: Shortfall | None = None
        for holder in limited:
            limit = holder.limits.by_kind.get(kind)
            if limit is None:
                continue
            bucket = self._bucket(holder, kind, limit)
            wait = bucket.wait(cost)
            if wait > 0 and (worst is None or wait > worst.wait):
                worst = Shortfall(holder, kind, wait)
            buckets.append(bucket)
        if worst is None:
            for bucket in buckets:
                bucket.take(cost)
        return worst

    def check(self, limited: Iterable[Limited], kind: str, cost: float) -> None:
        """Raises Throttled, naming the key or tenant, when a limit of `kind` is short."""
        short = self.shortfall(limited, kind, cost)
        if short is not None:
            limit = short.limited.limits.by_kind[kind]
            shares = max(1, self.processes)
            share = f"; this server's share: {limit.rate / shares:g}/s" if shares > 1 else ""
            raise Throttled(
                f"{short.limited.holder} {short.limited.name!r} is over its limit of "
                f"{limit.rate:g} {_UNITS[kind]} per second (burst {limit.burst:g}{share}); "
                f"retry in {short.wait:.3f} s",
                short.wait,
            )

    def check_call(self, limited: Sequence[Limited], method: str, request: Any) -> None:
        """The limits a call's start is counted against (calls, then sends or receives)."""
        if not limited or method in UNCOUNTED:
            return
        self.check(limited, "call", 1)
        sends = SENDS.get(method)
        if sends is not None and hasattr(request, "DESCRIPTOR"):
            self.check(limited, "send", sends(request))
        elif method in RECEIVES:
            self.check(limited, "receive", 1)

    async def pace(self, limited: Sequence[Limited], method: str, request: Any) -> None:
        """Waits until a stream's next request may go (StreamingReceive and the like)."""
        streamed = STREAMED.get(method)
        if not limited or streamed is None:
            return
        kind, count = streamed
        cost = count(request) if hasattr(request, "DESCRIPTOR") else 1
        # No event to wait on: the buckets refill with time, and say how long.
        while (short := self.shortfall(limited, kind, cost)) is not None:  # noqa: ASYNC110
            await asyncio.sleep(short.wait)
