"""SNS's query protocol: how the shim tells an SNS request from an SQS one (they share a
port), and reads and answers it by botocore's model of SNS (`modelquery`)."""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web
from botocore.model import OperationModel, ServiceModel
from botocore.session import get_session

from postbox_server.aws import modelquery, query
from postbox_server.aws.call import Call
from postbox_server.aws.errors import AwsError
from postbox_server.aws.protocol import response
from postbox_server.aws.sigv4 import credential_service
from postbox_server.aws.sns.actions import HANDLERS
from postbox_server.aws.sns.errors import INVALID_ACTION, STATUS_ERRORS, InvalidParameter

NAMESPACE = "http://sns.amazonaws.com/doc/2010-03-31/"
VERSION = "2010-03-31"
# Actions only SNS has: a SubscribeURL visit carries no Version and no signature.
_SNS_ONLY = {"ConfirmSubscription", "Unsubscribe"}


@functools.cache
def model() -> ServiceModel:
    return get_session().get_service_model("sns")


def operation(action: str) -> OperationModel | None:
    return model().operation_model(action) if action in model().operation_names else None


def is_sns(request: web.Request, body: bytes) -> bool:
    """Whether a query-protocol request is for SNS: signed for service sns, or naming
    SNS's API version (as boto3 and the AWS CLI always do), or an action only SNS has."""
    service = credential_service(request.headers.get("Authorization", ""))
    if service is not None:
        return service == "sns"
    try:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
    except AwsError:
        return False
    return form.get("Version") == VERSION or form.get("Action") in _SNS_ONLY


class SnsQuery:
    """SNS's query protocol: Action and parameters in a form body (or the URL), XML back."""

    handlers = HANDLERS
    call_type = Call
    status_errors = STATUS_ERRORS
    request_content_type: str | None = None
    action = ""

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
        self.action = query.action(form)
        op = operation(self.action)
        if op is None or self.action not in HANDLERS:
            raise AwsError(
                INVALID_ACTION, f"The action {self.action[:80]} is not valid for this endpoint."
            )
        return modelquery.decode(op, form, InvalidParameter)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        op = operation(self.action)
        assert op is not None
        body = modelquery.encode_result(op, result, request_id, NAMESPACE)
        return response(200, body, query.CONTENT_TYPE, request_id)

    def failure(self, error: AwsError, request_id: str) -> web.Response:
        body = query.encode_error(error, request_id, NAMESPACE, detail=False)
        return response(error.kind.status, body, query.CONTENT_TYPE, request_id)

    def vouched(self, request: web.Request) -> bool:
        """An unsigned GET of ConfirmSubscription: an endpoint following its SubscribeURL,
        whose token is its authority."""
        return (
            request.method == "GET"
            and "Authorization" not in request.headers
            and request.query.get("Action") == "ConfirmSubscription"
        )

    async def explain(self, call: Call, error: AwsError) -> AwsError:
        return error
