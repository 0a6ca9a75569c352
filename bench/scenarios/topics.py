"""Topic fan-out: Publish to a topic with queue subscriptions against the same rows inserted raw."""

from __future__ import annotations

import statistics
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import grpc
from postbox.v1 import topic_service_pb2 as tpb
from postbox.v1 import topic_service_pb2_grpc

from bench import raw
from bench.cpu import CpuPerOperation, cpu_row, median_split, metered
from bench.empty_server import FANOUT_QUEUES
from bench.load import Load, closed_loop
from bench.processes import Served
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import Channels, costs_added

SUBSCRIBED_QUEUES = FANOUT_QUEUES
# Closed-loop publishers. With 16 the machine's cores are not all busy: a Publish
# waits mostly on the commit before it (one group at the database at a time), so
# groups, and the rate, grow with more publishers. The bench shows both.
PUBLISHERS = (16, 64)
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


@dataclass
class _Turns:
    """One concurrency's rounds: ours, raw and the transport alone, by round."""

    publishers: int
    rounds: list[dict[str, Load]] = field(default_factory=list)
    splits: dict[str, list[CpuPerOperation]] = field(
        default_factory=lambda: {"ours": [], "raw": [], "transport": []}
    )
    groups: list[float] = field(default_factory=list)  # Publishes per commit, per round

    def rate(self, name: str) -> float:
        return statistics.median(r[name].rate for r in self.rounds)

    def ratios(self, name: str, of: str) -> list[float]:
        return [r[name].rate / r[of].rate for r in self.rounds]


@scenario(
    "topic_fanout",
    f"Publish(1) msgs/s to a topic with {SUBSCRIBED_QUEUES} subscribed queues, "
    f"{' and '.join(map(str, PUBLISHERS))} clients, vs a raw INSERT of the same "
    f"{SUBSCRIBED_QUEUES} rows per message, {ROUNDS} rounds taking turns",
)
async def topic_fanout(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    topic = await _topic(ctx, served.target)
    turns = [await _take_turns(ctx, served, topic, publishers) for publishers in PUBLISHERS]
    engine_row, engine_grouped = await _engine_alone(ctx, topic)
    await ctx.db.reset_raw()
    return [row for each in turns for row in _rows(each, engine_grouped)] + [engine_row]


async def _take_turns(ctx: Context, served: Served, topic: str, publishers: int) -> _Turns:
    request = tpb.PublishRequest(topic=topic, body=ctx.body())
    channels = Channels(served.target, 4, topic_service_pb2_grpc.TopicServiceStub)
    # The same client against the in-memory server: what gRPC alone allows.
    bare = Channels(ctx.empty().target, 4, topic_service_pb2_grpc.TopicServiceStub)
    pool = await ctx.db.pool(publishers)
    body = ctx.body()
    turns = _Turns(publishers)

    def publish(through: Channels) -> Callable[[], Awaitable[int]]:
        async def call() -> int:
            response = await through.stub().Publish(request)
            if len(response.message_ids) != SUBSCRIBED_QUEUES:
                raise RuntimeError(f"published to {len(response.message_ids)} queues")
            return 1

        return call

    async def metered_turn(
        name: str, server: Served | None, call: Callable[[], Awaitable[int]]
    ) -> Load:
        """One turn of `call` in a closed loop, keeping each part's CPU per publish."""
        load, split = await metered(
            server,
            lambda window: closed_loop(
                call, clients=publishers, seconds=ctx.seconds, window=window
            ),
        )
        turns.splits[name].append(split)
        return load

    async def ours() -> Load:
        before = served.group_commits()
        load = await metered_turn("ours", served, publish(channels))
        turns.groups.append(served.group_commits().mean_since(before))
        return load

    async def theirs() -> Load:
        return await metered_turn(
            "raw", None, lambda: raw.insert_fanout(pool, body, SUBSCRIBED_QUEUES)
        )

    async def transport() -> Load:
        return await metered_turn("transport", ctx.empty(), publish(bare))

    # The machine's load drifts: the three take turns, each going first in some
    # rounds, and the figures are medians of the rounds' ratios.
    measures = {"ours": ours, "raw": theirs, "transport": transport}
    order = list(measures)
    try:
        for turn in range(ROUNDS):
            rotated = order[turn % len(order) :] + order[: turn % len(order)]
            turns.rounds.append({name: await measures[name]() for name in rotated})
    finally:
        await channels.close()
        await bare.close()
        await pool.close()
    return turns


def _rows(turns: _Turns, engine_grouped: float) -> list[Row]:
    label = f"Publish(1) x{turns.publishers} -> {SUBSCRIBED_QUEUES} queues"
    ratios = turns.ratios("ours", "raw")
    last = turns.rounds[-1]
    ours_rate, raw_rate = turns.rate("ours"), turns.rate("raw")
    # What the server could do at most if the cores were its limit: its gRPC calls and
    # the engine's publishes in the batches its group commit forms, each measured alone.
    bound = costs_added(turns.rate("transport"), engine_grouped)
    return [
        Row(
            label,
            "msgs/s",
            ours_rate,
            raw_rate,
            f"asyncpg INSERT of {SUBSCRIBED_QUEUES} rows/commit",
            target=f">= {TARGET} of raw",
            met=statistics.median(ratios) >= TARGET,
            note=(
                f"medians of {ROUNDS} rounds; ratio per round {median_range(ratios)}; "
                f"last round p50 {last['ours'].latency_ms(0.5):.1f} / p99 "
                f"{last['ours'].latency_ms(0.99):.1f} ms (raw {last['raw'].latency_ms(0.5):.1f} / "
                f"{last['raw'].latency_ms(0.99):.1f}); "
                f"Publishes per commit {statistics.median(turns.groups):.1f}"
            ),
        ),
        Row(
            label,
            "msgs/s",
            ours_rate,
            turns.rate("transport"),
            "the same client, in-memory server",
            note=(
                f"ours/transport per round {median_range(turns.ratios('ours', 'transport'))}; "
                f"the transport alone does {median_range(turns.ratios('transport', 'raw'))} of "
                f"raw; with the engine's publish_batch of {GROUPED} per commit, costs added, at "
                f"most {bound:,.0f} publishes/s = {bound / raw_rate:.2f} of raw; "
                f"ours {ours_rate / bound:.2f} of that"
            ),
        ),
        cpu_row(
            label,
            "publish",
            (
                median_split(turns.splits["ours"]),
                median_split(turns.splits["raw"]),
                median_split(turns.splits["transport"]),
            ),
            TARGET,
            raw_rate,
            f"medians of {ROUNDS} rounds",
        ),
    ]


GROUPED = 8  # publishes per publish_batch, about what group commit forms (5 at x16, 8-12 at x64)
SESSIONS = PUBLISHERS[0]  # of the engine alone


async def _engine_alone(ctx: Context, topic: str) -> tuple[Row, float]:
    """The engine's own fan-out, pgbench -M prepared from SESSIONS sessions: postbox.publish
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
                ctx.db, scripts[kind], clients=SESSIONS, seconds=ctx.seconds
            )
            rates[kind].append(tps * per_call[kind])
    single = [p / r for p, r in zip(rates["publish"], rates["raw"], strict=True)]
    grouped = [g / r for g, r in zip(rates["grouped"], rates["raw"], strict=True)]
    grouped_rate = statistics.median(rates["grouped"])
    return Row(
        f"postbox.publish x{SESSIONS} -> {SUBSCRIBED_QUEUES} queues, engine alone",
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
