"""Change data capture: postbox.capture(table, topic) publishes each row change of a
user's table in the transaction that makes it; postbox.release(table) stops it.

The topic fans out to queues by routing key ("<prefix>.<operation>"), so what a queue
holds is what was published. Table and schema names that need quoting go through
regclass and format('%I'), never spliced raw.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from support import engine_database

TABLE = '"Shop Data"."Order Lines"'  # names that must be quoted to work at all


@pytest.fixture
async def engine_url(admin_url: str) -> AsyncIterator[str]:
    async def seed(conn: asyncpg.Connection) -> None:
        await conn.execute('CREATE SCHEMA "Shop Data"')
        await conn.execute(
            f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, item text NOT NULL, qty integer)"
        )
        await conn.execute('CREATE VIEW "Shop Data".v AS SELECT 1 AS x')
        await conn.execute("SELECT postbox.create_topic('lines')")
        await conn.execute("SELECT postbox.create_queue('all-changes')")
        await conn.execute("SELECT postbox.create_queue('deletes')")
        await conn.execute("SELECT postbox.create_subscription('lines', 'all', '#', 'all-changes')")
        await conn.execute(
            "SELECT postbox.create_subscription('lines', 'gone', 'shop.delete', 'deletes')"
        )
        await conn.execute(f"SELECT postbox.capture('{TABLE}', 'lines', 'shop')")

    async with engine_database(admin_url, "postbox_capture", seed) as url:
        yield url


@pytest.fixture
async def conn(engine_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(engine_url)
    try:
        yield conn
    finally:
        await conn.close()


async def _changes(conn: asyncpg.Connection, queue: str = "all-changes") -> list[dict]:
    rows = await conn.fetch(
        "SELECT m.body FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id"
        " WHERE q.name = $1 ORDER BY m.id",
        queue,
    )
    return [json.loads(row["body"]) for row in rows]


async def test_a_bulk_insert_and_delete_publish_every_row_in_order(conn):
    """2,500 rows: more than one of the trigger's batches of 1,000."""
    await conn.execute(
        f"INSERT INTO {TABLE} SELECT i, 'item ' || i, i FROM generate_series(1, 2500) i"
    )
    changes = await _changes(conn)
    assert [c["new"]["id"] for c in changes] == list(range(1, 2501))
    assert changes[0] == {
        "operation": "insert",
        "schema": "Shop Data",
        "table": "Order Lines",
        "old": None,
        "new": {"id": 1, "item": "item 1", "qty": 1},
    }
    assert {c["operation"] for c in changes} == {"insert"}
    assert await _changes(conn, "deletes") == []
    await conn.execute(f"DELETE FROM {TABLE} WHERE id > 1")
    deletes = await _changes(conn, "deletes")
    assert sorted(c["old"]["id"] for c in deletes) == list(range(2, 2501))
    assert {c["new"] is None for c in deletes} == {True}


async def test_a_rollback_publishes_nothing(conn):
    async with conn.transaction():
        await conn.execute(f"INSERT INTO {TABLE} VALUES (1, 'a', 1)")
    rolled_back = conn.transaction()
    await rolled_back.start()
    await conn.execute(f"INSERT INTO {TABLE} VALUES (2, 'b', 1)")
    await conn.execute(f"UPDATE {TABLE} SET qty = 9")
    await conn.execute(f"DELETE FROM {TABLE}")
    # Published inside the transaction (1 row before it, then 1 + 2 updated + 2 deleted).
    assert len(await _changes(conn)) == 6
    await rolled_back.rollback()
    assert [c["operation"] for c in await _changes(conn)] == ["insert"]
    assert await conn.fetchval(f"SELECT count(*) FROM {TABLE}") == 1


