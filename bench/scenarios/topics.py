"""Topic fan-out: Publish to a topic with queue subscriptions against the same rows inserted raw."""

from __future__ import annotations

import uuid

import grpc
from postbox.v1 import topic_service_pb2 as tpb
from postbox.v1 import topic_service_pb2_grpc

from bench import raw
from bench.load import closed_loop
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import Channels, measured

SUBSCRIBED_QUEUES = 10
PUBLISHERS = 16


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
    f"{PUBLISHERS} clients, vs a raw INSERT of the same {SUBSCRIBED_QUEUES} rows per message",
)
async def topic_fanout(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topic = await _topic(ctx, served.target)
    request = tpb.PublishRequest(topic=topic, body=ctx.body())
    channels = Channels(served.target, 4, topic_service_pb2_grpc.TopicServiceStub)

    async def publish() -> int:
        response = await channels.stub().Publish(request)
        if len(response.message_ids) != SUBSCRIBED_QUEUES:
            raise RuntimeError(f"published to {len(response.message_ids)} queues")
        return 1

    try:
        ours, cpu = await measured(
            served, lambda: closed_loop(publish, clients=PUBLISHERS, seconds=ctx.seconds)
        )
    finally:
        await channels.close()
    pool = await ctx.db.pool(PUBLISHERS)
    body = ctx.body()
    try:
        theirs = await closed_loop(
            lambda: raw.insert_fanout(pool, body, SUBSCRIBED_QUEUES),
            clients=PUBLISHERS,
            seconds=ctx.seconds,
        )
    finally:
        await pool.close()
    await ctx.db.reset_raw()
    return [
        Row(
            f"Publish(1) x{PUBLISHERS} -> {SUBSCRIBED_QUEUES} queues",
            "msgs/s",
            ours.rate,
            theirs.rate,
            f"asyncpg INSERT of {SUBSCRIBED_QUEUES} rows/commit",
            note=(
                f"p50 {ours.latency_ms(0.5):.1f} / p99 {ours.latency_ms(0.99):.1f} ms "
                f"(raw {theirs.latency_ms(0.5):.1f} / {theirs.latency_ms(0.99):.1f}); "
                f"server CPU {cpu:.0%}"
            ),
        )
    ]
