"""HTTP/JSON: every RPC over the Connect protocol, called with a plain HTTP client
(aiohttp) against a real server over real sockets; never the generated stubs for the
calls. gRPC is called only to compare: the same request must fail the same way.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import ssl
import struct
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import grpc
import psutil
import pytest
from certificates import Authority
from google.protobuf import message_factory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import (
    ROOT,
    HttpServerProcess,
    api_methods,
    bootstrap_key,
    call_method,
    create_database,
    drop_database,
    free_port,
    scrape,
    unique_name,
)

JSON = {"Content-Type": "application/json"}
# The Connect spec's HTTP status of each code (connectrpc.com/docs/protocol).
CONNECT_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403,
    "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}  # fmt: skip
# The smallest limit --http-max-request-size takes, so a test can exceed it cheaply.
BODY_LIMIT = 64 * 1024
GREETING = {"dataType": "String", "stringValue": "greeting"}


HttpServer = HttpServerProcess


@pytest.fixture(scope="module")
def http_server(database_url: str) -> Iterator[HttpServer]:
    process = HttpServer(
        database_url,
        "--http-max-request-size", str(BODY_LIMIT),
        metrics=True,
    ).start()  # fmt: skip
    yield process
    process.stop()


@pytest.fixture
async def http(http_server: HttpServer) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(http_server.base) as session:
        yield session


async def call(
    session: aiohttp.ClientSession,
    procedure: str,
    body: Any,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POSTs a procedure; the HTTP status and the JSON answer."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(f"/postbox.v1.{procedure}", data=data, headers=headers or JSON) as r:
        return r.status, json.loads(await r.read())


def path_of(method) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


async def test_create_send_receive_delete_round_trip(http: aiohttp.ClientSession) -> None:
    name = unique_name("http_round_trip")
    status, created = await call(http, "QueueService/CreateQueue", {"queue": {"name": name}})
    assert status == 200, created
    assert created["queue"]["name"] == name
    assert created["queue"]["visibilityTimeout"] == "30s"  # Duration as proto3 JSON
    body = base64.b64encode(b"hello over HTTP").decode()
    status, sent = await call(
        http,
        "MessageService/Send",
        {"queue": name, "body": body, "attributes": {"kind": GREETING}},
    )
    assert status == 200, sent
    assert isinstance(sent["messageId"], str)  # int64 as a string
    status, received = await call(
        http, "MessageService/Receive", {"queue": name, "maxMessages": 10, "waitTime": "5s"}
    )
    assert status == 200, received
    [message] = received["messages"]
    assert message["messageId"] == sent["messageId"]
    assert base64.b64decode(message["body"]) == b"hello over HTTP"
    assert message["attributes"] == {"kind": GREETING}
    status, deleted = await call(
        http, "MessageService/Delete", {"queue": name, "receipt": message["receipt"]}
    )
    assert (status, deleted) == (200, {})
    status, again = await call(http, "MessageService/Receive", {"queue": name, "waitTime": "0s"})
    assert (status, again) == (200, {})
    status, _ = await call(http, "QueueService/DeleteQueue", {"name": name})
    assert status == 200
    status, gone = await call(http, "QueueService/GetQueue", {"name": name})
    assert status == 404
    assert gone["code"] == "not_found"


async def test_a_jobs_life_over_http(http: aiohttp.ClientSession) -> None:
    name = unique_name("http_jobs")
    status, _ = await call(
        http, "QueueService/CreateQueue", {"queue": {"name": name, "archiveOnDelete": True}}
    )
    assert status == 200
    status, sent = await call(http, "MessageService/Send", {"queue": name, "maxReceiveCount": 3})
    assert status == 200, sent
    status, received = await call(
        http, "MessageService/Receive", {"queue": name, "consumerId": "http-worker"}
    )
    [message] = received["messages"]
    result = base64.b64encode(b'{"ok": true}').decode()
    ack = {"queue": name, "receipt": message["receipt"], "result": result}
    status, deleted = await call(http, "MessageService/Delete", ack)
    assert (status, deleted) == (200, {})
    status, found = await call(
        http, "MessageService/GetMessage", {"queue": name, "messageId": sent["messageId"]}
    )
    assert status == 200, found
    job = found["message"]
    assert job["state"] == "MESSAGE_STATE_SUCCEEDED"
    assert (job["consumerId"], job["receiveCount"], job["queue"]) == ("http-worker", 1, name)
    assert base64.b64decode(job["result"]) == b'{"ok": true}'
    assert {"enqueueTime", "firstReceiveTime", "finishTime"} <= set(job)
    status, listed = await call(
        http, "MessageService/ListMessages", {"queue": name, "state": "MESSAGE_STATE_SUCCEEDED"}
    )
    assert [m["messageId"] for m in listed["messages"]] == [sent["messageId"]]
    status, bad = await call(
        http, "MessageService/Receive", {"queue": name, "consumerId": "has space"}
    )
    assert (status, bad["code"]) == (400, "invalid_argument")
    assert "consumer_id 'has space'" in bad["message"]
    await call(http, "QueueService/DeleteQueue", {"name": name})


def _connect_code(code: grpc.StatusCode) -> str:
    return "canceled" if code is grpc.StatusCode.CANCELLED else code.name.lower()


@pytest.mark.parametrize("method", api_methods(), ids=path_of)
async def test_every_rpc_answers_an_empty_request_as_grpc_does(
    method, http: aiohttp.ClientSession, http_server: HttpServer
) -> None:
    """Every method of every service (from the descriptors, so a new RPC is covered):
    an empty message over HTTP gets gRPC's code and message for the same request, with
    the code's HTTP status; nothing but the bidirectional stream is a 5xx."""
    status, answer = await call(
        http,
        path_of(method).removeprefix("/postbox.v1."),
        {},
        {**JSON, "Connect-Timeout-Ms": "5000"},
    )
    if method.client_streaming:
        assert status == 501, answer
        assert answer["code"] == "unimplemented"
        assert "HTTP/1.1" in answer["message"]
        assert ", or use " in answer["message"]  # what to call instead
        return
    assert status < 500, answer
    request = message_factory.GetMessageClass(method.input_type)()
    with grpc.insecure_channel(http_server.target) as channel:
        code, details = call_method(channel, method, request, stream_timeout=5)
    if code is grpc.StatusCode.OK:
        assert status == 200, answer
        return
    assert answer == {"code": _connect_code(code), "message": details}
    assert status == CONNECT_STATUS[answer["code"]]


