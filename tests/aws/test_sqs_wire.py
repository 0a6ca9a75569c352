"""The shim's HTTP wire format, checked byte by byte with a plain HTTP client."""

from __future__ import annotations

import json
import socket
import uuid
from urllib.parse import urlencode, urlsplit
from xml.etree import ElementTree

import pytest
from support import SQS_ACCOUNT, SQS_QUERY_MODEL, unique_name

from postbox_server.aws import shapes
from postbox_server.aws.sqs.shapes import ACTIONS

NS = {"sqs": "http://queue.amazonaws.com/doc/2012-11-05/"}


def http(endpoint: str, method: str, path: str, body: bytes, headers: dict[str, str]):
    """(status, headers, body) of one request on a fresh connection."""
    import http.client

    url = urlsplit(endpoint)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def json_call(endpoint: str, action: str, params: dict | bytes):
    body = params if isinstance(params, bytes) else json.dumps(params).encode()
    return http(
        endpoint,
        "POST",
        "/",
        body,
        {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": "application/x-amz-json-1.0"},
    )


def query_call(endpoint: str, params: dict, path: str = "/"):
    body = urlencode({"Version": "2012-11-05", **params}).encode()
    return http(endpoint, "POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"})


def assert_request_id(headers: dict[str, str]) -> str:
    return str(uuid.UUID(headers["x-amzn-requestid"]))


def test_json_error_shape(sqs_shim):
    status, headers, body = json_call(sqs_shim.endpoint, "GetQueueUrl", {"QueueName": "nope_x"})
    assert status == 400
    assert headers["content-type"].startswith("application/x-amz-json-1.0")
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    assert_request_id(headers)
    assert json.loads(body) == {
        "__type": "com.amazonaws.sqs#QueueDoesNotExist",
        "message": "The specified queue does not exist.",
    }


def test_json_success_has_a_request_id(sqs_shim):
    status, headers, body = json_call(sqs_shim.endpoint, "ListQueues", {"QueueNamePrefix": "zz_"})
    assert status == 200
    assert_request_id(headers)
    assert json.loads(body) == {}


def test_query_error_shape(sqs_shim):
    status, headers, body = query_call(
        sqs_shim.endpoint, {"Action": "GetQueueUrl", "QueueName": "nope_x"}
    )
    assert status == 400
    assert headers["content-type"].startswith("text/xml")
    root = ElementTree.fromstring(body)
    assert root.tag == f"{{{NS['sqs']}}}ErrorResponse"
    assert root.findtext("sqs:Error/sqs:Type", namespaces=NS) == "Sender"
    assert root.findtext("sqs:Error/sqs:Code", namespaces=NS) == (
        "AWS.SimpleQueueService.NonExistentQueue"
    )
    assert root.findtext("sqs:Error/sqs:Message", namespaces=NS)
    assert root.findtext("sqs:RequestId", namespaces=NS) == assert_request_id(headers)


def test_query_success_shape_and_queue_url_path(sqs_shim):
    name = unique_name("wire")
    status, headers, body = query_call(
        sqs_shim.endpoint, {"Action": "CreateQueue", "QueueName": name}
    )
    assert status == 200
    root = ElementTree.fromstring(body)
    assert root.tag == f"{{{NS['sqs']}}}CreateQueueResponse"
    url = root.findtext("sqs:CreateQueueResult/sqs:QueueUrl", namespaces=NS)
    assert url == f"{sqs_shim.endpoint}/{SQS_ACCOUNT}/{name}"
    assert root.findtext("sqs:ResponseMetadata/sqs:RequestId", namespaces=NS) == (
        assert_request_id(headers)
    )
    # Old query clients post to the queue URL and leave QueueUrl out.
    path = f"/{SQS_ACCOUNT}/{name}"
    status, _, _ = query_call(
        sqs_shim.endpoint, {"Action": "SendMessage", "MessageBody": "hi"}, path
    )
    assert status == 200
    status, _, body = query_call(sqs_shim.endpoint, {"Action": "ReceiveMessage"}, path)
    root = ElementTree.fromstring(body)
    assert root.findtext("sqs:ReceiveMessageResult/sqs:Message/sqs:Body", namespaces=NS) == "hi"
    # And some send GET with the parameters in the URL.
    query = urlencode({"Action": "DeleteQueue", "Version": "2012-11-05"})
    status, _, body = http(sqs_shim.endpoint, "GET", f"{path}?{query}", b"", {})
    assert status == 200
    assert ElementTree.fromstring(body).tag == f"{{{NS['sqs']}}}DeleteQueueResponse"


