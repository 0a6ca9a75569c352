"""SendStream through the real server and the SDK: AsyncClient.send multiplexes every send
of a client over one stream; each send is answered only after its own commit, with its
own id or its own error; one caller leaving, or one bad request, leaves the rest alone;
a server restart fails what was in flight with UNAVAILABLE, never with a false OK."""

from __future__ import annotations

import asyncio

import asyncpg
import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox_client import AsyncClient, Retry
from postbox_client.errors import InvalidArgument, NotFound, Unavailable
from support import (
    ServerProcess,
    assert_shared,
    bodies_by_id,
    calls_started,
    metric,
    scrape,
    under_load,
    unique_name,
    until_waiting_at_lock,
)

from postbox_server.auth.rules import MAX_PARTS
from postbox_server.services.send_stream import MAX_SENDS_IN_PROGRESS as MAX_IN_PROGRESS


async def test_concurrent_sends_share_one_stream_and_commits_and_are_answered_after_them(
    server, db, queue, commit_sizes
):
    bodies = [f"message {i}".encode() for i in range(300)]
    streams, unary = calls_started(server, "SendStream"), calls_started(server, "Send")
    async with AsyncClient(server.target) as client:

        def no_answer_while_the_commit_waits(calls: list[asyncio.Future[str]]) -> None:
            # The group is held at the database: no send has committed, so none is answered.
            assert not any(call.done() for call in calls)

        ids = await under_load(
            db,
            server,
            lambda: [asyncio.ensure_future(client.send(queue, body)) for body in bodies],
            no_answer_while_the_commit_waits,
        )
    assert calls_started(server, "SendStream") == streams + 1  # one stream for all 300
    assert calls_started(server, "Send") == unary
    stored = await bodies_by_id(db, queue)
    assert [stored[i] for i in ids] == bodies  # each caller got the id of its own message
    assert_shared(await commit_sizes(ids))


async def test_a_bad_request_gets_its_own_error_and_the_others_commit(server, db, queue):
    bad_attribute = {"AWS.reserved": msg.AttributeValue(data_type="String", string_value="x")}
    async with AsyncClient(server.target) as client:
        outcomes = await asyncio.gather(
            client.send(queue, b"first"),
            client.send(queue, b"bad", attributes={"AWS.reserved": "x"}),
            client.send("no_such_queue_send_stream", b"lost"),
            client.send(queue, b"last"),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], InvalidArgument), outcomes[1]
        assert "AWS." in outcomes[1].message
        assert isinstance(outcomes[2], NotFound), outcomes[2]
        assert "no_such_queue_send_stream" in outcomes[2].message
        stored = await bodies_by_id(db, queue)
        assert stored == {outcomes[0]: b"first", outcomes[3]: b"last"}
        # The stream goes on after refusals.
        assert (await client.send(queue, b"after")) in await bodies_by_id(db, queue)

    # Raw: answers carry the tags of their requests; a request without a message is refused.
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = message_service_pb2_grpc.MessageServiceStub(channel).SendStream()
        await call.write(pb.SendStreamRequest(tag=7))
        await call.write(
            pb.SendStreamRequest(
                tag=8, send=pb.SendRequest(queue=queue, body=b"x", attributes=bad_attribute)
            )
        )
        await call.write(pb.SendStreamRequest(tag=9, send=pb.SendRequest(queue=queue, body=b"y")))
        await call.done_writing()
        results = {result.tag: result async for response in call for result in response.results}
    assert sorted(results) == [7, 8, 9]
    assert results[7].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "tag 7 has no send" in results[7].error.message
    assert results[8].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert (await bodies_by_id(db, queue))[results[9].sent.message_id] == b"y"


async def test_the_sends_a_request_carries_are_answered_each_alone(server, db, queue):
    """A request with `more` is several sends: each gets its own answer, as in a request of
    its own; a request over the limit has every send refused, and the stream goes on."""
    bad_attribute = {"AWS.reserved": msg.AttributeValue(data_type="String", string_value="x")}
    carrying = pb.SendStreamRequest(tag=1, send=pb.SendRequest(queue=queue, body=b"one"))
    carrying.more.add(tag=2, send=pb.SendRequest(queue=queue, body=b"x", attributes=bad_attribute))
    carrying.more.add(tag=3, send=pb.SendRequest(queue="no_such_queue_carried", body=b"x"))
    carrying.more.add(tag=4, send=pb.SendRequest(queue=queue, body=b"four"))
    carrying.more.add(tag=5)  # no send
    too_many = pb.SendStreamRequest(tag=100, send=pb.SendRequest(queue=queue, body=b"over"))
    for tag in range(101, 100 + MAX_PARTS + 1):  # MAX_PARTS + 1 sends in all
        too_many.more.add(tag=tag, send=pb.SendRequest(queue=queue, body=b"over"))
    after = pb.SendStreamRequest(tag=6, send=pb.SendRequest(queue=queue, body=b"six"))
    async with grpc.aio.insecure_channel(server.target) as channel:
        call = message_service_pb2_grpc.MessageServiceStub(channel).SendStream()
        for request in (carrying, too_many, after):
            await call.write(request)
        await call.done_writing()
        results = {result.tag: result async for response in call for result in response.results}
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert sorted(results) == [1, 2, 3, 4, 5, 6, *range(100, 100 + MAX_PARTS + 1)]
    assert results[2].error.code == invalid
    assert "AWS." in results[2].error.message
    assert results[3].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert "no_such_queue_carried" in results[3].error.message
    assert results[5].error.code == invalid
    assert "tag 5 has no send" in results[5].error.message
    for tag in range(100, 100 + MAX_PARTS + 1):
        assert results[tag].error.code == invalid
        assert "carries 1,001 sends, at most 1,000" in results[tag].error.message
    stored = await bodies_by_id(db, queue)
    assert stored == {
        results[1].sent.message_id: b"one",
        results[4].sent.message_id: b"four",
        results[6].sent.message_id: b"six",
    }


