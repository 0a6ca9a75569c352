"""A continuous stream claims at most two batches ahead of what its consumer settled."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import create_queue, seconds, unique_name

from postbox_server.services.receive.prefetch import Prefetch


async def in_flight(channel, queue: str) -> int:
    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    return (await queues.GetQueue(qpb.GetQueueRequest(name=queue))).queue.stats.in_flight_messages


async def _continuous(aio_channel, queue: str, messages: int, batch: int):
    """`messages` messages sent, and a continuous stream of batches of `batch` over
    them with 60 s leases; the stub and the call."""
    stub = message_service_pb2_grpc.MessageServiceStub(aio_channel)
    await stub.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=[pb.SendBatchEntry(body=b"x")] * messages)
    )
    call = stub.Receive(
        pb.ReceiveRequest(
            queue=queue, max_messages=batch, mode=pb.RECEIVE_MODE_CONTINUOUS,
            visibility_timeout=seconds(60),
        )
    )  # fmt: skip
    return stub, call


async def test_stream_waits_for_the_consumer_before_claiming_more(aio_channel, queue):
    stub, call = await _continuous(aio_channel, queue, 100, 10)
    first, _ = await call.read(), await call.read()
    # Both batches ahead are out, and the stream waits for the older to be settled
    # (or for its patience of 1 s, which this look comes well inside).
    assert await in_flight(aio_channel, queue) == 20

    loop = asyncio.get_running_loop()
    deleting_at = loop.time()
    await stub.DeleteBatch(
        pb.DeleteBatchRequest(queue=queue, receipts=[m.receipt for m in first.messages])
    )
    # One settled, one more claimed: in the delete's own transaction, so already.
    assert await in_flight(aio_channel, queue) == 20
    await call.read()

    # A consumer that never settles still gets a batch per second of patience. The stream
    # starts its second of patience once it has sent the batch the delete claimed, after
    # `deleting_at` (one monotonic clock for both processes): however long the look
    # above took, the next batch cannot come sooner (0.1 s spared for reading clocks).
    await call.read()
    assert loop.time() - deleting_at >= 0.9  # on the patience, not at once
    assert await in_flight(aio_channel, queue) == 30
    call.cancel()


async def _two_batches_ahead(aio_channel, archived: str, batch: int = 2):
    """A continuous stream of batches of `batch` over four batches' messages, both of
    its batches ahead read: it now waits for the older one to be settled. Returns the
    call, the stub and the two batches."""
    stub, call = await _continuous(aio_channel, archived, 4 * batch, batch)
    return call, stub, await call.read(), await call.read()


async def _transactions(db, table: str, batch) -> set[str]:
    """The transactions that wrote the batch's rows last (their xmin)."""
    ids = [int(m.message_id) for m in batch.messages]
    rows = await db.fetch(
        f"SELECT DISTINCT xmin::text AS x FROM postbox.{table} WHERE id = ANY($1)", ids
    )
    return {row["x"] for row in rows}


async def test_a_delete_batch_of_the_older_batch_commits_with_the_next_claim(
    aio_channel, queues, db
):
    archived = create_queue(queues, unique_name("handed"), archive_on_delete=True).name
    call, stub, older, newer = await _two_batches_ahead(aio_channel, archived)
    try:
        deleted = await stub.DeleteBatch(
            pb.DeleteBatchRequest(queue=archived, receipts=[m.receipt for m in older.messages])
        )
        assert [r.code for r in deleted.results] == [0, 0]
        third = await call.read()
        # The archive rows of the deleted batch and the claimed rows of the third were
        # written by one transaction: the delete went with the claim.
        archived_by = await _transactions(db, "archive", older)
        assert len(archived_by) == 1
        assert await _transactions(db, "messages", third) == archived_by

        # Part of the older batch is not enough to free room: it is deleted on its own,
        # and the stream claims nothing until the rest is settled.
        await stub.DeleteBatch(
            pb.DeleteBatchRequest(queue=archived, receipts=[newer.messages[0].receipt])
        )
        alone = await _transactions(db, "archive", pb.ReceiveResponse(messages=newer.messages[:1]))
        assert alone.isdisjoint(await _transactions(db, "messages", third))
        assert await in_flight(aio_channel, archived) == 3
        await stub.DeleteBatch(
            pb.DeleteBatchRequest(queue=archived, receipts=[newer.messages[1].receipt])
        )
        fourth = await call.read()
        assert [m.receive_count for m in fourth.messages] == [1, 1]
    finally:
        call.cancel()


