"""Malformed input to every RPC: the caller's error is the caller's status, never the server's.

Requests are generated from the API's own descriptors, so an RPC or field added
later is covered without touching this file. Names carry quotes, semicolons,
NULs and unicode; the database catalogue must not change because of them.
"""

from __future__ import annotations

import re

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from postbox.v1 import (
    message_pb2,
    message_service_pb2,
    queue_service_pb2,
    schedule_service_pb2,
    topic_service_pb2,
)
from support import call_method

FILES = (message_service_pb2, queue_service_pb2, topic_service_pb2, schedule_service_pb2)
METHODS = [
    method
    for module in FILES
    for service in module.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]

# Codes that mean "your request": anything else (INTERNAL, UNKNOWN, UNAVAILABLE with
# the database up, DATA_LOSS) is the server failing, and UNIMPLEMENTED too: every
# RPC of the API is implemented.
CALLER_CODES = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
}
# A continuous Receive runs until the client's deadline.
STREAM_CODES = CALLER_CODES | {grpc.StatusCode.DEADLINE_EXCEEDED}

EXISTING_QUEUE = "survival_malformed"
HOSTILE = [
    "",
    EXISTING_QUEUE,
    "'; DROP SCHEMA postbox CASCADE; --",
    '"; DROP TABLE postbox.messages; --',
    "queue'name",
    'q"u"o"t"e"s',
    "semi;colon",
    "$1",
    "%s%s%n",
    "\\x00",
    "nul\x00byte",
    "ünïcødé-名前-🚀",
    "\u202eright-to-left",
    "a" * 81,
    "x" * 100_000,
    "orders.fifo",
    "a.#.*",
    "../../etc/passwd",
]

INT_RANGES = {
    d.FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    d.FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    d.FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _strings() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), st.text(max_size=40))


def _scalar(field: d.FieldDescriptor) -> st.SearchStrategy[object]:
    kind = field.type
    if kind == d.FieldDescriptor.TYPE_STRING:
        return _strings()
    if kind == d.FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"\xff" * 2_000_000))
    if kind == d.FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind in (d.FieldDescriptor.TYPE_DOUBLE, d.FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if kind == d.FieldDescriptor.TYPE_ENUM:
        return st.integers(-3, len(field.enum_type.values) + 2)  # open enums: unknown values
    low, high = INT_RANGES[kind]
    edges = st.sampled_from([low, high, -1, 0, 1])
    return st.one_of(edges, st.integers(low, high))


def _value(field: d.FieldDescriptor, depth: int) -> st.SearchStrategy[object]:
    if field.type == d.FieldDescriptor.TYPE_MESSAGE:
        return message_values(field.message_type, depth + 1)
    return _scalar(field)


def message_values(descriptor: d.Descriptor, depth: int = 0) -> st.SearchStrategy[dict]:
    """Keyword arguments for the message's constructor, any field set or left out."""
    if depth > 3:
        return st.just({})
    optional: dict[str, st.SearchStrategy[object]] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            optional[field.name] = st.dictionaries(
                _value(key_field, depth), _value(value_field, depth), max_size=4
            )
        elif field.is_repeated:
            optional[field.name] = st.lists(_value(field, depth), max_size=4)
        else:
            optional[field.name] = _value(field, depth)
    return st.fixed_dictionaries({}, optional=optional)


def _build(cls: type[Message], values: dict) -> Message | None:
    """The message, or None when protobuf itself refuses the values (e.g. NUL-free checks)."""
    try:
        return cls(**values)
    except (ValueError, TypeError):
        return None


def _invoke(channel: grpc.Channel, method: d.MethodDescriptor, payload: bytes) -> grpc.StatusCode:
    code, details = call_method(channel, method, payload, stream_timeout=0.3)
    assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
        f"{method.full_name}: {code} {details}"
    )
    return code


def _check(channel: grpc.Channel, method: d.MethodDescriptor, payload: bytes) -> None:
    code = _invoke(channel, method, payload)
    allowed = STREAM_CODES if method.server_streaming else CALLER_CODES
    assert code in allowed, f"{method.full_name}: {code}"


CATALOGUE = """
SELECT 'ns ' || nspname FROM pg_namespace
UNION ALL
SELECT format('rel %s.%s %s', n.nspname, c.relname, c.relkind)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname !~ '^pg_(temp|toast_temp)'
UNION ALL
SELECT format('col %s.%s %s %s', n.nspname, c.relname, a.attname, a.atttypid::regtype)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'postbox' AND a.attnum > 0
UNION ALL
SELECT format('fn %s.%s(%s) %s', n.nspname, p.proname, pg_get_function_identity_arguments(p.oid),
              md5(p.prosrc))
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'postbox'
UNION ALL
SELECT 'role ' || rolname FROM pg_roles
ORDER BY 1
"""


