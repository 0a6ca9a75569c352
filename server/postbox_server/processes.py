"""`postbox serve --workers N`: N server processes sharing one port, so every core serves.

One Python process runs one event loop on one core; gRPC and protobuf work is what
limits a single process. The parent starts the embedded PostgreSQL once (when there
is no database URL), installs the SQL, checks the port is free, then runs N copies
of `postbox serve` that bind it with SO_REUSEPORT; the kernel spreads connections
over them. Each worker has its own pool and LISTEN connection. The parent only
supervises: a worker that dies takes the others down with a non-zero exit, so the
service manager sees the failure instead of a silently smaller server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile

from postbox_server.app import install_engine, open_database, stop_on_signals
from postbox_server.config import Settings
from postbox_server.db.engine import Engine
from postbox_server.observability.metrics import exposition, serve_metrics
from postbox_server.observability.probes import database_ready

log = logging.getLogger(__name__)


def _check_port_free(host: str, port: int) -> None:
    """Fails loudly when something already listens: the workers' SO_REUSEPORT would share it."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host.strip("[]"), port))
        except OSError as exc:
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def worker_command(settings: Settings, log_level: str, log_format: str) -> list[str]:
    """A worker's command line; the database URL, which may hold a password, goes in its
    environment instead (DATABASE_URL), where `ps` does not show it."""
    return [
        sys.executable, "-m", "postbox_server",
        "--log-level", log_level, "--log-format", log_format,
        "serve",
        "--grpc-host", settings.grpc_host,
        "--grpc-port", str(settings.grpc_port),
        "--pool-size", str(settings.pool_size),
        "--pool-acquire-timeout", str(settings.pool_acquire_timeout),
        "--database-silence-timeout", str(settings.database_silence_timeout),
        "--max-message-size", str(settings.max_message_size),
        "--max-response-size", str(settings.max_response_size),
        "--safety-poll-interval", str(settings.safety_poll_interval),
        "--maintenance-interval", str(settings.maintenance_interval),
        "--expiry-interval", str(settings.expiry_interval),
        "--activity-interval", str(settings.activity_interval),
        "--unary-deadline", str(settings.unary_deadline),
        "--reuse-port",
        *([] if settings.tls is None else settings.tls.flags()),
        *([] if settings.http_port is None else [
            "--http-host", settings.http_host,
            "--http-port", str(settings.http_port),
            "--http-max-request-size", str(settings.http_max_request_size),
        ]),
        *(arg for cidr in settings.webhook_allow_cidrs for arg in ("--webhook-allow-cidr", cidr)),
        *(["--insecure-allow-anonymous"] if settings.insecure_allow_anonymous else []),
        *(["--require-synchronous-commit"] if settings.require_synchronous_commit else []),
        *([] if settings.run_workers else ["--no-workers"]),
        *(["--auto-create-queues"] if settings.auto_create_queues else []),
        # The file was read (or made) before the workers start: they all sign with it.
        *([] if settings.sns_signing_key is None else [
            "--sns-signing-key", str(settings.sns_signing_key),
        ]),
    ]  # fmt: skip


async def serve_workers(
    settings: Settings, workers: int, log_level: str, log_format: str = "text"
) -> int:
    """Runs `workers` server processes until SIGINT/SIGTERM or until one of them exits."""
    if settings.grpc_port == 0:
        raise ValueError("--workers needs a fixed --grpc-port for the workers to share")
    _check_port_free(settings.grpc_host, settings.grpc_port)
    if settings.http_port is not None:
        if settings.http_port == 0:
            raise ValueError("--workers needs a fixed --http-port for the workers to share")
        _check_port_free(settings.http_host, settings.http_port)
    stop = asyncio.Event()
    stop_on_signals(stop)
    async with contextlib.AsyncExitStack() as stack:
        # Stopped in reverse: the workers, the metrics port, its engine, the files the
        # workers counted into, the embedded PostgreSQL.
        dsn, embedded = await open_database(settings)
        if embedded is not None:
            stack.push_async_callback(asyncio.to_thread, embedded.stop)
        await install_engine(settings.listen_database_url or dsn)  # once, before the workers race
        environment = {**os.environ, "DATABASE_URL": dsn}
        if settings.listen_database_url is not None:
            # In the environment, not on the command line, where `ps` shows it.
            environment["POSTBOX_LISTEN_DATABASE_URL"] = settings.listen_database_url
        if settings.metrics_port is not None:
            # The workers count into files here; this process serves them all as one.
            metrics_dir = tempfile.mkdtemp(prefix="postbox-metrics-")
            stack.callback(shutil.rmtree, metrics_dir, ignore_errors=True)
            environment["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
            engine = await Engine.connect(
                dsn, pool_size=1, transaction_pooler=settings.listen_database_url is not None
            )
            stack.push_async_callback(engine.close)
            await stack.enter_async_context(
                serve_metrics(
                    settings.metrics_host,
                    settings.metrics_port,
                    functools.partial(
                        exposition,
                        engine,
                        settings.metrics_max_queues,
                        multiprocess_dir=metrics_dir,
                    ),
                    database_ready(engine.ping, lambda: not stop.is_set()),
                )
            )
        processes: list[asyncio.subprocess.Process] = []
        stack.push_async_callback(_stop, processes, settings.shutdown_grace + 10)
        command = worker_command(settings, log_level, log_format)
        for _ in range(workers):
            processes.append(await asyncio.create_subprocess_exec(*command, env=environment))
        log.info("started %d workers on port %d", workers, settings.grpc_port)
        exits = [asyncio.ensure_future(p.wait()) for p in processes]
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([stopping, *exits], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failed = [p for p in processes if p.returncode is not None]
        for process in failed:
            log.error(
                "worker %d exited with %s; stopping the others", process.pid, process.returncode
            )
        return 1 if failed else 0


async def _stop(processes: list[asyncio.subprocess.Process], timeout: float) -> None:
    for process in processes:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            await asyncio.wait_for(process.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("worker %d did not stop in %.0f s; killing it", process.pid, timeout)
            process.kill()
            await process.wait()
