"""TopicService: topics, their queue and webhook subscriptions, publishing."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
from postbox.v1 import topic_service_pb2 as pb
from postbox.v1 import topic_service_pb2_grpc

from postbox_server.db.engine import (
    Connection,
    Engine,
    OutgoingPublish,
    PublishSignatures,
    Record,
    Row,
    SubscriptionDelivery,
)
from postbox_server.db.group_commit import GroupCommit
from postbox_server.db.wakeup import WakeHub
from postbox_server.egress import EgressPolicy, Refused
from postbox_server.errors import ApiError, invalid, quoted
from postbox_server.observability import tracing
from postbox_server.services import convert, payload_schemas
from postbox_server.services.pagination import (
    decode_id_page_token,
    decode_page_token,
    next_page,
    page_size_of,
)
from postbox_server.services.payload_schema_cache import PayloadSchemaCache
from postbox_server.services.status import reports_errors
from postbox_server.sns_signing import SigningKey, signature_version
from postbox_server.tenant_quotas import TenantQuotas
from postbox_server.workers import standard_webhooks as webhooks

_DELIVERY_STATES = {
    "pending": pb.WEBHOOK_DELIVERY_STATE_PENDING,
    "failed": pb.WEBHOOK_DELIVERY_STATE_FAILED,
}
_DELIVERY_FILTERS = {
    pb.WEBHOOK_DELIVERY_STATE_UNSPECIFIED: None,
    pb.WEBHOOK_DELIVERY_STATE_PENDING: "pending",
    pb.WEBHOOK_DELIVERY_STATE_FAILED: "failed",
}


_FILTER_SCOPES = {
    pb.FILTER_POLICY_SCOPE_UNSPECIFIED: "attributes",
    pb.FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES: "attributes",
    pb.FILTER_POLICY_SCOPE_MESSAGE_BODY: "body",
}
_SCOPE_FIELDS = {
    "attributes": pb.FILTER_POLICY_SCOPE_MESSAGE_ATTRIBUTES,
    "body": pb.FILTER_POLICY_SCOPE_MESSAGE_BODY,
}
# The longest filter policy, as SNS has it.
MAX_FILTER_POLICY = 256 * 1024
MAX_STREAM_DELAY = timedelta(days=30)


def topic_resource(row: Row, *, with_payload_schema: bool = True) -> pb.Topic:
    """A row of postbox.topics as an API Topic; its payload_schema (up to 256 KiB) only
    when asked for, as GetTopic does and a page of ListTopics does not."""
    topic = pb.Topic(
        name=row["name"],
        create_time=convert.timestamp(row["created_at"]),
        tags=json.loads(row["tags"]),
        sns_attributes=json.loads(row["sns_attributes"]),
    )
    if row["stream_retention"] is not None:
        topic.stream_retention.CopyFrom(convert.duration(row["stream_retention"]))
    schema = payload_schemas.resource(row["payload_schema"]) if with_payload_schema else None
    if schema is not None:
        topic.payload_schema.CopyFrom(schema)
    return topic


def _payload_schema(topic: pb.Topic) -> dict[str, Any] | None:
    if not topic.HasField("payload_schema"):
        return None
    return payload_schemas.setting(topic.payload_schema)


def _delivery(subscription: pb.Subscription) -> SubscriptionDelivery:
    """A subscription's filter and SNS fields as the engine takes them."""
    policy = subscription.filter_policy or None
    if policy is not None:
        if len(policy.encode()) > MAX_FILTER_POLICY:
            raise invalid(
                f"filter_policy is {len(policy.encode())} bytes; the limit is {MAX_FILTER_POLICY}"
            )
        try:
            json.loads(policy)
        except ValueError as error:
            raise invalid(f"filter_policy is not valid JSON: {error}") from None
    if subscription.filter_policy_scope not in _FILTER_SCOPES:
        raise invalid(f"filter_policy_scope {subscription.filter_policy_scope} is unknown")
    sns = None
    if subscription.HasField("sns_delivery"):
        delivery = subscription.sns_delivery
        sns = {
            "topic_arn": delivery.topic_arn,
            "subscription_arn": delivery.subscription_arn,
            "unsubscribe_url": delivery.unsubscribe_url or None,
            "raw": delivery.raw,
            "attributes": dict(delivery.attributes),
        }
        sns = {key: value for key, value in sns.items() if value is not None}
    return SubscriptionDelivery(
        filter_policy=policy,
        filter_scope=_FILTER_SCOPES[subscription.filter_policy_scope],
        sns=sns,
        suspended=subscription.suspended,
    )


