"""Queue tags: TagQueue, UntagQueue, ListQueueTags (postbox's Queue.tags)."""

from __future__ import annotations

from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.sqs.actions.base import Call, Result, action
from postbox_server.sqs.actions.queues import get_queue, update_queue


async def _retag(call: Call, change: dict[str, str], remove: list[str]) -> None:
    name = call.queue()
    tags = dict((await get_queue(call, name)).tags)
    tags.update(change)
    for key in remove:
        tags.pop(key, None)
    # A read-modify-write: a concurrent retag of the same queue may be overwritten.
    await update_queue(call, qpb.Queue(name=name, tags=tags), ["tags"])


@action("TagQueue")
async def tag_queue(call: Call) -> Result:
    await _retag(call, call.required("Tags"), [])
    return {}


@action("UntagQueue")
async def untag_queue(call: Call) -> Result:
    await _retag(call, {}, call.required("TagKeys"))
    return {}


@action("ListQueueTags")
async def list_queue_tags(call: Call) -> Result:
    tags = dict((await get_queue(call, call.queue())).tags)
    return {"Tags": tags} if tags else {}
