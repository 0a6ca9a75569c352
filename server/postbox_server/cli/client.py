"""What every client verb shares: the flags that reach a server (--target, --api-key,
TLS) and shape the output (-o, --base64), and the `postbox_client.Client` a verb calls
the server with."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from postbox_client import Client, PostboxError, Retry

from postbox_server.cli import output
from postbox_server.tls import TlsError, add_client_flags, client_tls

# A client verb: the parsed flags and a client of the server; returns the exit code.
Handler = Callable[[argparse.Namespace, Client], int]

# The CLI says what failed at once rather than retrying UNAVAILABLE as a program would:
# one attempt per call.
ONE_ATTEMPT = Retry(attempts=1)


def connect(args: argparse.Namespace, retry: Retry = ONE_ATTEMPT) -> Client:
    """A client of --target with the API key (--api-key, or --api-key-file where the verb
    has it), over TLS when the --tls flags ask for it; a flag that cannot work ends the
    command (exit code 2), naming the flag."""
    try:
        tls = client_tls(args)
        key = _api_key(args)
    except (TlsError, OSError) as error:
        print(f"postbox {args.verb}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    return Client(args.target, api_key=key, tls=tls, retry=retry)


def _api_key(args: argparse.Namespace) -> str | None:
    path = getattr(args, "api_key_file", None)
    if path is None:
        key: str | None = args.api_key
        return key
    try:
        return Path(path).read_text().strip()
    except OSError as error:
        raise OSError(f"--api-key-file {path}: {error.strerror}") from None


def run_with_client(args: argparse.Namespace) -> int:
    """Runs a client verb (its `handler`); a failed call is one line on stderr, exit 1."""
    with connect(args) as client:
        try:
            handler: Handler = args.handler
            return handler(args, client)
        except PostboxError as error:
            print(error, file=sys.stderr)
            return 1


class _RefuseKeyOnCommandLine(argparse.Action):
    """--api-key of a verb that runs for long: ps would show the secret all along."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        parser.error(
            "--api-key would show the key to ps for as long as this runs: set "
            "$POSTBOX_API_KEY or give --api-key-file instead"
        )


def connection_flags(*, long_running: bool = False) -> argparse.ArgumentParser:
    """--target, --api-key and the TLS flags; they may follow the verb, wherever it is. A
    long-running verb takes the key from $POSTBOX_API_KEY or --api-key-file only."""
    target = argparse.ArgumentParser(add_help=False)
    target.add_argument(
        "--target",
        default=os.environ.get("POSTBOX_TARGET", "localhost:50051"),
        help="address of a postbox server (default: $POSTBOX_TARGET or %(default)s)",
    )
    if long_running:
        target.set_defaults(api_key=os.environ.get("POSTBOX_API_KEY"))
        target.add_argument(
            "--api-key-file",
            type=Path,
            metavar="PATH",
            help="a file holding the secret of the API key to call with (default: "
            "$POSTBOX_API_KEY)",
        )
        target.add_argument(
            "--api-key", nargs=0, action=_RefuseKeyOnCommandLine, help=argparse.SUPPRESS
        )
    else:
        target.add_argument(
            "--api-key",
            default=os.environ.get("POSTBOX_API_KEY"),
            help="the secret of the API key to call with (default: $POSTBOX_API_KEY, which "
            "keeps it off the command line that ps shows)",
        )
    add_client_flags(target, environment=True)
    return target


def output_flags() -> argparse.ArgumentParser:
    """-o and --base64: how the verb prints what the server answered."""
    shown = argparse.ArgumentParser(add_help=False)
    shown.add_argument(
        "-o", "--output", choices=output.FORMATS, default="table", help="table, json or yaml"
    )
    shown.add_argument(
        "--base64", action="store_true", help="bodies in base64, even when they are text"
    )
    return shown


@dataclass(frozen=True)
class ClientParsers:
    """The parent parsers of the client verbs, and `verb`, which adds one."""

    connection: argparse.ArgumentParser
    shown: argparse.ArgumentParser

    @classmethod
    def build(cls) -> ClientParsers:
        return cls(connection_flags(), output_flags())

    def verb(
        self, parent: Any, name: str, help_: str, handler: Handler, **kwargs: Any
    ) -> argparse.ArgumentParser:
        """A verb under `parent` (subparsers) that runs `handler` with a client."""
        parser: argparse.ArgumentParser = parent.add_parser(
            name, parents=[self.connection, self.shown], help=help_, **kwargs
        )
        parser.set_defaults(run=run_with_client, handler=handler)
        return parser
