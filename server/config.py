"""Server settings: command-line flags, with environment variables as defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from server.embedded import default_data_dir

MIB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    # None: start an embedded PostgreSQL in data_dir.
    database_url: str | None = None
    data_dir: Path = field(default_factory=default_data_dir)
    grpc_host: str = "[::]"
    grpc_port: int = 50051
    pool_size: int = 10
    # Largest message a queue may accept; queues default to 1 MiB.
    max_message_size: int = MIB
    # Largest gRPC request, so a SendBatch of many messages fits.
    max_request_size: int = 64 * MIB
    # Waiting streams look at their queue at least this often (seconds), even
    # without a wake-up: the net under lost notifications.
    safety_poll_interval: float = 10.0
    # Seconds between steps of redrive tasks, and between expiry sweeps (retention,
    # archive retention, deduplication windows).
    maintenance_interval: float = 1.0
    expiry_interval: float = 10.0
    # Seconds in-flight calls get to finish on shutdown.
    shutdown_grace: float = 5.0
    # Bind the port with SO_REUSEPORT: set for the processes of `serve --workers N`.
    reuse_port: bool = False


def env_default(name: str, fallback: str | None = None) -> str | None:
    return os.environ.get(name, fallback)
