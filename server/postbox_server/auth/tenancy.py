"""The tenant door: a tenant's caller names its resources as `<name>`, the engine stores
them as `<tenant>/<name>` (tenant_names.py). Every request field that names a queue,
topic or schedule is qualified with the caller's tenant before authorisation and the
servicer see it; every such field of a response is unqualified before the caller does.

The tables below classify every string field of the API: a resource name, a name
prefix, free text that may quote names (errors), or none of these. A test fails when
a string field is left out, so a new field that names a resource cannot slip past.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from postbox_server.errors import invalid, quoted
from postbox_server.tenant_names import SEPARATOR, qualified, unqualified, without_caller_prefix


def _table(lines: str) -> dict[str, frozenset[str]]:
    """ "Message Message: field field" lines as {postbox.v1.Message: fields}."""
    table: dict[str, set[str]] = {}
    for line in lines.strip().splitlines():
        messages, fields = line.split(":")
        for message in messages.split():
            table.setdefault(f"postbox.v1.{message}", set()).update(fields.split())
    return {message: frozenset(fields) for message, fields in table.items()}


# Fields holding the name of a queue, topic or schedule (repeated ones: several).
RESOURCE_NAMES = _table(
    """
Queue: name
DeadLetterPolicy: dead_letter_queue
RedriveAllowPolicy: source_queues
GetQueueRequest DeleteQueueRequest PurgeQueueRequest PauseQueueRequest ResumeQueueRequest: name
ListDeadLetterSourceQueuesRequest: dead_letter_queue
ListDeadLetterSourceQueuesResponse: queue_names
RedriveTask: dead_letter_queue destination
RedriveMessagesRequest: dead_letter_queue destination
ListRedriveTasksRequest: dead_letter_queue
SendRequest SendBatchRequest ReceiveRequest StreamingReceiveRequest DeleteRequest: queue
DeleteBatchRequest ChangeVisibilityRequest ChangeVisibilityBatchRequest NackRequest: queue
PeekMessagesRequest GetMessageRequest ListArchivedMessagesRequest CancelMessageRequest: queue
ListMessagesRequest: queue
Message: queue dead_letter_source_queue
Topic: name
Subscription: topic queue
GetTopicRequest DeleteTopicRequest: name
GetSubscriptionRequest ListSubscriptionsRequest DeleteSubscriptionRequest: topic
RetryWebhookDeliveryRequest PublishRequest PublishBatchRequest ListWebhookDeliveriesRequest: topic
PublishResponse PublishResult: queues
ConsumerGroup GetConsumerGroupRequest ListConsumerGroupsRequest DeleteConsumerGroupRequest: topic
PauseConsumerGroupRequest ResumeConsumerGroupRequest ListStreamDeadLettersRequest: topic
ReplayStreamDeadLettersRequest PurgeStreamDeadLettersRequest ReadStreamRequest: topic
StreamingReadStreamRequest AckStreamRequest SeekConsumerGroupRequest: topic
ReadStreamRangeRequest GetStreamPositionRequest: topic
ScheduleTarget: queue topic
Schedule GetScheduleRequest DeleteScheduleRequest PauseScheduleRequest: name
ResumeScheduleRequest RunScheduleRequest: name
"""
)
# Fields holding the start of resource names: a tenant's is of its own names.
NAME_PREFIXES = _table("ListQueuesRequest ListSchedulesRequest: name_prefix")
# Free text the engine or a worker wrote, which may quote a stored name.
TEXTS = _table(
    """
Message: last_error
Schedule: last_error
RedriveTask: failure_reason
StreamDeadLetter: reason
WebhookDelivery: last_error
"""
)
# Every other string field: ids, tokens, names of things that live inside a queue or
# topic (subscriptions, consumer groups), keys, and texts the caller wrote.
# SnsDelivery's ARNs are the SNS shim's (its door maps accounts, not this one).
NOT_RESOURCE_NAMES = _table(
    """
