"""The SQL engine on its own, as a psql user sees it: install, upgrade, concurrency, NOTIFY."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from support import create_database, drop_database, until

from postbox_server.db.migrate import Scripts, format_version, installed_version, migrate
from postbox_server.db.sqlfiles import engine_dir

# The first release's full install, kept as a fixture (sql/ holds only the latest
# one): replaying every upgrade from it must give what a fresh install gives.
OLDEST_VERSION = (0, 1, 0)
OLDEST_INSTALL = Path(__file__).parent / "fixtures" / "sql" / "postbox--0.1.0.sql"

SCHEMA_FINGERPRINT = """
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || c.relpersistence::text || ' '
       || coalesce(array_to_string(c.reloptions, ','), '')
       || ' acl ' || coalesce(c.relacl::text, '')
FROM pg_class c WHERE c.relnamespace = 'postbox'::regnamespace
UNION ALL
SELECT 'schema acl ' || coalesce(nspacl::text, '') FROM pg_namespace WHERE nspname = 'postbox'
UNION ALL
SELECT format('column %s.%s #%s %s %s default %s', c.relname, a.attname, a.attnum,
              format_type(a.atttypid, a.atttypmod), a.attnotnull,
              pg_get_expr(d.adbin, d.adrelid))
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid AND c.relnamespace = 'postbox'::regnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'c')
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'postbox'
UNION ALL
SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid))
FROM pg_constraint WHERE connamespace = 'postbox'::regnamespace
UNION ALL
SELECT 'function ' || pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '')
FROM pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace
UNION ALL
SELECT 'trigger ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'postbox'::regnamespace AND NOT t.tgisinternal
ORDER BY 1
"""


async def fingerprint(conn: asyncpg.Connection) -> list[str]:
    return [row[0] for row in await conn.fetch(SCHEMA_FINGERPRINT)]


@pytest.fixture
async def fresh_db(admin_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to a new empty database, dropped afterwards."""
    url = await asyncio.to_thread(create_database, admin_url, "postbox_engine")
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
        await asyncio.to_thread(drop_database, admin_url, url)


async def test_fresh_install_equals_oldest_install_plus_every_upgrade(admin_url, fresh_db):
    scripts = Scripts.load()
    await migrate(fresh_db, scripts)
    fresh = await fingerprint(fresh_db)

    url = await asyncio.to_thread(create_database, admin_url, "postbox_replay")
    replay_conn = await asyncpg.connect(url)
    try:
        async with replay_conn.transaction():
            await replay_conn.execute(OLDEST_INSTALL.read_text())
        for _version, script in scripts.upgrade_path(OLDEST_VERSION):
            async with replay_conn.transaction():
                await replay_conn.execute(script.read_text())
        assert await installed_version(replay_conn) == scripts.latest
        replayed = await fingerprint(replay_conn)
    finally:
        await replay_conn.close()
        await asyncio.to_thread(drop_database, admin_url, url)
    assert fresh, "the fingerprint saw nothing"
    assert replayed == fresh


async def test_the_0_9_upgrade_carries_every_expiry_and_dedupe_key_over(admin_url):
    """0.9.0 moved the expiry and dedupe key indexes off postbox.messages into
    tables of their own: messages sent with a ttl under 0.8.0 must still expire,
    and a waiting message's key must still take the next send of it."""
    url = await asyncio.to_thread(create_database, admin_url, "postbox_upgrade")
    conn = await asyncpg.connect(url)
    try:
        *to_0_8, (latest, last) = Scripts.load().upgrade_path(OLDEST_VERSION)
        assert (to_0_8[-1][0], latest) == ((0, 8, 0), (0, 9, 0))
        await conn.execute(OLDEST_INSTALL.read_text())
        for _version, script in to_0_8:
            await conn.execute(script.read_text())
        await conn.execute("SELECT postbox.create_queue('upgraded')")
        expiring = await conn.fetchval("SELECT postbox.send('upgraded', 'x', ttl => '1 hour')")
        await conn.execute("SELECT postbox.send('upgraded', 'y')")
        keyed = await conn.fetchval("SELECT postbox.send('upgraded', 'v1', dedupe_key => 'k')")
        async with conn.transaction():
            await conn.execute(last.read_text())
        again = "SELECT postbox.send('upgraded', 'v2', dedupe_key => 'k')"
        assert await conn.fetchval(again) == keyed
        # The queue takes the receive that frees the key's row.
        await conn.fetch("SELECT * FROM postbox.receive('upgraded', 10)")
        assert await conn.fetchval("SELECT count(*) FROM postbox.dedupe_keys") == 0
        rows = await conn.fetch(
            "SELECT e.message_id, e.expires_at = m.expires_at AS same "
            "FROM postbox.message_expiries e JOIN postbox.messages m ON m.id = e.message_id"
        )
        assert [tuple(row) for row in rows] == [(expiring, True)]
        await conn.execute(
            "UPDATE postbox.message_expiries SET expires_at = now() - interval '1 s'; "
            "UPDATE postbox.messages SET expires_at = now() - interval '1 s' WHERE id = "
            f"{expiring}"
        )
        assert await conn.fetchval("SELECT postbox.expire_messages(10)") == 1
    finally:
        await conn.close()
        await asyncio.to_thread(drop_database, admin_url, url)


async def test_sql_holds_one_install_and_a_path_to_it_from_every_version():
    scripts = Scripts.load()
    # Only the latest version installs from scratch; older ones only upgrade.
    assert list(scripts.installs) == [scripts.latest]
    for version in (OLDEST_VERSION, *scripts.upgrades):
        path = scripts.upgrade_path(version)
        assert (path[-1][0] if path else version) == scripts.latest, format_version(version)


async def test_migrate_is_idempotent(fresh_db):
    assert await installed_version(fresh_db) is None
    first = await migrate(fresh_db)
    before = await fingerprint(fresh_db)
    assert await migrate(fresh_db) == first
    assert await fingerprint(fresh_db) == before


async def test_replicas_migrating_together_install_once(admin_url, fresh_db):
    database = await fresh_db.fetchval("SELECT current_database()")
    conns = [await asyncpg.connect(admin_url, database=database) for _ in range(4)]
    try:
        versions = await asyncio.gather(*(migrate(conn) for conn in conns))
    finally:
        for conn in conns:
            await conn.close()
    assert len(set(versions)) == 1
    assert await fresh_db.fetchval("SELECT count(*) FROM postbox.schema_version") == 1


def _extension_dir(sharedir: str) -> Path | None:
    directory = Path(sharedir) / "extension"
    return directory if directory.is_dir() and os.access(directory, os.W_OK) else None


async def test_create_extension_installs_the_same_engine(admin_url, fresh_db):
    sharedir = await fresh_db.fetchval("SELECT setting FROM pg_config WHERE name = 'SHAREDIR'")
    target = _extension_dir(sharedir)
    if target is None:
        pytest.fail(
            f"cannot place extension files in {sharedir}/extension (not local or not writable)"
        )
    copied = []
    for source in engine_dir().glob("postbox*"):
        shutil.copy(source, target / source.name)
        copied.append(target / source.name)
    try:
        await fresh_db.execute("CREATE EXTENSION postbox")
        as_extension = await fingerprint(fresh_db)
        version = await fresh_db.fetchval(
            "SELECT extversion FROM pg_extension WHERE extname = 'postbox'"
        )
        assert version == format_version(Scripts.load().latest)
        dumped = await fresh_db.fetchval(
            "SELECT array_length(extconfig, 1) FROM pg_extension WHERE extname = 'postbox'"
        )
        assert dumped == 27  # every table but the runtime state keeps its data in pg_dump
        assert await migrate(fresh_db) == Scripts.load().latest  # recognised as current
    finally:
        for path in copied:
            path.unlink()
    await fresh_db.execute("DROP EXTENSION postbox CASCADE; DROP SCHEMA IF EXISTS postbox CASCADE")
    await migrate(fresh_db)
    assert await fingerprint(fresh_db) == as_extension


async def run_two_workers(
    admin_url: str, db: asyncpg.Connection, call: str, remaining: str
) -> list[int]:
    """Runs `call` (returning how much it did) from two connections at once, each until
    `remaining` counts no work left (a call may find all of it held by the other worker);
    returns how much each did."""
    database = await db.fetchval("SELECT current_database()")
    workers = [await asyncpg.connect(admin_url, database=database) for _ in range(2)]
    done = [0, 0]

    async def work(index: int) -> None:
        while True:
            count = await workers[index].fetchval(call) or 0  # NULL: nothing to step
            done[index] += count
            if count == 0:
                if await workers[index].fetchval(remaining) == 0:
                    return
                await asyncio.sleep(0.01)

    try:
        await asyncio.gather(work(0), work(1))
    finally:
        for conn in workers:
            await conn.close()
    return done


