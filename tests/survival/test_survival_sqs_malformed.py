"""Malformed input to the SQS shim: random and truncated bodies and headers get 4xx, never 5xx.

Requests go over raw sockets, so nothing on the client side tidies them up: bodies
of random JSON or bytes to every action, random form fields, truncated requests,
lying Content-Length headers and garbage header lines. Every request is complete as
far as HTTP goes (a peer that half-closes mid-request hangs up, and gets no answer),
so each must be answered: with 4xx when the input cannot be a valid call, and never
with 5xx. After it all the shim still answers a well-formed call.
"""

from __future__ import annotations

import json
import socket
from urllib.parse import urlencode, urlsplit

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from postbox_server.aws.shapes import ListOf, MapOf, Scalar, Shape, Structure
from postbox_server.aws.sqs.shapes import ACTIONS

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


def exchange(endpoint: str, raw: bytes) -> int:
    """Sends raw bytes; the status of the first final response (1xx are skipped)."""
    url = urlsplit(endpoint)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(raw)
        received = b""
        while True:
            while b"\r\n" not in received:
                chunk = sock.recv(4096)
                assert chunk, f"the shim closed the connection without answering {raw[:200]!r}"
                received += chunk
            status_line, received = received.split(b"\r\n", 1)
            fields = status_line.split()
            assert fields[0].startswith(b"HTTP/"), status_line
            status = int(fields[1])
            if status >= 200:
                return status
            received = received.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in received else b""


def request(host: str, headers: dict[str, str], body: bytes) -> bytes:
    return head(host, {**headers, "Content-Length": str(len(body))}) + body


def head(host: str, headers: dict[str, str]) -> bytes:
    lines = ["POST / HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def assert_client_error(status: int) -> None:
    assert 400 <= status < 500, status


def assert_answered_without_server_error(status: int) -> None:
    # Random fields may make a valid call (ListQueues takes any unknown ones).
    assert 200 <= status < 300 or 400 <= status < 500, status


def json_headers(action: str) -> dict[str, str]:
    return {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"}


def test_random_json_bodies_to_every_action(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc

    @SETTINGS
    @given(action=ACTION_NAMES, body=st.dictionaries(FIELDS, JSON_VALUES, max_size=5) | JSON_VALUES)
    @example(action="ListQueues", body=None)  # null is no object of parameters
    @example(action="ListQueues", body=[])
    def run(action: str, body: object) -> None:
        payload = json.dumps(body).encode()
        status = exchange(sqs_shim.endpoint, request(host, json_headers(action), payload))
        if isinstance(body, dict):
            assert_answered_without_server_error(status)
        else:  # parameters are a JSON object, always
            assert_client_error(status)

    run()


def _wrong_json(shape: Shape) -> st.SearchStrategy:
    """JSON values of another type than the shape's."""
    if isinstance(shape, Structure | MapOf):
        return st.lists(st.integers(), max_size=2) | st.text(max_size=5)
    if isinstance(shape, ListOf):
        return st.dictionaries(st.text(max_size=5), st.integers(), max_size=2) | st.integers()
    if shape in (Scalar.INTEGER, Scalar.LONG):
        return st.text(max_size=5) | st.floats(allow_nan=False) | st.booleans()
    if shape is Scalar.BOOLEAN:
        return st.integers() | st.text(max_size=5)
    return st.integers() | st.booleans() | st.lists(st.text(max_size=3), max_size=2)


@st.composite
def mistyped_calls(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    """A known action with random parameters, one of them of the wrong type."""
    action = draw(st.sampled_from(sorted(name for name in ACTIONS if ACTIONS[name][0].members)))
    members = ACTIONS[action][0].members
    body = draw(st.dictionaries(FIELDS, JSON_VALUES, max_size=4))
    wrong = draw(st.sampled_from(members))
    body[wrong.name] = draw(_wrong_json(wrong.shape))
    return action, body


def test_mistyped_json_parameters_are_refused(sqs_shim):
    host = urlsplit(sqs_shim.endpoint).netloc

    @SETTINGS
    @given(call=mistyped_calls())
    def run(call: tuple[str, dict[str, object]]) -> None:
        action, body = call
        payload = json.dumps(body).encode()
        assert_client_error(
            exchange(sqs_shim.endpoint, request(host, json_headers(action), payload))
        )

    run()


def _may_be_a_valid_call(action: str, content_type: str, body: bytes) -> bool:
    """Whether random bytes happen to be a valid call: ListQueues needs no parameters."""
    if action != "ListQueues" or content_type != "application/x-amz-json-1.0":
        return False
    try:
        return not body.strip() or isinstance(json.loads(body), dict)
    except ValueError:
        return False


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
        status = exchange(sqs_shim.endpoint, request(host, headers, body))
        if _may_be_a_valid_call(action, content_type, body):
            assert_answered_without_server_error(status)
        else:
            assert_client_error(status)

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
        status = exchange(sqs_shim.endpoint, request(host, headers, body))
        if action in ACTIONS:
            assert_answered_without_server_error(status)
        else:
            assert_client_error(status)

    run()


def test_truncated_requests_and_lying_headers(sqs_shim):
    """Cut anywhere, a request for a queue that does not exist is still a bad request.

    The cut head is ended where it was cut and the body follows, so HTTP framing
    holds: whatever part of the head or body is missing, the answer is 4xx.
    """
    host = urlsplit(sqs_shim.endpoint).netloc
    body = b'{"QueueName": "no_such_queue_anywhere"}'
    headers = {**json_headers("GetQueueUrl"), "Content-Length": str(len(body))}
    whole_head = head(host, headers)[:-4]  # without the blank line that ends it

    @SETTINGS
    @given(
        cut_head=st.integers(0, len(whole_head)),
        cut_body=st.integers(0, len(body)),
        junk_header=st.text(max_size=40).filter(
            lambda t: "\r" not in t and "\n" not in t and "expect" not in t.lower()
        ),
        length=st.sampled_from(["-1", "abc", "99999999999999999999", "0", "5", ""]),
    )
    def run(cut_head: int, cut_body: int, junk_header: str, length: str) -> None:
        assert_client_error(exchange(sqs_shim.endpoint, whole_head[:cut_head] + b"\r\n\r\n" + body))
        truncated_body = whole_head.replace(
            f"Content-Length: {len(body)}".encode(), f"Content-Length: {cut_body}".encode()
        )
        assert_client_error(
            exchange(sqs_shim.endpoint, truncated_body + b"\r\n\r\n" + body[:cut_body])
        )
        garbled = whole_head.replace(
            f"Content-Length: {len(body)}".encode(), f"Content-Length: {length}".encode()
        )
        assert_client_error(exchange(sqs_shim.endpoint, garbled + b"\r\n\r\n" + body))
        with_junk = whole_head + f"\r\n{junk_header}\r\n\r\n".encode() + body
        assert_client_error(exchange(sqs_shim.endpoint, with_junk))

    run()


def test_the_shim_still_answers(sqs_shim, sqs):
    sqs.list_queues(MaxResults=10)  # boto3 is content with the answer
    status = exchange(
        sqs_shim.endpoint,
        request(urlsplit(sqs_shim.endpoint).netloc, json_headers("ListQueues"), b"{}"),
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
