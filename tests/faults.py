"""Load and checks shared by the tests of faults from outside the process (a full disk,
a partition): senders that retry each message until it is acknowledged, waits on
health and other conditions, and every message of a queue received."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Reconnect fast once the server answers again, rather than after gRPC's default backoff.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]


@dataclass
class Senders:
    """Send calls in a loop, each message retried until acknowledged; every failure with
    how long it took. A body is the message's number, then `padding`."""

    messages: message_service_pb2_grpc.MessageServiceStub
    queue: str
    deadline: float = 10.0
    padding: bytes = b""
    acknowledged: set[int] = field(default_factory=set)
    failures: list[tuple[float, grpc.StatusCode, str]] = field(default_factory=list)
    last_ack: float = 0.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _numbers: Iterator[int] = field(default_factory=lambda: iter(range(10**9)))

    def start(self, count: int) -> list[asyncio.Future[None]]:
        return [asyncio.ensure_future(self.run()) for _ in range(count)]

    async def run(self) -> None:
        while not self.stop.is_set():
            number = next(self._numbers)
            request = pb.SendRequest(queue=self.queue, body=b"%d %s" % (number, self.padding))
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    await self.messages.Send(request, timeout=self.deadline)
                except grpc.aio.AioRpcError as error:
                    took = time.monotonic() - started
                    self.failures.append((took, error.code(), error.details() or ""))
                    await asyncio.sleep(0.1)
                    continue
                self.acknowledged.add(number)
                self.last_ack = time.monotonic()
                break

    def codes(self) -> set[grpc.StatusCode]:
        return {code for _, code, _ in self.failures}


async def wait_for(check: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until `check()` (awaited when awaitable) is true; fails after `timeout`."""
    started = time.monotonic()
    while True:
        result = check()
        if await result if inspect.isawaitable(result) else result:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"not after {timeout} s: {what}"
        await asyncio.sleep(0.05)


async def health(stub: health_pb2_grpc.HealthStub) -> int:
    """The server's health, or -1 when the check itself fails."""
    try:
        return (await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)).status
    except grpc.aio.AioRpcError:
        return -1


async def wait_for_health(stub: health_pb2_grpc.HealthStub, status: int, timeout: float) -> float:
    async def reached() -> bool:
        return await health(stub) == status

    return await wait_for(reached, timeout, f"health {status}")


async def receive_numbers(
    messages: message_service_pb2_grpc.MessageServiceStub, queue: str
) -> set[int]:
    """The number of every message in the queue (the first word of each body)."""
    received: set[int] = set()
    while True:
        request = pb.ReceiveRequest(queue=queue, max_messages=1000, wait_time={})
        batch = [
            int(m.body.split()[0])
            async for r in messages.Receive(request, timeout=30)
            for m in r.messages
        ]
        if not batch:
            return received
        received.update(batch)
