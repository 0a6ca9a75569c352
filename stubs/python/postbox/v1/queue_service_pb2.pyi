import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from postbox.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeduplicationScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEDUPLICATION_SCOPE_UNSPECIFIED: _ClassVar[DeduplicationScope]
    DEDUPLICATION_SCOPE_QUEUE: _ClassVar[DeduplicationScope]
    DEDUPLICATION_SCOPE_MESSAGE_GROUP: _ClassVar[DeduplicationScope]

class FifoThroughputLimit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FIFO_THROUGHPUT_LIMIT_UNSPECIFIED: _ClassVar[FifoThroughputLimit]
    FIFO_THROUGHPUT_LIMIT_PER_QUEUE: _ClassVar[FifoThroughputLimit]
    FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID: _ClassVar[FifoThroughputLimit]

class QueueView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUEUE_VIEW_UNSPECIFIED: _ClassVar[QueueView]
    QUEUE_VIEW_BASIC: _ClassVar[QueueView]
    QUEUE_VIEW_FULL: _ClassVar[QueueView]
DEDUPLICATION_SCOPE_UNSPECIFIED: DeduplicationScope
DEDUPLICATION_SCOPE_QUEUE: DeduplicationScope
DEDUPLICATION_SCOPE_MESSAGE_GROUP: DeduplicationScope
FIFO_THROUGHPUT_LIMIT_UNSPECIFIED: FifoThroughputLimit
FIFO_THROUGHPUT_LIMIT_PER_QUEUE: FifoThroughputLimit
FIFO_THROUGHPUT_LIMIT_PER_MESSAGE_GROUP_ID: FifoThroughputLimit
QUEUE_VIEW_UNSPECIFIED: QueueView
QUEUE_VIEW_BASIC: QueueView
QUEUE_VIEW_FULL: QueueView

class Queue(_message.Message):
    __slots__ = ("name", "visibility_timeout", "delivery_delay", "retention", "max_message_size", "receive_wait_time", "create_time", "update_time", "stats", "fifo", "content_based_deduplication", "deduplication_window", "dead_letter_policy", "redrive_allow_policy", "retry_policy", "archive_on_delete", "archive_retention", "max_depth", "receive_rate_limit", "send_paused", "receive_paused", "tags", "purge_time", "access_policy", "payload_schema", "deduplication_scope", "fifo_throughput_limit")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_DELAY_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_WAIT_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    FIFO_FIELD_NUMBER: _ClassVar[int]
    CONTENT_BASED_DEDUPLICATION_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_WINDOW_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_POLICY_FIELD_NUMBER: _ClassVar[int]
    REDRIVE_ALLOW_POLICY_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_ON_DELETE_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_RETENTION_FIELD_NUMBER: _ClassVar[int]
    MAX_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SEND_PAUSED_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_PAUSED_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PURGE_TIME_FIELD_NUMBER: _ClassVar[int]
    ACCESS_POLICY_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_SCOPE_FIELD_NUMBER: _ClassVar[int]
    FIFO_THROUGHPUT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    visibility_timeout: _duration_pb2.Duration
    delivery_delay: _duration_pb2.Duration
    retention: Retention
    max_message_size: int
    receive_wait_time: _duration_pb2.Duration
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    stats: QueueStats
    fifo: bool
    content_based_deduplication: bool
    deduplication_window: _duration_pb2.Duration
    dead_letter_policy: DeadLetterPolicy
    redrive_allow_policy: RedriveAllowPolicy
    retry_policy: RetryPolicy
    archive_on_delete: bool
    archive_retention: Retention
    max_depth: int
    receive_rate_limit: float
    send_paused: bool
    receive_paused: bool
    tags: _containers.ScalarMap[str, str]
    purge_time: _timestamp_pb2.Timestamp
    access_policy: str
    payload_schema: _message_pb2.PayloadSchema
    deduplication_scope: DeduplicationScope
    fifo_throughput_limit: FifoThroughputLimit
    def __init__(self, name: _Optional[str] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., delivery_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ..., max_message_size: _Optional[int] = ..., receive_wait_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., stats: _Optional[_Union[QueueStats, _Mapping]] = ..., fifo: _Optional[bool] = ..., content_based_deduplication: _Optional[bool] = ..., deduplication_window: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., dead_letter_policy: _Optional[_Union[DeadLetterPolicy, _Mapping]] = ..., redrive_allow_policy: _Optional[_Union[RedriveAllowPolicy, _Mapping]] = ..., retry_policy: _Optional[_Union[RetryPolicy, _Mapping]] = ..., archive_on_delete: _Optional[bool] = ..., archive_retention: _Optional[_Union[Retention, _Mapping]] = ..., max_depth: _Optional[int] = ..., receive_rate_limit: _Optional[float] = ..., send_paused: _Optional[bool] = ..., receive_paused: _Optional[bool] = ..., tags: _Optional[_Mapping[str, str]] = ..., purge_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., access_policy: _Optional[str] = ..., payload_schema: _Optional[_Union[_message_pb2.PayloadSchema, _Mapping]] = ..., deduplication_scope: _Optional[_Union[DeduplicationScope, str]] = ..., fifo_throughput_limit: _Optional[_Union[FifoThroughputLimit, str]] = ...) -> None: ...

