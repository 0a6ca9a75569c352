"""`serve --auto-create-queues`: a send to a queue that does not exist creates it, for a
key that may also manage the name; without the flag, or without that grant, NOT_FOUND.

A database of its own: keys turn authentication on for every server of a database.
"""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.request
from collections.abc import Iterator

import asyncpg
import grpc
import pytest
from auth_support import bearer, wait_until
from postbox.v1 import (
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from support import (
    HttpServerProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    unique_name,
)

SEND = message_service_pb2.SendRequest


@pytest.fixture(scope="module")
def auto_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_auto_create")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def auto_server(auto_database: str) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(auto_database, "--pool-size", "4", "--auto-create-queues").start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def keys(auto_database: str, auto_server: HttpServerProcess) -> dict[str, str]:
    """The secrets of a key that may send to and manage auto-*, and one that may only send."""
    secrets = {
        "creator": bootstrap_key(auto_database, "creator", "send:*", "manage:auto-*", "read:*"),
        "sender": bootstrap_key(auto_database, "sender", "send:*", "read:*"),
    }
    with grpc.insecure_channel(auto_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)

        def works() -> bool:
            try:
                queues.ListQueues(
                    queue_service_pb2.ListQueuesRequest(), metadata=bearer(secrets["sender"])
                )
            except grpc.RpcError:
                return False
            return True

        wait_until(works, 5, "the keys")
    return secrets


@pytest.fixture
def stubs(auto_server: HttpServerProcess) -> Iterator[tuple]:
    with grpc.insecure_channel(auto_server.target) as channel:
        yield (
            queue_service_pb2_grpc.QueueServiceStub(channel),
            message_service_pb2_grpc.MessageServiceStub(channel),
        )


def _depth(queues, name: str, secret: str) -> int:
    queue = queues.GetQueue(
        queue_service_pb2.GetQueueRequest(name=name, view=queue_service_pb2.QUEUE_VIEW_FULL),
        metadata=bearer(secret),
    ).queue
    return queue.stats.visible_messages


def test_without_the_flag_a_send_to_an_unknown_queue_is_not_found(messages, queues) -> None:
    name = unique_name("auto-off")
    error = error_of(lambda: messages.Send(SEND(queue=name, body=b"x")))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "does not exist" in error.details()
    absent = error_of(lambda: queues.GetQueue(queue_service_pb2.GetQueueRequest(name=name)))
    assert absent.code() == grpc.StatusCode.NOT_FOUND


def test_send_batch_and_stream_create_the_queue_with_default_settings(stubs, keys) -> None:
    queues, messages = stubs
    creator = bearer(keys["creator"])
    sent = unique_name("auto-send")
    messages.Send(SEND(queue=sent, body=b"one"), metadata=creator)
    created = queues.GetQueue(queue_service_pb2.GetQueueRequest(name=sent), metadata=creator)
    bare = unique_name("auto-bare")
    made = queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=bare)),
        metadata=creator,
    ).queue
    for field in ("visibility_timeout", "retention", "max_message_size", "delivery_delay"):
        assert getattr(created.queue, field) == getattr(made, field), field
    assert _depth(queues, sent, keys["creator"]) == 1

    batched = unique_name("auto-batch")
    reply = messages.SendBatch(
        message_service_pb2.SendBatchRequest(
            queue=batched,
            entries=[
                message_service_pb2.SendBatchEntry(body=b"a"),
                message_service_pb2.SendBatchEntry(body=b"b"),
            ],
        ),
        metadata=creator,
    )
    assert len(reply.message_ids) == 2
    assert _depth(queues, batched, keys["creator"]) == 2

    streamed = unique_name("auto-stream")
    requests = iter(
        [message_service_pb2.SendStreamRequest(tag=1, send=SEND(queue=streamed, body=b"s"))]
    )
    responses = messages.SendStream(requests, metadata=creator, timeout=20)
    (answer,) = [result for response in responses for result in response.results]
    assert answer.sent.message_id, answer
    assert _depth(queues, streamed, keys["creator"]) == 1


def test_http_send_creates_the_queue(auto_server: HttpServerProcess, stubs, keys) -> None:
    queues, _ = stubs
    name = unique_name("auto-http")
    request = urllib.request.Request(
        f"{auto_server.base}/postbox.v1.MessageService/Send",
        data=json.dumps({"queue": name, "body": base64.b64encode(b"h").decode()}).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {keys['creator']}",
        },
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert json.loads(response.read())["messageId"]
    assert _depth(queues, name, keys["creator"]) == 1


def test_a_key_that_may_not_manage_the_name_gets_not_found(stubs, keys) -> None:
    queues, messages = stubs
    for secret, name in (
        (keys["sender"], unique_name("auto-nomanage")),  # no manage grant at all
        (keys["creator"], unique_name("elsewhere")),  # manage, but not on this name
    ):
        error = error_of(lambda s=secret, n=name: messages.Send(SEND(queue=n, body=b"x"),
                                                                 metadata=bearer(s)))  # fmt: skip
        assert error.code() == grpc.StatusCode.NOT_FOUND, error
        absent = error_of(
            lambda n=name: queues.GetQueue(
                queue_service_pb2.GetQueueRequest(name=n), metadata=bearer(keys["creator"])
            )
        )
        assert absent.code() == grpc.StatusCode.NOT_FOUND


async def test_two_first_sends_race_one_creates_both_send(
    auto_database: str, auto_server: HttpServerProcess, keys
) -> None:
    """Both sends miss the queue and both try to create it: a lock on postbox.queues holds
    their creates until both wait, so one creates and the other finds it exists."""
    name = unique_name("auto-race")
    holder = await asyncpg.connect(auto_database)
    try:
        lock = holder.transaction()
        await lock.start()
        # SHARE lets the sends read postbox.queues (and miss) but blocks every INSERT.
        await holder.execute("LOCK TABLE postbox.queues IN SHARE MODE")
        async with grpc.aio.insecure_channel(auto_server.target) as channel:
            messages = message_service_pb2_grpc.MessageServiceStub(channel)
            metadata = bearer(keys["creator"])
            sends = [
                asyncio.ensure_future(
                    messages.Send(SEND(queue=name, body=b"1"), metadata=metadata)
                ),
                asyncio.ensure_future(
                    messages.SendBatch(
                        message_service_pb2.SendBatchRequest(
                            queue=name, entries=[message_service_pb2.SendBatchEntry(body=b"2")]
                        ),
                        metadata=metadata,
                    )
                ),
            ]
            deadline = asyncio.get_running_loop().time() + 10
            while (
                await holder.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted"
                    " AND relation = 'postbox.queues'::regclass"
                )
                < 2
            ):
                assert asyncio.get_running_loop().time() < deadline, "two creates never waited"
                await asyncio.sleep(0.01)
            await lock.commit()
            sent, batched = await asyncio.gather(*sends)
        assert sent.message_id
        assert len(batched.message_ids) == 1
        assert (
            await holder.fetchval("SELECT count(*) FROM postbox.queues WHERE name = $1", name) == 1
        )
    finally:
        await holder.close()
    with grpc.insecure_channel(auto_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        assert _depth(queues, name, keys["creator"]) == 2
