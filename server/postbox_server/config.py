"""Server settings: command-line flags, with environment variables as defaults."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path

from postbox_server.embedded import default_data_dir
from postbox_server.tls import ServerTls

MIB = 1024 * 1024
# The range of --max-message-size: the engine's range of a queue's max_message_size.
MESSAGE_SIZE_RANGE = (1024, 64 * MIB)
# A SendBatch of many messages fits in a request of this size.
BATCH_REQUEST_SIZE = 64 * MIB
# Room in a request beyond one message's body and attributes: queue name, ids, framing.
REQUEST_ENVELOPE = MIB
# The range of --http-max-request-size.
HTTP_REQUEST_SIZE_RANGE = (64 * 1024, 1024 * MIB)
# The range of --max-response-size. A gRPC client takes 4 MiB unless told otherwise.
RESPONSE_SIZE_RANGE = (64 * 1024, 64 * MIB)


@dataclass(frozen=True)
class Settings:
    # None: start an embedded PostgreSQL in data_dir.
    database_url: str | None = None
    # A direct connection for LISTEN and migrations, when database_url is a transaction
    # pooler (PgBouncer's pool_mode=transaction): the pool then prepares no named statements.
    listen_database_url: str | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    # Loopback only (127.0.0.1 and ::1): reaching the network is a choice.
    grpc_host: str = "localhost"
    grpc_port: int = 50051
    # None: plaintext gRPC (postbox_server/tls.py).
    tls: ServerTls | None = None
    pool_size: int = 10
    # Seconds a call waits for a pooled connection before UNAVAILABLE.
    pool_acquire_timeout: float = 30.0
    # Seconds of silence from the database (sent data unacknowledged, keepalive probes
    # unanswered) after which a connection is closed (postbox_server/db/hosts.py).
    database_silence_timeout: float = 2.0
    # Refuse to serve unless commits wait for a synchronous standby (postbox_server/durability.py).
    require_synchronous_commit: bool = False
    # Largest message (body and attributes) this server accepts and a queue may be
    # set to accept; queues default to 1 MiB, or to this when it is smaller.
    max_message_size: int = MIB
    # Receive and StreamingReceive split what they deliver into responses of at most
    # this many bytes (a message larger than this goes alone): grpc's default limit.
    max_response_size: int = 4 * MIB
    # Waiting streams look at their queue at least this often (seconds), even
    # without a wake-up: the net under lost notifications.
    safety_poll_interval: float = 10.0
    # Seconds between steps of redrive tasks, and between expiry sweeps (retention,
    # archive retention, deduplication windows).
    maintenance_interval: float = 1.0
    expiry_interval: float = 10.0
    # Seconds between flushes of this process's per-queue counts into
    # postbox.queue_activity (postbox_server/workers/activity.py).
    activity_interval: float = 5.0
    # Seconds between counts of every tenant's usage (postbox.tenant_usage), against
    # which this process checks sends for the tenants' message and byte quotas
    # (postbox_server/tenant_quotas.py): a quota may be overrun by two intervals' sends.
    quota_refresh_interval: float = 5.0
    # Seconds in-flight calls get to finish on shutdown.
    shutdown_grace: float = 5.0
    # Bind the port with SO_REUSEPORT: set for the processes of `serve --workers N`.
    reuse_port: bool = False
    # Serve a non-loopback address while no API key exists (see refuse_anonymous_exposure).
    insecure_allow_anonymous: bool = False
    # Ranges webhooks may reach besides public addresses (postbox_server/egress.py).
    webhook_allow_cidrs: tuple[str, ...] = ()
    # The PEM file of the key that signs SNS envelopes (postbox_server/sns_signing.py),
    # made on first use when it does not exist; None: envelopes go unsigned.
    sns_signing_key: Path | None = None
    # HTTP/JSON (the Connect protocol, postbox_server/http/) on this port (None: not served), on
    # this address (the CLI defaults it to the gRPC host's), with bodies of at most this
    # many bytes: a full gRPC request in JSON, where bytes take 4/3 in base64 and strings
    # may need escapes.
    http_port: int | None = None
    http_host: str = "localhost"
    http_max_request_size: int = 2 * BATCH_REQUEST_SIZE
    # The web console (postbox_server/console/) on this port (None: not served), on this address
    # (the CLI defaults it to the HTTP host's, or the gRPC host's).
    console_port: int | None = None
    console_host: str = "localhost"
    # Prometheus /metrics on this port (None: not served), and how many queues it shows.
    metrics_host: str = "localhost"
    metrics_port: int | None = None
    metrics_max_queues: int = 1000
    # The roles this process plays: the API (gRPC, HTTP, console), and the workers
    # (maintenance, webhook deliveries, schedules). `serve --no-workers` drops the workers;
    # `postbox worker` the API.
    run_api: bool = True
    # Seconds a unary call without a deadline of its own may take (postbox_server/deadline.py).
    unary_deadline: float = 60.0
    run_workers: bool = True
    # A send to a queue that does not exist creates it with the default settings, when the
    # caller may also manage that name (`serve --auto-create-queues`): off, a typo in a
    # queue's name would quietly start a queue nobody receives from.
    auto_create_queues: bool = False

    @property
    def max_request_size(self) -> int:
        """Largest gRPC request: a batch of many messages, or the largest message.

        A message above max_message_size but within this reaches the services, which
        refuse it naming the limit; beyond it gRPC refuses with RESOURCE_EXHAUSTED.
        """
        return max(BATCH_REQUEST_SIZE, self.max_message_size + REQUEST_ENVELOPE)

    @property
    def max_send_size(self) -> int:
        """Largest gRPC response: a full one, or a single message beyond max_response_size."""
        return max(self.max_response_size, self.max_message_size + REQUEST_ENVELOPE)


def env_default(name: str, fallback: str | None = None) -> str | None:
    return os.environ.get(name, fallback)


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only: localhost, 127.0.0.0/8 or ::1."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere
