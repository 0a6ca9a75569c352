"""Process roles and probes: two `serve --no-workers` API nodes and one `postbox worker`
on one database, each kind of background work done once and by the worker only; /livez
without the database, /readyz with it, on the HTTP and metrics ports."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import message_service_pb2_grpc
from receiver import Receiver
from support import (
    ChildProcess,
    HttpServerProcess,
    create_database,
    drop_database,
    eventually,
    free_port,
    metric,
    run_sql,
    scrape,
    seconds,
    unique_name,
)

from postbox_server import __version__

# The worker sweeps expired messages this often (seconds), so a test waits little.
EXPIRY_INTERVAL = "0.2"


class ApiNode(HttpServerProcess):
    """`postbox serve --no-workers`, with its HTTP and metrics ports."""

    def __init__(self, database_url: str) -> None:
        super().__init__(database_url, "--no-workers", metrics=True)


class Worker(ChildProcess):
    """`postbox worker`: no API port, its probes and metrics on the metrics port."""

    log_prefix = "postbox-worker-"

    def __init__(self, database_url: str) -> None:
        super().__init__()
        self.database_url = database_url
        self.metrics_port = free_port()

    def start(self) -> Worker:
        self.spawn(
            "worker",
            "--database-url", self.database_url,
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.metrics_port),
            "--expiry-interval", EXPIRY_INTERVAL,
            "--webhook-allow-cidr", "127.0.0.0/8",
        )  # fmt: skip
        self.wait_ready(lambda: probe(self.metrics_port, "/readyz")[0] == 200, "worker", 30)
        return self


def probe(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refusal:
        return refusal.code, json.loads(refusal.read())
    except OSError:
        return 0, None


def rest(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    sent = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(sent, timeout=30) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as refusal:
        return refusal.code, json.loads(refusal.read())


@pytest.fixture(scope="module")
def deployment(admin_url: str) -> Iterator[tuple[ApiNode, ApiNode, Worker, str]]:
    url = create_database(admin_url, "postbox_roles")
    first = ApiNode(url).start()  # installs the engine before the others start
    second = ApiNode(url).start()
    worker = Worker(url).start()
    yield first, second, worker, url
    for process in (worker, second, first):
        process.stop()
    drop_database(admin_url, url)


def counted(port: int, name: str, **labels: str) -> float:
    return metric(scrape(port), name, **labels)


def test_each_kind_of_work_is_done_once_by_the_worker(
    deployment: tuple[ApiNode, ApiNode, Worker, str],
) -> None:
    first, second, worker, _ = deployment
    api_ports = (first.metrics_port, second.metrics_port)
    queue = unique_name("roles")
    assert rest(first.base, "POST", "/v1/queues", {"name": queue})[0] == 201
    # A webhook: subscribed through one node, published through the other.
    receiver = Receiver().start()
    try:
        word = unique_name("roles").replace("-", "_")
        status, _ = rest(
            first.base, "POST", f"/v1/events/{word}/subscriptions",
            {"protocol": "http", "endpoint": receiver.url("/roles")},
        )  # fmt: skip
        assert status == 201
        status, published = rest(second.base, "POST", f"/v1/events/{word}", {"message": "hook"})
        assert (status, published["webhook_deliveries"]) == (201, 1)
        receiver.wait_for("/roles", 1)
        eventually(
            lambda: counted(worker.metrics_port, "postbox_webhook_deliveries_total",
                            outcome="delivered") == 1,
            what="the worker to record the delivery",
        )  # fmt: skip
    finally:
        receiver.stop()
    assert len(receiver.on("/roles")) == 1
    # How long the attempt took: one observation, on the worker.
    duration = "postbox_webhook_delivery_seconds"
    worker_samples = scrape(worker.metrics_port)
    assert metric(worker_samples, f"{duration}_count", outcome="delivered") == 1
    assert metric(worker_samples, f"{duration}_sum", outcome="delivered") > 0
    # A schedule due now fires once.
    name = unique_name("roles_once")
    now = datetime.now(timezone.utc).isoformat()
    status, created = rest(
        first.base, "POST", "/v1/schedules",
        {"name": name, "fire_at": now, "target_kind": "queue", "target": queue, "message": 1},
    )  # fmt: skip
    assert status == 201, created
    # A one-shot schedule is deleted once it fired (as beyond-queue's is).
    eventually(
        lambda: rest(second.base, "GET", f"/v1/schedules/{name}")[0] == 404,
        what="the schedule to fire",
    )
    eventually(
        lambda: counted(worker.metrics_port, "postbox_schedule_fires_total", outcome="fired") == 1,
        what="the worker to count its fire",
    )
    assert rest(first.base, "GET", f"/v1/queues/{queue}")[1]["queue_length"] == 1
    # A message past its ttl expires once.
    with grpc.insecure_channel(first.target) as channel:
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        messages.Send(mpb.SendRequest(queue=queue, body=b"brief", ttl=seconds(1)), timeout=10)

    def expired() -> float:
        return counted(worker.metrics_port, "postbox_messages_expired_total", queue=queue)

    eventually(lambda: expired() == 1, what="the worker to expire the message")
    assert rest(first.base, "GET", f"/v1/queues/{queue}")[1]["queue_length"] == 1
    # None of it ran on an API node.
    for port in api_ports:
        samples = scrape(port)
        assert metric(samples, "postbox_webhook_deliveries_total", outcome="delivered") == 0
        assert metric(samples, "postbox_schedule_fires_total", outcome="fired") == 0
        assert metric(samples, "postbox_webhook_delivery_seconds_count", outcome="delivered") == 0
    # The engine counts the expiry wherever it happens: once, for the whole database.
    assert expired() == 1


def test_probes_tell_liveness_from_readiness(
    deployment: tuple[ApiNode, ApiNode, Worker, str], admin_url: str
) -> None:
    first, _, worker, url = deployment
    ports = (first.http_port, first.metrics_port, worker.metrics_port)
    for port in ports:
        assert probe(port, "/livez") == (200, {"status": "ok", "version": __version__})
        assert probe(port, "/readyz") == (200, {"status": "ok", "version": __version__})
    # The URL's path names the database (an embedded server's has a query after it).
    database = urlsplit(url).path.lstrip("/")
    # The database refuses connections: every session of it ends, none may start.
    run_sql(
        admin_url,
        f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false',
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'",
    )
    try:
        for port in ports:
            eventually(
                lambda port=port: probe(port, "/readyz") == (503, {"status": "degraded",
                    "reason": "the database does not answer within 2 s",
                    "version": __version__}),
                what=f"/readyz on {port} to say degraded",
            )  # fmt: skip
            assert probe(port, "/livez") == (200, {"status": "ok", "version": __version__})
    finally:
        run_sql(admin_url, f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    for port in ports:
        eventually(lambda port=port: probe(port, "/readyz")[0] == 200, what="ready again")


def test_the_worker_verb_takes_one_process(database_url: str) -> None:
    done = ChildProcess()
    done.spawn("worker", "--database-url", database_url, "--workers", "2")
    assert done.process.wait(30) == 2
    assert "one process" in done.log()
