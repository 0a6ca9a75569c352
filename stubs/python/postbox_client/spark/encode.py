"""Turns Arrow record batches into SendBatch requests, following a WritePlan."""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import topic_service_pb2 as tpb

import postbox_client.spark.wire as wire
from postbox_client.spark.client import EncodedRequest
from postbox_client.spark.options import AttributeColumn, WritePlan, attribute_name_problem

# What an Encoder makes: SendBatch requests for a queue, PublishBatch ones for a topic.
BatchRequest = pb.SendBatchRequest | tpb.PublishBatchRequest
BatchEntry = pb.SendBatchEntry | tpb.PublishBatchEntry

# A request stays well under the server's 64 MiB request limit even when
# messages are large; small messages reach the 1,000-entry limit first.
MAX_REQUEST_BYTES = 8 * 1024 * 1024
# Bodies that one pass of the Arrow encoding takes at most: it holds about three
# copies of them at once.
ENCODE_BYTES = 32 * 1024 * 1024


class PostboxRowError(ValueError):
    """A row cannot become a message (a null body, say): the task fails naming it."""


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)  # a float would round it
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def _json_bodies(batch: pa.RecordBatch, columns: Sequence[str]) -> list[bytes]:
    encode = json.JSONEncoder(
        default=_json_default, ensure_ascii=False, allow_nan=False, separators=(",", ":")
    ).encode
    rows = batch.select(list(columns)).to_pylist(maps_as_pydicts="strict")
    try:
        return [encode(row).encode() for row in rows]
    except ValueError as error:  # NaN or infinity, which JSON cannot hold
        raise PostboxRowError(f"a row cannot be written as JSON: {error}") from error


def _attribute_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _digest(request_without_ids: bytes | memoryview) -> str:
    """16 hex digits of a hash of a request's serialized form before its ids are set."""
    return hashlib.blake2b(request_without_ids, digest_size=8).hexdigest()


