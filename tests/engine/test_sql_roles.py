"""Direct SQL users: the three roles the engine ships, and its fixed search_path.

Each test logs in as a role of its own that is granted one of postbox_reader,
postbox_writer or postbox_admin, or none, and calls the engine's functions the way
an application's own transaction would.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from support import engine_database

DENIED = asyncpg.exceptions.InsufficientPrivilegeError


@pytest.fixture
async def engine_db(admin_url: str) -> AsyncIterator[str]:
    """A new database with the engine installed and one queue and one topic; its URL."""

    async def seed(conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT postbox.create_queue('jobs')")
        await conn.execute("SELECT postbox.create_topic('events')")
        await conn.execute("SELECT postbox.create_subscription('events', 'all', '#', 'jobs')")
        await conn.execute("SELECT postbox.send('jobs', 'seed')")

    async with engine_database(admin_url, "postbox_roles", seed) as url:
        yield url


@pytest.fixture
async def login_as(engine_db: str) -> AsyncIterator:
    """Connects as a new login role granted the given postbox role (or none)."""
    owner = await asyncpg.connect(engine_db)
    made: list[str] = []
    conns: list[asyncpg.Connection] = []

    async def connect(granted: str | None) -> asyncpg.Connection:
        name = f"postbox_test_{uuid.uuid4().hex[:10]}"
        password = uuid.uuid4().hex
        await owner.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        made.append(name)
        if granted:
            await owner.execute(f"GRANT {granted} TO {name}")
        conn = await asyncpg.connect(engine_db, user=name, password=password)
        conns.append(conn)
        return conn

    try:
        yield connect
    finally:
        for conn in conns:
            await conn.close()
        for name in made:
            await owner.execute(f"DROP OWNED BY {name}")
            await owner.execute(f"DROP ROLE {name}")
        await owner.close()


READS = [
    "SELECT * FROM postbox.queue_stats('jobs')",
    "SELECT * FROM postbox.peek_messages('jobs')",
    "SELECT * FROM postbox.get_queue('jobs')",
    "SELECT * FROM postbox.list_queues()",
    "SELECT * FROM postbox.get_topic('events')",
    "SELECT * FROM postbox.list_subscriptions('events')",
    "SELECT * FROM postbox.queue_health",
    "SELECT * FROM postbox.queue_throughput",
    "SELECT * FROM postbox.queue_rates('5 minutes', 'jobs')",
    "SELECT * FROM postbox.stream_health",
    "SELECT * FROM postbox.stream_rotation",
    "SELECT * FROM postbox.stream_latency()",
]
WRITES = [
    "SELECT postbox.send('jobs', 'hello')",
    "SELECT postbox.publish('events', 'hello')",
]
ADMIN = [
    "SELECT * FROM postbox.receive('jobs', 1)",
    "SELECT postbox.create_queue('more')",
    "SELECT postbox.purge_queue('jobs')",
    # What a server writes: its processes' counts (queue_throughput's source).
    "SELECT postbox.record_activity('{jobs}', '{1}', '{0}', '{0}', '{0}', '{0}', '{NULL}')",
]
TABLES = [
    "SELECT * FROM postbox.messages",
    "INSERT INTO postbox.messages (queue_id, body) SELECT id, 'x' FROM postbox.queues",
]


async def _allowed(conn: asyncpg.Connection, statement: str) -> bool:
    try:
        async with conn.transaction():
            await conn.execute(statement)  # simple protocol: nothing to decode
    except DENIED:
        return False
    return True


async def test_a_reader_reads_and_nothing_more(login_as):
    conn = await login_as("postbox_reader")
    assert [await _allowed(conn, s) for s in READS] == [True] * len(READS)
    assert [await _allowed(conn, s) for s in WRITES + ADMIN + TABLES] == [False] * len(
        WRITES + ADMIN + TABLES
    )


async def test_a_writer_sends_and_publishes_and_nothing_more(login_as):
    conn = await login_as("postbox_writer")
    assert [await _allowed(conn, s) for s in WRITES] == [True, True]
    assert [await _allowed(conn, s) for s in READS + ADMIN + TABLES] == [False] * len(
        READS + ADMIN + TABLES
    )


async def test_an_admin_does_everything(login_as):
    conn = await login_as("postbox_admin")
    assert [await _allowed(conn, s) for s in READS + WRITES + ADMIN] == [True] * len(
        READS + WRITES + ADMIN
    )
    assert await _allowed(conn, TABLES[0])


async def test_a_role_without_a_grant_calls_nothing(login_as):
    conn = await login_as(None)
    assert [await _allowed(conn, s) for s in READS + WRITES + ADMIN] == [False] * len(
        READS + WRITES + ADMIN
    )


FILTER_HELPERS = [
    "SELECT postbox.filter_policy_problem('{\"a\": [\"x\"]}', 'attributes')",
    'SELECT postbox.filter_matches(\'{"a": ["x"]}\', \'body\', NULL, \'{"a": "x"}\')',
]


@pytest.mark.parametrize("granted", ["postbox_reader", "postbox_writer", "postbox_admin", None])
async def test_filter_policy_helpers_are_granted_as_routing_key_problem_is(login_as, granted):
    conn = await login_as(granted)
    expected = await _allowed(conn, "SELECT postbox.routing_key_problem('a.b')")
    assert [await _allowed(conn, s) for s in FILTER_HELPERS] == [expected] * 2
    assert expected is (granted == "postbox_admin")


async def test_a_callers_schema_cannot_shadow_what_the_engine_calls(login_as, engine_db):
    """The writer puts a schema of its own before pg_catalog, with a clock_timestamp()
    that fails; send (whose wake-up notice reads the clock) runs on pg_catalog's."""
    owner = await asyncpg.connect(engine_db)
    try:
        await owner.execute("CREATE SCHEMA shadow")
        await owner.execute(
            "CREATE FUNCTION shadow.clock_timestamp() RETURNS timestamptz LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'shadowed'; END $$"
        )
        await owner.execute("GRANT USAGE ON SCHEMA shadow TO PUBLIC")
        conn = await login_as("postbox_writer")
        await conn.execute("SET search_path = shadow, pg_catalog")
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_proc WHERE proname = 'clock_timestamp'")
            == 2
        )
        with pytest.raises(asyncpg.RaiseError, match="shadowed"):
            await conn.fetchval("SELECT clock_timestamp()")  # the caller's own calls see it
        for _ in range(3):
            await conn.fetchval("SELECT postbox.send('jobs', 'not shadowed')")
    finally:
        await owner.close()


async def test_every_public_function_has_the_fixed_path(engine_db):
    conn = await asyncpg.connect(engine_db)
    try:
        loose = await conn.fetch(
            """
            SELECT p.proname FROM pg_proc p
            WHERE p.pronamespace = 'postbox'::regnamespace AND p.provolatile <> 'i'
              AND p.prorettype <> 'trigger'::regtype AND left(p.proname, 1) <> '_'
              AND NOT (p.prosecdef
                       AND p.proconfig @> ARRAY['search_path=pg_catalog, postbox, pg_temp'])
            """
        )
        public = await conn.fetchval(
            "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = 'postbox'::regnamespace "
            "AND has_function_privilege('public', p.oid, 'EXECUTE')"
        )
    finally:
        await conn.close()
    assert [r["proname"] for r in loose] == []
    assert public == 0
