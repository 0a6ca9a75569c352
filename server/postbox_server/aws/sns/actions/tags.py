"""The SNS actions on a topic's tags."""

from __future__ import annotations

from postbox.v1 import topic_service_pb2 as pb

from postbox_server.aws.call import Call, Result
from postbox_server.aws.errors import AwsError
from postbox_server.aws.sns import arns
from postbox_server.aws.sns.actions.base import (
    action,
    get_topic,
    required,
    update_topic,
)
from postbox_server.aws.sns.errors import (
    INVALID_PARAMETER,
    NOT_FOUND,
    RESOURCE_NOT_FOUND,
    TAG_LIMIT_EXCEEDED,
)

# SNS's limit of tags on a topic.
MAX_TAGS = 50


def _tagged_topic(call: Call) -> str:
    arn = required(call, "ResourceArn")
    try:
        return arns.topic_of(arn, call.settings, "ResourceArn")
    except AwsError as error:
        # A ResourceArn that names no topic of this account, an ARN or not, is a resource
        # that does not exist (moto's answer; AWS's for a non-ARN is unrecorded).
        if error.kind in (NOT_FOUND, INVALID_PARAMETER):
            raise AwsError(RESOURCE_NOT_FOUND, "Resource does not exist") from None
        raise


async def _tags(call: Call, name: str) -> dict[str, str]:
    try:
        return dict((await get_topic(call, name)).tags)
    except AwsError as error:
        if error.kind is NOT_FOUND:
            raise AwsError(RESOURCE_NOT_FOUND, "Resource does not exist") from None
        raise


@action("TagResource")
async def tag_resource(call: Call) -> Result:
    name = _tagged_topic(call)
    tags = await _tags(call, name)
    tags.update({tag["Key"]: tag.get("Value", "") for tag in required(call, "Tags")})
    if len(tags) > MAX_TAGS:
        raise AwsError(
            TAG_LIMIT_EXCEEDED, "Could not complete request: tag quota of per resource exceeded"
        )
    await update_topic(call, pb.Topic(name=name, tags=tags), "tags")
    return {}


@action("UntagResource")
async def untag_resource(call: Call) -> Result:
    name = _tagged_topic(call)
    tags = await _tags(call, name)
    for key in required(call, "TagKeys"):
        tags.pop(key, None)
    await update_topic(call, pb.Topic(name=name, tags=tags), "tags")
    return {}


@action("ListTagsForResource")
async def list_tags_for_resource(call: Call) -> Result:
    tags = await _tags(call, _tagged_topic(call))
    return {"Tags": [{"Key": key, "Value": value} for key, value in sorted(tags.items())]}
