"""How many claims a waiting stream makes per wake-up: each one is a database round trip,
and at low rates they, not the messages, are most of a server's work. The server runs
in this process, over a real socket and database, so its claims can be counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import seconds, unique_name

from postbox_server.db.engine import Engine
from postbox_server.db.wakeup import ENDED, WakeHub
from postbox_server.services.messages import MessageService


class CountingEngine(Engine):
    """The real engine, counting its claims and noting the receive floors it computes."""

    claims = 0
    looks = 0  # at when a queue's next message becomes visible
    # While set and not open, a look at the next visible time waits for it to open.
    look_gate: asyncio.Event | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.floors: list[tuple[datetime, datetime]] = []  # (asked at, floor)

    async def next_visible_at(self, *args: Any, **kwargs: Any) -> Any:
        self.looks += 1
        if self.look_gate is not None:
            await self.look_gate.wait()
        return await super().next_visible_at(*args, **kwargs)

    async def receive(self, *args: Any, **kwargs: Any) -> Any:
        self.claims += 1
        return await super().receive(*args, **kwargs)

    async def receive_floor(self, queue: str) -> datetime:
        asked_at = datetime.now(timezone.utc)
        floor = await super().receive_floor(queue)
        self.floors.append((asked_at, floor))
        return floor


@dataclass
class InProcess:
    engine: CountingEngine
    messages: message_service_pb2_grpc.MessageServiceStub
    hub: WakeHub

    async def until_listed(self, queue: str) -> None:
        """Until the hub's look at the queue it just listed is over: that look runs once
        the transactions in progress at the listing end (on a loaded machine, seconds
        later), and a look that met a message sent meanwhile would wake the stream a second
        time, which the counts here cannot allow for."""
        for _ in range(1500):
            if self.hub._is_listed(queue) and self.hub.looks_pending == 0:
                return
            await asyncio.sleep(0.02)
        raise AssertionError("the hub still looks at the newly listed queue after 30 s")

    async def until_claims(self, count: int) -> None:
        for _ in range(250):
            if self.engine.claims >= count:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.engine.claims} claims, expected {count}")

    async def settled(self) -> int:
        """The claim count once nothing has claimed for a while."""
        while True:
            before = self.engine.claims
            await asyncio.sleep(0.3)
            if self.engine.claims == before:
                return before


@pytest.fixture
async def in_process(database_url: str, server: Any) -> AsyncIterator[InProcess]:
    engine = await CountingEngine.connect(database_url, pool_size=4)
    # Notifications are the only wake-ups: no trailing look a moment after each one,
    # no safety poll. Either would add a claim at a time the counts cannot allow for.
    hub = WakeHub(database_url, trailing_wake=3600, safety_interval=3600)
    await hub.start()
    grpc_server = grpc.aio.server()
    message_service_pb2_grpc.add_MessageServiceServicer_to_server(
        MessageService(engine, hub, max_message_size=262_144), grpc_server
    )
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield InProcess(engine, message_service_pb2_grpc.MessageServiceStub(channel), hub)
    finally:
        await hub.close()
        await grpc_server.stop(0)
        await engine.close()


@pytest.fixture
async def queue_name(in_process: InProcess, request: pytest.FixtureRequest) -> str:
    name = unique_name(request.node.name)
    await in_process.engine.create_queue(name, {})
    return name


async def _receive(stub: message_service_pb2_grpc.MessageServiceStub, queue: str) -> Any:
    request = pb.ReceiveRequest(queue=queue, max_messages=2, mode=pb.RECEIVE_MODE_CONTINUOUS)
    return stub.Receive(request)


async def _streaming_receive(stub: message_service_pb2_grpc.MessageServiceStub, queue: str) -> Any:
    call = stub.StreamingReceive()
    await call.write(pb.StreamingReceiveRequest(queue=queue, max_messages=2))
    return call


async def _bodies(call: Any) -> list[bytes]:
    while True:
        response = await asyncio.wait_for(call.read(), 5)
        # A Receive response is a batch; a StreamingReceive one may carry settle results.
        batch = response.batch if isinstance(response, pb.StreamingReceiveResponse) else response
        if batch.messages:
            return [m.body for m in batch.messages]


async def test_a_streaming_receive_takes_messages_while_it_looks_at_the_next_visible_time(
    in_process: InProcess, queue_name: str
) -> None:
    """A stream that claimed fewer than it asked for looks up when the queue's next
    message becomes visible (for its timer) beside its wait, not before it: a send that
    commits during that query reaches the stream without waiting for it. Here every
    look is held until the end, so each message can only come while one is under way;
    before, the first look (after the claim of the empty queue) held the stream."""
    gate = in_process.engine.look_gate = asyncio.Event()
    call = await _streaming_receive(in_process.messages, queue_name)
    try:
        await in_process.until_claims(1)  # found the queue empty
        for _ in range(250):
            if in_process.engine.looks:
                break
            await asyncio.sleep(0.02)
        assert in_process.engine.looks == 1
        await in_process.until_listed(queue_name)
        for body in (b"one", b"two"):
            await in_process.engine.send_bodies(queue_name, [body])
            # _bodies waits 5 s at most: generous for a loaded machine, and the held
            # look would hold the message for ever.
            assert await _bodies(call) == [body]
        assert not gate.is_set()
        assert in_process.engine.looks == 1  # still the first look, held
    finally:
        gate.set()
        call.cancel()


@pytest.mark.parametrize("opening", [_receive, _streaming_receive], ids=["Receive", "Streaming"])
async def test_a_stream_that_got_less_than_it_asked_for_waits_without_claiming_again(
    in_process: InProcess, queue_name: str, opening: Callable[..., Awaitable[Any]]
) -> None:
    call = await opening(in_process.messages, queue_name)
    try:
        await in_process.until_claims(1)  # found the queue empty; waits now
        await in_process.until_listed(queue_name)
        # Sent through the SQL API, so its notification is the one wake-up (a Send to
        # this server would also wake the stream itself, at a moment of its own).
        await in_process.engine.send_bodies(queue_name, [b"one"])
        assert await _bodies(call) == [b"one"]
        # The claim that found the message asked for 2: nothing else was visible.
        assert await in_process.settled() == 2

        await in_process.engine.send_bodies(queue_name, [b"a", b"b", b"c"])
        assert await _bodies(call) == [b"a", b"b"]
        assert await _bodies(call) == [b"c"]
        # A full batch claims again at once; the second, with one message, does not.
        assert await in_process.settled() == 4
    finally:
        call.cancel()


async def test_a_send_that_waited_on_a_lock_wakes_a_waiting_stream(
    in_process: InProcess, queue_name: str, database_url: str
) -> None:
    """A send read its clock before waiting on the queue's lock; when it waited over a
    second, the server's receive floor had passed its message, the woken stream looked
    from the floor and missed it, and only the safety poll (here: none) would find it."""
    stub = in_process.messages
    waiting = await _receive(stub, queue_name)
    holder = await asyncpg.connect(database_url)
    # Not the holder: inside its transaction, pg_stat_activity is a snapshot taken once.
    observer = await asyncpg.connect(database_url)
    try:
        await in_process.until_claims(1)  # the stream found the queue empty; it waits now
        # What a purge or a queue drop holds while it runs: sends wait for it.
        await holder.execute("BEGIN")
        await holder.execute(
            "SELECT postbox._lock_queue(q, true) FROM postbox.queues q WHERE q.name = $1",
            queue_name,
        )
        sending = asyncio.ensure_future(stub.Send(pb.SendRequest(queue=queue_name, body=b"late")))
        blocked_at = await _until_a_send_waits_on_a_lock(observer, sending)
        # Other receives make the server compute floors; wait for one computed more than
        # a second after the send began, which today's floor would have put past it.
        passed = blocked_at + timedelta(seconds=1)
        for _ in range(500):
            if any(asked_at > passed for asked_at, _ in in_process.engine.floors):
                break
            poll = stub.Receive(pb.ReceiveRequest(queue=queue_name, wait_time=seconds(0)))
            assert [response async for response in poll] == []
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the server computed no receive floor")
        await holder.execute("COMMIT")
        await sending
        # 10 s: generous on a busy machine, and never reached by a message the stream
        # missed, which waits for a safety poll that is not there.
        reading = asyncio.ensure_future(waiting.read())
        done, _ = await asyncio.wait([reading], timeout=10)
        assert done, "the woken stream looked from a floor past the message and missed it"
        assert [m.body for m in reading.result().messages] == [b"late"]
    finally:
        waiting.cancel()
        await holder.close()
        await observer.close()


async def _until_a_send_waits_on_a_lock(
    conn: asyncpg.Connection, sending: asyncio.Future[Any]
) -> datetime:
    """The database clock once the send waits on the advisory lock (so after it began).
    `conn` must be outside a transaction, which would see one snapshot of the activity."""
    for _ in range(3000):
        if sending.done():
            raise AssertionError(f"the send did not wait on the lock: {sending.result()}")
        if await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory' "
            "AND datname = current_database()"
        ):
            return await conn.fetchval("SELECT clock_timestamp()")
        await asyncio.sleep(0.01)
    raise AssertionError("no send waited on the lock")


# Sends notify only queues a server lists as waited on (postbox.queue_listeners);
# listing a queue races with sends, and these force each side of the race.


async def _notifications(database_url: str) -> tuple[asyncpg.Connection, list[str]]:
    """An observer of the engine's channel, and what it hears."""
    heard: list[str] = []
    observer = await asyncpg.connect(database_url)
    await observer.add_listener("postbox", lambda *args: heard.append(args[3]))
    return observer, heard


