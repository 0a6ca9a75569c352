"""mkdocs hook: the SQL functions page, made at build time from sql/src/.

Each public function of the engine (a name without a leading underscore) is listed
with its signature and the comment above it, under the source file (the concern) that
defines it, with the roles that may call it as sql/src/90_security.sql grants them.
Made from the source on every build, the page cannot drift from the engine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

MARKER = "<!-- sql functions -->"
SOURCE = Path(__file__).resolve().parents[2] / "sql" / "src"
DEFINITION = re.compile(
    r"^CREATE (?:OR REPLACE )?FUNCTION postbox\.(?P<name>\w+)\s*\((?P<rest>.*?)"
    r"^\s*(?:LANGUAGE|AS\b)",
    re.MULTILINE | re.DOTALL,
)
GRANTS = re.compile(r"IF f\.name IN \((?P<reader>[^)]*)\)|ELSIF f\.name IN \((?P<writer>[^)]*)\)")


def _granted() -> dict[str, str]:
    """Function name -> the narrowest role 90_security.sql grants it to."""
    roles: dict[str, str] = {}
    text = (SOURCE / "90_security.sql").read_text()
    for match in GRANTS.finditer(text):
        role = "postbox_reader" if match["reader"] else "postbox_writer"
        for name in re.findall(r"'(\w+)'", match["reader"] or match["writer"]):
            roles[name] = role
    return roles


def _comment_above(text: str, start: int) -> str:
    """The run of `--` lines right above a definition, as one paragraph."""
    lines = text[:start].splitlines()
    comment: list[str] = []
    while lines and lines[-1].startswith("--"):
        comment.insert(0, lines.pop()[2:].strip())
    return " ".join(line for line in comment if line)


def _title(path: Path) -> str:
    return path.stem.split("_", 1)[1].replace("_", " ").capitalize()


def functions_markdown() -> str:
    roles = _granted()
    out: list[str] = []
    for path in sorted(SOURCE.glob("*.sql")):
        text = path.read_text()
        entries = []
        for match in DEFINITION.finditer(text):
            name = match["name"]
            if name.startswith("_"):
                continue
            signature = " ".join(f"postbox.{name}({match['rest']}".split())
            role = roles.get(name, "postbox_admin")
            may = "postbox_admin" if role == "postbox_admin" else f"{role} and postbox_admin"
            entries.append(
                f"### `{name}`\n\n```sql\n{signature}\n```\n\n"
                f"{_comment_above(text, match.start()) or '(no comment)'}\n\n"
                f"May call: {may}.\n"
            )
        if entries:
            out.append(f"## {_title(path)}\n\n<small>`sql/src/{path.name}`</small>\n")
            out.extend(entries)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, functions_markdown())