@pytest.fixture(scope="module")
def hostile_setup(server, database_url):
    """The existing queue the strategies aim at, and the catalogue before the onslaught."""
    import asyncio

    async def catalogue() -> list[str]:
        conn = await asyncpg.connect(database_url)
        try:
            return [row[0] for row in await conn.fetch(CATALOGUE)]
        finally:
            await conn.close()

    with grpc.insecure_channel(server.target) as channel:
        channel.unary_unary(
            "/postbox.v1.QueueService/CreateQueue",
            request_serializer=queue_service_pb2.CreateQueueRequest.SerializeToString,
            response_deserializer=queue_service_pb2.CreateQueueResponse.FromString,
        )(
            queue_service_pb2.CreateQueueRequest(
                queue=queue_service_pb2.Queue(name=EXISTING_QUEUE)
            ),
            timeout=10,
        )
    before = asyncio.run(catalogue())
    yield
    after = asyncio.run(catalogue())
    assert after == before, "hostile names changed the database catalogue"


SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name)
def test_generated_requests_get_a_caller_status(hostile_setup, channel, method):
    request_class = message_factory.GetMessageClass(method.input_type)

    @SETTINGS
    @given(values=message_values(method.input_type))
    def run(values: dict) -> None:
        request = _build(request_class, values)
        if request is not None:
            _check(channel, method, request.SerializeToString())

    run()


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.full_name)
def test_undecodable_bytes_get_a_caller_status(hostile_setup, channel, method):
    request_class = message_factory.GetMessageClass(method.input_type)
    first_string = next(
        (f for f in method.input_type.fields if f.type == d.FieldDescriptor.TYPE_STRING), None
    )

    @SETTINGS
    @given(noise=st.binary(min_size=1, max_size=64))
    def run(noise: bytes) -> None:
        _check(channel, method, noise)

    run()
    if first_string is not None:
        # A string field holding invalid UTF-8: the wire allows it, protobuf refuses it.
        valid = request_class(**{first_string.name: "AAAA"}).SerializeToString()
        code = _invoke(channel, method, valid.replace(b"AAAA", b"A\xff\xfeA"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, code


def test_ten_thousand_attributes_are_invalid(messages, queue):
    attributes = {
        f"a{i}": message_pb2.AttributeValue(data_type="String", string_value="v")
        for i in range(10_000)
    }
    with pytest.raises(grpc.RpcError) as caught:
        messages.Send(
            message_service_pb2.SendRequest(queue=queue, body=b"x", attributes=attributes),
            timeout=10,
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert re.search(r"at most 100\b", caught.value.details())


def test_a_100_mb_body_is_refused_as_too_large(server, queue):
    with grpc.insecure_channel(server.target) as channel:
        send = channel.unary_unary(
            "/postbox.v1.MessageService/Send",
            request_serializer=message_service_pb2.SendRequest.SerializeToString,
        )
        with pytest.raises(grpc.RpcError) as caught:
            send(
                message_service_pb2.SendRequest(queue=queue, body=b"x" * (100 * 2**20)),
                timeout=60,
            )
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_batches_beyond_the_limit_are_invalid(messages, queue):
    entries = [message_service_pb2.SendBatchEntry(body=b"x")] * 1001
    with pytest.raises(grpc.RpcError) as caught:
        messages.SendBatch(
            message_service_pb2.SendBatchRequest(queue=queue, entries=entries), timeout=10
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


HOSTILE_TEXT = "'; DROP SCHEMA postbox CASCADE; --\x00\u00e9\U0001f4a5"


def test_server_still_serving_after_the_onslaught(hostile_setup, channel, server):
    # Its own onslaught, so that the test holds whichever tests ran before it:
    # every RPC gets bytes that decode to nothing, then a request whose every
    # string field is hostile.
    for method in METHODS:
        _check(channel, method, b"\xff" * 7)
        request_class = message_factory.GetMessageClass(method.input_type)
        strings = {
            f.name: HOSTILE_TEXT
            for f in method.input_type.fields
            if f.type == d.FieldDescriptor.TYPE_STRING and not f.is_repeated
        }
        _check(channel, method, request_class(**strings).SerializeToString())
    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert "internal error" not in server.log()
