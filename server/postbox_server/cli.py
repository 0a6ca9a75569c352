"""The `postbox` command: serve, migrate, and client verbs for a first try."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from postbox_server import event_loop, versions
from postbox_server.config import (
    HTTP_REQUEST_SIZE_RANGE,
    MESSAGE_SIZE_RANGE,
    RESPONSE_SIZE_RANGE,
    Settings,
)
from postbox_server.egress import parse_cidrs
from postbox_server.embedded import default_data_dir
from postbox_server.observability.logs import FORMATS
from postbox_server.observability.logs import configure as configure_logging
from postbox_server.tls import TlsError, add_client_flags, add_server_flags, client_tls, server_tls

log = logging.getLogger("postbox")


def _serve(args: argparse.Namespace) -> int:
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
        require_synchronous_commit=args.require_synchronous_commit,
        max_message_size=args.max_message_size,
        max_response_size=args.max_response_size,
        webhook_allow_cidrs=tuple(args.webhook_allow_cidr),
        safety_poll_interval=args.safety_poll_interval,
        maintenance_interval=args.maintenance_interval,
        expiry_interval=args.expiry_interval,
        activity_interval=args.activity_interval,
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


def _sqs(args: argparse.Namespace) -> int:
    from postbox_server.aws.app import AnonymousExposure, serve
    from postbox_server.aws.settings import ShimSettings
    from postbox_server.aws.sigv4 import load_credentials

    if len(args.access_key) != len(args.secret_key):
        print("postbox sqs: give one --secret-key per --access-key", file=sys.stderr)
        return 2
    try:
        credentials = load_credentials(
            zip(args.access_key, args.secret_key, strict=True), args.credentials_file
        )
        tls = server_tls(args)
        grpc_tls = client_tls(args, "grpc-")
    except (OSError, ValueError) as error:
        print(f"postbox sqs: {error}", file=sys.stderr)
        return 2
    settings = ShimSettings(
        host=args.host,
        port=args.port,
        grpc_target=args.grpc_target,
        tls=tls,
        grpc_tls=grpc_tls,
        region=args.region,
        account_id=args.account_id,
        public_url=args.public_url,
        credentials=credentials,
        max_request_size=args.max_request_size,
        api_key=args.api_key,
        insecure_allow_anonymous=args.insecure_allow_anonymous,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        sns_auto_confirm=tuple(args.sns_auto_confirm),
        webhook_allow_cidrs=tuple(args.webhook_allow_cidr),
    )
    try:
        event_loop.run(serve(settings))
    except AnonymousExposure as refusal:
        print(f"postbox sqs: {refusal}", file=sys.stderr)
        return 2
    return 0


def _migrate(args: argparse.Namespace) -> int:
    import asyncpg

    from postbox_server.db.migrate import UnknownEngine, format_version, migrate

    if not args.database_url:
        print("postbox migrate: give --database-url or set DATABASE_URL", file=sys.stderr)
        return 2

    async def run() -> None:
        conn = await asyncpg.connect(args.database_url)
        try:
            print(f"postbox SQL {format_version(await migrate(conn))} installed")
        finally:
            await conn.close()

    try:
        asyncio.run(run())
    except UnknownEngine as refusal:
        print(f"postbox migrate: {refusal}", file=sys.stderr)
        return 2
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    import asyncpg

    if not args.database_url:
        print("postbox uninstall: give --database-url or set DATABASE_URL", file=sys.stderr)
        return 2
    if not args.yes:
        print(
            "postbox uninstall: this drops schema postbox with every queue, topic and message in "
            "it, postbox's pg_cron job, capture triggers and roles; add --yes to go ahead",
            file=sys.stderr,
        )
        return 2

    async def run() -> int:
        conn = await asyncpg.connect(args.database_url)
        try:
            if await conn.fetchval("SELECT to_regnamespace('postbox') IS NULL"):
                print(
                    "postbox uninstall: postbox is not installed in that database", file=sys.stderr
                )
                return 1
            done = json.loads(await conn.fetchval("SELECT postbox.uninstall()"))
        except asyncpg.PostgresError as error:
            print(f"postbox uninstall: {error}", file=sys.stderr)
            return 1
        finally:
            await conn.close()
        dropped = ", ".join(done["dropped_roles"]) or "none"
        print(
            f"postbox uninstalled: {done['cron_jobs']} pg_cron job(s) and {done['captures']} "
            f"capture trigger(s) removed; roles dropped: {dropped}"
        )
        if done["kept_roles"]:
            kept = ", ".join(done["kept_roles"])
            print(f"roles kept, still in use elsewhere in the cluster: {kept}")
        return 0

    return asyncio.run(run())


def client_channel(args: argparse.Namespace) -> grpc.Channel:
    """A channel to --target, over TLS when the --tls flags ask for it; a flag that
    cannot work ends the command (exit code 2), naming the flag."""
    try:
        tls = client_tls(args)
    except TlsError as error:
        print(f"postbox {args.verb}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    if tls is None:
        return grpc.insecure_channel(args.target)
    return grpc.secure_channel(args.target, tls.credentials())


def _operate(args: argparse.Namespace) -> int:
    """Runs an operator verb (postbox_server/operator) on a channel to the server."""
    from postbox_server.auth.client import with_api_key

    with client_channel(args) as plain:
        try:
            return args.handler(args, with_api_key(plain, args.api_key))
        except grpc.RpcError as error:
            print(f"{error.code().name}: {error.details()}", file=sys.stderr)
            return 1


def _db(args: argparse.Namespace) -> int:
    """`postbox db url` prints the embedded database's URL; `postbox psql` opens psql on it."""
    from postbox_server.embedded import NotRunning, running_uri

    try:
        url = running_uri(args.data_dir)
    except NotRunning as error:
        print(f"postbox: {error}", file=sys.stderr)
        return 2
    if args.verb == "db":
        print(url)
        return 0
    try:
        os.execvp("psql", ["psql", url, *args.psql_args])
    except OSError as error:
        print(f"postbox psql: cannot run psql: {error.strerror}", file=sys.stderr)
        return 2
    return 0  # not reached: psql replaced this process


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def _keys(args: argparse.Namespace) -> int:
    from postbox_server.auth import cli as keys
    from postbox_server.auth.client import with_api_key

    if getattr(args, "database_url", None) or args.keys_verb == "sigv4-secret":
        return keys.run(args, None)
    with client_channel(args) as channel:
        return keys.run(args, with_api_key(channel, args.api_key))


