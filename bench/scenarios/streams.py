"""Stream topics: publishing to a topic that keeps one log for its consumer groups, against
today's fan-out of a copy into every subscribed queue.

Both topics serve the same ten readers: ten consumer groups of the stream topic, ten
queues subscribed to the other. The two are measured in turns within each of ROUNDS
rounds (the order rotating), and the figure is the median of the rounds' ratios, with
their range: the machine's noise moves both sides of a round alike.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg
import grpc
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb

from bench import raw
from bench.load import closed_loop, fixed_rate, percentile
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import Channels
from bench.scenarios.topics import SUBSCRIBED_QUEUES
from bench.scenarios.topics import _topic as fanout_topic

GROUPS = SUBSCRIBED_QUEUES
ROUNDS = 3
TARGET = 5.0


@dataclass(frozen=True)
class _Workload:
    name: str
    clients: int
    batch: int  # messages per call; 1 is Publish, more PublishBatch


WORKLOADS = (_Workload("Publish(1)", 16, 1), _Workload("PublishBatch(100)", 4, 100))


async def _stream_topic(target: str) -> str:
    """A stream topic with GROUPS consumer groups and no subscriptions."""
    topic = f"stream_{uuid.uuid4().hex[:8]}"
    async with grpc.aio.insecure_channel(target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        retention = tpb.Topic(name=topic)
        retention.stream_retention.FromSeconds(3600)
        await topics.CreateTopic(tpb.CreateTopicRequest(topic=retention))
        streams = stream_service_pb2_grpc.StreamServiceStub(channel)
        for i in range(GROUPS):
            group = spb.ConsumerGroup(topic=topic, name=f"group{i}")
            await streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return topic


def _publisher(
    channels: Channels, topic: str, body: bytes, batch: int
) -> Callable[[], Awaitable[int]]:
    if batch == 1:
        request = tpb.PublishRequest(topic=topic, body=body)

        async def publish() -> int:
            await channels.stub().Publish(request)
            return 1

        return publish
    entries = [tpb.PublishBatchEntry(body=body) for _ in range(batch)]
    batch_request = tpb.PublishBatchRequest(topic=topic, entries=entries)

    async def publish_batch() -> int:
        await channels.stub().PublishBatch(batch_request)
        return batch

    return publish_batch


@scenario(
    "stream_publish",
    f"msgs/s published to a stream topic with {GROUPS} consumer groups vs to a topic that "
    f"fans out to {SUBSCRIBED_QUEUES} queues, Publish(1) x16 and PublishBatch(100) x4, "
    f"{ROUNDS} rounds in turns",
)
async def stream_publish(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topics = {"stream": await _stream_topic(served.target)}
    topics["fanout"] = await fanout_topic(ctx, served.target)
    channels = Channels(served.target, 4, topic_service_pb2_grpc.TopicServiceStub)
    rows = []
    try:
        for workload in WORKLOADS:
            rates: dict[str, list[float]] = {"stream": [], "fanout": []}
            for round_ in range(ROUNDS):
                order = ["stream", "fanout"] if round_ % 2 == 0 else ["fanout", "stream"]
                for kind in order:
                    publish = _publisher(channels, topics[kind], ctx.body(), workload.batch)
                    load = await closed_loop(publish, clients=workload.clients, seconds=ctx.seconds)
                    rates[kind].append(load.rate)
            ratios = [s / f for s, f in zip(rates["stream"], rates["fanout"], strict=True)]
            ours, theirs = statistics.median(rates["stream"]), statistics.median(rates["fanout"])
            rows.append(
                Row(
                    f"{workload.name} x{workload.clients} -> stream, {GROUPS} groups",
                    "msgs/s",
                    ours,
                    theirs,
                    f"{workload.name} -> {SUBSCRIBED_QUEUES} queues",
                    target=f">= {TARGET:g}x fan-out",
                    met=statistics.median(ratios) >= TARGET,
                    note=(
                        f"medians of {ROUNDS} rounds of {ctx.seconds:g} s: stream {ours:,.0f}, "
                        f"fan-out {theirs:,.0f} msgs/s; stream/fan-out per round "
                        f"{median_range(ratios, 'x')}"
                    ),
                )
            )
        rows.append(await _per_commit_bound(ctx, topics))
    finally:
        await channels.close()
    return rows


async def _per_commit_bound(ctx: Context, topics: dict[str, str]) -> Row:
    """Why Publish(1) stays far from 5x: one message per commit costs a commit on both
    sides, and the commit dominates. The engine alone (pgbench calling postbox.publish)
    and raw SQL (pgbench inserting 1 row, and the 10 rows a fan-out writes, per commit)
    show the ceiling no publish path can pass."""
    clients = WORKLOADS[0].clients
    hex_body = ctx.body().hex()
    scripts = {
        kind: f"SELECT count(*) FROM postbox.publish('{topics[kind]}', '\\x{hex_body}'::bytea);"
        for kind in ("stream", "fanout")
    }
    scripts["raw1"] = (
        f"INSERT INTO {raw.RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
        f"VALUES (1, now(), now(), '\\x{hex_body}'::bytea);"
    )
    scripts[f"raw{GROUPS}"] = (
        f"INSERT INTO {raw.RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
        f"SELECT q, now(), now(), '\\x{hex_body}'::bytea FROM generate_series(1, {GROUPS}) q;"
    )
    tps: dict[str, list[float]] = {kind: [] for kind in scripts}
    for round_ in range(ROUNDS):
        kinds = list(scripts)
        for kind in kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]:  # rotated
            tps[kind].append(
                await raw.pgbench_tps(ctx.db, scripts[kind], clients=clients, seconds=ctx.seconds)
            )
    await ctx.db.reset_raw()
    engine = [s / f for s, f in zip(tps["stream"], tps["fanout"], strict=True)]
    ceiling = [a / b for a, b in zip(tps["raw1"], tps[f"raw{GROUPS}"], strict=True)]
    return Row(
        f"bound: postbox.publish(1) x{clients}, engine alone, stream ÷ fan-out",
        "ratio",
        statistics.median(engine),
        statistics.median(ceiling),
        f"raw 1 row ÷ {GROUPS} rows per commit",
        note=(
            f"pgbench -M prepared, {ROUNDS} rounds rotated, per-round ratios: engine "
            f"stream/fan-out {median_range(engine, 'x')} (stream "
            f"{statistics.median(tps['stream']):,.0f}, fan-out "
            f"{statistics.median(tps['fanout']):,.0f} publishes/s); raw INSERT of 1 row per "
            f"commit ÷ {GROUPS} rows per commit {median_range(ceiling, 'x')} "
            f"({statistics.median(tps['raw1']):,.0f} / "
            f"{statistics.median(tps[f'raw{GROUPS}']):,.0f} commits/s): with one message per "
            f"commit the commit dominates, and no publish path passes the raw ratio"
        ),
    )


READ_ROWS = 50_000
READ_BATCH = 1000

# The raw read: the same rows in the same order, a keyset page at a time.
_RAW_PAGE = """
SELECT l.tx, l.stream_offset, l.published_at, l.publish_id, l.routing_key, l.ordering_key,
       l.subject, l.attributes, l.body
