"""Spark with API keys: auth_token reaches the server on every call of every executor,
and a wrong token fails the job at once, naming the option."""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from auth_support import bearer, call_status, wait_until
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2, queue_service_pb2_grpc
from spark_support import receive_all, writer
from support import ServerProcess, bootstrap_key, create_database, drop_database

from postbox_server.auth.client import with_api_key

# Without the driver's check a wrong token would fail in each task, after Spark's
# retry of it; this bound is far below that and far above a healthy planning call.
AT_ONCE = 30.0


@pytest.fixture(scope="module")
def keyed_server(admin_url: str) -> Iterator[tuple[ServerProcess, str, str]]:
    url = create_database(admin_url, "postbox_spark_keys")
    server = ServerProcess(url).start()
    try:
        admin = bootstrap_key(url, "spark-admin", "admin:*")
        writer_key = bootstrap_key(url, "spark-writer", "send:spark-*", "receive:spark-*")
        with grpc.insecure_channel(server.target) as channel:
            wait_until(
                lambda: (
                    call_status(channel, "/postbox.v1.QueueService/ListQueues", writer_key)
                    == grpc.StatusCode.PERMISSION_DENIED
                ),
                5,
                "the keys",
            )
            queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
                queue_service_pb2.CreateQueueRequest(
                    queue=queue_service_pb2.Queue(name="spark-orders")
                ),
                metadata=bearer(admin),
            )
        yield server, admin, writer_key
    finally:
        server.stop()
        drop_database(admin_url, url)


def test_auth_token_reaches_the_server_from_every_executor(spark, keyed_server) -> None:
    server, admin, writer_key = keyed_server
    df = spark.range(0, 2000, numPartitions=4).selectExpr("CAST(id AS STRING) AS body")
    writer(df, server, "spark-orders", auth_token=writer_key, body_column="body").save()
    with grpc.insecure_channel(server.target) as channel:
        messages = message_service_pb2_grpc.MessageServiceStub(with_api_key(channel, admin))
        assert len(receive_all(messages, "spark-orders")) == 2000


@pytest.mark.parametrize("token", [None, "pbk_" + "w" * 43])
def test_a_wrong_or_missing_token_fails_the_write_at_once(spark, keyed_server, token) -> None:
    server, _, _ = keyed_server
    df = spark.range(0, 10, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    options = {"body_column": "body", **({"auth_token": token} if token else {})}
    started = time.monotonic()
    with pytest.raises(Exception, match="auth_token") as failure:
        writer(df, server, "spark-orders", **options).save()
    assert time.monotonic() - started < AT_ONCE
    assert "UNAUTHENTICATED" in str(failure.value)
    if token:
        assert token not in str(failure.value)


def test_a_wrong_token_fails_the_stream_reader_at_once(spark, keyed_server) -> None:
    server, _, _ = keyed_server

    def run_stream() -> None:
        stream = (
            spark.readStream.format("postbox")
            .option("target", server.target)
            .option("queue", "spark-orders")
            .option("auth_token", "pbk_" + "v" * 43)
            .load()
        )
        query = stream.writeStream.format("noop").start()
        try:
            query.awaitTermination(AT_ONCE)
        finally:
            query.stop()

    started = time.monotonic()
    with pytest.raises(Exception, match="auth_token"):
        run_stream()
    assert time.monotonic() - started < AT_ONCE