async def test_errors_map_to_connect_codes_and_http_statuses(
    http: aiohttp.ClientSession, http_server: HttpServer
) -> None:
    missing = unique_name("missing")
    status, answer = await call(http, "QueueService/GetQueue", {"name": missing})
    assert status == 404
    assert answer == {"code": "not_found", "message": f"queue {missing!r} does not exist"}
    status, answer = await call(http, "QueueService/CreateQueue", {"queue": {"name": "no spaces"}})
    assert status == 400
    assert answer["code"] == "invalid_argument"
    from postbox.v1 import queue_service_pb2 as qpb

    with grpc.insecure_channel(http_server.target) as channel:
        code, details = call_method(
            channel,
            qpb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name["CreateQueue"],
            qpb.CreateQueueRequest(queue=qpb.Queue(name="no spaces")),
        )
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, answer["message"])
    name = unique_name("exists")
    assert (await call(http, "QueueService/CreateQueue", {"queue": {"name": name}}))[0] == 200
    status, answer = await call(http, "QueueService/CreateQueue", {"queue": {"name": name}})
    assert status == 409
    assert answer["code"] == "already_exists"


async def test_bad_requests_get_precise_4xx(http: aiohttp.ClientSession) -> None:
    queue = "QueueService/GetQueue"
    status, answer = await call(http, queue, b"{not json")
    assert status == 400
    assert answer["code"] == "invalid_argument"
    assert "proto3 JSON" in answer["message"]
    status, answer = await call(http, queue, b"")
    assert status == 400
    assert "empty" in answer["message"]
    status, answer = await call(http, queue, {"name": "x", "colour": "blue"})
    assert status == 400
    assert answer["code"] == "invalid_argument"
    assert "colour" in answer["message"]
    for not_an_object in ([], None, "x", ["name"]):
        status, answer = await call(http, queue, not_an_object)
        assert status == 400, not_an_object
        assert answer["code"] == "invalid_argument"
    status, answer = await call(http, queue, b'{"name": ' + b"[" * 30_000 + b"]" * 30_000 + b"}")
    assert status == 400  # deeper than Python's recursion: still the caller's error
    status, answer = await call(http, queue, b'{"name": "x", "name": "y"}')
    assert status == 400
    assert "duplicate" in answer["message"]
    status, answer = await call(http, queue, {"name": 12})
    assert status == 400
    assert answer["code"] == "invalid_argument"
    status, answer = await call(http, queue, b"\xff\xfe", headers=JSON)
    assert status == 400
    assert "UTF-8" in answer["message"]
    async with http.post(
        f"/postbox.v1.{queue}", data=b'{"name":"x"}', headers={"Content-Type": "text/plain"}
    ) as response:
        assert response.status == 415
        assert response.headers["Accept-Post"] == "application/json, application/proto"
        assert (await response.json())["code"] == "invalid_argument"
    async with http.get(f"/postbox.v1.{queue}") as response:
        assert response.status == 405
        assert response.headers["Allow"] == "POST"
    status, answer = await call(http, "QueueService/NoSuchMethod", {})
    assert status == 404
    assert answer["code"] == "not_found"
    status, answer = await call(
        http, queue, {"name": "x"}, headers={**JSON, "Connect-Timeout-Ms": "soon"}
    )
    assert status == 400
    assert "Connect-Timeout-Ms" in answer["message"]
    # Streaming content types are for streaming methods only.
    status, answer = await call(
        http, queue, b"", headers={"Content-Type": "application/connect+json"}
    )
    assert status == 415


