"""Uninstall removes what postbox made and nothing else.

A private cluster that preloads pg_cron (postbox's job lives in cron.job) holds a
user's own schema, table, trigger, function, role, grant and cron job. The catalog
before postbox is installed must equal the catalog after it is uninstalled, with the
user's objects and rows intact, whatever postbox did in between: queues, a capture
trigger on the user's table, a pg_cron job, its roles granted to the user's role.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import asyncpg
import pytest
from cron_cluster import cron_cluster

from bench.pg_cluster import PG_BIN, Postgres
from postbox_server.db.migrate import migrate

# Everything a database and its cluster hold that an install could add to, by name.
CATALOG = """
SELECT 'schema ' || nspname || ' ' || coalesce(nspacl::text, '') FROM pg_namespace
UNION ALL
SELECT 'relation ' || c.oid::regclass::text || ' ' || c.relkind::text || ' '
       || coalesce(c.relacl::text, '')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname !~ '^pg_toast'
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' ' || coalesce(p.proacl::text, '')
FROM pg_proc p
UNION ALL
SELECT 'type ' || t.oid::regtype::text FROM pg_type t
UNION ALL
SELECT 'trigger ' || tgrelid::regclass::text || ' ' || tgname FROM pg_trigger
UNION ALL
SELECT 'event trigger ' || evtname FROM pg_event_trigger
UNION ALL
SELECT 'extension ' || extname || ' ' || extversion FROM pg_extension
UNION ALL
SELECT 'role ' || rolname || ' ' || coalesce(shobj_description(oid, 'pg_authid'), '')
FROM pg_roles
UNION ALL
SELECT 'member ' || roleid::regrole::text || ' ' || member::regrole::text FROM pg_auth_members
UNION ALL
SELECT 'database ' || datname || ' ' || coalesce(datacl::text, '') FROM pg_database
UNION ALL
SELECT 'cron ' || coalesce(jobname, '') || ' ' || schedule || ' ' || command || ' ' || database
       || ' ' || username
FROM cron.job
ORDER BY 1
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Postgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail("Debian's postgresql-15 is not installed (.ci/run installs it)")
    with cron_cluster("postbox-uninstall-") as postgres:
        postgres.sql(
            "CREATE ROLE app_user LOGIN;"
            "CREATE SCHEMA app;"
            "CREATE TABLE app.orders (id serial PRIMARY KEY, item text NOT NULL,"
            " touched timestamptz);"
            "CREATE FUNCTION app.touch() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN NEW.touched := now(); RETURN NEW; END $$;"
            "CREATE TRIGGER touch BEFORE INSERT ON app.orders"
            " FOR EACH ROW EXECUTE FUNCTION app.touch();"
            "GRANT USAGE ON SCHEMA app TO app_user;"
            "GRANT SELECT, INSERT ON app.orders TO app_user;"
            "GRANT USAGE ON SEQUENCE app.orders_id_seq TO app_user;"
            "INSERT INTO app.orders (item) VALUES ('kept');"
            "SELECT cron.schedule('nightly report', '0 3 * * *',"
            " 'SELECT count(*) FROM app.orders');"
        )
        yield postgres


async def _catalog(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        return [row[0] for row in await conn.fetch(CATALOG)]
    finally:
        await conn.close()


def _postbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postbox_server", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_uninstall_needs_a_database_url():
    refused = _postbox("uninstall", "--yes", env={"DATABASE_URL": ""})
    assert refused.returncode == 2
    assert "give --database-url or set DATABASE_URL" in refused.stderr


async def test_uninstall_leaves_the_catalog_as_it_was_before_the_install(cluster):
    url = cluster.url()
    before = await _catalog(url)
    assert any(line.startswith("cron nightly report") for line in before)
    installed = _postbox("migrate", "--database-url", url)
    assert installed.returncode == 0, installed.stderr
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SELECT postbox.create_queue('order-events')")
        await conn.execute("SELECT postbox.create_topic('orders')")
        await conn.execute(
            "SELECT postbox.create_subscription('orders', 'all', '#', 'order-events')"
        )
        await conn.execute("SELECT postbox.capture('app.orders', 'orders', 'shop')")
        await conn.execute("SELECT postbox.start('1 minute')")
        await conn.execute("GRANT postbox_writer TO app_user")
        await conn.execute("INSERT INTO app.orders (item) VALUES ('captured')")
        assert await conn.fetchval("SELECT (postbox.queue_stats('order-events')).visible") == 1
    finally:
        await conn.close()
    assert await _catalog(url) != before

    refused = _postbox("uninstall", "--database-url", url)
    assert refused.returncode == 2
    assert "--yes" in refused.stderr
    assert "postbox" in "".join(line for line in await _catalog(url) if line.startswith("schema"))

    done = _postbox("uninstall", "--database-url", url, "--yes")
    assert done.returncode == 0, done.stderr
    assert "1 pg_cron job(s) and 1 capture trigger(s) removed" in done.stdout
    assert "postbox_admin, postbox_reader, postbox_writer" in done.stdout

    assert await _catalog(url) == before
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM app.orders") == 2
        await conn.execute("INSERT INTO app.orders (item) VALUES ('after')")  # no trigger left
    finally:
        await conn.close()
    again = _postbox("uninstall", "--database-url", url, "--yes")
    assert again.returncode == 1
    assert "not installed" in again.stderr


async def test_roles_stay_while_another_database_uses_them(cluster):
    """Roles belong to the cluster: the first of two databases to uninstall keeps them
    (the other's grants need them), the last one drops them."""
    before = await _catalog(cluster.url())
    for name in ("one", "two"):
        cluster.sql(f"CREATE DATABASE {name}")
    try:
        for name in ("one", "two"):
            conn = await asyncpg.connect(cluster.url(name))
            try:
                await migrate(conn)
            finally:
                await conn.close()
        results = []
        for name in ("one", "two"):
            conn = await asyncpg.connect(cluster.url(name))
            try:
                results.append(json.loads(await conn.fetchval("SELECT postbox.uninstall()")))
                assert await conn.fetchval("SELECT to_regnamespace('postbox')") is None
            finally:
                await conn.close()
        roles = ["postbox_admin", "postbox_reader", "postbox_writer"]
        assert results[0]["kept_roles"] == roles
        assert results[0]["dropped_roles"] == []
        assert results[1]["dropped_roles"] == roles
    finally:
        for name in ("one", "two"):
            cluster.sql(f"DROP DATABASE IF EXISTS {name}")
    assert await _catalog(cluster.url()) == before


async def test_a_role_made_by_hand_is_not_postboxs_to_drop(cluster):
    cluster.sql("CREATE ROLE postbox_reader NOLOGIN")
    cluster.sql("CREATE DATABASE three")
    try:
        conn = await asyncpg.connect(cluster.url("three"))
        try:
            await migrate(conn)
            done = json.loads(await conn.fetchval("SELECT postbox.uninstall()"))
        finally:
            await conn.close()
        assert done["dropped_roles"] == ["postbox_admin", "postbox_writer"]
        assert cluster.sql("SELECT count(*) FROM pg_roles WHERE rolname = 'postbox_reader'") == "1"
    finally:
        cluster.sql("DROP DATABASE IF EXISTS three")
        cluster.sql("DROP ROLE IF EXISTS postbox_reader")
