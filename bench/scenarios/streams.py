"""Stream topics: publishing to a topic that keeps one log for its consumer groups, against
today's fan-out of a copy into every subscribed queue.

Both topics serve the same ten readers: ten consumer groups of the stream topic, ten
queues subscribed to the other. The two are measured in turns within each of ROUNDS
rounds (the order rotating), and the figure is the median of the rounds' ratios, with
their range: the machine's noise moves both sides of a round alike.
"""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb

from bench.load import closed_loop
from bench.runner import Context, Row, scenario
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


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x ({min(values):.2f}-{max(values):.2f})"


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
                        f"{_median_range(ratios)}"
                    ),
                )
            )
    finally:
        await channels.close()
    return rows
