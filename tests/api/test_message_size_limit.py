"""`--max-message-size` is the server-wide ceiling on messages and on queues' max_message_size."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from postbox.v1 import (
    message_pb2,
    message_service_pb2_grpc,
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import schedule_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from support import ROOT, ServerProcess, create_queue, error_of, seconds, stats, unique_name

LIMIT = 2048
LARGEST = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def small(database_url: str) -> Iterator[grpc.Channel]:
    """A channel to a second server on the run's database that accepts at most LIMIT bytes."""
    process = ServerProcess(database_url, "--max-message-size", str(LIMIT)).start()
    with grpc.insecure_channel(process.target) as channel:
        yield channel
    process.stop()


def _says_limit(error: grpc.RpcError, limit: int = LIMIT) -> None:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert f"at most {limit} bytes" in error.details()


def test_queues_cannot_promise_more_than_the_server_accepts(small):
    queues = queue_service_pb2_grpc.QueueServiceStub(small)
    name = unique_name("small_server_queue")
    _says_limit(error_of(create_queue, queues, name, max_message_size=LIMIT + 1))
    # Unset means the 1 MiB default, which this server cannot keep: its own limit instead.
    assert create_queue(queues, name).max_message_size == LIMIT
    error = error_of(
        queues.UpdateQueue,
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=name, max_message_size=LIMIT + 1),
            update_mask=FieldMask(paths=["max_message_size"]),
        ),
    )
    _says_limit(error)
    assert queues.GetQueue(qpb.GetQueueRequest(name=name)).queue.max_message_size == LIMIT


def test_messages_above_the_server_limit_are_refused(small, queues):
    # Created through the session's server (1 MiB), so only the small server's limit refuses.
    queue = create_queue(queues, unique_name("big_queue")).name
    messages = message_service_pb2_grpc.MessageServiceStub(small)
    _says_limit(error_of(messages.Send, pb.SendRequest(queue=queue, body=b"x" * (LIMIT + 1))))
    attribute = message_pb2.AttributeValue(data_type="String", string_value="v" * 100)
    # Attributes count: name (1) + type (6) + value (100) + body.
    body_with_room = b"x" * (LIMIT - 107 + 1)
    error = error_of(
        messages.Send, pb.SendRequest(queue=queue, body=body_with_room, attributes={"a": attribute})
    )
    _says_limit(error)
    error = error_of(
        messages.SendBatch,
        pb.SendBatchRequest(
            queue=queue,
            entries=[pb.SendBatchEntry(body=b"ok"), pb.SendBatchEntry(body=b"x" * (LIMIT + 1))],
        ),
    )
    _says_limit(error)
    assert error.details().startswith("entry 1:")
    exactly = b"x" * (LIMIT - 107)
    messages.Send(pb.SendRequest(queue=queue, body=exactly, attributes={"a": attribute}))
    assert stats(queues, queue).visible_messages == 1


def test_publishes_above_the_server_limit_are_refused(small, channel, queues):
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    topic = unique_name("big_topic")
    queue = create_queue(queues, unique_name("big_subscriber")).name
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    topics.CreateSubscription(
        tpb.CreateSubscriptionRequest(
            subscription=tpb.Subscription(name="all", topic=topic, pattern="#", queue=queue)
        )
    )
    small_topics = topic_service_pb2_grpc.TopicServiceStub(small)
    body = b"x" * (LIMIT + 1)
    _says_limit(error_of(small_topics.Publish, tpb.PublishRequest(topic=topic, body=body)))
    error = error_of(
        small_topics.PublishBatch,
        tpb.PublishBatchRequest(topic=topic, entries=[tpb.PublishBatchEntry(body=body)]),
    )
    _says_limit(error)
    assert stats(queues, queue).visible_messages == 0
    small_topics.Publish(tpb.PublishRequest(topic=topic, body=b"x" * LIMIT))
    assert stats(queues, queue).visible_messages == 1


def test_the_largest_limit_raises_the_grpc_request_limit(database_url, queues):
    """A body just above 64 MiB reaches the service, which names the limit (not gRPC's
    RESOURCE_EXHAUSTED from a fixed request limit)."""
    queue = create_queue(queues, unique_name("largest")).name
    process = ServerProcess(database_url, "--max-message-size", str(LARGEST)).start()
    try:
        with grpc.insecure_channel(
            process.target, options=[("grpc.max_send_message_length", -1)]
        ) as channel:
            send = message_service_pb2_grpc.MessageServiceStub(channel).Send
            error = error_of(send, pb.SendRequest(queue=queue, body=b"x" * (LARGEST + 1)))
        _says_limit(error, LARGEST)
    finally:
        process.stop()


@pytest.mark.parametrize("value", ["1023", str(LARGEST + 1), "1MiB", "-1"])
def test_sizes_outside_the_range_are_refused_at_start(database_url, value):
    as_flag = (["--max-message-size", value], {})
    as_environment = ([], {"POSTBOX_MAX_MESSAGE_SIZE": value})
    for flag, env in (as_flag, as_environment):
        result = subprocess.run(
            [sys.executable, "-m", "postbox_server", "serve",
             "--database-url", database_url, *flag],
            cwd=ROOT, capture_output=True, text=True, timeout=30, env={**os.environ, **env},
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "--max-message-size" in result.stderr
        assert "from 1024 to 67108864 bytes" in result.stderr


def test_schedules_of_messages_above_the_server_limit_are_refused(small, queues):
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(small)
    queue = create_queue(queues, unique_name("scheduled")).name
    name = unique_name("too_big")
    schedule = spb.Schedule(
        name=name,
        interval=seconds(3600),
        target=spb.ScheduleTarget(queue=queue),
        body=b"x" * (LIMIT + 1),
    )
    _says_limit(error_of(schedules.CreateSchedule, spb.CreateScheduleRequest(schedule=schedule)))
    schedule.body = b"x"
    schedules.CreateSchedule(spb.CreateScheduleRequest(schedule=schedule))
    schedule.body = b"x" * (LIMIT + 1)
    error = error_of(
        schedules.UpdateSchedule,
        spb.UpdateScheduleRequest(schedule=schedule, update_mask=FieldMask(paths=["body"])),
    )
    _says_limit(error)
    schedules.DeleteSchedule(spb.DeleteScheduleRequest(name=name))