async def test_a_cancelled_caller_leaves_the_stream_and_the_others_alone(server, db, queue):
    streams = calls_started(server, "SendStream")
    async with AsyncClient(server.target) as client:
        bodies = [f"message {i}".encode() for i in range(20)]

        def cancel_one(held: list[asyncio.Future[str]]) -> None:
            held[5].cancel()  # its request is on the stream; its caller stops waiting

        outcomes = await under_load(
            db,
            server,
            lambda: [asyncio.ensure_future(client.send(queue, body)) for body in bodies],
            cancel_one,
        )
        assert isinstance(outcomes[5], asyncio.CancelledError)
        kept = [o for i, o in enumerate(outcomes) if i != 5]
        stored = await bodies_by_id(db, queue)
        assert [stored[i] for i in kept] == [b for i, b in enumerate(bodies) if i != 5]
        # The cancelled send's message was on its way: it committed, unanswered, or not.
        assert len(stored) in (19, 20)
        # The same stream serves the next send.
        assert (await client.send(queue, b"after")) in await bodies_by_id(db, queue)
    assert calls_started(server, "SendStream") == streams + 1


async def test_a_send_cancelled_before_it_is_written_is_not_sent(server, db, queue):
    """Sends wait for the client's writer; one whose caller gave up before the writer took
    it is left out of the request, rather than sent for nobody."""
    async with AsyncClient(server.target) as client:
        await client.send(queue, b"open")  # the stream is open
        kept = asyncio.ensure_future(client.send(queue, b"kept"))
        dropped = asyncio.ensure_future(client.send(queue, b"dropped"))
        # Both sends run their first step (ready, the writer started) before this callback,
        # and the writer's first step comes after it: asyncio runs callbacks in order.
        asyncio.get_running_loop().call_soon(dropped.cancel)
        kept_id = await kept
        with pytest.raises(asyncio.CancelledError):
            await dropped
        after = await client.send(queue, b"after")  # a later request does not carry it
        stored = await bodies_by_id(db, queue)
    assert sorted(stored.values()) == [b"after", b"kept", b"open"]
    assert stored[kept_id] == b"kept"
    assert stored[after] == b"after"


@pytest.fixture
def own_server(database_url: str):
    process = ServerProcess(database_url).start()
    yield process
    process.stop()


async def test_a_server_restart_fails_sends_in_flight_with_unavailable(
    own_server: ServerProcess, database_url: str
):
    queue = unique_name("send_stream_restart")
    db = await asyncpg.connect(database_url)
    try:
        async with AsyncClient(own_server.target) as client:
            await client.create_queue(queue)
            await client.send(queue, b"before")  # the stream is open
            held = db.transaction()
            await held.start()
            await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
            sends = [asyncio.ensure_future(client.send(queue, f"{i}".encode())) for i in range(20)]
            await until_waiting_at_lock(db, 1)  # the sends' group: they are in flight
            own_server.kill()  # the restart: the process dies with the sends in flight
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            await held.rollback()
            # No OK for a send whose commit the server never saw: UNAVAILABLE, an unknown
            # outcome. The statement already waiting at the database when the server died
            # may still commit once the lock goes (PostgreSQL learns of a dead client only
            # when it answers), as for a unary Send; so a retry must carry a deduplication id.
            assert all(isinstance(o, Unavailable) for o in outcomes), outcomes
            stored = await bodies_by_id(db, queue)
            assert set(stored.values()) <= {b"before", *(f"{i}".encode() for i in range(20))}
            own_server.start()
            await client.channel.channel_ready()  # past the channel's reconnect backoff
            # The client opens a new stream to the restarted server.
            assert (await client.send(queue, b"after")) in await bodies_by_id(db, queue)
    finally:
        await db.close()


