"""Sustained load with the xmin horizon pinned: does the queue table bloat, and what does it cost?

Send + receive + delete at a fixed rate for `--sustained-seconds` while another
session holds a transaction open, so vacuum can remove none of the dead rows the
traffic leaves behind. Every window reports throughput, send->receive latency,
dead tuples and table size; the first and last windows are the rows of the table.
At the end the pinning transaction ends and a VACUUM shows what it reclaims.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import asyncpg
import grpc
from postbox.v1 import message_service_pb2 as pb

from bench.load import fixed_rate, percentile
from bench.runner import Context, Row, message_stub, scenario
from bench.scenarios.latency import Stopwatch, _body

CONSUMERS = 8
WINDOW = 30.0

TABLE_STATS = """
SELECT s.n_live_tup, s.n_dead_tup, s.autovacuum_count, s.vacuum_count,
       pg_relation_size('postbox.messages') AS heap_bytes,
       pg_indexes_size('postbox.messages') AS index_bytes
FROM pg_stat_user_tables s WHERE s.relid = 'postbox.messages'::regclass
"""


async def _table_stats(conn: asyncpg.Connection) -> dict[str, int]:
    row = await conn.fetchrow(TABLE_STATS)
    assert row is not None  # the statistics row of postbox.messages
    return dict(row)


@scenario(
    "sustained",
    "send+receive+delete at a fixed rate with the xmin horizon pinned "
    "(--sustained-seconds, --sustained-rate)",
)
async def run(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    queue = await ctx.new_queue(served.target, "sustained")
    watch = Stopwatch()
    monitor = await asyncpg.connect(ctx.db.url)
    pin = await asyncpg.connect(ctx.db.url)
    pinned_xid = None
    if ctx.sustained_pin:
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pinned_xid = await pin.fetchval("SELECT txid_current()")
    deleted = 0
    windows: list[dict[str, float]] = []

    async with (
        grpc.aio.insecure_channel(served.target) as producer_channel,
        grpc.aio.insecure_channel(served.target) as consumer_channel,
    ):
        producer, consumer = message_stub(producer_channel), message_stub(consumer_channel)

        async def consume() -> None:
            nonlocal deleted
            stream = consumer.Receive(
                pb.ReceiveRequest(queue=queue, max_messages=10, mode=pb.RECEIVE_MODE_CONTINUOUS)
            )
            async for response in stream:
                for message in response.messages:
                    watch.arrived(message.body)
                receipts = [m.receipt for m in response.messages]
                await consumer.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=receipts))
                deleted += len(receipts)

        async def send(i: int) -> None:
            await producer.Send(pb.SendRequest(queue=queue, body=_body(i, ctx.body_size)))

        async def observe() -> None:
            seen_latencies, seen_deleted = 0, 0
            started = time.monotonic()
            while True:
                await asyncio.sleep(WINDOW)
                latencies = watch.latencies[seen_latencies:]
                seen_latencies = len(watch.latencies)
                stats = await _table_stats(monitor)
                window = {
                    "at_s": round(time.monotonic() - started),
                    "msgs_per_s": (deleted - seen_deleted) / WINDOW,
                    "p50_ms": percentile(latencies, 0.5) * 1000,
                    "p99_ms": percentile(latencies, 0.99) * 1000,
                    **stats,
                }
                seen_deleted = deleted
                windows.append(window)
                print(f"    sustained {json.dumps(window)}", file=sys.stderr, flush=True)

        consumers = [asyncio.ensure_future(consume()) for _ in range(CONSUMERS)]
        observer = asyncio.ensure_future(observe())
        try:
            paced = await fixed_rate(send, rate=ctx.sustained_rate, seconds=ctx.sustained_seconds)
            _, backlog = await watch.finish(paced.sent, timeout=30)
        finally:
            observer.cancel()
            for task in consumers:
                task.cancel()
            await asyncio.gather(observer, *consumers, return_exceptions=True)

    before = await _table_stats(monitor)
    if ctx.sustained_pin:
        await pin.execute("ROLLBACK")
    await pin.close()
    # Claims that began under the pin still hold its snapshot for a moment (at the
    # end of the first runs they did, and the VACUUM removed nothing): wait them out.
    if pinned_xid is not None:
        for _ in range(300):
            held = await monitor.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                "AND backend_xmin IS NOT NULL AND age(backend_xmin) >= age($1::text::xid)",
                str(pinned_xid),
            )
            if not held:
                break
            await asyncio.sleep(0.1)
    # Whoever still holds the horizon back once the pin is gone (expected: nobody).
    holders = await monitor.fetch(
        "SELECT pid, application_name, state, backend_xmin::text, now() - xact_start AS open "
        "FROM pg_stat_activity WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()"
    )
    ctx.extra["horizon_holders_after_unpin"] = [dict(r) for r in holders]
    vacuum_started = time.monotonic()
    await monitor.execute("VACUUM postbox.messages")
    vacuum_seconds = time.monotonic() - vacuum_started
    after = await _table_stats(monitor)
    await monitor.close()

    pin_text = f"pinned xid {pinned_xid}" if pinned_xid else "horizon not pinned"
    first, last = windows[0], windows[-1]
    pace = (
        f"{len(windows)} windows of {WINDOW:.0f} s at {ctx.sustained_rate:.0f} msg/s; "
        f"{backlog} sent but not received 30 s after the last send"
    )
    note = (
        f"{pin_text}; at the end {before['n_dead_tup']:,} dead tuples, heap "
        f"{before['heap_bytes'] / 2**20:.1f} MiB, indexes {before['index_bytes'] / 2**20:.1f} MiB; "
        f"VACUUM after unpinning took {vacuum_seconds:.1f} s and left {after['n_dead_tup']:,} dead"
    )
    rows = [
        Row("sustained: throughput", "msgs/s", last["msgs_per_s"], first["msgs_per_s"],
            "first window", note=pace),
        Row("sustained: send->receive p50", "ms", last["p50_ms"], first["p50_ms"], "first window"),
        Row("sustained: send->receive p99", "ms", last["p99_ms"], first["p99_ms"], "first window"),
        Row("sustained: dead tuples", "tuples", before["n_dead_tup"], first["n_dead_tup"],
            "first window", note=note),
        Row("sustained: heap+index size", "MiB",
            (last["heap_bytes"] + last["index_bytes"]) / 2**20,
            (first["heap_bytes"] + first["index_bytes"]) / 2**20, "first window"),
    ]  # fmt: skip
    ctx.extra["sustained_windows"] = windows
    return rows
