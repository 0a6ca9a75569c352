"""Maintenance from SQL alone: postbox.tick(), its cron evaluator, its locks, and pg_cron.

tick() runs the housekeeping a server's workers run (expiry, records, redrives,
rotation, schedules, activity, old webhook deliveries) by calling the same SQL
functions, so a server and tick share their locks. Schedules fired by tick get their
next fire time from postbox.cron_next, which must agree with cronsim, the server's
library: the comparison runs over many expressions, zones and daylight-saving edges.
The last test runs Debian's pg_cron in a private cluster with no postbox server.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest
from cron_cluster import cron_cluster
from support import engine_database

from bench.pg_cluster import PG_BIN, Postgres
from postbox_server.db.engine import Engine
from postbox_server.db.migrate import migrate
from postbox_server.errors import ApiError
from postbox_server.workers.scheduling import (
    fire_plan,
    next_cron_time,
    next_interval_time,
)

EXPRESSIONS = [
    "* * * * *", "0 9 * * MON-FRI", "*/15 * * * *", "30 2 * * *", "0 2 * * *", "15 1 * * *",
    "*/30 1-3 * * *", "0 0 L * *", "0 12 LW * *", "0 8 * * 5L", "0 8 * * MON#2", "0 0 1 1 *",
    "0 0 29 2 *", "0 0 31 * *", "5 4 * * sun", "0 0 13 * 5", "0 22 * * 1-5", "23 0-20/2 * * *",
    "0 0,12 1 */2 *", "1-59/7 * * * *", "0 3 * * 7", "*/5 2 * * *", "0 */2 * * *", "45 23 * * 6",
    "0 0 * * 0#5", "0 0 1-7 * 1", "0 9-17 * * 1-5", "0 0 * 2 MON#5", "10 * * * *", "59 1 * * *",
    "0 1 * * *", "30 1 * * *", "0 0 30 1,3 *", "0 0 15,L * *", "7 */3 * JAN-MAR *", "0 0 * * */2",
    "0 4 8-14 * 2", "2 2 2 2 *", "0 0 LW 2 *", "*/10 0 * * 0L", "0  12\t* * *", "0 5/20 * * *",
]  # fmt: skip
BAD_EXPRESSIONS = [
    "* * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *", "* * * * 8", "*/0 * * * *",
    "5-1 * * * *", "a * * * *", "* * * * 1#6", "* * * * 1#2#3", "* * 30 2 *", "* * * * L",
    "* * * FOO *", "1,,2 * * * *", "* * * * * *",
]  # fmt: skip
# Zones with daylight-saving changes north and south, at midnight (Santiago), at a
# half hour (Tehran, Kolkata without), and UTC.
ZONES = [
    "UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney", "Asia/Kolkata",
    "America/Santiago", "Pacific/Auckland", "Asia/Tehran",
]  # fmt: skip


@pytest.fixture
async def engine_url(admin_url: str) -> AsyncIterator[str]:
    """A new database with the engine installed; its URL."""
    async with engine_database(admin_url, "postbox_tick") as url:
        yield url


@pytest.fixture
async def engine(engine_url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(engine_url)
    try:
        yield conn
    finally:
        await conn.close()


def _starts() -> list[datetime]:
    """Times around the daylight-saving changes of both hemispheres in 2025 and 2026, at
    odd seconds and microseconds too, plus ordinary days."""
    rng = random.Random(44)
    starts = []
    for year in (2025, 2026):
        for month, day in [(3, 8), (3, 29), (4, 5), (9, 6), (10, 25), (11, 1), (6, 15)]:
            base = datetime(year, month, day, tzinfo=timezone.utc)
            for hour in range(48):
                starts.append(
                    base
                    + timedelta(hours=hour, minutes=rng.choice([0, 0, 29, 30, 59]))
                    + timedelta(seconds=rng.choice([0, 0, 59]), microseconds=rng.choice([0, 500]))
                )
    return starts


async def test_cron_next_agrees_with_cronsim_across_zones_and_daylight_saving(engine):
    rng = random.Random(4)
    starts = _starts()
    cases = [(e, z, s) for e in EXPRESSIONS for z in ZONES for s in rng.sample(starts, 24)]
    expected = [next_cron_time(e, z, s) for e, z, s in cases]
    # The session's own zone must play no part: one whose clock skips midnight.
    await engine.execute("SET TimeZone = 'America/Santiago'")
    rows = await engine.fetch(
        "SELECT postbox.cron_next(e, z, s) FROM unnest($1::text[], $2::text[], $3::timestamptz[])"
        " WITH ORDINALITY AS u(e, z, s, i) ORDER BY i",
        *map(list, zip(*cases, strict=True)),
    )
    answers = zip(cases, expected, [row[0] for row in rows], strict=True)
    differ = [(case, want, got) for case, want, got in answers if want != got]
    assert not differ, f"{len(differ)} of {len(cases)} differ, e.g. {differ[:5]}"
    assert len(cases) > 8000


@pytest.mark.parametrize("expression", BAD_EXPRESSIONS)
async def test_cron_next_refuses_what_cronsim_refuses(engine, expression):
    with pytest.raises(ApiError):
        next_cron_time(expression, "UTC", datetime.now(timezone.utc))
    with pytest.raises(asyncpg.PostgresError) as refused:
        await engine.fetchval("SELECT postbox.cron_next($1, 'UTC', now())", expression)
    assert refused.value.sqlstate == "PB400"
    assert "field" in refused.value.message or "bad " in refused.value.message


async def test_cron_next_names_no_time_when_cronsim_names_none(engine):
    # February the 30th or 31st never comes, on a day that must also be a weekday.
    after = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert next_cron_time("0 0 31 2 MON", "UTC", after) == await engine.fetchval(
        "SELECT postbox.cron_next('0 0 31 2 MON', 'UTC', $1)", after
    )
    with pytest.raises(asyncpg.PostgresError, match="time zone"):
        await engine.fetchval("SELECT postbox.cron_next('* * * * *', 'Mars/Olympus', now())")


async def test_an_interval_schedule_keeps_its_phase_as_the_server_computes_it(engine):
    await engine.execute("SELECT postbox.create_queue('beats')")
    due = datetime(2026, 3, 29, 0, 59, 30, tzinfo=timezone.utc)
    every = timedelta(days=1, seconds=7)
    await engine.execute(
        "SELECT postbox.create_schedule('beat', $1, 'x', 'beats', every => $2)", due, every
    )
    for after in [due - timedelta(seconds=1), due, due + timedelta(days=3, hours=5)]:
        got = await engine.fetchval(
            "SELECT postbox._next_fire_at(s, $1) FROM postbox.schedules s WHERE name = 'beat'",
            after,
        )
        assert got == next_interval_time(due, every, after)


@pytest.mark.parametrize(
    "timing",
    ["every => interval '60 seconds'", "cron_expression => '*/2 * * * *', time_zone => 'UTC'"],
)
async def test_tick_catches_up_as_the_server_plans_it(engine, timing):
    """catch_up_limit 3 after ten missed due times: tick fires the first three, in order,
    and leaves the next fire time fire_plan (the server's scheduler) computes."""
    await engine.execute("SELECT postbox.create_queue('caught')")
    await engine.execute(
        "SELECT postbox.create_schedule('late', now() - interval '19 minutes 30 seconds', 'x',"
        f" 'caught', catch_up_limit => 3, {timing})"
    )
    row = await engine.fetchrow("SELECT *, now() AS db_now FROM postbox.schedules")
    plan = fire_plan(row, row["db_now"])
    assert len(plan) == 3
    async with engine.transaction():  # one now() for the plan's clock and the tick's
        counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
        now = await engine.fetchval("SELECT now()")
    assert counts["fired_schedules"] == 3
    assert await _depth(engine, "caught") == 3
    after = await engine.fetchrow("SELECT * FROM postbox.schedules")
    assert after["fire_count"] == 3
    assert after["next_fire_at"] == fire_plan(row, now)[-1]


async def test_tick_pauses_at_the_failure_threshold(engine):
    await engine.execute("SELECT postbox.create_queue('shut')")
    await engine.execute("SELECT postbox.pause_queue('shut', sends => true)")
    await engine.execute(
        "SELECT postbox.create_schedule('refused', now() - interval '1 second', 'x', 'shut',"
        " every => interval '1 second', failure_threshold => 2)"
    )
    for refusals, paused in ((1, False), (2, True)):
        await engine.execute(
            "UPDATE postbox.schedules SET next_fire_at = now() - interval '1 second'"
        )
        counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
        assert counts["refused_schedules"] == 1
        row = await engine.fetchrow("SELECT * FROM postbox.schedules")
        assert (row["consecutive_failures"], row["paused"]) == (refusals, paused)
    assert "paused" in row["last_error"]


async def _seed(conn: asyncpg.Connection) -> None:
    """A message past its queue's retention, a due schedule of each kind, and a stream
    whose current slot is old enough to rotate: the work one tick has."""
    await conn.execute("SELECT postbox.create_queue('old', '{\"retention\": 60}')")
    await conn.execute("SELECT postbox.send('old', 'stale')")
    await conn.execute(
        "UPDATE postbox.messages SET visible_at = now() - interval '2 minutes',"
        " enqueued_at = now() - interval '2 minutes'"
    )
    await conn.execute("SELECT postbox.create_queue('fired')")
    for name, timing in [
        ("by-cron", "cron_expression => '*/5 * * * *', time_zone => 'Europe/Berlin'"),
        ("by-interval", "every => interval '1 hour'"),
        ("once", "run_at => now() - interval '1 second'"),
    ]:
        await conn.execute(
            f"SELECT postbox.create_schedule('{name}', now() - interval '1 second', 'tick',"
            f" 'fired', {timing})"
        )
    await conn.execute("SELECT postbox.create_topic('events', stream_retention => '1 hour')")
    await conn.execute("SELECT postbox.publish('events', 'e1')")
    await conn.execute(
        "UPDATE postbox.stream_slots SET since = now() - interval '1 day' WHERE state = 'current'"
    )


async def _depth(conn: asyncpg.Connection, queue: str) -> int:
    return await conn.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id"
        " WHERE q.name = $1",
        queue,
    )