async def _until_listed(conn: asyncpg.Connection, queue: str) -> None:
    listed = (
        "SELECT EXISTS (SELECT FROM postbox.queue_listeners l JOIN postbox.queues q "
        "ON q.id = l.queue_id WHERE q.name = $1)"
    )
    for _ in range(500):
        if await conn.fetchval(listed, queue):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{queue} was never listed")


async def _read_one(call: Any) -> list[bytes]:
    # 10 s: generous on a busy machine; a missed wake-up never comes (no safety poll).
    response = await asyncio.wait_for(call.read(), 10)
    return [m.body for m in response.messages]


async def test_a_send_that_looked_for_listeners_before_the_listing_still_wakes_the_stream(
    in_process: InProcess, queue_name: str, database_url: str
) -> None:
    """The send found no listener and commits after the listing: it does not notify,
    and the hub, waiting for the transactions in progress at the listing, looks itself."""
    sender = await asyncpg.connect(database_url)
    observer, heard = await _notifications(database_url)
    call = None
    try:
        await sender.execute("BEGIN")
        await sender.execute("SELECT postbox.send($1, 'early')", queue_name)  # looked: none
        call = await _receive(in_process.messages, queue_name)
        await in_process.until_claims(1)  # found nothing committed; it waits and lists
        await _until_listed(observer, queue_name)
        await sender.execute("COMMIT")
        assert await _read_one(call) == [b"early"]
        assert queue_name not in heard  # woken by the hub's own look, not a NOTIFY
    finally:
        if call is not None:
            call.cancel()
        await sender.close()
        await observer.close()


