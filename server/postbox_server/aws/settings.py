"""Settings of the SQS shim process."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from postbox_client import TLS

from postbox_server.sns_signing import SigningKey
from postbox_server.tls import ServerTls

MIB = 1024 * 1024


@dataclass(frozen=True)
class ShimSettings:
    # Loopback only (127.0.0.1 and ::1): reaching the network is a choice.
    host: str = "localhost"
    port: int = 9324
    grpc_target: str = "localhost:50051"
    # None: plain HTTP (postbox_server/tls.py).
    tls: ServerTls | None = None
    # The channel to the server: None, plaintext.
    grpc_tls: TLS | None = None
    # The region of unsigned requests that name no ARN; a signed request is in the
    # region it is signed for (aws/app.py, aws/accounts.py).
    region: str = "us-east-1"
    account_id: str = "000000000000"
    # Base of queue URLs, e.g. "https://sqs.example.com"; None: the Host of each request.
    public_url: str | None = None
    # access key -> secret key; empty: signatures are not checked.
    credentials: Mapping[str, str] = field(default_factory=dict)
    # The API key secret the shim's calls carry for requests a static credential signed
    # (and for unsigned requests of a shim without credentials).
    api_key: str | None = None
    # Serve beyond loopback with no static credential while the server has no key.
    insecure_allow_anonymous: bool = False
    # Largest request body read. A legal request fits: a 1 MiB batch grows by at most
    # 3x in form encoding (%XX per byte), plus names and attributes.
    max_request_size: int = 4 * MIB
    # Seconds a unary gRPC call may take before the shim answers ServiceUnavailable.
    grpc_timeout: float = 30.0
    # SNS: endpoint URL prefixes whose http/https subscriptions start confirmed (no
    # SubscriptionConfirmation handshake), and the private ranges the shim's
    # confirmation POSTs may reach (postbox_server/egress.py).
    sns_auto_confirm: tuple[str, ...] = ()
    webhook_allow_cidrs: tuple[str, ...] = ()
    # Signs SNS confirmations, and its certificate is served at
    # /SimpleNotificationService.pem (the server signs notifications with the same key);
    # None: unsigned, and no certificate.
    sns_signing_key: SigningKey | None = None
    # Prometheus /metrics on this port (None: not served).
    metrics_host: str = "localhost"
    metrics_port: int | None = None