async def _current_slot(conn: asyncpg.Connection) -> int:
    return await conn.fetchval("SELECT slot FROM postbox.stream_slots WHERE state = 'current'")


async def test_tick_does_every_kind_of_maintenance_and_says_what(engine):
    await _seed(engine)
    slot = await _current_slot(engine)
    before = await engine.fetchval("SELECT now()")
    done = await engine.fetchval("SELECT postbox.tick()")
    counts = json.loads(done)
    assert counts["expired_messages"] == 1
    assert counts["fired_schedules"] == 3
    assert counts["refused_schedules"] == 0
    assert await _depth(engine, "fired") == 3
    # The next fire times are the server's: cronsim for the cron schedule.
    rows = {r["name"]: r for r in await engine.fetch("SELECT * FROM postbox.schedules")}
    now = await engine.fetchval("SELECT now()")
    assert rows["by-cron"]["next_fire_at"] == next_cron_time("*/5 * * * *", "Europe/Berlin", now)
    assert rows["by-interval"]["next_fire_at"] > before
    # The one-shot schedule, fired, is deleted; its message says which schedule it
    # came from, as a server's fire says it (the same SQL sets it).
    assert "once" not in rows
    fired = await engine.fetch(
        "SELECT m.attributes -> '_schedule' AS header FROM postbox.messages m"
        " JOIN postbox.queues q ON q.id = m.queue_id WHERE q.name = 'fired'"
    )
    headers = {}
    for row in fired:
        header = json.loads(row["header"])
        assert header["data_type"] == "String.json"
        value = json.loads(header["string_value"])
        headers[value.pop("name")] = value
    assert set(headers) == {"by-cron", "by-interval", "once"}
    assert all(h["out_of_band"] is False for h in headers.values())
    assert all(h["scheduled_for"].endswith("Z") for h in headers.values())
    # The stream rotated: its old slot retired, an empty one is current.
    assert await _current_slot(engine) != slot
    assert (
        await engine.fetchval("SELECT state FROM postbox.stream_slots WHERE slot = $1", slot)
        == "retired"
    )
    # Once the retired slot is past the retention, the next tick truncates it.
    await engine.execute(
        "UPDATE postbox.stream_slots SET since = now() - interval '2 hours' WHERE slot = $1", slot
    )
    counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
    assert counts["rotated_slots"] == 1
    assert counts["fired_schedules"] == counts["expired_messages"] == 0


