"""What one engine call costs in CPU instructions, counted by valgrind: postbox
against PGMQ and raw SQL.

engine_vs_pgmq times the engine from many sessions, and on a shared two-core
machine its rounds move by ±20%, more than the margins its targets turn on.
Instructions do not move: callgrind counts those of a single-user backend
(`postgres --single`) executing each system's statement of engine_vs_pgmq,
prepared as pgbench -M prepared has it, and the count repeats run after run.
The count of 3N calls less that of N, over 2N, is one call's cost, with the
backend's start and end cancelled out. Where the machine's cores are the
limit, throughput goes as the inverse of that cost: PGMQ's count over ours
predicts engine_vs_pgmq's ratio with what many sessions add (WAL flushes, waits
on each other's locks) left out, so a change to the engine's code can be
judged here before the noisy run.

The cluster is the run's own (Debian's PostgreSQL 15, fsync off: a flush's cost
is the kernel's, which callgrind does not count), so `--apply-sql` changes are
applied to it as to the run's database.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import asyncpg

from bench.database import RAW_TABLE, install
from bench.pg_cluster import PG_BIN, Postgres, as_owner, scratch_directory
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.engine import Workload, _fill, _install, _workloads, body_literal
from bench.scenarios.producer import PGMQ_SQL

log = logging.getLogger(__name__)

ROUNDS = 3  # counts barely move; three show that they do not
CALLS = 40  # N: each figure is (count of 3N calls - count of N) / 2N
DATABASE = "bench"
TOPIC = "bench_fanout"
FANOUT = 10  # queues subscribed to the topic, as topic_fanout has them
_COLLECTED = re.compile(r"Collected : (\d+)")


def _single_user_script(statement: str, calls: int) -> str:
    """The statement prepared once and executed `calls` times, in postgres
    --single -j's syntax (a statement ends at a semicolon and a blank line).
    A call's rows are counted, not returned: the single-user backend prints
    every row it returns, and that printing would be counted too."""
    statement = statement.rstrip().rstrip(";")
    if statement.upper().startswith("SELECT"):
        statement = f"SELECT count(*) FROM ({statement}) AS call"
    return f"PREPARE call AS {statement};\n\n" + "EXECUTE call;\n\n" * calls


def _count(data: Path, script: Path) -> int:
    """Instructions of one single-user backend running `script`; a statement's
    error fails the count, since an error's path would be measured instead."""
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
               str(PG_BIN / "postgres"), "--single", "-j", "-D", str(data), DATABASE]  # fmt: skip
    with script.open() as stdin:
        done = subprocess.run(
            as_owner(command), stdin=stdin, capture_output=True, text=True, timeout=900
        )
    if done.returncode != 0 or "ERROR:" in done.stderr:
        error = next((line for line in done.stderr.splitlines() if "ERROR:" in line), "")
        raise RuntimeError(f"the single-user backend failed ({done.returncode}): {error}")
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError("callgrind printed no instruction count")
    return int(found.group(1))


async def _prepare(cluster: Postgres, apply_sql: list[Path], body: bytes) -> bool:
    """The engine (with the run's --apply-sql), PGMQ and the raw table in the
    cluster's database; True when PGMQ is there."""
    cluster.sql(f"CREATE DATABASE {DATABASE}")
    url = cluster.url(DATABASE)
    conn = await asyncpg.connect(url)
    try:
        await install(conn, apply_sql)
        await conn.execute("SELECT postbox.create_topic($1)", TOPIC)
        for queue in (f"{TOPIC}_{i}" for i in range(FANOUT)):
            await conn.execute("SELECT postbox.create_queue($1)", queue)
            await conn.execute(
                "SELECT postbox.create_subscription($1, $2, queue_name => $2)", TOPIC, queue
            )
    finally:
        await conn.close()
    have_pgmq = PGMQ_SQL.is_file()
    await _install(url, have_pgmq, body)
    return have_pgmq


def _fanout(body: bytes) -> Workload:
    """Issue 17's fan-out: one publish into 10 plain queues, against the raw INSERT of
    the same 10 rows (one commit each, as topic_fanout's raw side)."""
    literal = body_literal(body)
    return Workload(
        f"publish to {FANOUT} queues",
        16,
        FANOUT,
        None,  # Workload's target is against PGMQ, which has no topics; issue 17's is 0.5 of raw
        {
            "raw": f"INSERT INTO {RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
            f"SELECT q, now(), now(), {literal} FROM generate_series(1, {FANOUT}) q;",
            "postbox": f"SELECT postbox.publish('{TOPIC}', {literal});",
        },
    )


