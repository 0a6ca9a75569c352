"""The SQS actions, each a translation into postbox gRPC calls."""

from postbox_server.aws.sqs.actions import leases, queues, receive, redrive, send, tags
from postbox_server.aws.sqs.actions.base import HANDLERS, Call

__all__ = ["HANDLERS", "Call", "leases", "queues", "receive", "redrive", "send", "tags"]
