"""Oversized input never makes an oversized error: every RPC, every string field at every
depth (nested messages, map keys and values, repeated elements, oneof members), 1 MiB.

Each case starts from a request the server accepts (BASELINES, checked by their own test)
and puts the huge string in one field, so validation gets as far as that field: a
request empty but for the huge field would be refused at its first required field and
never reach a nested one.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import json_format, message_factory
from google.protobuf.message import Message
from google.rpc import status_pb2
from support import (
    ServerProcess,
    api_methods,
    bootstrap_key,
    create_database,
    drop_database,
    unique_name,
)

from postbox_server.errors import QUOTED_PREFIX

HUGE_LENGTH = 1 << 20
# A marker the test can find, then filler: how much of the filler an error repeats is
# how much of the value it quotes.
MARKER = "HUGE-"
FILLER = "x"
HUGE = MARKER + FILLER * (HUGE_LENGTH - len(MARKER))
# The client's own limit on a status's metadata is 16 KiB: a message must stay far below.
MAX_MESSAGE = 1024


@dataclass(frozen=True)
class Step:
    """One step of a path into a message: a field, and how to enter it."""

    field: str
    kind: str  # "field", "element" (of a repeated field), "key" or "value" (of a map)


Path = tuple[Step, ...]


def _is_map(field: d.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def string_paths(descriptor: d.Descriptor, seen: frozenset[str] = frozenset()) -> Iterator[Path]:
    """Every path to a string of a message: its fields, the elements of its repeated
    fields, the keys and values of its maps, and the same inside its message fields (each
    message type once per path, so recursive types end)."""
    for field in descriptor.fields:
        if _is_map(field):
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            if key.type == d.FieldDescriptor.TYPE_STRING:
                yield (Step(field.name, "key"),)
            if value.type == d.FieldDescriptor.TYPE_STRING:
                yield (Step(field.name, "value"),)
            elif value.type == d.FieldDescriptor.TYPE_MESSAGE:
                for rest in string_paths(value.message_type, seen):
                    yield (Step(field.name, "value"), *rest)
            continue
        kind = "element" if field.is_repeated else "field"
        if field.type == d.FieldDescriptor.TYPE_STRING:
            yield (Step(field.name, kind),)
        elif (
            field.type == d.FieldDescriptor.TYPE_MESSAGE
            and not field.message_type.full_name.startswith("google.")
            and field.message_type.full_name not in seen
        ):
            inner = seen | {field.message_type.full_name}
            for rest in string_paths(field.message_type, inner):
                yield (Step(field.name, kind), *rest)


def put(message: Message, path: Path, value: str) -> None:
    """Sets the string at `path` to `value`, keeping the rest of the message: a repeated
    field's first element and a map's first entry are entered (made if there is none); a
    oneof member set here replaces the baseline's choice."""
    step, rest = path[0], path[1:]
    field = message.DESCRIPTOR.fields_by_name[step.field]
    container = getattr(message, step.field)
    if step.kind == "field":
        if rest:
            put(container, rest, value)
            container.SetInParent()
        else:
            setattr(message, step.field, value)
    elif step.kind == "element":
        if not rest:
            container.append(value)
        else:
            put(container[0] if len(container) else container.add(), rest, value)
    elif step.kind == "key":
        scalar = field.message_type.fields_by_name["value"].type != d.FieldDescriptor.TYPE_MESSAGE
        first = next(iter(container), None)
        if scalar:
            container[value] = container[first] if first is not None else "v"
        elif first is not None:
            container[value].CopyFrom(container[first])
        else:
            container[value].SetInParent()
    else:  # a map's value
        first = next(iter(container), "k")
        if rest:
            put(container[first], rest, value)
        else:
            container[first] = value


def dotted(path: Path) -> str:
    marks = {"field": "", "element": "[0]", "key": "{key}", "value": "{k}"}
    return ".".join(step.field + marks[step.kind] for step in path)


@dataclass
class World:
    """The resources the baselines name: made once for the module."""

    queue: str
    fifo_queue: str
    topic: str
    subscription: str
    consumer_group: str
    schedule: str
    key: str
    tenant: str
    account_id: str
    # An admin key: AccessService wants one even where the rest of the API does not.
    metadata: tuple[tuple[str, str], ...] = ()
    # The id of a message of fifo_queue, never of queue: RedriveMessages of queue's dead
    # letters names it to be refused for it. A fixed id would name whichever message got
    # it, and which that is depends on when the schedule fires and the topic fans out.
    message_elsewhere: str = ""


