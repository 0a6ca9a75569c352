import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MessageState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MESSAGE_STATE_UNSPECIFIED: _ClassVar[MessageState]
    MESSAGE_STATE_VISIBLE: _ClassVar[MessageState]
    MESSAGE_STATE_IN_FLIGHT: _ClassVar[MessageState]
    MESSAGE_STATE_DELAYED: _ClassVar[MessageState]
    MESSAGE_STATE_DEAD: _ClassVar[MessageState]
    MESSAGE_STATE_SUCCEEDED: _ClassVar[MessageState]
    MESSAGE_STATE_FAILED: _ClassVar[MessageState]
    MESSAGE_STATE_DEAD_LETTERED: _ClassVar[MessageState]
    MESSAGE_STATE_EXPIRED: _ClassVar[MessageState]
    MESSAGE_STATE_CANCELLED: _ClassVar[MessageState]

class ArchiveReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ARCHIVE_REASON_UNSPECIFIED: _ClassVar[ArchiveReason]
    ARCHIVE_REASON_DELETED: _ClassVar[ArchiveReason]
    ARCHIVE_REASON_EXPIRED: _ClassVar[ArchiveReason]
    ARCHIVE_REASON_CANCELLED: _ClassVar[ArchiveReason]
    ARCHIVE_REASON_FAILED: _ClassVar[ArchiveReason]
MESSAGE_STATE_UNSPECIFIED: MessageState
MESSAGE_STATE_VISIBLE: MessageState
MESSAGE_STATE_IN_FLIGHT: MessageState
MESSAGE_STATE_DELAYED: MessageState
MESSAGE_STATE_DEAD: MessageState
MESSAGE_STATE_SUCCEEDED: MessageState
MESSAGE_STATE_FAILED: MessageState
MESSAGE_STATE_DEAD_LETTERED: MessageState
MESSAGE_STATE_EXPIRED: MessageState
MESSAGE_STATE_CANCELLED: MessageState
ARCHIVE_REASON_UNSPECIFIED: ArchiveReason
ARCHIVE_REASON_DELETED: ArchiveReason
ARCHIVE_REASON_EXPIRED: ArchiveReason
ARCHIVE_REASON_CANCELLED: ArchiveReason
ARCHIVE_REASON_FAILED: ArchiveReason

class AttributeValue(_message.Message):
    __slots__ = ("data_type", "string_value", "binary_value")
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BINARY_VALUE_FIELD_NUMBER: _ClassVar[int]
    data_type: str
    string_value: str
    binary_value: bytes
    def __init__(self, data_type: _Optional[str] = ..., string_value: _Optional[str] = ..., binary_value: _Optional[bytes] = ...) -> None: ...

class PayloadSchema(_message.Message):
    __slots__ = ("json_schema", "protobuf")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    PROTOBUF_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    protobuf: ProtobufSchema
    def __init__(self, json_schema: _Optional[str] = ..., protobuf: _Optional[_Union[ProtobufSchema, _Mapping]] = ...) -> None: ...

class ProtobufSchema(_message.Message):
    __slots__ = ("file_descriptor_set", "message_type")
    FILE_DESCRIPTOR_SET_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    file_descriptor_set: bytes
    message_type: str
    def __init__(self, file_descriptor_set: _Optional[bytes] = ..., message_type: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("message_id", "body", "attributes", "enqueue_time", "receive_count", "first_receive_time", "receipt", "priority", "message_group_id", "deduplication_id", "dead_letter_source_queue", "last_error", "state", "visible_time", "expire_time", "consumer_id", "receive_time", "finish_time", "result", "queue", "max_receive_count")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[AttributeValue, _Mapping]] = ...) -> None: ...
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ENQUEUE_TIME_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    FIRST_RECEIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_SOURCE_QUEUE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VISIBLE_TIME_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISH_TIME_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    body: bytes
    attributes: _containers.MessageMap[str, AttributeValue]
    enqueue_time: _timestamp_pb2.Timestamp
    receive_count: int
    first_receive_time: _timestamp_pb2.Timestamp
    receipt: str
    priority: int
    message_group_id: str
    deduplication_id: str
    dead_letter_source_queue: str
    last_error: str
    state: MessageState
    visible_time: _timestamp_pb2.Timestamp
    expire_time: _timestamp_pb2.Timestamp
    consumer_id: str
    receive_time: _timestamp_pb2.Timestamp
    finish_time: _timestamp_pb2.Timestamp
    result: bytes
    queue: str
    max_receive_count: int
    def __init__(self, message_id: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, AttributeValue]] = ..., enqueue_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receive_count: _Optional[int] = ..., first_receive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receipt: _Optional[str] = ..., priority: _Optional[int] = ..., message_group_id: _Optional[str] = ..., deduplication_id: _Optional[str] = ..., dead_letter_source_queue: _Optional[str] = ..., last_error: _Optional[str] = ..., state: _Optional[_Union[MessageState, str]] = ..., visible_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., consumer_id: _Optional[str] = ..., receive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result: _Optional[bytes] = ..., queue: _Optional[str] = ..., max_receive_count: _Optional[int] = ...) -> None: ...

class ArchivedMessage(_message.Message):
    __slots__ = ("message", "archive_time", "reason")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ARCHIVE_TIME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message: Message
    archive_time: _timestamp_pb2.Timestamp
    reason: ArchiveReason
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ..., archive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[_Union[ArchiveReason, str]] = ...) -> None: ...
