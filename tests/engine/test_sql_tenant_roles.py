"""Direct SQL users bound to tenants (issue 47): a login role bound to tenant A cannot
list, read, send to or even detect tenant B's resources through the engine's reader and
writer functions, names its own resources without the tenant, and sends into its own.

Two tenants and the default tenant hold resources of the same names. Each test logs in
as real login roles of this cluster (dropped afterwards), bound to a tenant directly or
through a group role, and calls every function postbox_reader and postbox_writer may.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from support import engine_database

TENANTS = ("acme", "globex")
PREFIXES = ("acme/", "globex/", "")  # the default tenant's names have no prefix


@pytest.fixture
async def engine_db(admin_url: str) -> AsyncIterator[str]:
    """The engine, tenants acme and globex, and in each of them and in the default tenant
    the same resources: queues orders (one message, its tenant's name as body) and
    graveyard (orders' dead-letter queue), topics events (subscription all into orders)
    and log (a stream with consumer group readers, one message behind), schedule tick."""

    async def seed(conn: asyncpg.Connection) -> None:
        for tenant in TENANTS:
            await conn.execute("SELECT 1 FROM postbox.create_tenant($1)", tenant)
        # globex alone has a queue only-b: acme must not tell it from one never made.
        await conn.execute("SELECT 1 FROM postbox.create_queue('globex/only-b')")
        for p in PREFIXES:
            await conn.execute("SELECT 1 FROM postbox.create_queue($1)", f"{p}graveyard")
            await conn.execute(
                "SELECT 1 FROM postbox.create_queue($1, jsonb_build_object('dead_letter_policy', "
                "jsonb_build_object('dead_letter_queue', $2::text, 'max_receive_count', 5)))",
                f"{p}orders",
                f"{p}graveyard",
            )
            await conn.execute(
                "SELECT postbox.send($1, $2)", f"{p}orders", (p.rstrip("/") or "-").encode()
            )
            await conn.execute("SELECT 1 FROM postbox.create_topic($1)", f"{p}events")
            await conn.execute(
                "SELECT 1 FROM postbox.create_subscription($1, 'all', '#', $2)",
                f"{p}events",
                f"{p}orders",
            )
            await conn.execute(
                "SELECT 1 FROM postbox.create_topic($1, stream_retention => '1 hour')", f"{p}log"
            )
            await conn.execute(
                "SELECT 1 FROM postbox.create_consumer_group($1, 'readers')", f"{p}log"
            )
            await conn.execute("SELECT 1 FROM postbox.publish($1, 'entry')", f"{p}log")
            await conn.execute(
                "SELECT 1 FROM postbox.create_schedule($1, now() + interval '1 day', 'tick', "
                "target_queue => $2, every => interval '1 day')",
                f"{p}tick",
                f"{p}orders",
            )

    async with engine_database(admin_url, "postbox_tenant_roles", seed) as url:
        yield url


@pytest.fixture
async def owner(engine_db: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(engine_db)
    try:
        yield conn
    finally:
        await conn.close()


Login = Callable[..., Awaitable[asyncpg.Connection]]


@pytest.fixture
async def roles(engine_db: str, owner: asyncpg.Connection) -> AsyncIterator[dict]:
    """make(granted, login=True) creates a role granted those roles; connect(role) logs
    in as it. Every role made is dropped afterwards."""
    made: list[str] = []
    conns: list[asyncpg.Connection] = []
    password = uuid.uuid4().hex

    async def make(*granted: str, login: bool = True) -> str:
        name = f"postbox_test_{uuid.uuid4().hex[:10]}"
        kind = f"LOGIN PASSWORD '{password}'" if login else "NOLOGIN"
        await owner.execute(f"CREATE ROLE {name} {kind}")
        made.append(name)
        for role in granted:
            await owner.execute(f"GRANT {role} TO {name}")
        return name

    async def connect(name: str) -> asyncpg.Connection:
        conn = await asyncpg.connect(engine_db, user=name, password=password)
        conns.append(conn)
        return conn

    async def bound(tenant: str) -> asyncpg.Connection:
        """A login role granted postbox_reader and postbox_writer, bound to tenant."""
        name = await make("postbox_reader", "postbox_writer")
        await owner.execute("SELECT postbox.bind_tenant_role($1, $2)", name, tenant)
        return await connect(name)

    try:
        yield {"make": make, "connect": connect, "bound": bound}
    finally:
        for conn in conns:
            await conn.close()
        await owner.execute("DELETE FROM postbox.tenant_roles")
        for name in reversed(made):
            await owner.execute(f"DROP OWNED BY {name}")
            await owner.execute(f"DROP ROLE {name}")


async def column(conn: asyncpg.Connection, query: str, *args: object) -> list:
    return [row[0] for row in await conn.fetch(query, *args)]


async def outcome(conn: asyncpg.Connection, query: str) -> tuple[str, str]:
    """What a call answers: its SQLSTATE and message, or ("ok", its status)."""
    try:
        async with conn.transaction():
            return "ok", await conn.execute(query)  # simple protocol: no row type to decode
    except asyncpg.PostgresError as error:
        return error.sqlstate, str(error)


async def failure(conn: asyncpg.Connection, query: str, *args: object) -> tuple[str, str]:
    """The SQLSTATE and message of a call that must fail."""
    try:
        await conn.fetch(query, *args)
    except asyncpg.PostgresError as error:
        return error.sqlstate, str(error)
    pytest.fail(f"{query} did not fail")


async def test_a_bound_role_reads_only_its_tenant_under_its_own_names(roles, owner):
    for tenant in TENANTS:
        conn = await roles["bound"](tenant)
        queues = (
            ["graveyard", "only-b", "orders"] if tenant == "globex" else ["graveyard", "orders"]
        )
        assert await conn.fetchval("SELECT postbox.caller_tenant()") == tenant
        assert await column(conn, "SELECT name FROM postbox.list_queues()") == queues
        assert await column(conn, "SELECT name FROM postbox.list_queues(after_name => 'graveyard')")
        assert await column(conn, "SELECT name FROM postbox.list_queues(name_prefix => 'or')") == [
            "orders"
        ]
        assert await conn.fetchval("SELECT name FROM postbox.get_queue('orders')") == "orders"
        assert await column(conn, "SELECT body FROM postbox.peek_messages('orders')") == [
            tenant.encode()
        ]
        assert await conn.fetchval("SELECT visible FROM postbox.queue_stats('orders')") == 1
        message_id = await owner.fetchval(
            "SELECT message_id FROM postbox.peek_messages($1)", f"{tenant}/orders"
        )
        got = await conn.fetchrow(
            "SELECT queue, body FROM postbox.get_message('orders', $1)", message_id
        )
        assert (got["queue"], got["body"]) == ("orders", tenant.encode())
        assert await column(conn, "SELECT body FROM postbox.list_archived_messages('orders')") == []
        assert await column(
            conn, "SELECT * FROM postbox.list_dead_letter_source_queues('graveyard')"
        ) == ["orders"]
        assert await column(conn, "SELECT id FROM postbox.list_redrive_tasks('graveyard')") == []
        for listing in (
            "SELECT queue_name FROM postbox.queue_metrics()",
            "SELECT queue_name FROM postbox.queue_rates('1 minute')",
            "SELECT queue_name FROM postbox.queue_health",
            "SELECT DISTINCT queue_name FROM postbox.queue_throughput ORDER BY 1",
        ):
            assert await column(conn, listing) == queues, listing
        assert await column(
            conn, "SELECT queue_name FROM postbox.queue_rates('1 minute', 'orders')"
        )
        assert await column(conn, "SELECT name FROM postbox.list_topics()") == ["events", "log"]
        assert await conn.fetchval("SELECT name FROM postbox.get_topic('events')") == "events"
        assert await column(conn, "SELECT name FROM postbox.list_subscriptions('events')") == [
            "all"
        ]
        assert (
            await conn.fetchval("SELECT name FROM postbox.get_subscription('events', 'all')")
            == "all"
        )
        assert (
            await column(conn, "SELECT id FROM postbox.list_webhook_deliveries('events', 'all')")
            == []
        )
        assert await column(conn, "SELECT name FROM postbox.list_schedules()") == ["tick"]
        schedule = await conn.fetchrow(
            "SELECT name, target_queue FROM postbox.get_schedule('tick')"
        )
        assert (schedule["name"], schedule["target_queue"]) == ("tick", "orders")
        group = await conn.fetchrow(
            "SELECT topic, lag_messages FROM postbox.get_consumer_group('log', 'readers')"
        )
        assert (group["topic"], group["lag_messages"]) == ("log", 1)
        assert await column(conn, "SELECT topic FROM postbox.list_consumer_groups('log')") == [
            "log"
        ]
        assert await conn.fetchrow(
            "SELECT cursor_offset FROM postbox.stream_position('log', 'readers')"
        )
        assert (
            await column(
                conn, "SELECT body FROM postbox.list_stream_dead_letters('log', 'readers')"
            )
            == []
        )
        for listing in (
            "SELECT topic FROM postbox.stream_metrics()",
            "SELECT topic FROM postbox.consumer_group_health()",
            "SELECT topic FROM postbox.stream_health",
        ):
            assert await column(conn, listing) == ["log"], listing
        assert await column(conn, "SELECT topic FROM postbox.stream_latency()") == []
        held = await column(conn, "SELECT unnest(held_by) FROM postbox.stream_rotation")
        assert all(not name.startswith(("acme/", "globex/")) for name in held)


# Every reader and writer function that takes a name, with {q}, {t} and {s} for a
# queue's, a topic's and a schedule's name.
NAMED_CALLS = [
    "SELECT * FROM postbox.queue_stats('{q}')",
    "SELECT * FROM postbox.queue_rates('1 minute', '{q}')",
    "SELECT * FROM postbox.peek_messages('{q}')",
    "SELECT * FROM postbox.get_message('{q}', 1)",
    "SELECT * FROM postbox.list_archived_messages('{q}')",
    "SELECT * FROM postbox.get_queue('{q}')",
    "SELECT * FROM postbox.list_dead_letter_source_queues('{q}')",
    "SELECT * FROM postbox.list_redrive_tasks('{q}')",
    "SELECT * FROM postbox.get_topic('{t}')",
    "SELECT * FROM postbox.get_subscription('{t}', 'all')",
    "SELECT * FROM postbox.list_subscriptions('{t}')",
    "SELECT * FROM postbox.list_webhook_deliveries('{t}', 'all')",
    "SELECT * FROM postbox.get_schedule('{s}')",
    "SELECT * FROM postbox.get_consumer_group('{t}', 'readers')",
    "SELECT * FROM postbox.list_consumer_groups('{t}')",
    "SELECT * FROM postbox.stream_position('{t}', 'readers')",
    "SELECT * FROM postbox.list_stream_dead_letters('{t}', 'readers')",
    "SELECT postbox.send('{q}', 'x')",
    "SELECT * FROM postbox.send_batch('{q}', ARRAY['x']::bytea[])",
    "SELECT * FROM postbox.send_batch('{q}', ARRAY['x']::bytea[], request_id => 'r1')",
    "SELECT * FROM postbox.publish('{t}', 'x')",
    "SELECT * FROM postbox.publish_batch('{t}', ARRAY['x']::bytea[])",
]


async def test_another_tenants_resource_answers_as_a_missing_one(roles, owner):
    """globex's only-b (a queue, and as topic and schedule names that exist nowhere) errs
    for acme exactly as never-made does; a name with globex's prefix, or any other
    tenant's, is refused alike whether it exists or not; nothing is written."""
    conn = await roles["bound"]("acme")
    before = await owner.fetchval("SELECT count(*) FROM postbox.messages")
    for call in NAMED_CALLS:
        foreign = await outcome(conn, call.format(q="only-b", t="only-b", s="only-b"))
        missing = await outcome(conn, call.format(q="never-made", t="never-made", s="never-made"))
        # queue_rates answers an unknown queue with no rows; every other call, PB404.
        assert missing[0] == ("ok" if "queue_rates" in call else "PB404"), call
        assert (foreign[0], foreign[1].replace("only-b", "never-made")) == missing, call
        prefixed = await outcome(
            conn, call.format(q="globex/orders", t="globex/events", s="globex/tick")
        )
        unknown = await outcome(
            conn, call.format(q="nobody/orders", t="nobody/events", s="nobody/tick")
        )
        assert prefixed[0] == unknown[0] == "PB400", call
        assert prefixed[1].replace("globex/", "nobody/") == unknown[1], call
    # globex's message ids are not acme's either.
    b_message = await owner.fetchval(
        "SELECT message_id FROM postbox.peek_messages('globex/orders')"
    )
    foreign = await failure(conn, "SELECT body FROM postbox.get_message('orders', $1)", b_message)
    missing = await failure(conn, "SELECT body FROM postbox.get_message('orders', $1)", 10**12)
    assert foreign[1].replace(str(b_message), "N") == missing[1].replace(str(10**12), "N")
    assert await owner.fetchval("SELECT count(*) FROM postbox.messages") == before


async def test_sends_and_publishes_land_in_the_callers_tenant(roles, owner):
    conn = await roles["bound"]("acme")
    await conn.fetchval("SELECT postbox.send('orders', 'sent')")
    await conn.fetch(
        "SELECT message_id FROM postbox.send_batch('orders', ARRAY['batched']::bytea[])"
    )
    published = await conn.fetchrow("SELECT queues FROM postbox.publish('events', 'published')")
    assert published["queues"] == ["orders"]
    batch = await conn.fetch(
        "SELECT queues FROM postbox.publish_batch('events', ARRAY['fanned']::bytea[])"
    )
    assert [row["queues"] for row in batch] == [["orders"]]
    # The full name of its own tenant is its own queue too (the engine's functions pass
    # full names to one another).
    await conn.fetchval("SELECT postbox.send('acme/orders', 'full')")
    bodies = {
        p: await column(owner, "SELECT body FROM postbox.peek_messages($1)", f"{p}orders")
        for p in PREFIXES
    }
    assert bodies == {
        "acme/": [b"acme", b"sent", b"batched", b"published", b"fanned", b"full"],
        "globex/": [b"globex"],
        "": [b"-"],
    }


async def test_an_unbound_role_sees_every_tenant_as_before(roles, owner):
    bound_elsewhere = await roles["bound"]("acme")  # a binding exists, not for this role
    assert await bound_elsewhere.fetchval("SELECT postbox.caller_tenant()") == "acme"
    conn = await roles["connect"](await roles["make"]("postbox_reader", "postbox_writer"))
    assert await conn.fetchval("SELECT postbox.caller_tenant()") is None
    assert await column(conn, "SELECT name FROM postbox.list_queues(name_prefix => 'acme/')") == [
        "acme/graveyard",
        "acme/orders",
    ]
    assert len(await column(conn, "SELECT name FROM postbox.list_queues()")) == 7
    assert await column(conn, "SELECT body FROM postbox.peek_messages('globex/orders')") == [
        b"globex"
    ]
    await conn.fetchval("SELECT postbox.send('orders', 'default')")
    assert await column(owner, "SELECT body FROM postbox.peek_messages('orders')") == [
        b"-",
        b"default",
    ]


async def test_a_binding_holds_through_group_roles_and_set_role(roles, owner):
    group = await roles["make"]("postbox_reader", login=False)
    await owner.execute("SELECT postbox.bind_tenant_role($1, 'globex')", group)
    member = await roles["connect"](await roles["make"](group))
    assert await column(member, "SELECT name FROM postbox.list_topics()") == ["events", "log"]
    assert await member.fetchval("SELECT postbox.caller_tenant()") == "globex"
    # Setting a role it belongs to, unbound itself, does not shed the binding.
    await member.execute("SET ROLE postbox_reader")
    assert await member.fetchval("SELECT postbox.caller_tenant()") == "globex"
    # The owner (a superuser here) acts for a bound role it sets, and for all after.
    await owner.execute(f"SET ROLE {group}")
    try:
        assert await owner.fetchval("SELECT postbox.caller_tenant()") == "globex"
        assert await column(owner, "SELECT body FROM postbox.peek_messages('orders')") == [
            b"globex"
        ]
    finally:
        await owner.execute("RESET ROLE")
    assert await owner.fetchval("SELECT postbox.caller_tenant()") is None


async def test_a_role_that_cannot_be_confined_is_refused(roles, owner):
    # Bound to two tenants through two groups: it acts for neither.
    groups = [await roles["make"](login=False) for _ in TENANTS]
    for group, tenant in zip(groups, TENANTS, strict=True):
        await owner.execute("SELECT postbox.bind_tenant_role($1, $2)", group, tenant)
    torn = await roles["connect"](await roles["make"]("postbox_reader", *groups))
    state, message = await failure(torn, "SELECT name FROM postbox.list_queues()")
    assert (state, "acme, globex" in message) == ("42501", True)
    # Bound, then made an admin: its reader calls fail rather than cross tenants.
    name = await roles["make"]("postbox_reader")
    await owner.execute("SELECT postbox.bind_tenant_role($1, 'acme')", name)
    await owner.execute(f"GRANT postbox_admin TO {name}")
    admin = await roles["connect"](name)
    state, message = await failure(admin, "SELECT name FROM postbox.list_queues()")
    assert (state, "postbox_admin" in message) == ("42501", True)
    # bind_tenant_role refuses an admin, a superuser or the owner, an unknown role or tenant.
    for role, tenant, expected in [
        (name, "acme", "PB400"),
        (await owner.fetchval("SELECT current_user"), "acme", "PB400"),
        ("no_such_role", "acme", "PB404"),
        (groups[0], "no-such-tenant", "PB404"),
    ]:
        state, _ = await failure(owner, "SELECT postbox.bind_tenant_role($1, $2)", role, tenant)
        assert state == expected, role


async def test_a_tenant_with_bound_roles_is_not_deleted_until_they_are_unbound(roles, owner):
    role = await roles["make"]("postbox_reader")
    await owner.execute("SELECT postbox.bind_tenant_role($1, 'acme')", role)
    assert await column(owner, "SELECT role_name::text FROM postbox.list_tenant_roles('acme')") == [
        role
    ]
    state, message = await failure(owner, "SELECT postbox.delete_tenant('acme', force => true)")
    assert (state, role in message) == ("PB412", True)
    assert await owner.fetchval("SELECT postbox.unbind_tenant_role($1)", role) is True
    assert await owner.fetchval("SELECT postbox.unbind_tenant_role($1)", role) is False
    await owner.execute("SELECT postbox.delete_tenant('acme', force => true)")
    conn = await roles["connect"](role)
    assert await conn.fetchval("SELECT postbox.caller_tenant()") is None


# What the tests above call, as a bound role: a function granted to readers or writers
# later must be scoped and added here (the list is what this file proves, not a copy of
# the grants).
COVERED = {
    "caller_tenant",
    "consumer_group_health",
    "get_consumer_group",
    "get_message",
    "get_queue",
    "get_schedule",
    "get_subscription",
    "get_topic",
    "list_archived_messages",
    "list_consumer_groups",
    "list_dead_letter_source_queues",
    "list_queues",
    "list_redrive_tasks",
    "list_schedules",
    "list_stream_dead_letters",
    "list_subscriptions",
    "list_topics",
    "list_webhook_deliveries",
    "peek_messages",
    "publish",
    "publish_batch",
    "queue_metrics",
    "queue_rates",
    "queue_stats",
    "send",
    "send_batch",
    "stream_latency",
    "stream_metrics",
    "stream_position",
}
COVERED_VIEWS = {"queue_health", "queue_throughput", "stream_health", "stream_rotation"}


async def test_every_function_and_view_of_readers_and_writers_is_covered(owner):
    granted = await column(
        owner,
        """
        SELECT DISTINCT p.proname::text FROM pg_proc p
        WHERE p.pronamespace = 'postbox'::regnamespace
              AND (has_function_privilege('postbox_reader', p.oid, 'EXECUTE')
                   OR has_function_privilege('postbox_writer', p.oid, 'EXECUTE'))
        """,
    )
    views = await column(
        owner,
        "SELECT c.relname::text FROM pg_class c WHERE c.relnamespace = 'postbox'::regnamespace "
        "AND (has_table_privilege('postbox_reader', c.oid, 'SELECT') "
        "OR has_table_privilege('postbox_writer', c.oid, 'SELECT'))",
    )
    assert set(granted) == COVERED
    assert set(views) == COVERED_VIEWS
