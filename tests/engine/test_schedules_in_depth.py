"""Schedules as beyond-queue has them (issue 45 item 2), through a real server: a catch-up
limit after downtime, failure_threshold pausing, AIP-134 upsert, list filters, and the
canonical timing with human_readable and the next fire times."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as pb
from postbox.v1 import schedule_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from support import error_of, eventually, seconds, stats, unique_name

BERLIN = ZoneInfo("Europe/Berlin")


@pytest.fixture(scope="module")
def schedules(channel: grpc.Channel) -> schedule_service_pb2_grpc.ScheduleServiceStub:
    return schedule_service_pb2_grpc.ScheduleServiceStub(channel)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    return unique_name(request.node.name)


def create(schedules, name: str, queue: str, **fields) -> pb.Schedule:
    schedule = pb.Schedule(name=name, target=pb.ScheduleTarget(queue=queue), **fields)
    return schedules.CreateSchedule(pb.CreateScheduleRequest(schedule=schedule)).schedule


def get(schedules, name: str) -> pb.Schedule:
    return schedules.GetSchedule(pb.GetScheduleRequest(name=name)).schedule


def times(stamps) -> list[datetime]:
    return [t.ToDatetime(timezone.utc) for t in stamps]


async def test_after_downtime_a_catch_up_limit_fires_missed_times_in_order(
    db, schedules, queues, queue, name
):
    create(schedules, name, queue, interval=seconds(60), body=b"tick", catch_up_limit=3)
    # As if the servers had been down for nine and a half periods: ten due times missed.
    due = await db.fetchval(
        "UPDATE postbox.schedules SET next_fire_at = now() - interval '570 s' WHERE name = $1 "
        "RETURNING next_fire_at",
        name,
    )
    await db.execute("SELECT postbox._signal('schedules')")  # wake the sleeping scheduler
    fired = eventually(lambda: (s := get(schedules, name)).fire_count >= 3 and s)
    assert fired.fire_count == 3  # the limit: the other seven are skipped
    assert stats(queues, queue).visible_messages == 3
    # The first three due times, each in its own message's deduplication id.
    ids = await db.fetch(
        """SELECT d.deduplication_id FROM postbox.deduplication d
           JOIN postbox.queues q ON q.id = d.queue_id WHERE q.name = $1
           ORDER BY d.deduplication_id""",
        queue,
    )
    stamps = [(due + timedelta(seconds=60 * k)).astimezone(timezone.utc) for k in range(3)]
    expected = [f"{name}@{t.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}" for t in stamps]
    assert [r["deduplication_id"] for r in ids] == expected
    # Then it continues from the first due time after now, in phase.
    next_fire = fired.next_fire_time.ToDatetime(timezone.utc)
    assert next_fire > datetime.now(timezone.utc) - timedelta(seconds=60)
    assert (next_fire - due) // timedelta(seconds=60) == 10
    assert (next_fire - due) % timedelta(seconds=60) == timedelta(0)


def test_failure_threshold_refusals_in_a_row_pause_the_schedule(schedules, queues, queue, name):
    queues.PauseQueue(qpb.PauseQueueRequest(name=queue, sends=True))
    create(schedules, name, queue, interval=seconds(1), failure_threshold=2)
    paused = eventually(lambda: (s := get(schedules, name)).paused and s, what="the pause")
    assert paused.consecutive_failures == 2
    assert "paused for sending" in paused.last_error
    assert paused.fire_count == 0
    assert not paused.HasField("next_fire_time")
    assert list(paused.next_fire_times) == []
    # Paused, it is no longer due: no third refusal is counted.
    assert get(schedules, name).consecutive_failures == 2
    queues.ResumeQueue(qpb.ResumeQueueRequest(name=queue))
    resumed = schedules.ResumeSchedule(pb.ResumeScheduleRequest(name=name)).schedule
    assert resumed.consecutive_failures == 0
    fired = eventually(lambda: (s := get(schedules, name)).fire_count > 0 and s)
    assert (fired.consecutive_failures, fired.last_error, fired.paused) == (0, "", False)
    schedules.DeleteSchedule(pb.DeleteScheduleRequest(name=name))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"catch_up_limit": 1001}, "catch_up_limit 1001 is outside 0 to 1000"),
        ({"catch_up_limit": -1}, "catch_up_limit -1"),
        ({"failure_threshold": 1001}, "failure_threshold 1001 is outside 0 to 1000"),
    ],
)
def test_policy_limits_are_enforced_and_store_nothing(schedules, queue, name, fields, says):
    error = error_of(create, schedules, name, queue, interval=seconds(60), **fields)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert says in error.details()
    assert error_of(get, schedules, name).code() is grpc.StatusCode.NOT_FOUND


def test_update_changes_the_policies(schedules, queue, name):
    create(schedules, name, queue, interval=seconds(3600))
    update = pb.UpdateScheduleRequest(
        schedule=pb.Schedule(name=name, catch_up_limit=5, failure_threshold=3),
        update_mask=FieldMask(paths=["catch_up_limit", "failure_threshold"]),
    )
    updated = schedules.UpdateSchedule(update).schedule
    assert (updated.catch_up_limit, updated.failure_threshold) == (5, 3)
    assert updated.interval.seconds == 3600


def test_update_with_allow_missing_creates_then_updates(schedules, queue, name):
    schedule = pb.Schedule(
        name=name, target=pb.ScheduleTarget(queue=queue), interval=seconds(600), body=b"a"
    )
    mask = FieldMask(paths=["body"])
    missing = error_of(
        schedules.UpdateSchedule, pb.UpdateScheduleRequest(schedule=schedule, update_mask=mask)
    )
    assert missing.code() is grpc.StatusCode.NOT_FOUND
    upsert = pb.UpdateScheduleRequest(schedule=schedule, update_mask=mask, allow_missing=True)
    created = schedules.UpdateSchedule(upsert).schedule
    assert (created.body, created.interval.seconds, created.target.queue) == (b"a", 600, queue)
    assert get(schedules, name).create_time == created.create_time
    upsert.schedule.body = b"b"
    upsert.schedule.interval.seconds = 60  # outside the mask: kept as it is
    updated = schedules.UpdateSchedule(upsert).schedule
    assert (updated.body, updated.interval.seconds) == (b"b", 600)
    assert updated.create_time == created.create_time


def test_list_filters_by_status_target_kind_and_name_prefix(schedules, topics, queue):
    prefix = unique_name("filters")
    topic = unique_name("filters_topic")
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    create(schedules, f"{prefix}-active", queue, interval=seconds(3600))
    create(schedules, f"{prefix}-paused", queue, interval=seconds(3600))
    schedules.PauseSchedule(pb.PauseScheduleRequest(name=f"{prefix}-paused"))
    into_topic = pb.Schedule(
        name=f"{prefix}-topic", target=pb.ScheduleTarget(topic=topic), interval=seconds(3600)
    )
    schedules.CreateSchedule(pb.CreateScheduleRequest(schedule=into_topic))
    create(schedules, unique_name("elsewhere"), queue, interval=seconds(3600))

    def listed(**filters) -> list[str]:
        request = pb.ListSchedulesRequest(name_prefix=prefix, page_size=1, **filters)
        found = []
        while True:
            page = schedules.ListSchedules(request)
            found += [s.name for s in page.schedules]
            if not page.next_page_token:
                return found
            request.page_token = page.next_page_token

    assert listed() == [f"{prefix}-active", f"{prefix}-paused", f"{prefix}-topic"]
    assert listed(paused=True) == [f"{prefix}-paused"]
    assert listed(paused=False) == [f"{prefix}-active", f"{prefix}-topic"]
    assert listed(target_kind="topic") == [f"{prefix}-topic"]
    assert listed(target_kind="queue", paused=False) == [f"{prefix}-active"]
    bad = error_of(schedules.ListSchedules, pb.ListSchedulesRequest(target_kind="workflow"))
    assert bad.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "target_kind" in bad.details()


def test_get_has_the_canonical_timing_its_description_and_next_fire_times(schedules, queue, name):
    created = create(
        schedules, name, queue,
        cron=pb.CronSpec(expression=" 0  9 * *   mon-fri ", time_zone="Europe/Berlin"),
    )  # fmt: skip
    assert created.cron.expression == "0 9 * * MON-FRI"
    got = get(schedules, name)
    assert got.human_readable == "At 09:00 on Monday through Friday (Europe/Berlin)"
    fires = times(got.next_fire_times)
    assert len(fires) == 5
    assert fires[0] == got.next_fire_time.ToDatetime(timezone.utc)
    assert fires == sorted(set(fires))
    for fire in fires:
        local = fire.astimezone(BERLIN)
        assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    # A list leaves the times out (a page would compute five per schedule).
    listed = schedules.ListSchedules(pb.ListSchedulesRequest(name_prefix=name)).schedules
    assert listed[0].human_readable == got.human_readable
    assert list(listed[0].next_fire_times) == []


@pytest.mark.parametrize(
    ("timing", "human"),
    [
        ({"interval": seconds(5400)}, "Every 1 hour 30 minutes"),
        ({"interval": seconds(86400)}, "Every day"),
        ({"cron": pb.CronSpec(expression="*/15 * * * *")}, "Every 15th minute of every hour (UTC)"),
    ],
)
def test_preview_has_the_description_and_the_canonical_timing(schedules, timing, human):
    previewed = schedules.PreviewSchedule(
        pb.PreviewScheduleRequest(schedule=pb.Schedule(**timing), count=3)
    )
    assert previewed.human_readable == human
    assert previewed.canonical.human_readable == human
    assert len(previewed.fire_times) == 3
    kind = next(iter(timing))
    assert previewed.canonical.WhichOneof("timing") == kind
    if kind == "cron":
        assert previewed.canonical.cron.time_zone == "UTC"
