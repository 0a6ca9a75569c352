"""Spark write throughput against SendBatch from a plain Python client, in one run.

    python bench/spark_write.py [--rows 1000000] [--database-url postgresql://...]

Starts a server (on an embedded PostgreSQL unless --database-url or
POSTBOX_BENCH_DATABASE_URL names a superuser URL to create a database on; or
uses the server at --target, as the `spark_write` scenario of `python -m bench`
does) and writes the same messages three ways, each into its own queue:

* plain: one Python process, SendBatch of 1,000 entries with the same total
  number of calls in flight as Spark's tasks together;
* spark-arrow: `df.write.format("postbox")`, the data source as shipped
  (DataSourceArrowWriter);
* spark-rows: the same sender behind the Row-based DataSourceWriter interface,
  to show what the Arrow interface buys.

Every message carries an idempotency id in all three, as Spark writes do. The
figures are messages committed per second; the ratios compare with plain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, cast

# pyspark forks the JVM's launcher after this process has opened gRPC channels;
# gRPC's fork handlers can crash such a child (grpc issue 43055, epoll EBADF).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import asyncpg
import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import (
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)

if TYPE_CHECKING:
    from bench.processes import HealthChecks
    from postbox_server.embedded import EmbeddedPostgres

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2, help="Spark tasks (local[N])")
    parser.add_argument("--in-flight", type=int, default=4, help="SendBatch calls per task")
    parser.add_argument("--database-url", default=os.environ.get("POSTBOX_BENCH_DATABASE_URL"))
    parser.add_argument("--target", help="use the postbox server at host:port instead of one's own")
    parser.add_argument(
        "--only", nargs="+", choices=["plain", "spark-arrow", "spark-stream", "spark-rows"]
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="run every variant this often, in rotated order"
    )
    parser.add_argument("--json", type=Path, help="also write msgs/s by variant to this file")
    parser.add_argument(
        "--skip-client-cpu", action="store_true", help="skip the client CPU per message figure"
    )
    return parser.parse_args()


def body(i: int, size: int) -> bytes:
    return f"{i:012d}".encode().ljust(size, b".")


def plain_client(target: str, queue: str, rows: int, size: int, in_flight: int) -> None:
    """SendBatch straight from the generated stubs: the ceiling for any client."""
    prefix = uuid.uuid4().hex
    with grpc.insecure_channel(target) as channel:
        send = message_service_pb2_grpc.MessageServiceStub(channel).SendBatch
        pending: list[grpc.Future] = []
        for start in range(0, rows, 1000):
            request = pb.SendBatchRequest(queue=queue)
            for i in range(start, min(start + 1000, rows)):
                request.entries.add(body=body(i, size), deduplication_id=f"{prefix}:{i}")
            if len(pending) >= in_flight:
                pending.pop(0).result()
            pending.append(send.future(request, timeout=120))
        for future in pending:
            future.result()


def spark_session(partitions: int):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
    )
    from postbox_client.spark import register
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(f"local[{partitions}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    _register_row_writer(spark)
    return spark


def row_requests(plan, rows: Iterator, prefix: str) -> Iterator:
    """What a Row-based writer does with the same plan: one row at a time."""
    from postbox_client.spark.client import EncodedRequest

    column = plan.body_column
    request = pb.SendBatchRequest(queue=plan.queue)
    for position, row in enumerate(rows):
        request.entries.add(body=row[column].encode(), deduplication_id=f"{prefix}:{position}")
        if len(request.entries) == plan.batch_size:
            yield EncodedRequest.of(request)
            request = pb.SendBatchRequest(queue=plan.queue)
    if len(request.entries):
        yield EncodedRequest.of(request)


def client_cpu(rows: int, size: int) -> tuple[float, float]:
    """CPU seconds per million rows to turn Arrow batches into requests: (arrow, rows).

    The rows path first converts each batch to Rows as Spark's Python worker does
    for a DataSourceWriter; no request is sent, so the server does not count.
    """
    import pyarrow as pa
    from postbox_client.spark.encode import Encoder
    from postbox_client.spark.options import write_plan
    from pyspark.sql.conversion import ArrowTableToRowsConversion
    from pyspark.sql.types import StringType, StructField, StructType, _create_row

    schema = StructType([StructField("body", StringType())])
    plan = write_plan({"queue": "q", "body_column": "body"}, schema, streaming=False)
    batches = [
        pa.record_batch({"body": [body(i, size).decode() for i in range(start, start + 10_000)]})
        for start in range(0, rows, 10_000)
    ]
    started = time.process_time()
    for batch in batches:
        for _ in Encoder(plan, "w:0").requests(batch):
            pass
    arrow = time.process_time() - started

    convert = [ArrowTableToRowsConversion._create_converter(f.dataType) for f in schema.fields]
    names = schema.fieldNames()

    def as_rows() -> Iterator:
        for batch in batches:
            columns = [ArrowTableToRowsConversion._to_pylist(c) for c in batch.columns]
            for i in range(batch.num_rows):
                values = [convert[c](columns[c][i]) for c in range(batch.num_columns)]
                yield _create_row(fields=names, values=values)

    started = time.process_time()
    for _ in row_requests(plan, as_rows(), "w:0"):
        pass
    by_row = time.process_time() - started
    return arrow * 1e6 / rows, by_row * 1e6 / rows


def _register_row_writer(spark) -> None:
    """Registers "postbox_rows": the shipped sender behind the Row-based interface."""
    from postbox_client.spark import PostboxDataSource
    from postbox_client.spark.options import write_plan
    from postbox_client.spark.writer import PartitionResult, _task_prefix
    from pyspark.sql.datasource import DataSourceWriter

    class RowWriter(DataSourceWriter):
        def __init__(self, plan) -> None:
            self.plan = plan

        def write(self, rows: Iterator) -> PartitionResult:
            from postbox_client.spark.client import BatchSender
            from pyspark import TaskContext

            plan = self.plan
            with plan.connection.open() as channel:
                sender = BatchSender(channel, plan.connection, plan.retry, plan.max_in_flight)
                for request in row_requests(plan, rows, _task_prefix(plan.write_id)):
                    sender.submit(request)
                sender.finish()
            context = TaskContext.get()
            return PartitionResult(
                context.partitionId() if context else 0,
                context.attemptNumber() if context else 0, sender.messages,
                sender.duplicates, sender.batches, sender.retries,
            )  # fmt: skip

    class RowSource(PostboxDataSource):
        @classmethod
        def name(cls) -> str:
            return "postbox_rows"

        def writer(self, schema, overwrite):
            return RowWriter(write_plan(self.options, schema, streaming=False))

    spark.dataSource.register(RowSource)


def spark_write(spark, fmt: str, target: str, queue: str, args: argparse.Namespace) -> None:
    from pyspark.sql import functions as F

    df = spark.range(0, args.rows, numPartitions=args.partitions).select(
        F.rpad(F.lpad(F.col("id").cast("string"), 12, "0"), args.body_size, ".").alias("body")
    )
    (
        df.write.format(fmt)
        .option("target", target)
        .option("queue", queue)
        .option("body_column", "body")
        .option("max_in_flight", str(args.in_flight))
        .mode("append")
        .save()
    )


def create_queue(queues, kind: str) -> str:
    name = f"{kind}_{uuid.uuid4().hex[:8]}"
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name))
    )
    return name


def stream_source(spark, directory: Path, args: argparse.Namespace) -> None:
    """Parquet files of the rows spark_write writes (and of a warm-up's 10,000), written
    before any measurement: the streaming variant reads them as its source."""
    from pyspark.sql import functions as F

    for name, rows in (("rows", args.rows), ("warm", 10_000)):
        spark.range(0, rows, numPartitions=args.partitions).select(
            F.rpad(F.lpad(F.col("id").cast("string"), 12, "0"), args.body_size, ".").alias("body")
        ).write.parquet(str(directory / name))


def stream_write(spark, source: Path, target: str, queue: str, args: argparse.Namespace) -> None:
    """`df.writeStream.format("postbox")`: one micro-batch of every file in `source`,
    with a checkpoint of its own (a new query)."""
    with tempfile.TemporaryDirectory(prefix="spark-bench-checkpoint-") as checkpoint:
        query = (
            spark.readStream.schema("body string")
            .parquet(str(source))
            .writeStream.format("postbox")
            .option("target", target)
            .option("queue", queue)
            .option("body_column", "body")
            .option("max_in_flight", str(args.in_flight))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        if query.exception() is not None:
            raise SystemExit(f"the streaming write failed: {query.exception()}")


@dataclass(frozen=True)
class CpuSplit:
    """CPU seconds by part: this process (the plain client; Spark's driver), Spark's
    JVM, its Python workers, the server and PostgreSQL (0 for a --target server)."""

    here: float = 0.0
    jvm: float = 0.0
    python_workers: float = 0.0
    server: float = 0.0
    postgres: float = 0.0

    def __sub__(self, other: CpuSplit) -> CpuSplit:
        return CpuSplit(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @staticmethod
    def header() -> str:
        return " / ".join(field.name for field in fields(CpuSplit)) + " (total)"

    @staticmethod
    def median(splits: list[CpuSplit]) -> CpuSplit:
        columns = zip(*map(astuple, splits), strict=True)
        return CpuSplit(*(statistics.median(parts) for parts in columns))

    def per_message(self, rows: int) -> str:
        parts = [seconds * 1e6 / rows for seconds in astuple(self)]
        return " / ".join(f"{part:.1f}" for part in parts) + f" ({sum(parts):.1f})"


class CpuMeter:
    """Reads a CpuSplit: the JVM is this process's java child, the Python workers the
    JVM's descendants; the server and PostgreSQL only when this script started them.

    Spark's Python daemons fork workers that come and go, and do not always wait for
    them, so a process's CPU is kept as last seen: one that ended between two readings
    misses only its last moments rather than taking back all it had used."""

    def __init__(self, server: Server | None) -> None:
        self.here = psutil.Process()
        self.server = psutil.Process(server.process.pid) if server else None
        self.postmaster = None
        if server is not None and server.embedded is not None:
            pid = (server.embedded.data_dir / "postmaster.pid").read_text().split()[0]
            self.postmaster = psutil.Process(int(pid))
        self.last_seen: dict[tuple[int, float], tuple[str, float]] = {}

    def totals(self) -> CpuSplit:
        for process in self.here.children():
            if process.name() == "java":
                self._read(process, "jvm", "python_workers")
        for part, root in (("server", self.server), ("postgres", self.postmaster)):
            if root is not None:
                self._read(root, part, part)
        used = dict.fromkeys(("jvm", "python_workers", "server", "postgres"), 0.0)
        for part, seconds in self.last_seen.values():
            used[part] += seconds
        own = self.here.cpu_times()
        return CpuSplit(here=own.user + own.system, **used)

    def _read(self, root: psutil.Process, part: str, descendants: str) -> None:
        for process in [root, *root.children(recursive=True)]:
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    times = process.cpu_times()
                    name = process.name()
            except psutil.NoSuchProcess:
                continue  # ended meanwhile: its last moments go uncounted
            kind = part if process.pid == root.pid or name == root.name() else descendants
            self.last_seen[key] = (kind, times.user + times.system)


class Server:
    """A database of its own and `python -m postbox_server serve` on a free port."""

    def __init__(self, admin_url: str | None) -> None:
        self.admin_url = admin_url
        self.embedded: EmbeddedPostgres | None = None
        self.database = f"postbox_spark_bench_{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> Server:
        if self.admin_url is None:
            from postbox_server.embedded import EmbeddedPostgres

            self.embedded = EmbeddedPostgres(Path(tempfile.mkdtemp()) / "data")
            self.embedded.start()
            self.admin_url = self.embedded.uri("postgres")
        asyncio.run(self._sql(f'CREATE DATABASE "{self.database}"'))
        if self.embedded is not None:  # its URL names a socket directory after the database
            database_url = self.embedded.uri(self.database)
        else:
            database_url = f"{self.admin_url.rpartition('/')[0]}/{self.database}"
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.target = f"127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "postbox_server", "serve", "--database-url",
             database_url, "--grpc-host", "127.0.0.1", "--grpc-port", str(port)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with grpc.insecure_channel(self.target) as channel:
            health = cast("HealthChecks", health_pb2_grpc.HealthStub(channel))
            for _ in range(600):
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return self
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise RuntimeError("server did not start")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(30)
        asyncio.run(self._sql(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)'))
        if self.embedded is not None:
            self.embedded.stop()

    async def _sql(self, statement: str) -> None:
        conn = await asyncpg.connect(self.admin_url)
        try:
            await conn.execute(statement)
        finally:
            await conn.close()


def rotated(variants: list[str], round_number: int) -> list[str]:
    """The variants in the order of one round: each round starts one later, so none
    always runs first on an empty database or always follows another's writes."""
    shift = round_number % len(variants)
    return variants[shift:] + variants[:shift]


def main() -> None:
    args = parse_args()
    variants = args.only or ["plain", "spark-arrow", "spark-stream", "spark-rows"]
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    ratios: dict[str, list[float]] = {variant: [] for variant in variants if variant != "plain"}
    cpu: dict[str, list[CpuSplit]] = {variant: [] for variant in variants}
    with contextlib.ExitStack() as stack:
        server = None if args.target else stack.enter_context(Server(args.database_url))
        target = args.target or cast(Server, server).target
        channel = stack.enter_context(grpc.insecure_channel(target))
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        spark = spark_session(args.partitions) if variants != ["plain"] else None
        source = None
        if spark is not None:  # warm the JVM and Python workers, outside the measurement
            warm = create_queue(queues, "warm")
            warm_args = argparse.Namespace(**{**vars(args), "rows": 10_000})
            spark_write(spark, "postbox", target, warm, warm_args)
            if "spark-stream" in variants:
                source = stack.enter_context(tempfile.TemporaryDirectory(prefix="spark-bench-"))
                stream_source(spark, Path(source), args)
                stream_write(spark, Path(source) / "warm", target, warm, args)
        meter = CpuMeter(server)
        for round_number in range(args.rounds):
            this_round: dict[str, float] = {}
            for variant in rotated(variants, round_number):
                queue = create_queue(queues, variant.replace("-", "_"))
                before = meter.totals()
                started = time.perf_counter()
                if variant == "plain":
                    in_flight = args.in_flight * args.partitions
                    plain_client(target, queue, args.rows, args.body_size, in_flight)
                elif variant == "spark-stream":
                    stream_write(spark, Path(cast(str, source)) / "rows", target, queue, args)
                else:
                    fmt = "postbox" if variant == "spark-arrow" else "postbox_rows"
                    spark_write(spark, fmt, target, queue, args)
                elapsed = time.perf_counter() - started
                cpu[variant].append(meter.totals() - before)
                stats = queues.GetQueue(queue_service_pb2.GetQueueRequest(name=queue)).queue.stats
                if stats.visible_messages != args.rows:
                    raise SystemExit(
                        f"{variant}: {stats.visible_messages} messages, not {args.rows}"
                    )
                this_round[variant] = args.rows / elapsed
                rates[variant].append(this_round[variant])
                print(
                    f"round {round_number + 1} {variant:12} {args.rows:>9,} msgs in"
                    f" {elapsed:7.1f} s: {this_round[variant]:>9,.0f}/s"
                    f" (load average {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            if "plain" in this_round:
                for variant in ratios:
                    ratios[variant].append(this_round[variant] / this_round["plain"])
        if spark is not None:
            spark.stop()
    for variant, values in ratios.items():
        print(
            f"{variant} / plain: median {statistics.median(values):.2f}"
            f" (range {min(values):.2f}-{max(values):.2f};"
            f" rounds {', '.join(f'{v:.2f}' for v in values)})"
        )
    print("CPU µs per message, median of rounds:", CpuSplit.header())
    for variant, splits in cpu.items():
        print(f"  {variant:12}", CpuSplit.median(splits).per_message(args.rows))
    if args.json:
        medians = {variant: statistics.median(values) for variant, values in rates.items()}
        args.json.write_text(
            json.dumps({"rows": args.rows, "rates": medians, "ratios": ratios}) + "\n"
        )
    if args.skip_client_cpu:
        return
    arrow, by_row = client_cpu(min(args.rows, 200_000), args.body_size)
    print(
        f"client CPU per message: Arrow writer {arrow:.1f} µs, Row writer {by_row:.1f} µs"
        f" ({by_row / arrow:.2f}x)"
    )


if __name__ == "__main__":
    main()
