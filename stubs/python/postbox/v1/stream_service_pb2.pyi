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

class StreamStart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STREAM_START_UNSPECIFIED: _ClassVar[StreamStart]
    STREAM_START_EARLIEST: _ClassVar[StreamStart]
    STREAM_START_LATEST: _ClassVar[StreamStart]
    STREAM_START_TIME: _ClassVar[StreamStart]
STREAM_START_UNSPECIFIED: StreamStart
STREAM_START_EARLIEST: StreamStart
STREAM_START_LATEST: StreamStart
STREAM_START_TIME: StreamStart

class StreamPosition(_message.Message):
    __slots__ = ("tx", "offset")
    TX_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    tx: int
    offset: int
    def __init__(self, tx: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class ConsumerGroup(_message.Message):
    __slots__ = ("topic", "name", "create_time", "cursor_offset", "ack_time", "lease_expire_time", "lag_messages", "lag", "paused", "retry_messages", "max_deliveries", "dead_letter_messages")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CURSOR_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ACK_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    LAG_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    RETRY_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    create_time: _timestamp_pb2.Timestamp
    cursor_offset: int
    ack_time: _timestamp_pb2.Timestamp
    lease_expire_time: _timestamp_pb2.Timestamp
    lag_messages: int
    lag: _duration_pb2.Duration
    paused: bool
    retry_messages: int
    max_deliveries: int
    dead_letter_messages: int
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cursor_offset: _Optional[int] = ..., ack_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lag_messages: _Optional[int] = ..., lag: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., paused: _Optional[bool] = ..., retry_messages: _Optional[int] = ..., max_deliveries: _Optional[int] = ..., dead_letter_messages: _Optional[int] = ...) -> None: ...

