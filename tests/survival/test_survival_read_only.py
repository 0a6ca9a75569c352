"""A database that turns read-only under the server (its sessions on a standby while a
failover is under way): sends answer UNAVAILABLE, never INTERNAL, and go through again
once the database is writable, without a restart.

A database of the test's own made read-only for new sessions
(`default_transaction_read_only`), with the server's sessions ended so that its pool
opens read-only ones: that is what a session on a standby meets (SQLSTATE 25006). It
was an internal error (seen in the pg_auto_failover test under load), and the pool kept
its read-only sessions after the database was writable again (seen in CI); the pool now
drops a session on that error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb
from support import ServerProcess, create_database, drop_database, run_sql

from postbox_server.db.errors import UNAVAILABLE_MESSAGE


@pytest.fixture
def database(admin_url: str) -> Iterator[str]:
    url = create_database(admin_url, "postbox_read_only")
    yield url
    drop_database(admin_url, url)


def _end_server_sessions(admin_url: str, name: str) -> None:
    run_sql(
        admin_url,
        f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}' "
        "AND application_name LIKE 'postbox/%'",
    )


def _send_status(
    messages: message_service_pb2_grpc.MessageServiceStub, send: pb.SendRequest
) -> grpc.StatusCode:
    try:
        messages.Send(send, timeout=10)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_a_database_turned_read_only_answers_unavailable_and_recovers(
    admin_url: str, database: str
) -> None:
    name = urlsplit(database).path.lstrip("/")
    server = ServerProcess(database).start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)
            messages = message_service_pb2_grpc.MessageServiceStub(channel)
            queues.CreateQueue(qpb.CreateQueueRequest(queue=qpb.Queue(name="jobs")))
            send = pb.SendRequest(queue="jobs", body=b"m")
            messages.Send(send, timeout=10)

            run_sql(admin_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
            _end_server_sessions(admin_url, name)
            # Until a send has met a read-only session: each refusal is UNAVAILABLE
            # (the ended sessions' calls too), with the message a client retries on.
            deadline = time.monotonic() + 30  # 30 s: a loaded machine; a send is ms
            while "ReadOnlySQLTransactionError" not in server.log():
                assert time.monotonic() < deadline, server.log()
                with pytest.raises(grpc.RpcError) as refused:
                    messages.Send(send, timeout=10)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
                assert refused.value.details() == UNAVAILABLE_MESSAGE
            assert "internal error" not in server.log()

            run_sql(admin_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
            deadline = time.monotonic() + 30
            while (code := _send_status(messages, send)) != grpc.StatusCode.OK:
                assert code == grpc.StatusCode.UNAVAILABLE, code
                assert time.monotonic() < deadline, "still read-only sessions after 30 s"
            assert "internal error" not in server.log()
    finally:
        server.stop()