class Retention(_message.Message):
    __slots__ = ("period",)
    PERIOD_FIELD_NUMBER: _ClassVar[int]
    period: _duration_pb2.Duration
    def __init__(self, period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class DeadLetterPolicy(_message.Message):
    __slots__ = ("dead_letter_queue", "max_receive_count")
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    dead_letter_queue: str
    max_receive_count: int
    def __init__(self, dead_letter_queue: _Optional[str] = ..., max_receive_count: _Optional[int] = ...) -> None: ...

class RedriveAllowPolicy(_message.Message):
    __slots__ = ("permission", "source_queues")
    class Permission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        PERMISSION_UNSPECIFIED: _ClassVar[RedriveAllowPolicy.Permission]
        PERMISSION_ALLOW_ALL: _ClassVar[RedriveAllowPolicy.Permission]
        PERMISSION_DENY_ALL: _ClassVar[RedriveAllowPolicy.Permission]
        PERMISSION_BY_QUEUE: _ClassVar[RedriveAllowPolicy.Permission]
    PERMISSION_UNSPECIFIED: RedriveAllowPolicy.Permission
    PERMISSION_ALLOW_ALL: RedriveAllowPolicy.Permission
    PERMISSION_DENY_ALL: RedriveAllowPolicy.Permission
    PERMISSION_BY_QUEUE: RedriveAllowPolicy.Permission
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_QUEUES_FIELD_NUMBER: _ClassVar[int]
    permission: RedriveAllowPolicy.Permission
    source_queues: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, permission: _Optional[_Union[RedriveAllowPolicy.Permission, str]] = ..., source_queues: _Optional[_Iterable[str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("minimum_backoff", "maximum_backoff")
    MINIMUM_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    minimum_backoff: _duration_pb2.Duration
    maximum_backoff: _duration_pb2.Duration
    def __init__(self, minimum_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., maximum_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class QueueStats(_message.Message):
    __slots__ = ("visible_messages", "in_flight_messages", "delayed_messages", "oldest_message_age", "sent_per_second", "received_per_second", "newest_message_age", "sent_messages_total")
    VISIBLE_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELAYED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_MESSAGE_AGE_FIELD_NUMBER: _ClassVar[int]
    SENT_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    NEWEST_MESSAGE_AGE_FIELD_NUMBER: _ClassVar[int]
    SENT_MESSAGES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    visible_messages: int
    in_flight_messages: int
    delayed_messages: int
    oldest_message_age: _duration_pb2.Duration
    sent_per_second: float
    received_per_second: float
    newest_message_age: _duration_pb2.Duration
    sent_messages_total: int
    def __init__(self, visible_messages: _Optional[int] = ..., in_flight_messages: _Optional[int] = ..., delayed_messages: _Optional[int] = ..., oldest_message_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., sent_per_second: _Optional[float] = ..., received_per_second: _Optional[float] = ..., newest_message_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., sent_messages_total: _Optional[int] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("queue", "with_dead_letter_queue", "dead_letter_max_receive_count")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    WITH_DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_MAX_RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    with_dead_letter_queue: bool
    dead_letter_max_receive_count: int
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., with_dead_letter_queue: _Optional[bool] = ..., dead_letter_max_receive_count: _Optional[int] = ...) -> None: ...

class CreateQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class GetQueueRequest(_message.Message):
    __slots__ = ("name", "view")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    name: str
    view: QueueView
    def __init__(self, name: _Optional[str] = ..., view: _Optional[_Union[QueueView, str]] = ...) -> None: ...

class GetQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "name_prefix", "view")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NAME_PREFIX_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    name_prefix: str
    view: QueueView
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., name_prefix: _Optional[str] = ..., view: _Optional[_Union[QueueView, str]] = ...) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues", "next_page_token")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    next_page_token: str
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("queue", "update_mask")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PurgeQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PurgeQueueResponse(_message.Message):
    __slots__ = ("purged_messages",)
    PURGED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    purged_messages: int
    def __init__(self, purged_messages: _Optional[int] = ...) -> None: ...

class PauseQueueRequest(_message.Message):
    __slots__ = ("name", "sends", "receives")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SENDS_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_FIELD_NUMBER: _ClassVar[int]
    name: str
    sends: bool
    receives: bool
    def __init__(self, name: _Optional[str] = ..., sends: _Optional[bool] = ..., receives: _Optional[bool] = ...) -> None: ...

class PauseQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class ResumeQueueRequest(_message.Message):
    __slots__ = ("name", "sends", "receives")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SENDS_FIELD_NUMBER: _ClassVar[int]
    RECEIVES_FIELD_NUMBER: _ClassVar[int]
    name: str
    sends: bool
    receives: bool
    def __init__(self, name: _Optional[str] = ..., sends: _Optional[bool] = ..., receives: _Optional[bool] = ...) -> None: ...

class ResumeQueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class ListDeadLetterSourceQueuesRequest(_message.Message):
    __slots__ = ("dead_letter_queue", "page_size", "page_token")
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letter_queue: str
    page_size: int
    page_token: str
    def __init__(self, dead_letter_queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListDeadLetterSourceQueuesResponse(_message.Message):
    __slots__ = ("queue_names", "next_page_token")
    QUEUE_NAMES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue_names: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, queue_names: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class RedriveTask(_message.Message):
    __slots__ = ("task_id", "dead_letter_queue", "destination", "max_messages", "max_messages_per_second", "state", "moved_messages", "messages_to_move", "failure_reason", "create_time", "update_time", "message_ids")
    class State(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATE_UNSPECIFIED: _ClassVar[RedriveTask.State]
        STATE_RUNNING: _ClassVar[RedriveTask.State]
        STATE_COMPLETED: _ClassVar[RedriveTask.State]
        STATE_CANCELLED: _ClassVar[RedriveTask.State]
        STATE_FAILED: _ClassVar[RedriveTask.State]
    STATE_UNSPECIFIED: RedriveTask.State
    STATE_RUNNING: RedriveTask.State
    STATE_COMPLETED: RedriveTask.State
    STATE_CANCELLED: RedriveTask.State
    STATE_FAILED: RedriveTask.State
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MOVED_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_TO_MOVE_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    dead_letter_queue: str
    destination: str
    max_messages: int
    max_messages_per_second: float
    state: RedriveTask.State
    moved_messages: int
    messages_to_move: int
    failure_reason: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, task_id: _Optional[str] = ..., dead_letter_queue: _Optional[str] = ..., destination: _Optional[str] = ..., max_messages: _Optional[int] = ..., max_messages_per_second: _Optional[float] = ..., state: _Optional[_Union[RedriveTask.State, str]] = ..., moved_messages: _Optional[int] = ..., messages_to_move: _Optional[int] = ..., failure_reason: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RedriveMessagesRequest(_message.Message):
    __slots__ = ("dead_letter_queue", "destination", "max_messages", "max_messages_per_second", "message_ids")
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    dead_letter_queue: str
    destination: str
    max_messages: int
    max_messages_per_second: float
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, dead_letter_queue: _Optional[str] = ..., destination: _Optional[str] = ..., max_messages: _Optional[int] = ..., max_messages_per_second: _Optional[float] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class RedriveMessagesResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: RedriveTask
    def __init__(self, task: _Optional[_Union[RedriveTask, _Mapping]] = ...) -> None: ...

class ListRedriveTasksRequest(_message.Message):
    __slots__ = ("dead_letter_queue", "page_size", "page_token")
    DEAD_LETTER_QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letter_queue: str
    page_size: int
    page_token: str
    def __init__(self, dead_letter_queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRedriveTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_page_token")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[RedriveTask]
    next_page_token: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[RedriveTask, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRedriveTaskRequest(_message.Message):
    __slots__ = ("task_id",)
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    def __init__(self, task_id: _Optional[str] = ...) -> None: ...

class CancelRedriveTaskResponse(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: RedriveTask
    def __init__(self, task: _Optional[_Union[RedriveTask, _Mapping]] = ...) -> None: ...
