"""argparse types and parent parsers that more than one verb takes."""

from __future__ import annotations

import argparse
import os
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
