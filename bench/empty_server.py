"""The transport ceiling: MessageService on postbox's grpc.aio stack with no database behind it.

Send, SendBatch and SendBatchStream answer at once with made-up ids, so a client measured against
this server sees what gRPC, protobuf and the event loop cost on this machine.
Receive and Delete(Batch) are there so the receiving and latency scenarios can run
their own client code against the same ceiling:

  * a continuous Receive on a queue named `relay-...` streams the bodies that Sends
    to that queue carry, as they arrive (send->stream latency with no database);
  * on a queue named `canned-<bytes>-...` it streams batches of made-up messages with
    bodies of that size, as fast as the client deletes them;
  * either way a stream is at most two batches ahead of the deletes, as postbox's is;
  * Delete and DeleteBatch answer OK for every receipt.

TopicService's Publish answers at once as a publish to FANOUT_QUEUES queues would
(their names and made-up ids), for the fan-out scenario's transport ceiling.

`python -m bench.empty_server --grpc-port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import signal
from collections.abc import AsyncIterator, Iterable

import grpc
from google.rpc import status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from postbox.v1 import message_pb2, message_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import topic_service_pb2 as tpb

from postbox_server import event_loop
from postbox_server.app import grpc_options
from postbox_server.config import Settings

RELAY, CANNED = "relay-", "canned-"
BATCHES_AHEAD = 2  # as server/postbox_server/services/receive/prefetch.py
FANOUT_QUEUES = 10  # as bench/scenarios/topics.py subscribes


class _Window:
    """The batches one stream delivered whose messages are not all deleted yet."""

    def __init__(self) -> None:
        self.batches = itertools.count()
        self.undeleted: dict[str, int] = {}  # batch -> messages of it not deleted
        self.fewer = asyncio.Event()

    async def room(self) -> None:
        while len(self.undeleted) >= BATCHES_AHEAD:
            self.fewer.clear()
            await self.fewer.wait()

    def delivered(self, count: int) -> str:
        batch = str(next(self.batches))
        self.undeleted[batch] = count
        return batch

    def deleted(self, batch: str) -> None:
        if batch in self.undeleted:
            self.undeleted[batch] -= 1
            if not self.undeleted[batch]:
                del self.undeleted[batch]
                self.fewer.set()


class EmptyMessageService(message_service_pb2_grpc.MessageServiceServicer):
    def __init__(self) -> None:
        self._relays: dict[str, asyncio.Queue[bytes]] = {}
        self._ids = itertools.count()
        self._streams = itertools.count()
        self._windows: dict[str, _Window] = {}

    async def Send(
        self, request: pb.SendRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendResponse:
        relay = self._relays.get(request.queue)
        if relay is not None:
            relay.put_nowait(request.body)
        return pb.SendResponse(message_id="0")

    async def SendBatch(
        self, request: pb.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendBatchResponse:
        return pb.SendBatchResponse(message_ids=[str(i) for i in range(len(request.entries))])

    async def SendBatchStream(
        self,
        requests: AsyncIterator[pb.SendBatchStreamRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.SendBatchStreamResponse]:
        await context.send_initial_metadata(())  # the SDK waits for it before writing
        async for request in requests:
            sent = await self.SendBatch(request.batch, context)
            yield pb.SendBatchStreamResponse(
                results=[pb.SendBatchStreamResult(tag=request.tag, sent=sent)]
            )

    async def Receive(
        self, request: pb.ReceiveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReceiveResponse]:
        if not request.queue.startswith((RELAY, CANNED)):
            message = "name the queue relay-... or canned-<bytes>-..."
            await context.abort(grpc.StatusCode.NOT_FOUND, message)
        size = max(request.max_messages, 1)
        stream = str(next(self._streams))
        window = self._windows[stream] = _Window()
        try:
            if request.queue.startswith(RELAY):
                relay = self._relays.setdefault(request.queue, asyncio.Queue())
                while True:
                    await window.room()
                    bodies = [await relay.get()]
                    while len(bodies) < size and not relay.empty():
                        bodies.append(relay.get_nowait())
                    yield self._batch(bodies, stream, window)
            else:
                body = b"x" * int(request.queue.split("-")[1])
                while True:
                    await window.room()
                    yield self._batch([body] * size, stream, window)
        finally:
            del self._windows[stream]

    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteResponse:
        self._deleted([request.receipt])
        return pb.DeleteResponse()

    async def DeleteBatch(
        self, request: pb.DeleteBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteBatchResponse:
        self._deleted(request.receipts)
        ok = status_pb2.Status()  # code 0: OK
        return pb.DeleteBatchResponse(results=[ok] * len(request.receipts))

    def _deleted(self, receipts: Iterable[str]) -> None:
        for receipt in receipts:
            _, _, stream, batch = receipt.split(":")
            window = self._windows.get(stream)
            if window is not None:
                window.deleted(batch)

    def _batch(self, bodies: list[bytes], stream: str, window: _Window) -> pb.ReceiveResponse:
        """What postbox's Receive sends for a batch: per message ids, body, receipt, times."""
        batch = window.delivered(len(bodies))
        messages = []
        for body in bodies:
            message_id = str(next(self._ids))
            message = message_pb2.Message(
                message_id=message_id,
                body=body,
                receipt=f"{message_id}:00000000-0000-4000-8000-000000000000:{stream}:{batch}",
                receive_count=1,
            )
            message.enqueue_time.GetCurrentTime()
            message.first_receive_time.GetCurrentTime()
            messages.append(message)
        return pb.ReceiveResponse(messages=messages)


class EmptyTopicService(topic_service_pb2_grpc.TopicServiceServicer):
    def __init__(self) -> None:
        self._ids = itertools.count()

    async def Publish(
        self, request: tpb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> tpb.PublishResponse:
        first = next(self._ids) * FANOUT_QUEUES
        return tpb.PublishResponse(
            publish_id="00000000-0000-0000-0000-000000000000",
            queues=[f"sub{i}" for i in range(FANOUT_QUEUES)],
            message_ids=[str(first + i) for i in range(FANOUT_QUEUES)],
            duplicates=[False] * FANOUT_QUEUES,
        )


async def serve(host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server(options=grpc_options(Settings()))
    # The generated base answers UNIMPLEMENTED for the methods left out; its stubs mark
    # them abstract.
    servicer = EmptyMessageService()  # type: ignore[abstract]
    message_service_pb2_grpc.add_MessageServiceServicer_to_server(servicer, server)
    topics = EmptyTopicService()  # type: ignore[abstract]
    topic_service_pb2_grpc.add_TopicServiceServicer_to_server(topics, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    await stop.wait()
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc-host", default="127.0.0.1")
    parser.add_argument("--grpc-port", type=int, required=True)
    args = parser.parse_args()
    # The server's own loop, so that the transport alone is the server's transport.
    event_loop.run(serve(args.grpc_host, args.grpc_port))


if __name__ == "__main__":
    main()