FROM postbox.stream_log l
WHERE l.topic_id = $1 AND (l.tx, l.stream_offset) > ($2::xid8, $3::bigint)
ORDER BY l.tx, l.stream_offset
LIMIT $4
"""


async def _timed(read_all: Callable[[], Awaitable[int]]) -> float:
    """msgs/s of one pass over the whole log."""
    began = time.perf_counter()
    read = await read_all()
    if read != READ_ROWS:
        raise RuntimeError(f"read {read} of {READ_ROWS} messages")
    return read / (time.perf_counter() - began)


@scenario(
    "stream_read",
    f"one consumer group reading a stream of {READ_ROWS:,} messages, ReadStream({READ_BATCH}) + "
    f"AckStream, vs a raw keyset SELECT of the same rows, {ROUNDS} rounds in turns",
)
async def stream_read(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topic = f"read_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(ctx.db.url)
    channel = grpc.aio.insecure_channel(served.target)
    try:
        await conn.execute("SELECT postbox.create_topic($1, stream_retention => '1 day')", topic)
        for _ in range(READ_ROWS // 1000):
            await conn.execute(
                "SELECT count(*) "
                "FROM postbox.publish_batch($1, array_fill($2::bytea, ARRAY[1000]))",
                topic,
                ctx.body(),
            )
        topic_id = await conn.fetchval("SELECT id FROM postbox.topics WHERE name = $1", topic)
        await conn.execute("VACUUM ANALYZE postbox.stream_log")
        streams = stream_service_pb2_grpc.StreamServiceStub(channel)

        async def ours() -> int:
            group = spb.ConsumerGroup(topic=topic, name=f"g{uuid.uuid4().hex[:8]}")
            await streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
            read = 0
            while True:
                batch = await streams.ReadStream(
                    spb.ReadStreamRequest(
                        topic=topic, consumer_group=group.name, max_messages=READ_BATCH
                    )
                )
                if not batch.batch:
                    return read
                read += len(batch.messages)
                await streams.AckStream(
                    spb.AckStreamRequest(topic=topic, consumer_group=group.name, batch=batch.batch)
                )

        async def raw_select() -> int:
            read, tx, offset = 0, 0, 0
            while rows := await conn.fetch(_RAW_PAGE, topic_id, tx, offset, READ_BATCH):
                read += len(rows)
                tx, offset = rows[-1]["tx"], rows[-1]["stream_offset"]
            return read

        async def engine() -> int:
            group = f"e{uuid.uuid4().hex[:8]}"
            await conn.execute("SELECT FROM postbox.create_consumer_group($1, $2)", topic, group)
            read = 0
            while rows := await conn.fetch(
                "SELECT * FROM postbox.read_stream($1, $2, $3)", topic, group, READ_BATCH
            ):
                read += len(rows)
                await conn.execute("SELECT postbox.ack_stream($1, $2, $3)", topic, group,
                                   rows[0]["batch"])  # fmt: skip
            return read

        passes = {"ours": ours, "engine": engine, "raw": raw_select}
        rates: dict[str, list[float]] = {kind: [] for kind in passes}
        for round_ in range(ROUNDS):
            kinds = list(passes)
            for kind in kinds[round_ % 3 :] + kinds[: round_ % 3]:  # rotated
                rates[kind].append(await _timed(passes[kind]))
    finally:
        await channel.close()
        await conn.close()
    ratios = [o / r for o, r in zip(rates["ours"], rates["raw"], strict=True)]
    engine_ratios = [e / r for e, r in zip(rates["engine"], rates["raw"], strict=True)]
    ours_rate, raw_rate = statistics.median(rates["ours"]), statistics.median(rates["raw"])
    return [
        Row(
            f"ReadStream({READ_BATCH}) + AckStream, 1 group",
            "msgs/s",
            ours_rate,
            raw_rate,
            f"asyncpg keyset SELECT of {READ_BATCH}",
            note=(
                f"medians of {ROUNDS} passes over {READ_ROWS:,} messages: ours {ours_rate:,.0f}, "
                f"raw {raw_rate:,.0f} msgs/s; ours/raw per round {median_range(ratios, 'x')}; "
                f"the engine alone (read_stream + ack_stream over asyncpg) "
                f"{statistics.median(rates['engine']):,.0f} msgs/s, engine/raw "
                f"{median_range(engine_ratios, 'x')}"
            ),
        )
    ]


SUSTAINED_RETENTION = 30  # seconds: the log rotates every 15 s, so a run sees many rotations

LOG_STATS = """
SELECT coalesce(sum(s.n_live_tup), 0)::bigint AS log_live, coalesce(sum(s.n_dead_tup), 0)::bigint
       AS log_dead, coalesce(sum(pg_relation_size(s.relid)), 0)::bigint AS log_bytes,
       (SELECT count(*) FROM postbox.stream_slots WHERE state = 'empty') AS empty_slots
