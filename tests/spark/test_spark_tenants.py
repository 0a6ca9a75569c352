"""Tenants (issue 47) through the Spark data source: with a tenant's key as auth_token, a
batch write lands in that tenant's queue and not in another's of the same name, and the
topic stream reader reads that tenant's stream topic only (and moves only its group)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from auth_support import tenant_server
from postbox.v1 import (
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import topic_service_pb2 as tpb
from spark_support import receive_all, wait_for, writer
from support import ServerProcess, seconds

from postbox_server.auth.client import with_api_key

TENANT_A, TENANT_B = "acme", "globex"
GROUP = "spark"


@dataclass
class Tenants:
    server: ServerProcess
    secrets: dict[str, str]  # per tenant: an admin:* key
    channels: dict[str, grpc.Channel]  # per tenant: presenting that key


@pytest.fixture(scope="module")
def tenants(admin_url: str) -> Iterator[Tenants]:
    made = tenant_server(admin_url, "postbox_spark_tenants", ServerProcess, TENANT_A, TENANT_B)
    with made as (server, secrets), grpc.insecure_channel(server.target) as channel:
        channels = {tenant: with_api_key(channel, s) for tenant, s in secrets.items()}
        yield Tenants(server, secrets, channels)


def _bodies(channel: grpc.Channel, queue: str) -> list[bytes]:
    messages = message_service_pb2_grpc.MessageServiceStub(channel)
    return sorted(m.body for m in receive_all(messages, queue))


def test_a_batch_write_lands_in_the_key_tenants_queue_only(spark, tenants: Tenants) -> None:
    for tenant in (TENANT_A, TENANT_B):
        queue_service_pb2_grpc.QueueServiceStub(tenants.channels[tenant]).CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="orders"))
        )
    message_service_pb2_grpc.MessageServiceStub(tenants.channels[TENANT_B]).Send(
        message_service_pb2.SendRequest(queue="orders", body=b"b-only")
    )
    df = spark.range(0, 20, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    writer(
        df, tenants.server, "orders", auth_token=tenants.secrets[TENANT_A], body_column="body"
    ).save()
    assert _bodies(tenants.channels[TENANT_A], "orders") == sorted(
        str(i).encode() for i in range(20)
    )
    assert _bodies(tenants.channels[TENANT_B], "orders") == [b"b-only"]


def test_the_topic_stream_reader_reads_the_key_tenants_topic_only(
    spark, tenants: Tenants, tmp_path
) -> None:
    for tenant in (TENANT_A, TENANT_B):
        channel = tenants.channels[tenant]
        topic_service_pb2_grpc.TopicServiceStub(channel).CreateTopic(
            tpb.CreateTopicRequest(topic=tpb.Topic(name="ticks", stream_retention=seconds(3600)))
        )
        stream_service_pb2_grpc.StreamServiceStub(channel).CreateConsumerGroup(
            spb.CreateConsumerGroupRequest(
                consumer_group=spb.ConsumerGroup(topic="ticks", name=GROUP)
            )
        )
        entries = [tpb.PublishBatchEntry(body=f"{tenant}-{i}".encode()) for i in range(5)]
        topic_service_pb2_grpc.TopicServiceStub(channel).PublishBatch(
            tpb.PublishBatchRequest(topic="ticks", entries=entries)
        )

    rows: list = []
    query = (
        spark.readStream.format("postbox")
        .option("target", tenants.server.target)
        .option("topic", "ticks")
        .option("consumer_group", GROUP)
        .option("auth_token", tenants.secrets[TENANT_A])
        .load()
        .writeStream.foreachBatch(lambda batch, _: rows.extend(batch.collect()))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(rows) >= 5, 120, "tenant A's 5 rows")
        # Spark commits a batch's offsets at the next trigger: A's group catches up.
        wait_for(lambda: _lag(tenants.channels[TENANT_A]) == 0, 60, "a lag of 0 in tenant A")
    finally:
        query.stop()
    assert sorted(row.body for row in rows) == [f"{TENANT_A}-{i}".encode() for i in range(5)]
    assert _lag(tenants.channels[TENANT_B]) == 5  # B's group of the same name never moved


def _lag(channel: grpc.Channel) -> int:
    request = spb.GetConsumerGroupRequest(topic="ticks", name=GROUP)
    got = stream_service_pb2_grpc.StreamServiceStub(channel).GetConsumerGroup(request)
    return got.consumer_group.lag_messages
