"""Dead-letter queues: their sources, and moving their messages back (SQS move tasks)."""

from __future__ import annotations

import base64
import binascii
import json

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.aws.errors import QUEUE_DOES_NOT_EXIST, AwsError, invalid_parameter
from postbox_server.aws.sqs import naming
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.errors import RESOURCE_NOT_FOUND, UNSUPPORTED_OPERATION
from postbox_server.errors import quoted

# For move tasks SQS names a missing queue or task ResourceNotFoundException, and a
# task in the wrong state (one running already, or none to cancel) UnsupportedOperation.
_TASK_ERRORS = {
    grpc.StatusCode.NOT_FOUND: RESOURCE_NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION: UNSUPPORTED_OPERATION,
}
_STATUS = {
    qpb.RedriveTask.STATE_RUNNING: "RUNNING",
    qpb.RedriveTask.STATE_COMPLETED: "COMPLETED",
    qpb.RedriveTask.STATE_CANCELLED: "CANCELLED",
    qpb.RedriveTask.STATE_FAILED: "FAILED",
}


@action("ListDeadLetterSourceQueues")
async def list_dead_letter_source_queues(call: Call) -> Result:
    response = await call.backend.call(
        call.backend.queues.ListDeadLetterSourceQueues,
        qpb.ListDeadLetterSourceQueuesRequest(dead_letter_queue=call.queue(), **call.page()),
    )
    result = {"queueUrls": [call.queue_url(name) for name in response.queue_names]}
    return call.paged(result, response.next_page_token)


def _queue_of(call: Call, parameter: str) -> str:
    try:
        return naming.queue_from_arn(call.required(parameter), call.settings, parameter)
    except AwsError as error:
        if error.kind is QUEUE_DOES_NOT_EXIST:
            raise AwsError(RESOURCE_NOT_FOUND, error.message) from None
        raise


def _handle(task: qpb.RedriveTask, source_arn: str) -> str:
    document = json.dumps({"taskId": task.task_id, "sourceArn": source_arn})
    return base64.urlsafe_b64encode(document.encode()).decode("ascii")


def _task_id(handle: str) -> str:
    try:
        task_id = json.loads(base64.urlsafe_b64decode(handle.encode("ascii")))["taskId"]
    except (binascii.Error, UnicodeError, ValueError, KeyError, TypeError):
        raise AwsError(
            RESOURCE_NOT_FOUND, f"Task handle {quoted(handle)} does not exist."
        ) from None
    if not isinstance(task_id, str):
        raise AwsError(RESOURCE_NOT_FOUND, f"Task handle {quoted(handle)} does not exist.")
    return task_id


def _millis(timestamp: Timestamp) -> int:
    return timestamp.seconds * 1000 + timestamp.nanos // 1_000_000


@action("StartMessageMoveTask")
async def start_message_move_task(call: Call) -> Result:
    source = _queue_of(call, "SourceArn")
    destination = _queue_of(call, "DestinationArn") if call.params.get("DestinationArn") else ""
    rate = call.integer("MaxNumberOfMessagesPerSecond", 1, 500)
    sources = await call.backend.call(
        call.backend.queues.ListDeadLetterSourceQueues,
        qpb.ListDeadLetterSourceQueuesRequest(dead_letter_queue=source, page_size=1),
        _TASK_ERRORS,
    )
    # A page holds only the sources the caller may read: an empty one with a token is not
    # the end.
    if not sources.queue_names and not sources.next_page_token:
        raise invalid_parameter("Source queue must be configured as a Dead Letter Queue.")
    response = await call.backend.call(
        call.backend.queues.RedriveMessages,
        qpb.RedriveMessagesRequest(
            dead_letter_queue=source, destination=destination, max_messages_per_second=rate
        ),
        _TASK_ERRORS,
    )
    return {"TaskHandle": _handle(response.task, call.params["SourceArn"])}


@action("ListMessageMoveTasks")
async def list_message_move_tasks(call: Call) -> Result:
    source = _queue_of(call, "SourceArn")
    response = await call.backend.call(
        call.backend.queues.ListRedriveTasks,
        qpb.ListRedriveTasksRequest(
            dead_letter_queue=source, page_size=call.integer("MaxResults", 1, 10, default=1)
        ),
        _TASK_ERRORS,
    )
    if not response.tasks:
        # The engine lists no tasks for a queue that does not exist either.
        await call.backend.call(
            call.backend.queues.GetQueue,
            qpb.GetQueueRequest(name=source, view=qpb.QUEUE_VIEW_BASIC),
            _TASK_ERRORS,
        )
    source_arn = naming.queue_arn(call.settings, source)
    results = []
    for task in response.tasks:
        entry: Result = {
            "Status": _STATUS[task.state],
            "SourceArn": source_arn,
            "ApproximateNumberOfMessagesMoved": task.moved_messages,
            "ApproximateNumberOfMessagesToMove": task.messages_to_move,
            "StartedTimestamp": _millis(task.create_time),
        }
        if task.state == qpb.RedriveTask.STATE_RUNNING:
            entry["TaskHandle"] = _handle(task, source_arn)
        if task.destination:
            entry["DestinationArn"] = naming.queue_arn(call.settings, task.destination)
        if task.HasField("max_messages_per_second"):
            entry["MaxNumberOfMessagesPerSecond"] = int(task.max_messages_per_second)
        if task.failure_reason:
            entry["FailureReason"] = task.failure_reason
        results.append(entry)
    return {"Results": results}


@action("CancelMessageMoveTask")
async def cancel_message_move_task(call: Call) -> Result:
    response = await call.backend.call(
        call.backend.queues.CancelRedriveTask,
        qpb.CancelRedriveTaskRequest(task_id=_task_id(call.required("TaskHandle"))),
        _TASK_ERRORS,
    )
    return {"ApproximateNumberOfMessagesMoved": response.task.moved_messages}
