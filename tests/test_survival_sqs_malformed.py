"""Malformed input to the SQS shim: random and truncated bodies and headers get 4xx, never 5xx.

Requests go over raw sockets, so nothing on the client side tidies them up: bodies
of random JSON or bytes to every action, random form fields, truncated requests,
lying Content-Length headers and garbage header lines. After it all the shim
still answers a well-formed call.
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlencode, urlsplit

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.sqs.shapes import ACTIONS

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
ACTION_NAMES = st.sampled_from(sorted(ACTIONS)) | st.text(max_size=20)
# Names the shim looks at, with values that are wrong for them.
FIELDS = st.sampled_from(
    ["QueueName", "QueueUrl", "MessageBody", "ReceiptHandle", "Entries", "Attributes",
     "MaxNumberOfMessages", "WaitTimeSeconds", "VisibilityTimeout", "DelaySeconds",
     "MessageAttributes", "AttributeNames", "Tags", "TagKeys", "MessageGroupId"]
) | st.text(min_size=1, max_size=12)  # fmt: skip


def exchange(endpoint: str, raw: bytes, *, half_close: bool = True) -> int | None:
    """Sends raw bytes; returns the response's status, or None if the shim just closed."""
    url = urlsplit(endpoint)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(raw)
        if half_close:
            sock.shutdown(socket.SHUT_WR)  # a truncated request ends here
        received = b""
        try:
            while b"\r\n" not in received:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                received += chunk
        except (ConnectionResetError, TimeoutError):
            return None
    if not received:
        return None
    status_line = received.split(b"\r\n", 1)[0].split()
    assert status_line[0].startswith(b"HTTP/"), received[:200]
    return int(status_line[1])


def request(host: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = ["POST / HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def assert_not_server_error(status: int | None) -> None:
    assert status is None or status < 500, status


def json_headers(action: str) -> dict[str, str]:
    return {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}


def test_random_json_bodies_to_every_action(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc

    @SETTINGS
    @given(action=ACTION_NAMES, body=st.dictionaries(FIELDS, JSON_VALUES, max_size=5) | JSON_VALUES)
    def run(action: str, body: object) -> None:
        payload = json.dumps(body).encode()
        status = exchange(sqs_shim.endpoint, request(host, json_headers(action), payload))
        assert_not_server_error(status)

    run()


def test_random_bytes_as_bodies(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc

    @SETTINGS
    @given(
        action=ACTION_NAMES,
        body=st.binary(max_size=200),
        content_type=st.sampled_from(
            ["application/x-amz-json-1.0", "application/x-www-form-urlencoded", "text/xml", ""]
        ),
    )
    def run(action: str, body: bytes, content_type: str) -> None:
        headers = {**json_headers(action), "Content-Type": content_type}
        assert_not_server_error(exchange(sqs_shim.endpoint, request(host, headers, body)))

    run()


def test_random_query_forms(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc

    @SETTINGS
    @given(
        action=ACTION_NAMES,
        fields=st.dictionaries(
            FIELDS | st.from_regex(r"\A[A-Za-z]+\.[0-9]{1,3}\.[A-Za-z]+\Z"), st.text(max_size=30),
            max_size=6,
        ),
    )  # fmt: skip
    def run(action: str, fields: dict[str, str]) -> None:
        body = urlencode({"Action": action, "Version": "2012-11-05", **fields}).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded"}
        assert_not_server_error(exchange(sqs_shim.endpoint, request(host, headers, body)))

    run()


def test_truncated_requests_and_lying_headers(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc
    whole = request(host, json_headers("ListQueues"), b'{"QueueNamePrefix": "x"}')

    @SETTINGS
    @given(
        cut=st.integers(0, len(whole) - 1),
        junk_header=st.text(max_size=40).filter(lambda t: "\r" not in t and "\n" not in t),
        length=st.sampled_from(["-1", "abc", "99999999999999999999", "0", "5", ""]),
    )
    def run(cut: int, junk_header: str, length: str) -> None:
        assert_not_server_error(exchange(sqs_shim.endpoint, whole[:cut]))
        garbled = whole.replace(b"Content-Length: 24", f"Content-Length: {length}".encode())
        assert_not_server_error(exchange(sqs_shim.endpoint, garbled))
        with_junk = whole.replace(b"\r\n\r\n", f"\r\n{junk_header}\r\n\r\n".encode(), 1)
        assert_not_server_error(exchange(sqs_shim.endpoint, with_junk))

    run()


def test_the_shim_still_answers(sqs_shim, sqs):
    sqs.list_queues(MaxResults=10)  # boto3 is content with the answer
    status = exchange(
        sqs_shim.endpoint,
        request(urlsplit(sqs_shim.endpoint).netloc, json_headers("ListQueues"), b"{}"),
        half_close=False,
    )
    assert status == 200
    # aiohttp logs each unparsable request at ERROR (having answered it 400);
    # nothing of the shim's own may fail.
    errors = [
        line
        for line in sqs_shim.log().splitlines()
        if " ERROR " in line and " aiohttp.server: Error handling request" not in line
    ]
    assert not errors, errors
