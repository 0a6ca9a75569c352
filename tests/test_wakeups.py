"""How many claims a waiting stream makes per wake-up: each one is a database round trip,
and at low rates they, not the messages, are most of a server's work. The server runs
in this process, over a real socket and database, so its claims can be counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import unique_name

from server.db.engine import Engine
from server.services.messages import MessageService
from server.wakeup import WakeHub


class CountingEngine(Engine):
    """The real engine, counting its claims."""

    claims = 0

    async def receive(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await super().receive(*args, **kwargs)


@dataclass
class InProcess:
    engine: CountingEngine
    messages: message_service_pb2_grpc.MessageServiceStub

    async def until_claims(self, count: int) -> None:
        for _ in range(250):
            if self.engine.claims >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.engine.claims} claims, expected {count}")

    async def settled(self) -> int:
        """The claim count once nothing has claimed for a while."""
        while True:
            before = self.engine.claims
            await asyncio.sleep(0.3)
            if self.engine.claims == before:
                return before


@pytest.fixture
async def in_process(database_url: str, server: Any) -> AsyncIterator[InProcess]:
    engine = await CountingEngine.connect(database_url, pool_size=4)
    # Notifications are the only wake-ups: no trailing look a moment after each one,
    # no safety poll. Either would add a claim at a time the counts cannot allow for.
    hub = WakeHub(database_url, trailing_wake=3600, safety_interval=3600)
    await hub.start()
    grpc_server = grpc.aio.server()
    message_service_pb2_grpc.add_MessageServiceServicer_to_server(
        MessageService(engine, hub, max_message_size=262_144), grpc_server
    )
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield InProcess(engine, message_service_pb2_grpc.MessageServiceStub(channel))
    finally:
        await hub.close()
        await grpc_server.stop(0)
        await engine.close()


@pytest.fixture
async def queue_name(in_process: InProcess, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    await in_process.engine.create_queue(name, {})
    return name


async def _receive(stub: message_service_pb2_grpc.MessageServiceStub, queue: str) -> Any:
    request = pb.ReceiveRequest(queue=queue, max_messages=2, mode=pb.RECEIVE_MODE_CONTINUOUS)
    return stub.Receive(request)


async def _streaming_receive(stub: message_service_pb2_grpc.MessageServiceStub, queue: str) -> Any:
    call = stub.StreamingReceive()
    await call.write(pb.StreamingReceiveRequest(queue=queue, max_messages=2))
    return call


async def _bodies(call: Any) -> list[bytes]:
    while True:
        response = await asyncio.wait_for(call.read(), 5)
        if response.messages:
            return [m.body for m in response.messages]


@pytest.mark.parametrize("opening", [_receive, _streaming_receive], ids=["Receive", "Streaming"])
async def test_a_stream_that_got_less_than_it_asked_for_waits_without_claiming_again(
    in_process: InProcess, queue_name: str, opening: Callable[..., Awaitable[Any]]
) -> None:
    call = await opening(in_process.messages, queue_name)
    try:
        await in_process.until_claims(1)  # found the queue empty; waits now
        # Sent through the SQL API, so its notification is the one wake-up (a Send to
        # this server would also wake the stream itself, at a moment of its own).
        await in_process.engine.send_bodies(queue_name, [b"one"])
        assert await _bodies(call) == [b"one"]
        # The claim that found the message asked for 2: nothing else was visible.
        assert await in_process.settled() == 2

        await in_process.engine.send_bodies(queue_name, [b"a", b"b", b"c"])
        assert await _bodies(call) == [b"a", b"b"]
        assert await _bodies(call) == [b"c"]
        # A full batch claims again at once; the second, with one message, does not.
        assert await in_process.settled() == 4
    finally:
        call.cancel()
