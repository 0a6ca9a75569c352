"""queue-ti's conveniences. `serve --auto-create-queues`: a send to a queue that does not
exist creates it, for a key that may also manage the name; without the flag, or without
that grant, NOT_FOUND. CreateQueue's with_dead_letter_queue: the queue and its `-dlq`
in one transaction, for a key that may manage both names.

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
    SqsShimProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    sqs_client,
    unique_name,
)

from postbox_server.auth.secrets import sigv4_secret

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
        # May create the queue "narrowq", but not its dead-letter queue "narrowq-dlq".
        "narrow": bootstrap_key(auto_database, "narrow", "manage:narrowq", "read:*"),
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


def test_the_sqs_shims_send_message_creates_the_queue(
    auto_server: HttpServerProcess, stubs, keys
) -> None:
    queues, _ = stubs
    known = unique_name("auto-sqs-known")
    _create(queues, keys["creator"], known)
    name = unique_name("auto-sqs")
    shim = SqsShimProcess(auto_server.target).start()
    try:
        client = sqs_client(shim.endpoint, "json", "creator", sigv4_secret(keys["creator"]))
        url = client.get_queue_url(QueueName=known)["QueueUrl"].replace(known, name)
        assert client.send_message(QueueUrl=url, MessageBody="via sqs")["MessageId"]
    finally:
        shim.stop()
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


def _create(queues, secret: str, name: str, **fields):
    return queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name), **fields),
        metadata=bearer(secret),
    ).queue


def _exists(queues, secret: str, name: str) -> bool:
    try:
        queues.GetQueue(queue_service_pb2.GetQueueRequest(name=name), metadata=bearer(secret))
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return False
    return True


def test_a_queue_is_created_with_its_dead_letter_queue(stubs, keys) -> None:
    queues, _messages = stubs
    secret = keys["creator"]
    name = unique_name("auto-jobs")
    queue = _create(queues, secret, name, with_dead_letter_queue=True)
    assert queue.dead_letter_policy.dead_letter_queue == f"{name}-dlq"
    assert queue.dead_letter_policy.max_receive_count == 5
    dlq = queues.GetQueue(
        queue_service_pb2.GetQueueRequest(name=f"{name}-dlq"), metadata=bearer(secret)
    ).queue
    assert not dlq.HasField("dead_letter_policy")

    fifo = unique_name("auto-orders") + ".fifo"
    queue = _create(
        queues, secret, fifo, with_dead_letter_queue=True, dead_letter_max_receive_count=2
    )
    assert queue.fifo
    assert queue.dead_letter_policy.dead_letter_queue == fifo.removesuffix(".fifo") + "-dlq.fifo"
    assert queue.dead_letter_policy.max_receive_count == 2

    # The longest name that leaves room for "-dlq": 76 characters, its DLQ 80.
    longest = "auto-" + "x" * 71
    assert len(_create(queues, secret, longest, with_dead_letter_queue=True).name) == 76
    assert _exists(queues, secret, longest + "-dlq")


def test_with_dead_letter_queue_refuses_what_cannot_be_made(stubs, keys) -> None:
    queues, _ = stubs
    secret = keys["creator"]
    too_long = "auto-" + "y" * 72
    error = error_of(lambda: _create(queues, secret, too_long, with_dead_letter_queue=True))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "77 characters long" in error.details()
    assert "at most 76" in error.details()
    name = unique_name("auto-bad")
    for fields, words in (
        ({"dead_letter_max_receive_count": 1001}, "1 to 1000"),
        ({"dead_letter_max_receive_count": -1}, "1 to 1000"),
    ):
        error = error_of(
            lambda f=fields: _create(queues, secret, name, with_dead_letter_queue=True, **f)
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in error.details()
    error = error_of(lambda: _create(queues, secret, name, dead_letter_max_receive_count=3))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "with_dead_letter_queue" in error.details()
    with_policy = queue_service_pb2.CreateQueueRequest(
        queue=queue_service_pb2.Queue(
            name=name,
            dead_letter_policy=queue_service_pb2.DeadLetterPolicy(
                dead_letter_queue="auto-other", max_receive_count=2
            ),
        ),
        with_dead_letter_queue=True,
    )
    error = error_of(lambda: queues.CreateQueue(with_policy, metadata=bearer(secret)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "dead_letter_policy" in error.details()
    assert not _exists(queues, secret, name)
    assert not _exists(queues, secret, name + "-dlq")
    assert not _exists(queues, secret, too_long)


def test_both_queues_or_neither(stubs, keys) -> None:
    queues, _ = stubs
    secret = keys["creator"]
    # The queue exists: its DLQ, created first in the transaction, is rolled back.
    name = unique_name("auto-taken")
    _create(queues, secret, name)
    error = error_of(lambda: _create(queues, secret, name, with_dead_letter_queue=True))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert not _exists(queues, secret, name + "-dlq")
    # The DLQ exists: the queue is not created.
    other = unique_name("auto-dlqtaken")
    _create(queues, secret, other + "-dlq")
    error = error_of(lambda: _create(queues, secret, other, with_dead_letter_queue=True))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert f"{other}-dlq" in error.details()
    assert not _exists(queues, secret, other)


def test_with_dead_letter_queue_needs_manage_on_both_names(stubs, keys) -> None:
    queues, _ = stubs
    error = error_of(
        lambda: _create(queues, keys["narrow"], "narrowq", with_dead_letter_queue=True)
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'manage'" in error.details()
    assert "'narrowq-dlq'" in error.details()
    assert not _exists(queues, keys["creator"], "narrowq")
    # The same key may create the queue alone.
    assert _create(queues, keys["narrow"], "narrowq").name == "narrowq"
