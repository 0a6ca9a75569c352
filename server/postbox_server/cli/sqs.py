"""`postbox sqs`: the Amazon SQS and SNS APIs, as a client of a postbox server."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from postbox_server import event_loop
from postbox_server.cli.flags import Verbs, add_sns_signing_flag, webhook_cidr
from postbox_server.embedded import default_data_dir
from postbox_server.tls import add_client_flags, add_server_flags, client_tls, server_tls


def run(args: argparse.Namespace) -> int:
    from postbox_server.aws.app import AnonymousExposure, serve
    from postbox_server.aws.settings import ShimSettings
    from postbox_server.aws.sigv4 import load_credentials

    if len(args.access_key) != len(args.secret_key):
        print("postbox sqs: give one --secret-key per --access-key", file=sys.stderr)
        return 2
    from postbox_server.sns_signing import SigningKeyError, default_key_path, load_or_create

    if args.sns_signing_key is None:
        # The file `postbox serve` makes beside its data directory on this host.
        data_dir = Path(os.environ.get("POSTBOX_DATA_DIR") or default_data_dir())
        args.sns_signing_key = default_key_path(data_dir)
    try:
        signing_key = load_or_create(args.sns_signing_key)
    except SigningKeyError as error:
        print(f"postbox sqs: --sns-signing-key: {error}", file=sys.stderr)
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
        sns_signing_key=signing_key,
    )
    try:
        event_loop.run(serve(settings))
    except AnonymousExposure as refusal:
        print(f"postbox sqs: {refusal}", file=sys.stderr)
        return 2
    return 0


def add_parser(verbs: Verbs) -> None:
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
    sqs.add_argument(
        "--region",
        default=ShimSettings.region,
        help="region of unsigned requests naming no ARN (a signed one is in the region it is "
        "signed for)",
    )
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
    add_sns_signing_flag(sqs)
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
    sqs.set_defaults(run=run)
