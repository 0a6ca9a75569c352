"""Payload schemas through every door of a real server: gRPC (Send, SendBatch,
SendStream, Publish, PublishBatch), Connect/HTTP and REST, the SQS shim's SendMessage
and SendMessageBatch and the SNS shim's Publish and PublishBatch (boto3). A body that
breaks the schema is refused naming the first violation, and nothing is stored."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import topic_service_pb2 as tpb
from support import SQS_REGION, HttpServerProcess, unique_name

ORDER_SCHEMA = json.dumps(
    {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}},
        },
        "required": ["id"],
    }
)
GOOD = b'{"id": "o-1", "items": [{"sku": "a"}]}'
BAD = b'{"id": "o-2", "items": [{"qty": 1}]}'
BAD_VIOLATION = 'at /items/0: "sku" is a required property'

ORDER_PROTO = """
syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
message Item { string sku = 1; int32 quantity = 2; }
message Order {
  string id = 1;
  repeated Item items = 2;
  google.protobuf.Timestamp placed = 3;
}
"""


def json_schema() -> msg.PayloadSchema:
    return msg.PayloadSchema(json_schema=ORDER_SCHEMA)


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """shop.v1.Order's FileDescriptorSet, built by protoc (grpcio-tools) as a user would;
    without --include_imports: the well-known Timestamp comes from the runtime."""
    folder = tmp_path_factory.mktemp("proto")
    (folder / "order.proto").write_text(ORDER_PROTO)
    out = folder / "order.pb"
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}",
         f"--descriptor_set_out={out}", str(folder / "order.proto")],
        check=True,
    )  # fmt: skip
    return out.read_bytes()


@pytest.fixture(scope="module")
def http_server(database_url: str) -> Iterator[HttpServerProcess]:
    """A second server on the same database, with the HTTP port: it hears of schema
    changes made through the first one by the engine's signal."""
    process = HttpServerProcess(database_url).start()
    yield process
    process.stop()


@pytest.fixture
async def http(http_server: HttpServerProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(http_server.base) as session:
        yield session


def schema_queue(queues, request: pytest.FixtureRequest, schema: msg.PayloadSchema) -> str:
    name = unique_name(request.node.name)
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name, payload_schema=schema)))
    request.addfinalizer(lambda: queues.DeleteQueue(qpb.DeleteQueueRequest(name=name)))
    return name


async def stored(db: asyncpg.Connection, queue: str) -> int:
    return await db.fetchval(
        "SELECT count(*) FROM postbox.messages m JOIN postbox.queues q ON q.id = m.queue_id"
        " WHERE q.name = $1",
        queue,
    )


