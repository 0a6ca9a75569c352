"""Receive never builds a response the client cannot take.

1,000 messages of 1 MiB are received in full by grpcio clients with their default
settings (4 MiB per message received), through Receive and through
StreamingReceive, while the server's peak RSS is watched: it holds about one
response's worth of bodies at a time, not the gigabyte asked for. (Before, one
Receive(max_messages=1000) built a 1 GB response that the client refused with
RESOURCE_EXHAUSTED, and the server grew by gigabytes.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc
from support import ServerProcess, seconds

MIB = 1024 * 1024
COUNT = 1000
# Generous: a response is 4 MiB, gRPC may buffer a few, and Python's allocator keeps
# some of what it freed; without the limit the growth is gigabytes.
MAX_GROWTH = 300 * MIB


@pytest.fixture(scope="module")
def sized_server(database_url: str) -> Iterator[ServerProcess]:
    process = ServerProcess(database_url).start()
    yield process
    process.stop()


def _memory(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def _reset_peak(pid: int) -> int:
    """Starts the process's peak RSS (VmHWM) over from its RSS now; returns that RSS."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _memory(pid, "VmRSS")


async def _fill(database_url: str, queue: str) -> None:
    """1,000 bodies of 1 MiB, written by SQL so that the server under test holds none."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("SELECT postbox.create_queue($1)", queue)
        for start in range(0, COUNT, 50):
            # Compressible: TOAST keeps the database small, and receive still hands
            # out 1 MiB per message.
            bodies = [f"{start + i:08}".encode() * (MIB // 8) for i in range(50)]
            await conn.execute("SELECT postbox.send_batch($1, $2)", queue, bodies)
    finally:
        await conn.close()


async def test_receive_delivers_a_gigabyte_in_responses_a_default_client_takes(
    sized_server, database_url
):
    await _fill(database_url, "big_receive")
    pid = sized_server.process.pid
    baseline = _reset_peak(pid)
    seen: set[str] = set()
    largest = 0
    async with grpc.aio.insecure_channel(sized_server.target) as channel:  # default limits
        stub = message_service_pb2_grpc.MessageServiceStub(channel)
        while len(seen) < COUNT:
            request = pb.ReceiveRequest(
                queue="big_receive", max_messages=1000, visibility_timeout=seconds(3600)
            )
            responses = [r async for r in stub.Receive(request)]
            assert responses, f"nothing left after {len(seen)}"
            for response in responses:
                largest = max(largest, response.ByteSize())
                for message in response.messages:
                    assert len(message.body) == MIB
                    seen.add(message.message_id)
    growth = _memory(pid, "VmHWM") - baseline
    assert len(seen) == COUNT
    assert largest <= 4 * MIB
    assert growth < MAX_GROWTH, f"the server grew by {growth // MIB} MiB"


async def test_streaming_receive_batches_stay_within_the_response_size(sized_server, database_url):
    await _fill(database_url, "big_stream")
    pid = sized_server.process.pid
    baseline = _reset_peak(pid)
    seen: set[str] = set()
    async with grpc.aio.insecure_channel(sized_server.target) as channel:  # default limits
        call = message_service_pb2_grpc.MessageServiceStub(channel).StreamingReceive()
        await call.write(
            pb.StreamingReceiveRequest(
                queue="big_stream", max_messages=1000, visibility_timeout=seconds(3600)
            )
        )
        while len(seen) < COUNT:
            response = await asyncio.wait_for(call.read(), 30)
            assert response is not grpc.aio.EOF
            assert response.ByteSize() <= 4 * MIB
            receipts = [m.receipt for m in response.batch.messages]
            seen.update(m.message_id for m in response.batch.messages)
            if receipts:  # settled, so flow control lets the next batch out
                await call.write(pb.StreamingReceiveRequest(delete_receipts=receipts))
        call.cancel()
    growth = _memory(pid, "VmHWM") - baseline
    assert len(seen) == COUNT
    assert growth < MAX_GROWTH, f"the server grew by {growth // MIB} MiB"


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--max-response-size", "65535"),
        ("--max-response-size", str(64 * MIB + 1)),
        ("--max-response-size", "4M"),
        ("--max-message-size", "1023"),
    ],
)
def test_size_flags_refuse_what_is_out_of_range(flag, value):
    import subprocess
    import sys

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "postbox_server",
            "serve",
            flag,
            value,
            "--database-url",
            "postgresql://x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "is not a size from" in result.stderr
