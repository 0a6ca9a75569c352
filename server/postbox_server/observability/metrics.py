"""Prometheus metrics: gRPC calls as the grpc-ecosystem names them, messages by queue, the
server's own moving parts, and each queue's depth read from the database once per scrape.

`--workers N` runs N processes: each writes its counters to files in a directory the
parent names in PROMETHEUS_MULTIPROC_DIR (prometheus-client's multiprocess mode, which
must be chosen before this module is imported), and the parent serves one view of them
all. A single process serves its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from postbox_server.errors import ApiError
from postbox_server.http_site import http_site
from postbox_server.observability.probes import Ready, add_probes
from postbox_server.tenant_names import SEPARATOR

if TYPE_CHECKING:
    from postbox_server.db.engine import Engine

log = logging.getLogger(__name__)

# Set: this process is a worker of `serve --workers N`, or the parent serving them.
MULTIPROCESS_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None

_GRPC_LABELS = ("grpc_type", "grpc_service", "grpc_method")
GRPC_STARTED = Counter("grpc_server_started_total", "RPCs started on the server.", _GRPC_LABELS)
GRPC_HANDLED = Counter(
    "grpc_server_handled_total",
    "RPCs completed on the server, whatever their status.",
    (*_GRPC_LABELS, "grpc_code"),
)
GRPC_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Seconds from the start of an RPC to its end (a stream's whole life).",
    _GRPC_LABELS,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)

# A queue's series name its tenant ("" for the default tenant, which Prometheus reads as
# no label) and the name its tenant knows it by: a function of the stored name, so the
# tenant label adds no series.
_QUEUE_LABELS = ("tenant", "queue")
MESSAGES_SENT = Counter("postbox_messages_sent_total", "Messages sent, by queue.", _QUEUE_LABELS)
MESSAGES_RECEIVED = Counter(
    "postbox_messages_received_total", "Deliveries of messages, by queue.", _QUEUE_LABELS
)
MESSAGES_REDELIVERED = Counter(
    "postbox_messages_redelivered_total",
    "Deliveries of messages delivered before (a lease ran out, or a nack), by queue.",
    _QUEUE_LABELS,
)
AGE_AT_RECEIVE = Histogram(
    "postbox_message_age_at_receive_seconds",
    "Seconds from a message's send to its first delivery, by queue.",
    _QUEUE_LABELS,
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600),
)
MESSAGES_DELETED = Counter(
    "postbox_messages_deleted_total", "Messages deleted by their receipt, by queue.", _QUEUE_LABELS
)
MESSAGES_NACKED = Counter(
    "postbox_messages_nacked_total", "Messages given back for a retry, by queue.", _QUEUE_LABELS
)
WEBHOOK_DELIVERIES = Counter(
    "postbox_webhook_deliveries_total",
    "Webhook delivery attempts, by outcome (delivered, retrying, failed).",
    ("outcome",),
)
WEBHOOK_SECONDS = Histogram(
    "postbox_webhook_delivery_seconds",
    "Seconds a webhook delivery attempt took (the POST and its answer), by outcome.",
    ("outcome",),
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
SCHEDULE_FIRES = Counter("postbox_schedule_fires_total", "Schedules fired.", ("outcome",))
GROUP_COMMIT_SIZE = Histogram(
    "postbox_group_commit_batch_size",
    "Single Sends, or single Publishes, that shared one transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
GROUP_COMMIT_PENDING = Gauge(
    "postbox_group_commit_pending",
    "Single Sends and single Publishes not yet answered: gathering into a group, or at the "
    "database with it.",
    multiprocess_mode="livesum",
)
OPEN_STREAMS = Gauge(
    "postbox_open_streams",
    "Receive and StreamingReceive calls open now.",
    multiprocess_mode="livesum",
)
POOL_CONNECTIONS = Gauge(
    "postbox_db_pool_connections",
    "Database connections of the server's pool, by state (in_use, idle).",
    ("state",),
    multiprocess_mode="livesum",
)

POOL_ACQUIRE_TIMEOUTS = Counter(
    "postbox_db_pool_acquire_timeouts_total",
    "Calls refused because no pooled database connection came free in time "
    "(--pool-acquire-timeout).",
)

SQS_REQUESTS = Counter(
    "postbox_sqs_requests_total",
    "Requests to the SQS shim, by action and outcome (OK or the SQS error code).",
    ("action", "code"),
)
SQS_SECONDS = Histogram(
    "postbox_sqs_request_seconds",
    "Seconds the SQS shim took per request, long polls included.",
    ("action",),
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30),
)


def tenant_and_name(stored: str) -> list[str]:
    """The label values of a stored queue or topic name: [tenant, name in the tenant]."""
    tenant, _, name = stored.rpartition(SEPARATOR)
    return [tenant, name]


def count(counter: Counter, queue: str, amount: int) -> None:
    if amount:
        counter.labels(*tenant_and_name(queue)).inc(amount)


def observe_pool(engine: Engine) -> None:
    """Reads the pool's sizes into POOL_CONNECTIONS; called before each scrape and as
    connections are taken, so workers' files stay current for the parent's view."""
    size, idle = engine.pool.get_size(), engine.pool.get_idle_size()
    POOL_CONNECTIONS.labels("in_use").set(size - idle)
    POOL_CONNECTIONS.labels("idle").set(idle)


# Queue figures: read at scrape time, one statement for all queues, never stored.

# (metric, help, column of postbox.queue_metrics)
_QUEUE_FAMILIES = (
    ("postbox_queue_messages_visible", "Messages a receive can claim now.", "visible"),
    ("postbox_queue_messages_in_flight", "Messages delivered, not settled.", "in_flight"),
    ("postbox_queue_messages_delayed", "Messages waiting for their delay.", "delayed"),
    ("postbox_queue_oldest_message_age_seconds", "Age of the oldest.", "oldest_age_seconds"),
    ("postbox_queue_dead_letter_messages", "Depth of the queue's DLQ.", "dead_letter_depth"),
)
# (counter, help, column of postbox.queue_metrics); prometheus-client adds _total.
_QUEUE_COUNTERS = (
    (
        "postbox_messages_expired",
        "Messages removed past their retention or expiry time, by queue.",
        "expired_total",
    ),
    (
        "postbox_messages_dead_lettered",
        "Messages moved to the queue's dead-letter queue, by queue.",
        "dead_lettered_total",
    ),
)


async def queue_families(engine: Engine, max_queues: int) -> list[Metric]:
    """The depth figures of up to max_queues queues (in name order), from one query."""
    rows = await engine.queue_metrics(max_queues + 1)
    families = {
        column: GaugeMetricFamily(name, text, labels=list(_QUEUE_LABELS))
        for name, text, column in _QUEUE_FAMILIES
    }
    paused = GaugeMetricFamily(
        "postbox_queue_paused", "1 while sends or receives are paused.", labels=list(_QUEUE_LABELS)
    )
    # Counted by the engine wherever it happens (a sweep, a receive on its way, any
    # server or SQL caller), so one figure for the whole deployment.
    counters = {
        column: CounterMetricFamily(name, text, labels=list(_QUEUE_LABELS))
        for name, text, column in _QUEUE_COUNTERS
    }
    for row in rows[:max_queues]:
        labels = tenant_and_name(row["queue_name"])
        for column, family in families.items():
            if row[column] is not None:
                family.add_metric(labels, float(row[column]))
        for column, counter in counters.items():
            counter.add_metric(labels, float(row[column]))
        paused.add_metric(labels, float(row["send_paused"] or row["receive_paused"]))
    omitted = GaugeMetricFamily(
        "postbox_queues_omitted",
        "1 when there are more queues than --metrics-max-queues shows (the first by name are).",
        value=float(len(rows) > max_queues),
    )
    return [*families.values(), *counters.values(), paused, omitted]


# In-flight messages per consumer: the (queue, consumer) pairs holding the most get a
# series each, the rest of a queue's share one with consumer="(other)", so a scrape has
# at most this many series plus one per queue, however many consumers come and go.
# Deliveries taken without a consumer_id show as consumer="(none)".
MAX_CONSUMER_SERIES = 20


async def consumer_families(engine: Engine, max_consumers: int) -> list[Metric]:
    """In-flight messages per queue and consumer (postbox.consumer_metrics), one query."""
    rows = await engine.consumer_metrics(max_consumers)
    in_flight = GaugeMetricFamily(
        "postbox_consumer_messages_in_flight",
        "Messages delivered to a consumer (ReceiveRequest.consumer_id), not settled; "
        f"the {max_consumers} largest holders, then (other) per queue; (none): unnamed.",
        labels=[*_QUEUE_LABELS, "consumer"],
    )
    for row in rows:
        in_flight.add_metric(
            [*tenant_and_name(row["queue_name"]), row["consumer_id"]], float(row["in_flight"])
        )
    return [in_flight]


async def stream_families(engine: Engine, max_groups: int) -> list[Metric]:
    """Every consumer group's lag (up to max_groups, by topic and group name), one query."""
    rows = await engine.stream_metrics(max_groups)
    labels = ["tenant", "topic", "group"]
    messages = GaugeMetricFamily(
        "postbox_consumer_group_lag_messages",
        "Messages of a stream topic's log past the group's cursor.",
        labels=labels,
    )
    seconds = GaugeMetricFamily(
        "postbox_consumer_group_lag_seconds",
        "Age of the first message past the group's cursor; 0 when none is.",
        labels=labels,
    )
    for row in rows:
        values = [*tenant_and_name(row["topic"]), row["name"]]
        messages.add_metric(values, float(row["lag_messages"]))
        seconds.add_metric(values, float(row["lag_seconds"]))
    return [messages, seconds]


