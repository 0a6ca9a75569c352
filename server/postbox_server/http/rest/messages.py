"""/v1/queues/{name}/messages: send (one or a batch), receive, delete (one or a batch) and
change visibility.

A received message's `id` is a number standing for its delivery, (message id, receive
count) packed (see services/deliveries.py): what deletes it and changes its visibility,
as beyond-queue's numeric id does, on any server process, and, like the delivery's
`receipt` ("<message id>:<lease>", which these routes take too), what stops a consumer
whose lease ran out from deleting a message delivered to another since. `message_id` is
the message's number, as sends return it: the same packing with receive-count part 0,
never a delivery's. Deleting by it removes the message whoever holds it, as
beyond-queue's delete by msg_id does (`DELETE ... WHERE msg_id = $id`); changing its
visibility acts on the delivery that holds it.
"""

from __future__ import annotations

import re
import secrets
from typing import Any, TypeVar

import grpc
from aiohttp import web
from postbox.v1 import message_pb2
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import queue_service_pb2 as qpb

from postbox_server.http.connect import ConnectError
from postbox_server.http.rest.framework import (
    BadInput,
    Reply,
    RestCall,
    RestError,
    Route,
    json_type,
    path_param,
    query_param,
    quoted,
)
from postbox_server.http.rest.queues import NAME
from postbox_server.http.rest.shapes import (
    HEADERS_SCHEMA,
    MESSAGE_SCHEMA,
    RECEIVED_HEADERS_SCHEMA,
    attributes_of,
    body_of,
    duration,
    headers_of,
    message_fields,
    message_id,
    now_plus,
    time_text,
    whole_seconds,
)
from postbox_server.queue_names import FIFO_SUFFIX
from postbox_server.services import deliveries

# beyond-queue's receive defaults: one message, a 30 s lease, no wait.
DEFAULT_MAX, DEFAULT_VT, DEFAULT_WAIT = 1, 30, 0
RECEIPT = path_param(
    "id",
    "The `id` a receive returned (its delivery id) or the delivery's `receipt`; or the "
    "`id` a send returned (the message's, whoever holds it).",
)
# A message's id past 2^41 messages, as shapes.message_id writes it.
_MESSAGE_FORM = re.compile(r"([0-9]{1,19})#0")
# Rounds of "cancel, else delete with the delivery holding it" a delete by a message's id
# makes: each loses only to a receive or a lease running out between its two calls.
_TRIES = 3
# Most ids of a batch delete (DeleteBatch's limit).
BATCH_MOST = 1000
# The messages a send's body fills.
Sendable = TypeVar("Sendable", mpb.SendRequest, mpb.SendBatchEntry)
_SEND_FIELDS = ("message", "headers", "delay", "group_id", "deduplication_id")


def _fill(message: Sendable, value: Any, where: str) -> Sendable:
    """Sets a send's fields (a SendRequest's or a SendBatchEntry's: the same names) from
    one message of the body."""
    if not isinstance(value, dict):
        raise BadInput(f"{where} is a JSON {json_type(value)}; a message is an object")
    unknown = sorted(set(value) - set(_SEND_FIELDS))
    if unknown:
        raise BadInput(
            f"{where} has unknown field {unknown[0][:40]!r}; a message takes "
            f"{', '.join(_SEND_FIELDS)}"
        )
    if "message" not in value:
        raise BadInput(f"{where} has no message; put the payload in `message`")
    message.body = body_of(value["message"])
    for name, attribute in attributes_of(value.get("headers"), f"{where}.headers").items():
        message.attributes[name].CopyFrom(attribute)
    if value.get("delay") is not None:
        message.delay.CopyFrom(duration(whole_seconds(value["delay"], f"{where}.delay")))
    for field, target in (
        ("group_id", "message_group_id"),
        ("deduplication_id", "deduplication_id"),
    ):
        if value.get(field) is not None:
            if not isinstance(value[field], str):
                raise BadInput(f"{where}.{field} is a JSON {json_type(value[field])}; a string")
            setattr(message, target, value[field])
    return message