def fresh() -> str:
    return f"et-{uuid.uuid4().hex[:12]}"


ATTRIBUTES = {"color": {"data_type": "String", "string_value": "blue"}}
Baseline = Callable[[World], dict[str, Any]]


def a_schedule(w: World, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "cron": {"expression": "0 3 * * *", "time_zone": "Europe/Berlin"},
        "target": {"queue": w.queue},
        "attributes": ATTRIBUTES,
    }


# A request each RPC accepts (or refuses only for a missing resource, see EXPECTED), as
# the JSON mapping with proto field names. Every repeated field and map that holds a
# string holds one entry, so that the huge value lands beside valid siblings.
BASELINES: dict[str, Baseline] = {
    "AccessService.CreateKey": lambda w: {
        "key": {"name": fresh(), "grants": [{"permission": "PERMISSION_SEND", "pattern": "et-*"}]}
    },
    "AccessService.GetKey": lambda w: {"name": w.key},
    "AccessService.ListKeys": lambda w: {},
    "AccessService.UpdateKey": lambda w: {
        "key": {"name": w.key, "grants": [{"permission": "PERMISSION_READ", "pattern": "et-*"}]},
        "update_mask": "grants",
    },
    "AccessService.DeleteKey": lambda w: {"name": fresh()},
    "AccessService.CreateTenant": lambda w: {
        "tenant": {"name": fresh(), "account_id": "", "description": "d"}
    },
    "AccessService.GetTenant": lambda w: {"name": w.tenant},
    "AccessService.ListTenants": lambda w: {},
    "AccessService.UpdateTenant": lambda w: {
        "tenant": {"name": w.tenant, "account_id": w.account_id, "description": "changed"},
        "update_mask": "accountId,description",
    },
    "AccessService.DeleteTenant": lambda w: {"name": fresh()},
    "AccessService.GetCallerTenant": lambda w: {},
    "MessageService.Send": lambda w: {
        "queue": w.fifo_queue,
        "attributes": ATTRIBUTES,
        "message_group_id": "g",
        "deduplication_id": fresh(),
    },
    "MessageService.SendBatch": lambda w: {
        "queue": w.fifo_queue,
        "entries": [
            {"attributes": ATTRIBUTES, "message_group_id": "g", "deduplication_id": fresh()}
        ],
    },
    "MessageService.Receive": lambda w: {"queue": w.queue},
    "MessageService.StreamingReceive": lambda w: {"queue": w.queue, "max_messages": 1},
    "MessageService.Delete": lambda w: {"queue": w.queue, "receipt": "r"},
    "MessageService.DeleteBatch": lambda w: {"queue": w.queue, "receipts": ["r"]},
    "MessageService.ChangeVisibility": lambda w: {"queue": w.queue, "receipt": "r"},
    "MessageService.ChangeVisibilityBatch": lambda w: {
        "queue": w.queue,
        "entries": [{"receipt": "r", "visibility_timeout": "5s"}],
    },
    "MessageService.Nack": lambda w: {"queue": w.queue, "receipt": "r", "error": "e"},
    "MessageService.PeekMessages": lambda w: {"queue": w.queue},
    "MessageService.GetMessage": lambda w: {"queue": w.queue, "message_id": "999999999"},
    "MessageService.ListArchivedMessages": lambda w: {"queue": w.queue},
    "MessageService.ListMessages": lambda w: {"queue": w.queue},
    "MessageService.SendStream": lambda w: {
        "tag": 1,
        "send": {
            "queue": w.fifo_queue,
            "attributes": ATTRIBUTES,
            "message_group_id": "g",
            "deduplication_id": fresh(),
        },
    },
    "MessageService.SendBatchStream": lambda w: {
        "tag": 1,
        "batch": {
            "queue": w.fifo_queue,
            "entries": [
                {"attributes": ATTRIBUTES, "message_group_id": "g", "deduplication_id": fresh()}
            ],
            "request_id": fresh(),
        },
    },
    "MessageService.CancelMessage": lambda w: {"queue": w.queue, "message_id": "999999999"},
    "QueueService.CreateQueue": lambda w: {
        "queue": {
            "name": fresh(),
            "dead_letter_policy": {"dead_letter_queue": w.queue, "max_receive_count": 5},
            "redrive_allow_policy": {
                "permission": "PERMISSION_BY_QUEUE",
                "source_queues": [w.queue],
            },
            "tags": {"team": "a"},
        }
    },
    "QueueService.GetQueue": lambda w: {"name": w.queue},
    "QueueService.ListQueues": lambda w: {"name_prefix": "et-"},
    "QueueService.UpdateQueue": lambda w: {
        "queue": {
            "name": w.fifo_queue,
            "dead_letter_policy": {"dead_letter_queue": w.queue, "max_receive_count": 5},
            "redrive_allow_policy": {
                "permission": "PERMISSION_BY_QUEUE",
                "source_queues": [w.queue],
            },
            "tags": {"team": "a"},
        },
        "update_mask": "deadLetterPolicy,redriveAllowPolicy,tags",
    },
    "QueueService.DeleteQueue": lambda w: {"name": fresh()},
    "QueueService.PurgeQueue": lambda w: {"name": w.queue},
    "QueueService.PauseQueue": lambda w: {"name": fresh()},
    "QueueService.ResumeQueue": lambda w: {"name": w.queue},
    "QueueService.ListDeadLetterSourceQueues": lambda w: {"dead_letter_queue": w.queue},
    "QueueService.RedriveMessages": lambda w: {
        "dead_letter_queue": w.queue,
        "destination": w.fifo_queue,
        "message_ids": [w.message_elsewhere],
    },
    "QueueService.ListRedriveTasks": lambda w: {"dead_letter_queue": w.queue},
    "QueueService.CancelRedriveTask": lambda w: {"task_id": "1"},
    "ScheduleService.CreateSchedule": lambda w: {"schedule": a_schedule(w, fresh())},
    "ScheduleService.GetSchedule": lambda w: {"name": w.schedule},
    "ScheduleService.ListSchedules": lambda w: {},
    "ScheduleService.UpdateSchedule": lambda w: {
        "schedule": a_schedule(w, w.schedule),
        "update_mask": "cron,target,attributes",
    },
    "ScheduleService.DeleteSchedule": lambda w: {"name": fresh()},
    "ScheduleService.PauseSchedule": lambda w: {"name": w.schedule},
    "ScheduleService.ResumeSchedule": lambda w: {"name": w.schedule},
    "ScheduleService.RunSchedule": lambda w: {"name": w.schedule},
    "ScheduleService.PreviewSchedule": lambda w: {"schedule": a_schedule(w, fresh())},
    "StreamService.CreateConsumerGroup": lambda w: {
        "consumer_group": {"topic": w.topic, "name": fresh()}
    },
    "StreamService.GetConsumerGroup": lambda w: {"topic": w.topic, "name": w.consumer_group},
    "StreamService.ListConsumerGroups": lambda w: {"topic": w.topic},
    "StreamService.DeleteConsumerGroup": lambda w: {"topic": w.topic, "name": fresh()},
    # A fresh name: pausing the shared group would refuse the reads of other baselines.
    "StreamService.PauseConsumerGroup": lambda w: {"topic": w.topic, "name": fresh()},
    "StreamService.ResumeConsumerGroup": lambda w: {"topic": w.topic, "name": w.consumer_group},
    "StreamService.UpdateConsumerGroup": lambda w: {
        "consumer_group": {"topic": w.topic, "name": w.consumer_group, "max_deliveries": 5},
        "update_mask": "maxDeliveries",
    },
    "StreamService.ListStreamDeadLetters": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
    },
    "StreamService.ReplayStreamDeadLetters": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
    },
    "StreamService.PurgeStreamDeadLetters": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
        "older_than": "2020-01-01T00:00:00Z",
    },
    "StreamService.ReadStream": lambda w: {"topic": w.topic, "consumer_group": w.consumer_group},
    "StreamService.StreamingReadStream": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
        "max_messages": 1,
    },
    "StreamService.AckStream": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
        "batch": "b",
    },
    "StreamService.SeekConsumerGroup": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
        "offset": 0,
    },
    "StreamService.ReadStreamRange": lambda w: {"topic": w.topic},
    "StreamService.GetStreamPosition": lambda w: {
        "topic": w.topic,
        "consumer_group": w.consumer_group,
    },
    "TopicService.CreateTopic": lambda w: {
        "topic": {"name": fresh(), "tags": {"team": "a"}, "sns_attributes": {"DisplayName": "d"}}
    },
    "TopicService.GetTopic": lambda w: {"name": w.topic},
    "TopicService.UpdateTopic": lambda w: {
        "topic": {"name": w.topic, "tags": {"team": "a"}, "sns_attributes": {"DisplayName": "d"}},
        "update_mask": "tags,snsAttributes",
    },
    "TopicService.ListTopics": lambda w: {},
    "TopicService.DeleteTopic": lambda w: {"name": fresh()},
    "TopicService.CreateSubscription": lambda w: {
        "subscription": {
            "name": fresh(),
            "topic": w.topic,
            "pattern": "#",
            "queue": w.queue,
            "filter_policy": '{"color": ["blue"]}',
            "sns_delivery": {
                "topic_arn": f"arn:aws:sns:us-east-1:000000000000:{w.topic}",
                "subscription_arn": f"arn:aws:sns:us-east-1:000000000000:{w.topic}:s",
                "unsubscribe_url": "https://sns.example.com/unsubscribe",
                "attributes": {"RawMessageDelivery": "true"},
            },
        }
    },
    "TopicService.GetSubscription": lambda w: {"topic": w.topic, "name": w.subscription},
    "TopicService.ListSubscriptions": lambda w: {"topic": w.topic},
    "TopicService.DeleteSubscription": lambda w: {"topic": w.topic, "name": fresh()},
    "TopicService.UpdateSubscription": lambda w: {
        "subscription": {
            "name": w.subscription,
            "topic": w.topic,
            "pattern": "#",
            "queue": w.queue,
            "filter_policy": '{"color": ["blue"]}',
        },
        "update_mask": "pattern,filterPolicy",
    },
    "TopicService.Publish": lambda w: {
        "topic": w.topic,
        "routing_key": "k",
        "attributes": ATTRIBUTES,
        "subject": "s",
    },
    "TopicService.PublishBatch": lambda w: {
        "topic": w.topic,
        "entries": [{"routing_key": "k", "attributes": ATTRIBUTES, "subject": "s"}],
    },
    "TopicService.ListWebhookDeliveries": lambda w: {
        "topic": w.topic,
        "subscription": w.subscription,
    },
    "TopicService.RetryWebhookDelivery": lambda w: {
        "topic": w.topic,
        "subscription": w.subscription,
        "delivery_id": "1",
    },
}
# What a baseline may get other than OK: the resources the test cannot cheaply make (a
# lease, a delivery, a redrive task) are missing, or the call is refused for a reason
# that comes after every string field is read.
EXPECTED = {
    "MessageService.Delete": grpc.StatusCode.INVALID_ARGUMENT,  # receipt "r" is no receipt
    "MessageService.ChangeVisibility": grpc.StatusCode.INVALID_ARGUMENT,
    "MessageService.Nack": grpc.StatusCode.INVALID_ARGUMENT,
    "MessageService.GetMessage": grpc.StatusCode.NOT_FOUND,
    "MessageService.CancelMessage": grpc.StatusCode.NOT_FOUND,
    "QueueService.DeleteQueue": grpc.StatusCode.NOT_FOUND,
    "QueueService.PauseQueue": grpc.StatusCode.NOT_FOUND,
    "QueueService.RedriveMessages": grpc.StatusCode.NOT_FOUND,  # not one of its dead letters
    "QueueService.CancelRedriveTask": grpc.StatusCode.INVALID_ARGUMENT,  # "1" is no task id
    "AccessService.DeleteKey": grpc.StatusCode.NOT_FOUND,
    "AccessService.DeleteTenant": grpc.StatusCode.NOT_FOUND,
    "ScheduleService.DeleteSchedule": grpc.StatusCode.NOT_FOUND,
    "StreamService.DeleteConsumerGroup": grpc.StatusCode.NOT_FOUND,
    "StreamService.PauseConsumerGroup": grpc.StatusCode.NOT_FOUND,
    "StreamService.AckStream": grpc.StatusCode.INVALID_ARGUMENT,  # batch "b" is no batch
    "TopicService.DeleteTopic": grpc.StatusCode.NOT_FOUND,
    "TopicService.DeleteSubscription": grpc.StatusCode.NOT_FOUND,
    "TopicService.RetryWebhookDelivery": grpc.StatusCode.INVALID_ARGUMENT,  # "1" is no id
}

