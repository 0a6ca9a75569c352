"""Pages of every List RPC (AIP-158): page_size limits, and opaque page tokens that
name the method they continue and the last key of the page before."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from postbox_server.errors import ApiError, invalid


class _Keyed(Protocol):
    """A row whose columns are read by name: an asyncpg Record or a dict."""

    def __getitem__(self, key: str, /) -> Any: ...


_Row = TypeVar("_Row", bound=_Keyed)

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size_of(
    requested: int, default: int = DEFAULT_PAGE_SIZE, limit: int = MAX_PAGE_SIZE
) -> int:
    page_size = requested or default
    if not 1 <= page_size <= limit:
        raise invalid(f"page_size is {page_size}; it must be 1 to {limit}")
    return page_size


def encode_page_token(method: str, last: str) -> str:
    """An opaque token: the List method it continues and the last key of the page before."""
    return base64.urlsafe_b64encode(f"{method}:{last}".encode()).decode("ascii")


def next_page(
    rows: Sequence[_Row], page_size: int, method: str, key: str = "name"
) -> tuple[Sequence[_Row], str]:
    """A page's rows, of page_size + 1 fetched, and the next page's token ("" on the last)."""
    if len(rows) <= page_size:
        return rows, ""
    return rows[:page_size], encode_page_token(method, str(rows[page_size - 1][key]))


def foreign_token(method: str) -> ApiError:
    return invalid(
        "page_token is not one this server issued: pass the next_page_token of the "
        f"previous {method} response, unchanged"
    )


def decode_page_token(token: str, method: str) -> str:
    """The last key of the previous page, "" for the first page (no token)."""
    if not token:
        return ""
    try:
        # Strictly: the lenient decoder skips characters outside the alphabet.
        decoded = base64.b64decode(token, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise foreign_token(method) from None
    issued_by, separator, last = decoded.partition(":")
    if not separator or issued_by != method or encode_page_token(method, last) != token:
        raise foreign_token(method)
    return last


def decode_id_page_token(token: str, method: str) -> int:
    """The last id (a bigint) of the previous page, 0 for the first page."""
    last = decode_page_token(token, method)
    if not last:
        return 0
    if not is_bigint_id(last):
        raise foreign_token(method)
    return int(last)


def is_bigint_id(text: str) -> bool:
    """Whether `text` is an id the engine issues: ASCII digits that fit a bigint."""
    # str.isdigit alone takes other scripts' digits ('١٢٣'), which int() reads as numbers.
    return text.isascii() and text.isdigit() and len(text) <= 18
