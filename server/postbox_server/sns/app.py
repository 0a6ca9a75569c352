"""How the shim tells an SNS request from an SQS one, and answers it."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from postbox_server.sns import protocol
from postbox_server.sns.actions import HANDLERS
from postbox_server.sns.errors import INVALID_ACTION, InvalidParameter
from postbox_server.sqs import query
from postbox_server.sqs.errors import MISSING_ACTION, SqsError
from postbox_server.sqs.sigv4 import credential_service

# Actions only SNS has: a SubscribeURL visit carries no Version and no signature.
_SNS_ONLY = {"ConfirmSubscription", "Unsubscribe"}


def is_sns(request: web.Request, body: bytes) -> bool:
    """Whether a query-protocol request is for SNS: signed for service sns, or naming
    SNS's API version (as boto3 and the AWS CLI always do), or an action only SNS has."""
    service = credential_service(request.headers.get("Authorization", ""))
    if service is not None:
        return service == "sns"
    try:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
    except SqsError:
        return False
    return form.get("Version") == protocol.VERSION or form.get("Action") in _SNS_ONLY


class SnsQuery:
    """SNS's query protocol: Action and parameters in a form body (or the URL), XML back."""

    handlers = HANDLERS
    action = ""

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
        self.action = form.get("Action", "")
        if not self.action:
            raise SqsError(MISSING_ACTION, "The request must contain the parameter Action.")
        op = protocol.operation(self.action)
        if op is None or self.action not in HANDLERS:
            raise SqsError(
                INVALID_ACTION, f"The action {self.action[:80]} is not valid for this endpoint."
            )
        return protocol.decode(op, form, InvalidParameter)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        op = protocol.operation(self.action)
        assert op is not None
        return _response(200, protocol.encode_result(op, result, request_id), request_id)

    def failure(self, error: SqsError, request_id: str) -> web.Response:
        return _response(error.kind.status, protocol.encode_error(error, request_id), request_id)


def _response(status: int, body: bytes, request_id: str) -> web.Response:
    response = web.Response(status=status, body=body)
    response.content_type = protocol.CONTENT_TYPE
    response.headers["x-amzn-RequestId"] = request_id
    return response
