"""Two server replicas on one database: schedules fire once per due time, webhooks arrive once."""

from __future__ import annotations

import base64
import collections
from collections.abc import Iterator

import grpc
import pytest
from postbox.v1 import schedule_service_pb2 as spb
from postbox.v1 import schedule_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from receiver import Receiver
from support import ServerProcess, eventually, receive, seconds, unique_name


@pytest.fixture(scope="module")
def replica(database_url: str, server: ServerProcess) -> Iterator[grpc.Channel]:
    """A channel to a second server on the first one's database."""
    second = ServerProcess(database_url).start()
    with grpc.insecure_channel(second.target) as channel:
        yield channel
    second.stop()


def test_replicas_fire_a_schedule_once_per_due_time(channel, replica, messages, queue):
    name = unique_name("replicated")
    here = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
    there = schedule_service_pb2_grpc.ScheduleServiceStub(replica)
    schedule = spb.Schedule(
        name=name, interval=seconds(1), target=spb.ScheduleTarget(queue=queue), body=b"tick"
    )
    here.CreateSchedule(spb.CreateScheduleRequest(schedule=schedule))

    def fired() -> int:
        return there.GetSchedule(spb.GetScheduleRequest(name=name)).schedule.fire_count

    eventually(lambda: fired() >= 4, what="four fires")
    there.PauseSchedule(spb.PauseScheduleRequest(name=name))
    got = receive(messages, queue, count=100)
    # Two fires of one due time would share a deduplication id, so the queue would
    # hold fewer messages than fire_count says.
    assert len(got) == fired()
    assert len({m.deduplication_id for m in got}) == len(got)


def test_replicas_deliver_each_webhook_once(channel, replica):
    name = unique_name("replicated")
    receiver = Receiver().start()
    try:
        stubs = [topic_service_pb2_grpc.TopicServiceStub(c) for c in (channel, replica)]
        stubs[0].CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=name)))
        subscription = tpb.Subscription(
            name="hook", topic=name, webhook=tpb.WebhookEndpoint(url=receiver.url("/hook"))
        )
        stubs[0].CreateSubscription(tpb.CreateSubscriptionRequest(subscription=subscription))
        published = [
            stubs[i % 2].Publish(tpb.PublishRequest(topic=name, body=str(i).encode())).publish_id
            for i in range(40)
        ]
        got = receiver.wait_for("/hook", 40)
        ids = collections.Counter(r.document["message"]["messageId"] for r in got)
        assert sorted(ids) == sorted(published)
        assert set(ids.values()) == {1}
        bodies = {base64.b64decode(r.document["message"]["data"]) for r in got}
        assert bodies == {str(i).encode() for i in range(40)}
    finally:
        receiver.stop()