@pytest.mark.parametrize(
    ("target", "code"),
    [("AmazonSQS.Frobnicate", "InvalidAction"), ("Other.ListQueues", "InvalidAction")],
)
def test_json_unknown_action(sqs_shim, target, code):
    status, headers, _ = http(
        sqs_shim.endpoint,
        "POST",
        "/",
        b"{}",
        {"X-Amz-Target": target, "Content-Type": "application/x-amz-json-1.0"},
    )
    assert status == 400
    assert headers["x-amzn-query-error"] == f"{code};Sender"


@pytest.mark.parametrize(
    ("params", "code"), [({"Action": "Frobnicate"}, "InvalidAction"), ({}, "MissingAction")]
)
def test_query_unknown_or_missing_action(sqs_shim, params, code):
    status, _, body = query_call(sqs_shim.endpoint, params)
    assert status == 400
    assert ElementTree.fromstring(body).findtext("sqs:Error/sqs:Code", namespaces=NS) == code


@pytest.mark.parametrize(
    "body", [b"{not json", json.dumps({"QueueName": 5}).encode(), b"[]", b"null", b'"text"']
)
def test_malformed_json_is_invalid_parameter_value(sqs_shim, body):
    status, headers, _ = json_call(sqs_shim.endpoint, "CreateQueue", body)
    assert status == 400
    assert headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"


def test_query_integer_must_be_an_integer(sqs_shim):
    status, _, body = query_call(sqs_shim.endpoint, {"Action": "ListQueues", "MaxResults": "ten"})
    assert status == 400
    code = ElementTree.fromstring(body).findtext("sqs:Error/sqs:Code", namespaces=NS)
    assert code == "InvalidParameterValue"


def raw_exchange(endpoint: str, head: bytes, chunks: list[bytes]) -> bytes:
    """Sends a request piece by piece (the server may answer before it has all) and
    returns the start of the response."""
    url = urlsplit(endpoint)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(head)
        for chunk in chunks:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        received = b""
        while b"\r\n\r\n" not in received:
            data = sock.recv(65536)
            if not data:
                break
            received += data
        return received


def test_oversized_body_is_refused_before_it_is_read(sqs_shim):
    # Only the headers are sent: the answer must come without the 5 MB announced.
    head = (
        b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\nContent-Length: 5000000\r\n\r\n"
    )
    response = raw_exchange(sqs_shim.endpoint, head, [])
    assert response.startswith(b"HTTP/1.1 413 ")
    assert b"x-amzn-query-error: requestentitytoolarge;sender" in response.lower()


