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

class FilterPolicyScope(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILTER_POLICY_SCOPE_UNSPECIFIED: _ClassVar[FilterPolicyScope]
    FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES: _ClassVar[FilterPolicyScope]
    FILTER_POLICY_SCOPE_MESSAGE_BODY: _ClassVar[FilterPolicyScope]

class WebhookDeliveryState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEBHOOK_DELIVERY_STATE_UNSPECIFIED: _ClassVar[WebhookDeliveryState]
    WEBHOOK_DELIVERY_STATE_PENDING: _ClassVar[WebhookDeliveryState]
    WEBHOOK_DELIVERY_STATE_FAILED: _ClassVar[WebhookDeliveryState]
FILTER_POLICY_SCOPE_UNSPECIFIED: FilterPolicyScope
FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES: FilterPolicyScope
FILTER_POLICY_SCOPE_MESSAGE_BODY: FilterPolicyScope
WEBHOOK_DELIVERY_STATE_UNSPECIFIED: WebhookDeliveryState
WEBHOOK_DELIVERY_STATE_PENDING: WebhookDeliveryState
WEBHOOK_DELIVERY_STATE_FAILED: WebhookDeliveryState

class Topic(_message.Message):
    __slots__ = ("name", "create_time", "tags", "sns_attributes", "stream_retention", "payload_schema")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SnsAttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    SNS_ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    STREAM_RETENTION_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    create_time: _timestamp_pb2.Timestamp
    tags: _containers.ScalarMap[str, str]
    sns_attributes: _containers.ScalarMap[str, str]
    stream_retention: _duration_pb2.Duration
    payload_schema: _message_pb2.PayloadSchema
    def __init__(self, name: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tags: _Optional[_Mapping[str, str]] = ..., sns_attributes: _Optional[_Mapping[str, str]] = ..., stream_retention: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., payload_schema: _Optional[_Union[_message_pb2.PayloadSchema, _Mapping]] = ...) -> None: ...

class WebhookEndpoint(_message.Message):
    __slots__ = ("url", "secret", "timeout", "max_attempts", "minimum_backoff", "maximum_backoff")
    URL_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_BACKOFF_FIELD_NUMBER: _ClassVar[int]
    url: str
    secret: str
    timeout: _duration_pb2.Duration
    max_attempts: int
    minimum_backoff: _duration_pb2.Duration
    maximum_backoff: _duration_pb2.Duration
    def __init__(self, url: _Optional[str] = ..., secret: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., max_attempts: _Optional[int] = ..., minimum_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., maximum_backoff: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("name", "topic", "pattern", "queue", "webhook", "create_time", "filter_policy", "filter_policy_scope", "sns_delivery", "suspended")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    FILTER_POLICY_FIELD_NUMBER: _ClassVar[int]
    FILTER_POLICY_SCOPE_FIELD_NUMBER: _ClassVar[int]
    SNS_DELIVERY_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic: str
    pattern: str
    queue: str
    webhook: WebhookEndpoint
    create_time: _timestamp_pb2.Timestamp
    filter_policy: str
    filter_policy_scope: FilterPolicyScope
    sns_delivery: SnsDelivery
    suspended: bool
    def __init__(self, name: _Optional[str] = ..., topic: _Optional[str] = ..., pattern: _Optional[str] = ..., queue: _Optional[str] = ..., webhook: _Optional[_Union[WebhookEndpoint, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., filter_policy: _Optional[str] = ..., filter_policy_scope: _Optional[_Union[FilterPolicyScope, str]] = ..., sns_delivery: _Optional[_Union[SnsDelivery, _Mapping]] = ..., suspended: _Optional[bool] = ...) -> None: ...

class SnsDelivery(_message.Message):
    __slots__ = ("topic_arn", "subscription_arn", "unsubscribe_url", "raw", "attributes")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_ARN_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ARN_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_URL_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    topic_arn: str
    subscription_arn: str
    unsubscribe_url: str
    raw: bool
    attributes: _containers.ScalarMap[str, str]
    def __init__(self, topic_arn: _Optional[str] = ..., subscription_arn: _Optional[str] = ..., unsubscribe_url: _Optional[str] = ..., raw: _Optional[bool] = ..., attributes: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class CreateTopicResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class GetTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetTopicResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class UpdateTopicRequest(_message.Message):
    __slots__ = ("topic", "update_mask")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateTopicResponse(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: Topic
    def __init__(self, topic: _Optional[_Union[Topic, _Mapping]] = ...) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics", "next_page_token")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[Topic]
    next_page_token: str
    def __init__(self, topics: _Optional[_Iterable[_Union[Topic, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CreateSubscriptionRequest(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class CreateSubscriptionResponse(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class GetSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class GetSubscriptionResponse(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class ListSubscriptionsRequest(_message.Message):
    __slots__ = ("topic", "page_size", "page_token")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    page_size: int
    page_token: str
    def __init__(self, topic: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListSubscriptionsResponse(_message.Message):
    __slots__ = ("subscriptions", "next_page_token")
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    next_page_token: str
    def __init__(self, subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteSubscriptionRequest(_message.Message):
    __slots__ = ("topic", "name")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    topic: str
    name: str
    def __init__(self, topic: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class DeleteSubscriptionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class UpdateSubscriptionRequest(_message.Message):
    __slots__ = ("subscription", "update_mask")
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class UpdateSubscriptionResponse(_message.Message):
    __slots__ = ("subscription",)
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    subscription: Subscription
    def __init__(self, subscription: _Optional[_Union[Subscription, _Mapping]] = ...) -> None: ...

class RetryWebhookDeliveryRequest(_message.Message):
    __slots__ = ("topic", "subscription", "delivery_id")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    delivery_id: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., delivery_id: _Optional[str] = ...) -> None: ...

class RetryWebhookDeliveryResponse(_message.Message):
    __slots__ = ("retried_deliveries",)
    RETRIED_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    retried_deliveries: int
    def __init__(self, retried_deliveries: _Optional[int] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("topic", "routing_key", "body", "attributes", "ordering_key", "deduplication_id", "subject", "stream_delay", "delay")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    STREAM_DELAY_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    topic: str
    routing_key: str
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    ordering_key: str
    deduplication_id: str
    subject: str
    stream_delay: _duration_pb2.Duration
    delay: _duration_pb2.Duration
    def __init__(self, topic: _Optional[str] = ..., routing_key: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., ordering_key: _Optional[str] = ..., deduplication_id: _Optional[str] = ..., subject: _Optional[str] = ..., stream_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("message_ids", "webhook_deliveries", "queues", "duplicates", "publish_id")
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ID_FIELD_NUMBER: _ClassVar[int]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    webhook_deliveries: int
    queues: _containers.RepeatedScalarFieldContainer[str]
    duplicates: _containers.RepeatedScalarFieldContainer[bool]
    publish_id: str
    def __init__(self, message_ids: _Optional[_Iterable[str]] = ..., webhook_deliveries: _Optional[int] = ..., queues: _Optional[_Iterable[str]] = ..., duplicates: _Optional[_Iterable[bool]] = ..., publish_id: _Optional[str] = ...) -> None: ...

class PublishBatchEntry(_message.Message):
    __slots__ = ("routing_key", "body", "attributes", "ordering_key", "deduplication_id", "subject", "delay", "stream_delay")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: _message_pb2.AttributeValue
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[_message_pb2.AttributeValue, _Mapping]] = ...) -> None: ...
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    ORDERING_KEY_FIELD_NUMBER: _ClassVar[int]
    DEDUPLICATION_ID_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    STREAM_DELAY_FIELD_NUMBER: _ClassVar[int]
    routing_key: str
    body: bytes
    attributes: _containers.MessageMap[str, _message_pb2.AttributeValue]
    ordering_key: str
    deduplication_id: str
    subject: str
    delay: _duration_pb2.Duration
    stream_delay: _duration_pb2.Duration
    def __init__(self, routing_key: _Optional[str] = ..., body: _Optional[bytes] = ..., attributes: _Optional[_Mapping[str, _message_pb2.AttributeValue]] = ..., ordering_key: _Optional[str] = ..., deduplication_id: _Optional[str] = ..., subject: _Optional[str] = ..., delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stream_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class PublishBatchRequest(_message.Message):
    __slots__ = ("topic", "entries")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    entries: _containers.RepeatedCompositeFieldContainer[PublishBatchEntry]
    def __init__(self, topic: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[PublishBatchEntry, _Mapping]]] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("message_ids", "webhook_deliveries", "queues", "duplicates", "publish_id")
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    WEBHOOK_DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ID_FIELD_NUMBER: _ClassVar[int]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    webhook_deliveries: int
    queues: _containers.RepeatedScalarFieldContainer[str]
    duplicates: _containers.RepeatedScalarFieldContainer[bool]
    publish_id: str
    def __init__(self, message_ids: _Optional[_Iterable[str]] = ..., webhook_deliveries: _Optional[int] = ..., queues: _Optional[_Iterable[str]] = ..., duplicates: _Optional[_Iterable[bool]] = ..., publish_id: _Optional[str] = ...) -> None: ...

class PublishBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    def __init__(self, results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ...) -> None: ...

class WebhookDelivery(_message.Message):
    __slots__ = ("delivery_id", "publish_id", "publish_time", "routing_key", "state", "attempts", "last_attempt_time", "last_status_code", "last_error", "next_attempt_time")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_TIME_FIELD_NUMBER: _ClassVar[int]
    ROUTING_KEY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_TIME_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    publish_id: str
    publish_time: _timestamp_pb2.Timestamp
    routing_key: str
    state: WebhookDeliveryState
    attempts: int
    last_attempt_time: _timestamp_pb2.Timestamp
    last_status_code: int
    last_error: str
    next_attempt_time: _timestamp_pb2.Timestamp
    def __init__(self, delivery_id: _Optional[str] = ..., publish_id: _Optional[str] = ..., publish_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., routing_key: _Optional[str] = ..., state: _Optional[_Union[WebhookDeliveryState, str]] = ..., attempts: _Optional[int] = ..., last_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_status_code: _Optional[int] = ..., last_error: _Optional[str] = ..., next_attempt_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListWebhookDeliveriesRequest(_message.Message):
    __slots__ = ("topic", "subscription", "state", "page_size", "page_token")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    topic: str
    subscription: str
    state: WebhookDeliveryState
    page_size: int
    page_token: str
    def __init__(self, topic: _Optional[str] = ..., subscription: _Optional[str] = ..., state: _Optional[_Union[WebhookDeliveryState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWebhookDeliveriesResponse(_message.Message):
    __slots__ = ("deliveries", "next_page_token")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[WebhookDelivery]
    next_page_token: str
    def __init__(self, deliveries: _Optional[_Iterable[_Union[WebhookDelivery, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
