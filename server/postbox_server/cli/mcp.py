"""`postbox mcp`: serves the Model Context Protocol on stdin and stdout, its tools calling
a postbox server with the caller's API key (postbox_server.mcp_server)."""

from __future__ import annotations

import argparse

from postbox_client import Retry

from postbox_server.cli.client import connect, connection_flags
from postbox_server.cli.flags import Verbs

DESCRIPTION = """\
Serves MCP over stdio for an agent's client (Claude Desktop, an IDE, the MCP SDK):
tools for queues, messages, topics, schedules and dead letters, each a call of the
postbox server at --target made with the API key from $POSTBOX_API_KEY or
--api-key-file, so the key's grants decide what the agent may do. A refused call is a
tool error naming the gRPC status, as in "PERMISSION_DENIED: ..."."""


def run(args: argparse.Namespace) -> int:
    from postbox_server.mcp_server import serve_stdio

    # Unlike the one-shot verbs, a server that outlives a restart of postbox: repeatable
    # calls retry UNAVAILABLE with the SDK's backoff.
    with connect(args, retry=Retry()) as client:
        serve_stdio(client)
    return 0


def add_parser(verbs: Verbs) -> None:
    parser = verbs.add_parser(
        "mcp",
        parents=[connection_flags(long_running=True)],
        help="serve the Model Context Protocol over stdio: tools that call a postbox server",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(run=run)
