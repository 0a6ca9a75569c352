"""/v1/schedules and /v1/previews: beyond-queue's schedule routes on ScheduleService.

A schedule is written as beyond-queue writes one, flat: its name; one timing (`cron`
with `timezone`, `when` in words such as "every weekday at 9am" (with `timezone`),
stored as the cron expression it means, `every` as seconds or "30s", "5m", "2h", "1d",
or `fire_at` as an RFC 3339 time); `target_kind` "queue" (target: a queue's name) or
"topic" (target: a routing key of the event bus, see events.py); `message` and
`headers` as a send takes them; `status` "active" or "paused"; `catchup` (with
`catchup_limit`) and `failure_threshold`.
"""

from __future__ import annotations

import re
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import schedule_service_pb2 as spb

from postbox_server.errors import ApiError
from postbox_server.http.rest.events import EVENTS_TOPIC, ensure_events_topic
from postbox_server.http.rest.framework import (
    BadInput,
    Reply,
    RestCall,
    RestError,
    Route,
    json_type,
    path_param,
    query_param,
    quoted,
)
from postbox_server.http.rest.shapes import (
    HEADERS_SCHEMA,
    MESSAGE_SCHEMA,
    attributes_of,
    body_of,
    duration,
    headers_of,
    message_fields,
    message_id,
    parse_time,
    time_text,
    whole_seconds,
)
from postbox_server.workers.when import when_to_cron

