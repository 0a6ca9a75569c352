"""Which permission each RPC needs, and on which resource: the one table of authorisation.

A method missing here is refused to every key (and the authorisation matrix test
fails), so a new RPC cannot go out unguarded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from postbox_server.errors import ApiError, invalid
from postbox_server.queue_names import dead_letter_queue_name


@dataclass(frozen=True)
class Target:
    """A second resource a request names, which the call then writes into: a queue's
    dead-letter queue, a redrive's destination, a subscription's queue, a schedule's
    queue or topic. The key needs `permission` on it too, the one that writing to it
    directly needs: otherwise a grant on one queue would let its holder route messages
    into any other.

    An empty field names nothing (the other arm of a oneof, or a setting left unset).
    For an Update, the target counts only when its `update_mask` names `mask`. A target
    with `when` counts only when that boolean field is set, and one with `derive` is the
    resource that function makes of the field's value (a queue's dead-letter queue that
    CreateQueue makes along with it).
    """

    permission: str
    field: str
    mask: str | None = None
    when: str | None = None
    derive: Callable[[str], str] | None = None


@dataclass(frozen=True)
class Rule:
    """`permission` on the resource named by the request field at `field` (a dotted path).

    Without a field the call names no single resource: a List that `listed` names is
    filtered to what the key may read, and anything else needs the permission on "*".
    With a field and `listed`, the call needs the permission on the resource it names,
    and its answer is filtered all the same (the names of other resources it lists).
    """

    permission: str
    field: str | None = None
    # The response's repeated field of resources (or of their names) a List filters.
    listed: str | None = None
    # Other permissions that allow the call too.
    also: tuple[str, ...] = ()
    # For a request stream whose requests are answered each on its own: a refused request
    # reaches the method as a server.errors.Refused, rather than ending the stream.
    per_request: bool = False
    # With per_request: the repeated field of further requests a request may carry, each
    # checked, paced and answered as a request of its own (see parts_of).
    more: str | None = None
    # Whether an empty `field` names every resource (then the permission is needed on "*").
    empty_means_all: bool = False
    # Second resources the call writes into (see Target).
    targets: tuple[Target, ...] = ()
    # A call without a field that acts only within the caller's tenant (its servicer
    # scopes it): a tenant's key needs the permission on all of its own tenant's names,
    # rather than on every name, which no tenant's grant covers.
    within_tenant: bool = False
    # A call about the calling key itself: any key may make it, whatever its grants.
    any_key: bool = False

    @property
    def permissions(self) -> tuple[str, ...]:
        return (self.permission, *self.also)


# Resource-less calls that act on a resource found by id: only a grant on every name covers them.
ANY_RESOURCE = "*"

OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")

# A queue's dead letters are written into its dead-letter queue.
_DEAD_LETTERS = "queue.dead_letter_policy.dead_letter_queue"
# A subscription delivers into its queue (the other arm is a webhook, no resource).
_SUBSCRIBED = "subscription.queue"
# A schedule fires into a queue or a topic.
_SCHEDULED = (("send", "schedule.target.queue"), ("publish", "schedule.target.topic"))

_QUEUES = {
    "CreateQueue": Rule(
        "manage",
        "queue.name",
        targets=(
            Target("send", _DEAD_LETTERS),
            # with_dead_letter_queue creates `<name>-dlq` too: creating a queue is managing it.
            Target(
                "manage", "queue.name", when="with_dead_letter_queue", derive=dead_letter_queue_name
            ),
        ),
    ),
    # Senders and receivers read a queue's settings too: SQS clients need them (the
    # shim's SendMessageBatch checks sizes against max_message_size, FIFO settings).
    "GetQueue": Rule("read", "name", also=("send", "receive")),
    "ListQueues": Rule("read", listed="queues"),
    "UpdateQueue": Rule(
        "manage",
        "queue.name",
        targets=(Target("send", _DEAD_LETTERS, mask="dead_letter_policy"),),
    ),
    "DeleteQueue": Rule("manage", "name"),
    "PurgeQueue": Rule("manage", "name"),
    "PauseQueue": Rule("manage", "name"),
    "ResumeQueue": Rule("manage", "name"),
    # Lists the queues that name it as their dead-letter queue: only those the key may read.
    "ListDeadLetterSourceQueues": Rule("read", "dead_letter_queue", listed="queue_names"),
    # An empty destination returns each dead letter to the queue it came from: those
    # messages were that queue's, so no second grant is asked for.
    "RedriveMessages": Rule(
        "manage", "dead_letter_queue", targets=(Target("send", "destination"),)
    ),
    "ListRedriveTasks": Rule("read", "dead_letter_queue"),
    # By task id: the queue is not in the request.
    "CancelRedriveTask": Rule("manage"),
}
_MESSAGES = {
    "Send": Rule("send", "queue"),
    "SendBatch": Rule("send", "queue"),
    # Each request names its queue: a refused one is answered alone, the stream goes on.
    "SendStream": Rule("send", "send.queue", per_request=True, more="more"),
    "SendBatchStream": Rule("send", "batch.queue", per_request=True),
    "Receive": Rule("receive", "queue"),
    "StreamingReceive": Rule("receive", "queue"),
    "Delete": Rule("receive", "queue"),
    "DeleteBatch": Rule("receive", "queue"),
    "ChangeVisibility": Rule("receive", "queue"),
    "ChangeVisibilityBatch": Rule("receive", "queue"),
    "Nack": Rule("receive", "queue"),
    "PeekMessages": Rule("read", "queue"),
    "GetMessage": Rule("read", "queue"),
    "ListArchivedMessages": Rule("read", "queue"),
    # Without a queue it lists every queue's messages.
    "ListMessages": Rule("read", "queue", empty_means_all=True),
    # A producer takes back a message it sent, before anyone receives it.
    "CancelMessage": Rule("send", "queue", also=("manage",)),
}
_TOPICS = {
    "CreateTopic": Rule("manage", "topic.name"),
    "GetTopic": Rule("read", "name"),
    "UpdateTopic": Rule("manage", "topic.name"),
    "ListTopics": Rule("read", listed="topics"),
    "DeleteTopic": Rule("manage", "name"),
    # Subscriptions belong to their topic: its name is the resource.
    "CreateSubscription": Rule(
        "manage", "subscription.topic", targets=(Target("send", _SUBSCRIBED),)
    ),
    "GetSubscription": Rule("read", "topic"),
    "ListSubscriptions": Rule("read", "topic"),
    "DeleteSubscription": Rule("manage", "topic"),
    "UpdateSubscription": Rule(
        "manage", "subscription.topic", targets=(Target("send", _SUBSCRIBED, mask="queue"),)
    ),
    "RetryWebhookDelivery": Rule("manage", "topic"),
    "Publish": Rule("publish", "topic"),
    "PublishBatch": Rule("publish", "topic"),
    "ListWebhookDeliveries": Rule("read", "topic"),
}
# Consumer groups belong to their stream topic: its name is the resource. Reading
# a stream is receiving from it; a consumer may also seek its group to replay.
_STREAMS = {
    "CreateConsumerGroup": Rule("manage", "consumer_group.topic"),
    "GetConsumerGroup": Rule("read", "topic", also=("receive",)),
    "ListConsumerGroups": Rule("read", "topic", also=("receive",)),
    "DeleteConsumerGroup": Rule("manage", "topic"),
    "PauseConsumerGroup": Rule("manage", "topic"),
    "ResumeConsumerGroup": Rule("manage", "topic"),
    "UpdateConsumerGroup": Rule("manage", "consumer_group.topic"),
    # Dead letters hold the messages: reading them is receiving, as ReadStream.
    "ListStreamDeadLetters": Rule("receive", "topic", also=("manage",)),
    "ReplayStreamDeadLetters": Rule("receive", "topic", also=("manage",)),
    "PurgeStreamDeadLetters": Rule("manage", "topic"),
    "ReadStream": Rule("receive", "topic"),
    "StreamingReadStream": Rule("receive", "topic"),
    "AckStream": Rule("receive", "topic"),
    "SeekConsumerGroup": Rule("receive", "topic", also=("manage",)),
    # Reading the log by position gives the messages, as ReadStream does.
    "ReadStreamRange": Rule("receive", "topic"),
    "GetStreamPosition": Rule("read", "topic", also=("receive",)),
}
_SCHEDULES = {
    "CreateSchedule": Rule(
        "manage", "schedule.name", targets=tuple(Target(p, f) for p, f in _SCHEDULED)
    ),
    "GetSchedule": Rule("read", "name"),
    "ListSchedules": Rule("read", listed="schedules"),
    "UpdateSchedule": Rule(
        "manage",
        "schedule.name",
        targets=tuple(Target(p, f, mask="target") for p, f in _SCHEDULED),
    ),
    "DeleteSchedule": Rule("manage", "name"),
    "PauseSchedule": Rule("manage", "name"),
    "ResumeSchedule": Rule("manage", "name"),
    "RunSchedule": Rule("manage", "name"),
    # Stores and touches nothing: whoever may read or manage a schedule of that name.
    "PreviewSchedule": Rule("read", "schedule.name", also=("manage",)),
}
# A tenant's admin manages its own tenant's keys (the servicer scopes them).
_ACCESS = {
    "CreateKey": Rule("admin", within_tenant=True),
    "GetKey": Rule("admin", within_tenant=True),
    "ListKeys": Rule("admin", within_tenant=True),
    "UpdateKey": Rule("admin", within_tenant=True),
    "DeleteKey": Rule("admin", within_tenant=True),
    # Tenants are the default tenant's admins' to manage: no tenant's grant covers "*".
    "CreateTenant": Rule("admin"),
    "GetTenant": Rule("admin"),
    "ListTenants": Rule("admin"),
    "UpdateTenant": Rule("admin"),
    "DeleteTenant": Rule("admin"),
    # The SQS and SNS shim asks it for the account id of each caller's URLs and ARNs,
    # whatever the caller's grants: a key with send on one queue needs that queue's URL.
    "GetCallerTenant": Rule("admin", any_key=True),
}

RULES: dict[str, Rule] = {
    f"/postbox.v1.{service}/{method}": rule
    for service, rules in (
        ("QueueService", _QUEUES),
        ("MessageService", _MESSAGES),
        ("TopicService", _TOPICS),
        ("StreamService", _STREAMS),
        ("ScheduleService", _SCHEDULES),
        ("AccessService", _ACCESS),
    )
    for method, rule in rules.items()
}


def _at(request: object, field: str) -> object:
    value = request
    for part in field.split("."):
        value = getattr(value, part)
    return value


# Most requests one request of a stream may carry, itself and its `more` (SendStream's
# 1,000 sends per request).
MAX_PARTS = 1000


def parts_of(request: Any, rule: Rule | None) -> tuple[list[Any], ApiError | None]:
    """The requests a stream's request carries: itself and those of the rule's `more`
    field, which is emptied so that each is qualified and checked once; with the error
    that refuses them all when there are more than MAX_PARTS."""
    if rule is None or rule.more is None or not hasattr(request, "DESCRIPTOR"):
        return [request], None
    more = list(getattr(request, rule.more))
    if not more:
        return [request], None
    request.ClearField(rule.more)  # the entries taken out stay whole, detached
    parts = [request, *more]
    if len(parts) <= MAX_PARTS:
        return parts, None
    return parts, invalid(
        f"a request carries {len(parts):,} sends, at most {MAX_PARTS:,} allowed (itself "
        f"and {MAX_PARTS - 1:,} in `{rule.more}`): write the others in another request"
    )


def resource_of(request: object, rule: Rule) -> str:
    """The resource name a request names at the rule's field ("*" for rules without one)."""
    if rule.field is None:
        return ANY_RESOURCE
    value = _at(request, rule.field)
    if rule.empty_means_all and not value:
        return ANY_RESOURCE
    return str(value)


def targets_of(request: object, rule: Rule) -> list[tuple[str, str]]:
    """(permission, resource) of each second resource the request writes into."""
    if not rule.targets:
        return []
    mask = getattr(request, "update_mask", None)
    paths = set(mask.paths) if mask is not None else set()
    found = []
    for target in rule.targets:
        if target.mask is not None and target.mask not in paths:
            continue
        if target.when is not None and not _at(request, target.when):
            continue
        name = _at(request, target.field)
        if name:
            name = str(name) if target.derive is None else target.derive(str(name))
            found.append((target.permission, name))
    return found
