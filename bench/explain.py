"""`python -m bench --explain`: the plans of the engine's hot statements, so that a
regression can be read rather than guessed.

The engine's functions run their statements inside PL/pgSQL, where a plain EXPLAIN
of the call shows one Result node. auto_explain, with nested statements on and its
log level at NOTICE, hands each inner statement's EXPLAIN (ANALYZE, BUFFERS) to the
client instead; this prints them under the call that ran them.
"""

from __future__ import annotations

import asyncpg

QUEUE = "bench_explain"
FILL = 10_000

# (what, statement): each runs once after a warm-up call, on a queue of FILL messages.
HOT = (
    ("send one body", f"SELECT postbox.send('{QUEUE}', 'x')"),
    ("send_batch of 100", f"SELECT count(*) FROM postbox.send_batch('{QUEUE}', "
     "array_fill('x'::bytea, ARRAY[100]))"),
    ("receive 10", f"SELECT count(*) FROM postbox.receive('{QUEUE}', 10)"),
    ("receive 10 + delete_batch", f"SELECT count(*) FROM postbox.delete_batch('{QUEUE}', "
     f"ARRAY(SELECT receipt FROM postbox.receive('{QUEUE}', 10)))"),
)  # fmt: skip


async def explain(url: str) -> str:
    """The hot statements' inner plans, as text."""
    conn = await asyncpg.connect(url)
    notices: list[str] = []
    conn.add_log_listener(lambda _conn, message: notices.append(message.message))
    try:
        await conn.execute("SELECT postbox.create_queue($1)", QUEUE)
        for _ in range(FILL // 1000):
            await conn.execute(
                f"SELECT count(*) FROM postbox.send_batch('{QUEUE}', "
                "array_fill('x'::bytea, ARRAY[1000]))"
            )
        await conn.execute("ANALYZE postbox.messages")
        await conn.execute("LOAD 'auto_explain'")
        out = []
        for what, statement in HOT:
            await conn.execute(statement)  # plans cached, as in a running server
            await conn.execute(
                "SET auto_explain.log_min_duration = 0; SET auto_explain.log_analyze = on; "
                "SET auto_explain.log_buffers = on; SET auto_explain.log_nested_statements = on; "
                "SET auto_explain.log_level = notice"
            )
            notices.clear()
            await conn.execute(statement)
            await conn.execute("SET auto_explain.log_min_duration = -1")
            out.append(f"== {what}: {statement}\n" + "\n\n".join(notices))
        return "\n\n".join(out)
    finally:
        await conn.execute("SELECT postbox.drop_queue($1)", QUEUE)
        await conn.close()