# beyond-queue's QUEUE_SCHEDULE_PREVIEW_COUNT and QUEUE_SCHEDULE_LIST_MAX defaults.
PREVIEW_COUNT = 5
LIST_MAX = 1000
# catchup: true without a catchup_limit.
DEFAULT_CATCH_UP_LIMIT = 100
_EVERY = re.compile(r"([0-9]{1,9})([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TIMINGS = ("cron", "every", "fire_at", "when")
_POLICIES = ("catchup", "catchup_limit", "failure_threshold")
_FIELDS = (
    *_TIMINGS,
    *_POLICIES,
    "name",
    "timezone",
    "target_kind",
    "target",
    "message",
    "headers",
    "status",
)
_STATUSES = ("active", "paused")
_TARGET_KINDS = ("queue", "topic")
NAME = path_param("name", "Name of the schedule.")


def _unknown(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadInput(f"unknown field {quoted(unknown[0])}; a schedule takes {', '.join(allowed)}")


def _every(value: Any) -> int:
    if isinstance(value, str):
        match = _EVERY.fullmatch(value)
        if match is None:
            raise BadInput(
                f"every is {quoted(value)}; write seconds as a number or a string such as "
                '"30s", "5m", "2h" or "1d"'
            )
        return int(match[1]) * _UNIT[match[2]]
    return whole_seconds(value, "every")


_SHAPES = {"cron": "five-field cron expression", "when": 'phrase such as "every day at 9am"'}


def _count(body: dict[str, Any], name: str) -> int:
    value = body[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{name} is a JSON {json_type(value)}; a whole number, 0 to 1000")
    return value


def _policies(body: dict[str, Any], schedule: spb.Schedule) -> list[str]:
    """Sets the body's catch-up and failure policies on `schedule`; the mask's paths."""
    paths = []
    catchup = body.get("catchup")
    if catchup is not None and not isinstance(catchup, bool):
        raise BadInput(f"catchup is a JSON {json_type(catchup)}; true or false")
    if catchup is not None or body.get("catchup_limit") is not None:
        limit = DEFAULT_CATCH_UP_LIMIT
        if body.get("catchup_limit") is not None:
            limit = _count(body, "catchup_limit")
        schedule.catch_up_limit = 0 if catchup is False else limit
        paths.append("catch_up_limit")
    if body.get("failure_threshold") is not None:
        schedule.failure_threshold = _count(body, "failure_threshold")
        paths.append("failure_threshold")
    return paths


def _timing(body: dict[str, Any], schedule: spb.Schedule) -> str | None:
    """Sets the body's timing on `schedule`; its field name, None when it has none."""
    given = [name for name in _TIMINGS if body.get(name) is not None]
    if len(given) > 1:
        raise BadInput(f"give one timing, not {' and '.join(given)}: cron, when, every or fire_at")
    zone = body.get("timezone")
    if zone is not None and not isinstance(zone, str):
        raise BadInput(f"timezone is a JSON {json_type(zone)}; an IANA name such as Europe/Berlin")
    if zone is not None and given not in (["cron"], ["when"]):
        raise BadInput("timezone goes with cron or when: give the timing with it")
    if not given:
        return None
    kind = given[0]
    value = body[kind]
    if kind in ("cron", "when"):
        if not isinstance(value, str):
            raise BadInput(f"{kind} is a JSON {json_type(value)}; a {_SHAPES[kind]}")
        try:
            expression = value if kind == "cron" else when_to_cron(value)
        except ApiError as error:
            raise BadInput(error.message) from None
        schedule.cron.CopyFrom(spb.CronSpec(expression=expression, time_zone=zone or ""))
        return "cron"
    if kind == "every":
        schedule.interval.CopyFrom(duration(_every(value)))
        return "interval"
    schedule.run_at.CopyFrom(parse_time(value, "fire_at"))
    return "run_at"


def _target(body: dict[str, Any], schedule: spb.Schedule) -> bool:
    """Sets the body's target on `schedule`; whether it has one."""
    kind, target = body.get("target_kind"), body.get("target")
    if kind is None and target is None:
        return False
    if kind not in _TARGET_KINDS:
        raise BadInput(f"target_kind is {quoted(str(kind))}; it must be queue or topic")
    if not isinstance(target, str):
        raise BadInput(f"target is a JSON {json_type(target)}; name the {kind} (a string)")
    if kind == "queue":
        schedule.target.queue = target
    else:
        schedule.target.topic = EVENTS_TOPIC
        schedule.target.routing_key = target
    return True


def _status(body: dict[str, Any]) -> str | None:
    status = body.get("status")
    if status is not None and status not in _STATUSES:
        raise BadInput(f"status is {quoted(str(status))}; it must be active or paused")
    return status


def _schedule(body: dict[str, Any], name: str) -> tuple[spb.Schedule, list[str]]:
    """The body as a Schedule, and the fields it sets (as an update mask names them)."""
    schedule = spb.Schedule(name=name)
    paths = []
    timing = _timing(body, schedule)
    if timing is not None:
        paths.append(timing)
    if _target(body, schedule):
        paths.append("target")
    if "message" in body:
        schedule.body = body_of(body["message"])
        paths.append("body")
    if "headers" in body:
        for key, value in attributes_of(body["headers"]).items():
            schedule.attributes[key].CopyFrom(value)
        paths.append("attributes")
    paths += _policies(body, schedule)
    return schedule, paths


def _json(schedule: spb.Schedule, *, next_fires: bool = False) -> dict[str, Any]:
    answer: dict[str, Any] = {"name": schedule.name}
    timing = schedule.WhichOneof("timing")
    if timing == "cron":
        answer["cron"] = schedule.cron.expression
        answer["timezone"] = schedule.cron.time_zone or "UTC"
    elif timing == "interval":
        answer["every"] = schedule.interval.seconds
    elif timing == "run_at":
        answer["fire_at"] = time_text(schedule.run_at)
    if schedule.target.WhichOneof("destination") == "queue":
        answer.update(target_kind="queue", target=schedule.target.queue)
    else:
        answer.update(target_kind="topic", target=schedule.target.routing_key)
    answer.update(message_fields(schedule.body))
    answer.update(
        headers=headers_of(schedule.attributes),
        status="paused" if schedule.paused else "active",
        next_fire_at=time_text(schedule.next_fire_time),
        last_fired_at=time_text(schedule.last_fire_time),
        created_at=time_text(schedule.create_time),
        fire_count=schedule.fire_count,
        last_error=schedule.last_error or None,
        human_readable=schedule.human_readable,
        catchup=schedule.catch_up_limit > 0,
        catchup_limit=schedule.catch_up_limit or None,
        failure_threshold=schedule.failure_threshold or None,
        consecutive_failures=schedule.consecutive_failures,
    )
    if next_fires:
        answer["next_fires"] = [time_text(t) for t in schedule.next_fire_times]
    return answer


async def _set_status(call: RestCall, schedule: spb.Schedule, status: str | None) -> spb.Schedule:
    if status == "paused" and not schedule.paused:
        paused = await call.call(
            "ScheduleService/PauseSchedule", spb.PauseScheduleRequest(name=schedule.name)
        )
        return paused.schedule
    if status == "active" and schedule.paused:
        resumed = await call.call(
            "ScheduleService/ResumeSchedule", spb.ResumeScheduleRequest(name=schedule.name)
        )
        return resumed.schedule
    return schedule


async def _answer(call: RestCall, schedule: spb.Schedule, status: int) -> web.Response:
    headers = {"Location": f"/v1/schedules/{schedule.name}"} if status == 201 else None
    return web.json_response(_json(schedule, next_fires=True), status=status, headers=headers)


async def _create(call: RestCall, body: dict[str, Any], name: str) -> spb.Schedule:
    schedule, _ = _schedule(body, name)
    if schedule.target.topic == EVENTS_TOPIC:
        await ensure_events_topic(call)
    created = await call.call(
        "ScheduleService/CreateSchedule", spb.CreateScheduleRequest(schedule=schedule)
    )
    return created.schedule


async def create(call: RestCall) -> web.Response:
    body = await call.json_object()
    _unknown(body, _FIELDS)
    name = body.get("name")
    if not isinstance(name, str):
        raise BadInput(f"name is a JSON {json_type(name)}; the body needs the schedule's name")
    status = _status(body)
    schedule = await _create(call, body, name)
    return await _answer(call, await _set_status(call, schedule, status), 201)


async def upsert(call: RestCall) -> web.Response:
    name = call.path("name")
    body = await call.json_object()
    _unknown(body, _FIELDS)
    if body.get("name", name) != name:
        raise BadInput(f"the body names {quoted(str(body['name']))}, the path {quoted(name)}")
    status = _status(body)
    schedule, paths = _schedule(body, name)
    try:
        return await _answer(
            call, await _set_status(call, await _create(call, body, name), status), 201
        )
    except RestError as error:
        if error.code is not grpc.StatusCode.ALREADY_EXISTS:
            raise
    # It exists: the body replaces its timing, target and message.
    updated = await call.call(
        "ScheduleService/UpdateSchedule",
        spb.UpdateScheduleRequest(
            schedule=schedule,
            update_mask=FieldMask(
                paths=[*paths, *(p for p in ("body", "attributes") if p not in paths)]
            ),
        ),
    )
    return await _answer(call, await _set_status(call, updated.schedule, status), 200)


async def update(call: RestCall) -> web.Response:
    name = call.path("name")
    body = await call.json_object()
    _unknown(body, tuple(f for f in _FIELDS if f != "name"))
    status = _status(body)
    schedule, paths = _schedule(body, name)
    if schedule.target.topic == EVENTS_TOPIC:
        await ensure_events_topic(call)
    if paths:
        updated = await call.call(
            "ScheduleService/UpdateSchedule",
            spb.UpdateScheduleRequest(schedule=schedule, update_mask=FieldMask(paths=paths)),
        )
        current = updated.schedule
    elif status is None:
        raise BadInput("the body changes nothing: give status, a timing, a target or a message")
    else:
        got = await call.call("ScheduleService/GetSchedule", spb.GetScheduleRequest(name=name))
        current = got.schedule
    return await _answer(call, await _set_status(call, current, status), 200)


async def get(call: RestCall) -> web.Response:
    got = await call.call(
        "ScheduleService/GetSchedule", spb.GetScheduleRequest(name=call.path("name"))
    )
    return await _answer(call, got.schedule, 200)


async def list_all(call: RestCall) -> web.Response:
    status = call.query_str("status")
    kind = call.query_str("target_kind")
    if status is not None and status not in _STATUSES:
        raise BadInput(f"status is {quoted(status)}; it must be active or paused")
    if kind is not None and kind not in _TARGET_KINDS:
        raise BadInput(f"target_kind is {quoted(kind)}; it must be queue or topic")
    request = spb.ListSchedulesRequest(
        page_size=LIST_MAX, target_kind=kind or "", name_prefix=call.query_str("name_prefix") or ""
    )
    if status is not None:
        request.paused = status == "paused"
    page = await call.call("ScheduleService/ListSchedules", request)
    return web.json_response([_json(schedule) for schedule in page.schedules])


async def delete(call: RestCall) -> web.Response:
    try:
        await call.call(
            "ScheduleService/DeleteSchedule", spb.DeleteScheduleRequest(name=call.path("name"))
        )
    except RestError as error:
        if error.code is not grpc.StatusCode.NOT_FOUND:
            raise
    return web.Response(status=204)


async def run(call: RestCall) -> web.Response:
    name = call.path("name")
    ran = await call.call("ScheduleService/RunSchedule", spb.RunScheduleRequest(name=name))
    return web.json_response(
        {
            "schedule": name,
            "msg_ids": [message_id(i) for i in ran.message_ids],
            "fired_at": time_text(ran.schedule.last_fire_time),
        },
        status=202,
    )


async def preview(call: RestCall) -> web.Response:
    body = await call.json_object()
    _unknown(body, (*_TIMINGS, "timezone", "count", "name"))
    count = body.get("count", PREVIEW_COUNT)
    # 0 would mean PreviewScheduleRequest's default, ten.
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise BadInput(f"count is a JSON {json_type(count)}; how many fire times, 1 to 100")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise BadInput(f"name is a JSON {json_type(name)}; a schedule's name, for its grant")
    schedule = spb.Schedule(name=name)
    if _timing(body, schedule) is None:
        raise BadInput("give a timing to preview: cron, when, every or fire_at")
    previewed = await call.call(
        "ScheduleService/PreviewSchedule",
        spb.PreviewScheduleRequest(schedule=schedule, count=count),
    )
    canonical = _json(previewed.canonical)
    answer = {k: v for k, v in canonical.items() if k in ("cron", "timezone", "every", "fire_at")}
    answer["human_readable"] = previewed.human_readable
    answer["next_fires"] = [time_text(t) for t in previewed.fire_times]
    return web.json_response(answer)


_TIMING_SCHEMA: dict[str, Any] = {
    "cron": {"type": "string", "description": "Five-field cron expression."},
    "timezone": {"type": "string", "description": "IANA time zone of cron; default UTC."},
    "every": {"type": ["integer", "string"], "description": 'Seconds, or "30s", "5m", "2h", "1d".'},
    "fire_at": {"type": "string", "format": "date-time", "description": "Fire once then."},
    "when": {
        "type": "string",
        "description": 'In words, e.g. "every weekday at 9am"; '
        "stored as the cron expression it means.",
    },
}
SCHEDULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        **_TIMING_SCHEMA,
        "target_kind": {"type": "string", "enum": list(_TARGET_KINDS)},
        "target": {"type": "string", "description": "A queue's name, or a routing key."},
        "message": MESSAGE_SCHEMA,
        "headers": HEADERS_SCHEMA,
        "status": {"type": "string", "enum": list(_STATUSES)},
        "catchup": {"type": "boolean", "description": "Fire missed times after downtime."},
        "catchup_limit": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000,
            "description": f"Most catch-up fires; default {DEFAULT_CATCH_UP_LIMIT}.",
        },
        "failure_threshold": {
            "type": "integer",
            "minimum": 0,
            "maximum": 1000,
            "description": "Refused fires in a row that pause it; 0: never.",
        },
    },
}
_READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **SCHEDULE_SCHEMA["properties"],
        "next_fire_at": {"type": ["string", "null"], "format": "date-time"},
        "last_fired_at": {"type": ["string", "null"], "format": "date-time"},
        "created_at": {"type": "string", "format": "date-time"},
        "fire_count": {"type": "integer"},
        "last_error": {"type": ["string", "null"]},
        "human_readable": {"type": "string"},
        "consecutive_failures": {"type": "integer"},
        "next_fires": {"type": "array", "items": {"type": "string", "format": "date-time"}},
    },
}
_ONE = "/v1/schedules/{name}"
_NOT_FOUND = {404: Reply("No schedule of that name.")}
ROUTES = (
    Route(
        "POST", "/v1/schedules", "ScheduleService/CreateSchedule", create,
        "Create a schedule; 409 when the name is taken.", body=SCHEDULE_SCHEMA,
        replies={201: Reply("Created; Location names it.", _READ_SCHEMA),
                 409: Reply("A schedule of that name exists.")},
    ),
    Route(
        "GET", "/v1/schedules", "ScheduleService/ListSchedules", list_all,
        f"List schedules in name order, at most {LIST_MAX}.",
        params=(
            query_param("status", {"type": "string", "enum": list(_STATUSES)}, "Only these."),
            query_param("target_kind", {"type": "string", "enum": list(_TARGET_KINDS)},
                        "Only these."),
            query_param("name_prefix", {"type": "string"}, "Only names starting so."),
        ),
        replies={200: Reply("Schedules.", {"type": "array", "items": _READ_SCHEMA})},
    ),
    Route(
        "GET", _ONE, "ScheduleService/GetSchedule", get, "Read a schedule and its next fires.",
        params=(NAME,), replies={200: Reply("The schedule.", _READ_SCHEMA), **_NOT_FOUND},
    ),
    Route(
        "PUT", _ONE, "ScheduleService/UpdateSchedule", upsert,
        "Create or replace a schedule: 201 when new, 200 when updated.",
        params=(NAME,), body=SCHEDULE_SCHEMA,
        replies={201: Reply("Created.", _READ_SCHEMA), 200: Reply("Updated.", _READ_SCHEMA)},
    ),
    Route(
        "PATCH", _ONE, "ScheduleService/UpdateSchedule", update,
        'Change what the body gives; {"status": "paused"} pauses, "active" resumes.',
        params=(NAME,), body=SCHEDULE_SCHEMA,
        replies={200: Reply("Updated.", _READ_SCHEMA), **_NOT_FOUND},
    ),
    Route(
        "DELETE", _ONE, "ScheduleService/DeleteSchedule", delete,
        "Delete a schedule; 204 whether or not it existed.", params=(NAME,),
        replies={204: Reply("Gone.")},
    ),
    Route(
        "POST", _ONE + "/runs", "ScheduleService/RunSchedule", run,
        "Fire a schedule once now, out of band; its next fire time stays.", params=(NAME,),
        replies={202: Reply("Fired.", {"type": "object", "properties": {
            "schedule": {"type": "string"},
            "msg_ids": {"type": "array", "items": {"type": "integer"}},
            "fired_at": {"type": "string", "format": "date-time"}}}), **_NOT_FOUND},
    ),
    Route(
        "POST", "/v1/previews", "ScheduleService/PreviewSchedule", preview,
        "Dry-run a timing: its next fire times; nothing is stored.",
        body={"type": "object", "properties": {
            **_TIMING_SCHEMA,
            "count": {"type": "integer", "minimum": 1, "maximum": 100, "default": PREVIEW_COUNT},
            "name": {"type": "string", "description": "For the key's grant; optional."}}},
        replies={200: Reply("The next fire times.", {"type": "object"})},
    ),
)  # fmt: skip