def subscription_resource(row: Row, *, with_secret: bool = False) -> pb.Subscription:
    """A subscription row (with its topic and queue names); the secret only when asked."""
    subscription = pb.Subscription(
        name=row["name"],
        topic=row["topic"],
        pattern=row["pattern"],
        create_time=convert.timestamp(row["created_at"]),
        filter_policy=row["filter_policy"] or "",
        suspended=row["suspended"],
    )
    if row["filter_policy"] is not None:
        subscription.filter_policy_scope = _SCOPE_FIELDS[row["filter_scope"]]
    if row["sns"] is not None:
        sns = json.loads(row["sns"])
        subscription.sns_delivery.CopyFrom(
            pb.SnsDelivery(
                topic_arn=sns["topic_arn"],
                subscription_arn=sns["subscription_arn"],
                unsubscribe_url=sns.get("unsubscribe_url", ""),
                raw=sns.get("raw", False),
                attributes=sns.get("attributes", {}),
            )
        )
    if row["queue"] is not None:
        subscription.queue = row["queue"]
    elif row["pending_queue"] is not None:
        # An SNS subscription of a queue not made yet: it names the queue it waits for.
        subscription.queue = row["pending_queue"]
    else:
        subscription.webhook.CopyFrom(
            pb.WebhookEndpoint(
                url=row["webhook_url"],
                secret=row["webhook_secret"] if with_secret else "",
                timeout=convert.duration(row["webhook_timeout"]),
                max_attempts=row["webhook_max_attempts"],
                minimum_backoff=convert.duration(row["webhook_minimum_backoff"]),
                maximum_backoff=convert.duration(row["webhook_maximum_backoff"]),
            )
        )
    return subscription


def _webhook_settings(endpoint: pb.WebhookEndpoint) -> dict[str, Any]:
    """The settings a request gives, in seconds; the engine fills in the rest."""
    settings: dict[str, Any] = {
        name: convert.seconds(getattr(endpoint, name))
        for name in ("timeout", "minimum_backoff", "maximum_backoff")
        if endpoint.HasField(name)
    }
    if endpoint.max_attempts:
        settings["max_attempts"] = endpoint.max_attempts
    return settings


def _stream_delay(entry: pb.PublishRequest | pb.PublishBatchEntry) -> timedelta | None:
    """The entry's stream_delay, checked (None: unset); a delayed entry goes to the
    stream log only, so it may not carry a deduplication_id."""
    if not entry.HasField("stream_delay"):
        return None
    delay = convert.optional_timedelta(entry, "stream_delay")
    assert delay is not None
    if not timedelta(0) <= delay <= MAX_STREAM_DELAY:
        raise invalid(
            f"stream_delay must be from 0 s to {MAX_STREAM_DELAY.total_seconds():.0f} s"
            f" (30 days), not {delay.total_seconds():g} s"
        )
    if entry.deduplication_id:
        raise invalid(
            "deduplication_id is for queues; a publish with a stream_delay goes to the"
            " stream log only: leave one of them out"
        )
    return delay


def _outgoing(entry: Any, max_message_size: int) -> OutgoingPublish:
    """A PublishRequest or PublishBatchEntry as the engine takes it."""
    attributes = entry.attributes
    body = entry.body
    # Without attributes the size is the body's: the common entry skips the walk.
    if attributes or len(body) > max_message_size:
        convert.check_message_size(entry, max_message_size)
    return OutgoingPublish(
        body,
        entry.routing_key,
        tracing.stamp(convert.attributes_json(attributes) if attributes else None),
        entry.ordering_key or None,
        entry.deduplication_id or None,
        entry.subject or None,
        convert.optional_timedelta(entry, "delay"),
    )


