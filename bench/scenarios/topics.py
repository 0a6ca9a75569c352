"""Topic fan-out: Publish to a topic with queue subscriptions against the same rows inserted raw."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Awaitable, Callable

import grpc
from postbox.v1 import topic_service_pb2 as tpb
from postbox.v1 import topic_service_pb2_grpc

from bench import raw
from bench.empty_server import FANOUT_QUEUES
from bench.load import Load, closed_loop
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import Channels, costs_added, measured

SUBSCRIBED_QUEUES = FANOUT_QUEUES
PUBLISHERS = 16
ROUNDS = 3
TARGET = 0.5  # of raw, issue 17


async def _topic(ctx: Context, target: str) -> str:
    """A topic with SUBSCRIBED_QUEUES queues subscribed to every message."""
    topic = f"fanout_{uuid.uuid4().hex[:8]}"
    async with grpc.aio.insecure_channel(target) as channel:
        topics = topic_service_pb2_grpc.TopicServiceStub(channel)
        await topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
        for i in range(SUBSCRIBED_QUEUES):
            queue = await ctx.new_queue(target, f"sub{i}")
            await topics.CreateSubscription(
                tpb.CreateSubscriptionRequest(
                    subscription=tpb.Subscription(name=f"to_{queue}", topic=topic, queue=queue)
                )
            )
    return topic


@scenario(
    "topic_fanout",
    f"Publish(1) msgs/s to a topic with {SUBSCRIBED_QUEUES} subscribed queues, "
    f"{PUBLISHERS} clients, vs a raw INSERT of the same {SUBSCRIBED_QUEUES} rows per message, "
    f"{ROUNDS} rounds taking turns",
)
async def topic_fanout(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topic = await _topic(ctx, served.target)
    request = tpb.PublishRequest(topic=topic, body=ctx.body())
    channels = Channels(served.target, 4, topic_service_pb2_grpc.TopicServiceStub)
    # The same client against the in-memory server: what gRPC alone allows.
    bare = Channels(ctx.empty().target, 4, topic_service_pb2_grpc.TopicServiceStub)
    pool = await ctx.db.pool(PUBLISHERS)
    body = ctx.body()

    def publish(through: Channels) -> Callable[[], Awaitable[int]]:
        async def call() -> int:
            response = await through.stub().Publish(request)
            if len(response.message_ids) != SUBSCRIBED_QUEUES:
                raise RuntimeError(f"published to {len(response.message_ids)} queues")
            return 1

        return call

    async def ours() -> Load:
        before = served.group_commits()
        load, cpu = await measured(
            served,
            lambda: closed_loop(publish(channels), clients=PUBLISHERS, seconds=ctx.seconds),
        )
        cpus.append(cpu)
        groups.append(served.group_commits().mean_since(before))
        return load

    async def theirs() -> Load:
        return await closed_loop(
            lambda: raw.insert_fanout(pool, body, SUBSCRIBED_QUEUES),
            clients=PUBLISHERS,
            seconds=ctx.seconds,
        )

    async def transport() -> Load:
        return await closed_loop(publish(bare), clients=PUBLISHERS, seconds=ctx.seconds)

    # The machine's load drifts: the three take turns, each going first in some
    # rounds, and the figures are medians of the rounds' ratios.
    cpus: list[float] = []
    groups: list[float] = []  # Publishes per commit, per round
    rounds: list[dict[str, Load]] = []
    measures = {"ours": ours, "raw": theirs, "transport": transport}
    order = list(measures)
    try:
        for turn in range(ROUNDS):
            rotated = order[turn % len(order) :] + order[: turn % len(order)]
            rounds.append({name: await measures[name]() for name in rotated})
    finally:
        await channels.close()
        await bare.close()
        await pool.close()
    engine_row, engine_grouped = await _engine_alone(ctx, topic)
    await ctx.db.reset_raw()
    ratios = [r["ours"].rate / r["raw"].rate for r in rounds]
    of_transport = [r["ours"].rate / r["transport"].rate for r in rounds]
    transport_by_raw = [r["transport"].rate / r["raw"].rate for r in rounds]
    median_ratio = statistics.median(ratios)
    last = rounds[-1]
    ours_rate = statistics.median(r["ours"].rate for r in rounds)
    raw_rate = statistics.median(r["raw"].rate for r in rounds)
    transport_rate = statistics.median(r["transport"].rate for r in rounds)
    # What the server could do at most: its gRPC calls and the engine's publishes
    # in the batches its group commit forms, each measured alone on these cores.
    bound = costs_added(transport_rate, engine_grouped)
    return [
        Row(
            f"Publish(1) x{PUBLISHERS} -> {SUBSCRIBED_QUEUES} queues",
            "msgs/s",
            ours_rate,
            raw_rate,
            f"asyncpg INSERT of {SUBSCRIBED_QUEUES} rows/commit",
            target=f">= {TARGET} of raw",
            met=median_ratio >= TARGET,
            note=(
                f"medians of {ROUNDS} rounds; ratio per round {median_range(ratios)}; "
                f"last round p50 {last['ours'].latency_ms(0.5):.1f} / p99 "
                f"{last['ours'].latency_ms(0.99):.1f} ms (raw {last['raw'].latency_ms(0.5):.1f} / "
                f"{last['raw'].latency_ms(0.99):.1f}); server CPU {statistics.median(cpus):.0%}; "
                f"Publishes per commit {statistics.median(groups):.1f}"
            ),
        ),
        Row(
            f"Publish(1) x{PUBLISHERS} -> {SUBSCRIBED_QUEUES} queues",
            "msgs/s",
            ours_rate,
            transport_rate,
            "the same client, in-memory server",
            note=(
                f"ours/transport per round {median_range(of_transport)}; the transport alone "
                f"does {median_range(transport_by_raw)} of raw; with the engine's publish_batch "
                f"of {GROUPED} per commit, costs added, at most {bound:,.0f} publishes/s = "
                f"{bound / raw_rate:.2f} of raw; ours {ours_rate / bound:.2f} of that"
            ),
        ),
        engine_row,
    ]


GROUPED = 8  # publishes per publish_batch, about what group commit forms with 16 publishers


async def _engine_alone(ctx: Context, topic: str) -> tuple[Row, float]:
    """The engine's own fan-out, pgbench -M prepared from PUBLISHERS sessions: postbox.publish
    once per commit, and publish_batch of GROUPED (as group commit shares a commit),
    against the raw INSERT of the same rows, one publish's rows per commit. Also returns
    the median publishes/s of publish_batch."""
    hex_body = ctx.body().hex()
    scripts = {
        "publish": f"SELECT count(*) FROM postbox.publish('{topic}', '\\x{hex_body}'::bytea);",
        "grouped": f"SELECT count(*) FROM postbox.publish_batch('{topic}', "
        f"array_fill('\\x{hex_body}'::bytea, ARRAY[{GROUPED}]));",
        "raw": f"INSERT INTO {raw.RAW_TABLE} (queue_id, visible_at, enqueued_at, body) "
        f"SELECT q, now(), now(), '\\x{hex_body}'::bytea "
        f"FROM generate_series(1, {SUBSCRIBED_QUEUES}) q;",
    }
    per_call = {"publish": 1, "grouped": GROUPED, "raw": 1}
    rates: dict[str, list[float]] = {kind: [] for kind in scripts}
    kinds = list(scripts)
    for round_ in range(ROUNDS):
        for kind in kinds[round_ % len(kinds) :] + kinds[: round_ % len(kinds)]:  # rotated
            tps = await raw.pgbench_tps(
                ctx.db, scripts[kind], clients=PUBLISHERS, seconds=ctx.seconds
            )
            rates[kind].append(tps * per_call[kind])
    single = [p / r for p, r in zip(rates["publish"], rates["raw"], strict=True)]
    grouped = [g / r for g, r in zip(rates["grouped"], rates["raw"], strict=True)]
    grouped_rate = statistics.median(rates["grouped"])
    return Row(
        f"postbox.publish x{PUBLISHERS} -> {SUBSCRIBED_QUEUES} queues, engine alone",
        "msgs/s",
        statistics.median(rates["publish"]),
        statistics.median(rates["raw"]),
        f"pgbench INSERT of {SUBSCRIBED_QUEUES} rows/commit",
        target=f">= {TARGET} of raw",
        met=statistics.median(single) >= TARGET,
        note=(
            f"pgbench -M prepared, {ROUNDS} rounds rotated; one publish per commit "
            f"{median_range(single)} of raw; publish_batch of {GROUPED} per commit "
            f"{median_range(grouped)} ({grouped_rate:,.0f} publishes/s), "
            f"which the server's group commit forms"
        ),
    ), grouped_rate
