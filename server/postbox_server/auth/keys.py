"""The keys a server process knows, kept current by LISTEN on channel postbox_keys.

Every call is checked against this cache, never the database: a change to any key
notifies on commit, and each process reloads all keys (a small table) at once, so a
revoked key stops working everywhere within a second. With the keys come the tenants'
rate limits (a change to a tenant notifies too), which each key of a tenant carries
with its own (ratelimits.py). A process that loses its listening connection keeps its
last keys and reloads when it reconnects.

The same connection records when keys were used (postbox.api_key_usage): a call only
notes its key's time in memory, and the listener writes what is due in one statement,
a key at most once every USAGE_INTERVAL seconds per process (its first use at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timezone

import asyncpg

from postbox_server.auth.ratelimits import Limited, Limits, RateLimiter
from postbox_server.auth.secrets import secret_sha256
from postbox_server.db import hosts
from postbox_server.db.engine import Row, application_name
from postbox_server.tenant_names import DEFAULT_TENANT, qualified

log = logging.getLogger(__name__)

CHANNEL = "postbox_keys"
# Seconds between two writes of one key's last use by one process.
USAGE_INTERVAL = 60.0
PERMISSIONS = ("send", "receive", "publish", "read", "manage", "admin")


def pattern_regex(pattern: str, tenant: str = DEFAULT_TENANT) -> re.Pattern[str]:
    """A grant's pattern as a regular expression over stored names: "*" matches any run
    of characters but "/", so that no pattern of one tenant reaches into another's
    `<tenant>/` names; a tenant key's pattern is of its own tenant's names."""
    regex = "[^/]*".join(re.escape(part) for part in pattern.split("*"))
    return re.compile(re.escape(qualified(tenant, "")) + regex, re.DOTALL)


def gives(held: str, needed: str) -> bool:
    """Whether a granted permission includes the needed one: admin includes everything,
    and manage includes read (who may create, change and delete a queue may look at it;
    the SQS shim's changes read the queue first)."""
    return held in (needed, "admin") or (held == "manage" and needed == "read")


@dataclass(frozen=True)
class Grant:
    permission: str
    pattern: str
    # The tenant of the key holding it ("" for the default tenant).
    tenant: str = DEFAULT_TENANT
    regex: re.Pattern[str] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "regex", pattern_regex(self.pattern, self.tenant))

    def covers(self, permission: str, resource: str) -> bool:
        if not gives(self.permission, permission):
            return False
        return self.regex.fullmatch(resource) is not None


@dataclass(frozen=True)
class ApiKey:
    name: str
    secret_sha256: bytes
    sigv4_secret: str
    expires_at: float | None  # seconds since the epoch
    grants: tuple[Grant, ...]
    # The rate limits its calls count against (ratelimits.py): its own and its tenant's,
    # those it has; none: not limited.
    limited: tuple[Limited, ...] = field(default=(), compare=False)
    # The tenant it belongs to ("" for the default tenant): its grants cover that tenant's names.
    tenant: str = DEFAULT_TENANT

    @classmethod
    def from_row(cls, row: Row, tenant_limits: Mapping[str, Limits] | None = None) -> ApiKey:
        """`tenant_limits`: the rate limits of the tenants that have some, by name."""
        expires_at = row["expires_at"]
        tenant = row["tenant"] or DEFAULT_TENANT
        own = Limits.from_json(row["rate_limits"])
        shared = (tenant_limits or {}).get(tenant) if tenant else None
        return cls(
            name=row["name"],
            secret_sha256=bytes(row["secret_sha256"]),
            sigv4_secret=row["sigv4_secret"],
            expires_at=expires_at.timestamp() if expires_at is not None else None,
            grants=tuple(
                Grant(permission, pattern, tenant)
                for permission, pattern in zip(row["permissions"], row["patterns"], strict=True)
            ),
            limited=(
                *((Limited("API key", row["name"], own),) if own else ()),
                *((Limited("tenant", tenant, shared),) if shared else ()),
            ),
            tenant=tenant,
        )

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at

    def allows(self, permission: str, resource: str) -> bool:
        return any(grant.covers(permission, resource) for grant in self.grants)

    def holds(self, permission: str) -> bool:
        """Whether any grant gives this permission, on whatever names."""
        return any(gives(grant.permission, permission) for grant in self.grants)


# The key of the call in progress, set by the interceptor before the servicer runs
# (None while auth is off): for the rare servicer that checks a further permission
# on its own, as a send that may create its queue does.
CALLER: ContextVar[ApiKey | None] = ContextVar("postbox_caller_key", default=None)


def caller_allows(permission: str, resource: str) -> bool:
    """Whether the key of the call in progress may do this (any call, while auth is off)."""
    key = CALLER.get()
    return key is None or key.allows(permission, resource)


