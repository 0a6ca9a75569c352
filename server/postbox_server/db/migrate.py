"""Installs the SQL engine into a database and upgrades it, version by version."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from postbox_server.db.sqlfiles import engine_dir

log = logging.getLogger(__name__)

# Held for the whole migration, so replicas starting together take turns: the
# second one finds the work done.
_MIGRATION_LOCK = 0x706F7374626F78  # "postbox"

Version = tuple[int, ...]


class UnknownEngine(Exception):
    """The database holds an engine version this server cannot run on or upgrade."""


def parse_version(text: str) -> Version:
    return tuple(int(part) for part in text.split("."))


def format_version(version: Version) -> str:
    return ".".join(map(str, version))


@dataclass(frozen=True)
class Scripts:
    """The install and upgrade scripts of sql/, by version."""

    installs: dict[Version, Path]
    upgrades: dict[Version, tuple[Version, Path]]  # from-version -> (to-version, script)
    latest: Version

    @classmethod
    def load(cls, directory: Path | None = None) -> Scripts:
        directory = directory or engine_dir()
        installs: dict[Version, Path] = {}
        upgrades: dict[Version, tuple[Version, Path]] = {}
        for path in directory.glob("postbox--*.sql"):
            versions = [parse_version(v) for v in path.stem.split("--")[1:]]
            if len(versions) == 1:
                installs[versions[0]] = path
            else:
                upgrades[versions[0]] = (versions[1], path)
        control = (directory / "postbox.control").read_text()
        match = re.search(r"default_version\s*=\s*'([\d.]+)'", control)
        if not match:
            raise ValueError("postbox.control has no default_version")
        return cls(installs, upgrades, parse_version(match.group(1)))

    @property
    def oldest(self) -> Version:
        """The oldest engine version these scripts upgrade (or, lacking upgrades, install)."""
        return min([*self.upgrades, *self.installs])

    def upgrade_path(self, start: Version) -> list[tuple[Version, Path]]:
        """The upgrade scripts leading from `start` to the latest version, in order."""
        path, version = [], start
        while version != self.latest:
            if version not in self.upgrades:
                raise UnknownEngine(
                    f"no upgrade script leads from postbox {format_version(version)} "
                    f"to {format_version(self.latest)}"
                )
            version, script = self.upgrades[version]
            path.append((version, script))
        return path


async def installed_version(conn: asyncpg.Connection) -> Version | None:
    """The engine version in the database, or None when it is not installed."""
    exists = await conn.fetchval("SELECT to_regclass('postbox.schema_version') IS NOT NULL")
    if not exists:
        return None
    versions = await conn.fetch("SELECT version FROM postbox.schema_version")
    return max(parse_version(row["version"]) for row in versions)


async def migrate(conn: asyncpg.Connection, scripts: Scripts | None = None) -> Version:
    """Installs or upgrades the engine to the latest version; a no-op when it is current."""
    scripts = scripts or Scripts.load()
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        current = await installed_version(conn)
        if current == scripts.latest:
            return current
        if current is not None and current > scripts.latest:
            # A newer server upgraded this database: its engine may hold what this server
            # cannot read, and "upgrading" would mean downgrading.
            raise UnknownEngine(
                f"the database holds postbox SQL {format_version(current)}, newer than "
                f"{format_version(scripts.latest)}, the newest this server knows: run a "
                "postbox server at least as new as the one that upgraded it "
                "(`postbox --version` says which engine versions a server works with)"
            )
        as_extension = await conn.fetchval(
            "SELECT extversion FROM pg_extension WHERE extname = 'postbox'"
        )
        if as_extension:
            # CREATE EXTENSION installed it: let the extension machinery upgrade it,
            # which needs the new scripts in the server's extension directory.
            await conn.execute(
                f"ALTER EXTENSION postbox UPDATE TO '{format_version(scripts.latest)}'"
            )
        elif current is None:
            log.info("installing postbox SQL %s", format_version(scripts.latest))
            await conn.execute(scripts.installs[scripts.latest].read_text())
        else:
            for version, script in scripts.upgrade_path(current):
                log.info("upgrading postbox SQL to %s", format_version(version))
                await conn.execute(script.read_text())
        return scripts.latest
