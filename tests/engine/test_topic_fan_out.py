"""publish_batch's fan-out in SQL: plain queues take a publish in one INSERT, the others a
send_batch each, and the two paths keep every rule (filters, suspensions, envelopes, refusals
named by the first refusing queue by name, all or nothing, a queue dropped meanwhile)."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest
from support import unique_name

ATTRIBUTE_KINDS = ["a", "b", "c"]


async def _queue(db: asyncpg.Connection, hint: str, **settings: object) -> str:
    name = unique_name(hint) + (".fifo" if settings.pop("fifo", False) else "")
    await db.execute("SELECT postbox.create_queue($1, $2::jsonb)", name, json.dumps(settings))
    return name


async def _subscribe(
    db: asyncpg.Connection, topic: str, name: str, queue: str, **options: object
) -> None:
    await db.execute(
        """SELECT postbox.create_subscription($1, $2, '#', $3, filter_policy => $4::jsonb,
                                              sns => $5::jsonb, suspended => $6)""",
        topic, name, queue,
        json.dumps(options["filter_policy"]) if "filter_policy" in options else None,
        json.dumps(options["sns"]) if "sns" in options else None,
        bool(options.get("suspended", False)),
    )  # fmt: skip


async def _topic(db: asyncpg.Connection, hint: str) -> str:
    name = unique_name(hint)
    await db.execute("SELECT postbox.create_topic($1)", name)
    return name


def _attributes(kind: str) -> str:
    return json.dumps({"kind": {"data_type": "String", "string_value": kind}})


async def _publish(db: asyncpg.Connection, topic: str, bodies: list[bytes]) -> list[asyncpg.Record]:
    return await db.fetch(
        "SELECT * FROM postbox.publish_batch($1, $2, attributes => $3::jsonb[])",
        topic, bodies, [_attributes(k) for k in ATTRIBUTE_KINDS[: len(bodies)]],
    )  # fmt: skip


async def _bodies(db: asyncpg.Connection, queue: str) -> dict[int, tuple[bytes, str | None]]:
    rows = await db.fetch(
        """SELECT m.id, m.body, m.attributes::text AS attributes FROM postbox.messages m
           JOIN postbox.queues q ON q.id = m.queue_id WHERE q.name = $1""",
        queue,
    )
    return {row["id"]: (row["body"], row["attributes"]) for row in rows}


async def test_plain_and_other_queues_take_a_publish_alike(db):
    topic = await _topic(db, "fan_out")
    plain = await _queue(db, "a_plain")
    enveloped = await _queue(db, "b_enveloped")
    bounded = await _queue(db, "c_bounded", max_depth=100)
    content = await _queue(db, "d_content", content_based_deduplication=True)
    filtered = await _queue(db, "e_filtered")
    suspended = await _queue(db, "f_suspended")
    fifo = await _queue(db, "g_fifo", fifo=True, content_based_deduplication=True)
    sns = {"topic_arn": f"arn:aws:sns:us-east-1:000000000000:{topic}", "subscription_arn": "arn:s"}
    await _subscribe(db, topic, "plain", plain)
    await _subscribe(db, topic, "plain-again", plain)  # one copy per queue all the same
    await _subscribe(db, topic, "enveloped", enveloped, sns=sns)
    await _subscribe(db, topic, "bounded", bounded)
    await _subscribe(db, topic, "content", content)
    await _subscribe(db, topic, "filtered", filtered, filter_policy={"kind": ["b"]})
    await _subscribe(db, topic, "suspended", suspended, suspended=True)
    await _subscribe(db, topic, "fifo", fifo)

    rows = await _publish(db, topic, [b"one", b"two", b"three"])

    everywhere = sorted([plain, enveloped, bounded, content, fifo])
    assert [list(row["queues"]) for row in rows] == [
        everywhere,
        sorted([*everywhere, filtered]),
        everywhere,
    ]
    for row in rows:
        assert row["duplicates"] == [False] * len(row["queues"])
        assert row["webhook_deliveries"] == 0
    for queue in [*everywhere, filtered, suspended]:
        stored = await _bodies(db, queue)
        taken = {
            message_id: (entry, row["publish_id"])
            for entry, row in enumerate(rows)
            for name, message_id in zip(row["queues"], row["message_ids"], strict=True)
            if name == queue
        }
        assert set(stored) == set(taken), queue
        for message_id, (entry, publish_id) in taken.items():
            body, attributes = stored[message_id]
            sent = [b"one", b"two", b"three"][entry]
            if queue == enveloped:
                # SNS's notification JSON, with the attributes inside it.
                envelope = json.loads(body)
                assert envelope["Message"] == sent.decode()
                assert envelope["MessageId"] == str(publish_id)
                assert envelope["MessageAttributes"]["kind"]["Value"] == ATTRIBUTE_KINDS[entry]
                assert attributes is None
            else:
                assert body == sent
                assert json.loads(attributes) == json.loads(_attributes(ATTRIBUTE_KINDS[entry]))

    # The content-deduplicating queues find the repeats; the plain ones take them again.
    (again,) = await _publish(db, topic, [b"one"])
    duplicates = dict(zip(again["queues"], again["duplicates"], strict=True))
    assert duplicates == {plain: False, enveloped: False, bounded: False, content: True, fifo: True}


@pytest.mark.parametrize("first", ["paused", "full"])
async def test_the_first_refusing_queue_by_name_is_named_and_nothing_is_published(db, first):
    """A paused plain queue refuses in the one INSERT, a full bounded queue in its send_batch:
    whichever comes first by name is the one the error names."""
    topic = await _topic(db, "refusals")
    open_queue = await _queue(db, "c_open")
    paused = await _queue(db, ("a" if first == "paused" else "b") + "_paused")
    full = await _queue(db, ("a" if first == "full" else "b") + "_full", max_depth=1)
    await db.execute("SELECT postbox.send($1, 'filler')", full)
    await db.execute("SELECT postbox.pause_queue($1, sends => true)", paused)
    for queue in (open_queue, paused, full):
        await _subscribe(db, topic, f"to-{queue}", queue)

    with pytest.raises(asyncpg.PostgresError) as raised:
        await _publish(db, topic, [b"one", b"two"])

    named = paused if first == "paused" else full
    assert raised.value.sqlstate == ("PB503" if first == "paused" else "PB429")
    refusal = f"subscription 'to-{named}' (queue '{named}') refused the publish"
    assert f"{refusal}, so nothing was published" in str(raised.value)
    assert await _bodies(db, open_queue) == {}
    assert len(await _bodies(db, full)) == 1


async def test_a_body_an_envelope_cannot_carry_is_refused_by_its_subscription(db):
    topic = await _topic(db, "not_utf8")
    raw = await _queue(db, "a_raw")
    enveloped = await _queue(db, "b_enveloped")
    sns = {"topic_arn": "arn:aws:sns:us-east-1:000000000000:t", "subscription_arn": "arn:s"}
    await _subscribe(db, topic, "raw", raw, sns={**sns, "raw": True})
    await _subscribe(db, topic, "enveloped", enveloped, sns=sns)

    with pytest.raises(asyncpg.PostgresError) as raised:
        await _publish(db, topic, [b"fine", b"\xff\xfe"])

    assert raised.value.sqlstate == "PB400"
    assert str(raised.value) == (
        f"subscription 'enveloped' (queue '{enveloped}') refused the publish, "
        "so nothing was published: the message body must be UTF-8 text for an SNS envelope, "
        "whose Message it is"
    )
    assert await _bodies(db, raw) == {}


async def test_a_queue_dropped_while_a_publish_waits_for_it_fails_the_publish(db, database_url):
    """The publish has read the subscriptions and waits on the queue's lock while a drop holds
    it; once the drop commits, the publish must not put a message into the queue that is gone."""
    topic = await _topic(db, "dropped")
    kept = await _queue(db, "a_kept")
    dropped = await _queue(db, "b_dropped")
    await _subscribe(db, topic, "kept", kept)
    await _subscribe(db, topic, "dropped", dropped)
    dropping = await asyncpg.connect(database_url)
    publishing = await asyncpg.connect(database_url)
    try:
        transaction = dropping.transaction()
        await transaction.start()
        await dropping.execute("SELECT postbox.drop_queue($1)", dropped)
        publish = asyncio.create_task(_publish(publishing, topic, [b"one"]))
        pid = publishing.get_server_pid()
        while not await db.fetchval(
            """SELECT wait_event_type = 'Lock' AND wait_event = 'advisory'
               FROM pg_stat_activity WHERE pid = $1""",
            pid,
        ):
            assert not publish.done(), publish
            await asyncio.sleep(0.01)
        await transaction.commit()
        with pytest.raises(asyncpg.PostgresError) as raised:
            await publish
        assert raised.value.sqlstate == "PB404"
        assert await _bodies(db, kept) == {}
    finally:
        await dropping.close()
        await publishing.close()
