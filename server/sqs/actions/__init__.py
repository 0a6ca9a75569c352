"""The SQS actions, each a translation into postbox gRPC calls."""

from server.sqs.actions import leases, queues, receive, send
from server.sqs.actions.base import HANDLERS, Call

__all__ = ["HANDLERS", "Call", "leases", "queues", "receive", "send"]
