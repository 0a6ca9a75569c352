"""Signed SNS messages, checked by validators that SNS subscribers use.

A server and an HTTPS shim share one --sns-signing-key file (the server makes it). Topics
with SignatureVersion 1 and 2 deliver into SQS queues (read back with boto3) and to an
HTTP endpoint (confirmation and notifications). Every message must pass npm's
sns-validator (tests/aws/sns-validator, `npm ci` there) and, for version 1, PyPI's
aws-sns-message-validator (it knows no version 2); a copy with its Message changed must
fail both. Both validators only fetch certificates from SNS's own hosts over https: they
are given a host pattern for the shim's 127.0.0.1:PORT instead (their option for it), and
trust the test CA that issued the shim's certificate (NODE_EXTRA_CA_CERTS,
REQUESTS_CA_BUNDLE); what postbox sends is not changed for them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from certificates import Authority
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from support import ROOT, HttpServerProcess, SqsShimProcess, eventually, sqs_client, unique_name
from test_sns import _Endpoint, _receive

VALIDATOR_DIR = ROOT / "tests" / "aws" / "sns-validator"


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return Authority(tmp_path_factory.mktemp("sns-tls"), "sns-test")


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Not there yet: the server makes it, and the shim then reads the same one.
    return tmp_path_factory.mktemp("sns-key") / "sns-signing.pem"


@pytest.fixture(scope="module")
def signing_server(database_url: str, key_file: Path) -> Iterator[HttpServerProcess]:
    process = HttpServerProcess(database_url, "--sns-signing-key", str(key_file)).start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def signing_shim(signing_server, authority: Authority, key_file: Path) -> Iterator[SqsShimProcess]:
    pair = authority.issue("shim", server=True)
    process = SqsShimProcess(
        signing_server.target,
        "--tls-cert", str(pair.certificate), "--tls-key", str(pair.key),
        "--sns-signing-key", str(key_file), "--webhook-allow-cidr", "127.0.0.0/8",
        https=ssl.create_default_context(cafile=str(authority.path)),
    ).start()  # fmt: skip
    yield process
    process.stop()


@pytest.fixture(scope="module")
def clients(signing_shim, authority: Authority):
    """An SNS and an SQS client that trust the shim's certificate."""
    import boto3
    from botocore.config import Config

    verify = str(authority.path)
    sns = boto3.client(
        "sns", endpoint_url=signing_shim.endpoint, region_name="us-east-1",
        aws_access_key_id="postbox-test", aws_secret_access_key="unchecked", verify=verify,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )  # fmt: skip
    return sns, sqs_client(signing_shim.endpoint, verify=verify)


def _host_pattern(shim: SqsShimProcess) -> str:
    return rf"^127\.0\.0\.1:{shim.port}$"


def _node_validate(messages: list[dict[str, Any]], shim: SqsShimProcess, ca: Path) -> list[str]:
    node = shutil.which("node")
    assert node is not None, "node is needed: npm's sns-validator runs on it"
    assert (VALIDATOR_DIR / "node_modules" / "sns-validator").is_dir(), (
        f"run `npm ci --prefix {VALIDATOR_DIR.relative_to(ROOT)}` first (.ci/run does)"
    )
    completed = subprocess.run(
        [node, str(VALIDATOR_DIR / "validate.js"), _host_pattern(shim)],
        input=json.dumps(messages), capture_output=True, text=True, timeout=60, check=True,
        env={**os.environ, "NODE_EXTRA_CA_CERTS": str(ca)},
    )  # fmt: skip
    return json.loads(completed.stdout)


