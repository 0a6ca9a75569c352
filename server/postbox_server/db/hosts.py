"""Connects to the database: a URL of several hosts one host at a time, each on a
timeout of its own, and every connection with TCP timeouts that notice a silent peer.

asyncpg tries the hosts of `postgresql://h1,h2/db` in order under one timeout for
all of them: a first host that is gone without refusing (powered off, cut off: no
TCP reset) takes the whole timeout, so the next host is never tried and traffic never
moves to the promoted standby. Here each host gets HOST_TIMEOUT, and the host that
last accepted is tried first, so only the first connection after a failover pays
for a silent host.

A database cut off by a network that drops packets (rather than refusing them) sends no
reset: without more, a connection waiting for it waits for the kernel's retransmission
timeout, about 15 minutes. Every connection here gets TCP keepalives (a probe after
KEEPALIVE_IDLE seconds of silence, then every KEEPALIVE_INTERVAL) and a TCP user timeout
of `silence_timeout` seconds (--database-silence-timeout): data sent and not
acknowledged, or probes not answered, for that long close the connection, so the call
on it fails UNAVAILABLE, the LISTEN connection's loss wakes the health check, and the
pool opens a fresh connection once the network is back.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

# Seconds one host gets to accept a connection (TCP, TLS, authentication, and
# target_session_attrs): far above a reachable server's milliseconds. A URL of one
# host too: asyncpg's default of 60 s would keep a connection started during a
# partition waiting (its SYNs backing off) long after the network is back.
HOST_TIMEOUT = 5.0
# TCP keepalives: the first probe after this many seconds of silence, then one every
# KEEPALIVE_INTERVAL; a few bytes each, on an idle connection only.
KEEPALIVE_IDLE = 1
KEEPALIVE_INTERVAL = 1
# Seconds of silence from the database (sent data unacknowledged, probes unanswered)
# after which a connection is closed; `serve --database-silence-timeout` sets it.
DEFAULT_SILENCE_TIMEOUT = 2.0
_silence_timeout = DEFAULT_SILENCE_TIMEOUT

FAILED_HOST = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a host that does not match target_session_attrs
)
_last_accepted: dict[str, str] = {}  # URL -> host that last accepted


class DatabaseSilent(ConnectionError):
    """No host accepted a connection within HOST_TIMEOUT: an OSError, as a refusal is,
    and not the asyncio.TimeoutError of asyncpg's connect, which a pool's acquire would
    pass on as its own (all connections busy) timeout."""


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


def set_silence_timeout(seconds: float) -> None:
    """The TCP user timeout of connections made from now on (this process's)."""
    global _silence_timeout
    _silence_timeout = seconds


def _notice_silence(conn: asyncpg.Connection) -> asyncpg.Connection:
    """Sets the keepalives and the user timeout on a TCP connection (not a Unix socket)."""
    # asyncpg exposes no socket options; its transport's socket takes them.
    sock = getattr(conn, "_transport").get_extra_info("socket")  # noqa: B009
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return conn
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):  # Linux; elsewhere the OS's defaults hold
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(_silence_timeout * 1000))
    return conn


async def connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    """asyncpg.connect, host by host for a URL of several hosts (also a pool's `connect`,
    whose signature has the dsn optional), with TCP timeouts that notice a silent peer."""
    kwargs.setdefault("timeout", HOST_TIMEOUT)
    try:
        conn = await _connect(dsn, **kwargs)
    except asyncio.TimeoutError:
        raise DatabaseSilent(
            f"the database {describe(dsn or '')!r} did not accept a connection within "
            f"{kwargs['timeout']:g} s"
        ) from None
    return _notice_silence(conn)


async def _connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    hosts = single_host_urls(dsn) if dsn is not None else []
    if dsn is None or not hosts:
        return await asyncpg.connect(dsn, **kwargs)
    preferred = _last_accepted.get(dsn)
    hosts.sort(key=lambda host: host[0] != preferred)  # stable: the rest keep their order
    failure: BaseException | None = None
    for host, url in hosts:
        try:
            conn = await asyncpg.connect(url, **kwargs)
        except FAILED_HOST as exc:
            failure = exc
            continue
        _last_accepted[dsn] = host
        return conn
    assert failure is not None
    raise failure
