"""How the client verbs print: snake_case fields as in the protos, bodies as text when they
are UTF-8, and tables, JSON or YAML (`-o`)."""

from __future__ import annotations

import base64
import json
import sys
from argparse import Namespace
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

FORMATS = ("table", "json", "yaml")


def as_dict(message: Message, *, raw_bodies: bool = False) -> dict[str, Any]:
    """A message's fields by their proto names; `body` (and binary attribute values) as text
    when they decode as UTF-8, else, or with raw_bodies, in base64 (as protobuf JSON has
    them)."""
    document = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _texts(message, document, raw_bodies)
    return document


def _texts(message: Message, document: dict[str, Any], raw_bodies: bool) -> None:
    for field, value in message.ListFields():
        if field.type == field.TYPE_BYTES and not field.is_repeated and not raw_bodies:
            text = readable(value)
            if text is not None:
                document[field.name] = text
        elif field.type == field.TYPE_MESSAGE:
            name = field.name
            entry = field.message_type  # set on every message field
            if entry is not None and entry.GetOptions().map_entry:
                for key, item in value.items():
                    if isinstance(item, Message):
                        _texts(item, document[name][key], raw_bodies)
            elif field.is_repeated:
                for item, sub in zip(value, document.get(name, []), strict=False):
                    if isinstance(sub, dict):
                        _texts(item, sub, raw_bodies)
            elif isinstance(document.get(name), dict):
                _texts(value, document[name], raw_bodies)


def readable(data: bytes) -> str | None:
    """The bytes as text when they are UTF-8 without control characters but whitespace."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        return None
    return text


def body_bytes(text: str, *, is_base64: bool) -> bytes:
    return base64.b64decode(text, validate=True) if is_base64 else text.encode()


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
