"""The transport ceiling: MessageService on postbox's grpc.aio stack with no database behind it.

Send and SendBatch answer at once with made-up ids, so a client measured against
this server sees what gRPC, protobuf and the event loop cost on this machine.
Receive and Delete(Batch) are there so the receiving and latency scenarios can run
their own client code against the same ceiling:

  * a continuous Receive on a queue named `relay-...` streams the bodies that Sends
    to that queue carry, as they arrive (send->stream latency with no database);
  * on a queue named `canned-<bytes>-...` it streams batches of made-up messages with
    bodies of that size, at most two batches ahead of the deletes, as postbox does;
  * Delete and DeleteBatch answer OK for every receipt.

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
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from postbox.v1 import message_pb2, message_service_pb2_grpc
from postbox.v1 import message_service_pb2 as pb

from server.app import grpc_options
from server.config import Settings

RELAY, CANNED = "relay-", "canned-"
BATCHES_AHEAD = 2  # as server/services/prefetch.py


class _Undeleted:
    """Made-up messages one canned stream delivered that are not deleted yet."""

    def __init__(self) -> None:
        self.count = 0
        self.fewer = asyncio.Event()

    def deleted(self) -> None:
        self.count -= 1
        self.fewer.set()


class EmptyMessageService(message_service_pb2_grpc.MessageServiceServicer):
    def __init__(self) -> None:
        self._relays: dict[str, asyncio.Queue[bytes]] = {}
        self._ids = itertools.count()
        self._streams = itertools.count()
        self._undeleted: dict[str, _Undeleted] = {}

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

    async def Receive(
        self, request: pb.ReceiveRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReceiveResponse]:
        size = max(request.max_messages, 1)
        if request.queue.startswith(RELAY):
            relay = self._relays.setdefault(request.queue, asyncio.Queue())
            while True:
                bodies = [await relay.get()]
                while len(bodies) < size and not relay.empty():
                    bodies.append(relay.get_nowait())
                yield pb.ReceiveResponse(messages=[self._message(body) for body in bodies])
        elif request.queue.startswith(CANNED):
            body = b"x" * int(request.queue.split("-")[1])
            stream = str(next(self._streams))
            undeleted = self._undeleted[stream] = _Undeleted()
            try:
                while True:
                    while undeleted.count >= BATCHES_AHEAD * size:
                        undeleted.fewer.clear()
                        await undeleted.fewer.wait()
                    undeleted.count += size
                    yield pb.ReceiveResponse(
                        messages=[self._message(body, stream) for _ in range(size)]
                    )
            finally:
                del self._undeleted[stream]
        else:
            message = "name the queue relay-... or canned-<bytes>-..."
            await context.abort(grpc.StatusCode.NOT_FOUND, message)

    async def Delete(
        self, request: pb.DeleteRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteResponse:
        self._deleted([request.receipt])
        return pb.DeleteResponse()

    async def DeleteBatch(
        self, request: pb.DeleteBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteBatchResponse:
        self._deleted(request.receipts)
        ok = message_pb2.BatchEntryStatus()
        return pb.DeleteBatchResponse(results=[ok] * len(request.receipts))

    def _deleted(self, receipts: Iterable[str]) -> None:
        for receipt in receipts:
            undeleted = self._undeleted.get(receipt.rsplit(":", 1)[-1])
            if undeleted is not None:
                undeleted.deleted()

    def _message(self, body: bytes, stream: str = "") -> message_pb2.Message:
        """What postbox's Receive sends for a message: ids, body, receipt, times."""
        message_id = str(next(self._ids))
        message = message_pb2.Message(
            message_id=message_id,
            body=body,
            receipt=f"{message_id}:00000000-0000-4000-8000-000000000000:{stream}",
            receive_count=1,
        )
        message.enqueue_time.GetCurrentTime()
        message.first_receive_time.GetCurrentTime()
        return message


async def serve(host: str, port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    server = grpc.aio.server(options=grpc_options(Settings()))
    message_service_pb2_grpc.add_MessageServiceServicer_to_server(EmptyMessageService(), server)
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
    asyncio.run(serve(args.grpc_host, args.grpc_port))


if __name__ == "__main__":
    main()