async def send(call: RestCall) -> web.Response:
    """One message (an object), or a batch (an array) in one transaction."""
    queue = call.path("name")
    body = await call.json()
    if isinstance(body, list):
        entries = [_fill(mpb.SendBatchEntry(), item, f"[{i}]") for i, item in enumerate(body)]
        await _undeduplicated(call, queue, entries)
        sent = await call.call(
            "MessageService/SendBatch", mpb.SendBatchRequest(queue=queue, entries=entries)
        )
        return web.json_response({"ids": [message_id(i) for i in sent.message_ids]}, status=201)
    # A lone message as Send: it may share a commit with concurrent ones (group commit).
    one = _fill(mpb.SendRequest(queue=queue), body, "the body")
    await _undeduplicated(call, queue, [one])
    sent_one = await call.call("MessageService/Send", one)
    return web.json_response({"id": message_id(sent_one.message_id)}, status=201)


async def _undeduplicated(
    call: RestCall, queue: str, sends: list[mpb.SendRequest] | list[mpb.SendBatchEntry]
) -> None:
    """As in beyond-queue, a FIFO send over REST needs no deduplication_id: one without
    it is not deduplicated (a fresh id of its own), unless the queue deduplicates by
    content, which then applies as on every door."""
    if not queue.endswith(FIFO_SUFFIX) or all(send.deduplication_id for send in sends):
        return
    found = await call.call(
        "QueueService/GetQueue", qpb.GetQueueRequest(name=queue, view=qpb.QUEUE_VIEW_BASIC)
    )
    if found.queue.content_based_deduplication:
        return
    for send in sends:
        if not send.deduplication_id:
            send.deduplication_id = secrets.token_hex(16)


def _received(message: Any) -> dict[str, Any]:
    number = deliveries.number(int(message.message_id), message.receive_count)
    return {
        # Past 2^41 messages no number fits below 2^53: the receipt stands for it then.
        "id": message.receipt if number is None else number,
        "receipt": message.receipt,
        "message_id": message_id(message.message_id),
        **message_fields(message.body),
        "headers": headers_of(message.attributes),
        "read_ct": message.receive_count,
        "enqueued_at": time_text(message.enqueue_time),
    }


async def receive(call: RestCall) -> web.Response:
    most = call.query_int("max", DEFAULT_MAX)
    if most < 1:  # 0 would mean ReceiveRequest's default, ten
        raise BadInput(f"query parameter max is {most}; it must be 1 to 1000")
    vt = call.query_int("vt", DEFAULT_VT)
    wait = call.query_int("wait", DEFAULT_WAIT)
    # The queue's kind decides its order; beyond-queue's flag is taken and checked only.
    call.query_bool("fifo")
    request = mpb.ReceiveRequest(
        queue=call.path("name"),
        max_messages=most,
        visibility_timeout=duration(vt),
        wait_time=duration(wait),
    )
    received = await call.call("MessageService/Receive", request)
    return web.json_response([_received(message) for message in received.messages])


def _receipt(given: str) -> str:
    """The receipt a path's id names: a delivery number's form, or the receipt given."""
    number = deliveries.parse_number(given)
    return given if number is None else deliveries.receipt_of(number)


def _message(given: str | int) -> int | None:
    """The message a send's id names (receive-count part 0), or None for a delivery's id
    or a receipt."""
    if isinstance(given, int):
        return deliveries.message_of(given) if given < deliveries.LIMIT else None
    number = deliveries.parse_number(given)
    if number is not None:
        return deliveries.message_of(number)
    form = _MESSAGE_FORM.fullmatch(given)
    return None if form is None else int(form[1])


async def _holding(call: RestCall, queue: str, message: int) -> tuple[str, int]:
    """The delivery form of the message's latest delivery, and the message's state."""
    got = await call.call(
        "MessageService/GetMessage", mpb.GetMessageRequest(queue=queue, message_id=str(message))
    )
    count = got.message.receive_count % deliveries.COUNTS
    return f"{message}#{count}", got.message.state


