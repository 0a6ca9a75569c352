"""16 consumers, 20k messages, short leases and random stalls: each message deleted exactly once.

Stalled consumers outlive their lease, so their messages are delivered again to
someone else; their late deletes must fail. Every delivery is recorded, so the
test can prove that each successful delete used the newest receipt of its message.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

import grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import seconds

TOTAL = 20_000
CONSUMERS = 16
LEASE = 2.0  # seconds
STALL_CHANCE = 0.02
OK = grpc.StatusCode.OK.value[0]
REFUSED = {grpc.StatusCode.FAILED_PRECONDITION.value[0], grpc.StatusCode.NOT_FOUND.value[0]}


async def test_every_message_deleted_exactly_once_under_stalls(server, queue):
    deliveries: dict[str, list[tuple[int, str]]] = defaultdict(list)  # id -> (count, receipt)
    deleted_with: dict[str, list[str]] = defaultdict(list)  # id -> receipts that deleted it
    refused = 0
    rng = random.Random(6)

    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = message_service_pb2_grpc.MessageServiceStub(channel)
        entries = [pb.SendBatchEntry(body=b"x")] * 1000
        for _ in range(TOTAL // 1000):
            await stub.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))

        async def consume(number: int) -> None:
            nonlocal refused
            call = stub.Receive(
                pb.ReceiveRequest(
                    queue=queue, mode=pb.RECEIVE_MODE_CONTINUOUS, max_messages=10,
                    visibility_timeout=seconds(LEASE), idle_timeout=seconds(LEASE + 1.5),
                )
            )  # fmt: skip
            async for response in call:
                batch = list(response.messages)
                for message in batch:
                    deliveries[message.message_id].append((message.receive_count, message.receipt))
                if rng.random() < STALL_CHANCE:
                    await asyncio.sleep(LEASE + 0.5)  # the lease runs out meanwhile
                if number % 2:  # half delete one by one, half in batches
                    for message in batch:
                        request = pb.DeleteRequest(queue=queue, receipt=message.receipt)
                        try:
                            await stub.Delete(request)
                        except grpc.aio.AioRpcError as error:
                            if error.code().value[0] not in REFUSED:
                                raise
                            refused += 1
                        else:
                            deleted_with[message.message_id].append(message.receipt)
                else:
                    reply = await stub.DeleteBatch(
                        pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in batch])
                    )
                    for message, status in zip(batch, reply.results, strict=True):
                        if status.code == OK:
                            deleted_with[message.message_id].append(message.receipt)
                        else:
                            assert status.code in REFUSED, status
                            refused += 1

        await asyncio.wait_for(asyncio.gather(*(consume(n) for n in range(CONSUMERS))), 240)

        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        stats = (await queues.GetQueue(qpb.GetQueueRequest(name=queue))).queue.stats

    assert (stats.visible_messages, stats.in_flight_messages, stats.delayed_messages) == (0, 0, 0)
    assert len(deleted_with) == TOTAL
    twice = [i for i, receipts in deleted_with.items() if len(receipts) != 1]
    assert not twice, f"{len(twice)} messages deleted more than once, e.g. {twice[:3]}"
    for message_id, (receipt,) in deleted_with.items():
        newest = max(deliveries[message_id])[1]
        assert receipt == newest, f"message {message_id} deleted with a stale receipt"
    redelivered = sum(len(d) > 1 for d in deliveries.values())
    assert redelivered > 0, "no lease ran out: the stalls did not test anything"
    assert refused > 0