async def test_a_broken_stream_retries_sends_with_a_deduplication_id_once_each(
    own_server: ServerProcess, database_url: str
):
    """The stream breaks with sends in flight (the server is killed while their commit
    waits): each caller with a deduplication id gets its message's id from a retry on a new
    stream, never a silent loss, and each message is stored once, whether or not the
    statement the dead server left at the database committed."""
    queue = unique_name("send_stream_retry")
    db = await asyncpg.connect(database_url)
    # Generous: the retries must outlast a restart of the server on a loaded machine.
    patient = Retry(attempts=40, initial=0.2, maximum=2.0)
    try:
        async with AsyncClient(own_server.target, retry=patient) as client:
            await client.create_queue(queue)
            await client.send(queue, b"before")  # the stream is open
            held = db.transaction()
            await held.start()
            await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
            bodies = [f"{i}".encode() for i in range(20)]
            sends = [
                asyncio.ensure_future(client.send(queue, body, deduplication_id=f"d{i}"))
                for i, body in enumerate(bodies)
            ]
            await until_waiting_at_lock(db, 1)  # the sends' group: they are in flight
            own_server.kill()
            await held.rollback()  # the dead server's statement may now commit, or not
            await asyncio.to_thread(own_server.start)
            ids = await asyncio.gather(*sends)
            stored = await bodies_by_id(db, queue)
            assert [stored[i] for i in ids] == bodies  # each caller's own message
            assert sorted(stored.values()) == sorted([b"before", *bodies])  # each once
    finally:
        await db.close()


async def test_a_server_without_send_stream_gets_unary_sends():
    """A server of an earlier version has no SendStream: the client falls back to Send."""
    received: list[pb.SendRequest] = []

    async def send(request: pb.SendRequest, context: grpc.aio.ServicerContext) -> pb.SendResponse:
        received.append(request)
        return pb.SendResponse(message_id=str(len(received)))

    older = grpc.aio.server()
    older.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "postbox.v1.MessageService",
                {
                    "Send": grpc.unary_unary_rpc_method_handler(
                        send, pb.SendRequest.FromString, pb.SendResponse.SerializeToString
                    )
                },
            ),
        )
    )
    port = older.add_insecure_port("127.0.0.1:0")
    await older.start()
    try:
        async with AsyncClient(f"127.0.0.1:{port}") as client:
            ids = await asyncio.gather(*(client.send("q", f"{i}".encode()) for i in range(10)))
            assert not client.send_stream.supported
            assert await client.send("q", b"later") == "11"
        assert sorted(ids, key=int) == [str(i) for i in range(1, 11)]
        assert sorted(r.body for r in received) == sorted(
            [f"{i}".encode() for i in range(10)] + [b"later"]
        )
    finally:
        await older.stop(None)


async def test_a_stream_has_at_most_1000_sends_in_progress(server, db, queue):
    """Past MAX_IN_PROGRESS unanswered requests the server stops reading the stream; the
    rest wait in gRPC's flow control and go on as answers free room."""
    assert server.metrics_port is not None
    total = MAX_IN_PROGRESS + 100

    def pending() -> float:
        return metric(scrape(server.metrics_port), "postbox_group_commit_pending")

    async with grpc.aio.insecure_channel(server.target) as channel:
        held = db.transaction()
        await held.start()
        try:
            await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
            call = message_service_pb2_grpc.MessageServiceStub(channel).SendStream()

            async def write_all() -> None:
                for tag in range(total):
                    body = f"{tag}".encode()
                    await call.write(
                        pb.SendStreamRequest(tag=tag, send=pb.SendRequest(queue=queue, body=body))
                    )
                await call.done_writing()

            writing = asyncio.ensure_future(write_all())
            # 60 s: 1,000 small requests cross loopback in well under a second, but CI stalls.
            deadline = asyncio.get_running_loop().time() + 60
            while (now := await asyncio.to_thread(pending)) < MAX_IN_PROGRESS:
                assert asyncio.get_running_loop().time() < deadline, f"{now} in progress"
            # The server holds no more than the limit however long the commit waits.
            for _ in range(20):
                assert await asyncio.to_thread(pending) == MAX_IN_PROGRESS
        finally:
            await held.rollback()
        answers = [result async for response in call for result in response.results]
        await writing
    assert sorted(answer.tag for answer in answers) == list(range(total))
    assert all(answer.HasField("sent") for answer in answers)
    assert len(await bodies_by_id(db, queue)) == total


async def test_a_shutdown_ends_an_idle_stream_at_once_with_unavailable(
    own_server: ServerProcess, database_url: str
):
    """An SDK client keeps its send stream open between sends; the server's shutdown ends
    it at once, saying why, rather than cutting it when the grace period runs out."""
    queue = unique_name("send_stream_shutdown")
    async with AsyncClient(own_server.target) as client:
        await client.create_queue(queue)
        async with grpc.aio.insecure_channel(own_server.target) as channel:
            call = message_service_pb2_grpc.MessageServiceStub(channel).SendStream()
            await call.write(pb.SendStreamRequest(tag=1, send=pb.SendRequest(queue=queue)))
            (answer,) = (await call.read()).results
            assert answer.HasField("sent")
            stopping = asyncio.ensure_future(asyncio.to_thread(own_server.stop))
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await call.read()
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in (ended.value.details() or "")
            await stopping
