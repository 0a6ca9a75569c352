"""Receive+Delete with queue features: FIFO groups, priorities, the StreamingReceive stream."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

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


@scenario(
    "streaming_receive",
    f"StreamingReceive with deletes on the stream, batch {BATCH}, {CONSUMERS} consumers, vs "
    "Receive + DeleteBatch and vs raw SKIP LOCKED claim+delete",
)
async def streaming_receive(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    body = ctx.body()

    def entry(i: int) -> pb.SendBatchEntry:
        return pb.SendBatchEntry(body=body)

    ours, cpu = await _receive_rate(ctx, served, "streaming", entry, measure=streaming_receives)
    unary, unary_cpu = await _receive_rate(ctx, served, "unary", entry)
    label = f"StreamingReceive({BATCH}) x{CONSUMERS}"
    one_statement, leased = await raw_receive_rows(ctx, label, ours, body, BATCH, _total(ctx))
    return [
        Row(
            label,
            "msgs/s",
            ours.rate,
            unary.rate,
            "Receive + DeleteBatch",
            note=f"server CPU {cpu:.0%} (Receive + DeleteBatch: {unary_cpu:.0%})",
        ),
        one_statement,
        leased,
    ]