# Any JSON value, nested a little.
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
# Not AccessService: a key created by chance would turn authentication on for every
# other test of the run (as in test_survival_malformed).
FUZZED = [m for m in api_methods() if m.containing_service.name != "AccessService"]


@st.composite
def json_requests(draw: st.DrawFn) -> tuple[Any, dict[str, Any]]:
    """A method and a body of its request's JSON field names (some unknown) with any
    values: mostly wrong types, sometimes right ones."""
    method = draw(st.sampled_from(FUZZED))
    names = [f.json_name for f in method.input_type.fields] + ["unknownField"]
    body = draw(st.dictionaries(st.sampled_from(names), JSON_VALUES, max_size=4))
    return method, body


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(json_requests())
def test_any_json_body_is_the_callers_error_never_the_servers(
    http_server: HttpServer, request: tuple[Any, dict[str, Any]]
) -> None:
    method, body = request
    headers = {**JSON, "Connect-Timeout-Ms": "3000"}  # a continuous Receive may wait
    posted = urllib.request.Request(
        f"{http_server.base}{path_of(method)}", data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(posted, timeout=30) as response:
            status, answer = response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:
        status, answer = refused.code, json.loads(refused.read())
    if method.client_streaming:
        assert status == 501
        return
    assert status in (200, 400, 404, 409, 429, 504), (status, answer, body)
    if status != 200:
        assert answer["code"] in ("invalid_argument", "failed_precondition", "out_of_range",
                                  "not_found", "already_exists", "aborted",
                                  "resource_exhausted", "deadline_exceeded"), answer  # fmt: skip


def _raw_http(port: int, request: bytes) -> bytes:
    """What the server answers to these bytes on a plain socket, read to its end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


async def test_a_body_over_the_limit_is_refused_before_and_while_read(
    http: aiohttp.ClientSession, http_server: HttpServer
) -> None:
    # Announced: refused on its Content-Length, before any of it is read.
    head = (
        "POST /postbox.v1.QueueService/GetQueue HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {BODY_LIMIT + 1}\r\n\r\n"
    ).encode()
    answer = await asyncio.to_thread(_raw_http, http_server.http_port, head)
    assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
    assert b'"resource_exhausted"' in answer
    assert str(BODY_LIMIT).encode() in answer

    # Unannounced (chunked): refused once it grows past the limit.
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"name": "'
        for _ in range(BODY_LIMIT // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    async with http.post(
        "/postbox.v1.QueueService/GetQueue", data=chunks(), headers=JSON
    ) as response:
        assert response.status == 429
        assert (await response.json())["code"] == "resource_exhausted"
    # At the limit it is read: a name too long for a queue, said by the service.
    name = "x" * (BODY_LIMIT - len('{"name": ""}'))
    status, answer = await call(http, "QueueService/GetQueue", {"name": name})
    assert status == 400, answer
    assert answer["code"] == "invalid_argument"


async def test_binary_protobuf_and_connect_streaming(http: aiohttp.ClientSession) -> None:
    from postbox.v1 import queue_service_pb2 as qpb

    name = unique_name("http_binary")
    request = qpb.CreateQueueRequest(queue=qpb.Queue(name=name))
    async with http.post(
        "/postbox.v1.QueueService/CreateQueue",
        data=request.SerializeToString(),
        headers={"Content-Type": "application/proto"},
    ) as response:
        assert response.status == 200
        assert response.content_type == "application/proto"
        assert qpb.CreateQueueResponse.FromString(await response.read()).queue.name == name
    for body in (b"a", b"b", b"c"):
        status, _ = await call(
            http, "MessageService/Send", {"queue": name, "body": base64.b64encode(body).decode()}
        )
        assert status == 200
    # Connect server streaming: an enveloped request; enveloped responses, then the end.
    receive = json.dumps({"queue": name, "maxMessages": 1, "mode": "RECEIVE_MODE_CONTINUOUS",
                          "maxTotalMessages": "3"}).encode()  # fmt: skip
    async with http.post(
        "/postbox.v1.MessageService/Receive",
        data=struct.pack(">BI", 0, len(receive)) + receive,
        headers={"Content-Type": "application/connect+json"},
    ) as response:
        assert response.status == 200
        data = await response.read()
    frames = []
    while data:
        flags, length = struct.unpack_from(">BI", data)
        frames.append((flags, json.loads(data[5 : 5 + length])))
        data = data[5 + length :]
    *messages, (end_flags, end) = frames
    assert end_flags == 2
    assert end == {}
    assert [flags for flags, _ in messages] == [0, 0, 0]
    bodies = [base64.b64decode(frame["messages"][0]["body"]) for _, frame in messages]
    assert bodies == [b"a", b"b", b"c"]
    # An error inside a stream comes in the end-of-stream envelope.
    bad = json.dumps({"queue": unique_name("absent"), "waitTime": "0s"}).encode()
    async with http.post(
        "/postbox.v1.MessageService/Receive",
        data=struct.pack(">BI", 0, len(bad)) + bad,
        headers={"Content-Type": "application/connect+json"},
    ) as response:
        data = await response.read()
    flags, length = struct.unpack_from(">BI", data)
    assert flags == 2
    assert json.loads(data[5:])["error"]["code"] == "not_found"


async def test_a_long_poll_receive_answers_as_soon_as_a_message_is_sent(
    http: aiohttp.ClientSession, database_url: str
) -> None:
    name = unique_name("http_long_poll")
    assert (await call(http, "QueueService/CreateQueue", {"queue": {"name": name}}))[0] == 200
    waiting = asyncio.ensure_future(
        call(http, "MessageService/Receive", {"queue": name, "waitTime": "120s"})
    )
    # The receive found nothing and waits: its server now listens for the queue's sends.
    conn = await asyncpg.connect(database_url)
    try:
        for _ in range(600):
            listening = await conn.fetchval(
                "SELECT EXISTS (SELECT FROM postbox.queue_listeners l "
                "JOIN postbox.queues q ON q.id = l.queue_id WHERE q.name = $1)",
                name,
            )
            if listening:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the receive never started waiting")
    finally:
        await conn.close()
    assert not waiting.done()
    loop = asyncio.get_running_loop()
    sent_at = loop.time()
    status, _ = await call(http, "MessageService/Send", {"queue": name, "body": "d29rZQ=="})
    assert status == 200
    # Generous: a wake-up takes milliseconds, but this machine is shared and loaded; far
    # below the 120 s wait, and below the server's safety poll (10 s), so only the
    # send's wake-up can have answered it.
    status, received = await asyncio.wait_for(waiting, 9)
    assert status == 200
    assert len(received["messages"]) == 1
    assert loop.time() - sent_at < 9


async def _open_streams(http_server: HttpServer) -> float:
    assert http_server.metrics_port is not None
    samples = await asyncio.to_thread(scrape, http_server.metrics_port)
    return samples[("postbox_open_streams", frozenset())]


async def _until(condition, what: str, timeout: float = 30) -> None:
    """Polls an async condition until it holds (the bound only catches a hang)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what}: not after {timeout} s")
        await asyncio.sleep(0.05)


