"""SendBatchStream through the real server and the SDK: the Producer's batches go over one
stream of its client; each batch keeps SendBatch's outcome (all or nothing, its request id)
and is answered only after its commit, by its tag; a refused batch leaves the others
alone; a broken stream fails what was in flight with UNAVAILABLE, and the Producer sends
those batches again under their request ids, so nothing is stored twice."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox_client import AsyncClient, Retry
from support import (
    ServerProcess,
    bodies_by_id,
    calls_started,
    unique_name,
    until_waiting_at_lock,
    waiting_at_lock,
)

from postbox_server.services.send_stream import MAX_BATCHES_IN_PROGRESS, TaggedStreamCall

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


async def _batch_requests(db: asyncpg.Connection, queue: str) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM postbox.batch_requests b JOIN postbox.queues q "
        "ON q.id = b.queue_id WHERE q.name = $1",
        queue,
    )


async def test_producer_batches_share_one_stream_and_are_answered_after_their_commit(
    server, db, queue
):
    bodies = [f"message {i}".encode() for i in range(200)]
    streams, unary = calls_started(server, "SendBatchStream"), calls_started(server, "SendBatch")
    client = AsyncClient(server.target)
    async with client, client.producer(queue, max_entries=50) as producer:
        held = db.transaction()
        await held.start()
        try:
            await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
            futures = [producer.send(body) for body in bodies]
            await until_waiting_at_lock(db, 4)  # the four batches of 50, each at the database
            assert not any(future.done() for future in futures)  # none committed yet
        finally:
            await held.rollback()
        ids = await asyncio.gather(*futures)
        assert producer.batches_sent == 4
    assert calls_started(server, "SendBatchStream") == streams + 1  # one stream for all four
    assert calls_started(server, "SendBatch") == unary
    stored = await bodies_by_id(db, queue)
    assert [stored[i] for i in ids] == bodies  # each caller got the id of its own message
    assert await _batch_requests(db, queue) == 4  # each batch under its own request id


async def test_each_batch_is_answered_by_its_tag_as_sendbatch_would_answer(server, db, queue):
    good = pb.SendBatchRequest(
        queue=queue,
        entries=[pb.SendBatchEntry(body=b"one"), pb.SendBatchEntry(body=b"two")],
        request_id="batch-1",
    )
    negative_ttl = pb.SendBatchEntry(body=b"never")
    negative_ttl.ttl.FromTimedelta(timedelta(seconds=-1))
    refused = pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x"), negative_ttl])
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = message_service_pb2_grpc.MessageServiceStub(channel).SendBatchStream()
        await call.write(pb.SendBatchStreamRequest(tag=1, batch=good))
        (first,) = (await call.read()).results
        for request in (
            pb.SendBatchStreamRequest(tag=2, batch=refused),
            pb.SendBatchStreamRequest(tag=3),  # no batch
            pb.SendBatchStreamRequest(
                tag=4,
                batch=pb.SendBatchRequest(
                    queue="no_such_queue_batch_stream", entries=[pb.SendBatchEntry(body=b"x")]
                ),
            ),
            pb.SendBatchStreamRequest(tag=5, batch=pb.SendBatchRequest(queue=queue)),  # empty
            pb.SendBatchStreamRequest(tag=6, batch=good),  # the first batch, sent again
        ):
            await call.write(request)
        await call.done_writing()
        results = {}
        while (response := await call.read()) != grpc.aio.EOF:
            results.update((result.tag, result) for result in response.results)
    assert first.tag == 1
    assert list(first.sent.duplicates) == [False, False]
    assert sorted(results) == [2, 3, 4, 5, 6]
    assert results[2].error.code == INVALID
    assert results[2].error.message.startswith("entry 1: ttl is -1.0 s")
    assert results[3].error.code == INVALID
    assert "tag 3 has no batch" in results[3].error.message
    assert results[4].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "no_such_queue_batch_stream" in results[4].error.message
    assert results[5].error.code == INVALID
    # The repeat stores nothing and answers the first batch's ids.
    assert list(results[6].sent.message_ids) == list(first.sent.message_ids)
    assert list(results[6].sent.duplicates) == [True, True]
    stored = await bodies_by_id(db, queue)
    assert stored == dict(zip(first.sent.message_ids, [b"one", b"two"], strict=True))


@pytest.fixture
def own_server(database_url: str):
    # A pool larger than a stream's batches in progress: the limit, not the pool, holds.
    process = ServerProcess(
        database_url, "--pool-size", str(MAX_BATCHES_IN_PROGRESS + 8), metrics=True
    ).start()
    yield process
    process.stop()


async def test_a_stream_has_at_most_16_batches_in_progress(own_server, database_url):
    queue = unique_name("batch_stream_limit")
    total = MAX_BATCHES_IN_PROGRESS + 4
    db = await asyncpg.connect(database_url)
    try:
        async with AsyncClient(own_server.target) as client:
            await client.create_queue(queue)
        async with grpc.aio.insecure_channel(own_server.target) as channel:
            call = message_service_pb2_grpc.MessageServiceStub(channel).SendBatchStream()
            held = db.transaction()
            await held.start()
            try:
                await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
                for tag in range(total):
                    entries = [pb.SendBatchEntry(body=f"{tag}".encode())]
                    batch = pb.SendBatchRequest(queue=queue, entries=entries)
                    await call.write(pb.SendBatchStreamRequest(tag=tag, batch=batch))
                await call.done_writing()
                await until_waiting_at_lock(db, MAX_BATCHES_IN_PROGRESS)
                # The server holds no more than the limit however long the commits wait,
                # though its pool has room for more.
                for _ in range(20):
                    assert await waiting_at_lock(db) == MAX_BATCHES_IN_PROGRESS
            finally:
                await held.rollback()
            answers = [result async for response in call for result in response.results]
        assert sorted(answer.tag for answer in answers) == list(range(total))
        assert all(answer.HasField("sent") for answer in answers)
        assert len(await bodies_by_id(db, queue)) == total
    finally:
        await db.close()


async def test_a_broken_stream_sends_the_producers_batches_again_once_each(
    own_server: ServerProcess, database_url: str
):
    """The stream breaks with batches in flight (the server is killed while their commits
    wait): the Producer sends each again under its request id, on a new stream, and each
    caller gets its own message's id, each message stored once, whether or not the
    statements the dead server left at the database committed."""
    queue = unique_name("batch_stream_retry")
    db = await asyncpg.connect(database_url)
    # Generous: the retries must outlast a restart of the server on a loaded machine.
    patient = Retry(attempts=40, initial=0.2, maximum=2.0)
    try:
        async with AsyncClient(own_server.target, retry=patient) as client:
            await client.create_queue(queue)
            async with client.producer(queue, max_entries=10) as producer:
                await producer.send(b"before")  # the stream is open
                held = db.transaction()
                await held.start()
                await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
                bodies = [f"{i}".encode() for i in range(30)]
                futures = [producer.send(body) for body in bodies]
                await until_waiting_at_lock(db, 3)
                own_server.kill()
                await held.rollback()  # the dead server's statements may now commit, or not
                await asyncio.to_thread(own_server.start)
                ids = await asyncio.gather(*futures)
            stored = await bodies_by_id(db, queue)
            assert [stored[i] for i in ids] == bodies  # each caller's own message
            assert sorted(stored.values()) == sorted([b"before", *bodies])  # each once
    finally:
        await db.close()


async def test_a_shutdown_ends_an_idle_batch_stream_at_once_with_unavailable(
    own_server: ServerProcess,
):
    queue = unique_name("batch_stream_shutdown")
    async with AsyncClient(own_server.target) as client:
        await client.create_queue(queue)
    async with grpc.aio.insecure_channel(own_server.target) as channel:
        call = message_service_pb2_grpc.MessageServiceStub(channel).SendBatchStream()
        batch = pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")])
        await call.write(pb.SendBatchStreamRequest(tag=1, batch=batch))
        (answer,) = (await call.read()).results
        assert answer.HasField("sent")
        stopping = asyncio.ensure_future(asyncio.to_thread(own_server.stop))
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (ended.value.details() or "")
        await stopping


async def test_a_server_without_the_batch_stream_gets_unary_batches():
    """A server of an earlier version has no SendBatchStream: the Producer falls back to
    SendBatch calls, its request ids as before."""
    received: list[pb.SendBatchRequest] = []

    async def send_batch(
        request: pb.SendBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.SendBatchResponse:
        received.append(request)
        first = sum(len(r.entries) for r in received) - len(request.entries)
        return pb.SendBatchResponse(
            message_ids=[str(first + i) for i in range(len(request.entries))]
        )

    older = grpc.aio.server()
    older.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "postbox.v1.MessageService",
                {
                    "SendBatch": grpc.unary_unary_rpc_method_handler(
                        send_batch,
                        pb.SendBatchRequest.FromString,
                        pb.SendBatchResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    port = older.add_insecure_port("127.0.0.1:0")
    await older.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            async with client.producer("q", max_entries=5) as producer:
                ids = await asyncio.gather(*(producer.send(f"{i}") for i in range(10)))
            assert not client.batch_stream.supported
            response = await client.send_batch("q", [pb.SendBatchEntry(body=b"later")])
        assert sorted(ids, key=int) == [str(i) for i in range(10)]
        assert list(response.message_ids) == ["10"]
        assert all(len(r.request_id) == 32 for r in received[:-1])  # the Producer's
        assert sorted(e.body for r in received for e in r.entries) == sorted(
            [f"{i}".encode() for i in range(10)] + [b"later"]
        )
    finally:
        await older.stop(None)


async def test_an_unexpected_failure_is_answered_on_its_own_tag():
    """A batch whose handling raised something not postbox's own is answered UNKNOWN with
    the error's type only (as a unary call is), and the stream's other batches go on;
    before, its caller waited for an answer until the stream ended."""

    async def handle(batch: pb.SendBatchRequest) -> pb.SendBatchResponse:
        if batch.queue == "breaks":
            raise RuntimeError(f"secret detail of {batch.queue}")
        return pb.SendBatchResponse(message_ids=["1"])

    async def requests():
        for tag, queue in ((1, "fine"), (2, "breaks"), (3, "fine")):
            yield pb.SendBatchStreamRequest(tag=tag, batch=pb.SendBatchRequest(queue=queue))

    call = TaggedStreamCall(
        handle, "batch", pb.SendBatchStreamResult, pb.SendBatchStreamResponse, 16
    )
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    results = {
        result.tag: result
        async for response in call.run(requests(), never)
        for result in response.results
    }
    assert sorted(results) == [1, 2, 3]
    assert list(results[1].sent.message_ids) == list(results[3].sent.message_ids) == ["1"]
    assert results[2].error.code == grpc.StatusCode.UNKNOWN.value[0]
    assert results[2].error.message == "Unexpected RuntimeError"