async def _delete_message(call: RestCall, queue: str, message: int) -> None:
    """As beyond-queue's delete by msg_id: the message goes, whoever holds it. One no
    consumer holds is cancelled (CancelMessage: no receive takes it meanwhile); one a
    consumer holds goes with the delivery that holds it, whose own id then answers 404,
    as beyond-queue's does once the row is gone."""
    for attempt in range(_TRIES):
        try:
            await call.call(
                "MessageService/CancelMessage",
                mpb.CancelMessageRequest(queue=queue, message_id=str(message)),
            )
            return
        except RestError as error:
            if error.code is not grpc.StatusCode.FAILED_PRECONDITION:
                raise
        receipt, _ = await _holding(call, queue, message)
        try:
            await call.call(
                "MessageService/Delete", mpb.DeleteRequest(queue=queue, receipt=receipt)
            )
            return
        except RestError as error:
            # Stale: delivered again, or (FIFO) its lease ran out, since the look.
            if error.code is not grpc.StatusCode.FAILED_PRECONDITION or attempt == _TRIES - 1:
                raise


def _is_id(value: Any) -> bool:
    return isinstance(value, str) or (
        isinstance(value, int) and not isinstance(value, bool) and value >= 0
    )


async def delete_batch(call: RestCall) -> web.Response:
    body = await call.json_object()
    ids = body.get("ids")
    if not isinstance(ids, list) or not all(_is_id(i) for i in ids):
        raise BadInput(
            "the body needs ids: an array of the `id`s receives or sends returned (numbers) "
            "or of receipts (strings)"
        )
    queue = call.path("name")
    messages = {i: m for i, m in enumerate(_message(given) for given in ids) if m is not None}
    if not 1 <= len(ids) <= BATCH_MOST:
        messages = {}  # DeleteBatch refuses the size before anything is deleted
    deleted: set[int] = set()
    for i, message in messages.items():
        try:
            await _delete_message(call, queue, message)
        except RestError as error:
            # Each fails on its own, as the deliveries' do; a refused key fails the call.
            if error.code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise
        else:
            deleted.add(i)
    # A number past 2^53 goes as its digits: a malformed receipt, which fails on its
    # own (not deleted) while the others are.
    named = [(i, given) for i, given in enumerate(ids) if i not in messages]
    receipts = [
        given
        if isinstance(given, str)
        else deliveries.receipt_of(given)
        if given < deliveries.LIMIT
        else str(given)
        for _, given in named
    ]
    if receipts or not messages:
        done = await call.call(
            "MessageService/DeleteBatch", mpb.DeleteBatchRequest(queue=queue, receipts=receipts)
        )
        deleted |= {
            i for (i, _), result in zip(named, done.results, strict=True) if not result.code
        }
    return web.json_response({"deleted": [given for i, given in enumerate(ids) if i in deleted]})


async def delete_one(call: RestCall) -> web.Response:
    queue, given = call.path("name"), call.path("id")
    message = _message(given)
    if message is not None:
        await _delete_message(call, queue, message)
        return web.Response(status=204)
    receipt = _receipt(given)
    await call.call("MessageService/Delete", mpb.DeleteRequest(queue=queue, receipt=receipt))
    return web.Response(status=204)


async def change_visibility(call: RestCall) -> web.Response:
    body = await call.json_object()
    if "vt" not in body:
        raise BadInput("the body needs vt: seconds until the message is visible again")
    vt = whole_seconds(body["vt"], "vt")
    queue, given = call.path("name"), call.path("id")
    message = _message(given)
    if message is None:
        receipt = _receipt(given)
    else:
        # A send's id: the delivery that holds the message now, if one does.
        receipt, state = await _holding(call, queue, message)
        if state != message_pb2.MESSAGE_STATE_IN_FLIGHT:
            raise RestError(
                ConnectError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"message {quoted(given)} is not in flight: by a send's id, vt changes "
                    "the lease of a message a consumer holds; hold a message back with a "
                    "send's delay",
                )
            )
    await call.call(
        "MessageService/ChangeVisibility",
        mpb.ChangeVisibilityRequest(queue=queue, receipt=receipt, visibility_timeout=duration(vt)),
    )
    number = deliveries.parse_number(given)
    return web.json_response(
        {"id": given if number is None else number, "visible_at": now_plus(vt)}
    )


