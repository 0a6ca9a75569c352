"""Traces through the real server to a real OTLP/HTTP receiver, across the queue."""

from __future__ import annotations

import gzip
import os
import secrets
import time
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import topic_service_pb2 as tpb
from receiver import Receiver
from support import ServerProcess, seconds, unique_name


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    """Stands for an OpenTelemetry collector: it takes OTLP/HTTP POSTs on /v1/traces."""
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def hooks() -> Iterator[Receiver]:
    running = Receiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def traced(database_url: str, collector: Receiver) -> Iterator[ServerProcess]:
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "postbox-under-test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # ms: spans reach the collector soon
    }
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    try:
        server = ServerProcess(database_url).start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    yield server
    server.stop()


def spans(collector: Receiver) -> list[tuple[str, object]]:
    """(service name, span) for every span the collector took so far."""
    found = []
    for request in collector.on("/v1/traces"):
        body = request.body
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = next(
                a.value.string_value
                for a in resource_spans.resource.attributes
                if a.key == "service.name"
            )
            for scope in resource_spans.scope_spans:
                found.extend((service, span) for span in scope.spans)
    return found


def attributes(span) -> dict[str, object]:
    return {
        a.key: a.value.string_value or a.value.int_value or a.value.bool_value
        for a in span.attributes
    }


def wait_for(collector: Receiver, test, timeout: float = 30.0) -> list:
    """The spans for which test(span) holds, once there is one (the exporter batches)."""
    deadline = time.monotonic() + timeout
    while True:
        matching = [span for _, span in spans(collector) if test(span)]
        if matching:
            return matching
        assert time.monotonic() < deadline, "no such span reached the collector"
        time.sleep(0.05)


def test_a_message_carries_its_producer_trace_to_the_consumer_span(traced, collector):
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    metadata = (("traceparent", f"00-{trace_id}-{parent}-01"),)
    name = unique_name("traced")
    with grpc.insecure_channel(traced.target) as channel:
        queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
            qpb.CreateQueueRequest(queue=qpb.Queue(name=name))
        )
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        sent = messages.Send(
            pb.SendRequest(queue=name, body=b"x"),
            metadata=(*metadata, ("x-request-id", "req-traced-send")),
        )
        (batch,) = messages.Receive(
            pb.ReceiveRequest(queue=name, wait_time=seconds(5)),
            metadata=(("x-request-id", "req-traced-receive"),),
        )
    (message,) = batch.messages
    # The producer's context travels with the message, for consumers in any language.
    carried = message.attributes["traceparent"].string_value
    assert carried.split("-")[1] == trace_id

    (send_span,) = wait_for(
        collector,
        lambda s: s.trace_id.hex() == trace_id and s.name == "/postbox.v1.MessageService/Send",
    )
    assert send_span.parent_span_id.hex() == parent  # the caller's span, from the metadata
    # Every span of a call carries its request id.
    assert attributes(send_span)["postbox.request_id"] == "req-traced-send"
    engine = wait_for(
        collector, lambda s: s.trace_id.hex() == trace_id and s.name == "postbox.send_batch"
    )
    assert engine[0].parent_span_id  # inside the call's span
    assert attributes(engine[0])["postbox.request_id"] == "req-traced-send"
    (consumer,) = wait_for(collector, lambda s: s.name == f"receive {name}")
    assert attributes(consumer) == {
        "messaging.system": "postbox",
        "messaging.destination.name": name,
        "messaging.operation.type": "receive",
        "messaging.operation.name": "receive",
        "messaging.batch.message_count": 1,
        "messaging.message.id": sent.message_id,
        "postbox.request_id": "req-traced-receive",
    }
    (link,) = consumer.links
    assert link.trace_id.hex() == trace_id
    assert link.span_id.hex() == carried.split("-")[2]  # the server's Send span
    services = {service for service, _ in spans(collector)}
    assert services == {"postbox-under-test"}


def test_webhook_posts_carry_the_publisher_trace(traced, collector, hooks):
    trace_id = secrets.token_hex(16)
    metadata = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),)
    topic = unique_name("traced_topic")
    with grpc.insecure_channel(traced.target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
        topics.CreateSubscription(
            tpb.CreateSubscriptionRequest(
                subscription=tpb.Subscription(
                    name="hook",
                    topic=topic,
                    pattern="#",
                    webhook=tpb.WebhookEndpoint(url=hooks.url(f"/{topic}")),
                )
            )
        )
        topics.Publish(tpb.PublishRequest(topic=topic, body=b"{}"), metadata=metadata)
    (post,) = hooks.wait_for(f"/{topic}", 1)
    assert post.headers["traceparent"].split("-")[1] == trace_id
