"""SigV4 verification: a shim with credentials accepts what real clients sign and nothing else."""

from __future__ import annotations

import datetime
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import botocore.auth
import pytest
from botocore.exceptions import ClientError
from support import SQS_ACCOUNT, ServerProcess, SqsShimProcess, sqs_client, unique_name

KEY, SECRET = "AKIDPOSTBOXTEST1", "secret-one"
FILE_KEY, FILE_SECRET = "AKIDPOSTBOXFILE2", "secret-from-file"


@pytest.fixture(scope="module")
def signed_shim(server: ServerProcess, tmp_path_factory) -> Iterator[SqsShimProcess]:
    credentials = Path(tmp_path_factory.mktemp("sqs")) / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {FILE_KEY}\naws_secret_access_key = {FILE_SECRET}\n"
    )
    process = SqsShimProcess(
        server.target,
        "--access-key", KEY,
        "--secret-key", SECRET,
        "--credentials-file", str(credentials),
    ).start()  # fmt: skip
    yield process
    process.stop()
    assert "accepting requests with any signature" not in process.log()


def code_of(call, **kwargs) -> tuple[str, int]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    response = caught.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.mark.parametrize("protocol", ["json", "query"])
@pytest.mark.parametrize(("key", "secret"), [(KEY, SECRET), (FILE_KEY, FILE_SECRET)])
def test_correct_signatures_are_accepted(signed_shim, protocol, key, secret):
    client = sqs_client(signed_shim.endpoint, protocol, key, secret)
    url = client.create_queue(QueueName=unique_name(f"signed_{protocol}"))["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="signed body ü", MessageAttributes={
        "a": {"DataType": "Binary", "BinaryValue": b"\x00\xff"}})  # fmt: skip
    (message,) = client.receive_message(QueueUrl=url)["Messages"]
    assert message["Body"] == "signed body ü"
    client.delete_queue(QueueUrl=url)


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_wrong_secret_is_signature_does_not_match(signed_shim, protocol):
    client = sqs_client(signed_shim.endpoint, protocol, KEY, "not-the-secret")
    assert code_of(client.list_queues) == ("SignatureDoesNotMatch", 403)


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_unknown_key_is_invalid_client_token_id(signed_shim, protocol):
    client = sqs_client(signed_shim.endpoint, protocol, "AKIDUNKNOWN", SECRET)
    assert code_of(client.list_queues) == ("InvalidClientTokenId", 403)


@pytest.mark.parametrize("protocol", ["json", "query"])
def test_request_older_than_15_minutes_is_expired(signed_shim, monkeypatch, protocol):
    # A client whose clock is 16 minutes behind signs with that time.
    late = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=16)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: late.replace(tzinfo=None))
    client = sqs_client(signed_shim.endpoint, protocol, KEY, SECRET)
    assert code_of(client.list_queues) == ("RequestExpired", 400)
    url = f"{signed_shim.endpoint}/{SQS_ACCOUNT}/{unique_name('expired')}"
    assert code_of(client.send_message, QueueUrl=url, MessageBody="x") == ("RequestExpired", 400)


def test_request_within_the_skew_is_accepted(signed_shim, monkeypatch):
    late = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: late.replace(tzinfo=None))
    sqs_client(signed_shim.endpoint, "json", KEY, SECRET).list_queues()


def test_body_changed_after_signing_is_refused(signed_shim):
    client = sqs_client(signed_shim.endpoint, "json", KEY, SECRET)

    def tamper(request, **_):
        request.body = request.body.replace(b"zz_", b"yy_")

    # before-send runs after signing: the body on the wire no longer matches the signature.
    client.meta.events.register("before-send.sqs.ListQueues", tamper)
    assert code_of(client.list_queues, QueueNamePrefix="zz_") == ("SignatureDoesNotMatch", 403)


def test_unsigned_request_is_refused(signed_shim):
    url = urlsplit(signed_shim.endpoint)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    connection.request(
        "POST",
        "/",
        json.dumps({}),
        {"X-Amz-Target": "AmazonSQS.ListQueues", "Content-Type": "application/x-amz-json-1.0"},
    )
    response = connection.getresponse()
    assert response.status == 403
    assert response.getheader("x-amzn-query-error") == "MissingAuthenticationToken;Sender"
    connection.close()


def test_without_credentials_any_signature_is_accepted_and_warned(sqs_shim):
    assert "accepting requests with any signature or none" in sqs_shim.log()
    sqs_client(sqs_shim.endpoint, "json", "anything", "at-all").list_queues()
