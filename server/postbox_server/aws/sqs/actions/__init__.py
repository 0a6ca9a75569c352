"""The SQS actions, each a translation into postbox gRPC calls."""

from postbox_server.aws.sqs.actions import leases, permissions, queues, receive, redrive, send, tags
from postbox_server.aws.sqs.actions.base import HANDLERS, Call

__all__ = [
    "HANDLERS",
    "Call",
    "leases",
    "permissions",
    "queues",
    "receive",
    "redrive",
    "send",
    "tags",
]