async def first_steps_side_by_side(admin_url: str, db: asyncpg.Connection, call: str) -> list[int]:
    """Two workers each run `call` once in a transaction of its own, the second while the
    first still holds what it took: SKIP LOCKED must pass it over, so both take part
    whatever the timing; how much each did."""
    database = await db.fetchval("SELECT current_database()")
    workers = [await asyncpg.connect(admin_url, database=database) for _ in range(2)]
    try:
        done = []
        for worker in workers:
            await worker.execute("BEGIN")
            done.append(await worker.fetchval(call) or 0)
        for worker in workers:
            await worker.execute("COMMIT")
        return done
    finally:
        for worker in workers:
            await worker.close()


async def first_steps_on_split_tasks(
    admin_url: str, db: asyncpg.Connection, call: str
) -> list[int]:
    """Two workers each lock two of the running redrive tasks; then each runs `call`
    once in its transaction (the other's half skipped), one after the other."""
    database = await db.fetchval("SELECT current_database()")
    workers = [await asyncpg.connect(admin_url, database=database) for _ in range(2)]
    try:
        for index, worker in enumerate(workers):
            await worker.execute("BEGIN")
            await worker.execute(
                "SELECT FROM postbox.redrive_tasks WHERE dead_letter_queue_id IN ("
                "  SELECT dead_letter_queue_id FROM postbox.redrive_tasks WHERE status = 'running'"
                "  ORDER BY dead_letter_queue_id LIMIT 2 OFFSET $1) FOR UPDATE",
                2 * index,
            )
        done = []
        for worker in workers:
            done.append(await worker.fetchval(call))
            await worker.execute("COMMIT")
        return done
    finally:
        for worker in workers:
            await worker.close()


async def test_two_maintenance_workers_never_do_the_same_work(admin_url, fresh_db):
    # A database of its own: no server's worker shares the rows.
    await migrate(fresh_db)
    await fresh_db.execute(
        """SELECT postbox.create_queue('shared', '{"retention": 60, "archive_on_delete": true}')"""
    )
    for _ in range(3):
        await fresh_db.execute(
            "SELECT postbox.send_batch('shared', array_fill('x'::bytea, ARRAY[1000]))"
        )
    await fresh_db.execute(
        "UPDATE postbox.messages SET enqueued_at = enqueued_at - interval '2 min', "
        "visible_at = visible_at - interval '2 min'"
    )
    # The two race for the messages; none is expired (archived) twice. Which of them
    # takes part is the scheduler's: one that ran first could take it all (CI saw
    # [0, 3000]), and a step held open in a transaction blocks the other's (tried, as
    # the record and redrive tests do). So only the sum is asserted.
    done = await run_two_workers(
        admin_url,
        fresh_db,
        "SELECT postbox.expire_messages(100)",
        "SELECT count(*) FROM postbox.messages",
    )
    assert done[0] + done[1] == 3000
    assert await fresh_db.fetchval("SELECT count(*) FROM postbox.archive") == 3000
    assert await fresh_db.fetchval("SELECT count(*) FROM postbox.messages") == 0


async def test_two_maintenance_workers_redrive_each_dead_letter_once(admin_url, fresh_db):
    await migrate(fresh_db)
    planted = {}
    for i in range(4):  # a task per dead-letter queue: both workers get some
        await fresh_db.execute("SELECT postbox.create_queue($1)", f"dlq{i}")
        await fresh_db.execute("SELECT postbox.create_queue($1)", f"source{i}")
        await fresh_db.execute(
            "SELECT postbox.send_batch($1, array_fill('x'::bytea, ARRAY[$2::int]))",
            f"source{i}",
            300 + 100 * i,
        )
        planted[f"dlq{i}"] = 300 + 100 * i
    # As if each message had been received too often: dead letters of their source.
    await fresh_db.execute(
        "UPDATE postbox.messages m SET queue_id = d.id, source_queue_id = s.id, "
        "dead_lettered_at = now() FROM postbox.queues s, postbox.queues d "
        "WHERE s.id = m.queue_id AND d.name = replace(s.name, 'source', 'dlq')"
    )
    ids_before = {r[0] for r in await fresh_db.fetch("SELECT id FROM postbox.messages")}
    for dlq in planted:
        await fresh_db.execute("SELECT postbox.start_redrive($1)", dlq)

    # Each worker first takes a step while the other holds some of the tasks, so both
    # take part whatever the timing; then they race for the rest.
    first = await first_steps_on_split_tasks(admin_url, fresh_db, "SELECT postbox.run_redrives(10)")
    done = await run_two_workers(
        admin_url,
        fresh_db,
        "SELECT postbox.run_redrives(10)",
        "SELECT count(*) FROM postbox.redrive_tasks WHERE status = 'running'",
    )

    assert min(first) > 0, first
    assert sum(first) + sum(done) == sum(planted.values())
    tasks = await fresh_db.fetch(
        "SELECT q.name, t.moved, t.status FROM postbox.redrive_tasks t "
        "JOIN postbox.queues q ON q.id = t.dead_letter_queue_id"
    )
    assert {t["name"]: (t["moved"], t["status"]) for t in tasks} == {
        dlq: (count, "completed") for dlq, count in planted.items()
    }
    rows = await fresh_db.fetch(
        "SELECT m.id, q.name FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id"
    )
    assert {r["id"] for r in rows} == ids_before
    counts = {}
    for r in rows:
        counts[r["name"]] = counts.get(r["name"], 0) + 1
    assert counts == {dlq.replace("dlq", "source"): n for dlq, n in planted.items()}


async def test_two_maintenance_workers_forget_each_record_once(admin_url, fresh_db):
    await migrate(fresh_db)
    await fresh_db.execute(
        "SELECT postbox.create_queue('kept', "
        """'{"archive_on_delete": true, "archive_retention": 60}')"""
    )
    queue_id = await fresh_db.fetchval("SELECT id FROM postbox.queues WHERE name = 'kept'")
    await fresh_db.execute(
        "INSERT INTO postbox.archive (id, queue_id, receive_count, enqueued_at, archived_at, "
        "reason, priority, body) SELECT i, $1, 1, now() - interval '1 h', "
        "now() - interval '2 min', 'deleted', 0, 'x' FROM generate_series(1, 1500) i",
        queue_id,
    )
    await fresh_db.execute(  # within archive_retention: stays
        "INSERT INTO postbox.archive (id, queue_id, receive_count, enqueued_at, archived_at, "
        "reason, priority, body) SELECT i, $1, 1, now(), now(), 'deleted', 0, 'x' "
        "FROM generate_series(1501, 1510) i",
        queue_id,
    )
    await fresh_db.execute(
        "INSERT INTO postbox.deduplication (queue_id, deduplication_id, message_id, expires_at) "
        "SELECT $1, 'd' || i, i, now() - interval '1 s' FROM generate_series(1, 1200) i",
        queue_id,
    )

    first = await first_steps_side_by_side(
        admin_url, fresh_db, "SELECT postbox.expire_records(100)"
    )
    assert min(first) > 0, first
    done = await run_two_workers(
        admin_url,
        fresh_db,
        "SELECT postbox.expire_records(100)",
        "SELECT (SELECT count(*) FROM postbox.archive WHERE archived_at < now() - interval '1 min')"
        " + (SELECT count(*) FROM postbox.deduplication WHERE expires_at < now())",
    )

    # Each record forgotten once: by the first steps or by the race for the rest.
    assert sum(first) + sum(done) == 1500 + 1200
    assert await fresh_db.fetchval("SELECT count(*) FROM postbox.archive") == 10
    assert await fresh_db.fetchval("SELECT count(*) FROM postbox.deduplication") == 0


