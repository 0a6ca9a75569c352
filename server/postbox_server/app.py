"""The server process: database, migrations, wake-ups, gRPC services, health, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2_grpc,
)

from postbox_server.auth.interceptor import Authorize
from postbox_server.auth.keys import KeyCache
from postbox_server.config import Settings, is_loopback
from postbox_server.console.app import build_console_app
from postbox_server.db import hosts
from postbox_server.db.disk_space import DISK_SPACE
from postbox_server.db.engine import Engine, application_name
from postbox_server.db.errors import DiskFull
from postbox_server.db.migrate import format_version, migrate
from postbox_server.db.wakeup import WakeHub
from postbox_server.deadline import DefaultDeadline
from postbox_server.durability import require_synchronous_commit
from postbox_server.egress import EgressPolicy
from postbox_server.embedded import EmbeddedPostgres
from postbox_server.errors import ApiError
from postbox_server.http.app import build_app
from postbox_server.http.openapi import committed_document
from postbox_server.http.procedures import MethodTable, Procedure, procedures
from postbox_server.http_site import http_site
from postbox_server.observability import activity, metrics, tracing
from postbox_server.observability.engine import CountingObserver
from postbox_server.observability.grpc_metrics import CountCalls
from postbox_server.observability.metrics import serve_metrics
from postbox_server.observability.probes import Ready, database_ready
from postbox_server.services.access import AccessService
from postbox_server.services.catalog import SERVICES
from postbox_server.services.decoding import RejectUndecodable
from postbox_server.services.messages import MessageService
from postbox_server.services.payload_schema_cache import PayloadSchemaCache
from postbox_server.services.queues import QueueService
from postbox_server.services.schedules import ScheduleService, check_fired_body
from postbox_server.services.streams import StreamService, StreamWaiters
from postbox_server.services.topics import TopicService
from postbox_server.sns_signing import SigningKey, load_or_create
from postbox_server.tenant_quotas import TenantQuotas
from postbox_server.workers.activity import run_flusher
from postbox_server.workers.maintenance import MaintenanceWorker
from postbox_server.workers.scheduler import SchedulerWorker
from postbox_server.workers.webhooks import WebhookWorker

log = logging.getLogger(__name__)

SERVICE_NAMES = tuple(service.full_name for service in SERVICES)
# The database is pinged this often while it answers (an idle server stays quiet;
# a dropped LISTEN connection triggers a ping at once), and every second while not.
HEALTH_CHECK_INTERVAL = 10.0
HEALTH_RECHECK_INTERVAL = 1.0
# Workers sleeping until their next due time look for work at least this often:
# work the engine's signals could not announce (a server that died mid-task).
IDLE_POLL_INTERVAL = 60.0


def grpc_options(settings: Settings, *, reuse_port: bool = False) -> list[tuple[str, int]]:
    """Channel options of the gRPC server; the benchmark's empty server uses them too."""
    return [
        ("grpc.max_receive_message_length", settings.max_request_size),
        ("grpc.max_send_message_length", settings.max_send_size),
        # Off unless several workers share the port on purpose: a second server
        # started by mistake on a busy port must fail, not silently split traffic.
        ("grpc.so_reuseport", int(reuse_port)),
    ]


class Serving:
    """Whether the server serves (the database answers, no shutdown yet), for the health
    checks that are not gRPC's (HTTP's /healthz)."""

    def __init__(self) -> None:
        self.now = False

    def __call__(self) -> bool:
        return self.now


