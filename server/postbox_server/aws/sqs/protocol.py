"""SQS's two protocols: awsJson 1.0 (the action in X-Amz-Target, JSON in and out) and the
query protocol (a form in, XML out). Both decode by the shapes of SQS's actions
(`shapes.ACTIONS`) and run the handlers of `actions`."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from postbox.v1.queue_service_pb2 import GetQueueRequest

from postbox_server.aws import jsonproto, query
from postbox_server.aws.errors import INVALID_ACTION, QUEUE_DOES_NOT_EXIST, AwsError
from postbox_server.aws.protocol import response
from postbox_server.aws.shapes import Structure
from postbox_server.aws.sqs import errors, shapes
from postbox_server.aws.sqs.actions import HANDLERS, Call
from postbox_server.errors import quoted

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"
TARGET_PREFIX = "AmazonSQS."
ERROR_NAMESPACE = "com.amazonaws.sqs#"


class _Sqs:
    handlers = HANDLERS
    call_type = Call
    status_errors = errors.STATUS_ERRORS
    action = ""

    def vouched(self, request: web.Request) -> bool:
        return False

    async def explain(self, call: Any, error: AwsError) -> AwsError:
        """QueueDoesNotExist when the queue the call names is missing, whatever else was
        wrong with it (a receipt handle, a parameter): SQS answers that first. Asked only
        once a call has failed, so successful calls pay nothing for it."""
        assert isinstance(call, Call)
        if error.kind is QUEUE_DOES_NOT_EXIST:
            return error
        if not call.params.get("QueueUrl") and not call.path.strip("/"):
            return error
        try:
            queue = call.queue()
            await call.backend.call(call.backend.queues.GetQueue, GetQueueRequest(name=queue))
        except AwsError as checked:
            return checked if checked.kind is QUEUE_DOES_NOT_EXIST else error
        return error


class SqsJson(_Sqs):
    """awsJson 1.0: the action in X-Amz-Target, parameters in a JSON body."""

    request_content_type: str | None = jsonproto.CONTENT_TYPE

    def __init__(self, target: str) -> None:
        self.target = target

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        self.action = jsonproto.action_of(self.target, TARGET_PREFIX)
        return jsonproto.decode(_input(self.action), body)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        return response(200, jsonproto.encode_result(result), jsonproto.CONTENT_TYPE, request_id)

    def failure(self, error: AwsError, request_id: str) -> web.Response:
        body, headers = jsonproto.encode_error(error, ERROR_NAMESPACE)
        return response(error.kind.status, body, jsonproto.CONTENT_TYPE, request_id, headers)


class SqsQuery(_Sqs):
    """The query protocol: Action and parameters in a form body (or the URL), XML back."""

    request_content_type: str | None = None

    def parse(self, request: web.Request, body: bytes) -> dict[str, Any]:
        form = query.parse_form(query.form_text(body) if body else request.query_string)
        self.action = query.action(form)
        return query.decode(_input(self.action), form)

    def success(self, result: dict[str, Any], request_id: str) -> web.Response:
        output = shapes.ACTIONS[self.action][1]
        body = query.encode_result(self.action, output, result, request_id, NAMESPACE)
        return response(200, body, query.CONTENT_TYPE, request_id)

    def failure(self, error: AwsError, request_id: str) -> web.Response:
        body = query.encode_error(error, request_id, NAMESPACE)
        return response(error.kind.status, body, query.CONTENT_TYPE, request_id)


def _input(action: str) -> Structure:
    if action not in shapes.ACTIONS:
        raise AwsError(
            INVALID_ACTION, f"The action {quoted(action)} is not valid for this endpoint."
        )
    return shapes.ACTIONS[action][0]