async def test_two_receivers_deliver_or_bury_each_message_once(admin_url, fresh_db):
    await migrate(fresh_db)
    await fresh_db.execute("SELECT postbox.create_queue('graveyard')")
    await fresh_db.execute(
        """SELECT postbox.create_queue('failing', '{"dead_letter_policy": """
        """{"dead_letter_queue": "graveyard", "max_receive_count": 1}}')"""
    )
    for _ in range(2):
        await fresh_db.execute(
            "SELECT postbox.send_batch('failing', array_fill('x'::bytea, ARRAY[1000]))"
        )
    # Every other message was received once already and is visible again: its next
    # receive buries it; the rest are delivered.
    await fresh_db.execute("UPDATE postbox.messages SET receive_count = 1 WHERE id % 2 = 0")
    due = {r[0] for r in await fresh_db.fetch("SELECT id FROM postbox.messages WHERE id % 2 = 0")}
    fresh = {r[0] for r in await fresh_db.fetch("SELECT id FROM postbox.messages WHERE id % 2 = 1")}
    database = await fresh_db.fetchval("SELECT current_database()")
    receivers = [await asyncpg.connect(admin_url, database=database) for _ in range(2)]
    delivered: list[int] = []

    async def receive(conn: asyncpg.Connection) -> None:
        for _ in range(60):
            rows = await conn.fetch("SELECT message_id FROM postbox.receive('failing', 50)")
            delivered.extend(r[0] for r in rows)

    try:
        await asyncio.gather(*(receive(conn) for conn in receivers))
    finally:
        for conn in receivers:
            await conn.close()
    assert sorted(delivered) == sorted(fresh)  # each once
    rows = await fresh_db.fetch(
        "SELECT m.id, m.receive_count, s.name AS source FROM postbox.messages m "
        "JOIN postbox.queues q ON q.id = m.queue_id "
        "LEFT JOIN postbox.queues s ON s.id = m.source_queue_id WHERE q.name = 'graveyard'"
    )
    assert sorted(r["id"] for r in rows) == sorted(due)
    assert {(r["receive_count"], r["source"]) for r in rows} == {(1, "failing")}


async def test_psql_installs_the_script_in_one_transaction(admin_url):
    psql = shutil.which("psql")
    if psql is None:
        pytest.fail("psql is needed to prove the scripts install from plain psql")
    url = await asyncio.to_thread(create_database, admin_url, "postbox_psql")
    try:
        script = Scripts.load().installs[Scripts.load().latest]
        command = [psql, url, "-v", "ON_ERROR_STOP=1", "-1", "-q", "-f", str(script)]
        result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("SELECT postbox.create_queue('from_psql')")
            assert await conn.fetchval("SELECT postbox.send('from_psql', 'hi')") > 0
            row = await conn.fetchrow("SELECT * FROM postbox.receive('from_psql', 1)")
            assert row["body"] == b"hi"
        finally:
            await conn.close()
    finally:
        await asyncio.to_thread(drop_database, admin_url, url)


# Two sessions, every interleaving of their steps (pgmq-style isolation tests).


class Session:
    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.results: list[list[asyncpg.Record]] = []

    async def step(self, sql: str, *args: object) -> None:
        self.results.append(await self.conn.fetch(sql, *args))


async def run_interleaving(steps: list[tuple[Session, str, tuple]]) -> None:
    """Runs steps in order; a step that blocks on the other session waits for it."""
    blocked: dict[Session, asyncio.Task[None]] = {}
    remaining = list(steps)
    while remaining:
        runnable = next((s for s in remaining if s[0] not in blocked), None)
        if runnable is None:
            # Every remaining step belongs to a blocked session: let them finish.
            done, _ = await asyncio.wait(blocked.values(), timeout=5)
            assert done, "deadlock between the two sessions"
        else:
            remaining.remove(runnable)
            session, sql, args = runnable
            task = asyncio.ensure_future(session.step(sql, *args))
            done, _ = await asyncio.wait([task], timeout=0.2)
            if not done:
                blocked[session] = task
        for session, task in list(blocked.items()):
            if task.done():
                task.result()
                del blocked[session]
    if blocked:
        await asyncio.wait_for(asyncio.gather(*blocked.values()), 5)


# Positions of session A's three steps among the six steps of both sessions.
SCHEDULES = list(itertools.combinations(range(6), 3))


def merge(positions: tuple[int, ...], a_steps: list, b_steps: list) -> list:
    a, b = iter(a_steps), iter(b_steps)
    return [next(a) if i in positions else next(b) for i in range(len(a_steps) + len(b_steps))]


def transaction(session: Session, sql: str, *args: object) -> list[tuple[Session, str, tuple]]:
    return [(session, "BEGIN", ()), (session, sql, args), (session, "COMMIT", ())]


@pytest.fixture
async def conns(database_url, server) -> AsyncIterator[list[asyncpg.Connection]]:
    """Three connections: one to set up, and one for each of the two sessions."""
    opened = [await asyncpg.connect(database_url) for _ in range(3)]
    yield opened
    for conn in opened:
        await conn.close()


async def new_queue(conn: asyncpg.Connection, name: str, messages: int) -> None:
    await conn.execute("SELECT postbox.create_queue($1)", name)
    for _ in range(messages):
        await conn.execute("SELECT postbox.send($1, 'x')", name)


RECEIVE = "SELECT * FROM postbox.receive($1, 1)"
DELETE = "SELECT outcome FROM postbox.delete_batch($1, ARRAY[$2])"
CHANGE = (
    "SELECT outcome FROM postbox.change_visibility_batch($1, ARRAY[$2], ARRAY[interval '60 s'])"
)


@pytest.mark.parametrize("messages", [1, 2])
async def test_concurrent_receivers_never_get_the_same_message(conns, messages):
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        queue = f"iso_recv_{messages}_{n}"
        await new_queue(setup, queue, messages)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(positions, transaction(a, RECEIVE, queue), transaction(b, RECEIVE, queue))
        )
        got_a = {r["message_id"] for r in a.results[1]}
        got_b = {r["message_id"] for r in b.results[1]}
        assert not got_a & got_b, f"schedule {positions}: both sessions got {got_a}"
        assert len(got_a) + len(got_b) == messages, f"schedule {positions}"


@pytest.mark.parametrize("acknowledge", [DELETE, CHANGE])
async def test_old_receipt_never_wins_against_a_redelivery(conns, acknowledge):
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        queue = f"iso_ack_{n}_{'d' if acknowledge is DELETE else 'c'}"
        await new_queue(setup, queue, 1)
        # Received once with a zero timeout: visible again, its receipt still current.
        receipt = await setup.fetchval("SELECT receipt FROM postbox.receive($1, 1, '0 s')", queue)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(
                positions,
                transaction(a, acknowledge, queue, receipt),
                transaction(b, RECEIVE, queue),
            )
        )
        outcome = a.results[1][0]["outcome"]
        redelivered = len(b.results[1]) == 1
        assert outcome in ("ok", "stale"), f"schedule {positions}: {outcome}"
        assert (outcome == "ok") != redelivered, f"schedule {positions}: {outcome}, {redelivered}"


async def test_one_receipt_deletes_once(conns):
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        queue = f"iso_del_{n}"
        await new_queue(setup, queue, 1)
        receipt = await setup.fetchval("SELECT receipt FROM postbox.receive($1, 1)", queue)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(
                positions,
                transaction(a, DELETE, queue, receipt),
                transaction(b, DELETE, queue, receipt),
            )
        )
        outcomes = sorted([a.results[1][0]["outcome"], b.results[1][0]["outcome"]])
        assert outcomes == ["not_found", "ok"], f"schedule {positions}"