async def test_a_send_that_committed_while_the_listing_waited_still_wakes_the_stream(
    in_process: InProcess, queue_name: str, database_url: str
) -> None:
    """The send commits after the stream found the queue empty, before the listing
    commits: the hub looks at the queue as soon as it is listed."""
    holder = await asyncpg.connect(database_url)
    observer, heard = await _notifications(database_url)
    call = None
    try:
        call = await _waiting_with_the_listing_held(in_process, queue_name, holder, observer)
        await observer.execute("SELECT postbox.send($1, 'between')", queue_name)
        await holder.execute("COMMIT")
        assert await _read_one(call) == [b"between"]
        assert queue_name not in heard
    finally:
        if call is not None:
            call.cancel()
        await holder.close()
        await observer.close()


async def test_a_send_that_looked_before_the_listing_and_inserts_after_it_still_wakes_the_stream(
    in_process: InProcess, queue_name: str, database_url: str
) -> None:
    """The send looks at the queue (nobody listens yet), then waits to insert while the
    listing commits. It took its transaction id before it looked, so the listing finds
    it in progress and the hub waits for it, then looks itself. A send that took its id
    only when it inserted would be missed: no NOTIFY, and the hub's look over before the
    message is there. The listing drew its own id first (it locks the queue's row), so
    unless another transaction ends meanwhile, the send's id is past the listing
    snapshot's xmax: running, but not among the ids the snapshot lists."""
    listing_held = await asyncpg.connect(database_url)
    insert_held = await asyncpg.connect(database_url)
    sender = await asyncpg.connect(database_url)
    observer, heard = await _notifications(database_url)
    call = None
    try:
        call = await _waiting_with_the_listing_held(in_process, queue_name, listing_held, observer)
        await insert_held.execute("BEGIN")
        await insert_held.execute("LOCK TABLE postbox.messages IN SHARE MODE")
        sending = asyncio.ensure_future(
            sender.execute("SELECT postbox.send($1, 'late')", queue_name)
        )
        await _until_waiting(observer, f"pid = {sender.get_server_pid()}")  # looked; inserts next
        await listing_held.execute("COMMIT")
        for _ in range(1500):  # up to 30 s: the listing's own statements on a loaded machine
            if in_process.hub._is_listed(queue_name) and in_process.hub.looks_pending:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the hub did not wait for the send in progress at the listing")
        await insert_held.execute("ROLLBACK")
        await sending
        assert await _read_one(call) == [b"late"]
        assert queue_name not in heard  # woken by the hub's own look, not a NOTIFY
    finally:
        if call is not None:
            call.cancel()
        for conn in (listing_held, insert_held, sender, observer):
            await conn.close()