METHODS = {f"{m.containing_service.name}.{m.name}": m for m in api_methods()}
CASES = [
    pytest.param(name, path, id=f"{name.split('.')[1]}.{dotted(path)}")
    for name, method in METHODS.items()
    for path in string_paths(method.input_type)
]


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    trailing: tuple[tuple[str, str | bytes], ...]
    responses: list[Message]


def call(
    channel: grpc.Channel,
    method: d.MethodDescriptor,
    request: Message,
    metadata: tuple[tuple[str, str], ...] = (),
) -> Outcome:
    """Calls the RPC, whatever its shape: its status, trailing metadata and responses."""
    rpc = f"/{method.containing_service.full_name}/{method.name}"
    decode = message_factory.GetMessageClass(method.output_type).FromString
    payload = request.SerializeToString()
    responses: list[Message] = []
    # Generous: a loaded machine (the suite's workers share two cores) may take seconds
    # to answer; a stream that answers nothing ends at the deadline instead.
    try:
        if method.server_streaming:
            if method.client_streaming:
                stream = channel.stream_stream(rpc, response_deserializer=decode)(
                    iter([payload]), timeout=10, metadata=metadata
                )
            else:
                stream = channel.unary_stream(rpc, response_deserializer=decode)(
                    payload, timeout=10, metadata=metadata
                )
            for response in stream:
                responses.append(response)
                # The first answer shows what the request did; the stream would go on.
                stream.cancel()
                return Outcome(grpc.StatusCode.OK, "", (), responses)
            return Outcome(
                stream.code(), stream.details() or "", stream.trailing_metadata() or (), responses
            )
        response, state = channel.unary_unary(rpc, response_deserializer=decode).with_call(
            payload, timeout=10, metadata=metadata
        )
        return Outcome(
            state.code(), state.details() or "", state.trailing_metadata() or (), [response]
        )
    except grpc.RpcError as error:
        return Outcome(
            error.code(), error.details() or "", error.trailing_metadata() or (), responses
        )