def test_oversized_chunked_body_is_cut_off(sqs_shim):
    head = (
        b"POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: AmazonSQS.SendMessage\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * (1024 * 1024)
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 6 + [b"0\r\n\r\n"]
    response = raw_exchange(sqs_shim.endpoint, head, chunks)
    assert response.startswith(b"HTTP/1.1 413 ")


def _model_tree(model: dict, shape_name: str) -> object:
    """A shape of the botocore query model as the names the query protocol puts on the wire.

    As botocore serialises: a flattened list travels under its member's name
    (`AttributeNames` -> `AttributeName.N`), a map under its own, with key/value names.
    """
    shape = model["shapes"][shape_name]
    if shape["type"] == "structure":
        tree = {}
        for name, member in shape["members"].items():
            target = model["shapes"][member["shape"]]
            wire = member.get("locationName", name)
            if target["type"] == "list" and "locationName" in target["member"]:
                wire = target["member"]["locationName"]
            tree[name] = (wire, _model_tree(model, member["shape"]))
        return tree
    if shape["type"] == "list":
        return ["list", _model_tree(model, shape["member"]["shape"])]
    if shape["type"] == "map":
        key = shape["key"].get("locationName", "key")
        value = shape["value"].get("locationName", "value")
        return ["map", key, value, _model_tree(model, shape["value"]["shape"])]
    return shape["type"]


_KINDS = {"string": "string", "integer": "integer", "long": "long", "boolean": "boolean",
          "blob": "blob"}  # fmt: skip


def _our_tree(shape: shapes.Shape) -> object:
    if isinstance(shape, shapes.Structure):
        return {m.name: (m.wire_name, _our_tree(m.shape)) for m in shape.members}
    if isinstance(shape, shapes.ListOf):
        return ["list", _our_tree(shape.member)]
    if isinstance(shape, shapes.MapOf):
        return ["map", shape.key_name, shape.value_name, _our_tree(shape.value)]
    return _KINDS[shape.value]


def _contains(theirs: object, ours: object, path: str) -> None:
    """Everything the model has, ours has with the same wire names and types."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), path
        for name, (wire, inner) in theirs.items():
            assert name in ours, f"{path}.{name} is missing"
            assert ours[name][0] == wire, f"{path}.{name}: {ours[name][0]} != {wire}"
            _contains(inner, ours[name][1], f"{path}.{name}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), path
        assert ours[:-1] == theirs[:-1], f"{path}: {ours} != {theirs}"
        _contains(theirs[-1], ours[-1], path + "[]")
    else:
        assert ours == theirs, f"{path}: {ours} != {theirs}"


def test_shapes_use_the_query_names_of_the_sqs_model():
    model = json.loads((SQS_QUERY_MODEL / "sqs/2012-11-05/service-2.json").read_text())
    for action, operation in model["operations"].items():
        request, result = ACTIONS[action]
        _contains(_model_tree(model, operation["input"]["shape"]), _our_tree(request), action)
        if "output" in operation:
            theirs = _model_tree(model, operation["output"]["shape"])
            _contains(theirs, _our_tree(result), action)


def test_query_message_system_attribute_names(sqs_shim):
    """The query form of MessageSystemAttributeNames (botocore's query model lacks it)."""
    name = unique_name("wire_system")
    path = f"/{SQS_ACCOUNT}/{name}"
    assert query_call(sqs_shim.endpoint, {"Action": "CreateQueue", "QueueName": name})[0] == 200
    try:
        query_call(sqs_shim.endpoint, {"Action": "SendMessage", "MessageBody": "x"}, path)
        status, _, body = query_call(
            sqs_shim.endpoint,
            {
                "Action": "ReceiveMessage",
                "MessageSystemAttributeName.1": "SentTimestamp",
                "MessageSystemAttributeName.2": "ApproximateReceiveCount",
                "AttributeName.1": "ApproximateFirstReceiveTimestamp",
            },
            path,
        )
        assert status == 200
        names = {
            element.findtext("sqs:Name", namespaces=NS): element.findtext(
                "sqs:Value", namespaces=NS
            )
            for element in ElementTree.fromstring(body).iterfind(
                "sqs:ReceiveMessageResult/sqs:Message/sqs:Attribute", NS
            )
        }
        assert set(names) == {
            "SentTimestamp",
            "ApproximateReceiveCount",
            "ApproximateFirstReceiveTimestamp",
        }
        assert names["ApproximateReceiveCount"] == "1"
        status, _, body = query_call(
            sqs_shim.endpoint,
            {"Action": "ReceiveMessage", "MessageSystemAttributeName.1": "NoSuchAttribute"},
            path,
        )
        assert status == 400
        code = ElementTree.fromstring(body).findtext("sqs:Error/sqs:Code", namespaces=NS)
        assert code == "InvalidAttributeName"
    finally:
        query_call(sqs_shim.endpoint, {"Action": "DeleteQueue"}, path)


def error_code_of(headers: dict[str, str], body: bytes) -> str:
    """The error code of a response in either protocol."""
    if "x-amzn-query-error" in headers:
        return headers["x-amzn-query-error"].split(";")[0]
    return ElementTree.fromstring(body).findtext("sqs:Error/sqs:Code", namespaces=NS)


JSON_HEADERS = {
    "X-Amz-Target": "AmazonSQS.ListQueues",
    "Content-Type": "application/x-amz-json-1.0",
}
FORM_HEADERS = {"Content-Type": "application/x-www-form-urlencoded"}
FORM_BODY = b"Action=ListQueues&Version=2012-11-05"


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "code"),
    [
        ("POST", "/nowhere", JSON_HEADERS, b"{}", 404, "InvalidAddress"),
        ("POST", "/a/b/c", FORM_HEADERS, FORM_BODY, 404, "InvalidAddress"),
        ("GET", "/favicon.ico", {}, b"", 404, "InvalidAddress"),
        ("PUT", "/", JSON_HEADERS, b"{}", 400, "InvalidHttpRequest"),
        ("DELETE", "/", FORM_HEADERS, FORM_BODY, 400, "InvalidHttpRequest"),
        ("POST", "/", {**JSON_HEADERS, "Content-Type": "text/plain"}, b"{}",
         400, "InvalidHttpRequest"),
        ("POST", "/", {**JSON_HEADERS, "Content-Type": "application/x-www-form-urlencoded"}, b"{}",
         400, "InvalidHttpRequest"),
        ("POST", "/", {"Content-Type": "application/json"}, b'{"Action": "ListQueues"}', 400,
         "InvalidHttpRequest"),
        ("POST", "/", {"Content-Type": "text/xml"}, FORM_BODY, 400, "InvalidHttpRequest"),
    ],
)  # fmt: skip
def test_requests_that_are_not_sqs_are_refused(sqs_shim, method, path, headers, body, status, code):
    got_status, got_headers, got_body = http(sqs_shim.endpoint, method, path, body, headers)
    assert got_status == status
    request_id = assert_request_id(got_headers)
    assert error_code_of(got_headers, got_body) == code
    if "X-Amz-Target" in headers:
        assert got_headers["content-type"].startswith("application/x-amz-json-1.0")
    else:
        root = ElementTree.fromstring(got_body)
        assert root.findtext("sqs:RequestId", namespaces=NS) == request_id