FROM pg_stat_user_tables s WHERE s.schemaname = 'postbox' AND s.relname LIKE 'stream_log_%'
"""


@scenario(
    "sustained_stream",
    "Publish(1) to a stream topic at a fixed rate, one consumer group reading and acking, "
    "the xmin horizon pinned by a snapshot (--sustained-seconds, --sustained-rate): log dead "
    "tuples and throughput per window",
)
async def sustained_stream(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topic = f"sustained_{uuid.uuid4().hex[:8]}"
    window_seconds = min(30.0, max(5.0, ctx.sustained_seconds / 10))
    monitor = await asyncpg.connect(ctx.db.url)
    pin = await asyncpg.connect(ctx.db.url)
    if ctx.sustained_pin:
        # A snapshot, not a transaction id: an open transaction id would hold the group's
        # reads back by design (see docs/concepts/streams.md); a snapshot pins vacuum alone.
        await pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        await pin.fetchval("SELECT count(*) FROM postbox.queues")
    read = 0
    latencies: list[float] = []
    windows: list[dict[str, float]] = []
    truncations = 0
    async with grpc.aio.insecure_channel(served.target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        streams = stream_service_pb2_grpc.StreamServiceStub(channel)
        created = tpb.Topic(name=topic)
        created.stream_retention.FromSeconds(SUSTAINED_RETENTION)
        await topics.CreateTopic(tpb.CreateTopicRequest(topic=created))
        group = spb.ConsumerGroup(topic=topic, name="reader")
        await streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))

        async def publish(_: int) -> None:
            body = f"{time.time():.6f}:".encode() + ctx.body()
            await topics.Publish(tpb.PublishRequest(topic=topic, body=body))

        async def consume() -> None:
            nonlocal read
            request = spb.ReadStreamRequest(topic=topic, consumer_group="reader", max_messages=1000)
            request.wait_time.FromSeconds(1)
            while True:
                batch = await streams.ReadStream(request)
                if not batch.batch:
                    continue
                now = time.time()
                latencies.extend(now - float(m.body.split(b":", 1)[0]) for m in batch.messages)
                await streams.AckStream(
                    spb.AckStreamRequest(topic=topic, consumer_group="reader", batch=batch.batch)
                )
                read += len(batch.messages)

        async def observe() -> None:
            nonlocal truncations
            seen_read, seen_latencies = 0, 0
            started = time.monotonic()
            empty_before = None
            while True:
                await asyncio.sleep(window_seconds)
                row = await monitor.fetchrow(LOG_STATS)
                assert row is not None
                stats = dict(row)
                if empty_before is not None and stats["empty_slots"] > empty_before:
                    truncations += stats["empty_slots"] - empty_before
                empty_before = stats["empty_slots"]
                window = {
                    "at_s": round(time.monotonic() - started),
                    "msgs_per_s": (read - seen_read) / window_seconds,
                    "p50_ms": percentile(latencies[seen_latencies:], 0.5) * 1000,
                    "p99_ms": percentile(latencies[seen_latencies:], 0.99) * 1000,
                    **stats,
                }
                seen_read, seen_latencies = read, len(latencies)
                windows.append(window)
                print(f"    sustained_stream {json.dumps(window)}", file=sys.stderr, flush=True)

        consumer = asyncio.ensure_future(consume())
        observer = asyncio.ensure_future(observe())
        try:
            await fixed_rate(publish, rate=ctx.sustained_rate, seconds=ctx.sustained_seconds)
        finally:
            for task in (consumer, observer):
                task.cancel()
            await asyncio.gather(consumer, observer, return_exceptions=True)
    pinned = await monitor.fetchval(
        "SELECT backend_xmin IS NOT NULL FROM pg_stat_activity WHERE pid = $1",
        pin.get_server_pid(),
    )
    await pin.close()
    await monitor.close()
    if len(windows) < 2:
        raise RuntimeError("the run was shorter than two windows: raise --sustained-seconds")
    first, last = windows[0], windows[-1]
    most_dead = max(w["log_dead"] for w in windows)
    note = (
        f"{len(windows)} windows of {window_seconds:g} s at {ctx.sustained_rate:g} msg/s, "
        f"retention {SUSTAINED_RETENTION} s; horizon {'pinned' if pinned else 'NOT pinned'} "
        f"to the end; slots truncated: at least {truncations}; log rows at the end "
        f"{last['log_live']:,}, {last['log_bytes'] / 2**20:.1f} MiB"
    )
    return [
        Row("sustained_stream: read throughput", "msgs/s", last["msgs_per_s"],
            first["msgs_per_s"], "first window", note=note),
        Row("sustained_stream: publish->read p99", "ms", last["p99_ms"], first["p99_ms"],
            "first window"),
        Row("sustained_stream: most dead tuples in the log", "tuples", most_dead, None,
            target="0", met=most_dead == 0),
    ]  # fmt: skip
