"""SNS's two protocols: the query protocol, read and answered by botocore's model of SNS
(`modelquery`), and the JSON protocol (awsJson 1.0, the action in `X-Amz-Target:
AmazonSNS.<Action>`, as beyond-queue and AWS's newer SDKs speak it), whose parameters are
checked against the same model's shapes. And how the shim tells an SNS query request
from an SQS one (they share a port)."""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web
from botocore import model as botocore_model
from botocore.model import OperationModel, ServiceModel
from botocore.session import get_session

from postbox_server.aws import jsonproto, modelquery, query
from postbox_server.aws import shapes as wire
from postbox_server.aws.call import Call
from postbox_server.aws.errors import AwsError
from postbox_server.aws.protocol import response
from postbox_server.aws.sigv4 import credential_service
from postbox_server.aws.sns.actions import HANDLERS
from postbox_server.aws.sns.errors import INVALID_ACTION, STATUS_ERRORS, InvalidParameter

NAMESPACE = "http://sns.amazonaws.com/doc/2010-03-31/"
TARGET_PREFIX = "AmazonSNS."
ERROR_NAMESPACE = "com.amazonaws.sns#"
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


_SCALARS = {
    "string": wire.STRING, "integer": wire.INTEGER, "long": wire.LONG,
    "boolean": wire.BOOLEAN, "blob": wire.BLOB,
}  # fmt: skip


def _wire_shape(shape: botocore_model.Shape) -> wire.Shape:
    """A model shape as the JSON codec (`jsonproto`) checks it."""
    if isinstance(shape, botocore_model.StructureShape):
        return wire.Structure(
            tuple(wire.Member(name, _wire_shape(member)) for name, member in shape.members.items())
        )
    if isinstance(shape, botocore_model.ListShape):
        return wire.ListOf(_wire_shape(shape.member))
    if isinstance(shape, botocore_model.MapShape):
        return wire.MapOf(_wire_shape(shape.value))
    return _SCALARS.get(shape.type_name, wire.STRING)


@functools.cache
def _input_shape(action: str) -> wire.Structure:
    op = operation(action)
    assert op is not None
    if op.input_shape is None:
        return wire.Structure(())
    structure = _wire_shape(op.input_shape)
    assert isinstance(structure, wire.Structure)
    return structure


class SnsJson(SnsQuery):
    """The JSON protocol: the action in X-Amz-Target, parameters in a JSON body, JSON back
    (the result members by the model's names; errors as SQS's JSON protocol sends them)."""

    request_content_type: str | None = jsonproto.CONTENT_TYPE

    def __init__(self, target: str) -> None:
        self.target = target

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        self.action = jsonproto.action_of(self.target, TARGET_PREFIX)
        if operation(self.action) is None or self.action not in HANDLERS:
            raise AwsError(
                INVALID_ACTION, f"The action {self.action[:80]} is not valid for this endpoint."
            )
        return jsonproto.decode(_input_shape(self.action), body)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        return response(200, jsonproto.encode_result(result), jsonproto.CONTENT_TYPE, request_id)

    def failure(self, error: AwsError, request_id: str) -> web.Response:
        body, headers = jsonproto.encode_error(error, ERROR_NAMESPACE)
        return response(error.kind.status, body, jsonproto.CONTENT_TYPE, request_id, headers)

    def vouched(self, request: web.Request) -> bool:
        return False


def is_sns_json(target: str | None) -> bool:
    """Whether an X-Amz-Target names an SNS action (the JSON protocol)."""
    return target is not None and target.startswith(TARGET_PREFIX)