def test_form_content_type_with_a_charset_is_accepted(sqs_shim):
    headers = {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"}
    assert http(sqs_shim.endpoint, "POST", "/", FORM_BODY, headers)[0] == 200


def test_form_bytes_that_are_not_utf8_are_refused(sqs_shim, sqs):
    """Replacing them would send another body than the client's, with another MD5."""
    name = unique_name("wire_utf8")
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    try:
        for body in (
            b"Action=SendMessage&MessageBody=caf\xe9",
            b"Action=SendMessage&MessageBody=\xff",
        ):
            status, _, response = http(
                sqs_shim.endpoint, "POST", f"/{SQS_ACCOUNT}/{name}", body, FORM_HEADERS
            )
            assert status == 400
            code = ElementTree.fromstring(response).findtext("sqs:Error/sqs:Code", namespaces=NS)
            assert code == "InvalidParameterValue"
        assert "Messages" not in sqs.receive_message(QueueUrl=url)
        # The same text percent-encoded as UTF-8 is a message.
        status, _, _ = http(
            sqs_shim.endpoint,
            "POST",
            f"/{SQS_ACCOUNT}/{name}",
            b"Action=SendMessage&MessageBody=caf%C3%A9",
            FORM_HEADERS,
        )
        assert status == 200
        assert sqs.receive_message(QueueUrl=url)["Messages"][0]["Body"] == "café"
    finally:
        sqs.delete_queue(QueueUrl=url)