# Envelopes signed on the event loop at most; more go to a thread (a 2048-bit RSA
# signature took 0.22 ms here: a batch of 1000 would hold the loop for 0.2 s).
_SIGNED_INLINE = 8


async def sign_envelopes(
    key: SigningKey, topic_arns: list[str], version: str, entries: list[OutgoingPublish]
) -> PublishSignatures:
    """Publish ids, a time (whole milliseconds, as the envelope's Timestamp shows it) and
    each entry's Signature by topic ARN. A body that is not UTF-8 gets none: the engine
    refuses it for an envelope."""
    published_at = datetime.now(timezone.utc)
    published_at = published_at.replace(microsecond=published_at.microsecond // 1000 * 1000)
    timestamp = (
        published_at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{published_at.microsecond // 1000:03d}Z"
    )
    ids = [uuid.uuid4() for _ in entries]

    def sign() -> list[dict[str, str]]:
        signatures: list[dict[str, str]] = []
        for publish_id, entry in zip(ids, entries, strict=True):
            try:
                message = entry.body.decode("utf-8")
            except UnicodeDecodeError:
                signatures.append({})
                continue
            envelope = {
                "Type": "Notification", "MessageId": str(publish_id), "Subject": entry.subject,
                "Message": message, "Timestamp": timestamp,
            }  # fmt: skip
            signatures.append(
                {arn: key.sign({**envelope, "TopicArn": arn}, version) for arn in topic_arns}
            )
        return signatures

    by_topic_arn = sign() if len(entries) <= _SIGNED_INLINE else await asyncio.to_thread(sign)
    return PublishSignatures(version, ids, published_at, by_topic_arn)


def _fill_result(result: pb.PublishResponse | pb.PublishResult, row: Row) -> None:
    """The fields that PublishResponse and PublishResult share. Set one by one on a
    message in place: for a PublishBatch of stream-topic entries, building each result
    from keyword arguments cost more than the engine's part of the call."""
    result.publish_id = str(row["publish_id"])
    result.webhook_deliveries = row["webhook_deliveries"]
    if row["queues"]:
        result.queues.extend(row["queues"])
        result.message_ids.extend(map(str, row["message_ids"]))
        result.duplicates.extend(row["duplicates"])


def webhook_delivery(row: Row) -> pb.WebhookDelivery:
    delivery = pb.WebhookDelivery(
        delivery_id=webhooks.delivery_id(row["publish_id"], row["id"]),
        publish_id=str(row["publish_id"]),
        publish_time=convert.timestamp(row["published_at"]),
        routing_key=row["routing_key"],
        state=_DELIVERY_STATES[row["state"]],
        attempts=row["attempts"],
        last_status_code=row["last_status"],
        last_error=row["last_error"] or "",
    )
    if row["last_attempt_at"] is not None:
        delivery.last_attempt_time.CopyFrom(convert.timestamp(row["last_attempt_at"]))
    if row["next_attempt_at"] is not None:
        delivery.next_attempt_time.CopyFrom(convert.timestamp(row["next_attempt_at"]))
    return delivery


class TopicService(topic_service_pb2_grpc.TopicServiceServicer):
    def __init__(
        self,
        engine: Engine,
        hub: WakeHub,
        on_webhook_deliveries: Callable[[], None],
        egress: EgressPolicy,
        *,
        max_message_size: int,
        on_published: Callable[[str], None] = lambda topic: None,
        payload_schemas: PayloadSchemaCache | None = None,
        signing_key: SigningKey | None = None,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self.engine = engine
        # Tenants' message and byte quotas: a publish is checked as one message per
        # entry (its copies in the subscribed queues count from the next refresh on).
        self.quotas = quotas or TenantQuotas(engine)
        self.payload_schemas = payload_schemas or PayloadSchemaCache(engine, hub)
        # Signs the SNS envelopes of publishes (None: they go unsigned).
        self.signing_key = signing_key
        self.publishes: GroupCommit[OutgoingPublish, Record] = GroupCommit(
            engine, self._publish_group
        )
        # Wakes this server's ReadStream calls waiting on the topic's log.
        self.on_published = on_published
        self.egress = egress
        self.max_message_size = max_message_size
        self.hub = hub
        # Wakes this server's webhook worker, which then delivers without waiting for its poll.
        self.on_webhook_deliveries = on_webhook_deliveries

    @reports_errors
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateTopicResponse:
        if not request.HasField("topic"):
            raise invalid("topic is required: give at least topic.name")
        topic = request.topic
        row = await self.engine.create_topic(
            topic.name, dict(topic.tags), dict(topic.sns_attributes),
            convert.optional_timedelta(topic, "stream_retention"), _payload_schema(topic),
        )  # fmt: skip
        self.payload_schemas.forget("topics", topic.name)
        return pb.CreateTopicResponse(topic=topic_resource(row))

    @reports_errors
    async def UpdateTopic(
        self, request: pb.UpdateTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateTopicResponse:
        topic = request.topic
        paths = list(request.update_mask.paths)
        schema = _payload_schema(topic) if "payload_schema" in paths else None
        row = await self.engine.update_topic(
            topic.name, paths, dict(topic.tags), dict(topic.sns_attributes),
            convert.optional_timedelta(topic, "stream_retention"), schema,
        )  # fmt: skip
        self.payload_schemas.forget("topics", topic.name)
        return pb.UpdateTopicResponse(topic=topic_resource(row))

    @reports_errors
    async def GetTopic(
        self, request: pb.GetTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetTopicResponse:
        return pb.GetTopicResponse(topic=topic_resource(await self.engine.get_topic(request.name)))

    @reports_errors
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListTopics")
        page, token = next_page(
            await self.engine.list_topics(page_size + 1, after), page_size, "ListTopics"
        )
        return pb.ListTopicsResponse(
            topics=[topic_resource(row, with_payload_schema=False) for row in page],
            next_page_token=token,
        )

    @reports_errors
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicResponse:
        await self.engine.delete_topic(request.name)
        self.payload_schemas.forget("topics", request.name)
        return pb.DeleteTopicResponse()

    @reports_errors
    async def CreateSubscription(
        self, request: pb.CreateSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateSubscriptionResponse:
        subscription = request.subscription
        destination = subscription.WhichOneof("destination")
        if destination is None:
            raise invalid("subscription.queue or subscription.webhook is required")
        webhook = subscription.webhook if destination == "webhook" else None
        if webhook is not None:
            await self._check_egress(webhook.url)
        row = await self.engine.create_subscription(
            subscription.topic,
            subscription.name,
            subscription.pattern,
            subscription.queue if destination == "queue" else None,
            webhook.url if webhook is not None else None,
            (webhook.secret or None) if webhook is not None else None,
            _webhook_settings(webhook) if webhook is not None else {},
            _delivery(subscription),
        )
        return pb.CreateSubscriptionResponse(
            subscription=subscription_resource(row, with_secret=True)
        )

    @reports_errors
    async def GetSubscription(
        self, request: pb.GetSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetSubscriptionResponse:
        row = await self.engine.get_subscription(request.topic, request.name)
        return pb.GetSubscriptionResponse(subscription=subscription_resource(row))

    @reports_errors
    async def ListSubscriptions(
        self, request: pb.ListSubscriptionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSubscriptionsResponse:
        page_size = page_size_of(request.page_size)
        after = decode_page_token(request.page_token, "ListSubscriptions")
        page, token = next_page(
            await self.engine.list_subscriptions(request.topic, page_size + 1, after),
            page_size,
            "ListSubscriptions",
        )
        return pb.ListSubscriptionsResponse(
            subscriptions=[subscription_resource(row) for row in page], next_page_token=token
        )

    @reports_errors
    async def DeleteSubscription(
        self, request: pb.DeleteSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSubscriptionResponse:
        await self.engine.delete_subscription(request.topic, request.name)
        return pb.DeleteSubscriptionResponse()

    @reports_errors
    async def UpdateSubscription(
        self, request: pb.UpdateSubscriptionRequest, context: grpc.aio.ServicerContext
    ) -> pb.UpdateSubscriptionResponse:
        subscription, paths = request.subscription, list(request.update_mask.paths)
        webhook = subscription.webhook
        if "webhook.url" in paths:
            await self._check_egress(webhook.url)
        settings = {
            name: value
            for name, value in _webhook_settings(webhook).items()
            if f"webhook.{name}" in paths
        }
        row = await self.engine.update_subscription(
            subscription.topic,
            subscription.name,
            paths,
            subscription.pattern or None,
            subscription.queue or None,
            webhook.url or None,
            webhook.secret or None,
            settings,
            _delivery(subscription),
        )
        self.on_webhook_deliveries()  # pending deliveries may be due sooner, or elsewhere
        return pb.UpdateSubscriptionResponse(
            subscription=subscription_resource(row, with_secret="webhook.secret" in paths)
        )

    async def _check_egress(self, url: str) -> None:
        try:
            await self.egress.check_url(url)
        except Refused as refused:
            raise invalid(str(refused)) from None

    @reports_errors
    async def RetryWebhookDelivery(
        self, request: pb.RetryWebhookDeliveryRequest, context: grpc.aio.ServicerContext
    ) -> pb.RetryWebhookDeliveryResponse:
        delivery_id = None
        if request.delivery_id:
            delivery_id = webhooks.delivery_row(request.delivery_id)
            if delivery_id is None:
                raise invalid(
                    f"delivery_id {quoted(request.delivery_id)} is not a delivery id of this "
                    "server: pass one ListWebhookDeliveries gives"
                )
        retried = await self.engine.retry_webhook_deliveries(
            request.topic, request.subscription, delivery_id
        )
        if retried:
            self.on_webhook_deliveries()
        return pb.RetryWebhookDeliveryResponse(retried_deliveries=retried)

    async def _publish(self, topic: str, entries: list[OutgoingPublish]) -> list[Record]:
        rows = await self.engine.publish_batch(
            topic, entries, signatures=await self._signatures(topic, entries)
        )
        self._woken(topic, rows)
        return rows

    async def _signatures(
        self, topic: str, entries: list[OutgoingPublish], conn: Connection | None = None
    ) -> PublishSignatures | None:
        """The SNS signatures of a publish's envelopes, over publish ids and a time made
        here, for each topic ARN the topic's enveloping subscriptions have; None when
        nothing is signed. A subscription made between this look and the publish gets its
        envelope unsigned."""
        if self.signing_key is None:
            return None
        topic_arns, version = await self.engine.sns_signing_needs(topic, conn=conn)
        if not topic_arns:
            return None
        return await sign_envelopes(
            self.signing_key, topic_arns, signature_version({"SignatureVersion": version or ""}),
            entries,
        )  # fmt: skip

    def _woken(self, topic: str, rows: Iterable[Record]) -> None:
        """Streams on this server waiting on the topic's log or on the queues, and its
        webhook worker, look now."""
        self.on_published(topic)
        queues = {queue for row in rows for queue in row["queues"]}
        for queue in queues:
            self.hub.wake(queue)
        if any(row["webhook_deliveries"] for row in rows):
            self.on_webhook_deliveries()

    async def _publish_group(
        self, conn: Connection, topic: str, entries: list[OutgoingPublish]
    ) -> list[Record]:
        """One topic's share of a group of single Publishes: a row per entry."""
        return await self.engine.publish_batch(
            topic, entries, conn=conn, signatures=await self._signatures(topic, entries, conn)
        )

    @reports_errors
    async def Publish(
        self, request: pb.PublishRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishResponse:
        self.quotas.check_send(request.topic, 1, (request.body,))
        if request.HasField("stream_delay"):
            if request.HasField("delay"):
                raise invalid(
                    "give stream_delay (a stream topic's log) or delay (subscriptions), not both"
                )
            return await self._publish_delayed(request)
        # Concurrent Publishes share commits, as Sends do: each fans out to every
        # subscribed queue, and one commit per Publish would bound them all.
        entry = _outgoing(request, self.max_message_size)
        await self.payload_schemas.check("topics", request.topic, (request.body,), batch=False)
        row = await self.publishes.write(request.topic, entry)
        self._woken(request.topic, (row,))
        response = pb.PublishResponse()
        _fill_result(response, row)
        return response

    async def _publish_delayed(self, request: pb.PublishRequest) -> pb.PublishResponse:
        """A stream topic's message held out of its log for stream_delay."""
        delay = _stream_delay(request)
        assert delay is not None
        entry = _outgoing(request, self.max_message_size)
        await self.payload_schemas.check("topics", request.topic, (request.body,), batch=False)
        publish_id = await self.engine.publish_delayed(request.topic, entry, delay)
        if not delay:
            self.on_published(request.topic)  # appended now: waiting readers may take it
        return pb.PublishResponse(publish_id=str(publish_id))

    @reports_errors
    async def PublishBatch(
        self, request: pb.PublishBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.PublishBatchResponse:
        entries = []
        delays = []
        for index, entry in enumerate(request.entries):
            try:
                entries.append(_outgoing(entry, self.max_message_size))
                delays.append(_stream_delay(entry))
            except ApiError as error:
                raise invalid(f"entry {index}: {error.message}") from None
        self.quotas.check_send(
            request.topic, len(request.entries), (entry.body for entry in request.entries)
        )
        await self.payload_schemas.check(
            "topics", request.topic, (entry.body for entry in request.entries), batch=True
        )
        if any(delay is not None for delay in delays):
            return await self._publish_batch_delayed(request, entries, delays)
        rows = await self._publish(request.topic, entries)
        response = pb.PublishBatchResponse()
        add = response.results.add
        for row in rows:
            _fill_result(add(), row)
        return response

    async def _publish_batch_delayed(
        self,
        request: pb.PublishBatchRequest,
        entries: list[OutgoingPublish],
        delays: list[timedelta | None],
    ) -> pb.PublishBatchResponse:
        """A batch with a stream_delay: to the stream log only, entries without a delay
        appended at once, all in one transaction."""
        for index, entry in enumerate(request.entries):
            if entry.deduplication_id:
                raise invalid(
                    f"entry {index}: deduplication_id is for queues; a batch with a stream_delay"
                    " goes to the stream log only: leave the deduplication_ids or the"
                    " stream_delays out"
                )
        when = [timedelta(0) if delay is None else delay for delay in delays]
        publish_ids = await self.engine.publish_delayed_batch(
            request.topic, list(zip(entries, when, strict=True))
        )
        if not all(when):
            self.on_published(request.topic)  # some appended now: waiting readers may take them
        response = pb.PublishBatchResponse()
        for publish_id in publish_ids:
            response.results.add(publish_id=str(publish_id))
        return response

    @reports_errors
    async def ListWebhookDeliveries(
        self, request: pb.ListWebhookDeliveriesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListWebhookDeliveriesResponse:
        if request.state not in _DELIVERY_FILTERS:
            raise invalid(f"state {request.state} is not a known webhook delivery state")
        page_size = page_size_of(request.page_size)
        after = decode_id_page_token(request.page_token, "ListWebhookDeliveries")
        rows = await self.engine.list_webhook_deliveries(
            request.topic, request.subscription, _DELIVERY_FILTERS[request.state], after,
            page_size + 1,
        )  # fmt: skip
        page, token = next_page(rows, page_size, "ListWebhookDeliveries", "id")
        return pb.ListWebhookDeliveriesResponse(
            deliveries=[webhook_delivery(row) for row in page], next_page_token=token
        )
