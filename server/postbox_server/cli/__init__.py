"""The `postbox` command: `main` parses the verb and runs it.

One module per verb group registers its subparser (`add_parser`) and runs it:
`serve` (serve, worker), `sqs`, `embedded` (db, psql), `schema` (migrate, uninstall),
`completion`, and the client verbs, which call the server through the SDK
(`postbox_client.Client`, opened by `client`): `status`, `queues`, `messages`, `dlq`,
`topics`, `schedules`, `keys`, and `mcp`, an MCP server whose tools are such calls.
"""

from postbox_server.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
