"""Queue tags: TagQueue, UntagQueue, ListQueueTags (postbox's Queue.tags)."""

from __future__ import annotations

from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.aws.errors import invalid_parameter, missing_parameter
from postbox_server.aws.sqs.actions.base import Call, Result, action
from postbox_server.aws.sqs.actions.queues import get_queue, update_queue

# SQS's limit on a queue's tags.
MAX_TAGS = 50


async def _retag(call: Call, change: dict[str, str], remove: list[str]) -> None:
    name = call.queue()
    tags = dict((await get_queue(call, name)).tags)
    tags.update(change)
    for key in remove:
        tags.pop(key, None)
    if len(tags) > MAX_TAGS:
        raise invalid_parameter(f"Too many tags added for queue {name}.")
    # A read-modify-write: a concurrent retag of the same queue may be overwritten.
    await update_queue(call, qpb.Queue(name=name, tags=tags), ["tags"])


@action("TagQueue")
async def tag_queue(call: Call) -> Result:
    tags = call.params.get("Tags")
    if not tags:  # absent or empty, SQS says the same
        raise missing_parameter("Tags")
    await _retag(call, tags, [])
    return {}


@action("UntagQueue")
async def untag_queue(call: Call) -> Result:
    keys = call.params.get("TagKeys")
    if not keys or not all(1 <= len(key) <= 128 for key in keys):
        raise invalid_parameter("Tag keys must be between 1 and 128 characters in length.")
    await _retag(call, {}, keys)
    return {}


@action("ListQueueTags")
async def list_queue_tags(call: Call) -> Result:
    tags = dict((await get_queue(call, call.queue())).tags)
    return {"Tags": tags} if tags else {}
