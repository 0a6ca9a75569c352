"""The blocking `Client`'s calls for managing what a server holds.

`Client` inherits them: queues (update, purge, pause, redrive), messages (look-ups,
listings, batches, a continuous receive), topics and their subscriptions, stream
consumer groups, schedules and API keys. They are what the `postbox` command calls, and
what an operator's script needs. Each is one call, or a listing that follows its pages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf import timestamp_pb2
from postbox.v1 import (
    access_service_pb2,
    access_service_pb2_grpc,
    message_pb2,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    schedule_service_pb2,
    schedule_service_pb2_grpc,
    stream_service_pb2,
    stream_service_pb2_grpc,
    topic_service_pb2,
    topic_service_pb2_grpc,
)

from postbox_client.errors import from_rpc_error
from postbox_client.fields import Attributes, attribute_values

T = TypeVar("T")

# Items per page of the listings below, as AsyncClient.list_queues asks for.
PAGE_SIZE = 100


class Operations:
    """The calls of `Client` beyond sending and receiving (see the module's doc)."""

    # What `Client` sets up; declared here for the type checker.
    channel: grpc.Channel
    metadata: tuple[tuple[str, str], ...]
    queues: queue_service_pb2_grpc.QueueServiceStub
    messages: message_service_pb2_grpc.MessageServiceStub
    topics: topic_service_pb2_grpc.TopicServiceStub
    schedules: schedule_service_pb2_grpc.ScheduleServiceStub
    streams: stream_service_pb2_grpc.StreamServiceStub

    if TYPE_CHECKING:

        def call(
            self, method: Callable[..., T], request: Any, *, repeatable: bool = False
        ) -> T: ...

    @cached_property
    def access(self) -> access_service_pb2_grpc.AccessServiceStub:
        """The AccessService stub (API keys), made on first use."""
        return access_service_pb2_grpc.AccessServiceStub(self.channel)

    def _pages(self, method: Callable[..., Any], request: Any, field: str) -> Iterator[Any]:
        """Every item of a paginated List, fetching the next page when one is used up."""
        while True:
            page = self.call(method, request, repeatable=True)
            yield from getattr(page, field)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    # Queues.

    def list_queues(
        self,
        page_size: int = PAGE_SIZE,
        *,
        view: queue_service_pb2.QueueView = queue_service_pb2.QUEUE_VIEW_UNSPECIFIED,
    ) -> Iterator[queue_service_pb2.Queue]:
        """Every queue by name, with its attributes; with QUEUE_VIEW_FULL also its live
        `stats`, which count its messages (in one query a page)."""
        request = queue_service_pb2.ListQueuesRequest(page_size=page_size, view=view)
        return self._pages(self.queues.ListQueues, request, "queues")

    def update_queue(
        self, name: str, update_mask: Sequence[str], **fields: Any
    ) -> queue_service_pb2.Queue:
        """Changes the Queue fields named in `update_mask` to the values in `fields`
        (visibility_timeout=timedelta(...), ...); a named field left out is reset."""
        request = queue_service_pb2.UpdateQueueRequest(
            queue=queue_service_pb2.Queue(name=name, **fields)
        )
        request.update_mask.paths.extend(update_mask)
        return self.call(self.queues.UpdateQueue, request).queue

    def purge_queue(self, name: str) -> queue_service_pb2.PurgeQueueResponse:
        """Deletes every message of a queue; says how many."""
        request = queue_service_pb2.PurgeQueueRequest(name=name)
        return self.call(self.queues.PurgeQueue, request)

    def pause_queue(
        self, name: str, *, sends: bool = True, receives: bool = True
    ) -> queue_service_pb2.Queue:
        """Refuses sends, receives or both with UNAVAILABLE until resumed."""
        request = queue_service_pb2.PauseQueueRequest(name=name, sends=sends, receives=receives)
        return self.call(self.queues.PauseQueue, request, repeatable=True).queue

    def resume_queue(
        self, name: str, *, sends: bool = True, receives: bool = True
    ) -> queue_service_pb2.Queue:
        """Lets a paused queue take sends, receives or both again."""
        request = queue_service_pb2.ResumeQueueRequest(name=name, sends=sends, receives=receives)
        return self.call(self.queues.ResumeQueue, request, repeatable=True).queue

    def redrive_messages(
        self,
        dead_letter_queue: str,
        *,
        destination: str = "",
        max_messages: int | None = None,
        message_ids: Sequence[str] = (),
    ) -> queue_service_pb2.RedriveTask:
        """Starts moving dead letters back (to `destination`, or each one's source queue);
        returns the task, which `get_redrive_task` follows."""
        request = queue_service_pb2.RedriveMessagesRequest(
            dead_letter_queue=dead_letter_queue,
            destination=destination,
            max_messages=max_messages,
            message_ids=message_ids,
        )
        return self.call(self.queues.RedriveMessages, request).task

    def list_redrive_tasks(
        self, dead_letter_queue: str, *, page_size: int = 100
    ) -> Iterator[queue_service_pb2.RedriveTask]:
        """The redrive tasks of a dead-letter queue, newest first."""
        request = queue_service_pb2.ListRedriveTasksRequest(
            dead_letter_queue=dead_letter_queue, page_size=page_size
        )
        return self._pages(self.queues.ListRedriveTasks, request, "tasks")

    def get_redrive_task(
        self, dead_letter_queue: str, task_id: str
    ) -> queue_service_pb2.RedriveTask | None:
        """A redrive task as it stands now, among its queue's newest (None: not among
        them)."""
        return next(
            (t for t in self.list_redrive_tasks(dead_letter_queue) if t.task_id == task_id), None
        )

    # Messages.

    def send_batch(
        self, queue: str, entries: Sequence[message_service_pb2.SendBatchEntry]
    ) -> message_service_pb2.SendBatchResponse:
        """Sends up to 1,000 entries at once; retried when every entry has a deduplication id."""
        request = message_service_pb2.SendBatchRequest(queue=queue, entries=entries)
        repeatable = all(entry.deduplication_id for entry in entries)
        return self.call(self.messages.SendBatch, request, repeatable=repeatable)

    def delete_batch(
        self, queue: str, receipts: Sequence[str]
    ) -> message_service_pb2.DeleteBatchResponse:
        """Deletes received messages by their receipts; the answer says which failed."""
        request = message_service_pb2.DeleteBatchRequest(queue=queue, receipts=receipts)
        return self.call(self.messages.DeleteBatch, request, repeatable=True)

    def receive_continuously(
        self, queue: str, *, max_messages: int = 10, max_total_messages: int | None = None
    ) -> Iterator[list[message_pb2.Message]]:
        """Batches of messages as they become visible, over one stream, until
        `max_total_messages` (None: until the caller stops)."""
        request = message_service_pb2.ReceiveRequest(
            queue=queue,
            max_messages=max_messages,
            mode=message_service_pb2.RECEIVE_MODE_CONTINUOUS,
            max_total_messages=max_total_messages,
        )
        stream = self.messages.Receive(request, metadata=self.metadata)
        try:
            for response in stream:
                yield list(response.messages)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        finally:
            # A caller that stops early ends the stream now, not when it is collected.
            stream.cancel()

    def nack(
        self,
        queue: str,
        receipt: str,
        *,
        delay: timedelta | None = None,
        error: str = "",
        dead_letter: bool = False,
    ) -> None:
        """Gives a received message back: visible after `delay`, or the queue's retry
        backoff; `error` says why (its last_error). With dead_letter, its tries end now:
        to the dead-letter queue, or failed where the queue has none."""
        request = nack_request(queue, receipt, delay=delay, error=error, dead_letter=dead_letter)
        self.call(self.messages.Nack, request)

    def get_message(self, queue: str, message_id: str) -> message_pb2.Message:
        """Where a message stands: its state, attempts, consumer and result."""
        request = message_service_pb2.GetMessageRequest(queue=queue, message_id=message_id)
        return self.call(self.messages.GetMessage, request, repeatable=True).message

    def list_messages(
        self,
        queue: str = "",
        *,
        state: message_pb2.MessageState | None = None,
        page_size: int = PAGE_SIZE,
    ) -> Iterator[message_pb2.Message]:
        """The messages of a queue ("": of every queue) with their state, or only those in
        `state`."""
        request = message_service_pb2.ListMessagesRequest(
            queue=queue, page_size=page_size, state=state
        )
        return self._pages(self.messages.ListMessages, request, "messages")

    def peek_messages(self, queue: str, limit: int = 10) -> list[message_pb2.Message]:
        """Up to `limit` messages of a queue, without receiving them."""
        request = message_service_pb2.PeekMessagesRequest(queue=queue, page_size=limit)
        return list(self.call(self.messages.PeekMessages, request, repeatable=True).messages)

    # Topics and stream consumer groups.

    def create_topic(
        self, name: str, *, stream_retention: timedelta | None = None, **fields: Any
    ) -> topic_service_pb2.Topic:
        """Creates a topic; with `stream_retention`, a stream topic that keeps its messages
        that long for consumer groups."""
        topic = topic_service_pb2.Topic(name=name, **fields)
        if stream_retention is not None:
            topic.stream_retention.FromTimedelta(stream_retention)
        request = topic_service_pb2.CreateTopicRequest(topic=topic)
        return self.call(self.topics.CreateTopic, request).topic

    def get_topic(self, name: str) -> topic_service_pb2.Topic:
        request = topic_service_pb2.GetTopicRequest(name=name)
        return self.call(self.topics.GetTopic, request, repeatable=True).topic

    def list_topics(self, *, page_size: int = PAGE_SIZE) -> Iterator[topic_service_pb2.Topic]:
        request = topic_service_pb2.ListTopicsRequest(page_size=page_size)
        return self._pages(self.topics.ListTopics, request, "topics")

    def delete_topic(self, name: str) -> None:
        self.call(self.topics.DeleteTopic, topic_service_pb2.DeleteTopicRequest(name=name))

    def list_subscriptions(
        self, topic: str, *, page_size: int = PAGE_SIZE
    ) -> Iterator[topic_service_pb2.Subscription]:
        request = topic_service_pb2.ListSubscriptionsRequest(topic=topic, page_size=page_size)
        return self._pages(self.topics.ListSubscriptions, request, "subscriptions")

    def retry_webhook_delivery(self, topic: str, subscription: str, delivery_id: str = "") -> int:
        """Makes a webhook subscription's failed deliveries (or only `delivery_id`) due now;
        returns how many."""
        request = topic_service_pb2.RetryWebhookDeliveryRequest(
            topic=topic, subscription=subscription, delivery_id=delivery_id
        )
        return self.call(self.topics.RetryWebhookDelivery, request).retried_deliveries

    def list_consumer_groups(
        self, topic: str, *, page_size: int = PAGE_SIZE
    ) -> Iterator[stream_service_pb2.ConsumerGroup]:
        """A stream topic's consumer groups, each with its lag."""
        request = stream_service_pb2.ListConsumerGroupsRequest(topic=topic, page_size=page_size)
        return self._pages(self.streams.ListConsumerGroups, request, "consumer_groups")

    def get_consumer_group(self, topic: str, name: str) -> stream_service_pb2.ConsumerGroup:
        """A consumer group of a stream topic: its cursor, lag, retries, dead letters and
        the lease of a batch out, if one is."""
        request = stream_service_pb2.GetConsumerGroupRequest(topic=topic, name=name)
        return self.call(self.streams.GetConsumerGroup, request, repeatable=True).consumer_group

    def seek_consumer_group(
        self, topic: str, name: str, *, offset: int
    ) -> stream_service_pb2.ConsumerGroup:
        """Moves a consumer group's cursor to an offset (past the log's end: to the end, so
        the group reads only what is published from then on)."""
        request = stream_service_pb2.SeekConsumerGroupRequest(
            topic=topic, consumer_group=name, offset=offset
        )
        return self.call(self.streams.SeekConsumerGroup, request, repeatable=True).consumer_group

    def pause_consumer_group(self, topic: str, name: str) -> stream_service_pb2.ConsumerGroup:
        """Stops a consumer group's reads until resumed."""
        request = stream_service_pb2.PauseConsumerGroupRequest(topic=topic, name=name)
        return self.call(self.streams.PauseConsumerGroup, request, repeatable=True).consumer_group

    def resume_consumer_group(self, topic: str, name: str) -> stream_service_pb2.ConsumerGroup:
        request = stream_service_pb2.ResumeConsumerGroupRequest(topic=topic, name=name)
        return self.call(self.streams.ResumeConsumerGroup, request, repeatable=True).consumer_group

    def list_stream_dead_letters(
        self, topic: str, group: str, *, page_size: int = PAGE_SIZE
    ) -> Iterator[stream_service_pb2.StreamDeadLetter]:
        """A consumer group's dead letters in offset order: each message as published, with
        how many times it went out to the group, when and why it died."""
        request = stream_service_pb2.ListStreamDeadLettersRequest(
            topic=topic, consumer_group=group, page_size=page_size
        )
        return self._pages(self.streams.ListStreamDeadLetters, request, "dead_letters")

    def replay_stream_dead_letters(
        self, topic: str, group: str, offsets: Sequence[int] = ()
    ) -> int:
        """Sends a consumer group's dead letters (all, or those at `offsets`) back to the
        group, to lead its next batch; returns how many went back. Not retried: a replay
        whose answer was lost would count none the second time."""
        request = stream_service_pb2.ReplayStreamDeadLettersRequest(
            topic=topic, consumer_group=group, offsets=offsets
        )
        return self.call(self.streams.ReplayStreamDeadLetters, request).replayed_count

    def purge_stream_dead_letters(self, topic: str, group: str, *, older_than: datetime) -> int:
        """Deletes a consumer group's dead letters that died before `older_than` (an aware
        datetime); returns how many."""
        request = stream_service_pb2.PurgeStreamDeadLettersRequest(
            topic=topic, consumer_group=group
        )
        request.older_than.FromDatetime(older_than)
        return self.call(self.streams.PurgeStreamDeadLetters, request, repeatable=True).purged_count

    # Schedules.

    def create_schedule(
        self,
        name: str,
        body: bytes | str,
        *,
        queue: str = "",
        topic: str = "",
        routing_key: str = "",
        attributes: Attributes | None = None,
        cron: str | None = None,
        time_zone: str = "UTC",
        interval: timedelta | None = None,
        run_at: datetime | None = None,
    ) -> schedule_service_pb2.Schedule:
        """A schedule that sends `body` to `queue`, or publishes it to `topic`, at the times
        of one timing: a cron expression (in `time_zone`), an interval, or one time."""
        if bool(queue) == bool(topic):
            raise ValueError("give exactly one of queue and topic")
        target = schedule_service_pb2.ScheduleTarget(routing_key=routing_key)
        if queue:
            target.queue = queue
        else:
            target.topic = topic
        schedule = schedule_service_pb2.Schedule(
            name=name,
            target=target,
            body=body.encode() if isinstance(body, str) else body,
            attributes=attribute_values(attributes),
        )
        set_timing(schedule, cron=cron, time_zone=time_zone, interval=interval, run_at=run_at)
        request = schedule_service_pb2.CreateScheduleRequest(schedule=schedule)
        return self.call(self.schedules.CreateSchedule, request).schedule

    def list_schedules(
        self,
        *,
        page_size: int = PAGE_SIZE,
        paused: bool | None = None,
        target_kind: str = "",
        name_prefix: str = "",
    ) -> Iterator[schedule_service_pb2.Schedule]:
        """Schedules in name order; only paused (or active) ones, those into queues or
        topics (target_kind "queue", "topic"), or names starting with name_prefix."""
        request = schedule_service_pb2.ListSchedulesRequest(
            page_size=page_size, target_kind=target_kind, name_prefix=name_prefix
        )
        if paused is not None:
            request.paused = paused
        return self._pages(self.schedules.ListSchedules, request, "schedules")

    def get_schedule(self, name: str) -> schedule_service_pb2.Schedule:
        request = schedule_service_pb2.GetScheduleRequest(name=name)
        return self.call(self.schedules.GetSchedule, request, repeatable=True).schedule

    def delete_schedule(self, name: str) -> None:
        request = schedule_service_pb2.DeleteScheduleRequest(name=name)
        self.call(self.schedules.DeleteSchedule, request)

    def pause_schedule(self, name: str) -> schedule_service_pb2.Schedule:
        request = schedule_service_pb2.PauseScheduleRequest(name=name)
        return self.call(self.schedules.PauseSchedule, request, repeatable=True).schedule

    def resume_schedule(self, name: str) -> schedule_service_pb2.Schedule:
        request = schedule_service_pb2.ResumeScheduleRequest(name=name)
        return self.call(self.schedules.ResumeSchedule, request, repeatable=True).schedule

    def run_schedule(self, name: str) -> schedule_service_pb2.RunScheduleResponse:
        """Fires a schedule once now; the answer holds the ids of what it sent."""
        request = schedule_service_pb2.RunScheduleRequest(name=name)
        return self.call(self.schedules.RunSchedule, request)

    def preview_schedule(
        self,
        *,
        cron: str | None = None,
        time_zone: str = "UTC",
        interval: timedelta | None = None,
        run_at: datetime | None = None,
        count: int = 10,
    ) -> list[timestamp_pb2.Timestamp]:
        """The next `count` fire times of a timing: a cron expression (in `time_zone`), an
        interval, or one time; exactly one of them."""
        request = schedule_service_pb2.PreviewScheduleRequest(count=count)
        set_timing(
            request.schedule, cron=cron, time_zone=time_zone, interval=interval, run_at=run_at
        )
        response = self.call(self.schedules.PreviewSchedule, request, repeatable=True)
        return list(response.fire_times)

    # API keys.

    def create_key(
        self,
        name: str,
        grants: Sequence[access_service_pb2.Grant | str],
        *,
        expire_time: datetime | None = None,
        tenant: str = "",
        rate_limits: access_service_pb2.RateLimits | None = None,
    ) -> access_service_pb2.CreateKeyResponse:
        """Creates an API key with `grants`: Grant messages, or "PERMISSION:PATTERN" as in
        "send:orders-*" (see `parse_grant`), in `tenant` ("": the caller's; naming
        another tenant takes an admin key of the default tenant), with `rate_limits`
        (None: none). The answer holds its secret, shown only this once."""
        parsed = [parse_grant(g) if isinstance(g, str) else g for g in grants]
        key = access_service_pb2.Key(
            name=name, grants=parsed, tenant=tenant, rate_limits=rate_limits
        )
        if expire_time is not None:
            key.expire_time.FromDatetime(expire_time)
        return self.call(self.access.CreateKey, access_service_pb2.CreateKeyRequest(key=key))

    def list_keys(self, *, page_size: int = PAGE_SIZE) -> Iterator[access_service_pb2.Key]:
        """Every API key, without its secret."""
        request = access_service_pb2.ListKeysRequest(page_size=page_size)
        return self._pages(self.access.ListKeys, request, "keys")

    def update_key(
        self,
        name: str,
        *,
        grants: Sequence[access_service_pb2.Grant | str] | None = None,
        expire_time: datetime | None = None,
        never_expires: bool = False,
        rate_limits: access_service_pb2.RateLimits | None = None,
    ) -> access_service_pb2.Key:
        """Changes the fields given and only those (None: leave it): `grants` replace them
        all; `expire_time`, or `never_expires`; `rate_limits` replace all of them, an
        empty RateLimits lifts them."""
        if expire_time is not None and never_expires:
            raise ValueError("give expire_time or never_expires, not both")
        key = access_service_pb2.Key(name=name)
        paths = []
        if grants is not None:
            key.grants.extend(parse_grant(g) if isinstance(g, str) else g for g in grants)
            paths.append("grants")
        if expire_time is not None:
            key.expire_time.FromDatetime(expire_time)
        if expire_time is not None or never_expires:
            paths.append("expire_time")
        if rate_limits is not None:
            key.rate_limits.CopyFrom(rate_limits)
            paths.append("rate_limits")
        request = access_service_pb2.UpdateKeyRequest(key=key)
        request.update_mask.paths.extend(paths)
        return self.call(self.access.UpdateKey, request).key

    def delete_key(self, name: str) -> None:
        """Revokes an API key."""
        self.call(self.access.DeleteKey, access_service_pb2.DeleteKeyRequest(name=name))

    # Tenants: an admin key of the default tenant manages them.

    def create_tenant(
        self,
        name: str,
        *,
        account_id: str = "",
        description: str = "",
        max_queues: int = 0,
        max_topics: int = 0,
        max_messages: int = 0,
        max_bytes: int = 0,
        rate_limits: access_service_pb2.RateLimits | None = None,
    ) -> access_service_pb2.Tenant:
        """Creates a tenant; without `account_id` it gets a random one. The max_ arguments
        are its quota (0: no limit); `rate_limits` are shared by all its keys (None: none)."""
        tenant = access_service_pb2.Tenant(
            name=name, account_id=account_id, description=description, rate_limits=rate_limits
        )
        quota = {
            "max_queues": max_queues,
            "max_topics": max_topics,
            "max_messages": max_messages,
            "max_bytes": max_bytes,
        }
        if any(quota.values()):
            tenant.quota.CopyFrom(access_service_pb2.TenantQuota(**quota))
        request = access_service_pb2.CreateTenantRequest(tenant=tenant)
        return self.call(self.access.CreateTenant, request).tenant

    def get_tenant(self, name: str) -> access_service_pb2.Tenant:
        return self.get_tenant_with_usage(name).tenant

    def get_tenant_with_usage(self, name: str) -> access_service_pb2.GetTenantResponse:
        """The tenant and what it holds, as the answering server last counted it."""
        request = access_service_pb2.GetTenantRequest(name=name)
        return self.call(self.access.GetTenant, request, repeatable=True)

    def list_tenants(self, *, page_size: int = PAGE_SIZE) -> Iterator[access_service_pb2.Tenant]:
        """Every tenant but the default one."""
        request = access_service_pb2.ListTenantsRequest(page_size=page_size)
        return self._pages(self.access.ListTenants, request, "tenants")

    def update_tenant(
        self,
        name: str,
        *,
        account_id: str | None = None,
        description: str | None = None,
        max_queues: int | None = None,
        max_topics: int | None = None,
        max_messages: int | None = None,
        max_bytes: int | None = None,
        rate_limits: access_service_pb2.RateLimits | None = None,
    ) -> access_service_pb2.Tenant:
        """Changes the fields given (None: leave it; a max_ of 0: no limit; `rate_limits`
        replace all of them, an empty RateLimits lifts them)."""
        tenant = access_service_pb2.Tenant(name=name)
        paths = []
        if account_id is not None:
            tenant.account_id = account_id
            paths.append("account_id")
        if description is not None:
            tenant.description = description
            paths.append("description")
        quota = {
            "max_queues": max_queues,
            "max_topics": max_topics,
            "max_messages": max_messages,
            "max_bytes": max_bytes,
        }
        for field, value in quota.items():
            if value is not None:
                setattr(tenant.quota, field, value)
                paths.append(f"quota.{field}")
        if rate_limits is not None:
            tenant.rate_limits.CopyFrom(rate_limits)
            paths.append("rate_limits")
        request = access_service_pb2.UpdateTenantRequest(tenant=tenant)
        request.update_mask.paths.extend(paths)
        return self.call(self.access.UpdateTenant, request).tenant

    def delete_tenant(self, name: str, *, force: bool = False) -> None:
        """Deletes a tenant and its keys; with `force`, its queues, topics and schedules too."""
        request = access_service_pb2.DeleteTenantRequest(name=name, force=force)
        self.call(self.access.DeleteTenant, request)


def nack_request(
    queue: str, receipt: str, *, delay: timedelta | None, error: str, dead_letter: bool
) -> message_service_pb2.NackRequest:
    """The NackRequest of both clients' `nack`."""
    request = message_service_pb2.NackRequest(
        queue=queue, receipt=receipt, error=error, dead_letter=dead_letter
    )
    if delay is not None:
        request.delay.FromTimedelta(delay)
    return request


def set_timing(
    schedule: schedule_service_pb2.Schedule,
    *,
    cron: str | None,
    time_zone: str,
    interval: timedelta | None,
    run_at: datetime | None,
) -> None:
    """Sets a schedule's timing: exactly one of a cron expression (read in `time_zone`),
    an interval and one time (another count is a ValueError)."""
    if (cron is not None) + (interval is not None) + (run_at is not None) != 1:
        raise ValueError("give exactly one of cron, interval and run_at")
    if cron is not None:
        schedule.cron.expression = cron
        schedule.cron.time_zone = time_zone
    elif interval is not None:
        schedule.interval.FromTimedelta(interval)
    elif run_at is not None:
        schedule.run_at.FromDatetime(run_at)


def parse_grant(text: str) -> access_service_pb2.Grant:
    """A Grant from "PERMISSION:PATTERN", as in "send:orders-*": a permission of send,
    receive, publish, read, manage or admin (another is a ValueError) on the names the
    pattern matches (* matches any run of characters; the server checks the pattern)."""
    permission, separator, pattern = text.partition(":")
    name = f"PERMISSION_{permission.strip().upper()}"
    known = access_service_pb2.Permission.DESCRIPTOR.values_by_name
    if not separator or name not in known or name == "PERMISSION_UNSPECIFIED":
        raise ValueError(
            f"{text[:40]!r} is not PERMISSION:PATTERN with a permission of send, receive, "
            "publish, read, manage or admin, as in send:orders-*"
        )
    return access_service_pb2.Grant(permission=name, pattern=pattern)