# (metric, help, column of postbox.tenant_usage): what each tenant holds, and its quotas.
_TENANT_USAGE = (
    ("postbox_tenant_queues", "Queues the tenant owns.", "queues"),
    ("postbox_tenant_topics", "Topics the tenant owns.", "topics"),
    ("postbox_tenant_messages", "Messages in the tenant's queues, in every state.", "messages"),
    ("postbox_tenant_bytes", "Bytes of the bodies of those messages.", "bytes"),
)
_TENANT_QUOTAS = (
    ("postbox_tenant_quota_queues", "The tenant's max_queues; absent: no limit.", "max_queues"),
    ("postbox_tenant_quota_topics", "The tenant's max_topics; absent: no limit.", "max_topics"),
    (
        "postbox_tenant_quota_messages",
        "The tenant's max_messages; absent: no limit.",
        "max_messages",
    ),
    ("postbox_tenant_quota_bytes", "The tenant's max_bytes; absent: no limit.", "max_bytes"),
)


# A scrape shows the servers' last count of the tenants' usage, unless none counted
# within the default --quota-refresh-interval (a scrape of a server with no API).
_TENANT_COUNT_AGE = timedelta(seconds=5)


async def tenant_families(engine: Engine) -> list[Metric]:
    """Each tenant's usage and quotas (postbox.tenant_usage), one query per scrape; the
    default tenant, which has no quota, is not counted."""
    rows = await engine.tenant_usage(_TENANT_COUNT_AGE)
    families: list[Metric] = []
    for name, text, column in (*_TENANT_USAGE, *_TENANT_QUOTAS):
        family = GaugeMetricFamily(name, text, labels=["tenant"])
        for row in rows:
            if row[column] is not None:
                family.add_metric([row["tenant_name"]], float(row[column]))
        families.append(family)
    return families


