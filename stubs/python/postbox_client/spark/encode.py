"""Turns Arrow record batches into SendBatch requests, following a WritePlan."""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import topic_service_pb2 as tpb

from postbox_client.spark.options import AttributeColumn, WritePlan, attribute_name_problem

# What an Encoder makes: SendBatch requests for a queue, PublishBatch ones for a topic.
BatchRequest = pb.SendBatchRequest | tpb.PublishBatchRequest
BatchEntry = pb.SendBatchEntry | tpb.PublishBatchEntry

# A request stays well under the server's 64 MiB request limit even when
# messages are large; small messages reach the 1,000-entry limit first.
MAX_REQUEST_BYTES = 8 * 1024 * 1024


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


def content_digest(entry: BatchEntry) -> str:
    """16 hex digits of a hash of everything the entry carries (before its id is set)."""
    return hashlib.blake2b(entry.SerializeToString(deterministic=True), digest_size=8).hexdigest()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _body_key(entry_type: type[BatchEntry]) -> bytes:
    """The protobuf key of an entry's `body` field (a length-delimited field)."""
    return _varint(entry_type.DESCRIPTOR.fields_by_name["body"].number << 3 | 2)


class Encoder:
    """Encodes the rows of one task; `position` counts rows so ids stay deterministic.

    A derived id is `<prefix>:<row>:<content digest>`: an attempt that sends the
    partition's rows in the same order repeats every id, and one whose order
    differs gives a moved row a new id, so the row is sent again rather than
    dropped as the repeat of a different row.
    """

    def __init__(self, plan: WritePlan, id_prefix: str) -> None:
        self.plan = plan
        self.id_prefix = id_prefix
        self.position = 0

    def requests(self, batch: pa.RecordBatch) -> Iterator[BatchRequest]:
        chunk = self._bodies_chunk if self._bodies_only() else self._chunk
        for start in range(0, batch.num_rows, self.plan.batch_size):
            yield from chunk(batch.slice(start, self.plan.batch_size))

    def _bodies_only(self) -> bool:
        """Whether a message is its body column alone, with a derived id: the common
        case, which `_bodies_chunk` encodes at about half the cost of `_chunk`."""
        plan = self.plan
        return plan.body_column is not None and not plan.attributes and all(
            column is None
            for column in (
                plan.group_column, plan.dedupe_column, plan.delay_column,
                plan.deliver_at_column, plan.priority_column, plan.routing_key_column,
            )
        )  # fmt: skip

    def _bodies_chunk(self, batch: pa.RecordBatch) -> Iterator[BatchRequest]:
        """`_chunk` for a plan of bodies alone (see `_bodies_only`), with the same ids:
        the digest hashes the entry's serialized form, which for a body alone is the
        body's field key, its length and its bytes, so no entry is serialized twice."""
        assert self.plan.body_column is not None
        column = batch.column(self.plan.body_column)
        if column.null_count:
            first = column.is_null().to_pylist().index(True)
            raise self._null(self.plan.body_column, self.position + first)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.binary())  # bytes out of Arrow, not str to encode
        bodies: list[bytes] = column.to_pylist()  # type: ignore[assignment]  # no nulls, above
        key = _body_key(pb.SendBatchEntry if self.plan.topic is None else tpb.PublishBatchEntry)
        heads: dict[int, bytes] = {}  # body length -> the entry's bytes before the body
        request = self._request()
        entries: Any = request.entries  # of SendBatchEntry or PublishBatchEntry
        add, blake2b, prefix, size = entries.add, hashlib.blake2b, self.id_prefix, 0
        for position, body in enumerate(bodies, self.position):
            if size and size + len(body) > MAX_REQUEST_BYTES:
                yield request
                request = self._request()
                entries = request.entries
                add, size = entries.add, 0
            size += len(body)
            head = heads.get(len(body))
            if head is None:
                # proto3 leaves an empty body out of the entry's bytes.
                head = heads[len(body)] = key + _varint(len(body)) if body else b""
            digest = blake2b(head + body, digest_size=8).hexdigest()
            add(body=body, deduplication_id=f"{prefix}:{position}:{digest}")
        self.position += batch.num_rows
        if len(request.entries):
            yield request

    def _column(self, batch: pa.RecordBatch, name: str | None) -> list[Any] | None:
        return None if name is None else batch.column(name).to_pylist()

    def _request(self) -> BatchRequest:
        """A SendBatchRequest, or a PublishBatchRequest when the plan names a topic."""
        if self.plan.topic is None:
            return pb.SendBatchRequest(queue=self.plan.queue)
        return tpb.PublishBatchRequest(topic=self.plan.topic)

    def _chunk(self, batch: pa.RecordBatch) -> Iterator[BatchRequest]:
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
        for row, body in enumerate(bodies):
            position = self.position + row
            if body is None:
                raise self._null(plan.body_column, position)
            if isinstance(body, str):
                body = body.encode()
            if len(request.entries) and size + len(body) > MAX_REQUEST_BYTES:
                yield request
                request = self._request()
                size = 0
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
            # Last: the digest covers everything else the entry carries.
            if dedupes is None:
                entry.deduplication_id = f"{self.id_prefix}:{position}:{content_digest(entry)}"
            elif dedupes[row] is None:
                raise self._null(plan.dedupe_column, position)
            else:
                entry.deduplication_id = str(dedupes[row])
        self.position += batch.num_rows
        if len(request.entries):
            yield request

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
