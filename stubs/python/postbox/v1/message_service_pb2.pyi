import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from postbox.v1 import message_pb2 as _message_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReceiveMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECEIVE_MODE_UNSPECIFIED: _ClassVar[ReceiveMode]
    RECEIVE_MODE_LONG_POLL: _ClassVar[ReceiveMode]
    RECEIVE_MODE_CONTINUOUS: _ClassVar[ReceiveMode]
RECEIVE_MODE_UNSPECIFIED: ReceiveMode
RECEIVE_MODE_LONG_POLL: ReceiveMode
RECEIVE_MODE_CONTINUOUS: ReceiveMode

class SendRequest(_message.Message):
    __slots__ = ("queue", "body", "attributes", "delay", "deliver_at", "message_group_id", "deduplication_id", "dedupe_key", "priority", "ttl", "expire_time", "max_receive_count", "relaxed_durability")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    RELAXED_DURABILITY_FIELD_NUMBER: _ClassVar[int]
    queue: str
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    delay: _duration_pb2.Duration
    deliver_at: _timestamp_pb2.Timestamp
    message_group_id: str
    deduplication_id: str
    dedupe_key: str
    priority: int
    ttl: _duration_pb2.Duration
    expire_time: _timestamp_pb2.Timestamp
    max_receive_count: int
    relaxed_durability: bool
    def __init__(self, queue: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message_group_id: _Optional[str] = ..., deduplication_id: _Optional[str] = ..., dedupe_key: _Optional[str] = ..., priority: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_receive_count: _Optional[int] = ..., relaxed_durability: _Optional[bool] = ...) -> None: ...

class SendResponse(_message.Message):
    __slots__ = ("message_id", "duplicate")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    duplicate: bool
    def __init__(self, message_id: _Optional[str] = ..., duplicate: _Optional[bool] = ...) -> None: ...

class SendBatchEntry(_message.Message):
    __slots__ = ("body", "attributes", "delay", "deliver_at", "message_group_id", "deduplication_id", "dedupe_key", "priority", "ttl", "expire_time", "max_receive_count")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    DELIVER_AT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    DEDUPE_KEY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_RECEIVE_COUNT_FIELD_NUMBER: _ClassVar[int]
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    delay: _duration_pb2.Duration
    deliver_at: _timestamp_pb2.Timestamp
    message_group_id: str
    deduplication_id: str
    dedupe_key: str
    priority: int
    ttl: _duration_pb2.Duration
    expire_time: _timestamp_pb2.Timestamp
    max_receive_count: int
    def __init__(self, body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., deliver_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., message_group_id: _Optional[str] = ..., deduplication_id: _Optional[str] = ..., dedupe_key: _Optional[str] = ..., priority: _Optional[int] = ..., ttl: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_receive_count: _Optional[int] = ...) -> None: ...

class SendBatchRequest(_message.Message):
    __slots__ = ("queue", "entries", "relaxed_durability", "request_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    RELAXED_DURABILITY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    entries: _containers.RepeatedCompositeFieldContainer[SendBatchEntry]
    relaxed_durability: bool
    request_id: str
    def __init__(self, queue: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[SendBatchEntry, _Mapping]]] = ..., relaxed_durability: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class SendBatchResponse(_message.Message):
    __slots__ = ("message_ids", "duplicates")
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    duplicates: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, message_ids: _Optional[_Iterable[str]] = ..., duplicates: _Optional[_Iterable[bool]] = ...) -> None: ...

class SendStreamRequest(_message.Message):
    __slots__ = ("tag", "send", "more")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    tag: int
    send: SendRequest
    more: _containers.RepeatedCompositeFieldContainer[SendStreamEntry]
    def __init__(self, tag: _Optional[int] = ..., send: _Optional[_Union[SendRequest, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SendStreamEntry, _Mapping]]] = ...) -> None: ...

class SendStreamEntry(_message.Message):
    __slots__ = ("tag", "send")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SEND_FIELD_NUMBER: _ClassVar[int]
    tag: int
    send: SendRequest
    def __init__(self, tag: _Optional[int] = ..., send: _Optional[_Union[SendRequest, _Mapping]] = ...) -> None: ...

class SendStreamResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendStreamResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendStreamResult, _Mapping]]] = ...) -> None: ...

class SendStreamResult(_message.Message):
    __slots__ = ("tag", "sent", "error")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    tag: int
    sent: SendResponse
    error: _status_pb2.Status
    def __init__(self, tag: _Optional[int] = ..., sent: _Optional[_Union[SendResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class SendBatchStreamRequest(_message.Message):
    __slots__ = ("tag", "batch")
    TAG_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    tag: int
    batch: SendBatchRequest
    def __init__(self, tag: _Optional[int] = ..., batch: _Optional[_Union[SendBatchRequest, _Mapping]] = ...) -> None: ...

class SendBatchStreamResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendBatchStreamResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendBatchStreamResult, _Mapping]]] = ...) -> None: ...

class SendBatchStreamResult(_message.Message):
    __slots__ = ("tag", "sent", "error")
    TAG_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    tag: int
    sent: SendBatchResponse
    error: _status_pb2.Status
    def __init__(self, tag: _Optional[int] = ..., sent: _Optional[_Union[SendBatchResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class ReceiveRequest(_message.Message):
    __slots__ = ("queue", "max_messages", "visibility_timeout", "wait_time", "mode", "max_total_messages", "idle_timeout", "consumer_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIME_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MAX_TOTAL_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_messages: int
    visibility_timeout: _duration_pb2.Duration
    wait_time: _duration_pb2.Duration
    mode: ReceiveMode
    max_total_messages: int
    idle_timeout: _duration_pb2.Duration
    consumer_id: str
    def __init__(self, queue: _Optional[str] = ..., max_messages: _Optional[int] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., wait_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., mode: _Optional[_Union[ReceiveMode, str]] = ..., max_total_messages: _Optional[int] = ..., idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., consumer_id: _Optional[str] = ...) -> None: ...

class ReceiveResponse(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ...) -> None: ...

class StreamingReceiveRequest(_message.Message):
    __slots__ = ("queue", "max_messages", "visibility_timeout", "max_outstanding_messages", "delete_receipts", "nack_receipts", "visibility_changes", "consumer_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTSTANDING_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    DELETE_RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    NACK_RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_CHANGES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    max_messages: int
    visibility_timeout: _duration_pb2.Duration
    max_outstanding_messages: int
    delete_receipts: _containers.RepeatedScalarFieldContainer[str]
    nack_receipts: _containers.RepeatedScalarFieldContainer[str]
    visibility_changes: _containers.RepeatedCompositeFieldContainer[ChangeVisibilityBatchEntry]
    consumer_id: str
    def __init__(self, queue: _Optional[str] = ..., max_messages: _Optional[int] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_outstanding_messages: _Optional[int] = ..., delete_receipts: _Optional[_Iterable[str]] = ..., nack_receipts: _Optional[_Iterable[str]] = ..., visibility_changes: _Optional[_Iterable[_Union[ChangeVisibilityBatchEntry, _Mapping]]] = ..., consumer_id: _Optional[str] = ...) -> None: ...

class StreamingReceiveResponse(_message.Message):
    __slots__ = ("batch", "settle_results")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    SETTLE_RESULTS_FIELD_NUMBER: _ClassVar[int]
    batch: MessageBatch
    settle_results: SettleResults
    def __init__(self, batch: _Optional[_Union[MessageBatch, _Mapping]] = ..., settle_results: _Optional[_Union[SettleResults, _Mapping]] = ...) -> None: ...

class MessageBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ...) -> None: ...

class SettleResults(_message.Message):
    __slots__ = ("deletes", "nacks", "visibility_changes")
    DELETES_FIELD_NUMBER: _ClassVar[int]
    NACKS_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_CHANGES_FIELD_NUMBER: _ClassVar[int]
    deletes: _containers.RepeatedCompositeFieldContainer[_status_pb2.Status]
    nacks: _containers.RepeatedCompositeFieldContainer[_status_pb2.Status]
    visibility_changes: _containers.RepeatedCompositeFieldContainer[_status_pb2.Status]
    def __init__(self, deletes: _Optional[_Iterable[_Union[_status_pb2.Status, _Mapping]]] = ..., nacks: _Optional[_Iterable[_Union[_status_pb2.Status, _Mapping]]] = ..., visibility_changes: _Optional[_Iterable[_Union[_status_pb2.Status, _Mapping]]] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("queue", "receipt", "result")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    receipt: str
    result: bytes
    def __init__(self, queue: _Optional[str] = ..., receipt: _Optional[str] = ..., result: _Optional[bytes] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteBatchRequest(_message.Message):
    __slots__ = ("queue", "receipts", "results")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    queue: str
    receipts: _containers.RepeatedScalarFieldContainer[str]
    results: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, queue: _Optional[str] = ..., receipts: _Optional[_Iterable[str]] = ..., results: _Optional[_Iterable[bytes]] = ...) -> None: ...

class DeleteBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_status_pb2.Status]
    def __init__(self, results: _Optional[_Iterable[_Union[_status_pb2.Status, _Mapping]]] = ...) -> None: ...

class ChangeVisibilityRequest(_message.Message):
    __slots__ = ("queue", "receipt", "visibility_timeout")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    queue: str
    receipt: str
    visibility_timeout: _duration_pb2.Duration
    def __init__(self, queue: _Optional[str] = ..., receipt: _Optional[str] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ChangeVisibilityResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ChangeVisibilityBatchEntry(_message.Message):
    __slots__ = ("receipt", "visibility_timeout")
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    VISIBILITY_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    receipt: str
    visibility_timeout: _duration_pb2.Duration
    def __init__(self, receipt: _Optional[str] = ..., visibility_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class ChangeVisibilityBatchRequest(_message.Message):
    __slots__ = ("queue", "entries")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    queue: str
    entries: _containers.RepeatedCompositeFieldContainer[ChangeVisibilityBatchEntry]
    def __init__(self, queue: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ChangeVisibilityBatchEntry, _Mapping]]] = ...) -> None: ...

class ChangeVisibilityBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[_status_pb2.Status]
    def __init__(self, results: _Optional[_Iterable[_Union[_status_pb2.Status, _Mapping]]] = ...) -> None: ...

class NackRequest(_message.Message):
    __slots__ = ("queue", "receipt", "delay", "error", "dead_letter")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    RECEIPT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    queue: str
    receipt: str
    delay: _duration_pb2.Duration
    error: str
    dead_letter: bool
    def __init__(self, queue: _Optional[str] = ..., receipt: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., error: _Optional[str] = ..., dead_letter: _Optional[bool] = ...) -> None: ...

class NackResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PeekMessagesRequest(_message.Message):
    __slots__ = ("queue", "state", "page_size", "page_token")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    state: _message_pb2.MessageState
    page_size: int
    page_token: str
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[_Union[_message_pb2.MessageState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class PeekMessagesResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetMessageRequest(_message.Message):
    __slots__ = ("queue", "message_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    message_id: str
    def __init__(self, queue: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class GetMessageResponse(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: _message_pb2.Message
    def __init__(self, message: _Optional[_Union[_message_pb2.Message, _Mapping]] = ...) -> None: ...

class ListArchivedMessagesRequest(_message.Message):
    __slots__ = ("queue", "page_size", "page_token")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    page_size: int
    page_token: str
    def __init__(self, queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class CancelMessageRequest(_message.Message):
    __slots__ = ("queue", "message_id")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    queue: str
    message_id: str
    def __init__(self, queue: _Optional[str] = ..., message_id: _Optional[str] = ...) -> None: ...

class CancelMessageResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListArchivedMessagesResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.ArchivedMessage]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.ArchivedMessage, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListMessagesRequest(_message.Message):
    __slots__ = ("queue", "state", "page_size", "page_token")
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    queue: str
    state: _message_pb2.MessageState
    page_size: int
    page_token: str
    def __init__(self, queue: _Optional[str] = ..., state: _Optional[_Union[_message_pb2.MessageState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListMessagesResponse(_message.Message):
    __slots__ = ("messages", "next_page_token")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[_message_pb2.Message]
    next_page_token: str
    def __init__(self, messages: _Optional[_Iterable[_Union[_message_pb2.Message, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
