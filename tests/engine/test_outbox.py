"""The transactional outbox: the engine's functions called inside an application's own
transaction, as docs/clients/psql.md states it.

- A message sent (send, send_batch, publish) exists if and only if the transaction
  commits; receivers see it, and waiting streams wake, only after the commit.
- Consume-and-write: receive, the application's own write and delete commit together;
  a rollback leaves the message as it was, with no lease and no delivery counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import receive, unique_name


@pytest.fixture
async def app(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The application's connection."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture
async def orders(app: asyncpg.Connection) -> AsyncIterator[str]:
    """A table of the application's own."""
    table = unique_name("orders")
    await app.execute(f'CREATE TABLE "{table}" (id int PRIMARY KEY)')
    yield table
    await app.execute(f'DROP TABLE "{table}"')


async def _received(messages, queue: str) -> list[bytes]:
    return [m.body for m in await asyncio.to_thread(receive, messages, queue)]


@pytest.mark.parametrize(
    "sending",
    [
        "SELECT postbox.send($1, 'x')",
        "SELECT count(*) FROM postbox.send_batch($1, ARRAY['x', 'y']::bytea[])",
    ],
    ids=["send", "send_batch"],
)
async def test_a_send_exists_only_if_its_transaction_commits(app, orders, queue, messages, sending):
    await app.execute("BEGIN")
    await app.execute(f'INSERT INTO "{orders}" VALUES (1)')
    await app.execute(sending, queue)
    # Uncommitted: no receiver sees it.
    assert await _received(messages, queue) == []
    await app.execute("ROLLBACK")
    assert await app.fetchval(f'SELECT count(*) FROM "{orders}"') == 0
    assert await _received(messages, queue) == []

    await app.execute("BEGIN")
    await app.execute(f'INSERT INTO "{orders}" VALUES (1)')
    await app.execute(sending, queue)
    await app.execute("COMMIT")
    assert await _received(messages, queue) in ([b"x"], [b"x", b"y"])


async def test_a_publish_exists_only_if_its_transaction_commits(app, messages):
    topic, target = unique_name("outbox_topic"), unique_name("outbox_sub")
    await app.execute("SELECT postbox.create_topic($1)", topic)
    await app.execute("SELECT postbox.create_queue($1)", target)
    await app.execute(
        "SELECT count(*) FROM postbox.create_subscription($1, 'all', '#', queue_name => $2)",
        topic,
        target,
    )
    await app.execute("BEGIN")
    await app.execute("SELECT count(*) FROM postbox.publish($1, 'dropped')", topic)
    await app.execute("ROLLBACK")
    assert await _received(messages, target) == []
    await app.execute("BEGIN")
    await app.execute("SELECT count(*) FROM postbox.publish($1, 'kept')", topic)
    await app.execute("COMMIT")
    assert await _received(messages, target) == [b"kept"]


async def test_a_waiting_stream_wakes_only_after_the_commit(app, queue, server, messages):
    async with grpc.aio.insecure_channel(server.target) as channel:
        stub = message_service_pb2_grpc.MessageServiceStub(channel)
        waiting = stub.Receive(
            pb.ReceiveRequest(queue=queue, max_messages=10, mode=pb.RECEIVE_MODE_CONTINUOUS)
        )
        reading = asyncio.ensure_future(waiting.read())
        try:
            await app.execute("BEGIN")
            await app.execute("SELECT postbox.send($1, 'after commit')", queue)
            # A receive now claims nothing, so the waiting stream has nothing to get.
            assert await _received(messages, queue) == []
            assert not reading.done()
            await app.execute("COMMIT")
            # 10 s: generous on a busy machine; a committed send wakes it in milliseconds.
            response = await asyncio.wait_for(reading, 10)
            assert [m.body for m in response.messages] == [b"after commit"]
        finally:
            waiting.cancel()


async def test_receive_write_and_delete_commit_together(app, orders, queue, messages):
    await app.execute("SELECT postbox.send($1, 'order 7')", queue)

    async def consume(outcome: str) -> None:
        await app.execute("BEGIN")
        (claimed,) = await app.fetch("SELECT * FROM postbox.receive($1, 1)", queue)
        await app.execute(f'INSERT INTO "{orders}" VALUES (7)')
        await app.execute("SELECT postbox.delete($1, $2)", queue, claimed["receipt"])
        await app.execute(outcome)

    await consume("ROLLBACK")
    # As before the transaction: visible at once (no lease), no delivery counted.
    row = await app.fetchrow(
        "SELECT m.receive_count, m.lease, m.visible_at <= now() AS visible "
        "FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id WHERE q.name = $1",
        queue,
    )
    assert (row["receive_count"], row["lease"], row["visible"]) == (0, None, True)
    assert await app.fetchval(f'SELECT count(*) FROM "{orders}"') == 0

    await consume("COMMIT")
    assert await app.fetchval(f'SELECT count(*) FROM "{orders}"') == 1
    assert await _received(messages, queue) == []
