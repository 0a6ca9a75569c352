"""The API's services, as descriptors: what every front door (gRPC, HTTP) serves."""

from __future__ import annotations

from google.protobuf.descriptor import ServiceDescriptor
from postbox.v1 import (
    access_service_pb2,
    message_service_pb2,
    queue_service_pb2,
    schedule_service_pb2,
    stream_service_pb2,
    topic_service_pb2,
)

SERVICES: tuple[ServiceDescriptor, ...] = (
    queue_service_pb2.DESCRIPTOR.services_by_name["QueueService"],
    message_service_pb2.DESCRIPTOR.services_by_name["MessageService"],
    topic_service_pb2.DESCRIPTOR.services_by_name["TopicService"],
    stream_service_pb2.DESCRIPTOR.services_by_name["StreamService"],
    schedule_service_pb2.DESCRIPTOR.services_by_name["ScheduleService"],
    access_service_pb2.DESCRIPTOR.services_by_name["AccessService"],
)
