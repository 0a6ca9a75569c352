"""A servicer that raises something unexpected: the caller gets UNKNOWN and the exception's
type, never its text or a traceback, over gRPC and HTTP alike; the server's log gets the
whole of it; and the server goes on serving.

The crash is real, not injected into the server: the test's own database gets a
`postbox.get_queue` whose row holds a value the server does not know (a redrive permission
named after the queue), as a hand-edited or half-upgraded engine would give it. The
server's lookup then raises a KeyError whose text is that value: were the exception's text
passed on, as grpc.aio does by default, the caller would read it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import queue_service_pb2_grpc
from support import HttpServerProcess, create_database, drop_database, run_sql

# The queue's name carries a marker that must not come back in any error.
QUEUE = "crash-marker-7f3a"

BROKEN_GET_QUEUE = """
CREATE OR REPLACE FUNCTION postbox.get_queue(queue_name text) RETURNS postbox.queues
LANGUAGE plpgsql STABLE AS $$
DECLARE
    q postbox.queues := postbox._queue(queue_name);
BEGIN
    q.redrive_permission := q.name;
    RETURN q;
END
$$
"""


@pytest.fixture(scope="module")
def broken_server(admin_url: str) -> Iterator[HttpServerProcess]:
    """A server on a database of its own, whose get_queue is then broken."""
    url = create_database(admin_url, "postbox_crash")
    process = HttpServerProcess(url).start()
    try:
        with grpc.insecure_channel(process.target) as channel:
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)
            queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=QUEUE)))
        run_sql(url, BROKEN_GET_QUEUE)
        yield process
    finally:
        process.stop()
        drop_database(admin_url, url)


def test_a_crash_answers_unknown_with_the_type_only(broken_server: HttpServerProcess) -> None:
    with grpc.insecure_channel(broken_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            queues.GetQueue(qpb.GetQueueRequest(name=QUEUE), timeout=30)
        error = raised.value
        assert error.code() == grpc.StatusCode.UNKNOWN, error.details()
        assert error.details() == "Unexpected KeyError", error.details()

        # The server is not harmed: a call that does not meet the broken function works.
        listed = queues.ListQueues(qpb.ListQueuesRequest(), timeout=30)
        assert [q.name for q in listed.queues] == [QUEUE]

    # The whole story is in the server's log, for the operator.
    log = broken_server.log()
    assert "Traceback" in log
    assert f"KeyError: '{QUEUE}'" in log


def test_a_crash_over_http_is_the_same(broken_server: HttpServerProcess) -> None:
    request = urllib.request.Request(
        f"{broken_server.base}/postbox.v1.QueueService/GetQueue",
        data=json.dumps({"name": QUEUE}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(request, timeout=30)
    answer = json.loads(raised.value.read())
    assert answer["code"] == "unknown", answer
    assert answer["message"] == "Unexpected KeyError", answer
    assert raised.value.code == 500