RECEIPT_FORM = re.compile(r"[0-9]{1,18}:[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def near_misses(receipt: str, alphabet: str) -> list[str]:
    """Every text one edit away from `receipt`: each character replaced, dropped, or
    preceded by one of `alphabet`, plus the receipt itself."""
    texts = {receipt}
    for at in range(len(receipt) + 1):
        texts.add(receipt[:at] + receipt[at + 1 :])
        for char in alphabet:
            texts.add(receipt[:at] + char + receipt[at + 1 :])
            texts.add(receipt[:at] + char + receipt[at:])
    return sorted(texts)


async def test_receipts_parse_exactly_their_one_form_and_nothing_else_raises(conns):
    setup = conns[0]
    texts = near_misses("123456789012345678:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "0aF-:é\n ")
    texts += ["", "1", ":", "1:", "-1:a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]
    texts += ["1" * 19 + ":" + "0" * 36, "1" * 18 + ":" + "0" * 36]
    rows = await setup.fetch(
        "SELECT i, message_id, lease::text FROM postbox._parse_receipts($1) ORDER BY i", texts
    )
    assert [row["i"] for row in rows] == list(range(1, len(texts) + 1))
    for text, row in zip(texts, rows, strict=True):
        if RECEIPT_FORM.fullmatch(text):
            message_id, lease = text.split(":")
            assert (row["message_id"], row["lease"]) == (int(message_id), lease), text
        else:
            assert (row["message_id"], row["lease"]) == (None, None), repr(text)


async def _fifo_group(conn: asyncpg.Connection, queue: str) -> list[tuple[bytes, bool]]:
    """(body, parked) of the queue's group "g" in id order."""
    rows = await conn.fetch(
        "SELECT body, visible_at = 'infinity' AS parked FROM postbox.messages "
        "WHERE queue_id = (SELECT id FROM postbox.queues WHERE name = $1) ORDER BY id",
        queue,
    )
    return [(row["body"], row["parked"]) for row in rows]


FIFO_SEND = (
    "SELECT * FROM postbox.send_batch($1, ARRAY['new'::bytea], message_group_ids => ARRAY['g'], "
    "deduplication_ids => ARRAY[gen_random_uuid()::text])"
)


async def test_fifo_send_racing_the_heads_delete_never_orphans_a_message(conns):
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        queue = f"iso_fifo_del_{n}.fifo"
        await setup.execute("SELECT postbox.create_queue($1)", queue)
        await setup.execute(FIFO_SEND.replace("'new'", "'head'"), queue)
        receipt = await setup.fetchval("SELECT receipt FROM postbox.receive($1, 1)", queue)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(
                positions, transaction(a, FIFO_SEND, queue), transaction(b, DELETE, queue, receipt)
            )
        )
        assert b.results[1][0]["outcome"] == "ok"
        # The new message is the group's only message, so it must be deliverable.
        assert await _fifo_group(setup, queue) == [(b"new", False)], f"schedule {positions}"


async def test_fifo_send_racing_a_dead_letter_move_never_orphans_a_message(conns):
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        dlq, queue = f"iso_fifo_dlq_{n}.fifo", f"iso_fifo_src_{n}.fifo"
        await setup.execute("SELECT postbox.create_queue($1)", dlq)
        await setup.execute(
            "SELECT postbox.create_queue($1, jsonb_build_object('dead_letter_policy', "
            "jsonb_build_object('dead_letter_queue', $2::text, 'max_receive_count', 1)))",
            queue,
            dlq,
        )
        await setup.execute(FIFO_SEND.replace("'new'", "'head'"), queue)
        await setup.execute(
            "SELECT * FROM postbox.receive($1, 1, '0 s')", queue
        )  # once: next moves it
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(positions, transaction(a, FIFO_SEND, queue), transaction(b, RECEIVE, queue))
        )
        # Whoever came first: the head is in the dead-letter queue, and the new
        # message is either delivered already (in flight) or visible, never parked.
        assert await _fifo_group(setup, dlq) == [(b"head", False)], f"schedule {positions}"
        assert await _fifo_group(setup, queue) == [(b"new", False)], f"schedule {positions}"


FIFO_RECEIVE = "SELECT message_id, message_group_id, body FROM postbox.receive($1, 10, '1 hour')"


async def _fifo_runs(conn: asyncpg.Connection, queue: str, groups: dict[str, int]) -> None:
    """Sends, interleaved, groups[g] messages to each group g, bodies "<g><n>"."""
    for n in range(max(groups.values())):
        for group, count in groups.items():
            if n < count:
                await conn.execute(
                    FIFO_SEND.replace("'new'", f"'{group}{n}'").replace("'g'", f"'{group}'"), queue
                )


async def test_two_fifo_receives_never_share_a_group_and_take_runs_in_order(conns):
    """Both sessions receive 10 from two groups of three at every interleaving: a group
    goes to one session only, as a run from its first message, in order."""
    setup, conn_a, conn_b = conns
    for n, positions in enumerate(SCHEDULES):
        queue = f"iso_fifo_runs_{n}.fifo"
        await setup.execute("SELECT postbox.create_queue($1)", queue)
        await _fifo_runs(setup, queue, {"a": 3, "b": 3})
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(
                positions,
                transaction(a, FIFO_RECEIVE, queue),
                transaction(b, FIFO_RECEIVE, queue),
            )
        )
        got_a, got_b = a.results[1], b.results[1]
        groups_a = {r["message_group_id"] for r in got_a}
        groups_b = {r["message_group_id"] for r in got_b}
        assert not groups_a & groups_b, f"schedule {positions}"
        for got in (got_a, got_b):
            for group in {r["message_group_id"] for r in got}:
                bodies = [r["body"] for r in got if r["message_group_id"] == group]
                assert bodies == [f"{group}{i}".encode() for i in range(3)], f"schedule {positions}"


async def test_a_fifo_receive_takes_nothing_of_a_group_whose_head_another_receive_holds(conns):
    """pgmq-style: the other receive's claim is held open (its rows locked, not
    committed); this one must skip the whole group, not deliver the messages behind."""
    setup, holder, receiver = conns
    queue = "iso_fifo_held_head.fifo"
    await setup.execute("SELECT postbox.create_queue($1)", queue)
    await _fifo_runs(setup, queue, {"a": 3, "b": 2})
    await holder.execute("BEGIN")
    held = await holder.fetch("SELECT body FROM postbox.receive($1, 1, '1 hour')", queue)
    assert [r["body"] for r in held] == [b"a0"]
    got = await receiver.fetch(FIFO_RECEIVE, queue)
    assert [r["body"] for r in got] == [b"b0", b"b1"]
    await holder.execute("COMMIT")
    # a0 in flight now: a1 and a2 wait for it.
    assert await receiver.fetch(FIFO_RECEIVE, queue) == []


async def test_a_fifo_receive_stops_a_run_at_a_held_message_and_skips_its_later_ones(conns):
    """A run that timed out is visible again: the receive takes its first message
    and stops at the one another transaction holds, never the ones after it; nor
    does it take them while the first is held."""
    setup, holder, receiver = conns
    queue = "iso_fifo_held_run.fifo"
    await setup.execute("SELECT postbox.create_queue($1)", queue)
    await _fifo_runs(setup, queue, {"a": 4})
    first = await setup.fetch("SELECT message_id FROM postbox.receive($1, 10, '0 s')", queue)
    ids = [r["message_id"] for r in first]
    assert len(ids) == 4  # the run, visible again at once
    await holder.execute("BEGIN")
    await holder.execute("SELECT FROM postbox.messages WHERE id = $1 FOR UPDATE", ids[0])
    assert await receiver.fetch(FIFO_RECEIVE, queue) == []  # a1..a3 are not the oldest
    await holder.execute("ROLLBACK")
    await holder.execute("BEGIN")
    await holder.execute("SELECT FROM postbox.messages WHERE id = $1 FOR UPDATE", ids[2])
    got = await receiver.fetch(FIFO_RECEIVE, queue)
    assert [r["body"] for r in got] == [b"a0", b"a1"]
    await holder.execute("ROLLBACK")
    assert await receiver.fetch(FIFO_RECEIVE, queue) == []  # a0 and a1 in flight


async def test_a_receive_claims_in_order_and_takes_the_rounds_past_an_expired_candidate(conns):
    """receive's one-statement claim, and its fall-back to the rounds that remove what
    must not be delivered."""
    setup, _, _ = conns
    await new_queue(setup, "claim_order", 0)
    low = await setup.fetchval("SELECT postbox.send('claim_order', 'low')")
    high = await setup.fetchval("SELECT postbox.send('claim_order', 'high', priority => 5)")
    later = await setup.fetchval("SELECT postbox.send('claim_order', 'later')")
    claim = "SELECT message_id, more FROM postbox.receive('claim_order', 10, '1 hour')"
    got = await setup.fetch(claim)
    assert [r["message_id"] for r in got] == [high, low, later]
    assert not any(r["more"] for r in got)

    gone = await setup.fetchval("SELECT postbox.send('claim_order', 'gone', ttl => '1 ms')")
    kept = await setup.fetchval("SELECT postbox.send('claim_order', 'kept')")
    await setup.execute(
        "SELECT pg_sleep_until(expires_at + interval '1 ms') FROM postbox.messages WHERE id = $1",
        gone,
    )
    assert [r["message_id"] for r in await setup.fetch(claim)] == [kept]
    assert not await setup.fetchval(
        "SELECT EXISTS (SELECT FROM postbox.messages WHERE id = $1)", gone
    )


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT postbox.send('dropped_under_a_send', 'x')",
        # send_batch's straight path (bodies alone into a plain queue).
        "SELECT count(*) FROM postbox.send_batch('dropped_under_a_send', ARRAY['x', 'y']::bytea[])",
    ],
    ids=["send", "send_batch"],
)
async def test_a_send_racing_a_queue_drop_leaves_no_orphans(conns, statement):
    setup, dropper, sender = conns
    await new_queue(setup, "dropped_under_a_send", 0)
    await dropper.execute("BEGIN")
    await dropper.execute("SELECT postbox.drop_queue('dropped_under_a_send')")
    # The send finds the queue (the drop has not committed) and waits for its lock.
    sending = asyncio.ensure_future(sender.execute(statement))
    waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    for _ in range(1500):  # up to 30 s: a loaded machine starts the statement late
        if sending.done() or await setup.fetchval(waiting, sender.get_server_pid()):
            break
        await asyncio.sleep(0.02)
    assert not sending.done(), "the send should wait for the drop"
    await dropper.execute("COMMIT")
    with pytest.raises(asyncpg.PostgresError) as caught:
        await sending
    assert caught.value.sqlstate == "PB404"
    orphans = await setup.fetchval(
        "SELECT count(*) FROM postbox.messages m "
        "WHERE NOT EXISTS (SELECT FROM postbox.queues q WHERE q.id = m.queue_id)"
    )
    assert orphans == 0


