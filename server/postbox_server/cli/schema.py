"""`postbox migrate` and `postbox uninstall`: the SQL engine in a database."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from postbox_server.cli.flags import Verbs


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


def add_parsers(verbs: Verbs) -> None:
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
