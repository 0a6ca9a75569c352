"""One rule for names, in every field that names a resource.

A name that breaks the grammar is INVALID_ARGUMENT, saying what is allowed, whatever
else the request holds; a well-formed name that names nothing is NOT_FOUND. The
cases come from the protos' descriptors, so a new RPC or field is covered the day it
is added.
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import descriptor as d
from google.protobuf import message_factory
from postbox.v1 import (
    topic_service_pb2,
)
from support import api_methods, call_method

# Fields that name a resource, by their path from the request; "name" alone is the
# request's own resource (GetQueue.name, GetSubscription.name, ...).
NAMING = {
    "name",
    "queue",
    "topic",
    "subscription",
    "dead_letter_queue",
    "destination",
    "key.name",
    "queue.name",
    "queue.dead_letter_policy.dead_letter_queue",
    "queue.redrive_allow_policy.source_queues",
    "schedule.name",
    "schedule.target.queue",
    "schedule.target.topic",
    "subscription.name",
    "subscription.topic",
    "subscription.queue",
    "consumer_group",
    "consumer_group.topic",
    "consumer_group.name",
}
# A value of each that breaks the grammar in a way no name can have: "/" is allowed
# nowhere, and no name is empty or over 256 characters (topics take 256, the rest 80).
MALFORMED = ["bad/name", "x" * 257]
# Well-formed and, in a fresh namespace, absent.
ABSENT = "absent-resource"
# Fields other than names that some requests need before they reach any lookup.
FILLERS = {
    "CreateSchedule": lambda r: r.schedule.interval.FromSeconds(60),
    "UpdateSchedule": lambda r: (
        r.schedule.interval.FromSeconds(60),
        r.update_mask.paths.append("target"),
    ),
    "CreateQueue": lambda r: _queue_policies(r.queue),
    "UpdateQueue": lambda r: (
        _queue_policies(r.queue),
        r.update_mask.paths.extend(["dead_letter_policy", "redrive_allow_policy"]),
    ),
    "UpdateKey": lambda r: r.update_mask.paths.append("grants"),
    "ChangeVisibility": lambda r: r.visibility_timeout.FromSeconds(10),
    "GetMessage": lambda r: setattr(r, "message_id", "1"),
    "CancelMessage": lambda r: setattr(r, "message_id", "1"),
    "UpdateSubscription": lambda r: r.update_mask.paths.append("queue"),
    "PreviewSchedule": lambda r: r.schedule.interval.FromSeconds(60),
    "AckStream": lambda r: setattr(r, "batch", "00000000-0000-0000-0000-000000000000"),
    "SeekConsumerGroup": lambda r: setattr(r, "offset", 0),
}
# Fields a call ignores (PreviewSchedule stores nothing; only its timing matters).
IGNORED = {
    ("PreviewSchedule", "schedule.name"),
    ("PreviewSchedule", "schedule.target.queue"),
    ("PreviewSchedule", "schedule.target.topic"),
}


def _queue_policies(queue) -> None:
    queue.dead_letter_policy.max_receive_count = 3
    queue.redrive_allow_policy.permission = queue.redrive_allow_policy.PERMISSION_BY_QUEUE


def naming_fields(descriptor: d.Descriptor, prefix: tuple[str, ...] = ()):
    for field in descriptor.fields:
        path = (*prefix, field.name)
        if field.type == d.FieldDescriptor.TYPE_STRING and ".".join(path) in NAMING:
            yield path, field.is_repeated
        elif (
            field.type == d.FieldDescriptor.TYPE_MESSAGE
            and not field.is_repeated
            and len(prefix) < 2
            and not field.message_type.full_name.startswith("google.")
        ):
            yield from naming_fields(field.message_type, path)


def _set(request, path: tuple[str, ...], value: str, repeated: bool) -> None:
    target = request
    for name in path[:-1]:
        target = getattr(target, name)
    if repeated:
        getattr(target, path[-1]).append(value)
    else:
        setattr(target, path[-1], value)


def _build(method: d.MethodDescriptor, bad_path: tuple[str, ...] | None, bad_value: str):
    request = message_factory.GetMessageClass(method.input_type)()
    FILLERS.get(method.name, lambda r: None)(request)
    fields = list(naming_fields(method.input_type))
    for path, repeated in fields:
        if path != bad_path:
            _set(request, path, ABSENT, repeated)
    for path, repeated in fields:  # last, so it wins a oneof (a schedule's target)
        if path == bad_path:
            _set(request, path, bad_value, repeated)
    return request


METHODS = api_methods()
MALFORMED_CASES = [
    pytest.param(method, path, value, id=f"{method.name}.{'.'.join(path)}-{kind}")
    for method in METHODS
    for path, _ in naming_fields(method.input_type)
    if (method.name, ".".join(path)) not in IGNORED
    for kind, value in zip(("slash", "long"), MALFORMED, strict=True)
]
# The request's own resource, where the call is not a create: absent means NOT_FOUND.
ABSENT_CASES = [
    pytest.param(method, id=method.name)
    for method in METHODS
    if not method.name.startswith("Create")
    and any(len(path) == 1 for path, _ in naming_fields(method.input_type))
]


def test_the_cases_cover_every_service():
    assert {m.containing_service.name for m, *_ in (c.values for c in MALFORMED_CASES)} == {
        "AccessService",
        "MessageService",
        "QueueService",
        "ScheduleService",
        "StreamService",
        "TopicService",
    }
    assert len(MALFORMED_CASES) >= 90


@pytest.mark.parametrize(("method", "path", "value"), MALFORMED_CASES)
def test_a_malformed_name_is_invalid_argument_saying_what_is_allowed(channel, method, path, value):
    code, details = call_method(channel, method, _build(method, path, value))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code.name}: {details[:200]}"
    allowed = "may only contain" if value != MALFORMED[1] else "the limit is"
    assert allowed in details, details[:200]


@pytest.mark.parametrize("method", ABSENT_CASES)
def test_a_well_formed_absent_name_is_not_found(channel, method):
    code, details = call_method(channel, method, _build(method, None, ""))
    assert code == grpc.StatusCode.NOT_FOUND, f"{code.name}: {details[:200]}"
    assert "does not exist" in details, details[:200]


@pytest.mark.parametrize("pattern", ["orders..created", "orders created", "orders.#x", "p" * 256])
def test_a_malformed_pattern_is_invalid_argument_even_on_an_absent_topic(channel, pattern):
    service = topic_service_pb2.DESCRIPTOR.services_by_name["TopicService"]
    method = service.methods_by_name["CreateSubscription"]
    request = _build(method, None, "")
    request.subscription.pattern = pattern
    code, details = call_method(channel, method, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code.name}: {details[:200]}"
    assert "pattern" in details, details[:200]