class Encoder:
    """Encodes the rows of one task; `position` counts rows so ids stay deterministic.

    A derived id is `<prefix>:<row>:<request digest>`, the digest a hash of the
    whole request before ids are set: an attempt that sends the partition's rows in
    the same order repeats every id, and one whose order differs gives a new id to
    every row of a request that holds a moved row, so rows are sent again rather than
    dropped as the repeats of different rows. One hash a request rather than one a
    row keeps a body-only write's encoding free of per-row Python.
    """

    def __init__(self, plan: WritePlan, id_prefix: str) -> None:
        self.plan = plan
        self.id_prefix = id_prefix
        self.position = 0

    def requests(self, batch: pa.RecordBatch) -> Iterator[EncodedRequest]:
        size = self.plan.batch_size
        if not self._bodies_only():
            for start in range(0, batch.num_rows, size):
                yield from self._chunk(batch.slice(start, size))
            return
        # `_bodies` takes as many chunks of batch_size rows at once as fit in
        # ENCODE_BYTES: Arrow's calls cost little a row but much a call.
        assert self.plan.body_column is not None
        _, offsets = wire.spans(wire.as_column(batch.column(self.plan.body_column)))
        start = 0
        while start < batch.num_rows:
            end = min(start + size, batch.num_rows)
            while end < batch.num_rows:
                further = min(end + size, batch.num_rows)
                if offsets[further] - offsets[start] > ENCODE_BYTES:
                    break
                end = further
            yield from self._bodies(batch.slice(start, end - start))
            start = end

    def _bodies_only(self) -> bool:
        """Whether a message is its body column alone, with a derived id: the common
        case, which `_bodies` encodes with Arrow compute rather than row by row."""
        plan = self.plan
        return plan.body_column is not None and not plan.attributes and all(
            column is None
            for column in (
                plan.group_column, plan.dedupe_column, plan.delay_column,
                plan.deliver_at_column, plan.priority_column, plan.routing_key_column,
            )
        )  # fmt: skip

    def _bodies(self, batch: pa.RecordBatch) -> Iterator[EncodedRequest]:
        """`_chunk`'s requests for a plan of bodies alone (see `_bodies_only`), byte for
        byte, serialized by Arrow compute: fields are joined element-wise, so each
        request is a slice of one buffer."""
        plan = self.plan
        assert plan.body_column is not None
        column = batch.column(plan.body_column)
        if column.null_count:
            first = column.is_null().to_pylist().index(True)
            raise self._null(plan.body_column, self.position + first)
        bodies = wire.as_column(column)
        if plan.topic is None:
            request_type: Any = pb.SendBatchRequest
            entry_type: Any = pb.SendBatchEntry
            method, name = "SendBatch", plan.queue
        else:
            request_type, entry_type = tpb.PublishBatchRequest, tpb.PublishBatchEntry
            method, name = "PublishBatch", plan.topic
        assert name is not None
        header = wire.key(request_type, request_type.DESCRIPTOR.fields[0].name)
        header += wire.varint(len(name.encode())) + name.encode()
        entries_key = wire.key(request_type, "entries")
        heads = wire.fields(wire.key(entry_type, "body"), bodies, omit_empty=True)
        bare, bare_offsets = wire.spans(wire.fields(entries_key, heads))

        requests = list(self._ranges(np.diff(wire.spans(bodies)[1])))
        digests = [_digest(header + bare[bare_offsets[s] : bare_offsets[e]]) for s, e in requests]
        hexes = np.frombuffer("".join(digests).encode(), np.uint8).reshape(-1, 16)
        digest_column = wire.binary(
            np.arange(0, 16 * batch.num_rows + 1, 16),
            np.repeat(hexes, [e - s for s, e in requests], axis=0).reshape(-1),
        )
        positions = pa.array(np.arange(self.position, self.position + batch.num_rows))
        ids = wire.join(
            self.id_prefix.encode() + b":",
            wire.as_column(positions),
            b":",
            digest_column,
        )
        entries = wire.join(heads, wire.fields(wire.key(entry_type, "deduplication_id"), ids))
        data, offsets = wire.spans(wire.fields(entries_key, entries))
        for start, end in requests:
            payload = header + data[offsets[start] : offsets[end]]
            yield EncodedRequest(method, plan.destination, end - start, payload)
        self.position += batch.num_rows

    def _ranges(self, body_sizes: np.ndarray) -> Iterator[tuple[int, int]]:
        """Rows from `start` to `end` of each request, as `_chunk` splits them: chunks
        of batch_size rows, cut before their bodies pass MAX_REQUEST_BYTES (unless
        one body alone does)."""
        ends = np.concatenate(([0], np.cumsum(body_sizes)))
        for chunk in range(0, len(body_sizes), self.plan.batch_size):
            stop = min(chunk + self.plan.batch_size, len(body_sizes))
            start = chunk
            while start < stop:
                fits = int(np.searchsorted(ends, ends[start] + MAX_REQUEST_BYTES, "right")) - 1
                end = min(stop, max(fits, start + 1))
                yield start, end
                start = end

    def _column(self, batch: pa.RecordBatch, name: str | None) -> list[Any] | None:
        return None if name is None else batch.column(name).to_pylist()

    def _request(self) -> BatchRequest:
        """A SendBatchRequest, or a PublishBatchRequest when the plan names a topic."""
        if self.plan.topic is None:
            return pb.SendBatchRequest(queue=self.plan.queue)
        return tpb.PublishBatchRequest(topic=self.plan.topic)

    def _chunk(self, batch: pa.RecordBatch) -> Iterator[EncodedRequest]:
        plan = self.plan
        if plan.body_column is None:
            bodies: list[Any] = _json_bodies(batch, plan.json_columns)
        else:
            bodies = batch.column(plan.body_column).to_pylist()
        attributes = [(a, batch.column(a.column).to_pylist()) for a in plan.attributes]
        groups = self._column(batch, plan.group_column)
        dedupes = self._column(batch, plan.dedupe_column)
        delays = self._column(batch, plan.delay_column)
        deliver_ats = self._column(batch, plan.deliver_at_column)
        priorities = self._column(batch, plan.priority_column)
        routing_keys = self._column(batch, plan.routing_key_column)
        # The message group of a send is the ordering key of a publish.
        group_field = "message_group_id" if plan.topic is None else "ordering_key"

        request = self._request()
        size = 0
        first = self.position  # of the request's first row
        for row, body in enumerate(bodies):
            position = self.position + row
            if body is None:
                raise self._null(plan.body_column, position)
            if isinstance(body, str):
                body = body.encode()
            if len(request.entries) and size + len(body) > MAX_REQUEST_BYTES:
                yield self._encoded(request, first, derived=dedupes is None)
                request = self._request()
                size, first = 0, position
            size += len(body)
            entry: BatchEntry = request.entries.add(body=body)
            for column, values in attributes:
                cell = values[row]
                if cell is None:
                    continue  # a message has no null attributes: the attribute is left out
                pairs = cell if column.is_map else [(column.column, cell)]
                for name, value in pairs:
                    size += self._attribute(entry, column, name, value, position)
            if groups is not None:
                if groups[row] is None:
                    raise self._null(plan.group_column, position)
                setattr(entry, group_field, groups[row])
            # The plan gives a routing key only to a publish, and a delay, a delivery
            # time or a priority only to a send.
            if isinstance(entry, tpb.PublishBatchEntry):
                if routing_keys is not None and routing_keys[row] is not None:
                    entry.routing_key = routing_keys[row]
            else:
                if delays is not None and delays[row] is not None:
                    delay = delays[row]
                    if isinstance(delay, datetime.timedelta):
                        entry.delay.FromTimedelta(delay)
                    else:
                        entry.delay.seconds = delay
                if deliver_ats is not None and deliver_ats[row] is not None:
                    entry.deliver_at.FromDatetime(deliver_ats[row])
                if priorities is not None and priorities[row] is not None:
                    entry.priority = priorities[row]
            if dedupes is not None:
                if dedupes[row] is None:
                    raise self._null(plan.dedupe_column, position)
                entry.deduplication_id = str(dedupes[row])
        self.position += batch.num_rows
        if len(request.entries):
            yield self._encoded(request, first, derived=dedupes is None)

    def _encoded(self, request: BatchRequest, first: int, derived: bool) -> EncodedRequest:
        """`request` serialized; with derived ids, set last so the digest covers all else."""
        if derived:
            digest = _digest(request.SerializeToString(deterministic=True))
            entries: Any = request.entries  # of SendBatchEntry or PublishBatchEntry
            for position, entry in enumerate(entries, first):
                entry.deduplication_id = f"{self.id_prefix}:{position}:{digest}"
        return EncodedRequest.of(request)

    def _attribute(
        self, entry: BatchEntry, column: AttributeColumn, name: str, value: Any, position: int
    ) -> int:
        """Sets one attribute of `entry`; returns the bytes it adds."""
        if value is None:
            return 0
        if column.is_map:
            problem = attribute_name_problem(name)
            if problem:
                raise PostboxRowError(
                    f"column {column.column!r} has key {name!r} in row {position} of this"
                    f" partition, which cannot name an attribute: {problem}"
                )
        attribute = entry.attributes[name]
        attribute.data_type = column.data_type
        if column.data_type == "Binary":
            attribute.binary_value = value
        else:
            attribute.string_value = _attribute_text(value)
        return len(name) + len(attribute.binary_value or attribute.string_value)

    def _null(self, column: str | None, position: int) -> PostboxRowError:
        return PostboxRowError(
            f"column {column!r} is null in row {position} of this partition; filter or"
            " fill nulls before writing to postbox"
        )
