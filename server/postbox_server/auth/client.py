"""The client side of API keys: a channel that sends `authorization: Bearer <secret>`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc


class _WithMetadata(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = (*(details.metadata or ()), *self._metadata)
        # grpcio's call details are a namedtuple; the stubs type only the ABC.
        return details._replace(metadata=metadata)  # type: ignore[attr-defined]

    # The parameters carry the names of the interfaces' methods (callers may pass them by
    # keyword); `request` is one request or, for client streams, an iterator of them.
    def intercept_unary_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self,
        continuation: Callable[..., Any],
        client_call_details: grpc.ClientCallDetails,
        request_iterator: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


def bearer_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents a key's secret (none without a secret)."""
    return (("authorization", f"Bearer {secret}"),) if secret else ()


def with_api_key(channel: grpc.Channel, secret: str | None) -> grpc.Channel:
    """`channel`, presenting the key's secret on every call (unchanged without a secret)."""
    if not secret:
        return channel
    return grpc.intercept_channel(channel, _WithMetadata(bearer_metadata(secret)))
