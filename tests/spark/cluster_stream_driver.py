"""A Spark driver for test_spark_cluster's streaming case, run as a process of its own so
that the test can SIGKILL it (and its JVM and executors, in the same process group).

    python cluster_stream_driver.py MASTER TARGET WRITE_TARGET TOPIC GROUP QUEUE CHECKPOINT

Streams the topic's log (from TARGET), through the consumer group, into the queue with
the postbox stream writer (through WRITE_TARGET, a proxy in front of TARGET), until
killed.
"""

from __future__ import annotations

import os
import sys

import pyspark


def main() -> None:
    master, target, write_target, topic, group, queue, checkpoint = sys.argv[1:]
    os.environ["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from postbox_client.spark import register
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("postbox-cluster-stream")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.format("postbox")
        .option("target", target)
        .option("topic", topic)
        .option("consumer_group", group)
        .option("max_messages_per_batch", "1000")
        .option("max_messages_per_partition", "500")
        .load()
        .select("body")
        .writeStream.format("postbox")
        .option("target", write_target)
        .option("queue", queue)
        .option("body_column", "body")
        # Small calls, one at a time: a batch is under way for long enough that the
        # test sees it half written.
        .option("batch_size", "50")
        .option("max_in_flight", "1")
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
