"""argparse types and parent parsers that more than one verb takes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from postbox_server.config import HTTP_REQUEST_SIZE_RANGE, MESSAGE_SIZE_RANGE, RESPONSE_SIZE_RANGE
from postbox_server.egress import parse_cidrs
from postbox_server.embedded import default_data_dir


def _size_flag(low: int, high: int, spelled: str) -> Callable[[str], int]:
    """An argparse type: whole bytes from low to high (`spelled` says so in words)."""

    def size(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text[:40]!r} is not a size from {low} to {high} bytes ({spelled})"
            )
        return value

    return size


def webhook_cidr(text: str) -> str:
    """--webhook-allow-cidr: a CIDR range."""
    try:
        return parse_cidrs([text])[0]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def positive_seconds(text: str) -> float:
    """A period in seconds above zero: a zero period would make a busy loop."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds above 0")
    return value


# --max-message-size: the range a queue's max_message_size has.
message_size = _size_flag(*MESSAGE_SIZE_RANGE, "1 KiB to 64 MiB")
response_size = _size_flag(*RESPONSE_SIZE_RANGE, "64 KiB to 64 MiB")
http_request_size = _size_flag(*HTTP_REQUEST_SIZE_RANGE, "64 KiB to 1 GiB")


def data_dir_flags() -> argparse.ArgumentParser:
    """--data-dir, of the verbs that start or find the embedded PostgreSQL."""
    data_dir = argparse.ArgumentParser(add_help=False)
    data_dir.add_argument(
        "--data-dir",
        type=Path,
        default=Path(os.environ.get("POSTBOX_DATA_DIR") or default_data_dir()),
        help="data directory of the embedded PostgreSQL (default: %(default)s)",
    )
    return data_dir


class Verbs:
    """The top-level verbs' subparsers, which all take the logging flags too."""

    def __init__(self, verbs: Any, logging_flags: argparse.ArgumentParser) -> None:
        self._verbs = verbs
        self._logging_flags = logging_flags

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs["parents"] = [*kwargs.get("parents", []), self._logging_flags]
        parser: argparse.ArgumentParser = self._verbs.add_parser(name, **kwargs)
        return parser


def add_sns_signing_flag(parser: argparse.ArgumentParser) -> None:
    """--sns-signing-key, which `postbox serve` and `postbox sqs` share: both sign."""
    parser.add_argument(
        "--sns-signing-key",
        type=Path,
        default=os.environ.get("POSTBOX_SNS_SIGNING_KEY") or None,
        metavar="FILE",
        help="PEM file of the RSA key (and optionally its certificate) that signs SNS "
        "messages; made with a new key and a self-signed certificate when it does not "
        "exist. Give the server and the SNS shim the same file (default: "
        "$POSTBOX_SNS_SIGNING_KEY, else sns-signing-key.pem in the directory that holds "
        "the --data-dir, made once and kept)",
    )


def check_sns_signing_key(args: argparse.Namespace, verb: str, data_dir: Path) -> bool:
    """Reads (or makes) the --sns-signing-key file now, so that a bad one stops the
    command before it serves; False after saying why on stderr. With no file named, it
    is the one beside `data_dir` (sns_signing.default_key_path), set on `args`."""
    from postbox_server.sns_signing import SigningKeyError, default_key_path, load_or_create

    if args.sns_signing_key is None:
        args.sns_signing_key = default_key_path(data_dir)
    try:
        load_or_create(args.sns_signing_key)
    except SigningKeyError as error:
        print(f"postbox {verb}: --sns-signing-key: {error}", file=sys.stderr)
        return False
    return True