_SEND_ONE: dict[str, Any] = {
    "type": "object",
    "required": ["message"],
    "properties": {
        "message": MESSAGE_SCHEMA,
        "headers": HEADERS_SCHEMA,
        "delay": {"type": "integer", "minimum": 0, "description": "Seconds."},
        "group_id": {"type": "string", "description": "Message group (FIFO queues)."},
        "deduplication_id": {"type": "string"},
    },
}
_RECEIVED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {
            "type": ["integer", "string"],
            "description": "The delivery id: deletes, changes visibility, on any server "
            "process (the receipt itself for message ids of 2^41 and above).",
        },
        "receipt": {"type": "string", "description": "The same, on any server process."},
        "message_id": {
            "type": ["integer", "string"],
            "description": "The message's id, as the send returned it: deletes the message "
            "whoever holds it.",
        },
        "message": MESSAGE_SCHEMA,
        "body_base64": {"type": "string", "description": "Only for a body that is no text."},
        "headers": RECEIVED_HEADERS_SCHEMA,
        "read_ct": {"type": "integer"},
        "enqueued_at": {"type": "string", "format": "date-time"},
    },
}
_NOT_FOUND = {404: Reply("No queue of that name, or the message is gone.")}
_ID = {"type": ["integer", "string"]}
_MESSAGES = "/v1/queues/{name}/messages"
ROUTES = (
    Route(
        "POST", _MESSAGES, "MessageService/Send", send,
        "Send a message, or a batch (an array) in one transaction.", params=(NAME,),
        body={"oneOf": [_SEND_ONE, {"type": "array", "items": _SEND_ONE}]},
        replies={
            201: Reply("Committed: the messages' ids, which delete them whoever holds them.",
                       {"type": "object", "properties": {
                           "id": _ID, "ids": {"type": "array", "items": _ID}}}),
            **_NOT_FOUND,
        },
    ),
    Route(
        "GET", _MESSAGES, "MessageService/Receive", receive,
        "Receive: claim up to max messages for vt seconds, waiting up to wait seconds.",
        params=(
            NAME,
            query_param("max", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 1},
                        "Most messages."),
            query_param("vt", {"type": "integer", "minimum": 0, "maximum": 43200, "default": 30},
                        "Visibility timeout, seconds."),
            query_param("wait", {"type": "integer", "minimum": 0, "maximum": 300, "default": 0},
                        "Long-poll wait, seconds."),
            query_param("fifo", {"type": "boolean"},
                        "Taken for beyond-queue's sake; the queue's kind decides."),
        ),
        replies={200: Reply("The claimed messages.", {"type": "array", "items": _RECEIVED}),
                 **_NOT_FOUND},
    ),
    Route(
        "DELETE", _MESSAGES, "MessageService/DeleteBatch", delete_batch,
        "Delete up to 1000 messages by receives' or sends' ids; each succeeds or fails on "
        "its own.",
        params=(NAME,),
        body={"type": "object", "required": ["ids"],
              "properties": {"ids": {"type": "array", "items": _ID}}},
        replies={200: Reply("The ids deleted.", {"type": "object", "properties": {
            "deleted": {"type": "array", "items": _ID}}}), **_NOT_FOUND},
    ),
    Route(
        "DELETE", _MESSAGES + "/{id}", "MessageService/Delete", delete_one,
        "Delete a received message, or by a send's id a message whoever holds it.",
        params=(NAME, RECEIPT),
        replies={204: Reply("Deleted."), **_NOT_FOUND,
                 400: Reply("Stale (delivered again since) or malformed id.")},
    ),
    Route(
        "PATCH", _MESSAGES + "/{id}", "MessageService/ChangeVisibility", change_visibility,
        "Make a received message visible again vt seconds from now (by a send's id: the "
        "message's current delivery).", params=(NAME, RECEIPT),
        body={"type": "object", "required": ["vt"],
              "properties": {"vt": {"type": "integer", "minimum": 0, "maximum": 43200}}},
        replies={200: Reply("Changed.", {"type": "object", "properties": {
            "id": _ID, "visible_at": {"type": "string", "format": "date-time"}}}),
            **_NOT_FOUND,
            400: Reply("Stale (delivered again since), malformed id, or by a send's id a "
                       "message no consumer holds.")},
    ),
)  # fmt: skip
