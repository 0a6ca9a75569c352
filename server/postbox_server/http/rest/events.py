"""/v1/events: beyond-queue's event bus, which is one postbox topic, `events`.

Publishing to /v1/events/{routing_key} publishes to that topic with the routing key;
/v1/events/{pattern}/subscriptions are its subscriptions with that routing-key pattern
(the same `*` and `#` wildcards), each delivering into a queue or to an HTTP(S) endpoint.
An endpoint gets the raw message (beyond-queue's default for this API) or, with
"envelope": true, SNS's notification envelope. The topic is created by the first
subscription; gRPC, Connect and SNS clients see it as any other topic.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web
from postbox.v1 import topic_service_pb2 as tpb

from postbox_server.http.connect import ConnectError
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
from postbox_server.http.rest.shapes import (
    HEADERS_SCHEMA,
    MESSAGE_SCHEMA,
    attributes_of,
    body_of,
    duration,
    message_id,
    time_text,
    whole_seconds,
)

EVENTS_TOPIC = "events"
# beyond-queue's ARNs: region and account fixed, never checked.
_ARN = "arn:aws:sns:us-east-1:000000000000"
LIST_PAGE = 1000
PATTERN = path_param("pattern", "Routing-key pattern: dot-separated words, `*` and `#`.")
SUBSCRIPTION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "pattern": {"type": "string"},
        "protocol": {"type": "string", "enum": ["sqs", "http", "https"]},
        "queue_name": {"type": ["string", "null"]},
        "endpoint": {"type": ["string", "null"]},
        "envelope": {"type": "boolean"},
        "created_at": {"type": "string", "format": "date-time"},
    },
}


def _subscription(subscription: tpb.Subscription) -> dict[str, Any]:
    webhook = subscription.WhichOneof("destination") == "webhook"
    url = subscription.webhook.url if webhook else None
    return {
        "id": subscription.name,
        "pattern": subscription.pattern,
        "protocol": url.split(":", 1)[0] if url else "sqs",
        "queue_name": None if webhook else subscription.queue,
        "endpoint": url,
        "envelope": webhook and not subscription.sns_delivery.raw,
        "created_at": time_text(subscription.create_time),
    }


async def subscriptions_where(
    call: RestCall, keep: Callable[[tpb.Subscription], bool]
) -> list[dict[str, Any]]:
    """The event subscriptions `keep` selects; none while the topic does not exist."""
    found: list[dict[str, Any]] = []
    token = ""
    while True:
        request = tpb.ListSubscriptionsRequest(
            topic=EVENTS_TOPIC, page_size=LIST_PAGE, page_token=token
        )
        try:
            page = await call.call("TopicService/ListSubscriptions", request)
        except RestError as error:
            if error.code is grpc.StatusCode.NOT_FOUND:
                return found
            raise
        found += [_subscription(s) for s in page.subscriptions if keep(s)]
        token = page.next_page_token
        if not token:
            return found


async def publish(call: RestCall) -> web.Response:
    body = await call.json_object()
    if "message" not in body:
        raise BadInput("the body has no message; put the payload in `message`")
    request = tpb.PublishRequest(
        topic=EVENTS_TOPIC,
        routing_key=call.path("routing_key"),
        body=body_of(body["message"]),
        attributes=attributes_of(body.get("headers")),
    )
    if body.get("delay") is not None:
        request.delay.CopyFrom(duration(whole_seconds(body["delay"], "delay")))
    try:
        published = await call.call("TopicService/Publish", request)
    except RestError as error:
        if error.code is not grpc.StatusCode.NOT_FOUND:
            raise
        # No subscription was ever made, so none matches.
        return web.json_response({"queues_matched": 0, "messages": []}, status=201)
    messages = [
        {"queue": queue, "id": message_id(i)}
        for queue, i in zip(published.queues, published.message_ids, strict=True)
    ]
    return web.json_response(
        {
            "queues_matched": len(messages),
            "messages": messages,
            "webhook_deliveries": published.webhook_deliveries,
        },
        status=201,
    )


def _destination(body: dict[str, Any], name: str, subscription: tpb.Subscription) -> None:
    protocol = body.get("protocol", "sqs")
    if protocol == "sqs":
        queue = body.get("queue_name")
        if not isinstance(queue, str):
            raise BadInput(
                f"queue_name is a JSON {json_type(queue)}; a queue subscription names its queue "
                '(or give "protocol": "http" and an endpoint)'
            )
        subscription.queue = queue
        return
    if protocol not in ("http", "https"):
        raise BadInput(f"protocol is {str(protocol)[:20]!r}; it must be sqs, http or https")
    endpoint, envelope = body.get("endpoint"), body.get("envelope", False)
    if not isinstance(endpoint, str) or not endpoint.startswith(f"{protocol}://"):
        raise BadInput(f"endpoint must be a {protocol}:// URL for protocol {protocol}")
    if not isinstance(envelope, bool):
        raise BadInput(f"envelope is a JSON {json_type(envelope)}; it must be true or false")
    subscription.webhook.url = endpoint
    subscription.sns_delivery.CopyFrom(
        tpb.SnsDelivery(
            topic_arn=f"{_ARN}:{EVENTS_TOPIC}",
            subscription_arn=f"{_ARN}:{EVENTS_TOPIC}:{name}",
            raw=not envelope,
        )
    )


async def ensure_events_topic(call: RestCall) -> None:
    """beyond-queue has one exchange, there from the start: the topic behind it is made by
    the first call that routes into it (a subscription, or a schedule that publishes)."""
    try:
        await call.call(
            "TopicService/CreateTopic", tpb.CreateTopicRequest(topic=tpb.Topic(name=EVENTS_TOPIC))
        )
    except RestError as error:
        if error.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise


async def subscribe(call: RestCall) -> web.Response:
    body = await call.json_object()
    name = f"s{secrets.token_hex(8)}"
    subscription = tpb.Subscription(name=name, topic=EVENTS_TOPIC, pattern=call.path("pattern"))
    _destination(body, name, subscription)
    await ensure_events_topic(call)
    created = await call.call(
        "TopicService/CreateSubscription", tpb.CreateSubscriptionRequest(subscription=subscription)
    )
    return web.json_response(_subscription(created.subscription), status=201)


async def list_by_pattern(call: RestCall) -> web.Response:
    pattern = call.path("pattern")
    return web.json_response(await subscriptions_where(call, lambda s: s.pattern == pattern))


async def unsubscribe(call: RestCall) -> web.Response:
    name, pattern = call.path("id"), call.path("pattern")
    got = await call.call(
        "TopicService/GetSubscription", tpb.GetSubscriptionRequest(topic=EVENTS_TOPIC, name=name)
    )
    if got.subscription.pattern != pattern:
        raise RestError(
            ConnectError(
                grpc.StatusCode.NOT_FOUND,
                f"subscription {name!r} is not one of pattern {quoted(pattern)}",
            )
        )
    await call.call(
        "TopicService/DeleteSubscription",
        tpb.DeleteSubscriptionRequest(topic=EVENTS_TOPIC, name=name),
    )
    return web.Response(status=204)


_PUBLISH: dict[str, Any] = {
    "type": "object",
    "required": ["message"],
    "properties": {
        "message": MESSAGE_SCHEMA,
        "headers": HEADERS_SCHEMA,
        "delay": {
            "type": "integer",
            "minimum": 0,
            "description": "Seconds each queue keeps it invisible, webhooks wait.",
        },
    },
}
_SUBSCRIBE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "queue_name": {"type": "string"},
        "protocol": {"type": "string", "enum": ["sqs", "http", "https"], "default": "sqs"},
        "endpoint": {"type": "string", "format": "uri"},
        "envelope": {"type": "boolean", "default": False},
    },
}
_SUBSCRIPTIONS = "/v1/events/{pattern}/subscriptions"
ROUTES = (
    Route(
        "POST", "/v1/events/{routing_key}", "TopicService/Publish", publish,
        "Publish an event to every queue and endpoint whose pattern matches the key.",
        params=(path_param("routing_key", "Dot-separated words."),), body=_PUBLISH,
        replies={201: Reply("Committed to every matching queue.", {"type": "object", "properties": {
            "queues_matched": {"type": "integer"},
            "messages": {"type": "array", "items": {"type": "object", "properties": {
                "queue": {"type": "string"}, "id": {"type": "integer"}}}},
            "webhook_deliveries": {"type": "integer"}}})},
    ),
    Route(
        "POST", _SUBSCRIPTIONS, "TopicService/CreateSubscription", subscribe,
        "Subscribe a queue (queue_name) or an HTTP(S) endpoint to a pattern.",
        params=(PATTERN,), body=_SUBSCRIBE,
        replies={201: Reply("Subscribed.", SUBSCRIPTION_SCHEMA),
                 404: Reply("No queue of that name.")},
    ),
    Route(
        "GET", _SUBSCRIPTIONS, "TopicService/ListSubscriptions", list_by_pattern,
        "The subscriptions of a pattern.", params=(PATTERN,),
        replies={200: Reply("Subscriptions.", {"type": "array", "items": SUBSCRIPTION_SCHEMA})},
    ),
    Route(
        "DELETE", _SUBSCRIPTIONS + "/{id}", "TopicService/DeleteSubscription", unsubscribe,
        "Unsubscribe.", params=(PATTERN, path_param("id", "The subscription's id.")),
        replies={204: Reply("Deleted."), 404: Reply("No such subscription of that pattern.")},
    ),
)  # fmt: skip