def _pypi_validate(
    message: dict[str, Any], shim: SqsShimProcess, ca: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aws-sns-message-validator's check; raises what it raises. SignatureVersion 1 only."""
    from sns_message_validator import SNSMessageValidator

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    SNSMessageValidator(cert_url_regex=rf"^https://127\.0\.0\.1:{shim.port}/").validate_message(
        message
    )


def _verify_by_the_documented_recipe(
    message: dict[str, Any], certificate: x509.Certificate | None = None
) -> None:
    """AWS's steps, written out here apart from the server's code: fetch the certificate
    (unless given), build the string to sign from the type's fields, check RSA with SHA1
    or SHA256."""
    if certificate is None:
        with urllib.request.urlopen(
            message["SigningCertURL"], timeout=10, context=ssl.create_default_context(cafile=_CA[0])
        ) as answer:
            certificate = x509.load_pem_x509_certificate(answer.read())
    if message["Type"] == "Notification":
        fields = ["Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"]
    else:
        fields = ["Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"]
    text = "".join(f"{f}\n{message[f]}\n" for f in fields if f in message)
    algorithm = hashes.SHA1() if message["SignatureVersion"] == "1" else hashes.SHA256()
    public_key = certificate.public_key()
    assert isinstance(public_key, rsa.RSAPublicKey)
    public_key.verify(
        base64.b64decode(message["Signature"]), text.encode(), padding.PKCS1v15(), algorithm
    )


_CA: list[str] = []


@pytest.fixture(autouse=True)
def _ca_for_the_recipe(authority: Authority) -> None:
    _CA[:] = [str(authority.path)]


def _tampered(message: dict[str, Any]) -> dict[str, Any]:
    return {**message, "Message": message["Message"] + " (changed)"}


# What npm's sns-validator 0.3 answers for an UnsubscribeConfirmation signed as AWS
# documents ("Verifying the signatures of Amazon SNS messages": Token is signed, as for
# a SubscriptionConfirmation): it reads every type but SubscriptionConfirmation with the
# Notification field list, without Token, so no message AWS's recipe signs passes it.
# The PyPI validator and the recipe below follow AWS; here npm's must get as far as
# the signature (the shape and the certificate passed) and no further.
_NODE_MISREADS = {"UnsubscribeConfirmation": "The message signature is invalid."}


def _check(messages: list[dict[str, Any]], version: str, shim, authority, monkeypatch) -> None:
    """Every message passes every validator that knows its version; tampered, none."""
    ca = authority.path
    assert _node_validate(messages, shim, ca) == [
        _NODE_MISREADS.get(m["Type"], "ok") for m in messages
    ]
    tampered = _node_validate([_tampered(m) for m in messages], shim, ca)
    assert all(result != "ok" for result in tampered), tampered
    for message in messages:
        assert message["SignatureVersion"] == version
        assert message["SigningCertURL"] == f"{shim.endpoint}/SimpleNotificationService.pem"
        _verify_by_the_documented_recipe(message)
        if version == "1":
            from sns_message_validator import SignatureVerificationFailureException

            _pypi_validate(message, shim, ca, monkeypatch)
            with pytest.raises(SignatureVerificationFailureException):
                _pypi_validate(_tampered(message), shim, ca, monkeypatch)


def test_the_key_file_is_made_once_and_both_ports_serve_its_certificate(
    signing_server, signing_shim, key_file: Path, authority: Authority
):
    assert key_file.stat().st_mode & 0o777 == 0o600
    pem = key_file.read_bytes()
    assert b"PRIVATE KEY" in pem
    assert b"CERTIFICATE" in pem
    stored = x509.load_pem_x509_certificate(pem[pem.index(b"-----BEGIN CERTIFICATE") :])
    context = ssl.create_default_context(cafile=str(authority.path))
    with urllib.request.urlopen(
        f"{signing_shim.endpoint}/SimpleNotificationService.pem", timeout=10, context=context
    ) as answer:
        from_shim = answer.read()
    with urllib.request.urlopen(f"{signing_server.base}/v1/cert", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("application/x-pem-file")
        from_server = answer.read()
    assert from_shim == from_server == stored.public_bytes(serialization.Encoding.PEM)


def test_the_rest_api_s_cert_is_the_one_that_signs(clients, signing_server, request):
    """beyond-queue's GET /v1/cert, fetched with a plain HTTP client from the REST port:
    the certificate whose key verifies a delivered envelope, and not a changed one."""
    sns, sqs = clients
    name = unique_name(request.node.name)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    topic = sns.create_topic(Name=name, Attributes={"SignatureVersion": "2"})["TopicArn"]
    try:
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        sns.publish(TopicArn=topic, Message="checked with /v1/cert")
        [envelope] = [json.loads(m["Body"]) for m in _receive(sqs, url, 1)]
    finally:
        sns.delete_topic(TopicArn=topic)
        sqs.delete_queue(QueueUrl=url)
    # No credentials: subscribers fetch it as they fetch SNS's.
    with urllib.request.urlopen(f"{signing_server.base}/v1/cert", timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("application/x-pem-file")
        pem = answer.read()
    assert pem.startswith(b"-----BEGIN CERTIFICATE-----")
    certificate = x509.load_pem_x509_certificate(pem)
    _verify_by_the_documented_recipe(envelope, certificate)
    with pytest.raises(InvalidSignature):
        _verify_by_the_documented_recipe(_tampered(envelope), certificate)


def _get(url: str, context: ssl.SSLContext | None = None) -> bytes:
    with urllib.request.urlopen(url, timeout=10, context=context) as answer:
        assert answer.headers["Content-Type"].startswith("application/x-pem-file")
        return answer.read()


def test_with_no_key_file_named_the_server_makes_one_beside_its_data_dir_and_keeps_it(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    data_dir = tmp_path / "state" / "pgdata"
    made = tmp_path / "state" / "sns-signing-key.pem"
    served = []
    for _ in range(2):  # the second start is a restart: the same key, the same certificate
        server = HttpServerProcess(database_url, "--data-dir", str(data_dir)).start()
        try:
            cert = _get(f"{server.base}/SimpleNotificationService.pem")
            assert _get(f"{server.base}/v1/cert") == cert
            served.append(cert)
        finally:
            server.stop()
        assert made.stat().st_mode & 0o777 == 0o600
        # The key is in the file and nowhere in what the server said.
        assert b"PRIVATE KEY" in made.read_bytes()
        assert "PRIVATE KEY" not in server.log()
    assert served[0] == served[1]
    assert x509.load_pem_x509_certificate(served[0])
    # The shim on the same host finds the same file through the same data directory.
    monkeypatch.setenv("POSTBOX_DATA_DIR", str(data_dir))
    server = HttpServerProcess(database_url, "--data-dir", str(data_dir)).start()
    shim = SqsShimProcess(server.target).start()
    try:
        assert _get(f"{shim.endpoint}/SimpleNotificationService.pem") == served[0]
    finally:
        shim.stop()
        server.stop()


@pytest.mark.parametrize("version", ["1", "2"])
def test_sqs_delivered_envelopes_pass_the_validators(
    version, clients, signing_shim, authority, monkeypatch, request
):
    sns, sqs = clients
    name = unique_name(request.node.name)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    topic = sns.create_topic(Name=name, Attributes={"SignatureVersion": version})["TopicArn"]
    try:
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
        sns.publish(TopicArn=topic, Message="with a subject", Subject="hello")
        sns.publish_batch(
            TopicArn=topic,
            PublishBatchRequestEntries=[
                {"Id": "a", "Message": "batched ünïcode \n line"},
                {"Id": "b", "Message": '{"json": "body"}', "MessageAttributes": {
                    "k": {"DataType": "String", "StringValue": "v"}}},
            ],
        )  # fmt: skip
        envelopes = [json.loads(m["Body"]) for m in _receive(sqs, url, 3)]
        assert sorted(e["Message"] for e in envelopes) == sorted(
            ["with a subject", "batched ünïcode \n line", '{"json": "body"}']
        )
        _check(envelopes, version, signing_shim, authority, monkeypatch)
    finally:
        sns.delete_topic(TopicArn=topic)
        sqs.delete_queue(QueueUrl=url)


def test_raw_delivery_carries_no_envelope_and_so_no_signature(clients, request):
    sns, sqs = clients
    name = unique_name(request.node.name)
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    topic = sns.create_topic(Name=name)["TopicArn"]
    try:
        sns.subscribe(
            TopicArn=topic, Protocol="sqs", Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
        )  # fmt: skip
        sns.publish(TopicArn=topic, Message="raw")
        assert [m["Body"] for m in _receive(sqs, url, 1)] == ["raw"]
    finally:
        sns.delete_topic(TopicArn=topic)
        sqs.delete_queue(QueueUrl=url)


@pytest.mark.parametrize("version", ["1", "2"])
def test_http_confirmation_and_notifications_pass_the_validators(
    version, clients, signing_shim, authority, monkeypatch, request
):
    sns, _ = clients
    topic = sns.create_topic(
        Name=unique_name(request.node.name), Attributes={"SignatureVersion": version}
    )["TopicArn"]
    try:
        with _Endpoint() as endpoint:
            sns.subscribe(TopicArn=topic, Protocol="http", Endpoint=endpoint.url)
            confirmation = endpoint.only("SubscriptionConfirmation")
            _check([confirmation], version, signing_shim, authority, monkeypatch)
            subscription = sns.confirm_subscription(TopicArn=topic, Token=confirmation["Token"])
            sns.publish(TopicArn=topic, Message="to the webhook", Subject="s")
            sns.publish(TopicArn=topic, Message="no subject")
            posts = eventually(
                lambda: (found := endpoint.of_type("Notification")) and len(found) == 2 and found,
                what="two notifications",
            )
            notifications = [json.loads(body) for _, body in posts]
            _check(notifications, version, signing_shim, authority, monkeypatch)
            # Unsubscribed, the endpoint hears so, signed as the confirmation was.
            sns.unsubscribe(SubscriptionArn=subscription["SubscriptionArn"])
            ((_, body),) = eventually(
                lambda: endpoint.of_type("UnsubscribeConfirmation"), what="the unsubscribe"
            )
            unsubscribed = json.loads(body)
            assert unsubscribed["TopicArn"] == topic
            assert subscription["SubscriptionArn"] in unsubscribed["Message"]
            assert unsubscribed["Token"]
            assert unsubscribed["MessageId"]
            assert "Action=ConfirmSubscription" in unsubscribed["SubscribeURL"]
            _check([unsubscribed], version, signing_shim, authority, monkeypatch)
    finally:
        sns.delete_topic(TopicArn=topic)


def test_signature_version_other_than_1_or_2_is_refused(clients, request):
    sns, _ = clients
    with pytest.raises(sns.exceptions.InvalidParameterException, match="must be 1 or 2"):
        sns.create_topic(Name=unique_name(request.node.name), Attributes={"SignatureVersion": "3"})


def test_an_operator_key_without_certificate_gets_one_and_a_bad_file_stops_the_shim(
    tmp_path: Path,
):
    from postbox_server.sns_signing import load_or_create

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    operator = tmp_path / "operator.pem"
    operator.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    loaded = load_or_create(operator)
    certificate = x509.load_pem_x509_certificate(loaded.certificate_pem)
    assert certificate.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    assert load_or_create(operator).private_key.private_numbers() == key.private_numbers()

    bad = tmp_path / "bad.pem"
    bad.write_text("not a key: SECRET-LOOKING-TEXT")
    completed = subprocess.run(
        [sys.executable, "-m", "postbox_server", "sqs", "--port", "0",
         "--sns-signing-key", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 2
    assert re.search(
        r"--sns-signing-key: .*bad\.pem: no unencrypted PEM private key", completed.stderr
    )
    assert "SECRET-LOOKING-TEXT" not in completed.stderr
