"""Finds the SQL shipped with postbox: the versioned engine scripts and the named queries."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
# server/postbox_server in a checkout: the checkout's root is two folders up.
_CHECKOUT = _PACKAGE_DIR.parent.parent


def engine_dir() -> Path:
    """The directory of postbox--*.sql scripts: the checkout's sql/, or the copy in the wheel."""
    for candidate in (_CHECKOUT / "sql", _PACKAGE_DIR / "sql"):
        if (candidate / "postbox.control").is_file():
            return candidate
    raise FileNotFoundError("postbox SQL scripts not found next to the server package")


_BLOCK = re.compile(r"^-- name: (\w+)\n(.*?)(?=^-- name: |\Z)", re.DOTALL | re.MULTILINE)


@cache
def queries() -> dict[str, str]:
    """Named blocks of queries.sql ("-- name: <name>" headers), by name."""
    text = (Path(__file__).parent / "queries.sql").read_text()
    return {name: body.strip() for name, body in _BLOCK.findall(text)}