def _size_flag(low: int, high: int, spelled: str) -> Callable[[str], int]:
    """An argparse type: whole bytes from low to high (`spelled` says so in words)."""

    def size(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a size from {low} to {high} bytes ({spelled})"
            )
        return value

    return size


def webhook_cidr(text: str) -> str:
    """--webhook-allow-cidr: a CIDR range."""
    try:
        return parse_cidrs([text])[0]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_seconds(text: str) -> float:
    """A period in seconds above zero: a zero period would make a busy loop."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds above 0")
    return value


# --max-message-size: the range a queue's max_message_size has.
message_size = _size_flag(*MESSAGE_SIZE_RANGE, "1 KiB to 64 MiB")
response_size = _size_flag(*RESPONSE_SIZE_RANGE, "64 KiB to 64 MiB")
http_request_size = _size_flag(*HTTP_REQUEST_SIZE_RANGE, "64 KiB to 1 GiB")


def _add_logging_flags(parser: argparse.ArgumentParser, level: str, log_format: str) -> None:
    parser.add_argument(
        "--log-level", default=level, help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=log_format,
        help="text, or json: one object per line (default: $POSTBOX_LOG_FORMAT or text)",
    )


class _VerbsWithLogging:
    """Subparsers that all take the logging flags too."""

    def __init__(self, verbs: Any, logging_flags: argparse.ArgumentParser) -> None:
        self._verbs = verbs
        self._logging_flags = logging_flags

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["parents"] = [*kwargs.get("parents", []), self._logging_flags]
        return self._verbs.add_parser(name, **kwargs)


class _PrintVersions(argparse.Action):
    """--version: the report's lines as they are (argparse's own action rewraps them)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(versions.report())
        parser.exit()


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
        help="seconds between sweeps for expired messages and records (default: %(default)s)",
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
        "--workers",
        type=int,
        default=int(os.environ.get("POSTBOX_WORKERS", "1")),
        help="server processes sharing the port (SO_REUSEPORT), e.g. one per core "
        "(default: %(default)s)",
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postbox", description=__doc__)
    parser.add_argument(
        "--version", action=_PrintVersions, nargs=0,
        help="print this server's version, the SQL engine and API versions it works with, and exit",
    )  # fmt: skip
    _add_logging_flags(parser, os.environ.get("POSTBOX_LOG_LEVEL", "INFO"),
                       os.environ.get("POSTBOX_LOG_FORMAT", "text"))  # fmt: skip
    # The same flags after the verb (`postbox serve --log-level DEBUG`) win over those before.
    after_verb = argparse.ArgumentParser(add_help=False)
    _add_logging_flags(after_verb, argparse.SUPPRESS, argparse.SUPPRESS)
    verbs = _VerbsWithLogging(parser.add_subparsers(dest="verb", required=True), after_verb)

    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("POSTBOX_DATA_DIR") or default_data_dir()),
        help="data directory of the embedded PostgreSQL (default: %(default)s)",
    )
    serve = verbs.add_parser("serve", help="serve the gRPC API", parents=[data_dir])
    _add_serve_flags(serve)
    serve.add_argument(
        "--no-workers",
        action="store_true",
        help="serve the API only: leave maintenance, webhook deliveries and schedules to "
        "`postbox worker` processes on the same database",
    )
    serve.set_defaults(run=_serve)
    worker = verbs.add_parser(
        "worker",
        help="run maintenance, webhook deliveries and schedules only, for API nodes started "
        "with `serve --no-workers` (serve's flags; its API ports are not opened)",
        parents=[data_dir],
    )
    _add_serve_flags(worker)
    worker.set_defaults(run=_serve, no_workers=False)

    from postbox_server.aws.settings import ShimSettings

    sqs = verbs.add_parser(
        "sqs", help="serve the Amazon SQS and SNS APIs, calling a postbox server"
    )
    sqs.add_argument("--host", default=os.environ.get("POSTBOX_SQS_HOST", ShimSettings.host))
    sqs.add_argument(
        "--port", type=int, default=int(os.environ.get("POSTBOX_SQS_PORT", ShimSettings.port))
    )
    sqs.add_argument(
        "--grpc-target",
        default=os.environ.get("POSTBOX_TARGET", ShimSettings.grpc_target),
        help="address of the postbox gRPC server (default: $POSTBOX_TARGET or %(default)s)",
    )
    sqs.add_argument("--region", default=ShimSettings.region, help="region in queue ARNs")
    sqs.add_argument(
        "--account-id", default=ShimSettings.account_id, help="account in queue URLs and ARNs"
    )
    sqs.add_argument(
        "--public-url",
        help="base of queue URLs, e.g. https://sqs.example.com (default: the request's Host)",
    )
    add_server_flags(sqs, "HTTPS")
    add_client_flags(sqs, prefix="grpc-")
    sqs.add_argument(
        "--access-key", action="append", default=[], help="accepted access key id (repeatable)"
    )
    sqs.add_argument(
        "--secret-key", action="append", default=[], help="its secret key, in the same order"
    )
    sqs.add_argument(
        "--credentials-file",
        action="append",
        type=Path,
        default=[],
        help="AWS-style credentials file; every profile's key pair is accepted (repeatable)",
    )
    sqs.add_argument(
        "--api-key",
        default=os.environ.get("POSTBOX_API_KEY"),
        help="secret of the API key the shim calls the server with for requests signed "
        "with a static credential (default: $POSTBOX_API_KEY)",
    )
    sqs.add_argument(
        "--insecure-allow-anonymous",
        action="store_true",
        help="serve an address beyond loopback with no static credential while the "
        "server has no API key",
    )
    sqs.add_argument(
        "--sns-auto-confirm",
        action="append",
        default=[],
        metavar="URL_PREFIX",
        help="SNS http/https subscriptions to endpoints starting with this prefix start "
        "confirmed, with no SubscriptionConfirmation handshake (repeat)",
    )
    sqs.add_argument(
        "--webhook-allow-cidr",
        action="append",
        default=[],
        type=webhook_cidr,
        metavar="CIDR",
        help="let SNS subscription confirmations reach this range too (repeat); non-public "
        "addresses are refused otherwise",
    )
    sqs.add_argument(
        "--max-request-size",
        type=int,
        default=ShimSettings.max_request_size,
        help="largest request body in bytes (default: %(default)s)",
    )
    sqs.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics at /metrics on this port (default: not at all)",
    )
    sqs.add_argument(
        "--metrics-host",
        default=ShimSettings.metrics_host,
        help="address of the metrics port (default: %(default)s)",
    )
    sqs.set_defaults(run=_sqs)

    db = verbs.add_parser(
        "db", help="the embedded PostgreSQL of a running `postbox serve`", parents=[data_dir]
    )
    db.add_argument("what", choices=["url"], help="url: print its connection URL")
    db.set_defaults(run=_db)
    psql = verbs.add_parser(
        "psql",
        help="open psql on the embedded database of a running `postbox serve`",
        parents=[data_dir],
    )
    # Everything else goes to psql as given, e.g. `postbox psql -c 'TABLE postbox.queue_health'`.
    psql.set_defaults(run=_db, psql_args=[])

    migrate = verbs.add_parser("migrate", help="install or upgrade the SQL engine in a database")
    migrate.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    migrate.set_defaults(run=_migrate)

    uninstall = verbs.add_parser(
        "uninstall",
        help="remove postbox from a database: its schema, pg_cron job, capture triggers and roles",
    )
    uninstall.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    uninstall.add_argument(
        "--yes", action="store_true", help="confirm: every queue, topic and message is dropped"
    )
    uninstall.set_defaults(run=_uninstall)

    # Client verbs: --target may follow the verb, wherever it is.
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--target",
        default=os.environ.get("POSTBOX_TARGET", "localhost:50051"),
        help="address of a postbox server (default: $POSTBOX_TARGET or %(default)s)",
    )
    target.add_argument(
        "--api-key",
        default=os.environ.get("POSTBOX_API_KEY"),
        help="the secret of the API key to call with (default: $POSTBOX_API_KEY, which "
        "keeps it off the command line that ps shows)",
    )
    add_client_flags(target, environment=True)

    from postbox_server.operator.verbs import add_parsers as add_operator_parsers

    add_operator_parsers(verbs, target, run=_operate)
    completion = verbs.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(run=_completion)

    from postbox_server.auth.cli import add_parser as add_keys_parser

    add_keys_parser(verbs, target, run=_keys)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.verb == "psql":
        args.psql_args = unknown  # psql's own arguments, e.g. -c
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging(args.log_level, args.log_format)
    sys.exit(args.run(args))
