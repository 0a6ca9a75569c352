"""TLS and the auth token reach the server: Spark writes through a TLS-terminating gRPC
proxy (as a load balancer in front of postbox would be) that forwards to the real server."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_support import SendBatchProxy, receive_all, writer


@pytest.fixture
def tls_proxy(server, tmp_path: Path) -> Iterator[tuple[SendBatchProxy, Path]]:
    key, certificate = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=postbox.test", "-addext", "subjectAltName=DNS:postbox.test",
         "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    proxy = SendBatchProxy(
        server.target, key=key.read_bytes(), certificate=certificate.read_bytes()
    )
    yield proxy, certificate
    proxy.close()


def test_writes_over_tls_with_the_auth_token(spark, server, messages, queue, tls_proxy):
    proxy, certificate = tls_proxy
    df = spark.range(0, 2500, numPartitions=2).selectExpr("CAST(id AS STRING) AS body")
    writer(
        df, server, queue,
        target=f"127.0.0.1:{proxy.port}",
        tls="true", tls_ca_file=str(certificate), tls_server_name="postbox.test",
        auth_token="s3cret", body_column="body",
    ).save()  # fmt: skip
    assert len(receive_all(messages, queue)) == 2500
    assert proxy.authorizations
    assert set(proxy.authorizations) == {"Bearer s3cret"}


def test_a_certificate_the_client_does_not_trust_fails_the_write(spark, server, queue, tls_proxy):
    proxy, _ = tls_proxy
    df = spark.range(0, 10, numPartitions=1).selectExpr("CAST(id AS STRING) AS body")
    with pytest.raises(Exception, match="UNAVAILABLE"):
        writer(
            df, server, queue, target=f"127.0.0.1:{proxy.port}", tls="true",
            tls_server_name="postbox.test", body_column="body", max_attempts="2",
        ).save()  # fmt: skip
    assert proxy.authorizations == []
