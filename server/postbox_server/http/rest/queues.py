"""/v1/queues: create, list, read metrics, delete, purge, and the event subscriptions
that feed a queue."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.duration_pb2 import Duration
from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.http.rest import events
from postbox_server.http.rest.framework import (
    BadInput,
    Reply,
    RestCall,
    RestError,
    Route,
    json_type,
    path_param,
    quoted,
)
from postbox_server.http.rest.shapes import time_text
from postbox_server.queue_names import FIFO_SUFFIX

# Queues listed per ListQueues call.
LIST_PAGE = 1000
NAME = path_param("name", "Name of the queue.")
QUEUE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "fifo": {"type": "boolean"},
        "is_partitioned": {"type": "boolean", "const": False},
        "is_unlogged": {"type": "boolean", "const": False},
        "created_at": {"type": "string", "format": "date-time"},
    },
}

_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
_AGE: dict[str, Any] = {
    "type": ["integer", "null"],
    "minimum": 0,
    "description": "Seconds; null when the queue is empty.",
}
METRICS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "queue_name": {"type": "string"},
        "queue_length": {**_COUNT, "description": "Visible, in flight and delayed."},
        "visible_messages": _COUNT,
        "in_flight_messages": _COUNT,
        "delayed_messages": _COUNT,
        "oldest_msg_age_sec": _AGE,
        "newest_msg_age_sec": _AGE,
        "total_messages": {
            **_COUNT,
            "description": "Sent since the queue was made, as the servers counted them "
            "(a few seconds behind; sends made in SQL are not counted).",
        },
        "scrape_time": {"type": "string", "format": "date-time"},
    },
}


def _queue(queue: qpb.Queue) -> dict[str, Any]:
    return {
        "name": queue.name,
        "fifo": queue.fifo,
        "is_partitioned": False,
        "is_unlogged": False,
        "created_at": time_text(queue.create_time),
    }


async def create(call: RestCall) -> web.Response:
    body = await call.json_object()
    name = body.get("name")
    if not isinstance(name, str):
        raise BadInput(f"name is a JSON {json_type(name)}; the body needs the queue's name")
    fifo = body.get("fifo", name.endswith(FIFO_SUFFIX))
    if not isinstance(fifo, bool):
        raise BadInput(f"fifo is a JSON {json_type(fifo)}; it must be true or false")
    if fifo and not name.endswith(FIFO_SUFFIX):
        # beyond-queue's FIFO "orders" is the queue SQS calls "orders.fifo": postbox's
        # engine tells a FIFO queue by its name, so that is the queue made, and the REST
        # paths reach it as "orders" too (fifo_names).
        name += FIFO_SUFFIX
    elif not fifo and name.endswith(FIFO_SUFFIX):
        raise BadInput(
            f"fifo is false but the name {quoted(name)} ends in {FIFO_SUFFIX}: only a FIFO "
            f"queue's name ends in {FIFO_SUFFIX} (in the engine, as in SQS); leave out fifo "
            "or make it true"
        )
    request = qpb.CreateQueueRequest(queue=qpb.Queue(name=name))
    try:
        created = await call.call("QueueService/CreateQueue", request)
    except RestError as error:
        if error.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise
        taken = error
    else:
        return web.json_response(
            _queue(created.queue), status=201, headers={"Location": f"/v1/queues/{name}"}
        )
    # As beyond-queue's create: creating a queue that exists is no error (its name says
    # its kind). A key that may not read it hears that it exists, as CreateQueue said.
    try:
        existing = await call.call(
            "QueueService/GetQueue", qpb.GetQueueRequest(name=name, view=qpb.QUEUE_VIEW_BASIC)
        )
    except RestError:
        raise taken from None
    return web.json_response(_queue(existing.queue), status=200)


async def list_all(call: RestCall) -> web.Response:
    listed: list[dict[str, Any]] = []
    token = ""
    while True:
        page = await call.call(
            "QueueService/ListQueues", qpb.ListQueuesRequest(page_size=LIST_PAGE, page_token=token)
        )
        listed += [_queue(queue) for queue in page.queues]
        token = page.next_page_token
        if not token:
            return web.json_response(listed)


async def metrics(call: RestCall) -> web.Response:
    name = call.path("name")
    got = await call.call("QueueService/GetQueue", qpb.GetQueueRequest(name=name))
    stats = got.queue.stats
    length = stats.visible_messages + stats.in_flight_messages + stats.delayed_messages
    return web.json_response(
        {
            "queue_name": name,
            "queue_length": length,
            "visible_messages": stats.visible_messages,
            "in_flight_messages": stats.in_flight_messages,
            "delayed_messages": stats.delayed_messages,
            # As beyond-queue's: null for an empty queue.
            "oldest_msg_age_sec": _seconds(stats.oldest_message_age) if length else None,
            "newest_msg_age_sec": _seconds(stats.newest_message_age) if length else None,
            # Sent through a server since the queue was made: SQL sends are not counted.
            "total_messages": stats.sent_messages_total,
            "scrape_time": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
        }
    )


def _seconds(age: Duration) -> int:
    return int(age.ToTimedelta().total_seconds())


async def delete(call: RestCall) -> web.Response:
    await call.call("QueueService/DeleteQueue", qpb.DeleteQueueRequest(name=call.path("name")))
    return web.Response(status=204)


async def purge(call: RestCall) -> web.Response:
    purged = await call.call(
        "QueueService/PurgeQueue", qpb.PurgeQueueRequest(name=call.path("name"))
    )
    return web.json_response({"deleted": purged.purged_messages})


async def subscriptions(call: RestCall) -> web.Response:
    name = call.path("name")
    await call.call(
        "QueueService/GetQueue", qpb.GetQueueRequest(name=name, view=qpb.QUEUE_VIEW_BASIC)
    )
    found = await events.subscriptions_where(call, lambda s: s.queue == name)
    return web.json_response(found)


_ERROR_REPLIES = {404: Reply("No queue of that name.")}
ROUTES = (
    Route(
        "POST", "/v1/queues", "QueueService/CreateQueue", create,
        "Create a queue; one that exists answers 200. A FIFO queue's name ends in .fifo: "
        "with fifo true and a name without it, the queue made is <name>.fifo, which the "
        "/v1/queues/{name} paths also reach by <name> when no queue <name> exists.",
        body={
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "fifo": {"type": "boolean"}},
        },
        replies={201: Reply("Created.", QUEUE_SCHEMA), 200: Reply("It existed.", QUEUE_SCHEMA),
                 400: Reply("fifo is false for a name ending in .fifo, or the name is not valid.")},
    ),
    Route(
        "GET", "/v1/queues", "QueueService/ListQueues", list_all,
        "List every queue the key may read.",
        replies={200: Reply("The queues.", {"type": "array", "items": QUEUE_SCHEMA})},
    ),
    Route(
        "GET", "/v1/queues/{name}", "QueueService/GetQueue", metrics,
        "A queue's metrics.", params=(NAME,),
        replies={200: Reply("Counted now.", METRICS_SCHEMA), **_ERROR_REPLIES},
    ),
    Route(
        "DELETE", "/v1/queues/{name}", "QueueService/DeleteQueue", delete,
        "Delete a queue and its messages.", params=(NAME,),
        replies={204: Reply("Deleted."), **_ERROR_REPLIES},
    ),
    Route(
        "POST", "/v1/queues/{name}/purge", "QueueService/PurgeQueue", purge,
        "Delete every message of a queue.", params=(NAME,),
        replies={
            200: Reply("Purged.", {"type": "object",
                                   "properties": {"deleted": {"type": "integer"}}}),
            **_ERROR_REPLIES,
        },
    ),
    Route(
        "GET", "/v1/queues/{name}/subscriptions", "QueueService/GetQueue", subscriptions,
        "The event subscriptions that deliver into a queue.", params=(NAME,),
        replies={
            200: Reply("Subscriptions.", {"type": "array", "items": events.SUBSCRIPTION_SCHEMA}),
            **_ERROR_REPLIES,
        },
    ),
)  # fmt: skip