class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


async def exposition(
    engine: Engine | None, max_queues: int, *, multiprocess_dir: str | None = MULTIPROCESS_DIR
) -> bytes:
    """The whole scrape: this process's (or every worker's) metrics, then the queues'."""
    if multiprocess_dir:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiprocess_dir)
    else:
        registry = REGISTRY
    text = generate_latest(registry)
    if engine is not None:
        queues = CollectorRegistry(auto_describe=False)
        try:
            families = await queue_families(engine, max_queues)
            families += await stream_families(engine, max_queues)
            families += await consumer_families(engine, MAX_CONSUMER_SERIES)
            families += await tenant_families(engine)
            queues.register(_Families(families))
        except ApiError as error:
            # The database is away: the process's own figures still tell why.
            log.warning("metrics: no queue figures: %s", error.message)
        else:
            text += generate_latest(queues)
    return text


@contextlib.asynccontextmanager
async def serve_metrics(
    host: str, port: int, scrape: Callable[[], Awaitable[bytes]], ready: Ready | None = None
) -> AsyncIterator[int]:
    """Serves GET /metrics on host:port inside the block (yielding the port), and the
    probes /livez and /readyz when there is a `ready` check."""

    async def metrics(_: web.Request) -> web.Response:
        body = await scrape()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    if ready is not None:
        add_probes(app, ready)
    async with http_site(app, host, port) as bound:
        log.info("serving metrics on %s:%d/metrics", host, bound)
        yield bound