def refusal(call: Any, *args: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(*args)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    return caught.value


async def test_grpc_sends_are_checked_and_nothing_bad_is_stored(queues, messages, db, request):
    name = schema_queue(queues, request, json_schema())
    got = queues.GetQueue(qpb.GetQueueRequest(name=name)).queue
    assert got.payload_schema == json_schema()
    listed = queues.ListQueues(qpb.ListQueuesRequest(name_prefix=name)).queues
    assert [q.name for q in listed] == [name]
    assert not listed[0].HasField("payload_schema")

    messages.Send(pb.SendRequest(queue=name, body=GOOD))
    error = refusal(messages.Send, pb.SendRequest(queue=name, body=BAD))
    assert error.details() == (
        f"body does not match the payload_schema of queue {name!r}: {BAD_VIOLATION}; "
        "nothing was stored"
    )
    error = refusal(messages.Send, pb.SendRequest(queue=name, body=b"not json"))
    assert "at /: the body is not UTF-8 JSON" in error.details()

    # A batch is refused whole, naming its first bad entry, as SendBatch refuses any
    # bad entry; none of it is stored.
    batch = [pb.SendBatchEntry(body=GOOD), pb.SendBatchEntry(body=BAD)]
    error = refusal(messages.SendBatch, pb.SendBatchRequest(queue=name, entries=batch))
    assert error.details().startswith("entry 1: body does not match")
    assert ("postbox-rejected-entry", "1") in error.trailing_metadata()
    assert await stored(db, name) == 1

    # SendStream answers each send on its own: the bad one fails, the stream goes on.
    sends = [
        pb.SendStreamRequest(tag=tag, send=pb.SendRequest(queue=name, body=body))
        for tag, body in enumerate((GOOD, BAD, GOOD))
    ]
    results = {r.tag: r for answer in messages.SendStream(iter(sends)) for r in answer.results}
    assert [results[tag].WhichOneof("result") for tag in range(3)] == ["sent", "error", "sent"]
    assert results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert BAD_VIOLATION in results[1].error.message
    assert await stored(db, name) == 3


async def test_a_protobuf_message_type(queues, messages, db, request, descriptor_set):
    schema = msg.PayloadSchema(
        protobuf=msg.ProtobufSchema(
            file_descriptor_set=descriptor_set, message_type="shop.v1.Order"
        )
    )
    name = schema_queue(queues, request, schema)
    assert queues.GetQueue(qpb.GetQueueRequest(name=name)).queue.payload_schema == schema
    # shop.v1.Order {id: "o-1", items: [{sku: "a", quantity: 2}]} in the wire format.
    item = b"\x0a\x01a\x10\x02"
    good = b"\x0a\x03o-1" + b"\x12" + bytes([len(item)]) + item
    messages.Send(pb.SendRequest(queue=name, body=good))
    # Field 5 of Item is not declared: refused, with where it is.
    unknown_item = item + b"\x28\x07"
    body = b"\x12" + bytes([len(unknown_item)]) + unknown_item
    error = refusal(messages.Send, pb.SendRequest(queue=name, body=body))
    assert "at /items/0: field number 5 is not a field of shop.v1.Item" in error.details()
    error = refusal(messages.Send, pb.SendRequest(queue=name, body=GOOD))  # JSON, not protobuf
    assert "is not a shop.v1.Order in the wire format" in error.details()
    assert await stored(db, name) == 1


def test_bad_schemas_and_limits_are_refused_when_set(queues, topics, request, descriptor_set):
    cases = {
        "not JSON": (msg.PayloadSchema(json_schema="{"), "payload_schema.json_schema is not JSON"),
        "not a schema": (
            msg.PayloadSchema(json_schema='{"type": 12}'),
            "is not a valid JSON Schema 2020-12",
        ),
        "another draft": (
            msg.PayloadSchema(json_schema='{"$schema": "http://json-schema.org/draft-07/schema#"}'),
            "postbox checks JSON Schema 2020-12 only",
        ),
        "a remote $ref": (
            msg.PayloadSchema(json_schema='{"$ref": "http://127.0.0.1:9/schema.json"}'),
            "Retrieval is disabled",
        ),
        "too long": (
            msg.PayloadSchema(json_schema=json.dumps({"description": "x" * 65536})),
            "payload_schema.json_schema is 65555 bytes; it must be 1 to 65536 bytes",
        ),
        "empty": (msg.PayloadSchema(), "payload_schema needs one of json_schema and protobuf"),
        "no descriptor set": (
            msg.PayloadSchema(protobuf=msg.ProtobufSchema(message_type="shop.v1.Order")),
            "file_descriptor_set is 0 bytes",
        ),
        "a descriptor set too large": (
            msg.PayloadSchema(
                protobuf=msg.ProtobufSchema(
                    file_descriptor_set=b"\x00" * 262145, message_type="shop.v1.Order"
                )
            ),
            "file_descriptor_set is 262145 bytes; it must be 1 to 262144 bytes",
        ),
        "not a descriptor set": (
            msg.PayloadSchema(
                protobuf=msg.ProtobufSchema(file_descriptor_set=b"\xff\xff", message_type="a.B")
            ),
            "is not a serialized google.protobuf.FileDescriptorSet",
        ),
        "a type not in the set": (
            msg.PayloadSchema(
                protobuf=msg.ProtobufSchema(
                    file_descriptor_set=descriptor_set, message_type="shop.v1.Nope"
                )
            ),
            "'shop.v1.Nope' is not in the descriptor set, which holds 2 message types: "
            "shop.v1.Item, shop.v1.Order",
        ),
        "a type name too long": (
            msg.PayloadSchema(
                protobuf=msg.ProtobufSchema(
                    file_descriptor_set=descriptor_set, message_type="a" * 513
                )
            ),
            "message_type is 513 characters",
        ),
    }
    for case, (schema, expected) in cases.items():
        name = unique_name(request.node.name)
        error = refusal(
            queues.CreateQueue,
            qpb.CreateQueueRequest(queue=qpb.Queue(name=name, payload_schema=schema)),
        )
        assert expected in error.details(), (case, error.details())
        assert len(error.details()) <= 1000
        error = refusal(
            topics.CreateTopic,
            tpb.CreateTopicRequest(topic=tpb.Topic(name=name, payload_schema=schema)),
        )
        assert expected in error.details(), (case, error.details())
    # Nothing was created.
    assert not queues.ListQueues(qpb.ListQueuesRequest(name_prefix=request.node.name[:20])).queues


async def test_update_and_removal_reach_another_server_by_signal(
    queues, messages, http, request, db
):
    """A schema set through one server holds on another at once it hears the signal; a
    queue whose schema is removed takes any body again."""
    name = unique_name(request.node.name)
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    request.addfinalizer(lambda: queues.DeleteQueue(qpb.DeleteQueueRequest(name=name)))

    async def http_send(body: bytes) -> tuple[int, Any]:
        payload = {"queue": name, "body": base64.b64encode(body).decode()}
        async with http.post("/postbox.v1.MessageService/Send", json=payload) as answer:
            return answer.status, await answer.json()

    assert (await http_send(BAD))[0] == 200  # no schema yet; the other server caches that
    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=name, payload_schema=json_schema()),
            update_mask={"paths": ["payload_schema"]},
        )
    )
    # Through the server that made the change: at once.
    refusal(messages.Send, pb.SendRequest(queue=name, body=BAD))
    # Through the other: once its LISTEN connection has the signal (milliseconds; the
    # bound is the suite's usual generous 30 s on a loaded 2-core machine).
    # Until then it may take a bad body, as a send committed just before the change would.
    deadline = time.monotonic() + 30
    accepted_before_the_signal = 0
    while (answer := await http_send(BAD))[0] == 200:
        accepted_before_the_signal += 1
        assert time.monotonic() < deadline, "the other server kept the old schema"
    status, refused = answer
    assert (status, refused["code"]) == (400, "invalid_argument"), refused
    assert BAD_VIOLATION in refused["message"]

    queues.UpdateQueue(
        qpb.UpdateQueueRequest(
            queue=qpb.Queue(name=name), update_mask={"paths": ["payload_schema"]}
        )
    )
    assert not queues.GetQueue(qpb.GetQueueRequest(name=name)).queue.HasField("payload_schema")
    messages.Send(pb.SendRequest(queue=name, body=BAD))
    deadline = time.monotonic() + 30
    while (await http_send(BAD))[0] != 200:
        assert time.monotonic() < deadline, "the other server kept the schema"
    assert await stored(db, name) == 3 + accepted_before_the_signal