async def _waiting_with_the_listing_held(
    in_process: InProcess, queue: str, holder: asyncpg.Connection, observer: asyncpg.Connection
) -> Any:
    """A Receive stream that found the queue empty and waits, its listing held up by
    `holder`'s lock on the listeners (reads pass it, so sends can look for listeners)."""
    await holder.execute("BEGIN")
    await holder.execute("LOCK TABLE postbox.queue_listeners IN EXCLUSIVE MODE")
    call = await _receive(in_process.messages, queue)
    await in_process.until_claims(1)
    await _until_waiting(observer, "query LIKE '%listen_to%'")
    return call


async def _until_waiting(conn: asyncpg.Connection, which: str) -> None:
    """Until a session that `which` picks out of pg_stat_activity waits on a table's lock."""
    for _ in range(1500):  # up to 30 s: a loaded machine starts the statement late
        if await conn.fetchval(
            "SELECT count(*) FROM pg_stat_clear_snapshot(), pg_stat_activity "
            f"WHERE wait_event_type = 'Lock' AND wait_event = 'relation' AND {which} "
            "AND datname = current_database()"
        ):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no session waited on a table's lock where {which}")


async def test_the_look_after_a_listing_waits_for_ids_past_its_snapshot(database_url: str) -> None:
    """A snapshot lists the ids in progress below its xmax, one past the newest id to
    have ended, and counts every id from there on as running without listing it: a
    send holding the newest id, which the listing must wait for, is one of those. Here
    the running transaction draws its id after the snapshot, so it is past the xmax
    whatever else the cluster does, and before the id the hub draws next."""
    observer = await asyncpg.connect(database_url)
    running = await asyncpg.connect(database_url)
    try:
        snapshot = await observer.fetchval("SELECT pg_current_snapshot()::text")
        await running.execute("BEGIN")
        xid = await running.fetchval("SELECT pg_current_xact_id()::text::bigint")
        drawn_after = await observer.fetchval("SELECT pg_current_xact_id()::text::bigint")
        listed = await observer.fetchval(
            "SELECT $2::text::xid8 = ANY (ARRAY(SELECT pg_snapshot_xip($1::text::pg_snapshot)))",
            snapshot,
            str(xid),
        )
        assert not listed
        assert not await observer.fetchval(ENDED, snapshot, drawn_after)
        await running.execute("COMMIT")
        # Other sessions of the cluster (pytest-xdist's other workers, on a shared one)
        # may have had transactions in progress at the snapshot too: they end soon.
        for _ in range(1500):  # up to 30 s on a loaded machine
            if await observer.fetchval(ENDED, snapshot, drawn_after):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the transactions of the snapshot never ended")
    finally:
        await observer.close()
        await running.close()