def statuses(message: Message) -> Iterator[status_pb2.Status]:
    """Every google.rpc.Status in a response (the per-entry results of batch calls)."""
    if message.DESCRIPTOR.full_name == "google.rpc.Status":
        yield message  # type: ignore[misc]
        return
    for field, value in message.ListFields():
        if field.type != d.FieldDescriptor.TYPE_MESSAGE or _is_map(field):
            continue
        for item in value if field.is_repeated else [value]:
            yield from statuses(item)


def assert_quotes_a_prefix_at_most(text: str, where: str) -> None:
    """The text repeats at most a prefix of HUGE, and says how long HUGE is when it does."""
    longest = max((len(run) for run in re.findall(f"{FILLER}+", text)), default=0)
    assert longest <= QUOTED_PREFIX, f"{where} quotes {longest} characters: {text[:200]}…"
    if MARKER in text:
        assert str(HUGE_LENGTH) in text, f"{where} quotes a prefix without its length: {text[:300]}"


@pytest.fixture(scope="module")
def keyed_database(admin_url: str) -> Iterator[str]:
    """A database of its own: the admin key AccessService needs turns auth on for every
    server on the database."""
    url = create_database(admin_url, "postbox_error_text")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def keyed_channel(keyed_database: str) -> Iterator[grpc.Channel]:
    process = ServerProcess(keyed_database).start()
    try:
        with grpc.insecure_channel(process.target) as channel:
            yield channel
    finally:
        process.stop()