async def test_tick_refuses_a_batch_size_out_of_range(engine):
    for size in (0, 10001):
        with pytest.raises(asyncpg.PostgresError, match="batch_size must be from 1 to 10000"):
            await engine.fetchval("SELECT postbox.tick($1)", size)


async def test_tick_skips_work_another_session_holds(engine, engine_url):
    """A server's workers call the same functions as tick: whoever holds a piece of work
    (a claimed schedule, a message row, the rotation lock) keeps it, and the other skips
    it at once instead of doing it twice or waiting."""
    await _seed(engine)
    slot = await _current_slot(engine)
    server_side = await asyncpg.connect(engine_url)
    try:
        holder = server_side.transaction()
        await holder.start()
        # As the server's scheduler does: claim the due schedules, in a transaction.
        claimed = await server_side.fetch("SELECT * FROM postbox.claim_due_schedules(10)")
        assert len(claimed) == 3
        # As the server's maintenance worker does: hold the rotation and activity locks,
        # and the expired message's row.
        assert await server_side.fetchval("SELECT pg_try_advisory_xact_lock(1886350201, 0)")
        assert await server_side.fetchval("SELECT pg_try_advisory_xact_lock(1886350201, 1)")
        await server_side.execute("SELECT id FROM postbox.messages FOR UPDATE")
        started = time.monotonic()
        counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
        # Generous: the point is that tick did not wait for the holder's transaction.
        assert time.monotonic() - started < 10
        assert counts["fired_schedules"] == counts["expired_messages"] == 0
        assert await _current_slot(engine) == slot
        # The holder does the work and commits: nothing is left for tick.
        for row in claimed:
            await server_side.execute("SELECT * FROM postbox.fire_schedule($1, NULL)", row["id"])
        await holder.commit()
        counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
        assert counts["fired_schedules"] == 0
        assert counts["expired_messages"] == 1  # the row lock is gone: tick takes it now
        assert await _current_slot(engine) != slot
        assert await _depth(engine, "fired") == 3
    finally:
        await server_side.close()


