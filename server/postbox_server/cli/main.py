"""The `postbox` command's parser, built from each verb group's module, and `main`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from postbox_server import versions
from postbox_server.cli import (
    completion,
    dlq,
    embedded,
    keys,
    mcp,
    messages,
    queues,
    schedules,
    schema,
    serve,
    sqs,
    status,
    tenants,
    topics,
)
from postbox_server.cli.client import ClientParsers
from postbox_server.cli.flags import Verbs, data_dir_flags
from postbox_server.observability.logs import FORMATS
from postbox_server.observability.logs import configure as configure_logging

DESCRIPTION = "The `postbox` command: serve, migrate, and client verbs for a first try."


def _add_logging_flags(parser: argparse.ArgumentParser, level: str, log_format: str) -> None:
    parser.add_argument(
        "--log-level", default=level, help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=log_format,
        help="text, or json: one object per line (default: $POSTBOX_LOG_FORMAT or text)",
    )


class _PrintVersions(argparse.Action):
    """--version: the report's lines as they are (argparse's own action rewraps them)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(versions.report())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="postbox", description=DESCRIPTION)
    parser.add_argument(
        "--version", action=_PrintVersions, nargs=0,
        help="print this server's version, the SQL engine and API versions it works with, and exit",
    )  # fmt: skip
    _add_logging_flags(parser, os.environ.get("POSTBOX_LOG_LEVEL", "INFO"),
                       os.environ.get("POSTBOX_LOG_FORMAT", "text"))  # fmt: skip
    # The same flags after the verb (`postbox serve --log-level DEBUG`) win over those before.
    after_verb = argparse.ArgumentParser(add_help=False)
    _add_logging_flags(after_verb, argparse.SUPPRESS, argparse.SUPPRESS)
    verbs = Verbs(parser.add_subparsers(dest="verb", required=True), after_verb)

    data_dir = data_dir_flags()
    serve.add_parsers(verbs, data_dir)
    sqs.add_parser(verbs)
    embedded.add_parsers(verbs, data_dir)
    schema.add_parsers(verbs)
    # The client verbs, in the order `postbox --help` lists them.
    client = ClientParsers.build()
    for group in (status, queues, messages, dlq, topics, schedules):
        group.add_parser(verbs, client)
    completion.add_parser(verbs, build_parser)
    keys.add_parser(verbs, client)
    tenants.add_parser(verbs, client)
    mcp.add_parser(verbs)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.verb == "psql":
        args.psql_args = unknown  # psql's own arguments, e.g. -c
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    configure_logging(args.log_level, args.log_format)
    sys.exit(args.run(args))
