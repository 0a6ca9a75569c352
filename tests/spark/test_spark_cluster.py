"""Exactly once under real failures, with executors in JVMs of their own: an executor
SIGKILLed mid-write, speculative copies of a slow task, and a streaming driver killed
mid-batch and restarted from its checkpoint.

Slow (a Spark cluster starts for each test, and the streaming case starts its driver
twice), so they are left out of the default run; one command runs them:

    python -m pytest -m spark_cluster tests/spark/test_spark_cluster.py
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import stream_service_pb2 as spb
from postbox.v1 import stream_service_pb2_grpc, topic_service_pb2_grpc
from postbox.v1 import topic_service_pb2 as tpb
from pyspark.sql import SparkSession
from spark_support import SendBatchProxy, receive_all, stats, wait_for, writer
from support import free_port, seconds, unique_name

pytestmark = pytest.mark.spark_cluster

SPARK_HOME = os.path.dirname(pyspark.__file__)
HERE = Path(__file__).resolve().parent
GROUP = "spark"


def _session(master: str, ui_port: int, **conf: str) -> SparkSession:
    """A Spark session on `master`, whose executors run this Python with the tests'
    modules on their path."""
    if SparkSession.getActiveSession() is not None:
        pytest.fail("another Spark session runs in this process: run this module on its own")
    os.environ["SPARK_HOME"] = SPARK_HOME  # local-cluster launches executors from here
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH")) if p
    )
    from postbox_client.spark import register

    builder = (
        SparkSession.builder.master(master)
        .appName("postbox-cluster-tests")
        .config("spark.executor.memory", "512m")
        .config("spark.ui.port", str(ui_port))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.task.maxFailures", "4")
        # Batches of 1,000 rows reach the writer while a task is held mid-partition.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    return session


def _status(session: SparkSession, path: str) -> list[dict]:
    """A document of Spark's status REST API, at the driver's UI port."""
    base = session.sparkContext.uiWebUrl
    app = session.sparkContext.applicationId
    with urllib.request.urlopen(f"{base}/api/v1/applications/{app}/{path}", timeout=10) as r:
        return json.load(r)


def _assert_once(messages, queue: str, rows: int) -> None:
    got = Counter(int(m.body) for m in receive_all(messages, queue))
    assert sum(got.values()) == rows, "a row landed twice, or not at all"
    assert set(got) == set(range(rows))


def _executor_jvms(app_id: str) -> list[int]:
    """The pids of the application's executor JVMs (CoarseGrainedExecutorBackend)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if b"CoarseGrainedExecutorBackend" in cmdline and app_id.encode() in cmdline:
                pids.append(int(entry.name))
    return pids


