"""Receive+Delete with queue features: FIFO groups, priorities, the StreamingReceive stream,
the Python SDK's consumer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import asyncpg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from postbox_client import AsyncClient

from bench import raw
from bench.load import Load
from bench.processes import Served, cpu_share
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import (
    CONSUMERS,
    Counts,
    consumed,
    fill_queue,
    raw_claim_deletes,
    raw_receive_rows,
    receive_deletes,
)

BATCH = 10
GROUPS = 100
PRIORITIES = 10


def _total(ctx: Context) -> int:
    """Messages enough that no side runs dry before its time is up, in whole batches of 1,000."""
    return int(ctx.seconds + 1) * 25_000


Measure = Callable[[Context, Served, str, int, int], Awaitable[Load]]


async def _receive_rate(
    ctx: Context,
    served: Served,
    hint: str,
    entry: Callable[[int], pb.SendBatchEntry],
    *,
    fifo: bool = False,
    measure: Measure = receive_deletes,
) -> tuple[Load, float]:
    """A new queue filled with entry(i) for _total messages, consumed by `measure`; Load and CPU."""
    queue = await ctx.new_queue(served.target, hint, fifo=fifo)
    await fill_queue(served, queue, entry, _total(ctx))
    before = served.cpu()
    load = await measure(ctx, served, queue, BATCH, _total(ctx))
    return load, cpu_share(before, served.cpu())


async def _feature_rows(
    ctx: Context,
    label: str,
    ours: tuple[Load, float],
    plain: tuple[Load, float],
    plain_is: tuple[str, str],
    raw_fill: Callable[[], Awaitable[None]],
    raw_claim: Callable[[raw.Connection, int], Awaitable[int]],
    raw_is: str,
) -> list[Row]:
    """A feature's figure against the same messages without it, and against raw SQL doing
    the feature's claim + delete (the raw table filled by raw_fill)."""
    (ours_load, cpu), (plain_load, plain_cpu) = ours, plain
    await ctx.db.reset_raw()
    await raw_fill()
    theirs = await raw_claim_deletes(ctx, BATCH, _total(ctx), raw_claim)
    await ctx.db.reset_raw()
    plain_label, plain_short = plain_is
    return [
        Row(
            label,
            "msgs/s",
            ours_load.rate,
            plain_load.rate,
            plain_label,
            note=f"server CPU {cpu:.0%} ({plain_short}: {plain_cpu:.0%})",
        ),
        Row(label, "msgs/s", ours_load.rate, theirs.rate, raw_is),
    ]


