"""Batch and streaming writers: each task sends its partition through SendBatch.

Every message carries an idempotency id that a retried or speculative attempt of
the same task computes again: `<write id>:<partition>:<row>:<digest>` for a batch
write, `<query id>:<batch id>:<partition>:<row>:<digest>` for a stream (both kept
in the checkpoint, so a restarted query repeats them), where the digest hashes
the content of the request that carries the row (see Encoder), or the user's
dedupe column. The
server drops a repeat within the queue's deduplication window, so rows that
an earlier attempt already committed are not sent twice.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from postbox_client.spark.client import BatchSender
from postbox_client.spark.encode import Encoder
from postbox_client.spark.options import WritePlan

# Local properties Spark's micro-batch engine sets for the tasks of a batch.
_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"

log = logging.getLogger(__name__)


@dataclass
class PartitionResult(WriterCommitMessage):
    """What one task committed: every message in it was acknowledged by SendBatch."""

    partition: int
    attempt: int
    messages: int
    # Of `messages`, how many an earlier attempt had already committed.
    duplicates: int
    requests: int
    retries: int


def send_partition(
    plan: WritePlan, batches: Iterable[pa.RecordBatch], id_prefix: str
) -> PartitionResult:
    """Sends one partition; returns only when every message is committed, else raises."""
    context = TaskContext.get()
    encoder = Encoder(plan, id_prefix)
    with plan.connection.open() as channel:
        sender = BatchSender(channel, plan.connection, plan.retry, plan.max_in_flight)
        for batch in batches:
            for request in encoder.requests(batch):
                sender.submit(request)
        sender.finish()
    return PartitionResult(
        partition=context.partitionId() if context else 0,
        attempt=context.attemptNumber() if context else 0,
        messages=sender.messages,
        duplicates=sender.duplicates,
        requests=sender.batches,
        retries=sender.retries,
    )


def _task_prefix(*parts: object) -> str:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("postbox writers run inside Spark tasks")
    return ":".join(str(p) for p in (*parts, context.partitionId()))


def _landed(messages: Iterable[WriterCommitMessage | None]) -> str:
    """What the tasks that finished committed, for the driver's log."""
    results = [m for m in messages if isinstance(m, PartitionResult)]
    count = sum(r.messages for r in results)
    repeats = sum(r.duplicates for r in results)
    text = f"{count} messages from {len(results)} partitions"
    if repeats:
        text += f" ({repeats} of them already committed by an earlier attempt, not sent again)"
    return text


class PostboxWriter(DataSourceArrowWriter):
    """`df.write.format("postbox")`: one write id for every task and attempt of the job."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    # Arrow batches where DataSourceWriter.write takes Rows: pyspark's Arrow writers
    # break that signature themselves, and mypy checks every base.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionResult:  # type: ignore[override]
        return send_partition(self.plan, iterator, _task_prefix(self.plan.write_id))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        log.info(
            "write %s to %s committed: %s",
            self.plan.write_id,
            self.plan.destination,
            _landed(messages),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.error(
            "write %s to %s failed; committed and staying there (a queue has no"
            " rollback): %s. Rerun with option write_id=%s to send only the rest, within"
            " the queue's deduplication window",
            self.plan.write_id,
            self.plan.destination,
            _landed(messages),
            self.plan.write_id,
        )


class PostboxStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("postbox")`: ids come from the query id and the batch id."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    # Arrow batches where DataSourceWriter.write takes Rows: pyspark's Arrow writers
    # break that signature themselves, and mypy checks every base.
    def write(self, iterator: Iterator[pa.RecordBatch]) -> PartitionResult:  # type: ignore[override]
        context = TaskContext.get()
        query_id = context.getLocalProperty(_QUERY_ID) if context else None
        batch_id = context.getLocalProperty(_BATCH_ID) if context else None
        if query_id is None or batch_id is None:
            raise RuntimeError(
                "the postbox stream writer runs only in a micro-batch streaming query"
            )
        return send_partition(self.plan, iterator, _task_prefix(query_id, batch_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.info("batch %d to %s committed: %s", batchId, self.plan.destination, _landed(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.error(
            "batch %d to %s failed; committed before the failure: %s. When the query"
            " runs the batch again, these are not sent twice (within the queue's"
            " deduplication window)",
            batchId,
            self.plan.destination,
            _landed(messages),
        )
