"""The transport ceiling: MessageService on postbox's grpc.aio stack with handlers that do nothing.

Send and SendBatch answer at once with made-up ids, so a client measured against
this server sees what gRPC, protobuf and the event loop cost on this machine.
`python -m bench.empty_server --grpc-port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

from server.app import grpc_options
from server.config import Settings


class EmptyMessageService(message_service_pb2_grpc.MessageServiceServicer):
    async def Send(
        self, request: pb.SendRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendResponse:
        return pb.SendResponse(message_id="0")

    async def SendBatch(
        self, request: pb.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendBatchResponse:
        return pb.SendBatchResponse(message_ids=[str(i) for i in range(len(request.entries))])


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