async def test_a_send_after_the_listing_notifies(
    in_process: InProcess, queue_name: str, database_url: str
) -> None:
    observer, heard = await _notifications(database_url)
    call = None
    try:
        call = await _receive(in_process.messages, queue_name)
        await in_process.until_claims(1)
        await _until_listed(observer, queue_name)
        await observer.execute("SELECT postbox.send($1, 'later')", queue_name)
        assert await _read_one(call) == [b"later"]
        for _ in range(500):  # the observer hears it on its own connection, at its pace
            if queue_name in heard:
                break
            await asyncio.sleep(0.01)
        assert queue_name in heard
    finally:
        if call is not None:
            call.cancel()
        await observer.close()


async def test_a_watch_hands_its_wake_up_on_when_its_stream_will_not_claim(
    database_url: str,
) -> None:
    """WakeHub.watch, the future a StreamingReceive waits on beside its other sources:
    a wake-up goes to one watcher at a time, in order; a watcher that ends without
    claiming (its stream ends) hands the wake-up to the next; a watch asked for after a
    wake-up it has not seen returns None; shutting down ends every watch. Watching and
    waking need no LISTEN connection, so the hub is not started."""
    hub = WakeHub(database_url)
    seen = hub.generation("q")
    first, second = hub.watch("q", seen), hub.watch("q", seen)
    assert first is not None
    assert second is not None
    hub.wake("q")
    assert first.done()
    assert not second.done()
    hub.unwatch("q", first, pass_on=True)
    assert second.done()
    assert hub.watch("q", seen) is None  # woken since `seen`: claim, do not wait
    hub.unwatch("q", second)  # claims: nothing to hand on

    third = hub.watch("q", hub.generation("q"))
    assert third is not None
    closed = hub.closed()
    await hub.close()
    assert third.done()
    assert closed.done()
    assert hub.watch("q", hub.generation("q")) is None
    hub.unwatch("q", third)


async def test_a_wake_up_for_messages_a_claim_took_is_told_apart(database_url: str) -> None:
    """WakeHub.woken_only_for, which spares a stream the empty claim after a send that
    committed just before its claim began and woke the queue just after: true only when
    the one wake-up since the claim began was this server's send of messages the claim
    took. Any other wake-up (a NOTIFY, a timer, a second send) means claim again."""
    hub = WakeHub(database_url)
    seen = hub.generation("q")
    assert not hub.woken_only_for("q", seen, ["7"])  # no wake-up since
    hub.wake("q", sent=["7", "8"])
    assert hub.woken_only_for("q", seen, ["6", "7", "8"])
    assert not hub.woken_only_for("q", seen, ["7"])  # 8 may be there to claim
    hub.wake("q", sent=["9"])
    assert not hub.woken_only_for("q", seen, ["7", "8", "9"])  # two wake-ups since
    seen = hub.generation("q")
    hub.wake("q")  # a NOTIFY or a timer: no ids
    assert not hub.woken_only_for("q", seen, ["9"])
    seen = hub.generation("q")
    hub.wake("q", sent=[str(i) for i in range(101)])  # more ids than it keeps
    assert not hub.woken_only_for("q", seen, [str(i) for i in range(101)])
