"""Test helpers: databases for a run, and the real server in a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import grpc
import psutil
import pytest
from google.protobuf.duration_pb2 import Duration
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from postbox_server.auth.secrets import new_secret, secret_sha256, sigv4_secret
from postbox_server.db.migrate import migrate

ROOT = Path(__file__).resolve().parent.parent


def with_database(url: str, database: str) -> str:
    """The same server URL, pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))


def run_sql(url: str, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    asyncio.run(run())


def create_database(admin_url: str, prefix: str = "postbox_test") -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    run_sql(admin_url, f'CREATE DATABASE "{name}"')
    return with_database(admin_url, name)


def drop_database(admin_url: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    run_sql(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.asynccontextmanager
async def engine_database(
    admin_url: str,
    prefix: str,
    seed: Callable[[asyncpg.Connection], Awaitable[object]] | None = None,
) -> AsyncIterator[str]:
    """A new database of its own with the engine installed and `seed` run on it, for
    tests that call the engine's SQL with no server; its URL. Dropped afterwards."""
    url = await asyncio.to_thread(create_database, admin_url, prefix)
    try:
        conn = await asyncpg.connect(url)
        try:
            await migrate(conn)
            if seed is not None:
                await seed(conn)
        finally:
            await conn.close()
        yield url
    finally:
        await asyncio.to_thread(drop_database, admin_url, url)


def seconds(value: float) -> Duration:
    duration = Duration()
    duration.FromTimedelta(timedelta(seconds=value))
    return duration


def kept(seconds_: float | None):
    """A queue's Retention: for so many seconds, or (None) forever."""
    from postbox.v1 import queue_service_pb2

    if seconds_ is None:
        return queue_service_pb2.Retention()
    return queue_service_pb2.Retention(period=seconds(seconds_))


def bootstrap_key(database_url: str, name: str, *grants: str) -> str:
    """Creates a key directly in the database, as `postbox keys create --database-url` does."""
    secret = new_secret()
    permissions = [grant.split(":", 1)[0] for grant in grants]
    patterns = [grant.split(":", 1)[1] for grant in grants]

    async def run() -> None:
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "SELECT postbox.create_key($1, $2, $3, $4, $5)",
                name, secret_sha256(secret), sigv4_secret(secret), permissions, patterns,
            )  # fmt: skip
        finally:
            await conn.close()

    asyncio.run(run())
    return secret


def error_of(call, *args, **kwargs) -> grpc.RpcError:
    """The RpcError a call fails with (the test fails if it succeeds)."""
    with pytest.raises(grpc.RpcError) as caught:
        call(*args, **kwargs)
    return caught.value


def api_methods() -> list:
    """Every method of every service in the generated postbox.v1 modules: found, not
    listed, so that a new service is covered by every test generated from them."""
    import importlib
    import pkgutil

    import postbox.v1

    return [
        method
        for module in sorted(pkgutil.iter_modules(postbox.v1.__path__), key=lambda m: m.name)
        if module.name.endswith("_pb2")
        for service in importlib.import_module(
            f"postbox.v1.{module.name}"
        ).DESCRIPTOR.services_by_name.values()
        for method in service.methods
    ]


def call_method(
    channel: grpc.Channel, method, request, stream_timeout: float = 10
) -> tuple[grpc.StatusCode, str]:
    """Calls the RPC a method descriptor names with a request (a message or its bytes),
    whatever its shape; its status code and details (OK and "" when it succeeds).
    stream_timeout bounds a streaming call, which may wait for messages that never come."""
    rpc = f"/{method.containing_service.full_name}/{method.name}"
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    try:
        if method.client_streaming:
            for _ in channel.stream_stream(rpc)(iter([payload]), timeout=stream_timeout):
                pass
        elif method.server_streaming:
            for _ in channel.unary_stream(rpc)(payload, timeout=stream_timeout):
                pass
        else:
            channel.unary_unary(rpc)(payload, timeout=10)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def receive(
    messages, queue: str, count: int = 10, visibility: float | None = None, wait: float = 0
):
    """One long-poll Receive through the sync stub: the messages of its batch (or none)."""
    from postbox.v1 import message_service_pb2 as pb

    request = pb.ReceiveRequest(queue=queue, max_messages=count, wait_time=seconds(wait))
    if visibility is not None:
        request.visibility_timeout.CopyFrom(seconds(visibility))
    return [m for response in messages.Receive(request) for m in response.messages]


def create_queue(queues, name: str, **attributes):
    """Creates a queue with the given Queue fields; returns the created Queue."""
    from postbox.v1 import queue_service_pb2 as qpb

    return queues.CreateQueue(
        qpb.CreateQueueRequest(queue=qpb.Queue(name=name, **attributes))
    ).queue


def stats(queues, queue: str):
    from postbox.v1 import queue_service_pb2 as qpb

    return queues.GetQueue(qpb.GetQueueRequest(name=queue)).queue.stats


def eventually(check: Callable[[], object], timeout: float = 30.0, what: str = "") -> object:
    """Polls `check` until it returns something true, which it returns; fails after timeout."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"not after {timeout} s: {what or check}"
        time.sleep(0.05)
    return result


async def until(conn: asyncpg.Connection, query: str, *args: object) -> None:
    """Waits for a condition the database reports true, for at most 30 seconds."""
    deadline = asyncio.get_running_loop().time() + 30
    while not await conn.fetchval(query, *args):
        assert asyncio.get_running_loop().time() < deadline, f"never true: {query}"
        await asyncio.sleep(0.02)


def free_port(*taken: int) -> int:
    """A port free now on 127.0.0.1, other than `taken` (the kernel may hand out the
    same port twice in a row)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in taken:
            return port


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of a /metrics page, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    # An empty label is no label, as Prometheus reads it (the default tenant's tenant="").
    return {
        (sample.name, frozenset((k, v) for k, v in sample.labels.items() if v)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(samples: dict, name: str, **labels: str) -> float:
    """One sample of a scrape; 0 when the page does not show it (yet)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def unique_name(hint: str) -> str:
    """A valid queue name derived from a test name."""
    cleaned = re.sub(r"[^A-Za-z0-9_-]", "_", hint)[:60]
    return f"{cleaned}_{uuid.uuid4().hex[:8]}"


class ChildProcess:
    """A `python -m postbox_server ...` subprocess whose output goes to a log file."""

    log_prefix = "postbox-"

    def __init__(self) -> None:
        self.port = free_port()
        self.log_path = Path(tempfile.mkstemp(prefix=self.log_prefix, suffix=".log")[1])
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, *args: str, env: dict[str, str] | None = None) -> None:
        """Runs `python -m postbox_server *args`, in this environment or in `env`."""
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "postbox_server", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
        )

    def wait_ready(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        """Polls `ready` until it holds; fails at once if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{what} exited early:\n{self.log()}")
            if ready():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not ready after {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_workers_listening(
        self, workers: int, port: int, timeout: float = 30.0
    ) -> list[psutil.Process]:
        """The processes of `serve --workers N`, once each of them listens on `port`.

        The parent answers health checks as soon as one worker serves; until the others
        have bound the port (SO_REUSEPORT), the kernel hands every connection to it."""
        assert self.process is not None
        parent = psutil.Process(self.process.pid)

        def listening(child: psutil.Process) -> bool:
            return any(
                c.status == psutil.CONN_LISTEN and c.laddr.port == port
                for c in child.net_connections(kind="tcp")
            )

        self.wait_ready(
            lambda: len(parent.children()) == workers and all(map(listening, parent.children())),
            f"{workers} workers listening on {port}",
            timeout,
        )
        return parent.children()

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class ServerProcess(ChildProcess):
    """`python -m postbox_server serve` against a database, on a free port of 127.0.0.1."""

    log_prefix = "postbox-server-"

    def __init__(
        self,
        database_url: str,
        *extra_args: str,
        loopback_webhooks: bool = True,
        credentials: grpc.ChannelCredentials | None = None,
        metrics: bool = False,
    ) -> None:
        super().__init__()
        self.database_url = database_url
        # With metrics: the port of its /metrics page, on 127.0.0.1.
        self.metrics_port = free_port(self.port) if metrics else None
        if self.metrics_port is not None:
            extra_args = (
                *extra_args, "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1"
            )  # fmt: skip
        # For a server started with --tls-cert: how the readiness check reaches it.
        self.credentials = credentials
        # The tests' webhook receivers listen on loopback, which the egress policy
        # refuses unless allowed.
        allow = ("--webhook-allow-cidr", "127.0.0.0/8", "--webhook-allow-cidr", "::1/128")
        self.extra_args = (*extra_args, *(allow if loopback_webhooks else ()))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerProcess:
        self.spawn(
            "serve",
            "--database-url", self.database_url,
            "--grpc-host", "127.0.0.1",
            "--grpc-port", str(self.port),
            *self.extra_args,
        )  # fmt: skip
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 30.0) -> None:
        # gRPC backs off reconnecting up to seconds while nothing listens yet (an
        # embedded PostgreSQL takes seconds to start): notice the server at once.
        fast_reconnect = [
            ("grpc.initial_reconnect_backoff_ms", 50),
            ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 200),
        ]
        if self.credentials is None:
            channel = grpc.insecure_channel(self.target, options=fast_reconnect)
        else:
            channel = grpc.secure_channel(self.target, self.credentials, options=fast_reconnect)
        with channel:
            health = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                try:
                    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    return False
                return reply.status == health_pb2.HealthCheckResponse.SERVING

            self.wait_ready(serving, "server", timeout)


class HttpServerProcess(ServerProcess):
    """`postbox serve` with its HTTP port on too."""

    def __init__(self, database_url: str, *extra: str, scheme: str = "http", **kwargs) -> None:
        super().__init__(database_url, *extra, **kwargs)
        self.http_port = free_port(self.port, self.metrics_port or 0)
        self.extra_args = ("--http-port", str(self.http_port), *self.extra_args)
        self.base = f"{scheme}://127.0.0.1:{self.http_port}"


class SqsShimProcess(ChildProcess):
    """`python -m postbox_server sqs` in front of a postbox server, on a free port of 127.0.0.1."""

    log_prefix = "postbox-sqs-"

    def __init__(
        self, grpc_target: str, *extra_args: str, https: ssl.SSLContext | None = None
    ) -> None:
        super().__init__()
        self.grpc_target = grpc_target
        self.extra_args = extra_args
        # For a shim started with --tls-cert: the client context that reaches it.
        self.https = https

    @property
    def endpoint(self) -> str:
        return f"{'http' if self.https is None else 'https'}://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> SqsShimProcess:
        self.spawn(
            "sqs",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--grpc-target", self.grpc_target,
            *self.extra_args,
        )  # fmt: skip
        self.wait_ready(self._answers, "shim", timeout)
        return self

    def _answers(self) -> bool:
        try:
            # Any HTTP answer (here MissingAction) means the shim is serving.
            urllib.request.urlopen(self.endpoint, timeout=1, context=self.https)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True


# A copy of botocore's last SQS model of the query protocol (botocore 1.29.165,
# Apache-2.0, documentation stripped): current botocore speaks only JSON to SQS, and
# this model carries the query member names (`Attribute.1.Name`, ...) clients sent.
SQS_QUERY_MODEL = ROOT / "tests" / "data" / "sqs-query"
SQS_REGION = "us-east-1"
SQS_ACCOUNT = "000000000000"


def sqs_client(
    endpoint: str,
    protocol: str = "json",
    access_key: str = "postbox-test",
    secret_key: str = "unchecked",
    verify: str | None = None,
    region: str = SQS_REGION,
):
    """A real boto3 SQS client for the shim, speaking JSON or the query protocol, its
    requests signed for `region`."""
    import boto3
    import botocore.session
    from botocore.config import Config

    session = botocore.session.get_session()
    if protocol == "query":
        session.get_component("data_loader").search_paths.insert(0, str(SQS_QUERY_MODEL))
    client = boto3.Session(botocore_session=session).client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        verify=verify,  # a CA bundle for an HTTPS shim
        # No retries: each test sees the shim's first answer.
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    assert client.meta.service_model.protocol == protocol
    return client


# Group commit under load (the group commit's and the send stream's tests).


async def bodies_by_id(db, queue: str) -> dict[str, bytes]:
    rows = await db.fetch(
        "SELECT m.id, m.body FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )
    return {str(row["id"]): row["body"] for row in rows}


async def waiting_at_lock(db, statement: str = "postbox.send_batch") -> int:
    """Sessions of db's database whose `statement` waits for a lock (one a test holds)."""
    # Activity is a snapshot per transaction: clear it to see the waits now.
    return await db.fetchval(
        "SELECT count(*) FROM pg_stat_clear_snapshot(), pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND query LIKE $1 AND datname = current_database()",
        f"%{statement}%",
    )


async def until_waiting_at_lock(db, count: int, statement: str = "postbox.send_batch") -> None:
    """Returns once `count` sessions' `statement` waits for a lock."""
    # 30 s: the calls only need to cross loopback, but CI machines stall.
    deadline = asyncio.get_running_loop().time() + 30
    while (waiting := await waiting_at_lock(db, statement)) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{waiting} of {count} waiting"
        await asyncio.sleep(0.01)


async def under_load(
    db,
    server: ServerProcess,
    make_calls,
    while_held=lambda calls: None,
    statement="postbox.send_batch",
) -> list:
    """Makes the calls (Sends, or Publishes with statement="postbox.publish_batch")
    against a busy database, as under real load, and returns their outcomes
    (responses or errors).

    Inserts are held back until the first group waits at the database and the
    server's pending writes show every other call waiting behind it (or answered already,
    refused before it could join). Without this, how many calls share a commit
    would depend on the machine's speed.
    """
    assert server.metrics_port is not None

    async def groups_at_database() -> int:
        return await waiting_at_lock(db, statement)

    held = db.transaction()
    await held.start()
    try:
        await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
        calls = make_calls()  # a call starts when it is made
        outcomes = asyncio.gather(*calls, return_exceptions=True)
        blocked = 0
        for _ in range(1000):
            blocked = await groups_at_database()
            if blocked:
                break
            await asyncio.sleep(0.01)
        assert blocked, "the first group never reached the database"
        # 30 s: the calls only need to cross loopback, but CI machines stall.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            samples = await asyncio.to_thread(scrape, server.metrics_port)
            pending = metric(samples, "postbox_group_commit_pending")
            if pending + sum(call.done() for call in calls) >= len(calls):
                break
            assert asyncio.get_running_loop().time() < deadline, f"{pending} of {len(calls)} joined"
            await asyncio.sleep(0.02)
        # Everyone else waits in the server for the group at the database, not beside it.
        blocked = await groups_at_database()
        assert blocked == 1, f"{blocked} groups at the database at once"
        while_held(calls)
    finally:
        await held.rollback()
    return await outcomes


def calls_started(server: ServerProcess, method: str) -> float:
    """MessageService calls of `method` the server has started (its metrics)."""
    assert server.metrics_port is not None
    samples = scrape(server.metrics_port)
    return sum(
        metric(
            samples,
            "grpc_server_started_total",
            grpc_type=kind,
            grpc_method=method,
            grpc_service="postbox.v1.MessageService",
        )
        for kind in ("unary", "bidi_stream")
    )


def assert_shared(sizes: list[int]) -> None:
    # Sends that arrived while the first group was held at the database went
    # in together: at least one commit carried many of them. How many arrived in
    # time depends on the machine, so the bound is low; one Send per commit gives 1.
    assert max(sizes) >= 10, sorted(sizes)


# The console script pip installs with the package.
POSTBOX = Path(sys.executable).with_name("postbox")


def postbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the installed `postbox` command as a user does, with `env` added."""
    return subprocess.run(
        [str(POSTBOX), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def publish_bodies(topics: Any, topic: str, *bodies: bytes) -> None:
    """Publishes the bodies to a topic in one PublishBatch (topics: a TopicService stub)."""
    from postbox.v1 import topic_service_pb2 as tpb

    entries = [tpb.PublishBatchEntry(body=body) for body in bodies]
    topics.PublishBatch(tpb.PublishBatchRequest(topic=topic, entries=entries))
