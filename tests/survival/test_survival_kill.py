"""kill -9 the server while clients send: every acknowledged message is there after a restart."""

from __future__ import annotations

import asyncio

import grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess, seconds, unique_name

TOTAL = 20_000
SENDERS = 48
# Reconnect fast once the server is back, rather than after gRPC's default backoff.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
]
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


async def send_all(target: str, queue: str, acknowledged: set[int]) -> None:
    """Sends messages 0..TOTAL-1, each retried until the server acknowledges it."""
    numbers = iter(range(TOTAL))
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = message_service_pb2_grpc.MessageServiceStub(channel)

        async def sender() -> None:
            for number in numbers:
                request = pb.SendRequest(queue=queue, body=str(number).encode())
                while True:
                    try:
                        await stub.Send(request, timeout=5)
                    except grpc.aio.AioRpcError as error:
                        if error.code() not in RETRYABLE:
                            raise
                        await asyncio.sleep(0.05)
                        continue
                    acknowledged.add(number)
                    break

        await asyncio.gather(*(sender() for _ in range(SENDERS)))


async def receive_all(target: str, queue: str) -> list[int]:
    received: list[int] = []
    async with grpc.aio.insecure_channel(target) as channel:
        stub = message_service_pb2_grpc.MessageServiceStub(channel)
        while True:
            batch = [
                int(message.body)
                async for response in stub.Receive(
                    pb.ReceiveRequest(
                        queue=queue, max_messages=1000, wait_time=seconds(0),
                        visibility_timeout=seconds(600),
                    )
                )
                for message in response.messages
            ]  # fmt: skip
            if not batch:
                return received
            received.extend(batch)


async def test_acknowledged_sends_survive_kill_9(database_url):
    server = ServerProcess(database_url).start()
    try:
        queue = unique_name("kill9")
        with grpc.insecure_channel(server.target) as channel:
            queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
                qpb.CreateQueueRequest(queue=qpb.Queue(name=queue))
            )
        acknowledged: set[int] = set()
        sending = asyncio.ensure_future(send_all(server.target, queue, acknowledged))
        while len(acknowledged) < TOTAL // 3:
            assert not sending.done(), sending.exception()
            await asyncio.sleep(0.01)
        server.kill()
        killed_at = len(acknowledged)
        log_before_restart = len(server.log())
        await asyncio.sleep(0.5)  # clients meet a closed port for a moment
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(sending, 300)
        assert killed_at < TOTAL
        assert len(acknowledged) == TOTAL

        received = await receive_all(server.target, queue)
        missing = acknowledged - set(received)
        assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {sorted(missing)[:5]}"
        # At least once: a Send whose answer the kill swallowed may have committed twice.
        duplicates = len(received) - len(set(received))
        assert duplicates <= SENDERS

        recovery = server.log()[log_before_restart:]
        assert "postbox serving gRPC" in recovery
        assert "database answers: SERVING" in recovery
        for line in recovery.splitlines():
            assert " ERROR " not in line, recovery
            assert "Traceback" not in line, recovery
    finally:
        server.stop()
