"""`postbox serve` (the API and the workers) and `postbox worker` (the workers only)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from postbox_server import event_loop
from postbox_server.cli.flags import (
    Verbs,
    add_sns_signing_flag,
    check_sns_signing_key,
    http_request_size,
    message_size,
    positive_seconds,
    response_size,
    webhook_cidr,
)
from postbox_server.config import Settings
from postbox_server.tls import TlsError, add_server_flags, server_tls


def run(args: argparse.Namespace) -> int:
    from postbox_server.app import AnonymousExposure, DatabaseUnreachable, serve
    from postbox_server.db.migrate import UnknownEngine
    from postbox_server.durability import NotDurable
    from postbox_server.processes import serve_workers

    if args.database_url_file is not None:
        try:
            args.database_url = args.database_url_file.read_text().strip()
        except OSError as error:
            print(f"postbox serve: --database-url-file: {error.strerror}", file=sys.stderr)
            return 2
    try:
        tls = server_tls(args)
    except TlsError as error:
        print(f"postbox serve: {error}", file=sys.stderr)
        return 2
    if not check_sns_signing_key(args, "serve", args.data_dir):
        return 2
    settings = Settings(
        # An empty DATABASE_URL (as compose files and shells leave it) means unset.
        database_url=args.database_url or None,
        listen_database_url=args.listen_database_url or None,
        data_dir=args.data_dir,
        grpc_host=args.grpc_host,
        grpc_port=args.grpc_port,
        tls=tls,
        pool_size=args.pool_size,
        pool_acquire_timeout=args.pool_acquire_timeout,
        database_silence_timeout=args.database_silence_timeout,
        require_synchronous_commit=args.require_synchronous_commit,
        max_message_size=args.max_message_size,
        max_response_size=args.max_response_size,
        webhook_allow_cidrs=tuple(args.webhook_allow_cidr),
        sns_signing_key=args.sns_signing_key,
        safety_poll_interval=args.safety_poll_interval,
        maintenance_interval=args.maintenance_interval,
        expiry_interval=args.expiry_interval,
        activity_interval=args.activity_interval,
        quota_refresh_interval=args.quota_refresh_interval,
        reuse_port=args.reuse_port,
        insecure_allow_anonymous=args.insecure_allow_anonymous,
        http_host=args.grpc_host if args.http_host is None else args.http_host,
        http_port=args.http_port,
        http_max_request_size=args.http_max_request_size,
        console_host=(args.console_host or args.http_host or args.grpc_host),
        console_port=args.console_port,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        metrics_max_queues=args.metrics_max_queues,
        run_api=args.verb != "worker",
        unary_deadline=args.unary_deadline,
        run_workers=not args.no_workers,
        auto_create_queues=args.auto_create_queues,
    )
    if args.verb == "worker" and args.workers > 1:
        print(
            "postbox worker: runs as one process (--workers is for `serve`); start more "
            "worker processes if one cannot keep up",
            file=sys.stderr,
        )
        return 2
    if args.workers > 1 and args.console_port is not None:
        # A session lives in the memory of the process that opened it, and SO_REUSEPORT
        # would hand the next request to any process.
        print(
            "postbox serve: --console-port serves sessions from one process's memory, so it "
            "cannot be combined with --workers; run the console on a separate `postbox serve` "
            "(without --workers) on the same database",
            file=sys.stderr,
        )
        return 2
    try:
        if args.workers > 1:
            return event_loop.run(
                serve_workers(settings, args.workers, args.log_level, args.log_format)
            )
        event_loop.run(serve(settings))
    except (AnonymousExposure, NotDurable, DatabaseUnreachable, UnknownEngine) as refusal:
        print(f"postbox serve: {refusal}", file=sys.stderr)
        return 2
    return 0


def _add_serve_flags(serve: argparse.ArgumentParser) -> None:
    """The flags of `serve`, which `worker` takes too."""
    serve.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL"),
        help="PostgreSQL URL (default: $DATABASE_URL; unset or empty: an embedded PostgreSQL)",
    )
    serve.add_argument(
        "--database-url-file",
        type=Path,
        help="read the PostgreSQL URL from this file (keeps a password off the command line)",
    )
    serve.add_argument(
        "--listen-database-url",
        default=os.environ.get("POSTBOX_LISTEN_DATABASE_URL"),
        help="a direct PostgreSQL URL for LISTEN and migrations, when --database-url is a "
        "transaction pooler such as PgBouncer with pool_mode=transaction (default: "
        "$POSTBOX_LISTEN_DATABASE_URL; unset: --database-url is a direct connection)",
    )
    serve.add_argument(
        "--grpc-host",
        default=os.environ.get("POSTBOX_GRPC_HOST", Settings.grpc_host),
        help="address to listen on (default: %(default)s, which is 127.0.0.1 and ::1; "
        "[::] or 0.0.0.0 for every interface, which needs an API key or "
        "--insecure-allow-anonymous)",
    )
    serve.add_argument(
        "--grpc-port", type=int, default=int(os.environ.get("POSTBOX_GRPC_PORT", "50051"))
    )
    serve.add_argument("--pool-size", type=int, default=Settings.pool_size)
    serve.add_argument(
        "--pool-acquire-timeout",
        type=positive_seconds,
        default=Settings.pool_acquire_timeout,
        metavar="SECONDS",
        help="a call that finds every pooled database connection busy for this long is "
        "refused with UNAVAILABLE, to retry (default: %(default)s)",
    )
    serve.add_argument(
        "--database-silence-timeout",
        type=positive_seconds,
        default=Settings.database_silence_timeout,
        metavar="SECONDS",
        help="a database connection that hears nothing back for this long (data it sent "
        "unacknowledged, TCP keepalive probes unanswered: a network that drops packets) "
        "is closed; its call fails UNAVAILABLE and health turns NOT_SERVING "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--require-synchronous-commit",
        action="store_true",
        help="refuse to start unless every commit waits for a synchronous standby "
        "(synchronous_commit on or remote_apply, synchronous_standby_names set)",
    )
    serve.add_argument(
        "--max-message-size",
        type=message_size,
        # A string default goes through `type`, so a bad environment value is refused too.
        default=os.environ.get("POSTBOX_MAX_MESSAGE_SIZE", str(Settings.max_message_size)),
        help="largest message in bytes (body and attributes) this server accepts and any "
        "queue may be set to accept (default: $POSTBOX_MAX_MESSAGE_SIZE or %(default)s)",
    )
    serve.add_argument(
        "--max-response-size",
        type=response_size,
        default=os.environ.get("POSTBOX_MAX_RESPONSE_SIZE", str(Settings.max_response_size)),
        help="Receive and StreamingReceive responses hold at most this many bytes (a larger "
        "message goes alone); gRPC clients take 4 MiB by default "
        "(default: $POSTBOX_MAX_RESPONSE_SIZE or %(default)s)",
    )
    serve.add_argument(
        "--webhook-allow-cidr",
        action="append",
        default=[],
        type=webhook_cidr,
        metavar="CIDR",
        help="let webhooks reach this range too (repeat), e.g. 10.0.0.0/8; loopback, private, "
        "link-local and other non-public addresses are refused otherwise",
    )
    add_sns_signing_flag(serve)
    serve.add_argument("--safety-poll-interval", type=float, default=Settings.safety_poll_interval)
    serve.add_argument(
        "--unary-deadline",
        type=positive_seconds,
        default=os.environ.get("POSTBOX_UNARY_DEADLINE", str(Settings.unary_deadline)),
        metavar="SECONDS",
        help="a unary call whose client set no deadline ends with DEADLINE_EXCEEDED after this "
        "long, what it had not committed rolled back; streams such as a long-poll Receive "
        "are not limited (default: $POSTBOX_UNARY_DEADLINE or %(default)s)",
    )
    serve.add_argument(
        "--maintenance-interval",
        type=float,
        default=Settings.maintenance_interval,
        help="seconds between steps of redrive tasks (default: %(default)s)",
    )
    serve.add_argument(
        "--expiry-interval",
        type=float,
        default=Settings.expiry_interval,
        help="seconds between sweeps for expired messages and records, and between appends "
        "of delayed stream messages that came due (default: %(default)s)",
    )
    serve.add_argument(
        "--activity-interval",
        type=positive_seconds,
        default=Settings.activity_interval,
        metavar="SECONDS",
        help="seconds between writes of each process's per-queue sent, received and deleted "
        "counts to postbox.queue_activity, which the postbox.queue_throughput view and the "
        "rates of `postbox status` read (default: %(default)s)",
    )
    serve.add_argument(
        "--quota-refresh-interval",
        type=positive_seconds,
        default=Settings.quota_refresh_interval,
        metavar="SECONDS",
        help="seconds between counts of each tenant's messages and bytes, against which "
        "sends are checked for the tenants' quotas: a quota may be overrun by what a tenant "
        "sends within two intervals (default: %(default)s)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=int(os.environ.get("POSTBOX_WORKERS", "1")),
        help="server processes sharing the port (SO_REUSEPORT), e.g. one per core "
        "(default: %(default)s)",
    )
    serve.add_argument(
        "--auto-create-queues",
        action="store_true",
        default=os.environ.get("POSTBOX_AUTO_CREATE_QUEUES", "").lower() in ("1", "true", "yes"),
        help="a send to a queue that does not exist creates it with the default settings, "
        "when the caller's key may also manage that name (default: "
        "$POSTBOX_AUTO_CREATE_QUEUES, else off)",
    )
    serve.add_argument(
        "--insecure-allow-anonymous",
        action="store_true",
        help="serve an address beyond loopback while no API key exists, so that anyone "
        "reaching it may do anything",
    )
    serve.add_argument(
        "--http-port",
        type=int,
        default=int(os.environ["POSTBOX_HTTP_PORT"]) if "POSTBOX_HTTP_PORT" in os.environ else None,
        help="serve every RPC as HTTP + JSON (the Connect protocol: POST "
        "/postbox.v1.<Service>/<Method>) on this port, with the gRPC port's TLS and API keys "
        "(default: $POSTBOX_HTTP_PORT or not at all)",
    )
    serve.add_argument(
        "--http-host",
        default=os.environ.get("POSTBOX_HTTP_HOST"),
        help="address of the HTTP port, under the same rules as --grpc-host (default: "
        "$POSTBOX_HTTP_HOST or the --grpc-host)",
    )
    serve.add_argument(
        "--http-max-request-size",
        type=http_request_size,
        default=Settings.http_max_request_size,
        metavar="BYTES",
        help="largest HTTP request body; a larger one is refused with resource_exhausted "
        "before it is read (default: %(default)s)",
    )
    serve.add_argument(
        "--console-port",
        type=int,
        default=int(os.environ["POSTBOX_CONSOLE_PORT"])
        if "POSTBOX_CONSOLE_PORT" in os.environ
        else None,
        help="serve the web console on this port: log in with an API key, act with its grants "
        "through the HTTP API (default: $POSTBOX_CONSOLE_PORT or not at all)",
    )
    serve.add_argument(
        "--console-host",
        default=os.environ.get("POSTBOX_CONSOLE_HOST"),
        help="address of the console port, under the same rules as --grpc-host (default: "
        "$POSTBOX_CONSOLE_HOST, or the --http-host, or the --grpc-host)",
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=int(os.environ["POSTBOX_METRICS_PORT"])
        if "POSTBOX_METRICS_PORT" in os.environ
        else None,
        help="serve Prometheus metrics at /metrics on this port (default: $POSTBOX_METRICS_PORT "
        "or not at all); with --workers, one view of every worker",
    )
    serve.add_argument(
        "--metrics-host",
        default=os.environ.get("POSTBOX_METRICS_HOST", Settings.metrics_host),
        help="address of the metrics port (default: %(default)s)",
    )
    serve.add_argument(
        "--metrics-max-queues",
        type=int,
        default=Settings.metrics_max_queues,
        help="queues whose depth /metrics shows, the first by name (default: %(default)s)",
    )
    add_server_flags(serve, "the gRPC port")
    # Set by `--workers` on the processes it starts; sharing the port is otherwise an error.
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)


def add_parsers(verbs: Verbs, data_dir: argparse.ArgumentParser) -> None:
    """`serve` and `worker`, which take the same flags."""
    serve = verbs.add_parser("serve", help="serve the gRPC API", parents=[data_dir])
    _add_serve_flags(serve)
    serve.add_argument(
        "--no-workers",
        action="store_true",
        help="serve the API only: leave maintenance, webhook deliveries and schedules to "
        "`postbox worker` processes on the same database",
    )
    serve.set_defaults(run=run)
    worker = verbs.add_parser(
        "worker",
        help="run maintenance, webhook deliveries and schedules only, for API nodes started "
        "with `serve --no-workers` (serve's flags; its API ports are not opened)",
        parents=[data_dir],
    )
    _add_serve_flags(worker)
    worker.set_defaults(run=run, no_workers=False)
