"""`postbox completion SHELL`: a shell completion script of the whole command."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from postbox_server.cli.flags import Verbs


def add_parser(verbs: Verbs, build_parser: Callable[[], argparse.ArgumentParser]) -> None:
    """`build_parser` builds the whole command, which the script completes."""

    def run(args: argparse.Namespace) -> int:
        import shtab

        print(shtab.complete(build_parser(), shell=args.shell))
        return 0

    completion = verbs.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(run=run)
