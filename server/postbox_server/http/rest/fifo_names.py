"""beyond-queue's FIFO names on the REST door.

postbox names a FIFO queue as SQS does, on every door: `orders.fifo`. beyond-queue strips
the suffix, so its REST scripts create `{"name": "orders", "fifo": true}` and then use
`/v1/queues/orders/...`. On the REST door a queue path may therefore leave `.fifo` off:
it names the queue `orders` when that exists, and `orders.fifo` only when it does not
and `orders.fifo` does. Where both exist, the plain name is the standard queue.
"""

from __future__ import annotations

import dataclasses

import grpc
from aiohttp import web
from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.http.rest.framework import RestCall, RestError, Route
from postbox_server.queue_names import FIFO_SUFFIX

# The routes whose {name} is a queue's.
QUEUE_PATH = "/v1/queues/{name}"


def taking_fifo_names(route: Route) -> Route:
    """The route, answering for `<name>.fifo` where its queue path names none."""
    if not route.path.startswith(QUEUE_PATH):
        return route
    handler = route.handler

    async def answer(call: RestCall) -> web.StreamResponse:
        # The route's answer for the queue its path names; when that queue does not
        # exist, its answer for `<name>.fifo` if that one does. The first attempt changed
        # nothing (its queue is missing), so taking the route again is safe.
        try:
            return await handler(call)
        except RestError as error:
            name = call.path("name")
            if error.code is not grpc.StatusCode.NOT_FOUND or name.endswith(FIFO_SUFFIX):
                raise
            # NOT_FOUND may be a message's (DELETE .../messages/{id}): only a missing
            # queue sends the route to the FIFO one. Each look answers to the caller's key.
            fifo = name + FIFO_SUFFIX
            if await _exists(call, name) is not False or not await _exists(call, fifo):
                raise
        return await handler(call.renamed("name", fifo))

    return dataclasses.replace(route, handler=answer)


async def _exists(call: RestCall, name: str) -> bool | None:
    """Whether the caller's queue of that name exists; None when the caller may not tell."""
    try:
        await call.call(
            "QueueService/GetQueue", qpb.GetQueueRequest(name=name, view=qpb.QUEUE_VIEW_BASIC)
        )
    except RestError as error:
        return False if error.code is grpc.StatusCode.NOT_FOUND else None
    return True
