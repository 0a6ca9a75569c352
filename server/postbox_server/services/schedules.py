"""ScheduleService: cron, interval and one-shot schedules that fire into queues and topics."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import grpc
from postbox.v1 import schedule_service_pb2 as pb
from postbox.v1 import schedule_service_pb2_grpc

from postbox_server.db.engine import Engine, Row, ScheduleFields
from postbox_server.errors import invalid
from postbox_server.services import convert
from postbox_server.services.pagination import decode_page_token, next_page, page_size_of
from postbox_server.services.status import reports_errors
from postbox_server.workers.scheduling import DEFAULT_TIME_ZONE, Timing, next_fire_on_resume

_TIMINGS = ("cron", "interval", "run_at")
DEFAULT_PREVIEW = 10
MAX_PREVIEW = 100
_UPDATABLE = (*_TIMINGS, "target", "body", "attributes")


def _timing(schedule: pb.Schedule) -> Timing:
    kind = schedule.WhichOneof("timing")
    if kind == "cron":
        return Timing(
            cron_expression=schedule.cron.expression,
            time_zone=schedule.cron.time_zone or DEFAULT_TIME_ZONE,
        )
    if kind == "interval":
        return Timing(every=convert.optional_timedelta(schedule, "interval"))
    if kind == "run_at":
        return Timing(run_at=convert.optional_datetime(schedule, "run_at"))
    raise invalid("a schedule needs its timing: cron, interval or run_at")


def _fields(schedule: pb.Schedule, timing: Timing | None) -> ScheduleFields:
    target = schedule.target
    destination = target.WhichOneof("destination")
    timing = timing or Timing()
    return ScheduleFields(
        body=schedule.body,
        target_queue=target.queue if destination == "queue" else None,
        target_topic=target.topic if destination == "topic" else None,
        routing_key=target.routing_key,
        attributes=convert.attributes_json(schedule.attributes),
        cron_expression=timing.cron_expression,
        time_zone=timing.time_zone,
        every=timing.every,
        run_at=timing.run_at,
    )


def _check_target(schedule: pb.Schedule) -> None:
    if schedule.target.WhichOneof("destination") is None:
        raise invalid("a schedule needs its target: target.queue or target.topic")


def schedule_resource(row: Row) -> pb.Schedule:
    """A row of postbox.schedules as an API Schedule."""
    schedule = pb.Schedule(
        name=row["name"],
        target=pb.ScheduleTarget(routing_key=row["routing_key"]),
        body=row["body"],
        attributes=convert.attributes_from_json(row["attributes"]),
        paused=row["paused"],
        last_fire_time=convert.timestamp(row["last_fire_at"]),
        create_time=convert.timestamp(row["created_at"]),
        last_error=row["last_error"] or "",
        fire_count=row["fire_count"],
    )
    if row["target_queue"] is not None:
        schedule.target.queue = row["target_queue"]
    else:
        schedule.target.topic = row["target_topic"]
    if row["cron_expression"] is not None:
        schedule.cron.CopyFrom(
            pb.CronSpec(expression=row["cron_expression"], time_zone=row["time_zone"])
        )
    elif row["every"] is not None:
        schedule.interval.CopyFrom(convert.duration(row["every"]))
    else:
        schedule.run_at.CopyFrom(convert.timestamp(row["run_at"]))
    if not row["paused"] and row["next_fire_at"] is not None:
        schedule.next_fire_time.CopyFrom(convert.timestamp(row["next_fire_at"]))
    return schedule


class ScheduleService(schedule_service_pb2_grpc.ScheduleServiceServicer):
    def __init__(
        self, engine: Engine, on_change: Callable[[], None], *, max_message_size: int
    ) -> None:
        self.engine = engine
        self.max_message_size = max_message_size
        # Wakes this server's scheduler, so a schedule due soon is not left to its poll.
        self.on_change = on_change

    @reports_errors
    async def CreateSchedule(
        self, request: pb.CreateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateScheduleResponse:
        schedule = request.schedule
        timing = _timing(schedule)
        _check_target(schedule)
        convert.check_message_size(schedule, self.max_message_size)
        first = timing.first(datetime.now(timezone.utc))
        if first is None:  # _timing refused a schedule without its timing already
            raise invalid("a schedule needs its timing: cron, interval or run_at")
        row = await self.engine.create_schedule(schedule.name, first, _fields(schedule, timing))
        self.on_change()
        return pb.CreateScheduleResponse(schedule=schedule_resource(row))

    @reports_errors
    async def GetSchedule(
        self, request: pb.GetScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetScheduleResponse:
        row = await self.engine.get_schedule(request.name)
        return pb.GetScheduleResponse(schedule=schedule_resource(row))

    @reports_errors
    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSchedulesResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListSchedules")
        rows, token = next_page(
            await self.engine.list_schedules(page_size + 1, after), page_size, "ListSchedules"
        )
        return pb.ListSchedulesResponse(
            schedules=[schedule_resource(row) for row in rows], next_page_token=token
        )

    @reports_errors
    async def UpdateSchedule(
        self, request: pb.UpdateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateScheduleResponse:
        schedule = request.schedule
        paths = list(request.update_mask.paths)
        if not paths:
            raise invalid(f"update_mask is required: name any of {', '.join(_UPDATABLE)}")
        unknown = [path for path in paths if path not in _UPDATABLE]
        if unknown:
            raise invalid(
                f"update_mask names {', '.join(unknown)}; only {', '.join(_UPDATABLE)} can change"
            )
        timings = [path for path in paths if path in _TIMINGS]
        timing, first = None, None
        if len(timings) > 1:
            raise invalid("update_mask may name one timing: cron, interval or run_at")
        if timings:
            if schedule.WhichOneof("timing") != timings[0]:
                raise invalid(f"update_mask names {timings[0]}, so set schedule.{timings[0]}")
            timing = _timing(schedule)
            first = timing.first(datetime.now(timezone.utc))
        if "target" in paths:
            _check_target(schedule)
        # Fields outside the mask are empty here: a lower bound of the message it will send.
        convert.check_message_size(schedule, self.max_message_size)
        row = await self.engine.update_schedule(
            schedule.name, paths, first, _fields(schedule, timing)
        )
        self.on_change()
        return pb.UpdateScheduleResponse(schedule=schedule_resource(row))

    @reports_errors
    async def DeleteSchedule(
        self, request: pb.DeleteScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteScheduleResponse:
        await self.engine.delete_schedule(request.name)
        return pb.DeleteScheduleResponse()

    @reports_errors
    async def PauseSchedule(
        self, request: pb.PauseScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.PauseScheduleResponse:
        row = await self.engine.pause_schedule(request.name)
        return pb.PauseScheduleResponse(schedule=schedule_resource(row))

    @reports_errors
    async def ResumeSchedule(
        self, request: pb.ResumeScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.ResumeScheduleResponse:
        row = await self.engine.resume_schedule(request.name, next_fire_on_resume)
        self.on_change()
        return pb.ResumeScheduleResponse(schedule=schedule_resource(row))

    @reports_errors
    async def RunSchedule(
        self, request: pb.RunScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.RunScheduleResponse:
        row = await self.engine.run_schedule(request.name)
        return pb.RunScheduleResponse(
            schedule=schedule_resource(row), message_ids=[str(i) for i in row["message_ids"]]
        )

    @reports_errors
    async def PreviewSchedule(
        self, request: pb.PreviewScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreviewScheduleResponse:
        count = request.count or DEFAULT_PREVIEW
        if not 1 <= count <= MAX_PREVIEW:
            raise invalid(f"count is {count}; it must be 1 to {MAX_PREVIEW}")
        start = convert.optional_datetime(request, "start_time") or datetime.now(timezone.utc)
        times = _timing(request.schedule).preview(start, count)
        return pb.PreviewScheduleResponse(fire_times=[convert.timestamp(t) for t in times])
