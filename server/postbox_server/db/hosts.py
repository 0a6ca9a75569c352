"""Connects to a URL of several hosts one host at a time, each on a timeout of its own.

asyncpg tries the hosts of `postgresql://h1,h2/db` in order under one timeout for
all of them: a first host that is gone without refusing (powered off, cut off: no
TCP reset) takes the whole timeout, so the next host is never tried and traffic never
moves to the promoted standby. Here each host gets HOST_TIMEOUT, and the host that
last accepted is tried first, so only the first connection after a failover pays
for a silent host.
"""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

# Seconds one host gets to accept a connection (TCP, TLS, authentication, and
# target_session_attrs): far above a reachable server's milliseconds.
HOST_TIMEOUT = 5.0

FAILED_HOST = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a host that does not match target_session_attrs
)
_last_accepted: dict[str, str] = {}  # URL -> host that last accepted


def describe(dsn: str) -> str:
    """user@hosts/database of a URL, for messages: never its password or parameters."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return f"{user}{at}{hosts or 'localhost'}{parts.path}"


def single_host_urls(dsn: str) -> list[tuple[str, str]]:
    """(host, URL naming that host alone) for each host of a multi-host URL; [] otherwise."""
    parts = urlsplit(dsn)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if "," not in hosts:
        return []
    return [
        (host, urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}")))
        for host in hosts.split(",")
    ]


async def connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    """asyncpg.connect, host by host for a URL of several hosts (also a pool's `connect`,
    whose signature has the dsn optional)."""
    hosts = single_host_urls(dsn) if dsn is not None else []
    if dsn is None or not hosts:
        return await asyncpg.connect(dsn, **kwargs)
    preferred = _last_accepted.get(dsn)
    hosts.sort(key=lambda host: host[0] != preferred)  # stable: the rest keep their order
    failure: BaseException | None = None
    for host, url in hosts:
        try:
            conn = await asyncpg.connect(url, timeout=HOST_TIMEOUT, **kwargs)
        except FAILED_HOST as exc:
            failure = exc
            continue
        _last_accepted[dsn] = host
        return conn
    assert failure is not None
    raise failure