def test_an_executor_killed_mid_write_is_rerun_on_the_other_and_rows_land_once(
    server, messages, queue
):
    rows, partitions = 40_000, 2
    # Once a quarter of the rows committed, both tasks' next calls wait in the proxy.
    proxy = SendBatchProxy(server.target, gate=lambda proxy, *_: proxy.forwarded >= rows // 4)
    spark = _session("local-cluster[2,1,1024]", free_port())
    try:
        wait_for(lambda: len(_status(spark, "executors")) >= 3, 120, "two executors")
        app = spark.sparkContext.applicationId
        killed: list[object] = []

        def kill_one_executor() -> None:
            try:
                wait_for(
                    lambda: len(proxy.paused) >= partitions, 180, "both tasks mid-send", every=0.02
                )
                victim = _executor_jvms(app)[0]
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
            except Exception as error:  # the test's assertion names it
                killed.append(error)
            finally:
                proxy.resume.set()

        killer = threading.Thread(target=kill_one_executor, daemon=True)
        killer.start()
        df = spark.range(0, rows, numPartitions=partitions).selectExpr("CAST(id AS STRING) AS id")
        writer(df, server, queue, body_column="id", target=proxy.address).save()
        killer.join(30)
        assert killed, "no executor was killed"
        assert isinstance(killed[0], int), f"no executor was killed: {killed[0]}"
        stages = _status(spark, "stages?details=true")
        attempts = [t for stage in stages for t in stage.get("tasks", {}).values()]
    finally:
        spark.stop()
        proxy.close()
    assert any(t["status"] != "SUCCESS" for t in attempts), "no task died with the executor"
    # The rerun sent again the rows the killed attempt had committed; the server
    # dropped them as repeats.
    assert sum(proxy.chunk_sizes) > rows
    _assert_once(messages, queue, rows)


def _standalone_cluster(tmp_path: Path) -> Iterator[str]:
    """A standalone master and two workers, each on a loopback address of its own:
    Spark never runs a speculative copy on a host where the task already runs, and
    local-cluster's workers all share one host."""
    spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
    env = {**os.environ, "SPARK_HOME": SPARK_HOME, "PYSPARK_PYTHON": sys.executable}
    port = free_port()
    master = f"spark://127.0.0.1:{port}"
    deploy = "org.apache.spark.deploy"
    commands = [
        [f"{deploy}.master.Master", "--host", "127.0.0.1", "--port", str(port),
         "--webui-port", str(free_port(port))],
    ] + [
        [f"{deploy}.worker.Worker", "--host", f"127.0.0.{n}", "--cores", "1", "--memory",
         "1024m", "--webui-port", "0", "--work-dir", str(tmp_path / f"worker{n}"), master]
        for n in (2, 3)
    ]  # fmt: skip
    processes = []
    try:
        for command in commands:
            name = f"{command[0].rsplit('.', 1)[1]}-{len(processes)}.log"
            # The child keeps its own copy of the descriptor.
            with open(tmp_path / name, "w") as log:
                processes.append(
                    subprocess.Popen(
                        [spark_class, *command],
                        env=env,
                        stdout=log,
                        stderr=log,
                        start_new_session=True,
                    )
                )
        yield master
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _held_attempt(partition: int, row: int):
    """A proxy gate holding the first task (peer) that sends `partition`, from its
    `row`-th row on; a later attempt of the partition, on a channel of its own, passes."""
    first: list[str] = []

    def gate(proxy: SendBatchProxy, peer: str, request: pb.SendBatchRequest) -> bool:
        # Ids are <write id>:<partition>:<row>:<digest>.
        _, part, position, _ = request.entries[0].deduplication_id.rsplit(":", 3)
        if int(part) != partition:
            return False
        if not first:
            first.append(peer)
        return peer == first[0] and int(position) >= row

    return gate


def test_speculative_copies_of_a_slow_task_both_run_and_rows_land_once(
    server, messages, queue, tmp_path
):
    rows, partitions = 20_000, 2
    per_partition = rows // partitions
    proxy = SendBatchProxy(server.target, gate=_held_attempt(1, per_partition // 2))
    cluster = _standalone_cluster(tmp_path)
    master = next(cluster)
    spark = _session(
        master,
        free_port(),
        **{
            "spark.speculation": "true",
            "spark.speculation.interval": "100ms",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.multiplier": "1.5",
            "spark.speculation.minTaskRuntime": "100ms",
            "spark.cores.max": "2",
        },
    )
    try:
        wait_for(lambda: len(_status(spark, "executors")) >= 3, 120, "two executors")
        df = spark.range(0, rows, numPartitions=partitions)

        def release_once_speculating() -> None:
            try:
                wait_for(
                    lambda: any(
                        t.get("speculative")
                        for stage in _status(spark, "stages?details=true&status=active")
                        for t in stage.get("tasks", {}).values()
                    ),
                    180,
                    "a speculative attempt",
                )
                # The copy sends the partition from its start, over a channel (a
                # peer) of its own: the rows the held attempt committed go again.
                wait_for(lambda: len(proxy.calls) > partitions, 180, "the copy sending", every=0.02)
            finally:
                proxy.resume.set()

        releaser = threading.Thread(target=release_once_speculating, daemon=True)
        releaser.start()
        body = df.selectExpr("CAST(id AS STRING) AS id")
        writer(body, server, queue, body_column="id", target=proxy.address).save()
        releaser.join(30)
        stages = _status(spark, "stages?details=true&status=complete")
        attempts = [t for stage in stages for t in stage.get("tasks", {}).values()]
    finally:
        spark.stop()
        next(cluster, None)
        proxy.close()
    assert proxy.paused, "the original attempt was not held"
    copies = [t for t in attempts if t["index"] == 1]
    assert len(copies) == 2, copies
    assert any(t["speculative"] for t in copies), copies
    assert sum(proxy.chunk_sizes) > rows, "the held attempt sent nothing"
    _assert_once(messages, queue, rows)


def _publish(topics, topic: str, count: int) -> None:
    for start in range(0, count, 1000):
        entries = [
            tpb.PublishBatchEntry(body=str(i).encode())
            for i in range(start, min(start + 1000, count))
        ]
        topics.PublishBatch(tpb.PublishBatchRequest(topic=topic, entries=entries))


class _Driver:
    """cluster_stream_driver.py in a process group of its own: its JVM and executors die
    with it."""

    def __init__(self, log: Path, *args: str) -> None:
        path = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "SPARK_LOCAL_IP": "127.0.0.1"}
        # The child keeps its own copy of the descriptor.
        with open(log, "a") as output:
            self.process = subprocess.Popen(
                [sys.executable, str(HERE / "cluster_stream_driver.py"), *args],
                env=env,
                stdout=output,
                stderr=output,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def test_a_stream_whose_driver_is_killed_mid_batch_restarts_from_its_checkpoint_once(
    server, channel, messages, queues, queue, tmp_path
):
    rows, per_batch = 6000, 1000
    topics = topic_service_pb2_grpc.TopicServiceStub(channel)
    streams = stream_service_pb2_grpc.StreamServiceStub(channel)
    topic = unique_name("spark-cluster-stream")
    topics.CreateTopic(
        tpb.CreateTopicRequest(topic=tpb.Topic(name=topic, stream_retention=seconds(3600)))
    )
    group = spb.ConsumerGroup(topic=topic, name=GROUP)
    streams.CreateConsumerGroup(spb.CreateConsumerGroupRequest(consumer_group=group))
    _publish(topics, topic, rows)
    # Each SendBatch is held a little, so that a batch is seen half written.
    proxy = SendBatchProxy(server.target, hold=0.05)
    checkpoint = tmp_path / "checkpoint"
    args = ["local-cluster[2,1,1024]", server.target, proxy.address, topic, GROUP, queue,
            str(checkpoint)]  # fmt: skip
    try:
        driver = _Driver(tmp_path / "driver.log", *args)
        try:
            # Mid-batch: some batch committed, and the next only partly written.
            wait_for(
                lambda: (
                    (landed := stats(queues, queue).visible_messages) > per_batch
                    and landed % per_batch
                ),
                300,
                "a batch half written",
            )
        finally:
            driver.kill()
        landed_at_kill = stats(queues, queue).visible_messages
        assert 0 < landed_at_kill < rows
        sent_at_kill = sum(proxy.chunk_sizes)

        driver = _Driver(tmp_path / "driver.log", *args)
        try:
            wait_for(
                lambda: (
                    stats(queues, queue).visible_messages >= rows
                    and streams.GetConsumerGroup(
                        spb.GetConsumerGroupRequest(topic=topic, name=GROUP)
                    ).consumer_group.lag_messages
                    == 0
                ),
                300,
                "every row in the queue and the group caught up",
            )
        finally:
            driver.kill()
    finally:
        proxy.close()
    # The restart ran the half-written batch again; its rows that had landed were
    # dropped as repeats.
    assert sum(proxy.chunk_sizes) > rows, (sent_at_kill, landed_at_kill)
    _assert_once(messages, queue, rows)

    # The group's cursor is where Spark's last committed batch ends.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]
    offsets = (checkpoint / "offsets" / str(last)).read_text().splitlines()
    spark_end = json.loads(offsets[2])
    cursor = streams.GetStreamPosition(
        spb.GetStreamPositionRequest(topic=topic, consumer_group=GROUP)
    ).cursor_position
    assert {"tx": cursor.tx, "offset": cursor.offset} == spark_end
    assert not (checkpoint / "offsets" / str(last + 1)).exists(), "a batch left uncommitted"
