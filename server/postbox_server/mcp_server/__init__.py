"""`postbox mcp`: a Model Context Protocol server over stdio whose tools act on a postbox
server as a client of it (postbox_server.mcp_server.tools), with the caller's API key.

It imports the SDK client and the MCP SDK, nothing of the server's own services: an agent
reaches postbox only through the API every other client uses, under the same grants.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from postbox_client import Client
from postbox_client.version import __version__

from postbox_server.mcp_server.tools import TOOLS, PostboxTools, reporting_errors

INSTRUCTIONS = (
    "Tools of a postbox message-queue server, called with this server's API key: what the "
    "key's grants refuse comes back as a PERMISSION_DENIED tool error. A received message "
    "stays invisible for its visibility timeout; ack_message it with its receipt when done, "
    "or nack_message it, else it is delivered again."
)


def build_server(client: Client) -> MCPServer:
    """An MCP server whose tools call the postbox server through `client`."""
    server: MCPServer = MCPServer(name="postbox", version=__version__, instructions=INSTRUCTIONS)
    tools = PostboxTools(client)
    for name, hints in TOOLS.items():
        server.add_tool(reporting_errors(getattr(tools, name)), annotations=hints)
    return server


def serve_stdio(client: Client) -> None:
    """Serves MCP on stdin and stdout until the client closes stdin."""
    build_server(client).run("stdio")