class KeyCache:
    """All keys, by the hash of their secret and by name; `enabled` once any exists."""

    def __init__(
        self, dsn: str, *, reconnect_delay: float = 0.5, liveness_interval: float = 10.0
    ) -> None:
        self._dsn = dsn
        self._liveness_interval = liveness_interval
        self._reconnect_delay = reconnect_delay
        self._by_sha256: dict[bytes, ApiKey] = {}
        self._by_name: dict[str, ApiKey] = {}
        self._loaded = asyncio.Event()
        self._stale = asyncio.Event()
        self._change_callbacks: list[Callable[[], None]] = []
        # Reloads begun and finished: catch_up waits for one that began after it was called.
        self._reloads_begun = 0
        self._reloads_done = asyncio.Condition()
        self._reloads_finished = 0
        self._task: asyncio.Task[None] | None = None
        # Last use (epoch seconds) of each key not written yet, and when (monotonic)
        # this process last wrote each key's.
        self._used: dict[str, float] = {}
        self._written: dict[str, float] = {}
        self._usage_due = asyncio.Event()
        # The keys' and the tenants' rate limits, shared among this database's server
        # processes.
        self.limiter = RateLimiter()

    @property
    def enabled(self) -> bool:
        """Auth is on as soon as one key exists."""
        return bool(self._by_name)

    def by_secret(self, secret: str) -> ApiKey | None:
        key = self._by_sha256.get(secret_sha256(secret))
        # The lookup compares hashes of 256-bit secrets, which leaks nothing worth
        # knowing; the constant-time comparison states the intent all the same.
        if key is not None and hmac.compare_digest(key.secret_sha256, secret_sha256(secret)):
            return key
        return None

    def by_name(self, name: str) -> ApiKey | None:
        return self._by_name.get(name)

    def note_use(self, key: ApiKey) -> None:
        """Remembers that a call presented `key`; the listener writes it when due."""
        self._used[key.name] = time.time()
        written = self._written.get(key.name)
        if written is None or time.monotonic() - written >= USAGE_INTERVAL:
            self._usage_due.set()

    def _due_usage(self) -> dict[str, float]:
        """Takes the uses whose key was not written for USAGE_INTERVAL (or ever)."""
        now = time.monotonic()
        due = {
            name: used
            for name, used in self._used.items()
            if now - self._written.get(name, -USAGE_INTERVAL) >= USAGE_INTERVAL
        }
        for name in due:
            del self._used[name]
            self._written[name] = now
        return due

    async def _record_usage(self, conn: asyncpg.Connection) -> bool:
        """Writes the uses that are due; whether there were any."""
        self._usage_due.clear()
        due = self._due_usage()
        if not due:
            return False
        names = list(due)
        used = [datetime.fromtimestamp(due[name], timezone.utc) for name in names]
        try:
            await conn.execute("SELECT postbox.record_key_use($1, $2)", names, used)
        except BaseException:
            # Tried again with the next flush, unless newer uses replaced them.
            for name in names:
                self._used.setdefault(name, due[name])
                self._written.pop(name, None)
            raise
        return True

    def replace(self, keys: Iterable[ApiKey]) -> None:
        keys = list(keys)
        self._by_sha256 = {key.secret_sha256: key for key in keys}
        self._by_name = {key.name: key for key in keys}

    async def start(self, *, timeout: float = 10.0) -> None:
        """Starts listening; returns once the keys are loaded (raises TimeoutError otherwise:
        a server must not serve before it knows whether auth is on)."""
        self._task = asyncio.create_task(self._listen_forever(), name="postbox-keys")
        await asyncio.wait_for(self._loaded.wait(), timeout)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def on_change(self, callback: Callable[[], None]) -> None:
        """Calls `callback` whenever a key, a grant or a tenant changes, on any server."""
        self._change_callbacks.append(callback)

    def _on_notify(self, *_args: object) -> None:
        self._stale.set()
        for callback in self._change_callbacks:
            callback()

    async def catch_up(self, timeout: float = 1.0) -> None:
        """Returns once this process has reloaded the keys after the call (or after
        `timeout`): a key changed through this server works at once on it."""
        target = self._reloads_begun + 1
        self._stale.set()
        async with self._reloads_done:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._reloads_done.wait_for(lambda: self._reloads_finished >= target),
                    timeout,
                )

    async def _reload(self, conn: asyncpg.Connection) -> None:
        self._stale.clear()  # before the read: a change committed after it notifies again
        self._reloads_begun += 1
        begun = self._reloads_begun
        rows = await conn.fetch("SELECT * FROM postbox.all_keys()")
        tenants = await conn.fetch("SELECT * FROM postbox.tenant_rate_limits()")
        tenant_limits = {
            tenant["tenant_name"]: limits
            for tenant in tenants
            if (limits := Limits.from_json(tenant["rate_limits"])) is not None
        }
        self.replace(ApiKey.from_row(row, tenant_limits) for row in rows)
        await self._count_processes(conn)
        self._loaded.set()
        async with self._reloads_done:
            self._reloads_finished = begun
            self._reloads_done.notify_all()

    async def _count_processes(self, conn: asyncpg.Connection) -> None:
        """How many server processes share the rate limits: those listening for keys on
        this database (each has one such connection, named by application_name)."""
        count = await conn.fetchval(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE 'postbox/%/keys'",
            timeout=self._liveness_interval,
        )
        self.limiter.processes = max(1, int(count or 0))

    async def _listen_forever(self) -> None:
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await hosts.connect(
                    self._dsn, server_settings={"application_name": application_name("keys")}
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, event=lost: event.set())
                await conn.add_listener(CHANNEL, self._on_notify)
                await self._reload(conn)  # changes made while not listening
                while not lost.is_set():
                    changed = asyncio.ensure_future(self._stale.wait())
                    ended = asyncio.ensure_future(lost.wait())
                    used = asyncio.ensure_future(self._usage_due.wait())
                    try:
                        await asyncio.wait(
                            {changed, ended, used},
                            timeout=self._liveness_interval,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                    finally:
                        changed.cancel()
                        ended.cancel()
                        used.cancel()
                    if lost.is_set():
                        break
                    # A write is a round trip: it checks the connection as SELECT 1 would.
                    wrote = await self._record_usage(conn)
                    if self._stale.is_set():
                        await self._reload(conn)
                    elif not wrote:  # a connection dropped without a word shows here
                        await self._count_processes(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("key listener lost its connection (keeping the last keys): %r", exc)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(self._reconnect_delay)
