"""Sends with relaxed_durability commit with synchronous_commit off, in transactions of
their own; durable sends keep synchronous_commit on and never share a commit with them."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox_client import AsyncClient, Client
from support import metric, scrape


@pytest.fixture
def stub(aio_channel) -> message_service_pb2_grpc.MessageServiceStub:
    return message_service_pb2_grpc.MessageServiceStub(aio_channel)


@pytest.fixture
async def commit_settings(db):
    """Per inserted message: its top-level transaction and the synchronous_commit in force
    there, noted by a trigger in the inserting session (SET LOCAL is session state)."""
    await db.execute(
        """
        CREATE TABLE public.commit_setting_probe (message_id bigint, top_xid bigint, setting text);
        CREATE FUNCTION public.commit_setting_probe() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.commit_setting_probe
            VALUES (NEW.id, txid_current(), current_setting('synchronous_commit'));
            RETURN NEW;
        END $$;
        CREATE TRIGGER commit_setting_probe AFTER INSERT ON postbox.messages
            FOR EACH ROW EXECUTE FUNCTION public.commit_setting_probe();
        """
    )

    async def settings(ids: list[str]) -> dict[str, tuple[int, str]]:
        rows = await db.fetch(
            "SELECT message_id, top_xid, setting FROM public.commit_setting_probe "
            "WHERE message_id = ANY($1::bigint[])",
            [int(i) for i in ids],
        )
        return {str(r["message_id"]): (r["top_xid"], r["setting"]) for r in rows}

    try:
        yield settings
    finally:
        await db.execute(
            "DROP TRIGGER commit_setting_probe ON postbox.messages;"
            "DROP FUNCTION public.commit_setting_probe(); DROP TABLE public.commit_setting_probe"
        )


async def _groups_at_database(db) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM pg_stat_clear_snapshot(), pg_stat_activity "
        "WHERE wait_event_type = 'Lock' AND query LIKE '%postbox.send_batch%' "
        "AND datname = current_database()"
    )


async def test_relaxed_and_durable_sends_commit_apart_each_with_its_setting(
    stub, db, queue, server, commit_settings
):
    requests = [
        pb.SendRequest(queue=queue, body=f"m{i}".encode(), relaxed_durability=i % 2 == 1)
        for i in range(120)
    ]
    # Inserts held back until a group of each kind waits at the database and every
    # other call waits behind them: the next groups would mix the two if anything did.
    held = db.transaction()
    await held.start()
    try:
        await db.execute("LOCK TABLE postbox.messages IN SHARE MODE")
        calls = [asyncio.ensure_future(stub.Send(r)) for r in requests]
        outcomes = asyncio.gather(*calls, return_exceptions=True)
        deadline = asyncio.get_running_loop().time() + 30
        while await _groups_at_database(db) < 2:
            assert asyncio.get_running_loop().time() < deadline, "two groups never waited"
            await asyncio.sleep(0.01)
        while True:
            samples = await asyncio.to_thread(scrape, server.metrics_port)
            pending = metric(samples, "postbox_group_commit_pending")
            if pending + sum(call.done() for call in calls) >= len(calls):
                break
            assert asyncio.get_running_loop().time() < deadline, f"{pending} joined"
            await asyncio.sleep(0.02)
    finally:
        await held.rollback()
    responses = await outcomes
    assert all(isinstance(r, pb.SendResponse) for r in responses), responses
    seen = await commit_settings([r.message_id for r in responses])
    kinds_by_transaction: dict[int, set[str]] = {}
    for request, response in zip(requests, responses, strict=True):
        top_xid, setting = seen[response.message_id]
        assert setting == ("off" if request.relaxed_durability else "on"), request
        kinds_by_transaction.setdefault(top_xid, set()).add(setting)
    assert all(len(kinds) == 1 for kinds in kinds_by_transaction.values())
    # Groups did form (several sends per commit) on both sides.
    sizes = {}
    for top_xid, _ in seen.values():
        sizes[top_xid] = sizes.get(top_xid, 0) + 1
    assert max(sizes.values()) >= 10, sorted(sizes.values())


async def test_relaxed_send_batch_commits_with_synchronous_commit_off(stub, queue, commit_settings):
    entries = [pb.SendBatchEntry(body=f"b{i}".encode()) for i in range(5)]
    relaxed = await stub.SendBatch(
        pb.SendBatchRequest(queue=queue, entries=entries, relaxed_durability=True)
    )
    durable = await stub.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))
    seen = await commit_settings([*relaxed.message_ids, *durable.message_ids])
    assert {seen[i][1] for i in relaxed.message_ids} == {"off"}
    assert {seen[i][1] for i in durable.message_ids} == {"on"}
    assert len({seen[i][0] for i in relaxed.message_ids}) == 1  # one transaction


async def test_a_refused_relaxed_send_fails_as_a_durable_one(stub, db, queue):
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Send(pb.SendRequest(queue="no_such_queue_relaxed", relaxed_durability=True))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.SendBatch(
            pb.SendBatchRequest(
                queue=queue,
                entries=[pb.SendBatchEntry(body=b"ok"), pb.SendBatchEntry(priority=99)],
                relaxed_durability=True,
            )
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "entry 1" in caught.value.details()
    count = await db.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )
    assert count == 0


async def test_the_sdks_send_takes_relaxed_durability(server, queue, commit_settings):
    async with AsyncClient(server.target) as client:
        relaxed_async = await client.send(queue, b"a", relaxed_durability=True)
        durable = await client.send(queue, b"d")

    def sync_send() -> str:
        with Client(server.target) as client:
            return client.send(queue, b"s", relaxed_durability=True)

    relaxed_sync = await asyncio.to_thread(sync_send)
    seen = await commit_settings([relaxed_async, durable, relaxed_sync])
    assert [seen[i][1] for i in (relaxed_async, durable, relaxed_sync)] == ["off", "on", "off"]
