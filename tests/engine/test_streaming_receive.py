"""StreamingReceive through the real server: batches out, settles in, flow control, errors."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import asyncpg
import grpc
import pytest
from postbox.v1 import message_pb2, message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import seconds, until

OK = grpc.StatusCode.OK.value[0]


@pytest.fixture
def stub(aio_channel) -> message_service_pb2_grpc.MessageServiceStub:
    return message_service_pb2_grpc.MessageServiceStub(aio_channel)


async def fill(stub, queue: str, count: int) -> None:
    for start in range(0, count, 1000):
        entries = [pb.SendBatchEntry(body=f"m{i}".encode()) for i in range(start, count)][:1000]
        await stub.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))


class Stream:
    """A StreamingReceive call whose reads can be waited for with a timeout and resumed
    (cancelling a read would cancel the call)."""

    def __init__(self, call) -> None:
        self.call = call
        self._reading: asyncio.Future | None = None

    async def write(self, **fields) -> None:
        await self.call.write(pb.StreamingReceiveRequest(**fields))

    async def read(self, timeout: float = 5.0) -> pb.StreamingReceiveResponse:
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.call.read())
        done, _ = await asyncio.wait([self._reading], timeout=timeout)
        if not done:
            raise asyncio.TimeoutError
        response, self._reading = self._reading.result(), None
        assert response is not grpc.aio.EOF, f"stream ended: {await self.call.code()}"
        return response

    async def nothing_within(self, seconds: float) -> bool:
        try:
            await self.read(seconds)
        except asyncio.TimeoutError:
            return True
        return False

    async def end(self) -> grpc.StatusCode:
        """Half-closes (again, harmlessly); the status once the server has ended the stream."""
        await self.call.done_writing()
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.call.read())
        assert await asyncio.wait_for(self._reading, 5) is grpc.aio.EOF
        return await self.call.code()

    def cancel(self) -> None:
        self.call.cancel()


async def open_stream(stub, queue: str, **fields) -> Stream:
    stream = Stream(stub.StreamingReceive())
    await stream.write(queue=queue, **fields)
    return stream


async def test_settles_on_the_stream_drain_the_queue(stub, queue):
    await fill(stub, queue, 25)
    call = await open_stream(stub, queue, max_messages=10, max_outstanding_messages=10)
    seen = []
    while len(seen) < 25:
        batch = (await call.read()).batch.messages
        assert 1 <= len(batch) <= 10
        seen.extend(m.body for m in batch)
        await call.write(delete_receipts=[m.receipt for m in batch])
        results = (await call.read()).settle_results
        assert [r.code for r in results.deletes] == [OK] * len(batch)
    assert await call.end() == grpc.StatusCode.OK
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(25))
    peek = await stub.PeekMessages(pb.PeekMessagesRequest(queue=queue))
    assert list(peek.messages) == []


async def test_no_more_than_max_outstanding_until_settled(stub, queue):
    await fill(stub, queue, 20)
    call = await open_stream(stub, queue, max_messages=4, max_outstanding_messages=6)
    first = (await call.read()).batch.messages
    second = (await call.read()).batch.messages
    assert (len(first), len(second)) == (4, 2)  # the second batch only fills the room left
    assert await call.nothing_within(0.5)
    await call.write(delete_receipts=[m.receipt for m in first])
    assert [r.code for r in (await call.read()).settle_results.deletes] == [OK] * 4
    assert len((await call.read()).batch.messages) == 4
    call.cancel()


async def test_settle_results_say_what_happened_to_each_receipt(stub, queue):
    await fill(stub, queue, 3)
    call = await open_stream(stub, queue, max_messages=3)
    first, second, third = (await call.read()).batch.messages
    await stub.ChangeVisibility(
        pb.ChangeVisibilityRequest(
            queue=queue, receipt=third.receipt, visibility_timeout=seconds(0)
        )
    )
    redelivered = (await call.read()).batch.messages
    assert [m.message_id for m in redelivered] == [third.message_id]
    await call.write(
        delete_receipts=[first.receipt, third.receipt, "not a receipt"],
        nack_receipts=[second.receipt],
        visibility_changes=[
            pb.ChangeVisibilityBatchEntry(
                receipt=redelivered[0].receipt, visibility_timeout=seconds(600)
            )
        ],
    )
    results = (await call.read()).settle_results
    assert [r.code for r in results.deletes] == [
        OK,
        grpc.StatusCode.FAILED_PRECONDITION.value[0],
        grpc.StatusCode.INVALID_ARGUMENT.value[0],
    ]
    assert [r.code for r in results.nacks] == [OK]
    assert [r.code for r in results.visibility_changes] == [OK]
    call.cancel()
    nacked = await stub.GetMessage(pb.GetMessageRequest(queue=queue, message_id=second.message_id))
    assert nacked.message.state == message_pb2.MESSAGE_STATE_DELAYED
    extended = await stub.GetMessage(pb.GetMessageRequest(queue=queue, message_id=third.message_id))
    assert extended.message.state == message_pb2.MESSAGE_STATE_IN_FLIGHT


async def test_extended_messages_keep_counting(stub, queue):
    await fill(stub, queue, 4)
    call = await open_stream(
        stub, queue, max_messages=2, max_outstanding_messages=2, visibility_timeout=seconds(1)
    )
    batch = (await call.read()).batch.messages
    await call.write(
        visibility_changes=[
            pb.ChangeVisibilityBatchEntry(receipt=m.receipt, visibility_timeout=seconds(60))
            for m in batch
        ]
    )
    assert [r.code for r in (await call.read()).settle_results.visibility_changes] == [OK, OK]
    # Past the first lease, the extended messages still hold the stream's room.
    assert await call.nothing_within(1.5)
    call.cancel()


async def test_a_lease_that_runs_out_frees_its_room(stub, queue):
    await fill(stub, queue, 4)
    call = await open_stream(
        stub, queue, max_messages=2, max_outstanding_messages=2, visibility_timeout=seconds(0.5)
    )
    first = (await call.read()).batch.messages
    second = (await call.read(timeout=3)).batch.messages
    assert len(second) == 2
    assert {m.message_id for m in first}.isdisjoint(m.message_id for m in second)
    call.cancel()


async def test_a_delete_by_call_frees_room_too(stub, queue):
    await fill(stub, queue, 4)
    call = await open_stream(stub, queue, max_messages=2, max_outstanding_messages=2)
    batch = (await call.read()).batch.messages
    await stub.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in batch]))
    assert len((await call.read(timeout=2)).batch.messages) == 2
    call.cancel()


async def test_waits_for_sends_and_wakes_on_them(stub, queue):
    call = await open_stream(stub, queue, max_messages=5)
    assert await call.nothing_within(0.3)
    await stub.Send(pb.SendRequest(queue=queue, body=b"late"))
    (message,) = (await call.read(timeout=2)).batch.messages
    assert message.body == b"late"
    call.cancel()


async def test_concurrent_streams_get_every_message_once(stub, queue):
    total = 2000
    await fill(stub, queue, total)
    counts: Counter[str] = Counter()

    async def consume() -> None:
        call = await open_stream(stub, queue, max_messages=10, max_outstanding_messages=20)
        try:
            while sum(counts.values()) < total:
                try:
                    response = await call.read(timeout=1)
                except asyncio.TimeoutError:
                    continue
                if response.HasField("batch"):
                    counts.update(m.message_id for m in response.batch.messages)
                    await call.write(delete_receipts=[m.receipt for m in response.batch.messages])
                else:
                    assert all(r.code == OK for r in response.settle_results.deletes)
        finally:
            call.cancel()

    await asyncio.wait_for(asyncio.gather(*(consume() for _ in range(4))), 60)
    assert len(counts) == total
    assert set(counts.values()) == {1}


async def test_client_half_close_gets_its_last_results(stub, queue):
    await fill(stub, queue, 2)
    call = await open_stream(stub, queue, max_messages=2)
    batch = (await call.read()).batch.messages
    await call.write(delete_receipts=[m.receipt for m in batch])
    await call.call.done_writing()
    assert [r.code for r in (await call.read()).settle_results.deletes] == [OK, OK]
    assert await call.end() == grpc.StatusCode.OK


async def status_of(stub, *requests: pb.StreamingReceiveRequest) -> tuple[grpc.StatusCode, str]:
    call = stub.StreamingReceive()
    for request in requests:
        await call.write(request)
    await call.done_writing()
    return await final_status(call)


async def final_status(call) -> tuple[grpc.StatusCode, str]:
    """Reads the call to its end; its status code and details."""
    try:
        while await asyncio.wait_for(call.read(), 5) is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details()
    return await call.code(), await call.details()


@pytest.mark.parametrize(
    ("first", "later", "says"),
    [
        (pb.StreamingReceiveRequest(), None, "name the queue"),
        (pb.StreamingReceiveRequest(queue="{queue}", max_messages=1001), None, "max_messages"),
        (
            pb.StreamingReceiveRequest(queue="{queue}", max_outstanding_messages=10_001),
            None,
            "max_outstanding_messages",
        ),
        (
            pb.StreamingReceiveRequest(queue="{queue}", visibility_timeout=seconds(43_201)),
            None,
            "visibility_timeout",
        ),
        (
            pb.StreamingReceiveRequest(queue="{queue}"),
            pb.StreamingReceiveRequest(queue="{queue}"),
            "first request only",
        ),
        (
            pb.StreamingReceiveRequest(queue="{queue}"),
            pb.StreamingReceiveRequest(delete_receipts=["1:x"] * 1001),
            "at most 1000",
        ),
        (
            pb.StreamingReceiveRequest(queue="{queue}"),
            pb.StreamingReceiveRequest(
                visibility_changes=[pb.ChangeVisibilityBatchEntry(receipt="1:x")]
            ),
            "visibility_timeout is required",
        ),
    ],
)
async def test_bad_requests_are_invalid_argument(stub, queue, first, later, says):
    requests = [r for r in (first, later) if r is not None]
    for request in requests:
        if request.queue:
            request.queue = queue
    code, details = await status_of(stub, *requests)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert says in details


async def test_missing_queue_is_not_found(stub):
    code, _ = await status_of(stub, pb.StreamingReceiveRequest(queue="no_such_queue"))
    assert code == grpc.StatusCode.NOT_FOUND


async def test_an_empty_request_stream_is_invalid(stub):
    code, details = await status_of(stub)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "first request" in details


async def test_undecodable_request_is_invalid_argument(aio_channel, queue):
    method = aio_channel.stream_stream(
        "/postbox.v1.MessageService/StreamingReceive",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.StreamingReceiveResponse.FromString,
    )
    call = method()
    await call.write(pb.StreamingReceiveRequest(queue=queue).SerializeToString())
    await call.write(b"\x2a\x02\xff\xfe")  # field 5 (a string) holding invalid UTF-8
    await call.done_writing()
    code, details = await final_status(call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "could not be decoded" in details


async def test_a_receive_paused_queue_is_unavailable_at_open(stub, aio_channel, queue):
    queues = queue_service_pb2_grpc.QueueServiceStub(aio_channel)
    await queues.PauseQueue(qpb.PauseQueueRequest(name=queue, receives=True))
    code, details = await status_of(stub, pb.StreamingReceiveRequest(queue=queue))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert "paused" in details


@pytest.fixture
async def settle_transactions(db):
    """The top-level transaction of each claim (an UPDATE that sets a lease) and each
    delete of a message, as a trigger saw them."""
    await db.execute(
        """
        CREATE TABLE public.settle_probe (message_id bigint, op text, top_xid bigint);
        CREATE FUNCTION public.settle_probe() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'DELETE' THEN
                INSERT INTO public.settle_probe VALUES (OLD.id, 'delete', txid_current());
            ELSIF NEW.lease IS DISTINCT FROM OLD.lease AND NEW.lease IS NOT NULL THEN
                INSERT INTO public.settle_probe VALUES (NEW.id, 'claim', txid_current());
            END IF;
            RETURN NULL;
        END $$;
        CREATE TRIGGER settle_probe AFTER UPDATE OR DELETE ON postbox.messages
            FOR EACH ROW EXECUTE FUNCTION public.settle_probe();
        """
    )

    async def transactions(op: str, ids: list[str]) -> set[int]:
        rows = await db.fetch(
            "SELECT DISTINCT top_xid FROM public.settle_probe "
            "WHERE op = $1 AND message_id = ANY($2::bigint[])",
            op,
            [int(i) for i in ids],
        )
        return {row[0] for row in rows}

    try:
        yield transactions
    finally:
        await db.execute(
            "DROP TRIGGER settle_probe ON postbox.messages;"
            "DROP FUNCTION public.settle_probe(); DROP TABLE public.settle_probe"
        )


async def full_stream(stub, queue: str) -> tuple[Stream, list]:
    """A stream holding as many unsettled messages as it may (10 of the queue's 20), so
    that it waits for its consumer's deletes before it claims again."""
    await fill(stub, queue, 20)
    call = await open_stream(stub, queue, max_messages=10, max_outstanding_messages=10)
    first = (await call.read()).batch.messages
    assert len(first) == 10
    # Nothing more comes while the stream is full; by now its generator has gone
    # back to waiting for room, where it takes the deletes that free some.
    assert await call.nothing_within(0.3)
    return call, list(first)


async def test_deletes_that_free_room_go_with_the_next_claim(stub, queue, settle_transactions):
    call, first = await full_stream(stub, queue)
    await call.write(delete_receipts=[m.receipt for m in first])
    assert [r.code for r in (await call.read()).settle_results.deletes] == [OK] * 10
    second = (await call.read()).batch.messages
    assert len(second) == 10
    deleted_in = await settle_transactions("delete", [m.message_id for m in first])
    claimed_in = await settle_transactions("claim", [m.message_id for m in second])
    assert len(deleted_in) == 1
    assert deleted_in == claimed_in  # one call, one commit
    call.cancel()


async def test_deletes_are_kept_when_the_claim_with_them_fails(stub, aio_channel, queue):
    """The claim that takes the deletes fails (receives paused after the stream opened),
    which undoes the deletes with it: they are made on their own, and say OK."""
    call, first = await full_stream(stub, queue)
    queues = queue_service_pb2_grpc.QueueServiceStub(aio_channel)
    await queues.PauseQueue(qpb.PauseQueueRequest(name=queue, receives=True))
    await call.write(delete_receipts=[m.receipt for m in first])
    assert [r.code for r in (await call.read()).settle_results.deletes] == [OK] * 10
    assert await call.nothing_within(0.5)  # paused: the stream waits on
    peek = await stub.PeekMessages(pb.PeekMessagesRequest(queue=queue))
    assert {m.message_id for m in peek.messages}.isdisjoint(m.message_id for m in first)
    assert len(peek.messages) == 10
    call.cancel()


@contextlib.asynccontextmanager
async def first_delete_waiting(call: Stream, db, database_url: str, message):
    """Deletes `message` on the stream while its row lock is held on purpose: inside the
    block that delete waits in the database; the lock goes at the block's end."""
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute(
                "SELECT FROM postbox.messages WHERE id = $1 FOR UPDATE", int(message.message_id)
            )
            await call.write(delete_receipts=[message.receipt])
            await until(
                db,
                "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%delete_batch%' AND datname = current_database()",
            )
            yield
    finally:
        await holder.close()


async def delete_results(call: Stream, count: int) -> list[int]:
    """The codes of the next `count` settle results, each of a one-receipt request."""
    codes = []
    while len(codes) < count:
        response = await call.read()
        if response.HasField("settle_results"):
            assert len(response.settle_results.deletes) == 1  # one result per request
            codes.append(response.settle_results.deletes[0].code)
    return codes


async def test_deletes_that_arrive_during_a_settle_go_together_next(
    stub, queue, db, database_url, settle_transactions
):
    """One-message deletes (as a consumer with several handlers sends them) that arrive
    while a delete waits in the database go to it in one call, each with its own result."""
    call, first = await full_stream(stub, queue)
    async with first_delete_waiting(call, db, database_url, first[0]):
        for message in first[1:]:
            await call.write(delete_receipts=[message.receipt])
        # The server reads a stream's requests as they come, while its settle task waits,
        # but nothing it shows says that it has read them. A call on the same connection,
        # sent after the nine and answered from the database, gives its loop the turns
        # to: without it a loaded machine once saw four calls for the nine.
        await stub.PeekMessages(pb.PeekMessagesRequest(queue=queue))
    assert await delete_results(call, 10) == [OK] * 10
    later = [await settle_transactions("delete", [m.message_id]) for m in first[1:]]
    # All nine in one call in every run so far; two if the last one was still on
    # its way when the lock went. One call each without the gathering.
    assert len(set().union(*later)) <= 2
    first_in = await settle_transactions("delete", [first[0].message_id])
    assert first_in.isdisjoint(set().union(*later))
    call.cancel()


async def test_a_bad_request_ends_the_stream_after_the_settles_before_it(stub, queue):
    call, first = await full_stream(stub, queue)
    for message in first:
        await call.write(delete_receipts=[message.receipt])
    await call.write(queue=queue)  # only the first request may name the queue
    statuses = []
    try:
        while (response := await call.read()) is not grpc.aio.EOF:
            statuses.extend(r.code for r in response.settle_results.deletes)
    except grpc.aio.AioRpcError as error:
        code = error.code()
    else:
        code = await call.code()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert statuses == [OK] * 10
    peek = await stub.PeekMessages(pb.PeekMessagesRequest(queue=queue))
    assert {m.message_id for m in peek.messages}.isdisjoint(m.message_id for m in first)


async def test_more_requests_than_are_read_ahead_are_all_settled_in_order(
    stub, queue, db, database_url
):
    """While a delete waits in the database the server reads up to MAX_WAITING_REQUESTS
    (100) requests ahead and then stops reading; those behind them are read as the
    first ones are settled, and each gets its result in request order."""
    call, first = await full_stream(stub, queue)
    # 150 requests, each for a receipt no message has (as one a client kept too
    # long), then the stream's other nine.
    stale = [f"{first[0].message_id}:{i:08d}-0000-0000-0000-000000000000" for i in range(141)]
    async with first_delete_waiting(call, db, database_url, first[0]):
        for receipt in stale + [m.receipt for m in first[1:]]:
            await call.write(delete_receipts=[receipt])
    codes = await delete_results(call, 151)
    assert codes[0] == OK
    assert OK not in codes[1:142]
    assert codes[142:] == [OK] * 9
    call.cancel()
