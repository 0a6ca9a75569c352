"""The request id (`x-request-id`) of a call: taken from the caller or made by the server,
echoed in the response of every door, and on every log line and span of the call."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from auth_support import wait_until
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2, queue_service_pb2_grpc
from support import HttpServerProcess, SqsShimProcess, seconds, unique_name

from postbox_server.observability.request_ids import MAX_LENGTH

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def logged(database_url: str) -> Iterator[HttpServerProcess]:
    server = HttpServerProcess(database_url, "--log-format", "json", "--log-level", "DEBUG")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shim(logged: HttpServerProcess) -> Iterator[SqsShimProcess]:
    process = SqsShimProcess(logged.target, "--log-format", "json", "--log-level", "DEBUG")
    process.start()
    yield process
    process.stop()


def _records(process) -> list[dict]:
    return [json.loads(line) for line in process.log().splitlines() if line.startswith("{")]


def _echoed(metadata) -> str | None:
    return dict(metadata or ()).get("x-request-id")


def _receive_absent(channel: grpc.Channel, metadata=()) -> grpc.RpcError:
    stub = message_service_pb2_grpc.MessageServiceStub(channel)
    request = pb.ReceiveRequest(queue=unique_name("absent"), wait_time=seconds(0))
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Receive(request, metadata=metadata, timeout=10))
    return caught.value


def test_a_grpc_call_echoes_the_callers_id_and_logs_it(logged: HttpServerProcess) -> None:
    with grpc.insecure_channel(logged.target) as channel:
        error = _receive_absent(channel, (("x-request-id", "req-grpc-1"),))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert _echoed(error.trailing_metadata()) == "req-grpc-1"

    def call_lines() -> list[dict]:
        return [r for r in _records(logged) if r.get("rpc") == "/postbox.v1.MessageService/Receive"]

    # Every line written while serving the call carries its id.
    wait_until(call_lines, 10, "a log line of the call")
    assert {line.get("request_id") for line in call_lines()} == {"req-grpc-1"}


def test_a_grpc_call_without_an_id_gets_a_new_one(logged: HttpServerProcess) -> None:
    with grpc.insecure_channel(logged.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        _, first = queues.ListQueues.with_call(queue_service_pb2.ListQueuesRequest())
        _, second = queues.ListQueues.with_call(queue_service_pb2.ListQueuesRequest())
    assert UUID.fullmatch(_echoed(first.trailing_metadata()) or "")
    assert _echoed(first.trailing_metadata()) != _echoed(second.trailing_metadata())


@pytest.mark.parametrize(
    "given", ["x" * (MAX_LENGTH + 1), "has space", ""], ids=["too-long", "space", "empty"]
)
def test_an_unusable_id_is_replaced(given: str, logged: HttpServerProcess) -> None:
    with grpc.insecure_channel(logged.target) as channel:
        error = _receive_absent(channel, (("x-request-id", given),))
    assert UUID.fullmatch(_echoed(error.trailing_metadata()) or "")


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}


def test_http_responses_echo_the_id(logged: HttpServerProcess) -> None:
    url = f"{logged.base}/postbox.v1.QueueService/ListQueues"
    json_type = {"Content-Type": "application/json"}
    status, headers = _post(url, b"{}", {**json_type, "x-request-id": "req-http-1"})
    assert status == 200
    assert headers["x-request-id"] == "req-http-1"
    status, headers = _post(url, b"{}", json_type)
    assert UUID.fullmatch(headers["x-request-id"])
    # An error answer carries it too.
    get = f"{logged.base}/postbox.v1.QueueService/GetQueue"
    body = json.dumps({"name": unique_name("absent")}).encode()
    status, headers = _post(get, body, {**json_type, "x-request-id": "req-http-2"})
    assert status == 404
    assert headers["x-request-id"] == "req-http-2"


def test_the_sqs_shim_echoes_the_id_and_passes_it_to_the_server(
    logged: HttpServerProcess, shim: SqsShimProcess
) -> None:
    headers = {
        "Content-Type": "application/x-amz-json-1.0",
        "X-Amz-Target": "AmazonSQS.ReceiveMessage",
        "x-request-id": "req-sqs-1",
    }
    body = json.dumps({"QueueUrl": f"{shim.endpoint}/000000000000/{unique_name('absent')}"})
    status, answer = _post(shim.endpoint, body.encode(), headers)
    assert status == 400
    assert answer["x-request-id"] == "req-sqs-1"
    assert answer["x-amzn-requestid"] == "req-sqs-1"

    def server_lines() -> list[dict]:
        return [r for r in _records(logged) if r.get("request_id") == "req-sqs-1"]

    wait_until(server_lines, 10, "the server's log line of the shim's call")
    status, answer = _post(shim.endpoint, b"{}", {**headers, "x-request-id": "z" * 200})
    assert UUID.fullmatch(answer["x-request-id"])
    assert answer["x-amzn-requestid"] == answer["x-request-id"]
