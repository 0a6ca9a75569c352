"""How the client verbs print: snake_case fields as in the protos, bodies as text when they
are UTF-8, and tables, JSON or YAML (`-o`)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.message import Message

# Shared with the MCP tools, which print nothing; named here for the verbs that use them.
from postbox_server.proto_json import as_dict, body_bytes, readable

__all__ = ["FORMATS", "as_dict", "body_bytes", "emit", "note", "readable", "show", "show_one"]

FORMATS = ("table", "json", "yaml")


def emit(
    documents: Sequence[Mapping[str, Any]],
    fmt: str,
    columns: Sequence[str] = (),
    *,
    single: bool = False,
) -> None:
    """Prints documents as a table of `columns` (all of the first one's keys by default), or
    whole as JSON or YAML: a list, or with `single` the one document."""
    data: Any = dict(documents[0]) if single else [dict(d) for d in documents]
    if fmt == "json":
        print(json.dumps(data, indent=2, ensure_ascii=False))
    elif fmt == "yaml":
        import yaml

        print(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), end="")
    else:
        table(documents, columns or (list(documents[0]) if documents else []))


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    view = Table(*columns, box=None, pad_edge=False, header_style="bold")
    for row in rows:
        view.add_row(*(_cell(row.get(column)) for column in columns))
    # A pipe or a file gets whole cells; a terminal, what fits its width.
    Console(soft_wrap=True, width=None if sys.stdout.isatty() else 100_000).print(view)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def note(text: str) -> None:
    """A remark for the person, not for a pipe: stderr."""
    print(text, file=sys.stderr)


def show(args: Namespace, messages: Sequence[Message], columns: Sequence[str] = ()) -> None:
    """A list of resources, as -o and --base64 ask (a JSON or YAML list; a table)."""
    documents = [as_dict(m, raw_bodies=getattr(args, "base64", False)) for m in messages]
    emit(documents, args.output, columns)


def show_one(args: Namespace, message: Message) -> None:
    """One resource, as -o and --base64 ask (a JSON or YAML object; a table of one row)."""
    document = as_dict(message, raw_bodies=getattr(args, "base64", False))
    emit([document], args.output, single=True)