async def test_an_update_carries_old_and_new_and_a_delete_the_old_row(conn):
    await conn.execute(f"INSERT INTO {TABLE} VALUES (7, 'pen', 1)")
    await conn.execute(f"UPDATE {TABLE} SET qty = 3 WHERE id = 7")
    await conn.execute(f"DELETE FROM {TABLE} WHERE id = 7")
    _, update, delete = await _changes(conn)
    assert update["operation"] == "update"
    assert update["old"] == {"id": 7, "item": "pen", "qty": 1}
    assert update["new"] == {"id": 7, "item": "pen", "qty": 3}
    assert delete["operation"] == "delete"
    assert delete["old"] == {"id": 7, "item": "pen", "qty": 3}
    assert delete["new"] is None
    # The routing key is "<prefix>.<operation>": the delete subscription took only it.
    assert await _changes(conn, "deletes") == [delete]


async def test_release_stops_publishing(conn):
    assert await conn.fetchval("SELECT count(*) FROM postbox.captures") == 1
    assert await conn.fetchval(f"SELECT postbox.release('{TABLE}')") is True
    assert await conn.fetchval(f"SELECT postbox.release('{TABLE}')") is False
    await conn.execute(f"INSERT INTO {TABLE} VALUES (1, 'a', 1)")
    assert await _changes(conn) == []
    assert await conn.fetchval("SELECT count(*) FROM postbox.captures") == 0


async def test_capturing_again_replaces_the_first_capture(conn):
    await conn.execute(f"SELECT postbox.capture('{TABLE}', 'lines', '')")
    captures = await conn.fetch("SELECT * FROM postbox.captures")
    assert [(r["captured_table"], r["topic_name"], r["routing_prefix"]) for r in captures] == [
        (TABLE, "lines", "")
    ]
    await conn.execute(f"DELETE FROM {TABLE}")  # no rows: nothing published
    await conn.execute(f"INSERT INTO {TABLE} VALUES (1, 'a', 1)")
    assert len(await _changes(conn)) == 1  # once, not once per capture
    assert await _changes(conn, "deletes") == []


@pytest.mark.parametrize(
    ("call", "state", "message"),
    [
        (f"SELECT postbox.capture('{TABLE}', 'nope')", "PB404", "topic 'nope' does not exist"),
        (f"SELECT postbox.capture('{TABLE}', 'lines', 'a..b')", "PB400", "routing key"),
        ("SELECT postbox.capture('postbox.queues', 'lines')", "PB400", "not a table outside"),
        ("SELECT postbox.capture('\"Shop Data\".v', 'lines')", "PB400", "is not a table"),
        ("SELECT postbox.capture('no_such_table', 'lines')", "42P01", "no_such_table"),
    ],
)
async def test_a_bad_capture_says_why_and_changes_nothing(conn, call, state, message):
    with pytest.raises(asyncpg.PostgresError) as refused:
        await conn.execute(call)
    assert refused.value.sqlstate == state
    assert message in refused.value.message
    assert await conn.fetchval("SELECT count(*) FROM postbox.captures") == 1


async def test_a_writer_of_the_table_publishes_without_rights_on_postbox(conn, engine_url):
    """The trigger runs as postbox's owner: the table's writer needs no postbox grant, and
    postbox_admin may not capture tables (owner only)."""
    name = f"capture_test_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    await conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    try:
        await conn.execute(f'GRANT USAGE ON SCHEMA "Shop Data" TO {name}')
        await conn.execute(f"GRANT INSERT ON {TABLE} TO {name}")
        writer = await asyncpg.connect(engine_url, user=name, password=password)
        try:
            await writer.execute(f"INSERT INTO {TABLE} VALUES (1, 'by writer', 1)")
        finally:
            await writer.close()
        assert [c["new"]["item"] for c in await _changes(conn)] == ["by writer"]
        await conn.execute(f"GRANT postbox_admin TO {name}")
        admin = await asyncpg.connect(engine_url, user=name, password=password)
        try:
            for call in (
                f"SELECT postbox.capture('{TABLE}', 'lines')",
                f"SELECT postbox.release('{TABLE}')",
                "SELECT postbox.uninstall()",
                "SELECT postbox.start()",
                "SELECT postbox.stop()",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await admin.execute(call)
            assert isinstance(await admin.fetchval("SELECT postbox.tick()"), str)
        finally:
            await admin.close()
    finally:
        await conn.execute(f"DROP OWNED BY {name}")
        await conn.execute(f"DROP ROLE {name}")
