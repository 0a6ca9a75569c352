"""What the SNS actions share: the table of actions, the calls on topics, and the
parameters every action reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf import field_mask_pb2
from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws.call import Actions, Call
from postbox_server.aws.errors import AwsError
from postbox_server.aws.sns.errors import (
    NOT_FOUND,
    STATUS_ERRORS,
    InvalidParameter,
    not_found,
)

HANDLERS = Actions()
action = HANDLERS.action
# The page of ListTopics and ListSubscriptions, as SNS pages them.
PAGE = 100


async def rpc(call: Call, method: Callable[..., Any], request: Any) -> Any:
    return await call.backend.call(method, request, STATUS_ERRORS)


def required(call: Call, name: str) -> Any:
    value = call.params.get(name)
    if value is None or value == "":
        raise InvalidParameter(f"Invalid parameter: {name} Reason: it is required")
    return value


def boolean(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise InvalidParameter(
            f"Invalid parameter: Attributes Reason: {name} must be true or false"
        )
    return value.lower() == "true"


def is_fifo(topic: str) -> bool:
    return topic.endswith(".fifo")


async def get_topic(call: Call, topic: str) -> pb.Topic:
    try:
        response = await rpc(call, call.backend.topics.GetTopic, pb.GetTopicRequest(name=topic))
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise not_found("Topic does not exist") from None
        raise
    return response.topic


async def update_topic(call: Call, topic: pb.Topic, path: str) -> None:
    await rpc(
        call, call.backend.topics.UpdateTopic,
        pb.UpdateTopicRequest(topic=topic, update_mask=field_mask_pb2.FieldMask(paths=[path])),
    )  # fmt: skip


def next_token(call: Call) -> str:
    return call.params.get("NextToken") or ""


async def all_subscriptions(call: Call, topic: str) -> list[pb.Subscription]:
    found: list[pb.Subscription] = []
    token = ""
    while True:
        response = await rpc(
            call, call.backend.topics.ListSubscriptions,
            pb.ListSubscriptionsRequest(topic=topic, page_size=1000, page_token=token),
        )  # fmt: skip
        found.extend(response.subscriptions)
        token = response.next_page_token
        if not token:
            return found
