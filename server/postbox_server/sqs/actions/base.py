"""What every action gets: its parameters, the request's place, settings and the backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from postbox_server.errors import quoted
from postbox_server.sqs import naming
from postbox_server.sqs.backend import Backend
from postbox_server.sqs.errors import invalid_parameter, missing_parameter
from postbox_server.sqs.settings import ShimSettings

Result = dict[str, Any]
Handler = Callable[["Call"], Awaitable[Result]]

# Action name -> handler; filled in by the action modules.
HANDLERS: dict[str, Handler] = {}


def action(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        HANDLERS[name] = handler
        return handler

    return register


@dataclass
class Call:
    params: dict[str, Any]
    # URL path of the request: a query-protocol client may post to the queue URL.
    path: str
    # Scheme and host queue URLs start with.
    base_url: str
    settings: ShimSettings
    backend: Backend

    def required(self, name: str) -> Any:
        value = self.params.get(name)
        if value is None or value == "":
            raise missing_parameter(name)
        return value

    def queue(self) -> str:
        """The queue the request names: QueueUrl, or the URL it was posted to."""
        url = self.params.get("QueueUrl")
        if url:
            return naming.queue_from_url(url, self.settings)
        if self.path.strip("/"):
            return naming.queue_from_path(self.path, self.settings)
        raise missing_parameter("QueueUrl")

    def queue_url(self, name: str) -> str:
        return naming.queue_url(self.settings.public_url or self.base_url, self.settings, name)

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
    """An integer parameter within SQS's bounds, or `default` when absent."""
    value = params.get(name)
    if value is None:
        return default
    if not low <= value <= high:
        raise invalid_parameter(
            f"Value {quoted(str(value))} for parameter {name} is invalid. "
            f"Reason: Must be between {low} and {high}, if provided."
        )
    return value