SENDS_INTO = {
    "send": "SELECT postbox.send($1, 'x')",
    "send_batch": "SELECT count(*) FROM postbox.send_batch($1, ARRAY['x']::bytea[])",
    "publish": "SELECT count(*) FROM postbox.publish($1 || '_topic', 'x')",
}


@pytest.mark.parametrize("kind", list(SENDS_INTO))
async def test_a_send_in_a_snapshot_older_than_a_drop_fails_and_leaves_no_orphans(conns, kind):
    """REPEATABLE READ: the transaction's snapshot predates the drop, so every look at the
    queue still finds it. The send must not put its message into the dropped queue; it
    fails with a serialization failure, which the application retries."""
    setup, dropper, sender = conns
    queue = f"dropped_since_{kind}"
    await new_queue(setup, queue, 0)
    await setup.execute("SELECT postbox.create_topic($1 || '_topic')", queue)
    await setup.execute(
        "SELECT postbox.create_subscription($1 || '_topic', 'all', queue_name => $1)", queue
    )
    await sender.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    try:
        await sender.execute("SELECT count(*) FROM postbox.queues")  # takes the snapshot
        await dropper.execute("SELECT postbox.drop_queue($1)", queue)
        with pytest.raises(asyncpg.PostgresError) as caught:
            await sender.execute(SENDS_INTO[kind], queue)
        assert caught.value.sqlstate == "40001"
    finally:
        await sender.execute("ROLLBACK")
    orphans = await setup.fetchval(
        "SELECT count(*) FROM postbox.messages m "
        "WHERE NOT EXISTS (SELECT FROM postbox.queues q WHERE q.id = m.queue_id)"
    )
    assert orphans == 0


STRIPE_CLASS = 1886350224  # postbox._lock_queue: stripe s is (STRIPE_CLASS + s, hashtext(name))
HOLDS = """SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'
                  AND classid = $2::bigint AND objid = hashtext($3)::oid AND granted = $4)"""


@pytest.mark.parametrize(
    "send",
    [
        "SELECT postbox.send('striped', 'x')",  # the straight path: locks, then looks
        "SELECT postbox.send('striped', 'x', delay => '0 s')",  # the general: looks, then locks
    ],
    ids=["straight", "general"],
)
async def test_a_drop_waits_for_the_sends_in_every_stripe_of_the_queue_lock(
    database_url, conns, send
):
    """A send holds one of the queue lock's 16 stripes, its session's; a drop takes all of
    them, so it waits for every send in progress, whichever stripe that send holds."""
    setup, dropper, _ = conns
    await new_queue(setup, "striped", 0)
    queue_id = await setup.fetchval("SELECT id FROM postbox.queues WHERE name = 'striped'")
    senders = [await asyncpg.connect(database_url)]
    try:
        # A second session in another stripe: pids differ, so a few tries find one.
        for _ in range(32):
            other = await asyncpg.connect(database_url)
            if other.get_server_pid() % 16 != senders[0].get_server_pid() % 16:
                senders.append(other)
                break
            await other.close()
        assert len(senders) == 2, "no two sessions in different stripes"
        for sender in senders:
            await sender.execute("BEGIN")
            await sender.execute(send)
            stripe = STRIPE_CLASS + sender.get_server_pid() % 16
            assert await setup.fetchval(HOLDS, sender.get_server_pid(), stripe, "striped", True)
        dropping = asyncio.ensure_future(dropper.execute("SELECT postbox.drop_queue('striped')"))
        # Whichever order they come in, the drop ends up waiting for the second sender's stripe.
        await senders[0].execute("COMMIT")
        second = STRIPE_CLASS + senders[1].get_server_pid() % 16
        await until(setup, HOLDS, dropper.get_server_pid(), second, "striped", False)
        assert not dropping.done(), "the drop should wait for the send in the other stripe"
        await senders[1].execute("COMMIT")
        await dropping
    finally:
        for sender in senders:
            await sender.close()
    # Both sends committed before the drop went through: it removed their messages.
    assert (
        await setup.fetchval("SELECT count(*) FROM postbox.messages WHERE queue_id = $1", queue_id)
        == 0
    )


# Wake-up notifications.


async def notifications_during(conn: asyncpg.Connection, action) -> list[str]:
    received: list[str] = []

    def listener(_conn, _pid, _channel, payload):
        received.append(payload)

    await conn.add_listener("postbox", listener)
    try:
        await action()
        await asyncio.sleep(0.2)
    finally:
        await conn.remove_listener("postbox", listener)
    return received


async def listens_to(conn: asyncpg.Connection, *queues: str) -> None:
    """Lists `conn` as waiting on the queues, as a server's LISTEN connection does."""
    await conn.execute("SELECT postbox.listen_to($1::text[])", list(queues))


async def test_a_queue_nobody_listens_to_is_not_notified(conns):
    """NOTIFY serialises commits: a send into a queue no server waits on skips it."""
    setup, listener, other = conns
    await new_queue(setup, "unheard", 0)
    await new_queue(setup, "heard", 0)
    await listens_to(listener, "heard")

    async def sends() -> None:
        await setup.execute("SELECT postbox.send('unheard', 'x')")
        # Last, on another session (the throttle is per session): when it arrives,
        # an earlier notification would have too.
        await other.execute("SELECT postbox.send('heard', 'x')")

    assert await notifications_during(listener, sends) == ["heard"]

    await listener.execute("SELECT postbox.unlisten($1::text[])", ["heard"])
    assert (
        await notifications_during(
            listener, lambda: other.execute("SELECT postbox.send('heard', 'y')")
        )
        == []
    )


async def test_listings_of_sessions_that_are_gone_are_cleared(conns, database_url):
    setup, listener, _ = conns
    await new_queue(setup, "listened_once", 0)
    gone = await asyncpg.connect(database_url)
    gone_pid = await gone.fetchval("SELECT pg_backend_pid()")
    await listens_to(gone, "listened_once")
    await gone.close()
    gone_yet = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)"
    for _ in range(500):  # its backend exits a moment after the close
        if await setup.fetchval(gone_yet, gone_pid):
            break
        await asyncio.sleep(0.02)
    await listens_to(listener, "listened_once")
    listeners = await setup.fetch(
        "SELECT listener FROM postbox.queue_listeners l JOIN postbox.queues q ON q.id = l.queue_id "
        "WHERE q.name = 'listened_once'"
    )
    assert [r["listener"] for r in listeners] == [
        await listener.fetchval("SELECT pg_backend_pid()")
    ]
    assert await setup.fetchval(LISTENED, "listened_once")
    await listener.execute("SELECT postbox.unlisten($1::text[])", ["listened_once"])
    assert not await setup.fetchval(LISTENED, "listened_once"), "the gone session still counted"


LISTENED = "SELECT listened FROM postbox.queues WHERE name = $1"