@pytest.fixture(scope="module")
def world(keyed_channel: grpc.Channel, keyed_database: str) -> World:
    base = unique_name("et")
    secret = bootstrap_key(keyed_database, f"{base}-admin", "admin:*")
    world = World(
        queue=f"{base}-q",
        fifo_queue=f"{base}-f",
        topic=f"{base}-t",
        subscription="sub",
        consumer_group="group",
        schedule=f"{base}-s",
        key=f"{base}-k",
        tenant=fresh(),
        account_id=f"{uuid.uuid4().int % 10**12:012d}",
        metadata=(("authorization", f"Bearer {secret}"),),
    )
    made = [
        ("QueueService.CreateQueue", {"queue": {"name": world.queue}}),
        ("QueueService.CreateQueue", {"queue": {"name": world.fifo_queue, "fifo": True}}),
        ("TopicService.CreateTopic", {"topic": {"name": world.topic, "stream_retention": "3600s"}}),
        (
            "TopicService.CreateSubscription",
            {
                "subscription": {
                    "name": world.subscription,
                    "topic": world.topic,
                    "pattern": "#",
                    "queue": world.queue,
                }
            },
        ),
        (
            "StreamService.CreateConsumerGroup",
            {"consumer_group": {"topic": world.topic, "name": world.consumer_group}},
        ),
        (
            "ScheduleService.CreateSchedule",
            {
                "schedule": {
                    "name": world.schedule,
                    "interval": "3600s",
                    "target": {"queue": world.queue},
                }
            },
        ),
        (
            "AccessService.CreateKey",
            {
                "key": {
                    "name": world.key,
                    "grants": [{"permission": "PERMISSION_READ", "pattern": "*"}],
                }
            },
        ),
    ]
    made.append(("TopicService.Publish", {"topic": world.topic, "routing_key": "k"}))
    made.append(
        (
            "AccessService.CreateTenant",
            {"tenant": {"name": world.tenant, "account_id": world.account_id}},
        )
    )
    for name, fields in made:
        outcome = call(keyed_channel, METHODS[name], parsed(name, fields), world.metadata)
        assert outcome.code == grpc.StatusCode.OK, f"{name}: {outcome.details}"
    send = {"queue": world.fifo_queue, "message_group_id": "g", "deduplication_id": fresh()}
    sent = call(
        keyed_channel,
        METHODS["MessageService.Send"],
        parsed("MessageService.Send", send),
        world.metadata,
    )
    assert sent.code == grpc.StatusCode.OK, sent.details
    world.message_elsewhere = sent.responses[0].message_id
    return world


