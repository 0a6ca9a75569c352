"""ScheduleService: cron, interval and one-shot schedules that fire into queues and topics."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import grpc
from postbox.v1 import schedule_service_pb2 as pb
from postbox.v1 import schedule_service_pb2_grpc

from postbox_server.db.engine import Engine, Row, ScheduleFields
from postbox_server.errors import ApiError, invalid, quoted
from postbox_server.services import convert
from postbox_server.services.pagination import decode_page_token, next_page, page_size_of
from postbox_server.services.payload_schema_cache import PayloadSchemaCache
from postbox_server.services.status import reports_errors
from postbox_server.workers.scheduling import (
    DEFAULT_TIME_ZONE,
    Timing,
    canonical_cron,
    next_fire_on_resume,
)

_TIMINGS = ("cron", "interval", "run_at")
DEFAULT_PREVIEW = 10
MAX_PREVIEW = 100
# Schedule.next_fire_times: beyond-queue's QUEUE_SCHEDULE_PREVIEW_COUNT default.
NEXT_FIRE_TIMES = 5
_UPDATABLE = (*_TIMINGS, "target", "body", "attributes", "catch_up_limit", "failure_threshold")
_TARGET_KINDS = ("queue", "topic")


def _timing(schedule: pb.Schedule) -> Timing:
    kind = schedule.WhichOneof("timing")
    if kind == "cron":
        return Timing(
            cron_expression=canonical_cron(schedule.cron.expression),
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
        catch_up_limit=schedule.catch_up_limit,
        failure_threshold=schedule.failure_threshold,
    )


def _check_target(schedule: pb.Schedule) -> None:
    if schedule.target.WhichOneof("destination") is None:
        raise invalid("a schedule needs its target: target.queue or target.topic")


async def check_fired_body(
    payload_schemas: PayloadSchemaCache,
    target_queue: str | None,
    target_topic: str | None,
    body: bytes,
) -> None:
    """Refuses (INVALID_ARGUMENT) a body that breaks its target's payload schema, as a
    send or publish of it would be; FAILED_PRECONDITION for a schema that does not
    compile. A missing target has no schema: its fires fail with NOT_FOUND instead."""
    if target_queue is not None:
        await payload_schemas.check("queues", target_queue, (body,), batch=False)
    elif target_topic is not None:
        await payload_schemas.check("topics", target_topic, (body,), batch=False)


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
        catch_up_limit=row["catch_up_limit"],
        failure_threshold=row["failure_threshold"],
        consecutive_failures=row["consecutive_failures"],
        human_readable=Timing.of(row).describe(),
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


def with_next_fire_times(row: Row) -> pb.Schedule:
    """The schedule with its next NEXT_FIRE_TIMES fire times, from next_fire_time on."""
    schedule = schedule_resource(row)
    if schedule.HasField("next_fire_time"):
        timing = Timing.of(row)
        times = [row["next_fire_at"]]
        while len(times) < NEXT_FIRE_TIMES and (
            following := timing.after_fire(times[-1], times[-1])
        ):
            times.append(following)
        schedule.next_fire_times.extend(convert.timestamp(t) for t in times)
    return schedule


class ScheduleService(schedule_service_pb2_grpc.ScheduleServiceServicer):
    def __init__(
        self,
        engine: Engine,
        on_change: Callable[[], None],
        payload_schemas: PayloadSchemaCache,
        *,
        max_message_size: int,
    ) -> None:
        self.engine = engine
        self.max_message_size = max_message_size
        # A schedule's body is checked against its target's schema when it is set, so
        # a bad one is refused to its author rather than failing every fire.
        self.payload_schemas = payload_schemas
        # Wakes this server's scheduler, so a schedule due soon is not left to its poll.
        self.on_change = on_change

    @reports_errors
    async def CreateSchedule(
        self, request: pb.CreateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateScheduleResponse:
        return pb.CreateScheduleResponse(schedule=await self._create(request.schedule))

    async def _create(self, schedule: pb.Schedule) -> pb.Schedule:
        timing = _timing(schedule)
        _check_target(schedule)
        convert.check_message_size(schedule, self.max_message_size)
        fields = _fields(schedule, timing)
        await check_fired_body(
            self.payload_schemas, fields.target_queue, fields.target_topic, fields.body
        )
        first = timing.first(datetime.now(timezone.utc))
        if first is None:  # _timing refused a schedule without its timing already
            raise invalid("a schedule needs its timing: cron, interval or run_at")
        row = await self.engine.create_schedule(schedule.name, first, fields)
        self.on_change()
        return with_next_fire_times(row)

    @reports_errors
    async def GetSchedule(
        self, request: pb.GetScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetScheduleResponse:
        row = await self.engine.get_schedule(request.name)
        return pb.GetScheduleResponse(schedule=with_next_fire_times(row))

    @reports_errors
    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSchedulesResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListSchedules")
        if request.target_kind not in ("", *_TARGET_KINDS):
            raise invalid(
                f"target_kind is {quoted(request.target_kind)}; it must be queue, topic or empty"
            )
        found = await self.engine.list_schedules(
            page_size + 1, after,
            paused=request.paused if request.HasField("paused") else None,
            target_kind=request.target_kind or None, name_prefix=request.name_prefix,
        )  # fmt: skip
        rows, token = next_page(found, page_size, "ListSchedules")
        return pb.ListSchedulesResponse(
            schedules=[schedule_resource(row) for row in rows], next_page_token=token
        )

    @reports_errors
    async def UpdateSchedule(
        self, request: pb.UpdateScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateScheduleResponse:
        try:
            return pb.UpdateScheduleResponse(schedule=await self._update(request))
        except ApiError as error:
            if not request.allow_missing or error.code is not grpc.StatusCode.NOT_FOUND:
                raise
        try:
            return pb.UpdateScheduleResponse(schedule=await self._create(request.schedule))
        except ApiError as refusal:
            if refusal.code is not grpc.StatusCode.ALREADY_EXISTS:
                raise
        # Created by another caller meanwhile: this request updates it.
        return pb.UpdateScheduleResponse(schedule=await self._update(request))

    async def _update(self, request: pb.UpdateScheduleRequest) -> pb.Schedule:
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
        fields = _fields(schedule, timing)
        if "body" in paths or "target" in paths:
            await self._check_updated_body(schedule.name, paths, fields)
        row = await self.engine.update_schedule(schedule.name, paths, first, fields)
        self.on_change()
        return with_next_fire_times(row)

    async def _check_updated_body(
        self, name: str, paths: list[str], fields: ScheduleFields
    ) -> None:
        """Checks the body and target it will fire with: the new ones, or those it has."""
        try:
            current = await self.engine.get_schedule(name)
        except ApiError as error:
            if error.code is not grpc.StatusCode.NOT_FOUND:
                raise
            # The update then says what is wrong: a malformed target before NOT_FOUND.
            return
        target = fields if "target" in paths else None
        await check_fired_body(
            self.payload_schemas,
            target.target_queue if target else current["target_queue"],
            target.target_topic if target else current["target_topic"],
            fields.body if "body" in paths else current["body"],
        )

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
        return pb.ResumeScheduleResponse(schedule=with_next_fire_times(row))

    @reports_errors
    async def RunSchedule(
        self, request: pb.RunScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.RunScheduleResponse:
        current = await self.engine.get_schedule(request.name)
        await check_fired_body(
            self.payload_schemas, current["target_queue"], current["target_topic"], current["body"]
        )
        row = await self.engine.run_schedule(request.name)
        return pb.RunScheduleResponse(
            schedule=with_next_fire_times(row), message_ids=[str(i) for i in row["message_ids"]]
        )

    @reports_errors
    async def PreviewSchedule(
        self, request: pb.PreviewScheduleRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreviewScheduleResponse:
        count = request.count or DEFAULT_PREVIEW
        if not 1 <= count <= MAX_PREVIEW:
            raise invalid(f"count is {count}; it must be 1 to {MAX_PREVIEW}")
        start = convert.optional_datetime(request, "start_time") or datetime.now(timezone.utc)
        timing = _timing(request.schedule)
        times = timing.preview(start, count)
        canonical = pb.Schedule(human_readable=timing.describe())
        if timing.cron_expression is not None:
            canonical.cron.CopyFrom(
                pb.CronSpec(expression=timing.cron_expression, time_zone=timing.time_zone)
            )
        elif timing.every is not None:
            canonical.interval.CopyFrom(request.schedule.interval)
        else:
            canonical.run_at.CopyFrom(request.schedule.run_at)
        return pb.PreviewScheduleResponse(
            fire_times=[convert.timestamp(t) for t in times],
            human_readable=canonical.human_readable,
            canonical=canonical,
        )