async def test_the_listened_flag_follows_the_listeners(conns):
    """Sends read queues.listened rather than queue_listeners: true while some session
    listens, false once the last one has unlistened."""
    setup, first, second = conns
    await new_queue(setup, "flagged", 0)
    assert not await setup.fetchval(LISTENED, "flagged")
    await listens_to(first, "flagged")
    await listens_to(second, "flagged")
    assert await setup.fetchval(LISTENED, "flagged")
    await first.execute("SELECT postbox.unlisten($1::text[])", ["flagged"])
    assert await setup.fetchval(LISTENED, "flagged"), "the second session still listens"
    await second.execute("SELECT postbox.unlisten($1::text[])", ["flagged"])
    assert not await setup.fetchval(LISTENED, "flagged")


async def test_a_listing_racing_the_last_unlisting_leaves_the_queue_flagged(conns):
    """The last listener unlists, and before it commits another session lists: the
    listing waits for the unlisting and counts itself after it. Had each counted in its
    own snapshot, the unlisting (which saw no other listener) would commit false last,
    and sends would stop notifying a queue that a server waits on."""
    setup, leaving, arriving = conns
    await new_queue(setup, "handed_over", 0)
    await listens_to(leaving, "handed_over")
    await leaving.execute("BEGIN")
    await leaving.execute("SELECT postbox.unlisten($1::text[])", ["handed_over"])
    listing = asyncio.ensure_future(listens_to(arriving, "handed_over"))
    waiting = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
    for _ in range(1500):  # up to 30 s: a loaded machine starts the statement late
        if listing.done() or await setup.fetchval(waiting, arriving.get_server_pid()):
            break
        await asyncio.sleep(0.02)
    await leaving.execute("COMMIT")
    await listing
    assert await setup.fetchval(LISTENED, "handed_over")


async def test_send_notifies_waiters_with_the_queue_name(conns):
    setup, listener, _ = conns
    await new_queue(setup, "notify_me", 0)
    await listens_to(listener, "notify_me")
    payloads = await notifications_during(
        listener, lambda: setup.execute("SELECT postbox.send('notify_me', 'x')")
    )
    assert payloads == ["notify_me"]


PRIORITIZED = "SELECT prioritized FROM postbox.queues WHERE name = $1"
RECEIVE_BODIES = "SELECT body FROM postbox.receive($1, 10, visibility_timeout => '0 s')"


async def test_a_queue_takes_priorities_first_from_its_first_committed_priority_send(conns):
    """Receive's straight path reads the priority index only once queues.prioritized is
    set: the first send of a priority sets it, in the send's own transaction."""
    setup, sender, _ = conns
    await new_queue(setup, "ranked", 0)
    await setup.execute("SELECT postbox.send('ranked', 'plain')")
    assert not await setup.fetchval(PRIORITIZED, "ranked")
    assert [r[0] for r in await setup.fetch(RECEIVE_BODIES, "ranked")] == [b"plain"]
    await sender.execute("BEGIN")
    await sender.execute("SELECT postbox.send('ranked', 'rolled back', priority => 5)")
    await sender.execute("ROLLBACK")
    assert not await setup.fetchval(PRIORITIZED, "ranked"), "the flag rolls back with its send"
    await setup.execute("SELECT postbox.send('ranked', 'urgent', priority => 5)")
    assert await setup.fetchval(PRIORITIZED, "ranked")
    assert [r[0] for r in await setup.fetch(RECEIVE_BODIES, "ranked")] == [b"urgent", b"plain"]


async def test_a_dead_lettered_priority_message_prioritizes_the_dead_letter_queue(conns):
    """A move keeps a message's priority, so it sets the flag of the queue it moves to."""
    setup, _, _ = conns
    await new_queue(setup, "ranked_dlq", 0)
    await setup.execute(
        "SELECT postbox.create_queue('ranked_source', jsonb_build_object('dead_letter_policy', "
        "jsonb_build_object('dead_letter_queue', 'ranked_dlq', 'max_receive_count', 1)))"
    )
    await setup.execute("SELECT postbox.send('ranked_dlq', 'waiting')")
    await setup.execute("SELECT postbox.send('ranked_source', 'failed', priority => 7)")
    assert [r[0] for r in await setup.fetch(RECEIVE_BODIES, "ranked_source")] == [b"failed"]
    assert await setup.fetch(RECEIVE_BODIES, "ranked_source") == []  # moves it
    assert await setup.fetchval(PRIORITIZED, "ranked_dlq")
    assert [r[0] for r in await setup.fetch(RECEIVE_BODIES, "ranked_dlq")] == [
        b"failed",
        b"waiting",
    ]


# Idempotent enqueue through postbox.dedupe_keys (since 0.9.0): a send locks the
# key's row, then fills the message the row names while that one still holds
# the key, or makes a message of its own.
KEYED_SEND = "SELECT postbox.send($1, $2::bytea, dedupe_key => 'k')"
WAITS_ON_A_LOCK = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
KEY_ROW = (
    "SELECT message_id FROM postbox.dedupe_keys d JOIN postbox.queues q ON q.id = d.queue_id "
    "WHERE q.name = $1 AND d.dedupe_key = 'k'"
)
BODIES = (
    "SELECT id, body FROM postbox.messages m "
    "WHERE queue_id = (SELECT id FROM postbox.queues WHERE name = $1) ORDER BY id"
)


@pytest.mark.parametrize("first_ends", ["COMMIT", "ROLLBACK"])
async def test_a_keyed_send_waits_for_a_concurrent_send_of_its_key(conns, first_ends):
    """The second send of a key waits on the key's row: it fills the first's message
    when that commits, and makes its own when that rolls back; never two."""
    setup, first, second = conns
    queue = f"keyed_race_{first_ends.lower()}"
    await new_queue(setup, queue, 0)
    await first.execute("BEGIN")
    first_id = await first.fetchval(KEYED_SEND, queue, b"v1")
    sending = asyncio.ensure_future(second.fetchval(KEYED_SEND, queue, b"v2"))
    await until(setup, WAITS_ON_A_LOCK, second.get_server_pid())
    assert not sending.done()
    await first.execute(first_ends)
    second_id = await sending
    (message,) = await setup.fetch(BODIES, queue)
    assert (message["id"], message["body"]) == (second_id, b"v2")
    assert (second_id == first_id) == (first_ends == "COMMIT")
    assert await setup.fetchval(KEY_ROW, queue) == second_id


async def test_keyed_batches_take_their_keys_rows_in_key_order(conns):
    """Two transactions sending keys a and b in opposite orders never wait on each
    other in a circle: a batch takes its keys' rows in key order, so the one that
    sends (b, a) waits for a before it holds b."""
    setup, first, second = conns
    await new_queue(setup, "keyed_order", 0)
    batch = (
        "SELECT message_id FROM postbox.send_batch('keyed_order', $1::bytea[], dedupe_keys => $2)"
    )
    await first.execute("BEGIN")
    (a,) = [row[0] for row in await first.fetch(batch, [b"a1"], ["a"])]
    sending = asyncio.ensure_future(second.fetch(batch, [b"b2", b"a2"], ["b", "a"]))
    await until(setup, WAITS_ON_A_LOCK, second.get_server_pid())
    # A wait for b here, while the other batch held it and waited for a, would be
    # a deadlock, which PostgreSQL reports after a second.
    (b,) = [row[0] for row in await asyncio.wait_for(first.fetch(batch, [b"b1"], ["b"]), 30)]
    await first.execute("COMMIT")
    assert [row[0] for row in await sending] == [b, a]
    assert dict(await setup.fetch(BODIES, "keyed_order")) == {a: b"a2", b: b"b2"}


async def test_a_keyed_send_whose_message_is_received_meanwhile_makes_its_own(conns):
    """The race the key's row is locked for: a send holds the row and waits for the
    message it names, which a receive holds and delivers. The receive frees the key
    without waiting for the row (or the two would wait on each other), and the send,
    finding the message no longer holds the key, makes a message of its own."""
    setup, receiver, sender = conns
    await new_queue(setup, "keyed_received", 0)
    held = await setup.fetchval(KEYED_SEND, "keyed_received", b"v1")
    await receiver.execute("BEGIN")
    await receiver.execute("SELECT FROM postbox.messages WHERE id = $1 FOR UPDATE", held)
    sending = asyncio.ensure_future(sender.fetchval(KEYED_SEND, "keyed_received", b"v2"))
    await until(setup, WAITS_ON_A_LOCK, sender.get_server_pid())
    got = await asyncio.wait_for(
        receiver.fetch("SELECT message_id, body FROM postbox.receive('keyed_received', 10)"),
        timeout=30,  # a wait for the key's row would be a deadlock, reported after 1 s
    )
    assert [(m["message_id"], m["body"]) for m in got] == [(held, b"v1")]
    await receiver.execute("COMMIT")
    made = await sending
    assert made != held
    assert await setup.fetchval(KEY_ROW, "keyed_received") == made
    got = await setup.fetch("SELECT message_id, body FROM postbox.receive('keyed_received', 10)")
    assert [(m["message_id"], m["body"]) for m in got] == [(made, b"v2")]