async def test_a_client_that_hangs_up_ends_its_long_poll(
    http: aiohttp.ClientSession, http_server: HttpServer
) -> None:
    """The HTTP call is cancelled with its connection, as a gRPC call is: the Receive
    stops waiting, so a message sent afterwards is not claimed for nobody."""
    name = unique_name("http_hang_up")
    assert (await call(http, "QueueService/CreateQueue", {"queue": {"name": name}}))[0] == 200
    async with aiohttp.ClientSession(http_server.base) as leaving:
        waiting = asyncio.ensure_future(
            call(leaving, "MessageService/Receive", {"queue": name, "waitTime": "120s"})
        )
        await _until(lambda: _open_streams_are(http_server, 1), "the receive is open")
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
    await _until(lambda: _open_streams_are(http_server, 0), "the server ended the receive")
    status, _ = await call(http, "MessageService/Send", {"queue": name, "body": "eA=="})
    assert status == 200
    status, answer = await call(http, "MessageService/Receive", {"queue": name, "waitTime": "0s"})
    assert status == 200
    assert len(answer["messages"]) == 1


async def _open_streams_are(http_server: HttpServer, count: int) -> bool:
    return await _open_streams(http_server) == count


async def test_a_long_poll_ends_before_the_callers_deadline(http: aiohttp.ClientSession) -> None:
    """Connect-Timeout-Ms is the call's deadline, as a gRPC deadline is: the long poll
    ends at it, not at its 60 s wait. It aims 50 ms early and answers empty; on a loaded
    machine its last look can run past the deadline, which the server then enforces
    (deadline_exceeded), as a gRPC server does."""
    name = unique_name("http_deadline")
    assert (await call(http, "QueueService/CreateQueue", {"queue": {"name": name}}))[0] == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, answer = await call(
        http,
        "MessageService/Receive",
        {"queue": name, "waitTime": "60s"},
        {**JSON, "Connect-Timeout-Ms": "1500"},
    )
    elapsed = loop.time() - started
    assert (status, answer) == (200, {}) or (status, answer["code"]) == (504, "deadline_exceeded")
    # Not before the deadline; well under the 60 s wait (generous for a loaded machine).
    assert 1.4 < elapsed < 20


