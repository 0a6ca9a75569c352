"""OpenTelemetry traces, set up from the standard OTEL_* variables, carried through the queue.

With no exporter configured nothing is set up and every helper here returns at once, so a
server without tracing pays a flag test per call. With one:
  * gRPC calls get server spans (opentelemetry-instrumentation-grpc), in the trace the
    caller's `traceparent` metadata names;
  * a sent or published message keeps the sender's context as a `traceparent` attribute
    (W3C), unless it has one or no room left for one;
  * each delivered batch gets a consumer span linked to every producer it carries;
  * engine calls get spans of their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from postbox_server.observability.logs import REQUEST_ID

log = logging.getLogger(__name__)

# The attribute a message's producer context travels in, and the engine's attribute limit.
TRACE_ATTRIBUTE = "traceparent"
# The span attribute holding the request id of the call a span belongs to.
REQUEST_ID_ATTRIBUTE = "postbox.request_id"
MAX_ATTRIBUTES = 100  # postbox._attributes_problem's
_EXPORTER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)

_tracer: Any = None


def enabled() -> bool:
    return _tracer is not None


def configure(service_name: str) -> bool:
    """Sets up tracing when an OTLP endpoint is configured; returns whether it did."""
    global _tracer
    if not any(os.environ.get(name) for name in _EXPORTER_VARIABLES):
        return False
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry import trace
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    )
    exporter: type[SpanExporter]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        exporter = GrpcExporter
    elif protocol in (None, "", "http/protobuf"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        exporter = HttpExporter
    else:
        raise ValueError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL is {protocol[:40]!r}: postbox exports traces over "
            "'grpc' or 'http/protobuf'"
        )
    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default name.
    resource = Resource.create({"service.name": service_name}).merge(
        OTELResourceDetector().detect()
    )
    provider = TracerProvider(resource=resource)  # the sampler comes from OTEL_TRACES_SAMPLER
    provider.add_span_processor(_request_id_processor())
    provider.add_span_processor(BatchSpanProcessor(exporter()))
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("postbox")
    log.info("exporting traces over OTLP (%s)", protocol or "http/protobuf")
    return True


def _request_id_processor() -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class RequestIdOnSpans(SpanProcessor):
        """Every span started while a call is served carries its request id."""

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            request_id = REQUEST_ID.get()
            if request_id is not None:
                span.set_attribute(REQUEST_ID_ATTRIBUTE, request_id)

    return RequestIdOnSpans()


def shutdown() -> None:
    """Sends the spans still buffered."""
    if _tracer is not None:
        from opentelemetry import trace

        provider = trace.get_tracer_provider()
        if hasattr(provider, "shutdown"):
            provider.shutdown()


def server_interceptors() -> list[Any]:
    """The gRPC server interceptor that opens a span per call, when tracing is on."""
    if _tracer is None:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]


def stamp(attributes: str | None) -> str | None:
    """Attributes JSON (the engine's format) with the current context as `traceparent`."""
    if _tracer is None:
        return attributes
    from opentelemetry.propagate import inject

    carrier: dict[str, str] = {}
    inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return attributes
    values = json.loads(attributes) if attributes else {}
    if TRACE_ATTRIBUTE in values or len(values) >= MAX_ATTRIBUTES:
        return attributes  # the caller's own, or no room: the message goes as it came
    values[TRACE_ATTRIBUTE] = {"data_type": "String", "string_value": traceparent}
    return json.dumps(values)


def _links(traceparents: Iterable[str]) -> list[Any]:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    links, propagator = [], TraceContextTextMapPropagator()
    for traceparent in traceparents:
        context = trace.get_current_span(propagator.extract({"traceparent": traceparent}))
        span_context = context.get_span_context()
        if span_context.is_valid:
            links.append(trace.Link(span_context))
    return links


def delivered(queue: str, messages: Iterable[Any], operation: str = "receive") -> None:
    """Records a consumer span for a batch handed to a consumer (API Message objects, whose
    attributes map holds the producers' traceparents), linked to each producer."""
    if _tracer is None:
        return
    from opentelemetry.trace import SpanKind

    batch = list(messages)
    traceparents = [
        m.attributes[TRACE_ATTRIBUTE].string_value for m in batch if TRACE_ATTRIBUTE in m.attributes
    ]
    attributes: dict[str, Any] = {
        "messaging.system": "postbox",
        "messaging.destination.name": queue,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.batch.message_count": len(batch),
    }
    if len(batch) == 1:
        attributes["messaging.message.id"] = batch[0].message_id
    span = _tracer.start_span(
        f"{operation} {queue}",
        kind=SpanKind.CONSUMER,
        links=_links(traceparents),
        attributes=attributes,
    )
    span.end()


def traceparent_header(attributes: str | Mapping[str, Any] | None) -> dict[str, str]:
    """The `traceparent` HTTP header for an outbound delivery of a message with these
    attributes (the engine's JSON shape, parsed or not), or nothing."""
    parsed: Mapping[str, Any] | None = (
        json.loads(attributes) if isinstance(attributes, str) else attributes
    )
    if not parsed or TRACE_ATTRIBUTE not in parsed:
        return {}
    value = parsed[TRACE_ATTRIBUTE]
    text = value.get("string_value") if isinstance(value, Mapping) else None
    return {"traceparent": text} if isinstance(text, str) else {}


@contextlib.contextmanager
def engine_span(statement: str) -> Iterator[None]:
    """A client span around one engine call."""
    if _tracer is None:
        yield
        return
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        f"postbox.{statement}",
        kind=SpanKind.CLIENT,
        attributes={"db.system.name": "postgresql", "db.operation.name": statement},
    ):
        yield