async def test_a_keyed_send_replaces_body_attributes_and_priority_of_the_waiting_message(conns):
    setup, _, _ = conns
    await new_queue(setup, "keyed_content", 0)
    keyed = (
        "SELECT message_id, duplicate FROM postbox.send_batch('keyed_content', "
        "ARRAY[$1::bytea], attributes => ARRAY[$2::jsonb], priorities => ARRAY[$3::integer], "
        "dedupe_keys => ARRAY['k'])"
    )
    attribute = '{"n": {"data_type": "String", "string_value": "%s"}}'
    first = await setup.fetchrow(keyed, b"v1", attribute % 1, 0)
    second = await setup.fetchrow(keyed, b"v2", attribute % 2, 3)
    assert (second["message_id"], second["duplicate"]) == (first["message_id"], True)
    (got,) = await setup.fetch("SELECT * FROM postbox.receive('keyed_content', 10)")
    assert (got["message_id"], got["body"], got["priority"]) == (first["message_id"], b"v2", 3)
    assert json.loads(got["attributes"])["n"]["string_value"] == "2"


async def test_a_key_row_leaves_with_the_first_delivery_or_the_message(conns):
    setup, _, _ = conns
    await new_queue(setup, "key_rows", 0)
    await setup.fetchval(KEYED_SEND, "key_rows", b"v1")
    assert await setup.fetchval(KEY_ROW, "key_rows") is not None
    assert len(await setup.fetch("SELECT * FROM postbox.receive('key_rows', 10)")) == 1
    assert await setup.fetchval(KEY_ROW, "key_rows") is None
    cancelled = await setup.fetchval(KEYED_SEND, "key_rows", b"v2")
    await setup.execute("SELECT postbox.cancel_message('key_rows', $1)", cancelled)
    assert await setup.fetchval(KEY_ROW, "key_rows") is None
    await setup.fetchval(KEYED_SEND, "key_rows", b"v3")
    await setup.execute("SELECT postbox.purge_queue('key_rows')")
    assert await setup.fetchval(KEY_ROW, "key_rows") is None


async def test_a_batch_notifies_once(conns):
    setup, listener, _ = conns
    await new_queue(setup, "notify_batch", 0)
    await listens_to(listener, "notify_batch")
    payloads = await notifications_during(
        listener,
        lambda: setup.execute(
            "SELECT postbox.send_batch('notify_batch', array_fill('x'::bytea, ARRAY[1000]))"
        ),
    )
    assert payloads == ["notify_batch"]


async def test_sends_right_after_a_notification_skip_theirs(conns):
    setup, listener, _ = conns
    await new_queue(setup, "notify_throttled", 0)
    await listens_to(listener, "notify_throttled")
    queue_id = await setup.fetchval("SELECT id FROM postbox.queues WHERE name = 'notify_throttled'")
    notified_at = "SELECT set_config('postbox.notified_' || $1, $2, false)"

    async def sends_with_fresh_notification() -> None:
        # As if this session had notified a moment ago (an hour ahead: any moment).
        await setup.execute(notified_at, str(queue_id), str(time.time() * 1000 + 3_600_000))
        for _ in range(5):
            await setup.execute("SELECT postbox.send('notify_throttled', 'x')")

    assert await notifications_during(listener, sends_with_fresh_notification) == []

    async def sends_after_the_window() -> None:
        await setup.execute(notified_at, str(queue_id), str(time.time() * 1000 - 1000))
        await setup.execute("SELECT postbox.send('notify_throttled', 'x')")

    assert await notifications_during(listener, sends_after_the_window) == ["notify_throttled"]


async def test_a_rolled_back_notification_does_not_hold_back_the_next(conns):
    setup, listener, _ = conns
    await new_queue(setup, "notify_rolled_back", 0)
    await listens_to(listener, "notify_rolled_back")

    async def rolled_back_then_sent() -> None:
        await setup.execute("BEGIN")
        await setup.execute("SELECT postbox.send('notify_rolled_back', 'x')")
        await setup.execute("ROLLBACK")
        await setup.execute("SELECT postbox.send('notify_rolled_back', 'y')")

    assert await notifications_during(listener, rolled_back_then_sent) == ["notify_rolled_back"]


async def test_hostile_names_change_nothing(conns):
    setup, _, _ = conns
    before = await fingerprint(setup)
    queues_before = await setup.fetchval("SELECT count(*) FROM postbox.queues")
    hostile = [
        "x'; DROP TABLE postbox.messages; --",
        'x"); DROP SCHEMA postbox CASCADE; --',
        "x; SELECT pg_sleep(10)",
        r"names\with\backslashes",
        "ä.fifo",
        "a\nb",
    ]
    for name in hostile:
        with pytest.raises(asyncpg.PostgresError) as caught:
            await setup.execute("SELECT postbox.create_queue($1)", name)
        assert caught.value.sqlstate == "PB400"
        with pytest.raises(asyncpg.PostgresError) as caught:
            await setup.execute("SELECT postbox.send($1, 'x')", name)
        assert caught.value.sqlstate == "PB400"
    assert await fingerprint(setup) == before
    assert await setup.fetchval("SELECT count(*) FROM postbox.queues") == queues_before


async def test_content_based_deduplication_from_sql(conns):
    setup, _, _ = conns
    queue = "sql_by_content.fifo"
    await setup.execute(
        "SELECT postbox.create_queue($1, '{\"content_based_deduplication\": true}')", queue
    )
    first = await setup.fetchval("SELECT postbox.send($1, 'same', message_group_id => 'g')", queue)
    rows = await setup.fetch(
        "SELECT * FROM postbox.send_batch($1, ARRAY['same', 'new', 'new']::bytea[], "
        "message_group_ids => ARRAY['g', 'g', 'g'])",
        queue,
    )
    assert [r["duplicate"] for r in rows] == [True, False, True]
    assert rows[0]["message_id"] == first
    assert rows[2]["message_id"] == rows[1]["message_id"]
    stored = await setup.fetch(
        "SELECT deduplication_id FROM postbox.messages m JOIN postbox.queues q "
        "ON q.id = m.queue_id WHERE q.name = $1 ORDER BY m.id",
        queue,
    )
    assert [r[0] for r in stored] == [
        hashlib.sha256(b"same").hexdigest(),
        hashlib.sha256(b"new").hexdigest(),
    ]


PRINTABLE_ID = re.compile(r"[!-~]{1,128}")


@pytest.mark.parametrize("field", ["deduplication_ids", "message_group_ids"])
async def test_ids_are_1_to_128_printable_ascii_characters_and_nothing_else(conns, field):
    """send_batch checks these ids by length and a character class; this pins the rule
    that its old pattern, ^[!-~]{1,128}$, stated."""
    setup, _, _ = conns
    queue = f"sql_ids_{field}.fifo"
    await setup.execute(
        "SELECT postbox.create_queue($1, '{\"content_based_deduplication\": true}')", queue
    )
    texts = ["", "!", "~", "a" * 128, "a" * 129, "é" * 10, "a b", "a\tb", "a\x7f", "ab\n"]
    texts += ["\x1f", " a", "a ", "€", "a" * 127 + "é", "a" * 64 + "é" * 64]
    other = "message_group_ids" if field == "deduplication_ids" else "deduplication_ids"
    sent = 0
    for n, text in enumerate(texts):
        call = (
            f"SELECT count(*) FROM postbox.send_batch($1, ARRAY['x']::bytea[], {field} => $2, "
            f"{other} => $3)"
        )
        if PRINTABLE_ID.fullmatch(text):
            assert await setup.fetchval(call, queue, [text], [f"other-{n}"]) == 1
            sent += 1
            continue
        with pytest.raises(asyncpg.PostgresError) as caught:
            await setup.fetchval(call, queue, [text], [f"other-{n}"])
        assert caught.value.sqlstate == "PB400", repr(text)
        what = field.removesuffix("s")
        assert f"{what} must be 1 to 128 printable ASCII characters" in str(caught.value)
    stored = await setup.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )
    assert stored == sent == 3


# Topics' webhook deliveries and schedules: the claims of replicas' workers.


