"""Schedules fire into queues and topics with payload schemas: a body that breaks the
target's schema is refused when the schedule is created, updated or run, and a fire
whose target's schema changed since then fails (last_error, failure_threshold) and
stores nothing. Real server, real database."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as spb
from postbox.v1 import schedule_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from support import error_of, eventually, stats, unique_name
from test_payload_schemas import BAD, BAD_VIOLATION, GOOD, json_schema, schema_queue


@pytest.fixture(scope="module")
def schedules(channel: grpc.Channel) -> schedule_service_pb2_grpc.ScheduleServiceStub:
    return schedule_service_pb2_grpc.ScheduleServiceStub(channel)


def hourly(name: str, target: spb.ScheduleTarget, body: bytes) -> spb.Schedule:
    return spb.Schedule(name=name, target=target, body=body, interval=Duration(seconds=3600))


def _refused(call, request) -> str:
    error = error_of(call, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    return error.details()


def test_a_body_that_breaks_the_schema_is_refused_when_set(schedules, queues, topics, request):
    queue = schema_queue(queues, request, json_schema())
    plain = unique_name("plain")
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=plain)))
    request.addfinalizer(lambda: queues.DeleteQueue(qpb.DeleteQueueRequest(name=plain)))
    name = unique_name(request.node.name)

    details = _refused(
        schedules.CreateSchedule,
        spb.CreateScheduleRequest(schedule=hourly(name, spb.ScheduleTarget(queue=queue), BAD)),
    )
    assert details == (
        f"body does not match the payload_schema of queue {queue!r}: {BAD_VIOLATION}; "
        "nothing was stored"
    )
    missing = error_of(schedules.GetSchedule, spb.GetScheduleRequest(name=name))
    assert missing.code() == grpc.StatusCode.NOT_FOUND

    # A good body is taken; changing it to a bad one is refused, and so is moving a
    # schedule with a bad body (fine for a queue without a schema) onto the schema's queue.
    schedules.CreateSchedule(
        spb.CreateScheduleRequest(schedule=hourly(name, spb.ScheduleTarget(queue=queue), GOOD))
    )
    request.addfinalizer(lambda: schedules.DeleteSchedule(spb.DeleteScheduleRequest(name=name)))
    _refused(
        schedules.UpdateSchedule,
        spb.UpdateScheduleRequest(
            schedule=spb.Schedule(name=name, body=BAD), update_mask=FieldMask(paths=["body"])
        ),
    )
    assert schedules.GetSchedule(spb.GetScheduleRequest(name=name)).schedule.body == GOOD

    other = unique_name(request.node.name)
    schedules.CreateSchedule(
        spb.CreateScheduleRequest(schedule=hourly(other, spb.ScheduleTarget(queue=plain), BAD))
    )
    request.addfinalizer(lambda: schedules.DeleteSchedule(spb.DeleteScheduleRequest(name=other)))
    _refused(
        schedules.UpdateSchedule,
        spb.UpdateScheduleRequest(
            schedule=spb.Schedule(name=other, target=spb.ScheduleTarget(queue=queue)),
            update_mask=FieldMask(paths=["target"]),
        ),
    )
    # RunSchedule checks too: the queue's schema may have changed since.
    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=plain, payload_schema=json_schema()),
            update_mask=FieldMask(paths=["payload_schema"]),
        )
    )
    assert BAD_VIOLATION in _refused(schedules.RunSchedule, spb.RunScheduleRequest(name=other))
    assert stats(queues, plain).visible_messages == 0

    # Topics too.
    topic = unique_name("topic")
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=topic, payload_schema=json_schema()))
    )
    request.addfinalizer(lambda: topics.DeleteTopic(tpb.DeleteTopicRequest(name=topic)))
    details = _refused(
        schedules.CreateSchedule,
        spb.CreateScheduleRequest(
            schedule=hourly(unique_name("t"), spb.ScheduleTarget(topic=topic), BAD)
        ),
    )
    assert details.startswith(f"body does not match the payload_schema of topic {topic!r}")


def test_a_fire_after_the_schema_changed_fails_and_counts_toward_the_threshold(
    schedules, queues, request
):
    queue = unique_name(request.node.name)
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)))
    request.addfinalizer(lambda: queues.DeleteQueue(qpb.DeleteQueueRequest(name=queue)))
    name = unique_name(request.node.name)
    schedule = hourly(name, spb.ScheduleTarget(queue=queue), BAD)
    schedule.failure_threshold = 2
    schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=schedule))
    request.addfinalizer(lambda: schedules.DeleteSchedule(spb.DeleteScheduleRequest(name=name)))
    schedules.PauseSchedule(spb.PauseScheduleRequest(name=name))

    # The schema arrives after the schedule was set; then the schedule fires every
    # second: each fire fails with the violation, the second pauses it, nothing is stored.
    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=queue, payload_schema=json_schema()),
            update_mask=FieldMask(paths=["payload_schema"]),
        )
    )
    schedules.UpdateSchedule(
        spb.UpdateScheduleRequest(
            schedule=spb.Schedule(name=name, interval=Duration(seconds=1)),
            update_mask=FieldMask(paths=["interval"]),
        )
    )
    schedules.ResumeSchedule(spb.ResumeScheduleRequest(name=name))

    def paused() -> spb.Schedule | None:
        got = schedules.GetSchedule(spb.GetScheduleRequest(name=name)).schedule
        return got if got.paused else None

    # Two fires one second apart, each within the scheduler's wake-up: 30 s is ample.
    stopped = eventually(paused, what="the schedule paused by its failure_threshold")
    assert stopped.consecutive_failures == 2
    assert stopped.fire_count == 0
    assert BAD_VIOLATION in stopped.last_error
    assert stopped.last_error.startswith(
        f"body does not match the payload_schema of queue {queue!r}"
    )
    assert stats(queues, queue).visible_messages == 0
