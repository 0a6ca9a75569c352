"""Pausing a stream topic's consumer group: its reads fail with UNAVAILABLE until it is
resumed, a batch already out may still be acknowledged, and it keeps its cursor, so the
messages past it wait for it."""

from __future__ import annotations

import grpc
import pytest
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from support import error_of, seconds, unique_name


@pytest.fixture
def stream(topics, streams, request: pytest.FixtureRequest) -> str:
    """A stream topic with three messages and a group `g` reading from the earliest."""
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, stream_retention=seconds(3600)))
    )
    entries = [tpb.PublishBatchEntry(body=body) for body in (b"1", b"2", b"3")]
    topics.PublishBatch(tpb.PublishBatchRequest(topic=name, entries=entries))
    group = spb.ConsumerGroup(topic=name, name="g")
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    return name


def _read(streams, topic: str, **options) -> spb.ReadStreamResponse:
    # min_messages waits for the publish's transaction to be final for readers.
    request = spb.ReadStreamRequest(
        topic=topic, consumer_group="g", wait_time=seconds(10), **options
    )
    return streams.ReadStream(request)


def _group(streams, topic: str) -> spb.ConsumerGroup:
    return streams.GetConsumerGroup(
        spb.GetConsumerGroupRequest(topic=topic, name="g")
    ).consumer_group


def test_a_paused_group_refuses_reads_and_reads_on_from_its_cursor_after_resume(streams, stream):
    out = _read(streams, stream, max_messages=2, min_messages=2)
    assert [m.body for m in out.messages] == [b"1", b"2"]
    paused = streams.PauseConsumerGroup(spb.PauseConsumerGroupRequest(topic=stream, name="g"))
    assert paused.consumer_group.paused
    again = streams.PauseConsumerGroup(spb.PauseConsumerGroupRequest(topic=stream, name="g"))
    assert again.consumer_group.paused  # pausing twice changes nothing
    assert _group(streams, stream).paused
    error = error_of(_read, streams, stream)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "consumer group 'g' of topic" in error.details()
    assert "is paused; ResumeConsumerGroup lets reads in again" in error.details()
    # The batch out before the pause is acknowledged: the work in hand finishes.
    acked = streams.AckStream(
        spb.AckStreamRequest(topic=stream, consumer_group="g", batch=out.batch)
    )
    assert acked.cursor_offset == out.messages[-1].offset
    assert _group(streams, stream).lag_messages == 1  # kept for the group while it is paused
    listed = streams.ListConsumerGroups(spb.ListConsumerGroupsRequest(topic=stream))
    assert [(g.name, g.paused) for g in listed.consumer_groups] == [("g", True)]
    resumed = streams.ResumeConsumerGroup(spb.ResumeConsumerGroupRequest(topic=stream, name="g"))
    assert not resumed.consumer_group.paused
    assert [m.body for m in _read(streams, stream).messages] == [b"3"]


def test_a_streaming_read_of_a_paused_group_fails_unavailable(streams, stream):
    streams.PauseConsumerGroup(spb.PauseConsumerGroupRequest(topic=stream, name="g"))
    responses = streams.StreamingReadStream(
        spb.StreamingReadStreamRequest(topic=stream, consumer_group="g")
    )
    error = error_of(next, responses)
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "is paused" in error.details()


@pytest.mark.parametrize("method", ["PauseConsumerGroup", "ResumeConsumerGroup"])
def test_pausing_or_resuming_a_group_that_does_not_exist_is_not_found(streams, stream, method):
    request_type = getattr(spb, f"{method}Request")
    error = error_of(getattr(streams, method), request_type(topic=stream, name="nobody"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "consumer group 'nobody'" in error.details()
    assert not _group(streams, stream).paused
