"""What the shim's HTTP handler (`app`) asks of a service's protocol: to read a request
into an action's parameters, to run it with the service's actions, and to write its
result or error back. SQS has two (aws/sqs/protocol.py), SNS one (aws/sns/protocol.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import grpc
from aiohttp import web

from postbox_server.aws.call import Call, Handler
from postbox_server.aws.errors import AwsError, ErrorKind


class ServiceProtocol(Protocol):
    # The action the request names, once `parse` has read it ("" before).
    action: str

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """The service's actions by name."""
        ...

    @property
    def call_type(self) -> type[Call]:
        """The Call the service's handlers take."""
        ...

    @property
    def status_errors(self) -> Mapping[grpc.StatusCode, ErrorKind]:
        """gRPC status -> the service's error (aws/backend.py holds the shared ones)."""
        ...

    @property
    def request_content_type(self) -> str | None:
        """The Content-Type a request must have; None: a form, or parameters in the URL."""
        ...

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]: ...

    def success(self, result: dict[str, Any], request_id: str) -> web.Response: ...

    def failure(self, error: AwsError, request_id: str) -> web.Response: ...

    def vouched(self, request: web.Request) -> bool:
        """Whether the request is its own authority (the shim's key then makes its calls)."""
        ...

    async def explain(self, call: Call, error: AwsError) -> AwsError:
        """The error a failed call reports, as the service would (SQS: a missing queue first)."""
        ...


def response(
    status: int,
    body: bytes,
    content_type: str,
    request_id: str,
    headers: dict[str, str] | None = None,
) -> web.Response:
    response = web.Response(status=status, body=body, headers=headers)
    response.content_type = content_type
    response.headers["x-amzn-RequestId"] = request_id
    return response
