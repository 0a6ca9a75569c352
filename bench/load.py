"""Load generation: closed-loop clients and fixed-rate producers, with latency percentiles."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol


def percentile(samples: list[float], fraction: float) -> float:
    """The nearest-rank percentile of samples (seconds); NaN when there are none."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[rank]


@dataclass
class Load:
    """What a load run did: operations (calls or messages) over a measured interval."""

    operations: int
    seconds: float
    latencies: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.operations / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self, fraction: float) -> float:
        return percentile(self.latencies, fraction) * 1000

    def __add__(self, other: Load) -> Load:
        return Load(
            self.operations + other.operations,
            self.seconds + other.seconds,
            self.latencies + other.latencies,
        )


async def interleaved(rounds: int, *measures: Callable[[], Awaitable[Load]]) -> list[Load]:
    """Runs the measures in turn, `rounds` times over, and adds up each one's rounds.

    This machine's speed drifts over seconds (it is shared); taking turns lets a
    drift reach every figure of a comparison alike, not whichever ran at that moment.
    """
    totals = [Load(0, 0.0) for _ in measures]
    for loads in await interleaved_rounds(rounds, *measures):
        for index, load in enumerate(loads):
            totals[index] = totals[index] + load
    return totals


async def interleaved_rounds(
    rounds: int, *measures: Callable[[], Awaitable[Load]]
) -> list[list[Load]]:
    """As interleaved, but each round's loads apart (a list per round, in measure order),
    for same-round ratios and their spread."""
    result = []
    for _ in range(rounds):
        result.append([await measure() for measure in measures])
    return result


class Window(Protocol):
    """Told when a load's measured interval opens and closes (after its warm-up)."""

    def open(self) -> None: ...
    def close(self) -> None: ...


async def closed_loop(
    call: Callable[[], Awaitable[int]],
    *,
    clients: int,
    seconds: float,
    warmup: float = 0.5,
    window: Window | None = None,
) -> Load:
    """`clients` loops each awaiting `call` back to back; `call` returns how many operations it did.

    Calls that finish during the warm-up are not counted, so connection set-up and
    cold caches do not colour the figure.
    """
    loop = asyncio.get_running_loop()
    start = loop.time() + warmup
    end = start + seconds
    if window is not None:
        loop.call_at(start, window.open)
        loop.call_at(end, window.close)
    counted = 0
    latencies: list[float] = []

    async def client() -> None:
        nonlocal counted
        while True:
            began = time.perf_counter()
            done = await call()
            finished = loop.time()
            if finished >= end:
                return
            if finished >= start:
                counted += done
                latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(client() for _ in range(clients)))
    return Load(counted, seconds, latencies)


@dataclass
class Paced:
    """What a fixed-rate run achieved: sends started, over how long."""

    sent: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0


async def fixed_rate(
    send: Callable[[int], Coroutine[Any, Any, object]],
    *,
    rate: float,
    seconds: float,
    max_in_flight: int = 256,
) -> Paced:
    """Starts send(i) every 1/rate seconds for `seconds`, without waiting for earlier ones.

    At most `max_in_flight` sends are outstanding: past that the schedule slips
    (the achieved rate says by how much) rather than piling up calls until gRPC
    cancels them.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: set[asyncio.Task[object]] = set()
    count = int(rate * seconds)
    for i in range(count):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        while len(tasks) >= max_in_flight:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.create_task(send(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    elapsed = loop.time() - start
    if tasks:
        await asyncio.gather(*tasks)
    return Paced(count, elapsed)


async def until_seen(
    ready: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0
) -> None:
    """Polls until the server shows a change (a key, a tenant: a notification away)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await ready():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{what} not seen by the server after {timeout} s")
        await asyncio.sleep(0.01)