async def _set_health(
    servicer: health.aio.HealthServicer, serving: bool, state: Serving | None = None
) -> None:
    if state is not None:
        state.now = serving
    status = (
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    for name in ("", *SERVICE_NAMES):
        await servicer.set(name, status)


async def _watch_health(
    engine: Engine, servicer: health.aio.HealthServicer, hub: WakeHub, state: Serving
) -> None:
    """SERVING while the database answers and has disk space for writes, NOT_SERVING
    while not, with the reason in the log."""
    serving = None
    check_now = asyncio.Event()
    hub.on_lost(check_now.set)
    DISK_SPACE.on_refusal(check_now.set)
    while True:
        forced = check_now.is_set()
        check_now.clear()
        trouble = await _database_trouble(engine, ping=forced or serving is not True)
        now_serving = trouble is None
        if now_serving != serving:
            serving = now_serving
            await _set_health(servicer, serving, state)
            if serving:
                log.info("database answers: SERVING")
            else:
                log.warning("database %s: NOT_SERVING", trouble)
        interval = HEALTH_CHECK_INTERVAL if serving else HEALTH_RECHECK_INTERVAL
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(check_now.wait(), interval)


async def _database_trouble(engine: Engine, ping: bool) -> str | None:
    """Why the database cannot serve calls now, or None: it does not answer a ping, or
    it refused a write for lack of disk space and a small write of our own fails too.
    Unless told to ping, a statement that answered within the last check's interval
    (the workers' sweeps, any call) stands for the ping: an idle server stays quiet."""
    try:
        if ping or time.monotonic() - engine.answered_at > HEALTH_CHECK_INTERVAL:
            await asyncio.wait_for(engine.ping(), HEALTH_RECHECK_INTERVAL * 2)
        metrics.observe_pool(engine)  # workers' figures reach the parent's scrape this way
        if DISK_SPACE.full:
            await _probe_disk_space(engine)
    except DiskFull:
        return f"is out of disk space ({DISK_SPACE.refusal})"
    except (ApiError, asyncio.TimeoutError):
        return "does not answer"
    return None


async def _probe_disk_space(engine: Engine) -> None:
    """Marks the space back unless the probe, too, is refused for lack of it. A probe
    refused for another reason (a role without TEMPORARY on the database) cannot tell:
    the space counts as back, and the next refused write marks it full again."""
    try:
        await asyncio.wait_for(engine.probe_disk_space(), HEALTH_RECHECK_INTERVAL * 2)
    except DiskFull:
        raise
    except ApiError as error:
        log.warning("the disk-space probe failed (%s); counting the space as back", error)
    DISK_SPACE.freed()


class DatabaseUnreachable(Exception):
    """The database refused or did not answer the first connection of a start."""


async def install_engine(dsn: str) -> None:
    try:
        conn = await hosts.connect(
            dsn, server_settings={"application_name": application_name("migrate")}
        )
    except hosts.FAILED_HOST as error:
        raise DatabaseUnreachable(
            f"cannot connect to the database {hosts.describe(dsn)!r}: "
            f"{error or type(error).__name__}"
        ) from None
    try:
        version = await migrate(conn)
    finally:
        await conn.close()
    log.info("postbox SQL %s installed", format_version(version))


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set `stop`."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def open_database(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """The database URL to serve from, starting the embedded PostgreSQL when none is given."""
    if settings.database_url is not None:
        return settings.database_url, None
    embedded = EmbeddedPostgres(settings.data_dir)
    await asyncio.to_thread(embedded.start)
    return await embedded.ensure_database(), embedded


class AnonymousExposure(Exception):
    """Serving without keys on an address beyond loopback, which nobody asked for."""


def refuse_anonymous_exposure(host: str, keys: KeyCache, allow_anonymous: bool) -> None:
    """With no key, only loopback clients may call: like Redis's protected mode."""
    if keys.enabled or allow_anonymous or is_loopback(host):
        return
    raise AnonymousExposure(
        f"refusing to serve {host!r} without authentication: no API key exists, so anyone "
        "who reaches this address could read, purge or delete every queue. Either create "
        "an admin key first (postbox keys create NAME --grant 'admin:*' --database-url URL), "
        "which turns authentication on, or pass --insecure-allow-anonymous to serve "
        "anonymously on purpose."
    )


def http_front(
    settings: Settings,
    http_procedures: dict[str, Procedure],
    serving: Serving,
    ready: Ready,
    signing_key: SigningKey | None = None,
) -> AbstractAsyncContextManager[int]:
    """The HTTP/JSON front door, serving inside the block; it yields the port it listens on."""
    app = build_app(
        http_procedures,
        max_request_size=settings.http_max_request_size,
        serving=serving,
        ready=ready,
        openapi=committed_document(),
        sns_certificate=None if signing_key is None else signing_key.certificate_pem,
    )
    assert settings.http_port is not None
    return http_site(
        app,
        settings.http_host,
        settings.http_port,
        ssl_context=None if settings.tls is None else settings.tls.ssl_context(),
        reuse_port=settings.reuse_port,
        handler_cancellation=True,
        shutdown_timeout=settings.shutdown_grace,
    )


def console_front(
    settings: Settings, http_procedures: dict[str, Procedure], keys: KeyCache
) -> AbstractAsyncContextManager[int]:
    """The web console, serving inside the block; it yields the port it listens on."""
    app = build_console_app(
        keys,
        http_procedures,
        max_request_size=settings.http_max_request_size,
        secure_cookie=settings.tls is not None,
        bound_host=settings.console_host,
    )
    assert settings.console_port is not None
    return http_site(
        app,
        settings.console_host,
        settings.console_port,
        ssl_context=None if settings.tls is None else settings.tls.ssl_context(),
        handler_cancellation=True,
        shutdown_timeout=settings.shutdown_grace,
    )


async def _scrape(engine: Engine, max_queues: int) -> bytes:
    metrics.observe_pool(engine)
    return await metrics.exposition(engine, max_queues)


async def _serve_api(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    engine: Engine,
    hub: WakeHub,
    keys: KeyCache,
    quotas: TenantQuotas,
    workers: tuple[EgressPolicy, WebhookWorker, SchedulerWorker],
    health_servicer: health.aio.HealthServicer,
    serving: Serving,
    ready: Ready,
) -> None:
    """Starts the gRPC server and the HTTP and console ports on the servicers, each
    entered into `stack`, which stops them in reverse (the console and HTTP ports,
    then gRPC with the shutdown grace)."""
    egress, webhooks, scheduler = workers
    signing_key = (
        None if settings.sns_signing_key is None else load_or_create(settings.sns_signing_key)
    )
    server = grpc.aio.server(
        # Authentication first: an anonymous caller learns nothing, not even decoding errors.
        # Counting first, so that refused calls are counted too.
        interceptors=[
            CountCalls(),
            *tracing.server_interceptors(),
            Authorize(keys),
            RejectUndecodable(),
            DefaultDeadline(settings.unary_deadline),
        ],
        options=grpc_options(settings, reuse_port=settings.reuse_port),
    )
    # Each servicer goes to both front doors; the generated add_* functions take the
    # grpc server, or the HTTP side's MethodTable, which stands in for one.
    stream_waiters = StreamWaiters()
    # One per process: a schema changed through QueueService or TopicService is seen
    # at once by this process's sends and publishes.
    payload_schema_cache = PayloadSchemaCache(engine, hub)
    servicers: tuple[tuple[Callable[[Any, Any], None], object], ...] = (
        (
            queue_service_pb2_grpc.add_QueueServiceServicer_to_server,
            QueueService(
                engine,
                max_message_size=settings.max_message_size,
                payload_schemas=payload_schema_cache,
            ),
        ),
        (
            message_service_pb2_grpc.add_MessageServiceServicer_to_server,
            MessageService(
                engine,
                hub,
                max_message_size=settings.max_message_size,
                max_response_size=settings.max_response_size,
                auto_create_queues=settings.auto_create_queues,
                payload_schemas=payload_schema_cache,
                quotas=quotas,
            ),
        ),
        (
            topic_service_pb2_grpc.add_TopicServiceServicer_to_server,
            TopicService(
                engine,
                hub,
                webhooks.wake,
                egress,
                max_message_size=settings.max_message_size,
                on_published=stream_waiters.wake,
                payload_schemas=payload_schema_cache,
                signing_key=signing_key,
                quotas=quotas,
            ),
        ),
        (
            stream_service_pb2_grpc.add_StreamServiceServicer_to_server,
            StreamService(engine, stream_waiters),
        ),
        (
            schedule_service_pb2_grpc.add_ScheduleServiceServicer_to_server,
            ScheduleService(
                engine,
                scheduler.wake,
                payload_schema_cache,
                max_message_size=settings.max_message_size,
            ),
        ),
        (
            access_service_pb2_grpc.add_AccessServiceServicer_to_server,
            AccessService(engine, keys, quotas),
        ),
    )
    methods = MethodTable()
    for add_to_server, servicer in servicers:
        add_to_server(servicer, server)
        add_to_server(servicer, methods)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    address = f"{settings.grpc_host}:{settings.grpc_port}"
    if settings.tls is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, settings.tls.grpc_credentials())
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    stack.push_async_callback(server.stop, settings.shutdown_grace)
    if settings.http_port is not None or settings.console_port is not None:
        # The gRPC server's servicers behind the same interceptors, tracing aside
        # (its interceptor reads gRPC's own call objects).
        http_procedures = procedures(
            SERVICES,
            methods,
            [
                CountCalls(),
                Authorize(keys),
                RejectUndecodable(),
                DefaultDeadline(settings.unary_deadline),
            ],
        )
    http_port = console_port = None
    if settings.http_port is not None:
        http_port = await stack.enter_async_context(
            http_front(settings, http_procedures, serving, ready, signing_key)
        )
    if settings.console_port is not None:
        console_port = await stack.enter_async_context(
            console_front(settings, http_procedures, keys)
        )
    log.info(
        "postbox serving gRPC%s on %s:%d",
        "" if settings.tls is None else " over TLS",
        settings.grpc_host,
        port,
    )
    if http_port is not None:
        log.info(
            "postbox serving HTTP/JSON (Connect)%s on %s:%d",
            "" if settings.tls is None else " over TLS",
            settings.http_host,
            http_port,
        )
    if console_port is not None:
        log.info(
            "postbox serving the web console on %s://%s:%d/",
            "http" if settings.tls is None else "https",
            settings.console_host,
            console_port,
        )


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    """Serves until `stop` is set (or SIGINT/SIGTERM arrives), then shuts down in order.

    Everything started is entered into one exit stack as it starts, so a start that
    fails stops what started before it, and a stop runs the list backwards: health
    says NOT_SERVING, the background tasks end, the metrics port closes, waiting
    streams are woken to end with what they have, the console and HTTP ports close,
    gRPC gets the shutdown grace, then the engine (after a last activity flush), the
    key cache, the embedded PostgreSQL and tracing."""
    stop = stop or asyncio.Event()
    stop_on_signals(stop)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(log.info, "stopped")
        hosts.set_silence_timeout(settings.database_silence_timeout)
        dsn, embedded = await open_database(settings)
        if embedded is not None:
            stack.push_async_callback(asyncio.to_thread, embedded.stop)
        tracing.configure("postbox")
        stack.callback(tracing.shutdown)
        # Sessions of their own (LISTEN, the migration) need a direct connection.
        direct_dsn = settings.listen_database_url or dsn
        await install_engine(direct_dsn)
        keys = KeyCache(direct_dsn)
        stack.push_async_callback(keys.close)
        await keys.start()
        if settings.run_api:
            for host, port in (
                (settings.grpc_host, settings.grpc_port),
                (settings.http_host, settings.http_port),
                (settings.console_host, settings.console_port),
            ):
                if port is not None:
                    refuse_anonymous_exposure(host, keys, settings.insecure_allow_anonymous)
        engine = await Engine.connect(
            dsn,
            pool_size=settings.pool_size,
            transaction_pooler=settings.listen_database_url is not None,
            acquire_timeout=settings.pool_acquire_timeout,
            observer=CountingObserver(),
        )
        stack.push_async_callback(_close_engine, engine, settings.shutdown_grace)
        if settings.require_synchronous_commit:
            await require_synchronous_commit(engine)
        ready = database_ready(engine.ping, lambda: not stop.is_set())
        hub = WakeHub(
            direct_dsn,
            safety_interval=settings.safety_poll_interval,
            own_sessions=engine.own_sessions,
        )
        stack.push_async_callback(hub.close)
        await hub.start()

        egress = EgressPolicy(settings.webhook_allow_cidrs)
        webhooks = WebhookWorker(engine, egress, poll_interval=IDLE_POLL_INTERVAL)
        schedule_schemas = PayloadSchemaCache(engine, hub)
        scheduler = SchedulerWorker(
            engine,
            functools.partial(check_fired_body, schedule_schemas),
            on_webhook_deliveries=webhooks.wake,
            poll_interval=IDLE_POLL_INTERVAL,
        )
        hub.on_signal("webhooks", webhooks.wake)
        hub.on_signal("schedules", scheduler.wake)
        health_servicer = health.aio.HealthServicer()
        serving = Serving()
        # The servicer starts out SERVING the whole server; nothing is served until
        # the database has answered a ping.
        await _set_health(health_servicer, False, serving)
        quotas = TenantQuotas(engine, settings.quota_refresh_interval)
        keys.on_change(quotas.wake)
        if settings.run_api:
            await _serve_api(
                stack,
                settings,
                engine,
                hub,
                keys,
                quotas,
                (egress, webhooks, scheduler),
                health_servicer,
                serving,
                ready,
            )
            # Again, now before the front doors stop: waiting streams end at once,
            # with what they have, rather than at the end of the grace (close is
            # idempotent; the first one stops the hub should a start above fail).
            stack.push_async_callback(hub.close)
        if settings.metrics_port is not None:
            await stack.enter_async_context(
                serve_metrics(
                    settings.metrics_host,
                    settings.metrics_port,
                    functools.partial(_scrape, engine, settings.metrics_max_queues),
                    ready,
                )
            )
        maintenance = MaintenanceWorker(
            engine,
            interval=settings.maintenance_interval,
            expiry_interval=settings.expiry_interval,
            idle_interval=IDLE_POLL_INTERVAL,
        )
        hub.on_signal("redrives", maintenance.wake)
        tasks = [
            asyncio.create_task(
                _watch_health(engine, health_servicer, hub, serving), name="postbox-health"
            ),
            asyncio.create_task(
                run_flusher(engine, settings.activity_interval), name="postbox-activity"
            ),
        ]
        if settings.run_api:
            tasks.append(asyncio.create_task(quotas.run(), name="postbox-tenant-quotas"))
        if settings.run_workers:
            tasks += [
                asyncio.create_task(maintenance.run(), name="postbox-maintenance"),
                asyncio.create_task(webhooks.run(), name="postbox-webhooks"),
                asyncio.create_task(scheduler.run(), name="postbox-scheduler"),
            ]
            log.info("postbox running maintenance, webhook deliveries and schedules")
        for task in tasks:
            task.add_done_callback(lambda _: _stop_if_crashed(tasks, stop))
        stack.push_async_callback(_cancel, tasks)
        # Last in, so first out: before any stream ends, balancers stop sending calls
        # while the grace lasts; later sets (the health watcher's) are ignored.
        stack.push_async_callback(_stop_serving, health_servicer, serving)
        await stop.wait()
        log.info("shutting down")
        for task in tasks:
            if _crashed(task):
                # Out through the stack's shutdown, then a traceback and exit status 1.
                raise RuntimeError(f"{task.get_name()} stopped on an error") from task.exception()


def _crashed(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is not None


def _stop_if_crashed(tasks: list[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """A background task that ends on an error stops the server: one whose maintenance or
    deliveries died would go on serving without them, with nothing to show for it."""
    if any(_crashed(task) for task in tasks):
        stop.set()


async def _stop_serving(servicer: health.aio.HealthServicer, serving: Serving) -> None:
    serving.now = False
    await servicer.enter_graceful_shutdown()


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _close_engine(engine: Engine, grace: float) -> None:
    """What the calls counted since the last flush, now that none is running, then the
    pool; the flush is bounded, so a database that is away cannot hold the shutdown."""
    with contextlib.suppress(ApiError, asyncio.TimeoutError):
        await asyncio.wait_for(activity.flush(engine), grace)
    await engine.close()
