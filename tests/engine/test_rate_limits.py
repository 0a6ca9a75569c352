"""Per-key rate limits: token buckets for calls, sends and receives, refused with
RESOURCE_EXHAUSTED and a RetryInfo over gRPC, 429 with Retry-After over HTTP and
ThrottlingException at the SQS shim, and shared among the servers of one database.

A database of its own: keys turn authentication on for every server of a database,
and the servers on it are counted.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from auth_support import bearer, retry_delay, wait_until
from botocore.exceptions import ClientError
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from support import (
    HttpServerProcess,
    ServerProcess,
    SqsShimProcess,
    bootstrap_key,
    create_database,
    drop_database,
    error_of,
    sqs_client,
)

from postbox_server.auth.secrets import sigv4_secret

LIST_QUEUES = queue_service_pb2.ListQueuesRequest()


@pytest.fixture(scope="module")
def limited_database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_rate_limits")
    yield url
    drop_database(admin_url, url)


@pytest.fixture(scope="module")
def limited_server(limited_database: str) -> Iterator[HttpServerProcess]:
    # A small pool: the machine's PostgreSQL is shared, and these tests make few calls.
    process = HttpServerProcess(limited_database, "--pool-size", "3").start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def admin(limited_database: str, limited_server: HttpServerProcess) -> str:
    secret = bootstrap_key(limited_database, "limits-admin", "admin:*")
    with grpc.insecure_channel(limited_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)

        def works() -> bool:
            try:
                queues.ListQueues(LIST_QUEUES, metadata=bearer(secret))
            except grpc.RpcError:
                return False
            return True

        wait_until(works, 5, "the first key")
    return secret


def _create_key(target: str, admin: str, name: str, **limits: float) -> access_pb.CreateKeyResponse:
    key = access_pb.Key(
        name=name,
        grants=[access_pb.Grant(permission=access_pb.PERMISSION_ADMIN, pattern="*")],
        rate_limits=access_pb.RateLimits(**limits),
    )
    with grpc.insecure_channel(target) as channel:
        access = access_service_pb2_grpc.AccessServiceStub(channel)
        return access.CreateKey(access_pb.CreateKeyRequest(key=key), metadata=bearer(admin))


def _list_queues(queues, secret: str) -> grpc.RpcError | None:
    """The error a ListQueues with the key fails with, None when it succeeds."""
    try:
        queues.ListQueues(LIST_QUEUES, metadata=bearer(secret))
    except grpc.RpcError as error:
        return error
    return None


def test_the_key_keeps_its_limits_and_bad_ones_are_refused(
    limited_database: str, limited_server: HttpServerProcess, admin: str
) -> None:
    created = _create_key(
        limited_server.target, admin, "limits-shown", sends_per_second=5, send_burst=7
    )
    assert created.key.rate_limits.sends_per_second == 5
    assert created.key.rate_limits.send_burst == 7
    with grpc.insecure_channel(limited_server.target) as channel:
        access = access_service_pb2_grpc.AccessServiceStub(channel)
        got = access.GetKey(access_pb.GetKeyRequest(name="limits-shown"), metadata=bearer(admin))
        assert got.key.rate_limits.send_burst == 7
        for bad in ({"calls_per_second": -1}, {"receive_burst": -2}, {"sends_per_second": 2e6}):
            key = access_pb.Key(
                name="limits-bad",
                grants=[access_pb.Grant(permission=access_pb.PERMISSION_READ, pattern="*")],
                rate_limits=access_pb.RateLimits(**bad),
            )
            error = error_of(
                access.CreateKey, access_pb.CreateKeyRequest(key=key), metadata=bearer(admin)
            )
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"rate_limits.{next(iter(bad))}" in error.details()
        # `postbox keys list` shows them, with the key's last use.
        listed = subprocess.run(
            [sys.executable, "-m", "postbox_server", "keys", "list",
             "--database-url", limited_database],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        (line,) = [line for line in listed.stdout.splitlines() if line.startswith("limits-shown")]
        assert line.endswith("\tlast used never\tlimits sends_per_second=5 send_burst=7")
        # Lifting them: update_mask rate_limits with none set.
        update = access_pb.UpdateKeyRequest(key=access_pb.Key(name="limits-shown"))
        update.update_mask.paths.append("rate_limits")
        lifted = access.UpdateKey(update, metadata=bearer(admin)).key
        assert not lifted.HasField("rate_limits")


def test_calls_over_the_limit_are_refused_with_retry_info_measured_against_the_clock(
    limited_server: HttpServerProcess, admin: str
) -> None:
    rate, burst = 4.0, 6
    secret = _create_key(
        limited_server.target, admin, "limits-calls", calls_per_second=rate, call_burst=burst
    ).secret
    with grpc.insecure_channel(limited_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        # The burst goes at once; the next call is refused, saying when to retry.
        for _ in range(burst):
            queues.ListQueues(LIST_QUEUES, metadata=bearer(secret))
        refused = error_of(queues.ListQueues, LIST_QUEUES, metadata=bearer(secret))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits-calls" in refused.details()
        assert "4 calls per second" in refused.details()
        # One token comes back every 1/rate s; the call just took a little of that.
        assert 0 < retry_delay(refused) <= 1 / rate
        # Calling flat out for a while lets through burst + rate * elapsed calls. The
        # window is 2 s; the bounds allow one refill step either way plus a slow machine's
        # slack (calls take ms, so the loop makes hundreds of attempts).
        started, allowed = time.monotonic(), 0
        while (elapsed := time.monotonic() - started) < 2.0:
            error = _list_queues(queues, secret)
            assert error is None or error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            allowed += error is None
        assert rate * elapsed - 2 <= allowed <= rate * elapsed + 2, (allowed, elapsed)


def test_sends_count_messages_and_a_refused_send_stores_nothing(
    limited_server: HttpServerProcess, admin: str
) -> None:
    secret = _create_key(
        limited_server.target, admin, "limits-sends", sends_per_second=0.01, send_burst=3
    ).secret
    with grpc.insecure_channel(limited_server.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        messages = message_service_pb2_grpc.MessageServiceStub(channel)
        queues.CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="limited")),
            metadata=bearer(admin),
        )
        batch = message_service_pb2.SendBatchRequest(
            queue="limited",
            entries=[message_service_pb2.SendBatchEntry(body=b"x") for _ in range(2)],
        )
        messages.SendBatch(batch, metadata=bearer(secret))
        send = message_service_pb2.SendRequest(queue="limited", body=b"x")
        messages.Send(send, metadata=bearer(secret))
        refused = error_of(messages.Send, send, metadata=bearer(secret))
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "sends per second" in refused.details()
        # Other calls are not sends: the key still reads.
        queues.ListQueues(LIST_QUEUES, metadata=bearer(secret))
        peek = message_service_pb2.PeekMessagesRequest(queue="limited")
        assert len(messages.PeekMessages(peek, metadata=bearer(admin)).messages) == 3


def test_http_answers_429_with_retry_after(limited_server: HttpServerProcess, admin: str) -> None:
    secret = _create_key(
        limited_server.target, admin, "limits-http", calls_per_second=0.5, call_burst=1
    ).secret
    url = f"{limited_server.base}/postbox.v1.QueueService/ListQueues"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}

    def post() -> tuple[int, dict[str, str], dict]:
        request = urllib.request.Request(url, data=b"{}", headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, dict(response.headers), json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read())

    assert post()[0] == 200
    status, answer, body = post()
    assert status == 429
    assert body["code"] == "resource_exhausted"
    # Half a token a second: the one spent comes back within 2 s.
    assert answer["Retry-After"] in ("1", "2")


def test_the_sqs_shim_answers_throttling_exception(
    limited_database: str, limited_server: HttpServerProcess, admin: str
) -> None:
    created = _create_key(
        limited_server.target, admin, "limits-sqs", calls_per_second=0.01, call_burst=1
    )
    shim = SqsShimProcess(limited_server.target).start()
    try:
        client = sqs_client(shim.endpoint, "json", "limits-sqs", sigv4_secret(created.secret))
        client.list_queues()
        with pytest.raises(ClientError) as refused:
            client.list_queues()
        error = refused.value.response
        assert error["Error"]["Code"] == "ThrottlingException"
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    finally:
        shim.stop()


def test_servers_on_one_database_each_enforce_a_share(
    limited_database: str, limited_server: HttpServerProcess, admin: str
) -> None:
    second = ServerProcess(limited_database, "--pool-size", "3").start()
    try:
        # Created after both run: the key change makes each server count the others.
        secret = _create_key(
            limited_server.target, admin, "limits-shared", calls_per_second=0.01, call_burst=6
        ).secret
        allowed = {}
        for server in (limited_server, second):
            with grpc.insecure_channel(server.target) as channel:
                queues = queue_service_pb2_grpc.QueueServiceStub(channel)

                def known(queues=queues) -> bool:
                    try:
                        queues.ListQueues(LIST_QUEUES, metadata=bearer(secret))
                    except grpc.RpcError as error:
                        return error.code() != grpc.StatusCode.UNAUTHENTICATED
                    return True

                wait_until(known, 5, "the new key on each server")
                count = 1
                while (error := _list_queues(queues, secret)) is None:
                    count += 1
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "this server's share" in error.details()
                allowed[server.target] = count
        # A burst of 6 over two servers: 3 each, so 6 in all, not 12.
        assert sorted(allowed.values()) == [3, 3]
    finally:
        second.stop()


def test_a_send_stream_over_the_limit_waits_rather_than_fails(
    limited_server: HttpServerProcess, admin: str
) -> None:
    rate = 5.0
    secret = _create_key(
        limited_server.target, admin, "limits-stream", sends_per_second=rate, send_burst=1
    ).secret
    with grpc.insecure_channel(limited_server.target) as channel:
        queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
            queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name="paced")),
            metadata=bearer(admin),
        )
        # Two requests of three sends each (`more`): each send counts, not each request.
        requests = [
            message_service_pb2.SendStreamRequest(
                tag=tag,
                send=message_service_pb2.SendRequest(queue="paced", body=b"x"),
                more=[
                    message_service_pb2.SendStreamEntry(
                        tag=tag + extra, send=message_service_pb2.SendRequest(queue="paced")
                    )
                    for extra in (1, 2)
                ],
            )
            for tag in (0, 3)
        ]
        started = time.monotonic()
        responses = message_service_pb2_grpc.MessageServiceStub(channel).SendStream(
            iter(requests), metadata=bearer(secret), timeout=30
        )
        results = [result for response in responses for result in response.results]
        elapsed = time.monotonic() - started
    assert len(results) == 6
    assert all(result.sent.message_id for result in results)
    # The first goes on the burst, the 5 others one every 1/rate s: 1 s at the least;
    # 0.1 s less for the clock's granularity, and no upper bound but the deadline.
    assert elapsed >= 5 / rate - 0.1


def test_a_batch_stream_is_paced_by_its_messages(
    limited_server: HttpServerProcess, admin: str
) -> None:
    rate = 5.0
    secret = _create_key(
        limited_server.target, admin, "limits-batches", sends_per_second=rate, send_burst=1
    ).secret
    with grpc.insecure_channel(limited_server.target) as channel:
        queue_service_pb2_grpc.QueueServiceStub(channel).CreateQueue(
            queue_service_pb2.CreateQueueRequest(
                queue=queue_service_pb2.Queue(name="paced-batches")
            ),
            metadata=bearer(admin),
        )
        # Three batches of three: each message counts, not each batch.
        requests = [
            message_service_pb2.SendBatchStreamRequest(
                tag=tag,
                batch=message_service_pb2.SendBatchRequest(
                    queue="paced-batches",
                    entries=[message_service_pb2.SendBatchEntry(body=b"x")] * 3,
                ),
            )
            for tag in range(3)
        ]
        started = time.monotonic()
        responses = message_service_pb2_grpc.MessageServiceStub(channel).SendBatchStream(
            iter(requests), metadata=bearer(secret), timeout=30
        )
        results = [result for response in responses for result in response.results]
        elapsed = time.monotonic() - started
    assert len(results) == 3
    assert all(len(result.sent.message_ids) == 3 for result in results)
    # The first batch goes on the full bucket and leaves it 2 in debt; each later one
    # waits until a token is back (3/rate s): 6 messages after the first 3 take 1.2 s at
    # the least (counted per batch, 0.4 s); 0.1 s less for the clock's granularity.
    assert elapsed >= 6 / rate - 0.1
