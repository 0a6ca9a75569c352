"""Helpers of the Spark tests: what a queue holds, and a writer aimed at the test server."""

from __future__ import annotations

from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import seconds


def receive_all(messages, queue: str, visibility: float = 600) -> list[msg.Message]:
    """Every message visible in the queue now, left in flight for `visibility` seconds."""
    received: list[msg.Message] = []
    while True:
        request = pb.ReceiveRequest(
            queue=queue,
            max_messages=1000,
            wait_time=seconds(0),
            visibility_timeout=seconds(visibility),
        )
        batch = [m for response in messages.Receive(request) for m in response.messages]
        if not batch:
            return received
        received.extend(batch)


def stats(queues, queue: str) -> qpb.QueueStats:
    return queues.GetQueue(qpb.GetQueueRequest(name=queue)).queue.stats


def writer(df, server, queue: str, **options: str):
    """`df.write.format("postbox")` with the target and queue set, in append mode."""
    write = df.write.format("postbox").option("target", server.target).option("queue", queue)
    for key, value in options.items():
        write = write.option(key, value)
    return write.mode("append")