async def test_rest_sends_are_checked(queues, http, request, db):
    name = schema_queue(queues, request, json_schema())
    async with http.post(f"/v1/queues/{name}/messages", json={"message": json.loads(GOOD)}) as r:
        assert r.status == 201, await r.text()
    batch = [{"message": json.loads(GOOD)}, {"message": json.loads(BAD)}]
    async with http.post(f"/v1/queues/{name}/messages", json=batch) as r:
        answer = await r.json()
    assert r.status == 400, answer
    assert answer["error"].startswith("entry 1: body does not match")
    assert BAD_VIOLATION in answer["error"]
    assert await stored(db, name) == 1


async def test_a_schema_set_in_sql_that_does_not_compile_fails_sends(queues, messages, db, request):
    """The engine checks the shape, not the schema: a caller in SQL can store one that
    does not compile, and sends then fail with FAILED_PRECONDITION rather than pass
    unchecked."""
    name = unique_name(request.node.name)
    broken = json.dumps({"payload_schema": {"json_schema": '{"type": 1}'}})
    await db.execute("SELECT postbox.create_queue($1, $2::jsonb)", name, broken)
    request.addfinalizer(lambda: queues.DeleteQueue(qpb.DeleteQueueRequest(name=name)))
    with pytest.raises(grpc.RpcError) as caught:
        messages.Send(pb.SendRequest(queue=name, body=GOOD))
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "does not compile" in caught.value.details()
    with pytest.raises(asyncpg.PostgresError, match="json_schema must be a string"):
        await db.execute(
            """SELECT postbox.create_queue($1, '{"payload_schema": {"json_schema": 1}}')""",
            name + "x",
        )