@pytest.fixture
async def unserved(admin_url, fresh_db) -> AsyncIterator[list[asyncpg.Connection]]:
    """Like conns, on a database of its own: no server's worker claims its rows meanwhile."""
    await migrate(fresh_db)
    database = await fresh_db.fetchval("SELECT current_database()")
    opened = [await asyncpg.connect(admin_url, database=database) for _ in range(2)]
    yield [fresh_db, *opened]
    for conn in opened:
        await conn.close()


CLAIM_DELIVERIES = "SELECT delivery_id FROM postbox.claim_webhook_deliveries(10)"


@pytest.mark.parametrize("deliveries", [1, 2])
async def test_webhook_workers_never_claim_the_same_delivery(unserved, deliveries):
    setup, conn_a, conn_b = unserved
    for n, positions in enumerate(SCHEDULES):
        topic = f"iso_hooks_{deliveries}_{n}"
        await setup.execute("SELECT postbox.create_topic($1)", topic)
        await setup.execute(
            "SELECT postbox.create_subscription($1, 'hook', webhook_url => 'http://127.0.0.1:9/')",
            topic,
        )
        for _ in range(deliveries):
            await setup.execute("SELECT * FROM postbox.publish($1, 'x')", topic)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(
            merge(
                positions,
                transaction(a, CLAIM_DELIVERIES),
                transaction(b, CLAIM_DELIVERIES),
            )
        )
        got_a = {r["delivery_id"] for r in a.results[1]}
        got_b = {r["delivery_id"] for r in b.results[1]}
        assert not got_a & got_b, f"schedule {positions}: both claimed {got_a & got_b}"
        assert len(got_a | got_b) == deliveries, f"schedule {positions}"


FIRE_DUE = (
    "SELECT s.name, f.error FROM postbox.claim_due_schedules(10) s "
    "CROSS JOIN LATERAL postbox.fire_schedule(s.id, now() + interval '1 hour') f"
)


async def _due_schedule(conn: asyncpg.Connection, name: str) -> None:
    await conn.execute("SELECT postbox.create_queue($1)", name)
    await conn.execute(
        "SELECT postbox.create_schedule($1, now() - interval '1 s', 'tick', target_queue => $1, "
        "every => interval '1 hour')",
        name,
    )


async def _queued(conn: asyncpg.Connection, queue: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1",
        queue,
    )


async def test_schedulers_never_fire_a_schedule_twice(unserved):
    setup, conn_a, conn_b = unserved
    for n, positions in enumerate(SCHEDULES):
        name = f"iso_fire_{n}"
        await _due_schedule(setup, name)
        a, b = Session(conn_a), Session(conn_b)
        await run_interleaving(merge(positions, transaction(a, FIRE_DUE), transaction(b, FIRE_DUE)))
        fired = [r["name"] for r in a.results[1] + b.results[1]]
        assert fired == [name], f"schedule {positions}: {fired}"
        assert await _queued(setup, name) == 1, f"schedule {positions}"


async def test_a_fire_commits_with_its_next_fire_time(unserved):
    setup, _, _ = unserved
    await _due_schedule(setup, "crashy")
    # A scheduler that dies before committing: nothing was sent, and it is still due.
    dying = setup.transaction()
    await dying.start()
    assert [r["name"] for r in await setup.fetch(FIRE_DUE)] == ["crashy"]
    assert await _queued(setup, "crashy") == 1
    await dying.rollback()
    assert await _queued(setup, "crashy") == 0
    row = await setup.fetchrow(
        "SELECT fire_count, next_fire_at <= now() AS due FROM postbox.schedules "
        "WHERE name = 'crashy'"
    )
    assert (row["fire_count"], row["due"]) == (0, True)
    # Committed: sent once, and not due again until its next time.
    assert [r["name"] for r in await setup.fetch(FIRE_DUE)] == ["crashy"]
    assert await setup.fetch(FIRE_DUE) == []
    assert await _queued(setup, "crashy") == 1


async def test_queue_health_follows_its_thresholds(db):
    dlq, source = "health_dlq", "health_src"
    await db.execute("SELECT postbox.create_queue($1)", dlq)
    await db.execute(
        "SELECT postbox.create_queue($1, $2::jsonb)",
        source,
        '{"dead_letter_policy": {"dead_letter_queue": "health_dlq", "max_receive_count": 3}}',
    )
    try:

        async def health() -> dict[str, tuple[str, str]]:
            rows = await db.fetch(
                "SELECT queue_name, status, reason FROM postbox.queue_health "
                "WHERE queue_name IN ($1, $2)",
                dlq,
                source,
            )
            return {row["queue_name"]: (row["status"], row["reason"]) for row in rows}

        assert await health() == {dlq: ("ok", ""), source: ("ok", "")}  # empty, not old
        await db.execute("SELECT postbox.send($1, 'dead')", dlq)
        assert (await health())[source] == ("warning", "1 dead letters")
        await db.execute("SET postbox.health_critical_dlq_depth = '1'")
        assert (await health())[source] == ("critical", "1 dead letters")
        await db.execute("SET postbox.health_critical_age = '0 s'")
        status, reason = (await health())[dlq]
        assert status == "critical"
        assert reason.startswith("oldest message ")
        await db.execute(
            "RESET postbox.health_critical_age; RESET postbox.health_critical_dlq_depth"
        )
        await db.execute("SELECT postbox.pause_queue($1, true, false)", source)
        assert (await health())[source] == ("warning", "1 dead letters; paused")
    finally:
        await db.execute("SELECT postbox.drop_queue($1)", source)
        await db.execute("SELECT postbox.drop_queue($1)", dlq)


@pytest.mark.parametrize(
    ("setting_up", "queue", "body"),
    [
        ("SELECT postbox.pause_queue('paused_sends', true, false)", "paused_sends", "x"),
        (
            "SELECT postbox.update_queue('small', '{\"max_message_size\": 1024}')",
            "small",
            "x" * 1025,
        ),
        ("", "no_such_queue", "x"),
        ("", "bad name!", "x"),
    ],
    ids=["paused", "too_large", "missing", "malformed"],
)
async def test_a_plain_send_fails_as_send_batch_does(conns, setting_up, queue, body):
    """postbox.send's straight path for a body alone hands every case it does not
    take to send_batch: the same error, word for word."""
    setup, _, _ = conns
    if setting_up:
        await setup.execute("SELECT postbox.create_queue($1)", queue)
        await setup.execute(setting_up)
    errors = []
    for call in ("SELECT postbox.send($1, $2)", "SELECT postbox.send_batch($1, ARRAY[$2::bytea])"):
        with pytest.raises(asyncpg.PostgresError) as caught:
            await setup.execute(call, queue, body.encode())
        errors.append((caught.value.sqlstate, str(caught.value)))
    assert errors[0] == errors[1]
    count = (
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1"
    )
    assert await setup.fetchval(count, queue) == 0


async def test_a_plain_batch_checks_each_body_only_when_the_whole_is_over_the_limit(conns):
    """send_batch's straight path bounds every body by the size of the whole array,
    and looks at the bodies one by one only past that bound. Both sides of it: a
    batch larger than max_message_size whose bodies all fit is sent, in order;
    one body over the limit fails the batch by its entry, and nothing is sent."""
    setup, _, _ = conns
    queue = "batch_size_bound"
    await setup.execute("SELECT postbox.create_queue($1)", queue)
    await setup.execute("SELECT postbox.update_queue($1, '{\"max_message_size\": 1024}')", queue)
    fitting = [bytes([65 + i]) * 1024 for i in range(3)]
    ids = [
        row["message_id"]
        for row in await setup.fetch("SELECT * FROM postbox.send_batch($1, $2)", queue, fitting)
    ]
    assert len(ids) == 3
    assert ids == sorted(ids)
    bodies = await setup.fetch(
        "SELECT m.body FROM postbox.messages m WHERE m.id = ANY ($1) ORDER BY m.id", ids
    )
    assert [row["body"] for row in bodies] == fitting
    with pytest.raises(asyncpg.PostgresError) as caught:
        await setup.execute("SELECT postbox.send_batch($1, $2)", queue, [b"x", b"y" * 1025, b"z"])
    assert caught.value.sqlstate == "PB400"
    assert "entry 1" in str(caught.value)
    assert "1024" in str(caught.value)
    count = (
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
        "WHERE q.name = $1"
    )
    assert await setup.fetchval(count, queue) == 3