async def test_a_delete_batch_for_a_stream_that_ended_deletes_on_its_own(aio_channel, queues, db):
    archived = create_queue(queues, unique_name("ended"), archive_on_delete=True).name
    call, stub, older, _ = await _two_batches_ahead(aio_channel, archived)
    call.cancel()
    deleted = await stub.DeleteBatch(
        pb.DeleteBatchRequest(queue=archived, receipts=[m.receipt for m in older.messages])
    )
    assert [r.code for r in deleted.results] == [0, 0]
    assert len(await _transactions(db, "archive", older)) == 1


async def _waiting_window(receipts: list[list[str]]):
    """A window (of the server's own code, no server) with these batches delivered, and
    a task waiting in room() for the older one to be settled."""
    prefetch = Prefetch()

    async def never(receipts: list[str]) -> int:
        return len(receipts)  # all still in flight: only local settles count

    window = prefetch.open(never, "q")
    for batch in receipts:
        window.delivered(batch)
    waiting = asyncio.ensure_future(window.room(patience=60))
    await asyncio.sleep(0)  # into room()
    return prefetch, window, waiting


async def test_only_the_whole_older_batch_of_a_waiting_stream_is_handed():
    prefetch, _, waiting = await _waiting_window([["a", "b"], ["c", "d"]])
    assert prefetch.hand("q", ["a"]) is None  # part of it
    assert prefetch.hand("q", ["c", "d"]) is None  # not the older batch
    assert prefetch.hand("other", ["a", "b"]) is None  # another queue's receipts
    assert prefetch.hand("q", ["x"]) is None  # no stream's
    handed = prefetch.hand("q", ["b", "a", "a"])
    assert handed is not None
    assert handed.receipts == ["b", "a", "a"]
    assert prefetch.hand("q", ["b", "a"]) is None  # already handed
    assert await waiting is handed
    prefetch.settled(["a", "b"])  # the DeleteBatch's own settle finds nothing left
    assert not handed.outcomes.done()  # until the claim's call ends


async def test_handed_deletes_come_back_when_the_stream_leaves_first():
    prefetch, window, waiting = await _waiting_window([["a", "b"], ["c", "d"]])
    handed = prefetch.hand("q", ["a", "b"])  # a DeleteBatch hands the stream its deletes ...
    assert handed is not None
    window.close()  # ... and the call ends (its done callback) before room() took them
    assert handed.outcomes.result() is None  # the DeleteBatch deletes them itself
    assert await waiting is None

    prefetch, window, waiting = await _waiting_window([["a", "b"], ["c", "d"]])
    assert prefetch.hand("q", ["a", "b"]) is not None
    handed = await waiting
    failed: asyncio.Future[tuple[list[str], object]] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("the claim failed"))
    handed.claimed(failed)
    assert handed.outcomes.result() is None
    window.close()


async def test_handed_deletes_learn_their_outcomes_from_the_claim():
    prefetch, _, waiting = await _waiting_window([["a", "b"], ["c", "d"]])
    assert prefetch.hand("q", ["a", "b"]) is not None
    handed = await waiting
    call: asyncio.Future[tuple[list[str], object]] = asyncio.get_running_loop().create_future()
    call.set_result((["ok", "stale"], []))
    handed.claimed(call)
    assert handed.outcomes.result() == ["ok", "stale"]


async def test_a_delete_of_the_older_batch_of_one_commits_with_the_next_claim(
    aio_channel, queues, db
):
    archived = create_queue(queues, unique_name("handed1"), archive_on_delete=True).name
    call, stub, older, newer = await _two_batches_ahead(aio_channel, archived, batch=1)
    try:
        await stub.Delete(pb.DeleteRequest(queue=archived, receipt=older.messages[0].receipt))
        third = await call.read()
        archived_by = await _transactions(db, "archive", older)
        assert len(archived_by) == 1
        assert await _transactions(db, "messages", third) == archived_by

        # A handed delete that finds its message gone (deleted behind the stream's
        # back, as through another replica) says so, as a Delete on its own does,
        # and the stream claims on.
        await db.execute(
            "DELETE FROM postbox.messages WHERE id = $1", int(newer.messages[0].message_id)
        )
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Delete(pb.DeleteRequest(queue=archived, receipt=newer.messages[0].receipt))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert (await call.read()).messages[0].receive_count == 1
    finally:
        call.cancel()
