"""The data source's options: read on the driver, checked against the DataFrame's schema,
and frozen into a picklable plan, so a mistake fails the query before any task starts."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
    VarcharType,
)

from postbox_client.spark.client import Connection, RetryPolicy

MAX_BATCH = 1000
MAX_ATTRIBUTES = 100
_INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
_NUMBER = (*_INTEGRAL, FloatType, DoubleType, DecimalType)
_STRING = (StringType, CharType, VarcharType)
_ATTRIBUTE_VALUE = (*_STRING, *_NUMBER, BinaryType, BooleanType)
# The engine's rule for attribute names (see SendRequest.attributes).
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# Derived ids append ":<partition>:<row>:<16 hex digits>" to the write id and
# must stay within the engine's 128 printable ASCII characters.
_WRITE_ID = re.compile(r"[!-~]{1,80}")

CONNECTION_OPTIONS = frozenset(
    {
        "target",
        "auth_token",
        "tls",
        "tls_ca_file",
        "tls_cert_file",
        "tls_key_file",
        "tls_server_name",
        "timeout",
        "max_attempts",
    }
)
WRITE_OPTIONS = CONNECTION_OPTIONS | {
    "queue",
    "topic",
    "routing_key_column",
    "body_column",
    "attribute_columns",
    "group_column",
    "dedupe_column",
    "delay_column",
    "deliver_at_column",
    "priority_column",
    "batch_size",
    "max_in_flight",
    "write_id",
}
READ_OPTIONS = CONNECTION_OPTIONS | {
    "queue",
    "visibility_timeout",
    "max_messages_per_batch",
    "wait_time",
}
# Reading a stream topic's log instead of a queue.
TOPIC_READ_OPTIONS = CONNECTION_OPTIONS | {
    "topic",
    "consumer_group",
    "max_messages_per_batch",
    "max_messages_per_partition",
}
# Options Spark itself passes to a data source.
_SPARK_OPTIONS = frozenset({"path", "checkpointlocation"})


class PostboxOptionError(ValueError):
    """An option, or the DataFrame's schema, does not fit: raised on the driver when planning."""


def attribute_name_problem(name: str) -> str | None:
    """Why `name` cannot name an attribute, or None when it can."""
    if (
        not _ATTRIBUTE_NAME.fullmatch(name)
        or name.lower().startswith(("aws.", "amazon."))
        or name.startswith(".")
        or name.endswith(".")
        or ".." in name
    ):
        return (
            "names are 1-256 characters of [A-Za-z0-9_.-], not starting with 'AWS.' or"
            " 'Amazon.', not starting or ending with '.' and without '..'"
        )
    return None


def _attribute_type(data_type: DataType) -> str:
    """The attribute data type a Spark value type is sent as."""
    if isinstance(data_type, BinaryType):
        return "Binary"
    return "Number" if isinstance(data_type, _NUMBER) else "String"


@dataclass(frozen=True)
class AttributeColumn:
    column: str
    # "String", "Number" or "Binary": the attribute's data type (of the map's
    # values when `is_map`).
    data_type: str
    # A map<string, ...> column: each entry is an attribute named by its key.
    is_map: bool = False


@dataclass(frozen=True)
class WritePlan:
    """How each row becomes a message; built on the driver, pickled to every task."""

    connection: Connection
    retry: RetryPolicy
    # Exactly one of queue (SendBatch) and topic (PublishBatch) is set.
    queue: str | None
    topic: str | None
    routing_key_column: str | None
    # A string or binary column, or None for the JSON of `json_columns`.
    body_column: str | None
    body_is_binary: bool
    json_columns: tuple[str, ...]
    attributes: tuple[AttributeColumn, ...]
    group_column: str | None
    dedupe_column: str | None
    delay_column: str | None
    deliver_at_column: str | None
    priority_column: str | None
    batch_size: int
    max_in_flight: int
    # Prefix of the idempotency ids of a batch write (streams use their query id).
    write_id: str | None = None
    columns: tuple[str, ...] = field(default=())

    @property
    def destination(self) -> str:
        return f"queue {self.queue!r}" if self.topic is None else f"topic {self.topic!r}"


