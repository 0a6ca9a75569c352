"""Queue actions: create, look up, list, delete, purge, and queue attributes (a queue's
permissions: `permissions`; its tags: `tags`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.aws.errors import (
    INVALID_PARAMETER_VALUE,
    AwsError,
    invalid_parameter,
    missing_parameter,
    of_another_account,
    queue_does_not_exist,
)
from postbox_server.aws.sqs import naming, queue_attributes
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.errors import PURGE_QUEUE_IN_PROGRESS, QUEUE_NAME_EXISTS


async def get_queue(call: Call, name: str, *, stats: bool = False) -> qpb.Queue:
    """The queue's attributes; its message counts only when asked, as they cost a count."""
    view = qpb.QUEUE_VIEW_FULL if stats else qpb.QUEUE_VIEW_BASIC
    request = qpb.GetQueueRequest(name=name, view=view)
    response = await call.backend.call(call.backend.queues.GetQueue, request)
    return response.queue


@action("CreateQueue")
async def create_queue(call: Call) -> Result:
    name = naming.new_queue_name(call.required("QueueName"))
    attributes = queue_attributes.named(call.params.get("Attributes", {}))
    wants_fifo = attributes.get("FifoQueue", "").lower() == "true"
    # SQS's own answers (codes and texts) when a name and FifoQueue disagree, and a hint.
    if queue_attributes.is_fifo(name) and not wants_fifo:
        raise invalid_parameter(
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in "
            "length (a name ending in .fifo needs the attribute FifoQueue=true)"
        )
    if wants_fifo and not queue_attributes.is_fifo(name):
        raise invalid_parameter(
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
            "underscores, must end with .fifo suffix and be 1 to 80 in length."
        )
    queue, _ = queue_attributes.to_queue(name, attributes, call.settings)
    queue.tags.update(call.params.get("tags", {}))
    try:
        # The queue is new, so a queue not found is the RedrivePolicy's target: SQS
        # calls that an invalid parameter.
        await call.backend.call(
            call.backend.queues.CreateQueue,
            qpb.CreateQueueRequest(queue=queue),
            {grpc.StatusCode.NOT_FOUND: INVALID_PARAMETER_VALUE},
        )
    except AwsError as error:
        if error.kind is not QUEUE_NAME_EXISTS:
            raise
        # SQS makes CreateQueue idempotent: the same name with the same attributes
        # answers the existing queue's URL.
        existing = await get_queue(call, name)
        differing = queue_attributes.conflicting(attributes, existing, call.settings)
        if differing is not None:
            raise AwsError(
                QUEUE_NAME_EXISTS,
                f"A queue already exists with the same name and a different value for "
                f"attribute {differing}",
            ) from None
    return {"QueueUrl": call.queue_url(name)}


@action("GetQueueUrl")
async def get_queue_url(call: Call) -> Result:
    name = naming.existing_queue_name(call.required("QueueName"))
    owner = call.params.get("QueueOwnerAWSAccountId")
    if owner is not None and owner != call.settings.account_id:
        raise of_another_account(queue_does_not_exist())
    await get_queue(call, name)
    return {"QueueUrl": call.queue_url(name)}


@action("ListQueues")
async def list_queues(call: Call) -> Result:
    response = await call.backend.call(
        call.backend.queues.ListQueues,
        qpb.ListQueuesRequest(name_prefix=call.params.get("QueueNamePrefix", ""), **call.page()),
    )
    result: Result = {}
    if response.queues:
        result["QueueUrls"] = [call.queue_url(queue.name) for queue in response.queues]
    return call.paged(result, response.next_page_token)


@action("DeleteQueue")
async def delete_queue(call: Call) -> Result:
    await call.backend.call(
        call.backend.queues.DeleteQueue, qpb.DeleteQueueRequest(name=call.queue())
    )
    return {}


# SQS refuses a purge within this long of the queue's previous one.
PURGE_INTERVAL = timedelta(seconds=60)


@action("PurgeQueue")
async def purge_queue(call: Call) -> Result:
    queue = call.queue()
    described = await call.backend.call(
        call.backend.queues.GetQueue, qpb.GetQueueRequest(name=queue)
    )
    if described.queue.HasField("purge_time"):
        since = datetime.now(timezone.utc) - described.queue.purge_time.ToDatetime(timezone.utc)
        if since < PURGE_INTERVAL:
            raise AwsError(
                PURGE_QUEUE_IN_PROGRESS,
                f"Only one PurgeQueue operation on {queue} is allowed every 60 seconds.",
            )
    await call.backend.call(call.backend.queues.PurgeQueue, qpb.PurgeQueueRequest(name=queue))
    return {}


@action("GetQueueAttributes")
async def get_queue_attributes(call: Call) -> Result:
    queue = call.queue()
    names = call.params.get("AttributeNames", [])
    described = queue_attributes.describe(
        await get_queue(call, queue, stats=True), names, call.settings
    )
    return {"Attributes": described} if described else {}


@action("SetQueueAttributes")
async def set_queue_attributes(call: Call) -> Result:
    name = call.queue()
    attributes = queue_attributes.named(call.params.get("Attributes") or {})
    if not attributes:
        raise missing_parameter("Attribute.1.Name")
    queue, paths = queue_attributes.to_queue(name, attributes, call.settings)
    if not paths:  # only attributes postbox fixes (FifoQueue, ...), confirmed as they are
        await get_queue(call, name)
        return {}
    await update_queue(call, queue, paths)
    return {}


async def update_queue(call: Call, queue: qpb.Queue, paths: list[str]) -> None:
    request = qpb.UpdateQueueRequest(queue=queue, update_mask=FieldMask(paths=paths))
    if "dead_letter_policy" not in paths:
        await call.backend.call(call.backend.queues.UpdateQueue, request)
        return
    try:
        await call.backend.call(
            call.backend.queues.UpdateQueue,
            request,
            {grpc.StatusCode.NOT_FOUND: INVALID_PARAMETER_VALUE},
        )
    except AwsError as error:
        # Not found is the queue itself (QueueDoesNotExist, as SQS says) or the
        # RedrivePolicy's target (an invalid parameter): ask which.
        if error.kind is INVALID_PARAMETER_VALUE:
            await get_queue(call, queue.name)
        raise
