import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from postbox.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CronSpec(_message.Message):
    __slots__ = ("expression", "time_zone")
    EXPRESSION_FIELD_NUMBER: _ClassVar[int]
    TIME_ZONE_FIELD_NUMBER: _ClassVar[int]
    expression: str
    time_zone: str
    def __init__(self, expression: _Optional[str] = ..., time_zone: _Optional[str] = ...) -> None: ...

class ScheduleTarget(_message.Message):
    __slots__ = ("queue", "topic", "routing_key")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    topic: str
    routing_key: str
    def __init__(self, queue: _Optional[str] = ..., topic: _Optional[str] = ..., routing_key: _Optional[str] = ...) -> None: ...

class Schedule(_message.Message):
    __slots__ = ("name", "cron", "interval", "run_at", "target", "body", "attributes", "paused", "next_fire_time", "last_fire_time", "create_time", "last_error", "fire_count", "catch_up_limit", "failure_threshold", "consecutive_failures", "human_readable", "next_fire_times")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    RUN_AT_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_FIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    FIRE_COUNT_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    FAILURE_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    HUMAN_READABLE_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIRE_TIMES_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: CronSpec
    interval: _duration_pb2.Duration
    run_at: _timestamp_pb2.Timestamp
    target: ScheduleTarget
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    paused: bool
    next_fire_time: _timestamp_pb2.Timestamp
    last_fire_time: _timestamp_pb2.Timestamp
    create_time: _timestamp_pb2.Timestamp
    last_error: str
    fire_count: int
    catch_up_limit: int
    failure_threshold: int
    consecutive_failures: int
    human_readable: str
    next_fire_times: _containers.RepeatedCompositeFieldContainer[_timestamp_pb2.Timestamp]
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[_Union[CronSpec, _Mapping]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., run_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., target: _Optional[_Union[ScheduleTarget, _Mapping]] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., paused: _Optional[bool] = ..., next_fire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_fire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_error: _Optional[str] = ..., fire_count: _Optional[int] = ..., catch_up_limit: _Optional[int] = ..., failure_threshold: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., human_readable: _Optional[str] = ..., next_fire_times: _Optional[_Iterable[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]] = ...) -> None: ...

class CreateScheduleRequest(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class CreateScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class GetScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ListSchedulesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "paused", "target_kind", "name_prefix")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    TARGET_KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    paused: bool
    target_kind: str
    name_prefix: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., paused: _Optional[bool] = ..., target_kind: _Optional[str] = ..., name_prefix: _Optional[str] = ...) -> None: ...

class ListSchedulesResponse(_message.Message):
    __slots__ = ("schedules", "next_page_token")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[Schedule]
    next_page_token: str
    def __init__(self, schedules: _Optional[_Iterable[_Union[Schedule, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateScheduleRequest(_message.Message):
    __slots__ = ("schedule", "update_mask", "allow_missing")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    ALLOW_MISSING_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    update_mask: _field_mask_pb2.FieldMask
    allow_missing: bool
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ..., allow_missing: _Optional[bool] = ...) -> None: ...

class UpdateScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class DeleteScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteScheduleResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PauseScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class ResumeScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ResumeScheduleResponse(_message.Message):
    __slots__ = ("schedule",)
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...

class RunScheduleRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RunScheduleResponse(_message.Message):
    __slots__ = ("schedule", "message_ids")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PreviewScheduleRequest(_message.Message):
    __slots__ = ("schedule", "count", "start_time")
    SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    schedule: Schedule
    count: int
    start_time: _timestamp_pb2.Timestamp
    def __init__(self, schedule: _Optional[_Union[Schedule, _Mapping]] = ..., count: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PreviewScheduleResponse(_message.Message):
    __slots__ = ("fire_times", "human_readable", "canonical")
    FIRE_TIMES_FIELD_NUMBER: _ClassVar[int]
    HUMAN_READABLE_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_FIELD_NUMBER: _ClassVar[int]
    fire_times: _containers.RepeatedCompositeFieldContainer[_timestamp_pb2.Timestamp]
    human_readable: str
    canonical: Schedule
    def __init__(self, fire_times: _Optional[_Iterable[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]]] = ..., human_readable: _Optional[str] = ..., canonical: _Optional[_Union[Schedule, _Mapping]] = ...) -> None: ...
