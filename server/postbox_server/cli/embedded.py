"""`postbox db url` and `postbox psql`: the embedded PostgreSQL of a running server."""

from __future__ import annotations

import argparse
import os
import sys

from postbox_server.cli.flags import Verbs


def run(args: argparse.Namespace) -> int:
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


def add_parsers(verbs: Verbs, data_dir: argparse.ArgumentParser) -> None:
    db = verbs.add_parser(
        "db", help="the embedded PostgreSQL of a running `postbox serve`", parents=[data_dir]
    )
    db.add_argument("what", choices=["url"], help="url: print its connection URL")
    db.set_defaults(run=run)
    psql = verbs.add_parser(
        "psql",
        help="open psql on the embedded database of a running `postbox serve`",
        parents=[data_dir],
    )
    # Everything else goes to psql as given, e.g. `postbox psql -c 'TABLE postbox.queue_health'`.
    psql.set_defaults(run=run, psql_args=[])