@scenario(
    "fifo_receive",
    f"Receive+Delete msgs/s on a FIFO queue with {GROUPS} message groups, batch {BATCH}, "
    f"{CONSUMERS} consumers, vs a standard queue with the same messages and vs raw SQL "
    "claiming group heads + delete",
)
async def fifo_receive(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    body = ctx.body()

    def entry(i: int) -> pb.SendBatchEntry:
        return pb.SendBatchEntry(
            body=body, message_group_id=f"group-{i % GROUPS}", deduplication_id=str(i)
        )

    return await _feature_rows(
        ctx,
        f"FIFO Receive+Delete({BATCH}) x{CONSUMERS}, {GROUPS} groups",
        await _receive_rate(ctx, served, "fifo", entry, fifo=True),
        await _receive_rate(ctx, served, "standard", entry),
        ("same on a standard queue", "standard"),
        lambda: raw.fill_fifo(ctx.db, body, _total(ctx), GROUPS),
        raw.fifo_claim_delete,
        "asyncpg group-head SKIP LOCKED DELETE",
    )


@scenario(
    "priority_receive",
    f"Receive+Delete msgs/s, batch {BATCH}, {CONSUMERS} consumers, priorities 0-9 mixed "
    "vs all priority 0 and vs raw SQL claiming the highest priority first + delete",
)
async def priority_receive(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    body = ctx.body()
    return await _feature_rows(
        ctx,
        f"Receive+Delete({BATCH}) x{CONSUMERS}, priorities 0-9",
        await _receive_rate(
            ctx,
            served,
            "priorities",
            lambda i: pb.SendBatchEntry(body=body, priority=i % PRIORITIES),
        ),
        await _receive_rate(ctx, served, "priority0", lambda i: pb.SendBatchEntry(body=body)),
        ("same, all priority 0", "priority 0"),
        lambda: raw.fill_priorities(ctx.db, body, _total(ctx), PRIORITIES),
        raw.priority_claim_delete,
        "asyncpg priority-first SKIP LOCKED DELETE",
    )


async def streaming_receives(
    ctx: Context, served: Served, queue: str, batch: int, total: int
) -> Load:
    """CONSUMERS StreamingReceive streams, each deleting every batch on its own stream.

    A message counts once the result of its delete says OK: that is when it is
    committed, as a DeleteBatch response is for the Receive consumers.
    """

    async def consume(
        stub: message_service_pb2_grpc.MessageServiceAsyncStub, counts: Counts
    ) -> None:
        call = stub.StreamingReceive()
        try:
            await call.write(
                pb.StreamingReceiveRequest(
                    queue=queue, max_messages=batch, visibility_timeout={"seconds": 120}
                )
            )
            while True:
                response = await call.read()
                if not isinstance(response, pb.StreamingReceiveResponse):  # grpc.aio.EOF
                    return
                if response.HasField("batch"):
                    receipts = [m.receipt for m in response.batch.messages]
                    await call.write(pb.StreamingReceiveRequest(delete_receipts=receipts))
                    continue
                deleted = sum(1 for r in response.settle_results.deletes if r.code == 0)
                if counts.add(deleted):
                    return
        finally:
            call.cancel()

    return await consumed(ctx, served, total, consume)


async def sdk_consumers(ctx: Context, served: Served, queue: str, batch: int, total: int) -> Load:
    """CONSUMERS consumers of the Python SDK (postbox_client.Consumer), each running its
    default 8 handlers, which ack each message on its own. They run for --seconds and
    are then stopped gracefully (their settles answered); a message counts when its
    delete has committed: the queue's rows gone, counted in the database."""
    async with AsyncClient(served.target) as client:
        consumers = [
            client.consumer(queue, max_messages=batch, lease=timedelta(seconds=120))
            for _ in range(CONSUMERS)
        ]

        async def handler(message: object) -> None:
            pass

        loop = asyncio.get_running_loop()
        started = loop.time()
        runs = [asyncio.ensure_future(c.run(handler)) for c in consumers]
        await asyncio.sleep(ctx.seconds)  # a run of fixed length, as Counts' window is
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*runs)
        elapsed = loop.time() - started
    conn = await asyncpg.connect(ctx.db.url)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id "
            "WHERE q.name = $1",
            queue,
        )
    finally:
        await conn.close()
    return Load(total - left, elapsed)


async def _plain_rows(
    ctx: Context,
    label: str,
    ours: tuple[str, Measure],
    theirs: tuple[str, Measure],
    theirs_is: str,
) -> list[Row]:
    """Plain messages consumed by `ours` against `theirs` (each a queue hint and a
    measure) on the same server, and against both raw claims."""
    served = ctx.postbox()
    body = ctx.body()

    def entry(i: int) -> pb.SendBatchEntry:
        return pb.SendBatchEntry(body=body)

    (our_hint, our_measure), (their_hint, their_measure) = ours, theirs
    our_load, cpu = await _receive_rate(ctx, served, our_hint, entry, measure=our_measure)
    their_load, their_cpu = await _receive_rate(
        ctx, served, their_hint, entry, measure=their_measure
    )
    one_statement, leased, _ = await raw_receive_rows(
        ctx, label, our_load, body, BATCH, _total(ctx)
    )
    return [
        Row(
            label,
            "msgs/s",
            our_load.rate,
            their_load.rate,
            theirs_is,
            note=f"server CPU {cpu:.0%} ({their_hint}: {their_cpu:.0%})",
        ),
        one_statement,
        leased,
    ]


@scenario(
    "sdk_consumer",
    f"Python SDK consumers (postbox_client.Consumer, 8 handlers each, one ack per message), "
    f"{CONSUMERS} of them, vs StreamingReceive deleting each batch and vs raw SKIP LOCKED "
    "claim+delete",
)
async def sdk_consumer(ctx: Context) -> list[Row]:
    return await _plain_rows(
        ctx,
        f"SDK Consumer x{CONSUMERS}",
        ("sdk", sdk_consumers),
        ("streaming", streaming_receives),
        f"StreamingReceive({BATCH}), a delete per batch",
    )


@scenario(
    "streaming_receive",
    f"StreamingReceive with deletes on the stream, batch {BATCH}, {CONSUMERS} consumers, vs "
    "Receive + DeleteBatch and vs raw SKIP LOCKED claim+delete",
)
async def streaming_receive(ctx: Context) -> list[Row]:
    return await _plain_rows(
        ctx,
        f"StreamingReceive({BATCH}) x{CONSUMERS}",
        ("streaming", streaming_receives),
        ("unary", receive_deletes),
        "Receive + DeleteBatch",
    )