AckStreamRequest: batch consumer_group
CancelMessageRequest: message_id
CancelRedriveTaskRequest: task_id
ChangeVisibilityBatchEntry ChangeVisibilityRequest DeleteRequest NackRequest Message: receipt
NackRequest: error
ConsumerGroup: name
CreateKeyResponse: secret sigv4_secret_access_key
CronSpec: expression time_zone
DeleteBatchRequest: receipts
DeleteConsumerGroupRequest GetConsumerGroupRequest PauseConsumerGroupRequest: name
ResumeConsumerGroupRequest DeleteSubscriptionRequest GetSubscriptionRequest: name
DeleteKeyRequest GetKeyRequest Key: name
Key: tenant
GetMessageRequest: message_id
GetStreamPositionRequest ListStreamDeadLettersRequest PurgeStreamDeadLettersRequest: consumer_group
ReadStreamRequest ReplayStreamDeadLettersRequest SeekConsumerGroupRequest: consumer_group
StreamingReadStreamRequest: consumer_group
ReadStreamResponse StreamingReadStreamResponse: batch
Grant: pattern
ListArchivedMessagesRequest ListConsumerGroupsRequest ListDeadLetterSourceQueuesRequest: page_token
ListKeysRequest ListMessagesRequest ListQueuesRequest ListRedriveTasksRequest: page_token
ListSchedulesRequest ListStreamDeadLettersRequest ListSubscriptionsRequest: page_token
ListTopicsRequest ListWebhookDeliveriesRequest PeekMessagesRequest ListTenantsRequest: page_token
ListArchivedMessagesResponse ListConsumerGroupsResponse: next_page_token
ListDeadLetterSourceQueuesResponse ListKeysResponse ListMessagesResponse: next_page_token
ListQueuesResponse ListRedriveTasksResponse ListSchedulesResponse: next_page_token
ListStreamDeadLettersResponse ListSubscriptionsResponse ListTopicsResponse: next_page_token
ListWebhookDeliveriesResponse PeekMessagesResponse ListTenantsResponse: next_page_token
ListWebhookDeliveriesRequest RetryWebhookDeliveryRequest: subscription
RetryWebhookDeliveryRequest WebhookDelivery: delivery_id
Message: consumer_id deduplication_id message_group_id message_id
ReceiveRequest StreamingReceiveRequest: consumer_id
StreamingReceiveRequest: delete_receipts nack_receipts
PublishRequest PublishBatchEntry StreamMessage: ordering_key routing_key subject
PublishRequest PublishBatchEntry: deduplication_id
PublishResponse PublishResult RunScheduleResponse SendBatchResponse: message_ids
PublishResponse PublishResult StreamMessage WebhookDelivery: publish_id
Queue: access_policy
RedriveMessagesRequest RedriveTask: message_ids
RedriveTask: task_id
ScheduleTarget WebhookDelivery: routing_key
SendRequest SendBatchEntry: dedupe_key deduplication_id message_group_id
SendBatchRequest: request_id
SendResponse: message_id
SnsDelivery: subscription_arn topic_arn unsubscribe_url
Subscription: filter_policy name pattern
WebhookEndpoint: secret url
Tenant: name account_id description
ListSchedulesRequest: target_kind
Schedule PreviewScheduleResponse: human_readable
PayloadSchema: json_schema
ProtobufSchema: message_type
GetTenantRequest DeleteTenantRequest: name
"""
)


def _message_type(field: FieldDescriptor) -> Descriptor | None:
    """The message type of a message field that is not a map (maps hold tags and
    attributes, never resource names); None for any other field."""
    if field.type != FieldDescriptor.TYPE_MESSAGE or field.message_type is None:
        return None
    return None if field.message_type.GetOptions().map_entry else field.message_type


@dataclass(frozen=True)
class _Plan:
    """Where a message type holds names: its own fields, and the message fields below
    it that lead to some (built once per type, so a call walks only those)."""

    names: tuple[FieldDescriptor, ...]
    prefixes: tuple[FieldDescriptor, ...]
    texts: tuple[FieldDescriptor, ...]
    children: tuple[tuple[FieldDescriptor, _Plan], ...]

    @property
    def empty(self) -> bool:
        return not (self.names or self.prefixes or self.texts or self.children)


_PLANS: dict[str, _Plan] = {}


def _plan(descriptor: Descriptor) -> _Plan:
    found = _PLANS.get(descriptor.full_name)
    if found is not None:
        return found
    _PLANS[descriptor.full_name] = _Plan((), (), (), ())  # a recursive type ends here
    empty = frozenset[str]()

    def of(table: dict[str, frozenset[str]]) -> tuple[FieldDescriptor, ...]:
        names = table.get(descriptor.full_name, empty)
        return tuple(field for field in descriptor.fields if field.name in names)

    children = []
    for field in descriptor.fields:
        message_type = _message_type(field)
        if message_type is not None:
            child = _plan(message_type)
            if not child.empty:
                children.append((field, child))
    plan = _Plan(of(RESOURCE_NAMES), of(NAME_PREFIXES), of(TEXTS), tuple(children))
    _PLANS[descriptor.full_name] = plan
    return plan


def _values(message: Any, field: FieldDescriptor) -> Iterable[Any]:
    if field.is_repeated:
        return getattr(message, field.name)
    if field.has_presence and not message.HasField(field.name):
        return ()
    return (getattr(message, field.name),)


def _set_strings(message: Any, field: FieldDescriptor, change: Any) -> None:
    """Replaces each string of the field with change(it)."""
    if field.is_repeated:
        values = getattr(message, field.name)
        values[:] = [change(value) for value in values]
    else:
        value = getattr(message, field.name)
        changed = change(value)
        # Only when it changes: setting a member of a oneof, even to "", selects it.
        if changed != value:
            setattr(message, field.name, changed)


def _refuse_separator(field: FieldDescriptor, value: str) -> None:
    if SEPARATOR in value:
        raise invalid(
            f'{field.name} {quoted(value)}: a name may only contain A-Z, a-z, 0-9, "_" and '
            f'"-", not {SEPARATOR!r} (a tenant\'s caller names its resources without the tenant)'
        )


def qualify_request(request: Any, tenant: str) -> None:
    """Qualifies every resource name of a request with the caller's tenant, in place;
    INVALID_ARGUMENT for a name that has a "/" of its own (for every caller: a default
    tenant's caller must not reach a tenant's names either)."""
    _qualify(request, _plan(request.DESCRIPTOR), tenant)


def _qualify(message: Any, plan: _Plan, tenant: str) -> None:
    for field in plan.names:
        for value in getattr(message, field.name) if field.is_repeated else (
            getattr(message, field.name),
        ):  # fmt: skip
            _refuse_separator(field, value)
        if tenant:
            _set_strings(message, field, lambda name: qualified(tenant, name) if name else name)
    for field in plan.prefixes:
        _refuse_separator(field, getattr(message, field.name))
        if tenant:
            _set_strings(message, field, lambda prefix: qualified(tenant, prefix))
    for field, child in plan.children:
        for value in _values(message, field):
            _qualify(value, child, tenant)


def unqualify_response(response: Any, tenant: str) -> Any:
    """The response with every name of the caller's tenant unqualified, in place, and its
    prefix taken out of free texts (the default tenant's responses pass unchanged)."""
    if tenant:
        _unqualify(response, _plan(response.DESCRIPTOR), tenant)
    return response


def _unqualify(message: Any, plan: _Plan, tenant: str) -> None:
    for field in plan.names:
        _set_strings(message, field, lambda name: unqualified(tenant, name))
    for field in plan.texts:
        _set_strings(message, field, without_caller_prefix)
    for field, child in plan.children:
        for value in _values(message, field):
            _unqualify(value, child, tenant)
