"""Ids and page tokens the server did not issue are the caller's error, naming the field."""

from __future__ import annotations

import base64

import grpc
import pytest
from postbox.v1 import message_service_pb2 as mpb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import (
    queue_service_pb2_grpc,
    schedule_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import schedule_service_pb2 as spb
from postbox.v1 import stream_service_pb2 as stpb
from postbox.v1 import topic_service_pb2 as tpb
from support import api_methods, error_of


def _token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "message_id",
    ["١٢٣", "\uff11\uff12", " 12", "12 ", "12a", "", "-1", "+1", "1_000", "9" * 19, "1.0"],
)
def test_message_ids_are_ascii_digits(messages, queue, message_id):
    sent = messages.Send(mpb.SendRequest(queue=queue, body=b"x"))
    # '١٢٣' is 123 to int(); make sure such an id would find a message if it were read so.
    assert int(sent.message_id) > 0
    error = error_of(messages.GetMessage, mpb.GetMessageRequest(queue=queue, message_id=message_id))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "message_id" in error.details()


def test_an_arabic_indic_id_does_not_find_its_ascii_twin(messages, queue):
    sent = messages.Send(mpb.SendRequest(queue=queue, body=b"x"))
    twin = sent.message_id.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    error = error_of(messages.GetMessage, mpb.GetMessageRequest(queue=queue, message_id=twin))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "task_id",
    ["", "not-a-uuid", "١٢٣٤٥٦٧٨-1234-1234-1234-123456789abc", "\uff11" * 32, "x" * 100_000],
)
def test_task_ids_are_uuids(queues, task_id):
    error = error_of(queues.CancelRedriveTask, qpb.CancelRedriveTaskRequest(task_id=task_id))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "task_id" in error.details()
    assert len(error.details()) < 200


MALFORMED_TOKENS = [
    "!!not-a-token!!",
    "x!",
    "abc",  # not base64 (length)
    "YWJj",  # base64 of 'abc', which this server never issues
    " " + _token("ListQueues:a"),  # a space the lenient decoder would skip
    _token("ListQueues:a") + "\n",
    "_w==",  # base64 of b'\xff', not UTF-8
    _token("PeekMessages:١٢٣"),
    _token("PeekMessages:12a"),
    _token("ListArchivedMessages:" + "9" * 19),
    _token("ListWebhookDeliveries:-1"),
]


def _list_calls(channel: grpc.Channel, queue: str) -> dict[str, object]:
    """Each List RPC, as a function of its page_token."""
    from postbox.v1 import message_service_pb2_grpc

    queues = queue_service_pb2_grpc.QueueServiceStub(channel)
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    schedules = schedule_service_pb2_grpc.ScheduleServiceStub(channel)
    streams = stream_service_pb2_grpc.StreamServiceStub(channel)
    return {
        "ListQueues": lambda t: queues.ListQueues(qpb.ListQueuesRequest(page_token=t)),
        "ListDeadLetterSourceQueues": lambda t: queues.ListDeadLetterSourceQueues(
            qpb.ListDeadLetterSourceQueuesRequest(dead_letter_queue=queue, page_token=t)
        ),
        "ListRedriveTasks": lambda t: queues.ListRedriveTasks(
            qpb.ListRedriveTasksRequest(dead_letter_queue=queue, page_token=t)
        ),
        "PeekMessages": lambda t: messages.PeekMessages(
            mpb.PeekMessagesRequest(queue=queue, page_token=t)
        ),
        "ListArchivedMessages": lambda t: messages.ListArchivedMessages(
            mpb.ListArchivedMessagesRequest(queue=queue, page_token=t)
        ),
        "ListMessages": lambda t: messages.ListMessages(
            mpb.ListMessagesRequest(queue=queue, page_token=t)
        ),
        "ListTopics": lambda t: topics.ListTopics(tpb.ListTopicsRequest(page_token=t)),
        "ListSubscriptions": lambda t: topics.ListSubscriptions(
            tpb.ListSubscriptionsRequest(topic="no_such_topic", page_token=t)
        ),
        "ListWebhookDeliveries": lambda t: topics.ListWebhookDeliveries(
            tpb.ListWebhookDeliveriesRequest(topic="no_such_topic", page_token=t)
        ),
        "ListSchedules": lambda t: schedules.ListSchedules(spb.ListSchedulesRequest(page_token=t)),
        "ListConsumerGroups": lambda t: streams.ListConsumerGroups(
            stpb.ListConsumerGroupsRequest(topic="no_such_topic", page_token=t)
        ),
        "ListStreamDeadLetters": lambda t: streams.ListStreamDeadLetters(
            stpb.ListStreamDeadLettersRequest(
                topic="no_such_topic", consumer_group="g", page_token=t
            )
        ),
    }


def test_every_list_rpc_with_a_page_token_is_here(channel):
    services = {
        "QueueService", "MessageService", "TopicService", "ScheduleService", "StreamService",
    }  # fmt: skip
    methods = [m for m in api_methods() if m.containing_service.name in services]
    with_tokens = {m.name for m in methods if "page_token" in [f.name for f in m.input_type.fields]}
    assert with_tokens == set(_list_calls(channel, "q"))


@pytest.mark.parametrize("token", MALFORMED_TOKENS)
def test_page_tokens_not_issued_here_are_invalid(channel, queue, token):
    for method, call in _list_calls(channel, queue).items():
        error = error_of(call, token)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, error.details())
        assert "page_token is not one this server issued" in error.details(), method
        assert method in error.details()


def test_a_token_works_only_for_the_method_that_issued_it(messages, queue):
    messages.SendBatch(
        mpb.SendBatchRequest(queue=queue, entries=[mpb.SendBatchEntry(body=b"x")] * 3)
    )
    page = messages.PeekMessages(mpb.PeekMessagesRequest(queue=queue, page_size=1))
    assert page.next_page_token
    following = messages.PeekMessages(
        mpb.PeekMessagesRequest(queue=queue, page_size=1, page_token=page.next_page_token)
    )
    assert following.messages[0].message_id != page.messages[0].message_id
    error = error_of(
        messages.ListArchivedMessages,
        mpb.ListArchivedMessagesRequest(queue=queue, page_token=page.next_page_token),
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
