"""The rate-limit flags of `postbox keys create` and `postbox tenants create/update`:
each is the RateLimits field of the same name (access_service.proto)."""

from __future__ import annotations

import argparse

from postbox.v1 import access_service_pb2 as pb

_BURST = "0: a second's worth, at least 1"
# (field, type, what it sets)
FLAGS = (
    ("sends_per_second", float, "messages sent per second; 0: no limit"),
    ("send_burst", int, f"most sends at once; {_BURST}"),
    ("receives_per_second", float, "receives per second; 0: no limit"),
    ("receive_burst", int, f"most receives at once; {_BURST}"),
    ("calls_per_second", float, "calls of any method per second; 0: no limit"),
    ("call_burst", int, f"most calls at once; {_BURST}"),
)


def add_rate_limit_flags(parser: argparse.ArgumentParser, *, updating: bool = False) -> None:
    """Adds --sends-per-second and the like (and, to change existing limits,
    --no-rate-limits)."""
    for name, kind, what in FLAGS:
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            metavar="N",
            help=f"rate limit: {what}",
        )
    if updating:
        parser.add_argument(
            "--no-rate-limits",
            action="store_true",
            help="lift every rate limit (the rate-limit flags given replace all of them)",
        )


def rate_limits(args: argparse.Namespace) -> pb.RateLimits | None:
    """The RateLimits the flags give: None when no flag is given, empty (none) for
    --no-rate-limits."""
    given = {name: getattr(args, name) for name, _, _ in FLAGS if getattr(args, name) is not None}
    if given and getattr(args, "no_rate_limits", False):
        raise SystemExit("give either --no-rate-limits or rate-limit flags, not both")
    if given or getattr(args, "no_rate_limits", False):
        return pb.RateLimits(**given)
    return None
