"""What keeping history costs: a queue that archives (keeps each finished message's
life for GetMessage and ListMessages) against a plain queue, in the same run.

The work is a job's whole round through the SQL engine, driven by pgbench -M
prepared from several sessions: send 10, then receive 10 and delete them (with
a consumer id, as workers name themselves). The two queues take turns within
each round, so the machine's drift falls on both, and each figure is a median
of the rounds with its range. A history queue writes every finished message a
second time, into postbox.archive; a plain queue's delete takes its straight
path, which history adds no work to. Each queue starts with a backlog of
1,000 messages, so no receive comes back empty.
"""

from __future__ import annotations

import statistics

import asyncpg

from bench import raw
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.engine import body_literal

ROUNDS = 5  # as engine_vs_pgmq: one slow turn moves no median
CLIENTS = 4
BATCH = 10
BACKLOG = 1000
QUEUES = {"plain": "bench_jobs_plain", "history": "bench_jobs_history"}


def _script(queue: str, literal: str) -> str:
    return (
        f"SELECT count(*) FROM postbox.send_batch('{queue}', "
        f"array_fill({literal}, ARRAY[{BATCH}]));\n"
        f"SELECT count(*) FROM postbox.delete_batch('{queue}', ARRAY(SELECT receipt FROM "
        f"postbox.receive('{queue}', {BATCH}, consumer_id => 'bench-worker')));"
    )


@scenario(
    "history_vs_plain",
    f"send {BATCH} + receive {BATCH} + delete through the SQL engine, x{CLIENTS} sessions: "
    "a queue that keeps history (archive_on_delete) against a plain one",
)
async def run(ctx: Context) -> list[Row]:
    conn = await asyncpg.connect(ctx.db.url)
    try:
        await conn.execute("SELECT postbox.create_queue($1)", QUEUES["plain"])
        await conn.execute(
            "SELECT postbox.create_queue($1, '{\"archive_on_delete\": true}')", QUEUES["history"]
        )
        # A backlog, so that every receive finds messages however the sessions
        # interleave (each cycle sends as many as it takes, so the depth holds).
        for queue in QUEUES.values():
            await conn.execute(
                "SELECT count(*) FROM postbox.send_batch($1, "
                "array_fill($2::bytea, ARRAY[$3::integer]))",
                queue,
                ctx.body(),
                BACKLOG,
            )
    finally:
        await conn.close()
    literal = body_literal(ctx.body())
    seconds = max(2, round(ctx.seconds))
    rates: dict[str, list[float]] = {kind: [] for kind in QUEUES}
    for round_ in range(ROUNDS):
        order = list(QUEUES) if round_ % 2 == 0 else list(reversed(QUEUES))
        for kind in order:
            tps = await raw.pgbench_tps(
                ctx.db, _script(QUEUES[kind], literal), clients=CLIENTS, seconds=seconds
            )
            rates[kind].append(tps * BATCH)
    history, plain = statistics.median(rates["history"]), statistics.median(rates["plain"])
    ratios = [h / p for h, p in zip(rates["history"], rates["plain"], strict=True)]
    return [
        Row(
            f"SQL jobs x{CLIENTS}, history queue",
            "msgs/s",
            history,
            plain,
            "plain queue, same run",
            note=(
                f"msgs/s sent, received and deleted, medians of {ROUNDS} rounds of {seconds} s: "
                f"history {median_range(rates['history'])}, plain {median_range(rates['plain'])}; "
                f"history/plain per round {median_range(ratios)}"
            ),
        )
    ]