def test_topics_check_publishes(topics, request):
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, payload_schema=json_schema()))
    )
    request.addfinalizer(lambda: topics.DeleteTopic(tpb.DeleteTopicRequest(name=name)))
    assert topics.GetTopic(tpb.GetTopicRequest(name=name)).topic.payload_schema == json_schema()
    topics.Publish(tpb.PublishRequest(topic=name, body=GOOD))
    error = refusal(topics.Publish, tpb.PublishRequest(topic=name, body=BAD))
    assert error.details().startswith(f"body does not match the payload_schema of topic {name!r}")
    batch = [tpb.PublishBatchEntry(body=GOOD), tpb.PublishBatchEntry(body=BAD)]
    error = refusal(topics.PublishBatch, tpb.PublishBatchRequest(topic=name, entries=batch))
    assert error.details().startswith("entry 1: ")
    topics.UpdateTopic(
        tpb.UpdateTopicRequest(
            topic=tpb.Topic(name=name), update_mask={"paths": ["payload_schema"]}
        )
    )
    topics.Publish(tpb.PublishRequest(topic=name, body=BAD))


def _aws_error(call: Any, **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response["Error"]


async def test_sqs_send_message_and_batch(queues, sqs, request, db):
    name = schema_queue(queues, request, json_schema())
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody=GOOD.decode())
    error = _aws_error(sqs.send_message, QueueUrl=url, MessageBody=BAD.decode())
    assert error["Code"] == "InvalidParameterValue"
    assert BAD_VIOLATION in error["Message"]
    # SendMessageBatch fails the bad entries alone and sends the rest, as SQS reports
    # each entry's failure.
    answer = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "good1", "MessageBody": GOOD.decode()},
            {"Id": "bad1", "MessageBody": BAD.decode()},
            {"Id": "good2", "MessageBody": GOOD.decode()},
            {"Id": "bad2", "MessageBody": "[]"},
        ],
    )
    assert sorted(s["Id"] for s in answer["Successful"]) == ["good1", "good2"]
    failed = {f["Id"]: f for f in answer["Failed"]}
    assert set(failed) == {"bad1", "bad2"}
    assert (failed["bad1"]["Code"], failed["bad1"]["SenderFault"]) == (
        "InvalidParameterValue",
        True,
    )
    assert failed["bad1"]["Message"].startswith("body does not match")
    assert 'at /: the value is not of type "object"' in failed["bad2"]["Message"]
    assert await stored(db, name) == 3


def test_sns_publish_and_batch(topics, sqs_shim, request):
    import boto3

    sns = boto3.client(
        "sns", endpoint_url=sqs_shim.endpoint, region_name=SQS_REGION,
        aws_access_key_id="postbox-test", aws_secret_access_key="unchecked",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )  # fmt: skip
    name = unique_name(request.node.name)
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=name, payload_schema=json_schema()))
    )
    request.addfinalizer(lambda: topics.DeleteTopic(tpb.DeleteTopicRequest(name=name)))
    arn = sns.create_topic(Name=name)["TopicArn"]
    sns.publish(TopicArn=arn, Message=GOOD.decode())
    error = _aws_error(sns.publish, TopicArn=arn, Message=BAD.decode())
    assert error["Code"] == "InvalidParameter", error
    assert BAD_VIOLATION in error["Message"]
    answer = sns.publish_batch(
        TopicArn=arn,
        PublishBatchRequestEntries=[
            {"Id": "good", "Message": GOOD.decode()},
            {"Id": "bad", "Message": BAD.decode()},
        ],
    )
    assert [s["Id"] for s in answer["Successful"]] == ["good"]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [("bad", "InvalidParameter")]
