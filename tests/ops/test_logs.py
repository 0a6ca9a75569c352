"""Log output of the real server: JSON lines, and logging flags given after the verb."""

from __future__ import annotations

import json

import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import ServerProcess, seconds, unique_name


def records(server: ServerProcess) -> list[dict]:
    return [json.loads(line) for line in server.log().splitlines() if line.strip()]


def test_json_lines_with_the_rpc_a_record_was_written_in(database_url):
    server = ServerProcess(database_url, "--log-format", "json", "--log-level", "DEBUG").start()
    try:
        with grpc.insecure_channel(server.target) as channel:
            stub = message_service_pb2_grpc.MessageServiceStub(channel)
            with pytest.raises(grpc.RpcError):
                list(
                    stub.Receive(
                        pb.ReceiveRequest(queue=unique_name("absent"), wait_time=seconds(0))
                    )
                )
    finally:
        server.stop()
    lines = records(server)  # every line is one JSON object
    assert lines
    for line in lines:
        assert {"ts", "level", "logger", "msg"} <= set(line), line
    assert any(line["msg"].startswith("postbox serving gRPC") for line in lines)
    assert any(line["level"] == "DEBUG" for line in lines)  # the level after the verb held
    assert any(line.get("rpc") == "/postbox.v1.MessageService/Receive" for line in lines), lines


def test_log_level_after_the_verb_wins(database_url):
    server = ServerProcess(database_url, "--log-level", "WARNING").start()
    server.stop()
    assert "INFO" not in server.log()
