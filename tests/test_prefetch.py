"""A continuous stream claims at most two batches ahead of what its consumer settled."""

from __future__ import annotations

import asyncio

from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import seconds


async def in_flight(channel, queue: str) -> int:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    return (await queues.GetQueue(qpb.GetQueueRequest(name=queue))).queue.stats.in_flight_messages


async def test_stream_waits_for_the_consumer_before_claiming_more(aio_channel, queue):
    stub = message_service_pb2_grpc.MessageServiceStub(aio_channel)
    await stub.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * 100)
    )
    call = stub.Receive(
        pb.ReceiveRequest(
            queue=queue, max_messages=10, mode=pb.RECEIVE_MODE_CONTINUOUS,
            visibility_timeout=seconds(60),
        )
    )  # fmt: skip
    first = await call.read()
    await asyncio.sleep(0.3)  # well inside the stream's patience (1 s)
    assert await in_flight(aio_channel, queue) == 20  # the batch read and one more

    await stub.DeleteBatch(
        pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in first.messages])
    )
    await asyncio.sleep(0.3)
    assert await in_flight(aio_channel, queue) == 20  # one settled, one more claimed

    # A consumer that never settles still gets a batch per second of patience.
    await asyncio.sleep(1.5)
    assert await in_flight(aio_channel, queue) >= 30
    call.cancel()
