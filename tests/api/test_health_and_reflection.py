"""grpc.health.v1 follows the server's life; reflection lets grpcurl call it without protos."""

from __future__ import annotations

import signal
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from support import ServerProcess, create_queue, unique_name

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
POSTBOX_SERVICES = {
    "postbox.v1.QueueService",
    "postbox.v1.MessageService",
    "postbox.v1.TopicService",
    "postbox.v1.ScheduleService",
}


def test_every_service_is_serving_after_start(channel):
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", *sorted(POSTBOX_SERVICES)):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == SERVING, service


def test_reflection_lists_the_postbox_services(channel):
    database = ProtoReflectionDescriptorDatabase(channel)
    services = set(database.get_services())
    assert services >= POSTBOX_SERVICES
    assert "grpc.health.v1.Health" in services
    # grpcurl describes a service from the file reflection serves for it.
    send = database.FindFileContainingSymbol("postbox.v1.MessageService")
    assert send.name == "postbox/v1/message_service.proto"


def test_not_serving_as_soon_as_shutdown_begins(database_url):
    server = ServerProcess(database_url).start()
    channel = grpc.insecure_channel(server.target)
    try:
        queue = unique_name("health_shutdown")
        create_queue(queue_service_pb2_grpc.QueueServiceStub(channel), queue)
        # A continuous Receive keeps a call in flight, so shutdown takes its grace.
        stream = message_service_pb2_grpc.MessageServiceStub(channel).Receive(
            pb.ReceiveRequest(queue=queue, max_messages=1, mode=pb.RECEIVE_MODE_CONTINUOUS),
            timeout=30,
        )
        stream_ended = threading.Event()

        def drain() -> None:
            try:
                for _ in stream:
                    pass
            except grpc.RpcError:
                pass
            stream_ended.set()

        threading.Thread(target=drain, daemon=True).start()
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=""), timeout=30
        )
        assert next(watch).status == SERVING
        time.sleep(0.2)  # the Receive is waiting on the server
        assert not stream_ended.is_set()
        server.process.send_signal(signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        assert server.process.wait(30) == 0
        assert stream_ended.wait(5)
    finally:
        channel.close()
        server.stop()
