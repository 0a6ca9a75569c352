import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttributeValue(_message.Message):
    __slots__ = ("data_type", "string_value", "binary_value")
    DATA_TYPE_FIELD_NUMBER: _ClassVar[int]
    STRING_VALUE_FIELD_NUMBER: _ClassVar[int]
    BINARY_VALUE_FIELD_NUMBER: _ClassVar[int]
    data_type: str
    string_value: str
    binary_value: bytes
    def __init__(self, data_type: _Optional[str] = ..., string_value: _Optional[str] = ..., binary_value: _Optional[bytes] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("message_id", "body", "attributes", "enqueue_time", "receive_count", "first_receive_time", "receipt")
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
    message_id: str
    body: bytes
    attributes: _containers.MessageMap[str, AttributeValue]
    enqueue_time: _timestamp_pb2.Timestamp
    receive_count: int
    first_receive_time: _timestamp_pb2.Timestamp
    receipt: str
    def __init__(self, message_id: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, AttributeValue]] = ..., enqueue_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receive_count: _Optional[int] = ..., first_receive_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., receipt: _Optional[str] = ...) -> None: ...

class BatchEntryStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
