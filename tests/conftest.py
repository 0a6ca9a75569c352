"""Fixtures: a PostgreSQL for the run, a fresh database, the real server, and stubs."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path, PurePosixPath

# gRPC's fork handlers can crash a child forked while channels are open (grpc
# issue 43055, epoll EBADF): pyspark forks the JVM's launcher that way. The tests
# fork only to exec, so they need no fork support; set before gRPC initializes.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import asyncpg
import grpc
import pytest
from postbox.v1 import (
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
    stream_service_pb2_grpc,
    topic_service_pb2_grpc,
)
from support import (
    ServerProcess,
    SqsShimProcess,
    create_database,
    drop_database,
    sqs_client,
    unique_name,
)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Each phase's report on the test item, for fixtures that act on a failure (the
    console tests keep a screenshot)."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# Under pytest-xdist (the README's `-n 4 --dist loadgroup`) a file's tests run on one
# worker, in order, as they do without it: some build on what an earlier one left. The
# areas whose tests start processes, clusters or JVMs of their own, hold the machine's
# ports or time what the machine does run whole on one worker each, beside the others.
SERIAL_AREAS = ("ops", "survival", "spark", "console")


def xdist_group(nodeid: str) -> str:
    """The group a test runs in under `--dist loadgroup`: its area if serial, else its file."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    return path.parent.name if path.parent.name in SERIAL_AREAS else str(path)


# tryfirst: xdist's own scheduler would answer first. Its loadgroup reads xdist_group marks
# through a suffix its workers append to each test's id, which pytest 9.2's structured ids
# no longer take (pytest-xdist issue 1386): the marks are silently ignored. This takes the
# group from the id's path instead, which every pytest reports.
@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByArea(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ByArea(config, log)


@pytest.fixture(scope="session")
def admin_url() -> Iterator[str]:
    """A PostgreSQL superuser URL: $POSTBOX_TEST_DATABASE_URL, or an embedded server."""
    url = os.environ.get("POSTBOX_TEST_DATABASE_URL")
    if url:
        yield url
        return
    from postbox_server.embedded import EmbeddedPostgres

    directory = tempfile.mkdtemp(prefix="postbox-test-pg-")
    embedded = EmbeddedPostgres(Path(directory) / "data")
    embedded.start()
    try:
        yield embedded.uri("postgres")
    finally:
        embedded.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    """A database of this test run, dropped at the end."""
    url = create_database(admin_url)
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="session")
def server(database_url: str) -> Iterator[ServerProcess]:
    process = ServerProcess(
        database_url,
        "--safety-poll-interval",
        "2",
        "--maintenance-interval",
        "0.2",
        "--expiry-interval",
        "0.5",
        metrics=True,
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.target) as channel:
        yield channel


@pytest.fixture(scope="session")
def queues(channel: grpc.Channel) -> queue_service_pb2_grpc.QueueServiceStub:
    return queue_service_pb2_grpc.QueueServiceStub(channel)


@pytest.fixture(scope="session")
def messages(channel: grpc.Channel) -> message_service_pb2_grpc.MessageServiceStub:
    return message_service_pb2_grpc.MessageServiceStub(channel)


@pytest.fixture(scope="session")
def topics(channel: grpc.Channel) -> topic_service_pb2_grpc.TopicServiceStub:
    return topic_service_pb2_grpc.TopicServiceStub(channel)


@pytest.fixture(scope="session")
def streams(channel: grpc.Channel) -> stream_service_pb2_grpc.StreamServiceStub:
    return stream_service_pb2_grpc.StreamServiceStub(channel)


@pytest.fixture
def queue(
    queues: queue_service_pb2_grpc.QueueServiceStub, request: pytest.FixtureRequest
) -> Iterator[str]:
    """A new queue for one test, deleted afterwards."""
    name = unique_name(request.node.name)
    queues.CreateQueue(
        queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name))
    )
    yield name
    try:
        queues.DeleteQueue(queue_service_pb2.DeleteQueueRequest(name=name))
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise


@pytest.fixture
async def aio_channel(server: ServerProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield channel


@pytest.fixture
async def db(database_url: str, server: ServerProcess) -> AsyncIterator[asyncpg.Connection]:
    """A direct connection to the run's database, with the engine installed by the server."""
    conn = await asyncpg.connect(database_url)
    yield conn
    await conn.close()


@pytest.fixture(scope="session")
def sqs_shim(server: ServerProcess) -> Iterator[SqsShimProcess]:
    process = SqsShimProcess(server.target).start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def sqs(sqs_shim: SqsShimProcess):
    """A boto3 SQS client on the JSON protocol (current botocore's)."""
    return sqs_client(sqs_shim.endpoint, "json")


@pytest.fixture(scope="session")
def sqs_query(sqs_shim: SqsShimProcess):
    """A boto3 SQS client on the query protocol."""
    return sqs_client(sqs_shim.endpoint, "query")


@pytest.fixture(params=["json", "query"])
def sqs_any(request: pytest.FixtureRequest, sqs, sqs_query):
    """Each protocol in turn."""
    return sqs if request.param == "json" else sqs_query


@pytest.fixture
def sqs_queue(sqs, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a new standard queue for one test, deleted afterwards."""
    url = sqs.create_queue(QueueName=unique_name(request.node.name))["QueueUrl"]
    yield url
    with contextlib.suppress(sqs.exceptions.QueueDoesNotExist):
        sqs.delete_queue(QueueUrl=url)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """One local Spark for the run: 2 cores, a task may fail once and be retried, no UI."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors' Python workers must import grpc, pyarrow and this package too, and
    # the tests' own modules, which functions shipped to them refer to.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    tests = Path(__file__).resolve().parent
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(tests), str(tests / "spark"), os.environ.get("PYTHONPATH")) if p
    )
    # The data source's log, from the driver's Python workers too (test_spark_stream).
    os.environ["POSTBOX_SPARK_LOG_FILE"] = str(tmp_path_factory.mktemp("spark-log") / "postbox.log")
    from postbox_client.spark import register
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("postbox-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("spark-warehouse")))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    register(session)
    yield session
    session.stop()


@pytest.fixture
async def commit_sizes(db):
    """How the top-level transactions that inserted given messages shared them.

    A trigger notes txid_current() for every inserted message: unlike xmin, it is
    the same in every savepoint of a transaction, so a group that fell back to one
    savepoint per message still counts as the one commit it was.
    """
    await db.execute(
        """
        CREATE TABLE public.group_commit_probe (message_id bigint, top_xid bigint);
        CREATE FUNCTION public.group_commit_probe() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO public.group_commit_probe VALUES (NEW.id, txid_current());
            RETURN NEW;
        END $$;
        CREATE TRIGGER group_commit_probe AFTER INSERT ON postbox.messages
            FOR EACH ROW EXECUTE FUNCTION public.group_commit_probe();
        """
    )

    async def sizes(ids: list[str]) -> list[int]:
        """How many of these messages each commit carried."""
        rows = await db.fetch(
            "SELECT count(*) FROM public.group_commit_probe "
            "WHERE message_id = ANY($1::bigint[]) GROUP BY top_xid",
            [int(i) for i in ids],
        )
        return [row[0] for row in rows]

    try:
        yield sizes
    finally:
        await db.execute(
            "DROP TRIGGER group_commit_probe ON postbox.messages;"
            "DROP FUNCTION public.group_commit_probe(); DROP TABLE public.group_commit_probe"
        )
