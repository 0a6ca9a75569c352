"""TLS and mutual TLS on every front door, with certificates made here by `cryptography`:
a CA that signs the server's and a client's certificates, and a rogue CA whose
certificates nobody trusts.

Each side is the real thing: the server's gRPC port, the SQS shim's HTTPS port and its
channel to the server, the SDK, the CLI, boto3 and a local Spark session.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from certificates import Authority, Pair
from postbox.v1 import queue_service_pb2 as qpb
from postbox.v1 import queue_service_pb2_grpc
from postbox_client import TLS, Client
from spark_support import receive_all, writer
from support import ServerProcess, SqsShimProcess, free_port, sqs_client, unique_name


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server: Pair
    client: Pair
    rogue_ca: Path
    rogue_client: Pair


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("tls")
    authority, rogue = Authority(directory, "postbox"), Authority(directory, "rogue")
    return Certificates(
        ca=authority.path,
        server=authority.issue("server", server=True),
        client=authority.issue("client", server=False),
        rogue_ca=rogue.path,
        rogue_client=rogue.issue("intruder", server=False),
    )


def _server_flags(certs: Certificates, *, mutual: bool) -> tuple[str, ...]:
    flags = ("--tls-cert", str(certs.server.certificate), "--tls-key", str(certs.server.key))
    return (*flags, "--tls-client-ca", str(certs.ca)) if mutual else flags


@pytest.fixture(scope="module")
def tls_server(database_url: str, certs: Certificates) -> Iterator[ServerProcess]:
    credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes())
    process = ServerProcess(
        database_url, *_server_flags(certs, mutual=False), credentials=credentials
    ).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def mtls_server(database_url: str, certs: Certificates) -> Iterator[ServerProcess]:
    credentials = certs.client.tls(certs.ca).credentials()
    process = ServerProcess(
        database_url, *_server_flags(certs, mutual=True), credentials=credentials
    ).start()
    yield process
    process.stop()


def _list_queues(channel: grpc.Channel) -> qpb.ListQueuesResponse:
    stub = queue_service_pb2_grpc.QueueServiceStub(channel)
    return stub.ListQueues(qpb.ListQueuesRequest(page_size=1), timeout=10)


def _refused(channel: grpc.Channel) -> grpc.RpcError:
    with channel, pytest.raises(grpc.RpcError) as raised:
        _list_queues(channel)
    return raised.value


def test_the_sdk_sends_and_receives_over_tls(tls_server, certs):
    queue = unique_name("tls")
    with Client(tls_server.target, tls=TLS(root_certificates=certs.ca.read_bytes())) as client:
        client.create_queue(queue)
        client.send(queue, b"sealed")
        (message,) = client.receive(queue, max_messages=10)
        assert message.body == b"sealed"


def test_a_plaintext_client_gets_no_answer_from_a_tls_server(tls_server):
    error = _refused(grpc.insecure_channel(tls_server.target))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_that_trusts_another_ca_refuses_the_server(tls_server, certs):
    credentials = grpc.ssl_channel_credentials(certs.rogue_ca.read_bytes())
    error = _refused(grpc.secure_channel(tls_server.target, credentials))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls_admits_a_client_certificate_the_ca_signed(mtls_server, certs):
    credentials = certs.client.tls(certs.ca).credentials()
    with grpc.secure_channel(mtls_server.target, credentials) as channel:
        _list_queues(channel)


@pytest.mark.parametrize("client", ["none", "rogue"])
def test_mutual_tls_refuses_a_client_without_a_certificate_the_ca_signed(
    mtls_server, certs, client
):
    if client == "none":
        credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes())
    else:
        credentials = certs.rogue_client.tls(certs.ca).credentials()
    error = _refused(grpc.secure_channel(mtls_server.target, credentials))
    assert error.code() == grpc.StatusCode.UNAVAILABLE


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "postbox_server", *args], capture_output=True, text=True, timeout=60
    )


def test_the_cli_reaches_a_mutual_tls_server_with_its_flags(mtls_server, certs):
    queue = unique_name("cli_tls")
    tls = ("--tls-ca", str(certs.ca), "--tls-cert", str(certs.client.certificate))
    tls += ("--tls-key", str(certs.client.key))
    created = _cli("queues", "create", queue, "--target", mtls_server.target, *tls)
    assert created.returncode == 0, created.stderr
    listed = _cli("queues", "ls", "--target", mtls_server.target, *tls)
    assert listed.returncode == 0, listed.stderr
    assert queue in listed.stdout

    without_certificate = _cli(
        "queues", "ls", "--target", mtls_server.target, "--tls-ca", str(certs.ca)
    )
    assert without_certificate.returncode == 1
    assert without_certificate.stderr.startswith("UNAVAILABLE")


def test_the_cli_names_a_client_flag_that_cannot_work(certs):
    half = _cli("queues", "ls", "--tls-cert", str(certs.client.certificate))
    assert half.returncode == 2
    assert "give --tls-cert and --tls-key together" in half.stderr
    missing = _cli("queues", "ls", "--tls-ca", "/nonexistent/ca.pem")
    assert missing.returncode == 2
    assert "--tls-ca '/nonexistent/ca.pem': No such file or directory" in missing.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--tls-cert", "{server.certificate}"), "give --tls-cert and --tls-key together"),
        (("--tls-client-ca", "{ca}"), "--tls-client-ca needs --tls-cert and --tls-key"),
        (
            ("--tls-cert", "{server.certificate}", "--tls-key", "{client.key}"),
            "--tls-cert and --tls-key: not a PEM certificate chain and its key",
        ),
        (
            ("--tls-cert", "{server.certificate}", "--tls-key", "/nonexistent/key.pem"),
            "--tls-key '/nonexistent/key.pem': No such file or directory",
        ),
    ],
)
@pytest.mark.parametrize("verb", ["serve", "sqs"])
def test_a_front_door_with_tls_flags_that_cannot_work_does_not_start(
    certs, database_url, verb, flags, message
):
    values = {"server": certs.server, "client": certs.client, "ca": certs.ca}
    args = [flag.format(**values) for flag in flags]
    port = ("--grpc-port" if verb == "serve" else "--port", str(free_port()))
    database = ("--database-url", database_url) if verb == "serve" else ()
    result = _cli(verb, *port, *database, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "PRIVATE KEY" not in result.stderr  # the key's content is never quoted


def test_workers_serve_tls_each(database_url, certs):
    """`serve --workers 2` hands each worker the TLS flags (by path)."""
    process = ServerProcess(
        database_url,
        "--workers",
        "2",
        *_server_flags(certs, mutual=True),
        credentials=certs.client.tls(certs.ca).credentials(),
    ).start()
    try:
        # A channel per connection, so the kernel spreads them over both workers.
        options = [("grpc.use_local_subchannel_pool", 1)]
        for _ in range(8):
            credentials = certs.client.tls(certs.ca).credentials()
            with grpc.secure_channel(process.target, credentials, options=options) as channel:
                _list_queues(channel)
        refused = _refused(grpc.insecure_channel(process.target))
        assert refused.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        process.stop()


@pytest.fixture(scope="module")
def https_shim(mtls_server, certs) -> Iterator[SqsShimProcess]:
    """The shim over HTTPS, calling the mutual-TLS server with the client certificate."""
    context = ssl.create_default_context(cafile=str(certs.ca))
    shim = SqsShimProcess(
        mtls_server.target,
        "--tls-cert", str(certs.server.certificate),
        "--tls-key", str(certs.server.key),
        "--grpc-tls-ca", str(certs.ca),
        "--grpc-tls-cert", str(certs.client.certificate),
        "--grpc-tls-key", str(certs.client.key),
        https=context,
    ).start()  # fmt: skip
    yield shim
    shim.stop()


def test_boto3_talks_https_to_the_shim_which_calls_the_server_over_mutual_tls(https_shim, certs):
    sqs = sqs_client(https_shim.endpoint, verify=str(certs.ca))
    url = sqs.create_queue(QueueName=unique_name("https"))["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="over https")
    received = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert [m["Body"] for m in received] == ["over https"]


def test_a_shim_without_the_client_certificate_cannot_call_a_mutual_tls_server(mtls_server, certs):
    shim = SqsShimProcess(mtls_server.target, "--grpc-tls-ca", str(certs.ca)).start()
    try:
        sqs = sqs_client(shim.endpoint)
        with pytest.raises(sqs.exceptions.ClientError) as raised:
            sqs.list_queues()
        assert raised.value.response["Error"]["Code"] == "ServiceUnavailable"
    finally:
        shim.stop()


def test_spark_writes_to_a_mutual_tls_server_with_its_client_certificate(
    spark, mtls_server, messages, queue, certs
):
    df = spark.range(0, 500, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    writer(
        df, mtls_server, queue, tls="true", tls_ca_file=str(certs.ca),
        tls_cert_file=str(certs.client.certificate), tls_key_file=str(certs.client.key),
        body_column="body",
    ).save()  # fmt: skip
    assert len(receive_all(messages, queue)) == 500