@dataclass(frozen=True)
class ReadPlan:
    connection: Connection
    retry: RetryPolicy
    queue: str
    visibility_timeout: float
    max_messages_per_batch: int
    wait_time: float


@dataclass(frozen=True)
class TopicReadPlan:
    connection: Connection
    retry: RetryPolicy
    topic: str
    consumer_group: str
    max_messages_per_batch: int
    # A micro-batch is read by Spark tasks, one per part of at most this many messages.
    max_messages_per_partition: int


class _Options:
    """Typed access to the string options Spark hands over, with errors naming the option."""

    def __init__(self, options: Mapping[str, str], known: frozenset[str]) -> None:
        self._values = {key.lower(): value for key, value in options.items()}
        unknown = sorted(set(self._values) - known - _SPARK_OPTIONS)
        if unknown:
            raise PostboxOptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
                f" for format 'postbox'; known options: {', '.join(sorted(known))}"
            )

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self._values.get(name, default)
        if value is not None and not value.strip():
            raise PostboxOptionError(f"option {name!r} is empty; leave it out or give a value")
        return value

    def required(self, name: str, hint: str) -> str:
        value = self.text(name)
        if value is None:
            raise PostboxOptionError(f"option {name!r} is required: {hint}")
        return value

    def number(self, name: str, default: float, low: float, high: float) -> float:
        text = self.text(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise PostboxOptionError(f"option {name!r} is {text!r}; it must be a number") from None
        if not low <= value <= high:
            raise PostboxOptionError(f"option {name!r} is {text}; it must be {low:g} to {high:g}")
        return value

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        value = self.number(name, default, low, high)
        if value != int(value):
            raise PostboxOptionError(f"option {name!r} is {value}; it must be a whole number")
        return int(value)

    def flag(self, name: str) -> bool:
        text = (self.text(name) or "false").lower()
        if text not in ("true", "false"):
            raise PostboxOptionError(f"option {name!r} is {text!r}; it must be true or false")
        return text == "true"

    def columns(self, name: str) -> tuple[str, ...]:
        text = self.text(name)
        if text is None:
            return ()
        names = tuple(part.strip() for part in text.split(","))
        if not all(names):
            raise PostboxOptionError(f"option {name!r} is {text!r}: an empty column name")
        return names


def _pem(options: _Options, name: str) -> bytes | None:
    """The bytes of a PEM file option, read on the driver so executors need no copy."""
    path = options.text(name)
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise PostboxOptionError(
            f"option {name!r}: cannot read {path[:200]}: {error.strerror}"
        ) from None


def _connection(options: _Options) -> tuple[Connection, RetryPolicy]:
    tls = options.flag("tls")
    server_name = options.text("tls_server_name")
    tls_files = ("tls_ca_file", "tls_cert_file", "tls_key_file")
    if not tls and (server_name or any(options.text(name) for name in tls_files)):
        raise PostboxOptionError(
            "options 'tls_ca_file', 'tls_cert_file', 'tls_key_file' and 'tls_server_name' "
            "need tls=true"
        )
    if (options.text("tls_cert_file") is None) != (options.text("tls_key_file") is None):
        raise PostboxOptionError("options 'tls_cert_file' and 'tls_key_file' go together")
    connection = Connection(
        target=options.text("target", "localhost:50051") or "",
        auth_token=options.text("auth_token"),
        tls=tls,
        root_certificates=_pem(options, "tls_ca_file"),
        certificate_chain=_pem(options, "tls_cert_file"),
        private_key=_pem(options, "tls_key_file"),
        server_name=server_name,
        timeout=options.number("timeout", 60.0, 0.1, 3600.0),
    )
    return connection, RetryPolicy(attempts=options.integer("max_attempts", 8, 1, 100))


def _type_name(data_type: DataType) -> str:
    return data_type.simpleString()


def write_plan(options: Mapping[str, str], schema: StructType, *, streaming: bool) -> WritePlan:
    """Checks the options against the DataFrame's schema; raises PostboxOptionError."""
    opts = _Options(options, WRITE_OPTIONS)
    queue, topic = opts.text("queue"), opts.text("topic")
    if (queue is None) == (topic is None):
        raise PostboxOptionError(
            "give option 'queue' (send to a queue) or option 'topic' (publish), one of them"
        )
    connection, retry = _connection(opts)
    write_id = opts.text("write_id")
    if streaming and write_id is not None:
        raise PostboxOptionError(
            "option 'write_id' is for batch writes: a streaming write derives its ids from"
            " the query id and batch id kept in its checkpoint"
        )
    if write_id is not None and not _WRITE_ID.fullmatch(write_id):
        raise PostboxOptionError(
            f"option 'write_id' is {write_id!r}; it must be 1 to 80 printable ASCII"
            " characters without spaces (it prefixes each message's deduplication id)"
        )

    types = {f.name: f.dataType for f in schema.fields}
    used: dict[str, str] = {}

    def column(option: str, allowed: tuple[type[DataType], ...], wanted: str) -> str | None:
        name = opts.text(option)
        if name is None:
            return None
        take(option, name, allowed, wanted)
        return name

    def take(option: str, name: str, allowed: tuple[type[DataType], ...], wanted: str) -> None:
        if name not in types:
            raise PostboxOptionError(
                f"option {option!r} names column {name!r}, which the DataFrame does not have;"
                f" its columns are: {', '.join(types) or '(none)'}"
            )
        if not isinstance(types[name], allowed):
            raise PostboxOptionError(
                f"column {name!r} ({option}) is {_type_name(types[name])}; it must be {wanted}"
            )
        if name in used:
            raise PostboxOptionError(
                f"column {name!r} is named by both {used[name]!r} and {option!r}"
            )
        used[name] = option

    body_column = column("body_column", (*_STRING, BinaryType), "string or binary")
    routing_key_column = column("routing_key_column", _STRING, "string")
    if routing_key_column and topic is None:
        raise PostboxOptionError("option 'routing_key_column' is for publishing: give 'topic'")
    group_column = column("group_column", _STRING, "string")
    dedupe_column = column("dedupe_column", (*_STRING, *_INTEGRAL), "string or an integer")
    delay_column = column(
        "delay_column",
        (*_INTEGRAL, DayTimeIntervalType),
        "an integer (seconds) or a day-time interval",
    )
    deliver_at_column = column("deliver_at_column", (TimestampType,), "a timestamp")
    if delay_column and deliver_at_column:
        raise PostboxOptionError("give 'delay_column' or 'deliver_at_column', not both")
    priority_column = column("priority_column", _INTEGRAL, "an integer")
    if topic is not None and (delay_column or deliver_at_column or priority_column):
        raise PostboxOptionError(
            "a publish has no delay, delivery time or priority: drop 'delay_column',"
            " 'deliver_at_column' and 'priority_column', or send to a queue"
        )
    if queue is not None and queue.endswith(".fifo"):
        # Every row would fail on the server; say so before any task starts.
        if group_column is None:
            raise PostboxOptionError(
                f"queue {queue!r} is a FIFO queue, whose messages need a message group:"
                " give 'group_column'"
            )
        refused = [
            option
            for option, value in (
                ("delay_column", delay_column),
                ("deliver_at_column", deliver_at_column),
                ("priority_column", priority_column),
            )
            if value
        ]
        if refused:
            raise PostboxOptionError(
                f"queue {queue!r} is a FIFO queue, which takes no per-message delay, delivery"
                f" time or priority: drop {', '.join(map(repr, refused))}"
            )

    attribute_columns = opts.columns("attribute_columns")
    if len(attribute_columns) > MAX_ATTRIBUTES:
        raise PostboxOptionError(
            f"option 'attribute_columns' names {len(attribute_columns)} columns;"
            f" a message may have at most {MAX_ATTRIBUTES} attributes"
        )
    attributes = []
    for name in attribute_columns:
        data_type = types.get(name)
        if isinstance(data_type, MapType):
            take("attribute_columns", name, (MapType,), "a map")
            if not isinstance(data_type.keyType, _STRING):
                raise PostboxOptionError(
                    f"column {name!r} (attribute_columns) is {_type_name(data_type)}: the keys"
                    " of a map column name its attributes, so they must be strings"
                )
            if not isinstance(data_type.valueType, _ATTRIBUTE_VALUE):
                raise PostboxOptionError(
                    f"column {name!r} (attribute_columns) is {_type_name(data_type)}: the"
                    " values of a map column must be strings, numbers, booleans or binary"
                )
            attributes.append(AttributeColumn(name, _attribute_type(data_type.valueType), True))
            continue
        take(
            "attribute_columns",
            name,
            _ATTRIBUTE_VALUE,
            "a string, number, boolean or binary, or a map with string keys of those",
        )
        problem = attribute_name_problem(name)
        if problem:
            raise PostboxOptionError(
                f"column {name!r} cannot be an attribute name: {problem}; rename the column"
            )
        attributes.append(AttributeColumn(name, _attribute_type(types[name])))

    rest = tuple(name for name in types if name not in used)
    if body_column is not None and rest:
        raise PostboxOptionError(
            f"column{'s' if len(rest) > 1 else ''} {', '.join(map(repr, rest))} not mapped to"
            " any part of the message: list them in 'attribute_columns', or select only the"
            " columns to send (without 'body_column' the body is the JSON of the other columns)"
        )
    if body_column is None and not rest:
        raise PostboxOptionError(
            "no column is left for the body: name a 'body_column', or keep columns"
            " outside the attribute and other mappings to send as JSON"
        )

    return WritePlan(
        connection=connection,
        retry=retry,
        queue=queue,
        topic=topic,
        routing_key_column=routing_key_column,
        body_column=body_column,
        body_is_binary=body_column is not None and isinstance(types[body_column], BinaryType),
        json_columns=rest if body_column is None else (),
        attributes=tuple(attributes),
        group_column=group_column,
        dedupe_column=dedupe_column,
        delay_column=delay_column,
        deliver_at_column=deliver_at_column,
        priority_column=priority_column,
        batch_size=opts.integer("batch_size", MAX_BATCH, 1, MAX_BATCH),
        # In order, one at a time, so a retried batch cannot overtake a later one
        # of the same message group.
        max_in_flight=1 if group_column else opts.integer("max_in_flight", 4, 1, 64),
        write_id=None if streaming else write_id or uuid.uuid4().hex,
        columns=tuple(types),
    )


def read_plan(options: Mapping[str, str]) -> ReadPlan:
    opts = _Options(options, READ_OPTIONS)
    queue = opts.required("queue", "the name of the queue to receive from")
    connection, retry = _connection(opts)
    return ReadPlan(
        connection=connection,
        retry=retry,
        queue=queue,
        visibility_timeout=opts.number("visibility_timeout", 300.0, 1.0, 12 * 3600.0),
        max_messages_per_batch=opts.integer("max_messages_per_batch", 10_000, 1, 1_000_000),
        wait_time=opts.number("wait_time", 1.0, 0.0, 20.0),
    )


def reads_topic(options: Mapping[str, str]) -> bool:
    """Whether the reader reads a stream topic (option `topic`) rather than a queue."""
    return any(key.lower() == "topic" for key in options)


def topic_read_plan(options: Mapping[str, str]) -> TopicReadPlan:
    opts = _Options(options, TOPIC_READ_OPTIONS)
    topic = opts.required("topic", "the name of the stream topic to read")
    group = opts.required(
        "consumer_group",
        "the consumer group (it must exist) whose cursor the query starts from and commits to",
    )
    connection, retry = _connection(opts)
    return TopicReadPlan(
        connection=connection,
        retry=retry,
        topic=topic,
        consumer_group=group,
        max_messages_per_batch=opts.integer("max_messages_per_batch", 10_000, 1, 1_000_000),
        max_messages_per_partition=opts.integer("max_messages_per_partition", 10_000, 1, 1_000_000),
    )