async def test_the_servers_workers_skip_what_a_running_tick_holds(engine, engine_url):
    """The other way round, through the server's own Engine calls (the ones its
    maintenance and scheduler workers make): while a tick's transaction is open, they
    find nothing to do, and after it commits nothing is left to do twice."""
    await _seed(engine)
    server = await Engine.connect(engine_url, pool_size=2)
    try:
        ticking = engine.transaction()
        await ticking.start()
        counts = json.loads(await engine.fetchval("SELECT postbox.tick()"))
        assert counts["fired_schedules"] == 3
        assert counts["expired_messages"] == 1
        started = time.monotonic()
        assert await server.fire_due_schedules(10, fire_plan) == []
        assert await server.rotate_streams(None, timedelta(milliseconds=20)) == 0
        assert await server.expire_activity() == 0
        assert await server.expire_messages(1000) == 0
        assert time.monotonic() - started < 10  # generous: none of them waited for tick
        await ticking.commit()
        assert await server.fire_due_schedules(10, fire_plan) == []
        assert await server.expire_messages(1000) == 0
        assert await _depth(engine, "fired") == 3
    finally:
        await server.close()


async def test_start_without_pg_cron_names_the_alternative(engine):
    with pytest.raises(asyncpg.PostgresError) as refused:
        await engine.fetchval("SELECT postbox.start('1 minute')")
    assert refused.value.sqlstate == "55000"
    assert "pg_cron is not installed" in refused.value.message
    assert "postbox.tick()" in refused.value.hint
    assert await engine.fetchval("SELECT postbox.stop()") == 0


# With pg_cron: a private cluster that preloads it.


@pytest.fixture(scope="module")
def cron_postgres() -> Iterator[Postgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail("Debian's postgresql-15 is not installed (.ci/run installs it)")
    with cron_cluster("postbox-tick-") as postgres:
        yield postgres


async def test_pg_cron_ticks_with_no_server_running(cron_postgres):
    """pg_cron runs postbox.tick(): a message expires, schedules fire and the stream
    rotates, with no postbox server anywhere."""
    conn = await asyncpg.connect(cron_postgres.url())
    try:
        await migrate(conn)
        version = await conn.fetchval(
            "SELECT extversion FROM pg_extension WHERE extname = 'pg_cron'"
        )
        await _seed(conn)
        slot = await _current_slot(conn)
        if tuple(int(p) for p in version.split("-")[0].split(".")) < (1, 5):
            # Debian's pg_cron (1.4) runs a job at most once a minute; start says so.
            with pytest.raises(asyncpg.PostgresError, match="at most once a minute"):
                await conn.fetchval("SELECT postbox.start('5 seconds')")
            every = "1 minute"
        else:
            every = "1 second"
        for bad in ("7 minutes", "90 seconds", "0 seconds"):
            with pytest.raises(asyncpg.PostgresError, match="every must be"):
                await conn.fetchval("SELECT postbox.start($1::text::interval)", bad)
        start = "SELECT postbox.start($1::text::interval)"
        job = await conn.fetchval(start, every)
        assert await conn.fetchval(start, every) != job  # the second replaced the first
        assert await conn.fetchval("SELECT count(*) FROM cron.job") == 1
        deadline = time.monotonic() + 150  # a minute's schedule, on a loaded machine
        while True:
            gone = await _depth(conn, "old") == 0
            # A one-shot schedule that fired is deleted: count the messages.
            fired = await _depth(conn, "fired")
            rotated = await _current_slot(conn) != slot
            if gone and fired == 3 and rotated:
                break
            failures = await conn.fetch(
                "SELECT return_message FROM cron.job_run_details WHERE status = 'failed'"
            )
            assert not failures, failures
            assert time.monotonic() < deadline, (gone, fired, rotated)
            await asyncio.sleep(0.5)
        runs = await conn.fetchval(
            "SELECT count(*) FROM cron.job_run_details WHERE command = 'SELECT postbox.tick()'"
            " AND status = 'succeeded'"
        )
        assert runs >= 1
        assert await conn.fetchval("SELECT postbox.stop()") == 1
        assert await conn.fetchval("SELECT count(*) FROM cron.job") == 0
    finally:
        await conn.close()
