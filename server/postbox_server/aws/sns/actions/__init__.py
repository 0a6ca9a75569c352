"""The SNS actions, each over TopicService calls, by resource: topics, their permissions
and tags, subscriptions, and publishing."""

from postbox_server.aws.sns.actions import permissions, publish, subscriptions, tags, topics
from postbox_server.aws.sns.actions.base import HANDLERS

__all__ = ["HANDLERS", "permissions", "publish", "subscriptions", "tags", "topics"]
