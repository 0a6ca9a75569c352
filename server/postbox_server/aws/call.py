"""What every action of either service gets: its parameters, the request's place, the
settings and the backend; and the table that maps an action's name to its handler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from postbox_server.aws.backend import Backend
from postbox_server.aws.errors import invalid_parameter, missing_parameter
from postbox_server.aws.settings import ShimSettings
from postbox_server.errors import quoted

Result = dict[str, Any]
Handler = Callable[[Any], Awaitable[Result]]


class Actions(dict[str, Handler]):
    """A service's actions by name; its action modules fill it in with `@HANDLERS.action`."""

    def action(self, name: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self[name] = handler
            return handler

        return register


@dataclass
class Call:
    params: dict[str, Any]
    # URL path of the request: a query-protocol client may post to the queue URL.
    path: str
    # Scheme and host that URLs the shim hands out (queue URLs, SubscribeURLs) start with.
    base_url: str
    settings: ShimSettings
    # The server, its failures reported in the errors of the service called.
    backend: Backend

    def required(self, name: str) -> Any:
        value = self.params.get(name)
        if value is None or value == "":
            raise missing_parameter(name)
        return value

    def integer(self, name: str, low: int, high: int, default: int | None = None) -> int | None:
        return bounded(self.params, name, low, high, default)

    def page(self) -> dict[str, Any]:
        """MaxResults and NextToken as the page_size and page_token of a gRPC list call."""
        return {
            "page_size": self.integer("MaxResults", 1, 1000) or 1000,
            "page_token": self.params.get("NextToken", ""),
        }

    def paged(self, result: Result, next_page_token: str) -> Result:
        """A list result, with NextToken when the client asked for pages (SQS pages only then)."""
        if self.params.get("MaxResults") is not None and next_page_token:
            result["NextToken"] = next_page_token
        return result


def bounded(
    params: Mapping[str, Any], name: str, low: int, high: int, default: int | None = None
) -> int | None:
    """An integer parameter within the service's bounds, or `default` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not low <= value <= high:
        raise invalid_parameter(
            f"Value {quoted(str(value))} for parameter {name} is invalid. "
            f"Reason: Must be between {low} and {high}, if provided."
        )
    return value