def parsed(name: str, fields: dict[str, Any]) -> Message:
    """The request of an RPC from its JSON mapping."""
    return json_format.ParseDict(
        fields, message_factory.GetMessageClass(METHODS[name].input_type)()
    )


def baseline(name: str, world: World) -> Message:
    return parsed(name, BASELINES[name](world))


def test_every_rpc_has_a_baseline_and_every_field_a_case():
    assert set(BASELINES) == set(METHODS), "give each new RPC a baseline request"
    assert len(CASES) >= 130


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_each_baseline_gets_past_validation(keyed_channel, world, name):
    outcome = call(keyed_channel, METHODS[name], baseline(name, world), world.metadata)
    assert outcome.code == EXPECTED.get(name, grpc.StatusCode.OK), outcome.details


@pytest.mark.parametrize(("name", "path"), CASES)
def test_a_huge_string_gets_the_intended_status_with_a_short_message(
    keyed_channel, world, name, path
):
    request = baseline(name, world)
    put(request, path, HUGE)
    outcome = call(keyed_channel, METHODS[name], request, world.metadata)
    where = f"{outcome.code.name} of {name} with {dotted(path)} of 1 MiB"
    assert outcome.code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), (
        f"{where}: {outcome.details[:300]}"
    )
    # The status that carried 1 MiB back was refused by the client itself.
    assert "metadata size" not in outcome.details, f"{where}: {outcome.details[:200]}"
    assert len(outcome.details.encode()) < MAX_MESSAGE, f"{where}: {outcome.details[:200]}…"
    assert_quotes_a_prefix_at_most(outcome.details, where)
    for key, value in outcome.trailing:
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        assert len(text) < MAX_MESSAGE, f"{where}: trailing {key} of {len(text)}"
        assert_quotes_a_prefix_at_most(text, f"{where}, trailing {key}")
    for response in outcome.responses:
        for status in statuses(response):
            assert len(status.message.encode()) < MAX_MESSAGE, f"{where}: {status.message[:200]}"
            assert_quotes_a_prefix_at_most(status.message, f"{where}, a result")


@pytest.mark.parametrize(
    ("action", "arguments"),
    [
        ("get_queue_url", {"QueueName": HUGE}),
        ("create_queue", {"QueueName": HUGE}),
        ("delete_message", {"QueueUrl": "QUEUE", "ReceiptHandle": HUGE}),
        ("send_message", {"QueueUrl": "QUEUE", "MessageBody": "x", "MessageGroupId": HUGE}),
    ],
)
def test_the_sqs_shim_bounds_its_errors_too(sqs_any, sqs_queue, action, arguments):
    from botocore.exceptions import ClientError

    arguments = {k: sqs_queue if v == "QUEUE" else v for k, v in arguments.items()}
    with pytest.raises(ClientError) as caught:
        getattr(sqs_any, action)(**arguments)
    error = caught.value.response["Error"]
    assert error["Code"] not in ("InternalFailure", "InternalError")
    assert len(error["Message"].encode()) < MAX_MESSAGE, error["Message"][:200]
