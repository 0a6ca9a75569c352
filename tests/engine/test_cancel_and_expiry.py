"""A producer's control over a message it sent: CancelMessage, and a message's own
expiry (SendRequest.ttl and expire_time), through the real server and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import asyncpg
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from support import create_queue, error_of, eventually, receive, seconds, unique_name


def _cancel(messages, queue: str, message_id: str):
    return messages.CancelMessage(pb.CancelMessageRequest(queue=queue, message_id=message_id))


def _archived(messages, queue: str) -> list[msg.ArchivedMessage]:
    request = pb.ListArchivedMessagesRequest(queue=queue)
    return list(messages.ListArchivedMessages(request).messages)


def test_a_waiting_or_delayed_message_is_cancelled_and_never_delivered(messages, queues):
    queue = create_queue(queues, unique_name("cancel"), archive_on_delete=True).name
    waiting = messages.Send(pb.SendRequest(queue=queue, body=b"waiting")).message_id
    delayed = messages.Send(pb.SendRequest(queue=queue, body=b"later", delay=seconds(1))).message_id
    kept = messages.Send(pb.SendRequest(queue=queue, body=b"kept")).message_id
    _cancel(messages, queue, waiting)
    _cancel(messages, queue, delayed)
    assert [m.message_id for m in receive(messages, queue, count=10)] == [kept]
    archived = {a.message.message_id: a.reason for a in _archived(messages, queue)}
    assert archived == {
        waiting: msg.ARCHIVE_REASON_CANCELLED,
        delayed: msg.ARCHIVE_REASON_CANCELLED,
    }
    again = error_of(_cancel, messages, queue, waiting)
    assert again.code() == grpc.StatusCode.NOT_FOUND
    assert "is not in queue" in again.details()


def test_a_message_a_consumer_holds_is_not_cancelled_until_its_lease_runs_out(messages, queue):
    sent = messages.Send(pb.SendRequest(queue=queue, body=b"held")).message_id
    (held,) = receive(messages, queue, visibility=30)
    refused = error_of(_cancel, messages, queue, sent)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "in flight" in refused.details()
    # The consumer lets go (visibility 0): nobody holds it now.
    messages.ChangeVisibility(
        pb.ChangeVisibilityRequest(queue=queue, receipt=held.receipt, visibility_timeout=seconds(0))
    )
    _cancel(messages, queue, sent)
    assert receive(messages, queue, wait=0) == []


async def test_a_cancel_in_progress_hides_the_message_from_receivers(messages, queue, db):
    """The cancel's row lock is held open (its transaction not committed) while a
    receive runs: the receive skips the message, and after the commit it is gone."""
    sent = int(messages.Send(pb.SendRequest(queue=queue, body=b"contested")).message_id)
    async with db.transaction():
        await db.execute("SELECT postbox.cancel_message($1, $2)", queue, sent)
        got = await asyncio.to_thread(receive, messages, queue, wait=0)
        assert got == []
    assert await asyncio.to_thread(receive, messages, queue, wait=0) == []


async def test_a_cancel_that_rolls_back_leaves_the_message_deliverable(messages, queue, db):
    sent = messages.Send(pb.SendRequest(queue=queue, body=b"kept")).message_id

    async def cancel_then_fail() -> None:
        async with db.transaction():
            await db.execute("SELECT postbox.cancel_message($1, $2)", queue, int(sent))
            await db.execute("DO $$ BEGIN RAISE EXCEPTION 'changed my mind'; END $$")

    with pytest.raises(asyncpg.RaiseError, match="changed my mind"):
        await cancel_then_fail()
    assert [m.message_id for m in receive(messages, queue, wait=0)] == [sent]


def test_cancel_refuses_what_is_not_a_message_id(messages, queue):
    bad = error_of(_cancel, messages, queue, "12; DROP")
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT


def _timestamp(when: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(when)
    return stamp


async def _expire_now(db: asyncpg.Connection, message_id: str) -> None:
    """Moves a message's own expiry into the past, as if its ttl had run out:
    on the message, and where maintenance looks for due ones."""
    await db.execute(
        "WITH m AS (UPDATE postbox.messages SET expires_at = now() - interval '1 second' "
        "WHERE id = $1 RETURNING id, expires_at) "
        "UPDATE postbox.message_expiries e SET expires_at = m.expires_at "
        "FROM m WHERE e.message_id = m.id",
        int(message_id),
    )


async def test_a_message_past_its_ttl_is_never_delivered_and_is_archived_as_expired(
    messages, queues, db
):
    queue = create_queue(queues, unique_name("ttl"), archive_on_delete=True).name
    doomed = messages.Send(pb.SendRequest(queue=queue, body=b"doomed", ttl=seconds(60)))
    lasting = messages.Send(pb.SendRequest(queue=queue, body=b"lasting", ttl=seconds(3600)))
    (peeked, _) = messages.PeekMessages(pb.PeekMessagesRequest(queue=queue)).messages
    expected = datetime.now(timezone.utc) + timedelta(seconds=60)
    assert abs(peeked.expire_time.ToDatetime(timezone.utc) - expected) < timedelta(seconds=30)
    await _expire_now(db, doomed.message_id)
    got = await asyncio.to_thread(receive, messages, queue, count=10, wait=0)
    assert [m.body for m in got] == [b"lasting"]
    assert got[0].message_id == lasting.message_id

    def archived_as_expired() -> bool:
        return [(a.message.body, a.reason) for a in _archived(messages, queue)] == [
            (b"doomed", msg.ARCHIVE_REASON_EXPIRED)
        ]

    # Receive removed it on its way, or the maintenance worker (0.5 s in tests) did.
    await asyncio.to_thread(eventually, archived_as_expired, 10, "archived as expired")


async def test_expire_time_and_batch_entries_expire_too(messages, queue, db):
    soon = datetime.now(timezone.utc) + timedelta(hours=1)
    sent = messages.SendBatch(
        pb.SendBatchRequest(
            queue=queue,
            entries=[
                pb.SendBatchEntry(body=b"a", expire_time=_timestamp(soon)),
                pb.SendBatchEntry(body=b"b", ttl=seconds(3600)),
                pb.SendBatchEntry(body=b"c"),
            ],
        )
    )
    for message_id in sent.message_ids[:2]:
        await _expire_now(db, message_id)
    got = await asyncio.to_thread(receive, messages, queue, count=10, wait=0)
    assert [m.body for m in got] == [b"c"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"ttl": seconds(0)}, "ttl"),
        ({"ttl": seconds(-5)}, "ttl"),
        ({"ttl": seconds(5), "delay": seconds(10)}, "would expire"),
        ({"expire_time": Timestamp(seconds=1)}, "would expire"),
    ],
)
def test_an_expiry_no_message_could_live_to_see_is_invalid(messages, queue, fields, says):
    error = error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x", **fields))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    assert receive(messages, queue, wait=0) == []


async def test_a_dedupe_key_replacement_takes_the_new_expiry(messages, queue, db):
    first = messages.Send(pb.SendRequest(queue=queue, body=b"v1", dedupe_key="k", ttl=seconds(60)))
    second = messages.Send(pb.SendRequest(queue=queue, body=b"v2", dedupe_key="k"))
    assert second.message_id == first.message_id
    expires = await db.fetchval(
        "SELECT expires_at FROM postbox.messages WHERE id = $1", int(first.message_id)
    )
    assert expires is None


# A message's own expiry is kept twice: on the message (which receive and peek
# read) and in postbox.message_expiries (where maintenance finds the due ones,
# since 0.9.0). Each way a message leaves must take its expiry row along, or
# the table would keep rows for messages long gone.
EXPIRIES = (
    "SELECT message_id, expires_at FROM postbox.message_expiries "
    "WHERE message_id = ANY($1::bigint[])"
)
SEND_WITH_TTL = "SELECT postbox.send($1, 'x', ttl => '1 hour')"


async def _expiries(db: asyncpg.Connection, *ids: int) -> dict[int, datetime]:
    return {row["message_id"]: row["expires_at"] for row in await db.fetch(EXPIRIES, list(ids))}


async def _assert_gone(db: asyncpg.Connection, message_id: int) -> None:
    """The message and its expiry row are both gone."""
    exists = "SELECT EXISTS (SELECT FROM postbox.messages WHERE id = $1)"
    assert not await db.fetchval(exists, message_id)
    assert await _expiries(db, message_id) == {}


async def _receive_and_delete(db: asyncpg.Connection, queue: str) -> int:
    (got,) = await db.fetch("SELECT message_id, receipt FROM postbox.receive($1, 1)", queue)
    delete = "SELECT outcome FROM postbox.delete_batch($1, ARRAY[$2])"
    outcomes = await db.fetch(delete, queue, got["receipt"])
    assert [row["outcome"] for row in outcomes] == ["ok"]
    return got["message_id"]


async def test_a_message_has_an_expiry_row_exactly_when_it_has_an_expiry(queues, db):
    queue = create_queue(queues, unique_name("expiry_rows")).name
    until = datetime.now(timezone.utc) + timedelta(hours=2)
    ttl = await db.fetchval(SEND_WITH_TTL, queue)
    at = await db.fetchval("SELECT postbox.send($1, 'x', expire_at => $2)", queue, until)
    (batch_ttl, batch_none) = [
        row[0]
        for row in await db.fetch(
            "SELECT message_id FROM postbox.send_batch($1, ARRAY['a', 'b']::bytea[], "
            "ttls => ARRAY[interval '1 hour', NULL])",
            queue,
        )
    ]
    plain = await db.fetchval("SELECT postbox.send($1, 'x')", queue)
    on_messages = {
        row["id"]: row["expires_at"]
        for row in await db.fetch(
            "SELECT id, expires_at FROM postbox.messages WHERE id = ANY($1::bigint[]) "
            "AND expires_at IS NOT NULL",
            [ttl, at, batch_ttl, batch_none, plain],
        )
    }
    assert set(on_messages) == {ttl, at, batch_ttl}
    assert await _expiries(db, ttl, at, batch_ttl, batch_none, plain) == on_messages


async def test_a_dedupe_key_replacement_moves_or_removes_the_expiry_row(queues, db):
    queue = create_queue(queues, unique_name("expiry_rows_key")).name
    keyed = "SELECT postbox.send($1, $2::bytea, dedupe_key => 'k', ttl => $3::interval)"
    first = await db.fetchval(keyed, queue, b"v1", timedelta(hours=1))
    (hour,) = (await _expiries(db, first)).values()
    assert await db.fetchval(keyed, queue, b"v2", timedelta(hours=3)) == first
    (later,) = (await _expiries(db, first)).values()
    assert later - hour > timedelta(hours=1, minutes=59)
    assert await db.fetchval(keyed, queue, b"v3", None) == first
    assert await _expiries(db, first) == {}


async def test_every_way_a_message_leaves_takes_its_expiry_row_along(queues, db):
    plain = create_queue(queues, unique_name("expiry_rows_plain")).name
    archiving = create_queue(queues, unique_name("expiry_rows_arch"), archive_on_delete=True).name
    purged = create_queue(queues, unique_name("expiry_rows_purge")).name
    dropped = create_queue(queues, unique_name("expiry_rows_drop")).name

    # delete_batch's plain path, and _remove's archiving one.
    for queue in (plain, archiving):
        sent = await db.fetchval(SEND_WITH_TTL, queue)
        assert await _receive_and_delete(db, queue) == sent
        await _assert_gone(db, sent)

    cancelled = await db.fetchval(SEND_WITH_TTL, plain)
    await db.execute("SELECT postbox.cancel_message($1, $2)", plain, cancelled)
    await _assert_gone(db, cancelled)

    # Past its expiry: a receive meets it first, or else maintenance.
    met = await db.fetchval(SEND_WITH_TTL, plain)
    await _expire_now(db, str(met))
    assert await db.fetch("SELECT * FROM postbox.receive($1, 1)", plain) == []
    await _assert_gone(db, met)
    swept = await db.fetchval(SEND_WITH_TTL, plain)
    await _expire_now(db, str(swept))
    assert await db.fetchval("SELECT postbox.expire_messages(1000)") >= 1
    await _assert_gone(db, swept)

    in_purged = await db.fetchval(SEND_WITH_TTL, purged)
    assert await db.fetchval("SELECT postbox.purge_queue($1)", purged) == 1
    assert await _expiries(db, in_purged) == {}
    in_dropped = await db.fetchval(SEND_WITH_TTL, dropped)
    await db.execute("SELECT postbox.drop_queue($1)", dropped)
    assert await _expiries(db, in_dropped) == {}