class StreamDeadLetter(_message.Message):
    __slots__ = ("message", "dead_time", "reason")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DEAD_TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message: StreamMessage
    dead_time: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, message: _Optional[_Union[StreamMessage, _Mapping]] = ..., dead_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class StreamMessage(_message.Message):
    __slots__ = ("offset", "publish_id", "publish_time", "routing_key", "ordering_key", "subject", "body", "attributes", "delivery_count")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    offset: int
    publish_id: str
    publish_time: _timestamp_pb2.Timestamp
    routing_key: str
    ordering_key: str
    subject: str
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    delivery_count: int
    def __init__(self, offset: _Optional[int] = ..., publish_id: _Optional[str] = ..., publish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., routing_key: _Optional[str] = ..., ordering_key: _Optional[str] = ..., subject: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class CreateConsumerGroupRequest(_message.Message):
    __slots__ = ("consumer_group", "start", "start_time")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    start: StreamStart
    start_time: _timestamp_pb2.Timestamp
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ..., start: _Optional[_Union[StreamStart, str]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CreateConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class GetConsumerGroupRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class ListConsumerGroupsRequest(_message.Message):
    __slots__ = ("topic", "page_size", "page_token")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    page_size: int
    page_token: str
    def __init__(self, topic: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListConsumerGroupsResponse(_message.Message):
    __slots__ = ("consumer_groups", "next_page_token")
    CONSUMER_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    consumer_groups: _containers.RepeatedCompositeFieldContainer[ConsumerGroup]
    next_page_token: str
    def __init__(self, consumer_groups: _Optional[_Iterable[_Union[ConsumerGroup, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteConsumerGroupRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteConsumerGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseConsumerGroupRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class PauseConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class ResumeConsumerGroupRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ResumeConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class UpdateConsumerGroupRequest(_message.Message):
    __slots__ = ("consumer_group", "update_mask")
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class ListStreamDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "page_size", "page_token")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    page_size: int
    page_token: str
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListStreamDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters", "next_page_token")
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[StreamDeadLetter]
    next_page_token: str
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[StreamDeadLetter, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ReplayStreamDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "offsets")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class ReplayStreamDeadLettersResponse(_message.Message):
    __slots__ = ("replayed_count",)
    REPLAYED_COUNT_FIELD_NUMBER: _ClassVar[int]
    replayed_count: int
    def __init__(self, replayed_count: _Optional[int] = ...) -> None: ...

class PurgeStreamDeadLettersRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "older_than")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    OLDER_THAN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    older_than: _timestamp_pb2.Timestamp
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., older_than: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PurgeStreamDeadLettersResponse(_message.Message):
    __slots__ = ("purged_count",)
    PURGED_COUNT_FIELD_NUMBER: _ClassVar[int]
    purged_count: int
    def __init__(self, purged_count: _Optional[int] = ...) -> None: ...

class ReadStreamRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "max_messages", "min_messages", "max_batch_wait", "wait_time", "lease_duration")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MIN_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIME_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    max_messages: int
    min_messages: int
    max_batch_wait: _duration_pb2.Duration
    wait_time: _duration_pb2.Duration
    lease_duration: _duration_pb2.Duration
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., max_messages: _Optional[int] = ..., min_messages: _Optional[int] = ..., max_batch_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ReadStreamResponse(_message.Message):
    __slots__ = ("batch", "messages", "delivery_count")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    batch: str
    messages: _containers.RepeatedCompositeFieldContainer[StreamMessage]
    delivery_count: int
    def __init__(self, batch: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[StreamMessage, _Mapping]]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class StreamingReadStreamRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "max_messages", "min_messages", "max_batch_wait", "lease_duration")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MIN_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_WAIT_FIELD_NUMBER: _ClassVar[int]
    LEASE_DURATION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    max_messages: int
    min_messages: int
    max_batch_wait: _duration_pb2.Duration
    lease_duration: _duration_pb2.Duration
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., max_messages: _Optional[int] = ..., min_messages: _Optional[int] = ..., max_batch_wait: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., lease_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class StreamingReadStreamResponse(_message.Message):
    __slots__ = ("batch", "messages", "delivery_count")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    batch: str
    messages: _containers.RepeatedCompositeFieldContainer[StreamMessage]
    delivery_count: int
    def __init__(self, batch: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[StreamMessage, _Mapping]]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class AckStreamRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "batch", "nack_offsets", "nack_delay")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    NACK_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    NACK_DELAY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    batch: str
    nack_offsets: _containers.RepeatedScalarFieldContainer[int]
    nack_delay: _duration_pb2.Duration
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., batch: _Optional[str] = ..., nack_offsets: _Optional[_Iterable[int]] = ..., nack_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class AckStreamResponse(_message.Message):
    __slots__ = ("cursor_offset",)
    CURSOR_OFFSET_FIELD_NUMBER: _ClassVar[int]
    cursor_offset: int
    def __init__(self, cursor_offset: _Optional[int] = ...) -> None: ...

class SeekConsumerGroupRequest(_message.Message):
    __slots__ = ("topic", "consumer_group", "offset", "time", "position")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    offset: int
    time: _timestamp_pb2.Timestamp
    position: StreamPosition
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ..., offset: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., position: _Optional[_Union[StreamPosition, _Mapping]] = ...) -> None: ...

class SeekConsumerGroupResponse(_message.Message):
    __slots__ = ("consumer_group",)
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    consumer_group: ConsumerGroup
    def __init__(self, consumer_group: _Optional[_Union[ConsumerGroup, _Mapping]] = ...) -> None: ...

class ReadStreamRangeRequest(_message.Message):
    __slots__ = ("topic", "after", "until", "max_messages", "positions_only")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_ONLY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    after: StreamPosition
    until: StreamPosition
    max_messages: int
    positions_only: bool
    def __init__(self, topic: _Optional[str] = ..., after: _Optional[_Union[StreamPosition, _Mapping]] = ..., until: _Optional[_Union[StreamPosition, _Mapping]] = ..., max_messages: _Optional[int] = ..., positions_only: _Optional[bool] = ...) -> None: ...

class ReadStreamRangeResponse(_message.Message):
    __slots__ = ("messages", "last_position", "message_count")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_COUNT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[StreamMessage]
    last_position: StreamPosition
    message_count: int
    def __init__(self, messages: _Optional[_Iterable[_Union[StreamMessage, _Mapping]]] = ..., last_position: _Optional[_Union[StreamPosition, _Mapping]] = ..., message_count: _Optional[int] = ...) -> None: ...

class GetStreamPositionRequest(_message.Message):
    __slots__ = ("topic", "consumer_group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    consumer_group: str
    def __init__(self, topic: _Optional[str] = ..., consumer_group: _Optional[str] = ...) -> None: ...

class GetStreamPositionResponse(_message.Message):
    __slots__ = ("cursor_position", "end_position")
    CURSOR_POSITION_FIELD_NUMBER: _ClassVar[int]
    END_POSITION_FIELD_NUMBER: _ClassVar[int]
    cursor_position: StreamPosition
    end_position: StreamPosition
    def __init__(self, cursor_position: _Optional[_Union[StreamPosition, _Mapping]] = ..., end_position: _Optional[_Union[StreamPosition, _Mapping]] = ...) -> None: ...
