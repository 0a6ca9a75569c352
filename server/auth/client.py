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
        return details._replace(metadata=(*(details.metadata or ()), *self._metadata))  # type: ignore[attr-defined]

    def _intercept(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    intercept_unary_unary = _intercept
    intercept_unary_stream = _intercept
    intercept_stream_unary = _intercept
    intercept_stream_stream = _intercept


def bearer_metadata(secret: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents a key's secret (none without a secret)."""
    return (("authorization", f"Bearer {secret}"),) if secret else ()


def with_api_key(channel: grpc.Channel, secret: str | None) -> grpc.Channel:
    """`channel`, presenting the key's secret on every call (unchanged without a secret)."""
    if not secret:
        return channel
    return grpc.intercept_channel(channel, _WithMetadata(bearer_metadata(secret)))