def test_serve_refuses_an_anonymous_http_network_address(admin_url: str) -> None:
    """--http-host follows --grpc-host's rule: beyond loopback only with a key, or on
    purpose."""
    url = create_database(admin_url, "postbox_http_open")
    try:
        result = subprocess.run(
            [sys.executable, "-m", "postbox_server", "serve", "--database-url", url,
             "--grpc-host", "127.0.0.1", "--grpc-port", str(free_port()),
             "--http-host", "0.0.0.0", "--http-port", str(free_port())],
            capture_output=True, text=True, cwd=ROOT, timeout=60,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "'0.0.0.0'" in result.stderr
        assert "--insecure-allow-anonymous" in result.stderr
    finally:
        drop_database(admin_url, url)


async def test_health_and_openapi_document(http: aiohttp.ClientSession) -> None:
    async with http.get("/healthz") as response:
        assert response.status == 200
        assert await response.json() == {"status": "SERVING"}
    async with http.get("/openapi.json") as response:
        assert response.status == 200
        served = await response.json()
    committed = json.loads((ROOT / "api" / "openapi.json").read_text())
    assert served == committed
    # Every method HTTP serves; a request-streaming one is gRPC only (HTTP answers 501).
    assert {
        f"/{m.containing_service.full_name}/{m.name}"
        for m in api_methods()
        if not m.client_streaming
    } == set(served["paths"])
    assert "/postbox.v1.MessageService/StreamingReceive" not in served["paths"]
    assert all(set(operations) == {"post"} for operations in served["paths"].values())
    queue = served["components"]["schemas"]["postbox.v1.Queue"]["properties"]
    assert (queue["maxDepth"]["type"], queue["maxDepth"]["format"]) == ("string", "int64")
    assert queue["maxDepth"]["description"].startswith("Optional. Most messages the queue")
    assert queue["visibilityTimeout"]["type"] == "string"
    assert queue["createTime"]["format"] == "date-time"
    message = served["components"]["schemas"]["postbox.v1.Message"]["properties"]
    assert (message["body"]["type"], message["body"]["format"]) == ("string", "byte")
    receive = served["paths"]["/postbox.v1.MessageService/Receive"]["post"]
    assert receive["description"].startswith("Claims messages")  # the proto's comment


def test_the_documented_curl_examples_run_as_written(http_server: HttpServer) -> None:
    """The block of docs/clients/http.md, but its `postbox serve` (this server stands in)
    and with a queue name of this run's (the database is shared)."""
    page = (ROOT / "docs" / "clients" / "http.md").read_text()
    block = page.split("<!-- http examples", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if not line.startswith("postbox serve")]
    name = unique_name("readme_orders")
    script = "\n".join(lines).replace("localhost:8080", f"127.0.0.1:{http_server.http_port}")
    script = script.replace('"orders"', f'"{name}"').replace('\\"orders\\"', f'\\"{name}\\"')
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    answers, text = [], result.stdout  # curl adds no newline: one JSON value after another
    while text.strip():
        answer, end = json.JSONDecoder().raw_decode(text.strip())
        answers.append(answer)
        text = text.strip()[end:]
    created, sent, deleted, missing = answers
    assert created["queue"]["name"] == name
    assert sent["messageId"]
    assert deleted == {}
    assert missing == {"code": "not_found", "message": "queue 'nope' does not exist"}


async def test_workers_share_the_http_port(database_url: str) -> None:
    """serve --workers 2: both workers listen on the HTTP port (SO_REUSEPORT) and the
    kernel spreads connections over them (all 24 on one: 2 ** -23)."""
    process = HttpServer(database_url, "--workers", "2").start()
    try:
        children = process.wait_workers_listening(2, process.http_port)
        name = unique_name("http_workers")
        sessions = [aiohttp.ClientSession(process.base) for _ in range(24)]
        try:
            create = {"queue": {"name": name}}
            assert (await call(sessions[0], "QueueService/CreateQueue", create))[0] == 200
            for session in sessions:
                status, answer = await call(
                    session, "MessageService/Send", {"queue": name, "body": "eA=="}
                )
                assert status == 200, answer
            # Each worker holds kept-alive connections over which these calls succeeded.
            for child in children:
                served = [
                    c
                    for c in child.net_connections(kind="tcp")
                    if c.laddr.port == process.http_port and c.status == psutil.CONN_ESTABLISHED
                ]
                assert served, f"worker {child.pid} has no HTTP connection"
            status, answer = await call(sessions[0], "QueueService/GetQueue", {"name": name})
            assert answer["queue"]["stats"]["visibleMessages"] == "24"
        finally:
            for session in sessions:
                await session.close()
    finally:
        process.stop()


def test_connect_clients_speak_it(http_server: HttpServer) -> None:
    """The committed TypeScript stubs with Connect for Node's Connect transport (HTTP/1.1,
    JSON: what @connectrpc/connect-web does in a browser): unary calls, a server stream,
    an error with its code and message."""
    assert (ROOT / "stubs/ts/node_modules").is_dir(), "run `npm ci --prefix stubs/ts` first"
    scenario = ROOT / "tests" / "sdk" / "polyglot" / "ts" / "http_scenario.mjs"
    result = subprocess.run(
        ["node", str(scenario), http_server.base, unique_name("connect")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "6 passed, 0 failed" in result.stdout


def test_committed_openapi_document_is_generated_from_the_protos() -> None:
    from postbox_server.http.openapi import postbox_document, render

    assert (ROOT / "api" / "openapi.json").read_text() == render(postbox_document())


# Keys: a database of their own, as in test_auth (a key turns authentication on for
# every server of its database).


@pytest.fixture(scope="module")
def keyed_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_http_auth")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def keyed(keyed_database: str) -> Iterator[tuple[HttpServer, dict[str, str]]]:
    process = HttpServer(keyed_database).start()  # installs the engine the keys live in
    secrets = {
        "admin": bootstrap_key(keyed_database, "http-admin", "admin:*", "manage:*", "send:*",
                               "receive:*", "read:*"),
        "sender": bootstrap_key(keyed_database, "http-sender", "send:orders-*", "read:orders-*"),
    }  # fmt: skip
    list_queues = urllib.request.Request(
        f"{process.base}/postbox.v1.QueueService/ListQueues", data=b"{}", headers=JSON
    )

    def keys_known() -> bool:
        try:
            urllib.request.urlopen(list_queues, timeout=5).close()
        except urllib.error.HTTPError as refused:
            return refused.code == 401
        return False

    process.wait_ready(keys_known, "authentication turned on by the first key", 30)
    yield process, secrets
    process.stop()


def bearer(secret: str) -> dict[str, str]:
    return {**JSON, "Authorization": f"Bearer {secret}"}


async def test_api_keys_over_http_are_gRPC_s_rules(
    keyed: tuple[HttpServer, dict[str, str]],
) -> None:
    server, secrets = keyed
    queue = f"orders-{unique_name('keys')}"
    other = f"billing-{unique_name('keys')}"
    from postbox.v1 import message_service_pb2 as mpb
    from postbox.v1 import queue_service_pb2 as qpb

    with grpc.insecure_channel(server.target) as channel:
        create = qpb.DESCRIPTOR.services_by_name["QueueService"].methods_by_name["CreateQueue"]
        grpc_anonymous = call_method(channel, create, qpb.CreateQueueRequest())
    async with aiohttp.ClientSession(server.base) as http:
        for name in (queue, other):
            status, answer = await call(
                http,
                "QueueService/CreateQueue",
                {"queue": {"name": name}},
                bearer(secrets["admin"]),
            )
            assert status == 200, answer
        # No key: 401, gRPC's message; before the body is even looked at.
        status, answer = await call(http, "QueueService/CreateQueue", {})
        assert status == 401
        assert answer == {"code": "unauthenticated", "message": grpc_anonymous[1]}
        assert grpc_anonymous[0] is grpc.StatusCode.UNAUTHENTICATED
        status, answer = await call(http, "QueueService/CreateQueue", b"{broken")
        assert status == 401
        assert answer["code"] == "unauthenticated"
        # A wrong key.
        status, answer = await call(http, "QueueService/ListQueues", {}, bearer("pbk_wrong"))
        assert status == 401
        assert "not known" in answer["message"]
        # The right key, within its grants and beyond them.
        sender = bearer(secrets["sender"])
        status, answer = await call(
            http, "MessageService/Send", {"queue": queue, "body": "aGk="}, sender
        )
        assert status == 200, answer
        status, answer = await call(
            http, "MessageService/Send", {"queue": other, "body": "aGk="}, sender
        )
        assert status == 403
        assert answer["code"] == "permission_denied"
        with grpc.insecure_channel(server.target) as channel:
            send = mpb.DESCRIPTOR.services_by_name["MessageService"].methods_by_name["Send"]
            denied = channel.unary_unary(f"/postbox.v1.MessageService/{send.name}")
            with pytest.raises(grpc.RpcError) as caught:
                denied(
                    mpb.SendRequest(queue=other, body=b"hi").SerializeToString(),
                    metadata=[("authorization", f"Bearer {secrets['sender']}")],
                    timeout=10,
                )
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert answer["message"] == caught.value.details()
        assert "'send'" in answer["message"]
        assert other in answer["message"]
        status, answer = await call(http, "QueueService/DeleteQueue", {"name": queue}, sender)
        assert status == 403
        # A malformed body from a key is the key's to hear about.
        status, answer = await call(http, "QueueService/GetQueue", b"{broken", sender)
        assert status == 400
        assert answer["code"] == "invalid_argument"
        # Lists come back filtered to what the key may read, as over gRPC.
        status, answer = await call(http, "QueueService/ListQueues", {}, sender)
        assert status == 200
        names = {q["name"] for q in answer.get("queues", [])}
        assert queue in names
        assert other not in names
        # Health and the document stay open.
        async with http.get("/healthz") as response:
            assert response.status == 200
        async with http.get("/openapi.json") as response:
            assert response.status == 200


def _tls_context(ca: Path, client: Any = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(client.certificate, client.key)
    return context


async def test_tls_and_mutual_tls(database_url: str, tmp_path: Path) -> None:
    authority = Authority(tmp_path, "postbox")
    server_pair = authority.issue("server", server=True)
    client_pair = authority.issue("client", server=False)
    credentials = client_pair.tls(authority.path).credentials()
    process = HttpServer(
        database_url,
        "--tls-cert", str(server_pair.certificate),
        "--tls-key", str(server_pair.key),
        "--tls-client-ca", str(authority.path),
        scheme="https",
        credentials=credentials,
    ).start()  # fmt: skip
    try:
        with_cert = aiohttp.TCPConnector(ssl=_tls_context(authority.path, client_pair))
        async with aiohttp.ClientSession(process.base, connector=with_cert) as http:
            status, answer = await call(http, "QueueService/ListQueues", {})
            assert status == 200, answer
        without = aiohttp.TCPConnector(ssl=_tls_context(authority.path))
        async with aiohttp.ClientSession(process.base, connector=without) as http:
            with pytest.raises(aiohttp.ClientError):
                await call(http, "QueueService/ListQueues", {})
        plain = aiohttp.ClientSession(f"http://127.0.0.1:{process.http_port}")
        async with plain as http:
            with pytest.raises(aiohttp.ClientError):
                await call(http, "QueueService/ListQueues", {})
    finally:
        process.stop()
