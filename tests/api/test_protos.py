"""The API's own rules, checked on the .proto sources: every field's comment says
whether it is Required, Optional or Output only (oneof members take the word of their
oneof), and every List RPC pages with page_size and page_token."""

from __future__ import annotations

import re
from pathlib import Path

from support import ROOT, api_methods

PROTOS = sorted((ROOT / "protos" / "postbox" / "v1").glob("*.proto"))
FIELD = re.compile(r"(optional |repeated )?[\w.<>, ]+\s+\w+\s*=\s*\d+;")
BLOCK = re.compile(r"(message|enum|service|oneof)\s+(\w+)\s*\{")
WORDS = ("Required", "Optional", "Output only")


def _fields_and_comments(path: Path):
    """(message or oneof, field line, the first line of its comment) for every field."""
    lines = path.read_text().split("\n")
    stack: list[tuple[str, str]] = []
    for number, line in enumerate(lines):
        text = line.strip()
        if block := BLOCK.match(text):
            stack.append((block.group(1), block.group(2)))
        elif text == "}" and stack:
            stack.pop()
        elif stack and stack[-1][0] in ("message", "oneof") and FIELD.match(text):
            above = number - 1
            while above >= 0 and lines[above].strip().startswith("//"):
                above -= 1
            comment = (
                lines[above + 1].strip().removeprefix("//").strip() if above + 1 < number else ""
            )
            yield stack[-1], f"{path.name}:{number + 1}: {text}", comment


def test_every_field_says_required_optional_or_output_only():
    unsaid = [
        where
        for path in PROTOS
        for (kind, _), where, comment in _fields_and_comments(path)
        if kind != "oneof" and not comment.startswith(WORDS)
    ]
    assert unsaid == []


def test_every_oneof_says_required_or_optional():
    unsaid = []
    for path in PROTOS:
        lines = path.read_text().split("\n")
        for number, line in enumerate(lines):
            if line.strip().startswith("oneof "):
                above = number - 1
                while lines[above - 1].strip().startswith("//"):
                    above -= 1
                comment = lines[above].strip().removeprefix("//").strip()
                if not comment.startswith(WORDS):
                    unsaid.append(f"{path.name}:{number + 1}")
    assert unsaid == []


def test_every_list_rpc_pages():
    lists = [m for m in api_methods() if m.name.startswith("List")]
    assert len(lists) >= 9
    for method in lists:
        fields = {f.name for f in method.input_type.fields}
        assert {"page_size", "page_token"} <= fields, method.full_name
        assert "next_page_token" in {f.name for f in method.output_type.fields}, method.full_name