async def _per_message(
    directory: Path, workload: Workload, systems: list[str]
) -> dict[str, list[float]]:
    """Each system's instructions per message of the workload, one per round."""
    scripts = {}
    for system in systems:
        for calls in (CALLS, 3 * CALLS):
            path = directory / f"{system}-{calls}.sql"
            path.write_text(_single_user_script(workload.scripts[system], calls))
            scripts[system, calls] = path
    counts: dict[str, list[float]] = {system: [] for system in systems}
    for round_ in range(ROUNDS):
        # Rotated, as engine_vs_pgmq's turns: each system's calls change the tables.
        for system in systems[round_ % len(systems) :] + systems[: round_ % len(systems)]:
            few = await asyncio.to_thread(_count, directory / "data", scripts[system, CALLS])
            many = await asyncio.to_thread(_count, directory / "data", scripts[system, 3 * CALLS])
            counts[system].append((many - few) / (2 * CALLS) / workload.messages_per_call)
    return counts


@scenario(
    "engine_instructions",
    "CPU instructions per engine call (valgrind, single-user backend): postbox vs PGMQ 1.5.1 "
    "and raw SQL, for engine_vs_pgmq's statements",
)
async def engine_instructions(ctx: Context) -> list[Row]:
    if shutil.which("valgrind") is None or not (PG_BIN / "postgres").is_file():
        raise RuntimeError(f"needs valgrind and {PG_BIN / 'postgres'}")
    body = ctx.body()
    # Issue 17's three workloads; the sends before the receive queue is filled,
    # as engine_vs_pgmq has them (a backlog changes where the sends land).
    workloads = [w for w in _workloads(body) if w.target is not None]
    receives = sum(1 for w in workloads if w.beside_backlog)
    # Every round's N and 3N receive calls of 10, with a thousand to spare.
    filled = (ROUNDS * 4 * CALLS * 10 * receives // 1000 + 1) * 1000
    directory = scratch_directory("postbox-bench-callgrind-")
    cluster = Postgres(directory / "data").initdb(
        "fsync = off", "synchronous_commit = off", "full_page_writes = off", "autovacuum = off"
    )
    try:
        cluster.start()
        try:
            have_pgmq = await _prepare(cluster, ctx.db.apply_sql, body)
        finally:
            cluster.stop()
        if not have_pgmq:
            log.warning("PGMQ's SQL is absent (%s): postbox against raw SQL only", PGMQ_SQL)
        systems = ["raw", "pgmq", "postbox"] if have_pgmq else ["raw", "postbox"]
        rows = []
        for workload in workloads:
            if workload.beside_backlog:
                cluster.start()
                try:
                    await _fill(cluster.url(DATABASE), have_pgmq, body, filled)
                finally:
                    cluster.stop()
            per_message = await _per_message(directory, workload, systems)
            ours = statistics.median(per_message["postbox"])
            note = (
                f"instructions per message, medians of {ROUNDS} rounds: postbox "
                f"{median_range(per_message['postbox'])}, "
                f"raw SQL {median_range(per_message['raw'])}"
            )
            pgmq = None
            if have_pgmq:
                pgmq = statistics.median(per_message["pgmq"])
                # PGMQ's cost over ours: engine_vs_pgmq's sense, a throughput ratio.
                as_throughput = [
                    q / p for q, p in zip(per_message["pgmq"], per_message["postbox"], strict=True)
                ]
                note += (
                    f", PGMQ {median_range(per_message['pgmq'])}; PGMQ/postbox (the throughput "
                    f"ratio where the cores are the limit) {median_range(as_throughput)}"
                )
            rows.append(
                Row(
                    f"SQL {workload.name}, CPU",
                    "instr/msg",
                    ours,
                    pgmq,
                    "PGMQ 1.5.1, callgrind" if have_pgmq else "PGMQ absent",
                    note=note,
                )
            )
        fanout = _fanout(body)
        per_message = await _per_message(directory, fanout, ["raw", "postbox"])
        raw_by_ours = [
            r / p for r, p in zip(per_message["raw"], per_message["postbox"], strict=True)
        ]
        rows.append(
            Row(
                f"SQL {fanout.name}, CPU",
                "instr/msg",
                statistics.median(per_message["postbox"]),
                statistics.median(per_message["raw"]),
                f"raw {FANOUT}-row INSERT, callgrind",
                note=(
                    f"instructions per queued message, medians of {ROUNDS} rounds; raw/postbox "
                    "(the throughput ratio where the cores are the limit) "
                    f"{median_range(raw_by_ours)}"
                ),
            )
        )
        return rows
    finally:
        cluster.stop_if_running()
        shutil.rmtree(directory, ignore_errors=True)
