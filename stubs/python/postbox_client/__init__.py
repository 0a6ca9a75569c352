"""The Python SDK of postbox: clients, a batching producer, a consumer with lease management.

async with AsyncClient("localhost:50051", api_key=...) as client:
    async with client.producer("jobs") as producer:
        message_id = await producer.send(b"work")
    await client.consumer("jobs").run(handle, concurrency=8)
"""

from postbox_client.client import TLS, AsyncClient, Client, Retry
from postbox_client.consumer import Consumer, ConsumerOptions, ReceivedMessage
from postbox_client.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PostboxError,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from postbox_client.producer import Producer, ProducerOptions
from postbox_client.streams import StreamBatch, StreamReader
from postbox_client.version import API, __version__

__all__ = [
    "API",
    "TLS",
    "AlreadyExists",
    "AsyncClient",
    "Client",
    "Consumer",
    "ConsumerOptions",
    "DeadlineExceeded",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "PostboxError",
    "Producer",
    "ProducerOptions",
    "ReceivedMessage",
    "ResourceExhausted",
    "Retry",
    "StreamBatch",
    "StreamReader",
    "Unauthenticated",
    "Unavailable",
    "__version__",
]
