"""Topic fan-out: Publish to a topic with queue subscriptions against the same rows inserted raw."""

from __future__ import annotations

import statistics
import uuid

import grpc
from postbox.v1 import topic_service_pb2 as tpb
from postbox.v1 import topic_service_pb2_grpc

from bench import raw
from bench.load import Load, closed_loop
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import Channels, measured

SUBSCRIBED_QUEUES = 10
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
    pool = await ctx.db.pool(PUBLISHERS)
    body = ctx.body()

    async def publish() -> int:
        response = await channels.stub().Publish(request)
        if len(response.message_ids) != SUBSCRIBED_QUEUES:
            raise RuntimeError(f"published to {len(response.message_ids)} queues")
        return 1

    async def ours() -> Load:
        load, cpu = await measured(
            served, lambda: closed_loop(publish, clients=PUBLISHERS, seconds=ctx.seconds)
        )
        cpus.append(cpu)
        return load

    async def theirs() -> Load:
        return await closed_loop(
            lambda: raw.insert_fanout(pool, body, SUBSCRIBED_QUEUES),
            clients=PUBLISHERS,
            seconds=ctx.seconds,
        )

    # The machine's load drifts: the two take turns, each going first in some
    # rounds, and the figure is the median of the rounds' ratios.
    cpus: list[float] = []
    rounds: list[tuple[Load, Load]] = []
    try:
        for turn in range(ROUNDS):
            if turn % 2 == 0:
                rounds.append((await ours(), await theirs()))
            else:
                theirs_load = await theirs()
                rounds.append((await ours(), theirs_load))
    finally:
        await channels.close()
        await pool.close()
    await ctx.db.reset_raw()
    ratios = [o.rate / t.rate for o, t in rounds]
    median_ratio = statistics.median(ratios)
    last_ours, last_theirs = rounds[-1]
    return [
        Row(
            f"Publish(1) x{PUBLISHERS} -> {SUBSCRIBED_QUEUES} queues",
            "msgs/s",
            statistics.median(o.rate for o, _ in rounds),
            statistics.median(t.rate for _, t in rounds),
            f"asyncpg INSERT of {SUBSCRIBED_QUEUES} rows/commit",
            target=f">= {TARGET} of raw",
            met=median_ratio >= TARGET,
            note=(
                f"medians of {ROUNDS} rounds; ratio per round {median_ratio:.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}); last round p50 "
                f"{last_ours.latency_ms(0.5):.1f} / p99 {last_ours.latency_ms(0.99):.1f} ms "
                f"(raw {last_theirs.latency_ms(0.5):.1f} / {last_theirs.latency_ms(0.99):.1f}); "
                f"server CPU {statistics.median(cpus):.0%}"
            ),
        )
    ]
