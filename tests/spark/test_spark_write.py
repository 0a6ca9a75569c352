"""Batch writes from a real local Spark to the real server: `df.write.format("postbox")`."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import queue_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from spark_support import receive_all, stats, writer
from support import ServerProcess, unique_name


def test_100k_rows_land_exactly_once_with_bodies_and_attributes(spark, server, messages, queue):
    rows = 100_000
    df = spark.range(0, rows, numPartitions=4).select(
        F.concat(F.lit("order-"), F.col("id").cast("string")).alias("body"),
        (F.col("id") % 7).alias("shard"),
        F.when(F.col("id") % 2 == 0, F.lit("even")).alias("parity"),  # null when odd
        F.col("id").cast("string").cast("binary").alias("raw"),
    )
    writer(df, server, queue, body_column="body", attribute_columns="shard,parity,raw").save()

    got = receive_all(messages, queue)
    bodies = Counter(m.body for m in got)
    assert len(got) == rows
    assert len(bodies) == rows, "a row landed twice"
    for m in got:
        n = int(m.body.removeprefix(b"order-"))
        assert m.attributes["shard"].data_type == "Number"
        assert m.attributes["shard"].string_value == str(n % 7)
        assert m.attributes["raw"].data_type == "Binary"
        assert m.attributes["raw"].binary_value == str(n).encode()
        if n % 2 == 0:
            assert m.attributes["parity"].string_value == "even"
        else:
            assert "parity" not in m.attributes  # null attributes are left out


def test_default_body_is_the_row_as_json(spark, server, messages, queue):
    df = spark.sql(
        """SELECT 1 AS id, 'a "b"' AS name, 2.5D AS price, true AS ok,
                  CAST(12.30 AS DECIMAL(5, 2)) AS amount,
                  TIMESTAMP '2024-05-06 07:08:09+00:00' AS at, DATE '2024-05-06' AS day,
                  array(1, 2) AS list, map('k', 1) AS dict,
                  named_struct('x', 1, 'y', CAST(NULL AS STRING)) AS nested,
                  X'00FF' AS blob, 'web' AS source"""
    )
    writer(df, server, queue, attribute_columns="source").save()
    (got,) = receive_all(messages, queue)
    body = json.loads(got.body)
    assert body.pop("at").startswith("2024-05-06")  # in the session's time zone
    assert body == {
        "id": 1,
        "name": 'a "b"',
        "price": 2.5,
        "ok": True,
        "amount": "12.30",
        "day": "2024-05-06",
        "list": [1, 2],
        "dict": {"k": 1},
        "nested": {"x": 1, "y": None},
        "blob": base64.b64encode(b"\x00\xff").decode(),
    }
    assert got.attributes["source"].string_value == "web"  # mapped columns leave the body


def _fail_first_attempt_midway(target: str, queue: str, at: int, marker: Path):
    """A UDF failing the first attempt of its task at row `at`, once rows of it committed."""

    def check(value: int) -> int:
        from pyspark import TaskContext

        if value != at or TaskContext.get().attemptNumber() > 0:
            return value
        with grpc.insecure_channel(target) as channel:
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                landed = queues.GetQueue(qpb.GetQueueRequest(name=queue)).queue.stats
                if landed.visible_messages:
                    break
                time.sleep(0.05)
        marker.write_text(str(landed.visible_messages))
        raise RuntimeError(f"injected failure at row {value}")

    return F.udf(check, "long", useArrow=False)


def test_task_failure_mid_partition_leaves_no_duplicate(spark, server, messages, queue, tmp_path):
    rows, fail_at = 40_000, 15_000
    marker = tmp_path / "landed_before_failure"
    fail = _fail_first_attempt_midway(server.target, queue, fail_at, marker)
    df = spark.range(0, rows, numPartitions=2).select(fail("id").alias("id"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    try:
        writer(df.selectExpr("CAST(id AS STRING) AS id"), server, queue, body_column="id").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    landed_before = int(marker.read_text())
    assert 0 < landed_before < rows, "the failure did not come mid-partition"
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert sum(got.values()) == rows
    assert set(got) == set(range(rows))


def test_server_killed_mid_write_is_retried_without_duplicates(
    spark, database_url, messages, queues, queue
):
    rows = 60_000
    # A server of this test's own on the run's database: it can die while the
    # session's server keeps serving the checks.
    doomed = ServerProcess(database_url).start()
    restarted = threading.Event()

    def kill_and_restart() -> None:
        deadline = time.monotonic() + 120
        while stats(queues, queue).visible_messages < 5000 and time.monotonic() < deadline:
            time.sleep(0.05)
        doomed.kill()  # calls under way are lost; some may have committed
        doomed.start()
        restarted.set()

    killer = threading.Thread(target=kill_and_restart, daemon=True)
    killer.start()
    try:
        df = spark.range(0, rows, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
        writer(df, doomed, queue, body_column="body", max_in_flight="8").save()
        killer.join(60)
    finally:
        doomed.stop()
    assert restarted.is_set()
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert sum(got.values()) == rows
    assert set(got) == set(range(rows))


def test_dedupe_column_sends_each_key_once(spark, server, messages, queue):
    df = spark.range(0, 3000, numPartitions=3).selectExpr(
        "CAST(id % 1000 AS STRING) AS key", "CONCAT('v', id % 1000) AS body"
    )
    writer(df, server, queue, body_column="body", dedupe_column="key").save()
    got = receive_all(messages, queue)
    assert sorted(m.body for m in got) == sorted(f"v{i}".encode() for i in range(1000))


def test_rerun_with_the_same_write_id_sends_nothing_again(spark, server, messages, queue):
    df = spark.range(0, 2000, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    writer(df, server, queue, body_column="body", write_id="nightly-2024-05-06").save()
    writer(df, server, queue, body_column="body", write_id="nightly-2024-05-06").save()
    writer(df, server, queue, body_column="body").save()  # a new write: sent again
    got = Counter(m.body for m in receive_all(messages, queue))
    assert sum(got.values()) == 4000
    assert set(got.values()) == {2}


def test_fifo_groups_keep_their_order(spark, server, messages, queues):
    name = unique_name("spark_fifo")[:70] + ".fifo"
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name)))
    df = (
        spark.range(0, 600, numPartitions=3)
        .selectExpr("CONCAT('g', id % 4) AS grp", "CAST(id AS STRING) AS body")
        .repartition(2, "grp")
        .sortWithinPartitions("grp", F.col("body").cast("long"))
    )
    writer(df, server, name, body_column="body", group_column="grp").save()

    seen: dict[str, list[int]] = {}
    while got := receive_all(messages, name):
        for m in got:
            seen.setdefault(f"g{int(m.body) % 4}", []).append(int(m.body))
        messages.DeleteBatch(pb.DeleteBatchRequest(queue=name, receipts=[m.receipt for m in got]))
    assert sum(len(v) for v in seen.values()) == 600
    for values in seen.values():
        assert values == sorted(values), "a group came out of order"


def test_priority_delay_and_deliver_at_columns(spark, server, messages, queues, queue):
    df = spark.sql(
        """SELECT * FROM VALUES
             ('low', 0, CAST(NULL AS INT), CAST(NULL AS TIMESTAMP)),
             ('high', 9, NULL, NULL),
             ('later', 0, 3600, NULL),
             ('at', 0, NULL, current_timestamp() + INTERVAL 1 DAY)
           AS t(body, prio, wait, at)"""
    )
    now = df.where("at IS NULL").drop("at")
    writer(
        now, server, queue, body_column="body", priority_column="prio", delay_column="wait"
    ).save()
    later = df.where("at IS NOT NULL").select("body", "at")
    writer(later, server, queue, body_column="body", deliver_at_column="at").save()
    assert stats(queues, queue).delayed_messages == 2
    assert [m.body for m in receive_all(messages, queue)] == [b"high", b"low"]


def test_publish_to_a_topic_fans_out_exactly_once(spark, server, channel, messages, queues):
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    topic, everything, eu = (unique_name(n) for n in ("spark_topic", "all", "eu"))
    topics.CreateTopic(tpb.CreateTopicRequest(topic=tpb.Topic(name=topic)))
    for queue, pattern in ((everything, "#"), (eu, "orders.*.eu")):
        queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=queue)))
        topics.CreateSubscription(
            tpb.CreateSubscriptionRequest(
                subscription=tpb.Subscription(
                    name=queue[:60], topic=topic, pattern=pattern, queue=queue
                )
            )
        )
    df = spark.range(0, 2000, numPartitions=2).selectExpr(
        "CAST(id AS STRING) AS body",
        "IF(id % 2 = 0, 'orders.created.eu', 'orders.created.us') AS key",
    )
    for _ in range(2):  # the rerun with the same write id publishes nothing new
        (
            df.write.format("postbox")
            .option("target", server.target)
            .option("topic", topic)
            .option("body_column", "body")
            .option("routing_key_column", "key")
            .option("write_id", "publish-once")
            .mode("append")
            .save()
        )
    assert sorted(int(m.body) for m in receive_all(messages, everything)) == list(range(2000))
    assert sorted(int(m.body) for m in receive_all(messages, eu)) == list(range(0, 2000, 2))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"body_column": "nope"}, "names column 'nope', which the DataFrame does not have"),
        ({"body_column": "n"}, "column 'n' (body_column) is bigint; it must be string or binary"),
        ({"body_column": "text", "attribute_columns": "n,tags"}, "column 'tags'"),
        ({"body_column": "text", "delay_column": "label"}, "it must be an integer"),
        ({"body_column": "text", "priority_column": "n", "attribute_columns": "n"}, "by both"),
        ({"body_column": "text", "attribute_columns": "n"}, "'label', 'tags' not mapped"),
        ({"bodycolumn": "text"}, "unknown option 'bodycolumn'"),
        ({"topic": "orders", "body_column": "text"}, "give option 'queue'"),
        ({"routing_key_column": "label", "body_column": "text"}, "is for publishing"),
        ({"tls_server_name": "x"}, "need tls=true"),
        ({"batch_size": "5000"}, "option 'batch_size' is 5000; it must be 1 to 1000"),
    ],
)
def test_mistakes_fail_when_planning(spark, server, queues, queue, options, message):
    df = spark.sql("SELECT 'hi' AS text, 1L AS n, 'x' AS label, array(1) AS tags")
    with pytest.raises(AnalysisException, match="Failed to initialize") as caught:
        writer(df, server, queue, **options).save()
    assert message in str(caught.value)
    assert stats(queues, queue).visible_messages == 0


@pytest.mark.parametrize(
    ("queue_name", "options", "message"),
    [
        ("orders.fifo", {}, "'orders.fifo' is a FIFO queue, whose messages need a message group"),
        (
            "orders.fifo",
            {"group_column": "grp", "priority_column": "n"},
            "takes no per-message delay, delivery time or priority: drop 'priority_column'",
        ),
        ("orders.fifo", {"group_column": "grp", "delay_column": "n"}, "drop 'delay_column'"),
        ("orders.fifo", {"group_column": "grp", "deliver_at_column": "at"}, "drop 'deliver_at"),
        ("orders", {"write_id": "with space"}, "'with space'; it must be 1 to 80 printable ASCII"),
        ("orders", {"write_id": "x" * 81}, "it must be 1 to 80 printable ASCII"),
        ("orders", {"write_id": "caf\u00e9"}, "it must be 1 to 80 printable ASCII"),
        (
            "orders",
            {"attribute_columns": "by_number"},
            "column 'by_number' (attribute_columns) is map<int,string>: the keys of a map"
            " column name its attributes, so they must be strings",
        ),
        (
            "orders",
            {"attribute_columns": "nested"},
            "the values of a map column must be strings, numbers, booleans or binary",
        ),
        (
            "orders",
            {"attribute_columns": "ok"},
            "column 'ok' (attribute_columns) is array<int>; it must be a string, number",
        ),
        ("orders", {"attribute_columns": "bad..name"}, "'bad..name' cannot be an attribute name"),
    ],
)
def test_queue_and_mapping_mistakes_fail_when_planning(spark, server, queue_name, options, message):
    df = spark.sql(
        """SELECT 'hi' AS text, 'g' AS grp, 1L AS n, current_timestamp() AS at,
                  map(1, 'a') AS by_number, map('k', array(1)) AS nested,
                  array(1) AS ok, 'x' AS `bad..name`"""
    )
    # No such queue exists, and none needs to: the driver refuses before any task runs.
    with pytest.raises(AnalysisException, match="Failed to initialize") as caught:
        writer(df, server, queue_name, **options).save()
    assert message in str(caught.value)


def test_a_map_column_sends_one_attribute_per_entry(spark, server, messages, queue):
    df = spark.sql(
        """SELECT 'hi' AS body, map('region', 'eu', 'tier', NULL) AS tags, 7 AS shard
           UNION ALL SELECT 'bad key', map('no spaces', 'x'), 8"""
    )
    writer(
        df.where("shard = 7"), server, queue, body_column="body", attribute_columns="tags,shard"
    ).save()
    (got,) = receive_all(messages, queue)
    assert dict(got.attributes) == {
        "region": msg.AttributeValue(data_type="String", string_value="eu"),
        "shard": msg.AttributeValue(data_type="Number", string_value="7"),
    }
    with pytest.raises(Exception, match="column 'tags' has key 'no spaces' in row 0"):
        writer(
            df.where("shard = 8"), server, queue, body_column="body", attribute_columns="tags,shard"
        ).save()


def test_overwrite_is_refused_when_planning(spark, server, queue):
    df = spark.sql("SELECT 'hi' AS text")
    with pytest.raises(AnalysisException, match="a queue cannot be overwritten"):
        writer(df, server, queue).mode("overwrite").save()


def test_missing_queue_fails_the_write(spark, server):
    df = spark.sql("SELECT 'hi' AS text")
    with pytest.raises(Exception, match="NOT_FOUND"):
        writer(df, server, "no_such_queue").save()


def test_rows_that_break_the_queues_payload_schema_fail_the_write(spark, server, messages, queues):
    """The writer sends with SendBatch, which refuses a batch holding a body the queue's
    payload schema does not accept: the task fails, and the write with it."""
    name = unique_name("spark_schema")
    schema = msg.PayloadSchema(json_schema=json.dumps({"type": "object", "required": ["id"]}))
    queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name=name, payload_schema=schema)))
    try:
        good = spark.sql("SELECT id FROM range(3)")
        writer(good, server, name).save()  # each row as JSON: {"id": ...}
        bad = spark.sql("SELECT id AS other FROM range(2)")
        with pytest.raises(Exception, match="does not match the payload_schema"):
            writer(bad, server, name).save()
        assert len(receive_all(messages, name)) == 3
    finally:
        queues.DeleteQueue(qpb.DeleteQueueRequest(name=name))
