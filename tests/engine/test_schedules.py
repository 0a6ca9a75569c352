"""Schedules over gRPC: validation, cron in time zones, intervals, one-shot, pause, catch-up."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.timestamp_pb2 import Timestamp
from postbox.v1 import message_pb2, schedule_service_pb2_grpc, topic_service_pb2
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as pb
from postbox.v1 import topic_service_pb2_grpc as topic_grpc
from support import create_queue, error_of, eventually, receive, seconds, stats, unique_name


@pytest.fixture(scope="module")
def schedules(channel: grpc.Channel) -> schedule_service_pb2_grpc.ScheduleServiceStub:
    return schedule_service_pb2_grpc.ScheduleServiceStub(channel)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return unique_name(request.node.name)


def at(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def create(schedules, name: str, queue: str, **fields) -> pb.Schedule:
    schedule = pb.Schedule(name=name, target=pb.ScheduleTarget(queue=queue), **fields)
    return schedules.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule)).schedule


def get(schedules, name: str) -> pb.Schedule:
    return schedules.GetSchedule(pb.GetScheduleRequest(name=name)).schedule


def gone(schedules, name: str) -> bool:
    """Whether GetSchedule says there is no such schedule."""
    try:
        get(schedules, name)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return True
    return False


def visible(queues, queue: str) -> int:
    return stats(queues, queue).visible_messages


@pytest.mark.parametrize(
    ("cron", "says"),
    [
        (pb.CronSpec(expression="* * * *"), "has 4 fields; it needs 5"),
        (pb.CronSpec(expression="0 0 * * * *"), "has 6 fields"),
        (pb.CronSpec(expression="61 * * * *"), "bad minute"),
        (pb.CronSpec(expression="0 25 * * *"), "bad hour"),
        (pb.CronSpec(expression="0 0 31 2 *"), "bad day-of-month"),
        (pb.CronSpec(expression="0 0 * * FUNDAY"), "bad day-of-week"),
        (pb.CronSpec(expression="0 9 * * *", time_zone="Mars/Olympus"), "'Mars/Olympus' is not"),
        (pb.CronSpec(expression="0 9 * * *", time_zone="../etc/passwd"), "not an IANA time zone"),
    ],
)
def test_bad_cron_specs_are_invalid(schedules, queue, name, cron, says):
    error = error_of(create, schedules, name, queue, cron=cron)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def test_create_checks_the_rest(schedules, queue, name):
    for fields, code, says in [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "timing"),
        ({"interval": seconds(0.5)}, grpc.StatusCode.INVALID_ARGUMENT, "outside 1 s to 366 days"),
        # Found by the HTTP fuzzer: now + this overflowed a datetime (a 500).
        (
            {"interval": seconds(-89_270_073_141)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "outside 1 s to 366 days",
        ),
        ({"interval": seconds(60), "name": "bad name"}, grpc.StatusCode.INVALID_ARGUMENT, "name"),
    ]:
        error = error_of(create, schedules, fields.pop("name", name), queue, **fields)
        assert error.code() == code, fields
        assert says in error.details()
    error = error_of(create, schedules, name, "no-such-queue", interval=seconds(60))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    no_target = pb.Schedule(name=name, interval=seconds(60))
    error = error_of(schedules.CreateSchedule, pb.CreateScheduleRequest(schedule=no_target))
    assert "target" in error.details()
    create(schedules, name, queue, interval=seconds(60))
    error = error_of(create, schedules, name, queue, interval=seconds(60))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS


def test_cron_fires_next_in_its_time_zone(schedules, queue, name):
    berlin = ZoneInfo("Europe/Berlin")
    created = create(
        schedules, name, queue, cron=pb.CronSpec(expression="30 9 * * *", time_zone="Europe/Berlin")
    )
    now = datetime.now(berlin)
    expected = now.replace(hour=9, minute=30, second=0, microsecond=0)
    if expected <= now:
        # Wall-clock arithmetic in the zone: tomorrow's offset, whatever today's.
        expected = (now + timedelta(days=1)).replace(hour=9, minute=30, second=0, microsecond=0)
    assert created.next_fire_time.ToDatetime(timezone.utc) == expected.astimezone(timezone.utc)
    assert created.cron.time_zone == "Europe/Berlin"
    utc = create(schedules, name + "u", queue, cron=pb.CronSpec(expression="0 0 1 1 *"))
    assert utc.cron.time_zone == "UTC"
    assert utc.next_fire_time.ToDatetime(timezone.utc) == datetime(
        datetime.now(timezone.utc).year + 1, 1, 1, tzinfo=timezone.utc
    )


def test_interval_fires_into_a_queue_until_paused(schedules, queues, messages, queue, name):
    created = create(schedules, name, queue, interval=seconds(1), body=b"tick")
    assert not created.paused
    assert created.next_fire_time.ToDatetime() > datetime.now(timezone.utc).replace(tzinfo=None)
    eventually(lambda: visible(queues, queue) >= 2, what="two fires")
    paused = schedules.PauseSchedule(pb.PauseScheduleRequest(name=name)).schedule
    assert paused.paused
    assert not paused.HasField("next_fire_time")
    fired = get(schedules, name).fire_count
    got = receive(messages, queue, count=100)
    assert len(got) == fired
    assert {m.body for m in got} == {b"tick"}
    # One deduplication id per due time, so no content-based filter drops a repeat.
    assert len({m.deduplication_id for m in got}) == fired
    assert all(m.deduplication_id.startswith(f"{name}@") for m in got)

    resumed = schedules.ResumeSchedule(pb.ResumeScheduleRequest(name=name)).schedule
    assert not resumed.paused
    assert resumed.next_fire_time.ToDatetime() > datetime.now(timezone.utc).replace(tzinfo=None)
    eventually(lambda: get(schedules, name).fire_count > fired, what="a fire after resuming")
    schedules.DeleteSchedule(pb.DeleteScheduleRequest(name=name))
    error = error_of(schedules.GetSchedule, pb.GetScheduleRequest(name=name))
    assert error.code() == grpc.StatusCode.NOT_FOUND


def _schedule_header(message) -> dict:
    """The `_schedule` attribute of a fired message, as the JSON object it holds."""
    attribute = message.attributes["_schedule"]
    assert attribute.data_type == "String.json"
    return json.loads(attribute.string_value)


def test_run_at_fires_once_into_a_topic_and_is_deleted(
    schedules, channel, queues, messages, queue, name
):
    topics = topic_grpc.TopicServiceStub(channel)
    topics.CreateTopic(
        topic_service_pb2.CreateTopicRequest(topic=topic_service_pb2.Topic(name=name))
    )
    subscription = topic_service_pb2.Subscription(
        name="jobs", topic=name, pattern="jobs.*", queue=queue
    )
    topics.CreateSubscription(
        topic_service_pb2.CreateSubscriptionRequest(subscription=subscription)
    )
    run_at = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    schedule = pb.Schedule(
        name=name,
        run_at=at(run_at),
        target=pb.ScheduleTarget(topic=name, routing_key="jobs.nightly"),
        body=b"once",
    )
    schedules.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule))
    # Fired, it is gone, as beyond-queue deletes one-shots: the message is the record.
    eventually(lambda: gone(schedules, name), what="the one-shot schedule deleted after its fire")
    (message,) = receive(messages, queue)
    assert message.body == b"once"
    stamp = run_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    assert _schedule_header(message) == {
        "name": name, "scheduled_for": stamp, "out_of_band": False,
    }  # fmt: skip


def test_a_refused_one_shot_stays_paused_with_its_error(schedules, queues, queue, name):
    run_at = datetime.now(timezone.utc) + timedelta(seconds=0.3)
    queues.PauseQueue(qpb.PauseQueueRequest(name=queue, sends=True))
    create(schedules, name, queue, run_at=at(run_at), body=b"refused")
    spent = eventually(lambda: (s := get(schedules, name)).last_error and s)
    assert spent.paused
    assert spent.fire_count == 0
    assert not spent.HasField("next_fire_time")
    error = error_of(schedules.ResumeSchedule, pb.ResumeScheduleRequest(name=name))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "update run_at" in error.details()


def test_a_fired_message_says_its_schedule_and_due_time(schedules, messages, queue, name):
    created = create(
        schedules, name, queue, interval=seconds(1), body=b"tick",
        attributes={"kind": message_pb2.AttributeValue(data_type="String", string_value="k")},
    )  # fmt: skip
    due = created.next_fire_time.ToDatetime(timezone.utc)
    (message,) = eventually(lambda: receive(messages, queue, count=1), what="a fire")
    assert message.attributes["kind"].string_value == "k"
    assert _schedule_header(message) == {
        "name": name,
        "scheduled_for": due.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "out_of_band": False,
    }
    # The deduplication id names the same due time.
    assert message.deduplication_id == f"{name}@{due.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


def test_the_server_keeps_the_schedule_attribute_for_itself(schedules, queue, name):
    def attributes(*names: str) -> dict:
        return {n: message_pb2.AttributeValue(data_type="String", string_value="v") for n in names}

    error = error_of(
        create, schedules, name, queue, interval=seconds(60), attributes=attributes("_schedule")
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'_schedule' is the server's" in error.details()
    hundred = attributes(*(f"a{i}" for i in range(100)))
    error = error_of(create, schedules, name, queue, interval=seconds(60), attributes=hundred)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 99 (the server adds _schedule)" in error.details()


def test_update(schedules, queues, queue, name):
    create(schedules, name, queue, interval=seconds(3600), body=b"old")
    other = create_queue(queues, unique_name("other")).name
    changed = pb.Schedule(
        name=name,
        cron=pb.CronSpec(expression="0 12 * * *"),
        target=pb.ScheduleTarget(queue=other),
        body=b"new",
    )
    updated = schedules.UpdateSchedule(
        pb.UpdateScheduleRequest(
            schedule=changed, update_mask=FieldMask(paths=["cron", "target", "body"])
        )
    ).schedule
    assert updated.WhichOneof("timing") == "cron"
    assert (updated.target.queue, updated.body) == (other, b"new")
    assert updated.next_fire_time.ToDatetime(timezone.utc).hour == 12
    for paths, says in [
        ([], "update_mask is required"),
        (["name"], "only cron"),
        (["interval"], "set schedule.interval"),
        (["cron", "interval"], "one timing"),
    ]:
        error = error_of(
            schedules.UpdateSchedule,
            pb.UpdateScheduleRequest(schedule=changed, update_mask=FieldMask(paths=paths)),
        )
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in error.details()


async def test_after_downtime_a_schedule_fires_once_and_keeps_its_phase(
    db, schedules, queues, queue, name
):
    create(schedules, name, queue, interval=seconds(60), body=b"late")
    # As if the servers had been down for nine and a half periods.
    due = await db.fetchval(
        "UPDATE postbox.schedules SET next_fire_at = now() - interval '570 s' WHERE name = $1 "
        "RETURNING next_fire_at",
        name,
    )
    # A change behind the engine's back: tell the sleeping scheduler, as the engine's
    # own functions do.
    await db.execute("SELECT postbox._signal('schedules')")
    fired = eventually(lambda: (s := get(schedules, name)).fire_count == 1 and s)
    assert visible(queues, queue) == 1
    next_fire = fired.next_fire_time.ToDatetime(timezone.utc)
    assert next_fire > datetime.now(timezone.utc)
    assert (next_fire - due) % timedelta(seconds=60) == timedelta(0)
    assert (next_fire - due) // timedelta(seconds=60) == 10


async def test_a_refused_fire_is_recorded_and_skipped(db, schedules, queues, queue, name):
    queues.PauseQueue(qpb.PauseQueueRequest(name=queue, sends=True))
    create(schedules, name, queue, interval=seconds(1))
    failed = eventually(lambda: (s := get(schedules, name)).last_error and s)
    assert "paused for sending" in failed.last_error
    assert failed.fire_count == 0
    assert failed.next_fire_time.ToDatetime(timezone.utc) > datetime.now(timezone.utc) - timedelta(
        seconds=1
    )
    queues.ResumeQueue(qpb.ResumeQueueRequest(name=queue))
    recovered = eventually(lambda: (s := get(schedules, name)).fire_count > 0 and s)
    assert recovered.last_error == ""
    schedules.DeleteSchedule(pb.DeleteScheduleRequest(name=name))


def test_list(schedules, queue):
    names = sorted(unique_name(f"list{i}") for i in range(3))
    for schedule_name in names:
        create(schedules, schedule_name, queue, interval=seconds(3600))
    seen, token = [], ""
    while True:
        page = schedules.ListSchedules(pb.ListSchedulesRequest(page_size=2, page_token=token))
        seen += [s.name for s in page.schedules]
        if not (token := page.next_page_token):
            break
    assert [s for s in seen if s in names] == names


def _preview(schedules, start: datetime | None = None, count: int = 0, **timing):
    request = pb.PreviewScheduleRequest(schedule=pb.Schedule(**timing), count=count)
    if start is not None:
        request.start_time.CopyFrom(at(start))
    return [t.ToDatetime(timezone.utc) for t in schedules.PreviewSchedule(request).fire_times]


def test_preview_lists_the_next_fire_times_of_each_kind_of_timing(schedules):
    berlin = ZoneInfo("Europe/Berlin")
    # Friday 2026-03-27, before the switch to summer time on Sunday the 29th.
    start = datetime(2026, 3, 27, 12, 0, tzinfo=berlin)
    weekdays = _preview(
        schedules,
        start,
        count=3,
        cron=pb.CronSpec(expression="0 9 * * MON-FRI", time_zone="Europe/Berlin"),
    )
    assert [t.astimezone(berlin) for t in weekdays] == [
        datetime(2026, 3, 30, 9, 0, tzinfo=berlin),  # Monday, now CEST
        datetime(2026, 3, 31, 9, 0, tzinfo=berlin),
        datetime(2026, 4, 1, 9, 0, tzinfo=berlin),
    ]
    assert weekdays[0] - weekdays[1] == timedelta(days=-1)
    every = _preview(schedules, start, count=2, interval=seconds(90))
    assert every == [start + timedelta(seconds=90), start + timedelta(seconds=180)]
    assert len(_preview(schedules, start, cron=pb.CronSpec(expression="* * * * *"))) == 10
    once = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert _preview(schedules, start, count=5, run_at=at(once)) == [once]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"cron": pb.CronSpec(expression="61 * * * *")}, "bad minute"),
        ({"cron": pb.CronSpec(expression="0 9 * * *", time_zone="Mars/Olympus")}, "time zone"),
        ({"interval": seconds(0.5)}, "outside 1 s to 366 days"),
        ({}, "needs its timing"),
        ({"interval": seconds(60), "count": 101}, "count is 101"),
    ],
)
def test_preview_says_what_is_wrong_with_a_timing(schedules, fields, says):
    count = fields.pop("count", 0)
    error = error_of(_preview, schedules, count=count, **fields)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()


def _run(schedules, name: str) -> pb.RunScheduleResponse:
    return schedules.RunSchedule(pb.RunScheduleRequest(name=name))


def test_run_fires_now_and_keeps_the_next_fire_time(schedules, messages, queue, name):
    created = create(schedules, name, queue, interval=seconds(3600), body=b"by hand")
    ran = _run(schedules, name)
    assert ran.schedule.next_fire_time == created.next_fire_time
    assert ran.schedule.fire_count == 1
    assert ran.schedule.HasField("last_fire_time")
    (message,) = receive(messages, queue)
    assert (message.body, [message.message_id]) == (b"by hand", list(ran.message_ids))
    # Out of band, scheduled for the moment of the run (its deduplication id's).
    header = _schedule_header(message)
    assert (header["name"], header["out_of_band"]) == (name, True)
    assert message.deduplication_id == f"{name}@run:{header['scheduled_for']}"
    # Two runs are two messages: each run has a deduplication id of its own.
    _run(schedules, name)
    assert len(receive(messages, queue)) == 1


def test_a_paused_schedule_runs_by_hand_and_stays_paused(schedules, messages, queue, name):
    create(schedules, name, queue, interval=seconds(3600), body=b"paused")
    schedules.PauseSchedule(pb.PauseScheduleRequest(name=name))
    ran = _run(schedules, name)
    assert ran.schedule.paused
    assert [m.body for m in receive(messages, queue)] == [b"paused"]


def test_a_run_the_target_refuses_is_the_callers_error(schedules, queues, queue, name):
    create(schedules, name, queue, interval=seconds(3600))
    queues.PauseQueue(qpb.PauseQueueRequest(name=queue, sends=True))
    refused = error_of(_run, schedules, name)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert get(schedules, name).fire_count == 0
    missing = error_of(_run, schedules, "no-such-schedule")
    assert missing.code() == grpc.StatusCode.NOT_FOUND
