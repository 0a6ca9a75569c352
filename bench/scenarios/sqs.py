"""The SQS shim: boto3 through `postbox sqs` against the same work over gRPC directly.

Both sides are blocking clients (boto3, and the generated synchronous stubs)
driven by the same number of threads, so the ratio is what the shim's HTTP,
JSON and extra hop cost, not the difference between sync and async clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import boto3
import grpc
from botocore.config import Config
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

from bench.load import Load, closed_loop
from bench.processes import Served, cpu_share
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import fill_queue

THREADS = 8
BATCH = 10


class GrpcPath:
    """The workloads over the postbox gRPC API, with the generated synchronous stubs."""

    name = "gRPC"

    def __init__(self, target: str, queue: str) -> None:
        self.queue = queue
        self.channel = grpc.insecure_channel(target)
        self.messages = message_service_pb2_grpc.MessageServiceStub(self.channel)

    def send(self, body: str) -> int:
        self.messages.Send(pb.SendRequest(queue=self.queue, body=body.encode()))
        return 1

    def send_batch(self, body: str) -> int:
        entries = [pb.SendBatchEntry(body=body.encode())] * BATCH
        self.messages.SendBatch(pb.SendBatchRequest(queue=self.queue, entries=entries))
        return BATCH

    def receive_delete(self) -> int:
        request = pb.ReceiveRequest(queue=self.queue, max_messages=BATCH)
        request.wait_time.seconds = 0
        received = [m for batch in self.messages.Receive(request) for m in batch.messages]
        if received:
            receipts = [m.receipt for m in received]
            self.messages.DeleteBatch(pb.DeleteBatchRequest(queue=self.queue, receipts=receipts))
        return len(received)

    def close(self) -> None:
        self.channel.close()


class SqsPath:
    """The same workloads with boto3 through the shim (JSON protocol)."""

    name = "SQS shim"

    def __init__(self, endpoint: str, queue: str) -> None:
        self.client = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            config=Config(max_pool_connections=THREADS, retries={"max_attempts": 1}),
        )
        self.url = self.client.get_queue_url(QueueName=queue)["QueueUrl"]

    def send(self, body: str) -> int:
        self.client.send_message(QueueUrl=self.url, MessageBody=body)
        return 1

    def send_batch(self, body: str) -> int:
        entries = [{"Id": str(i), "MessageBody": body} for i in range(BATCH)]
        response = self.client.send_message_batch(QueueUrl=self.url, Entries=entries)
        if response.get("Failed"):
            raise RuntimeError(f"send_message_batch failed: {response['Failed']}")
        return BATCH

    def receive_delete(self) -> int:
        messages = self.client.receive_message(
            QueueUrl=self.url, MaxNumberOfMessages=BATCH, WaitTimeSeconds=0
        ).get("Messages", [])
        if messages:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            response = self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)
            if response.get("Failed"):
                raise RuntimeError(f"delete_message_batch failed: {response['Failed']}")
        return len(messages)

    def close(self) -> None:
        self.client.close()


async def _threaded(
    watched: list[Served], pool: ThreadPoolExecutor, call: Callable[[], int], seconds: float
) -> tuple[Load, list[float]]:
    """THREADS closed loops of a blocking call; Load and the CPU of each watched server."""
    loop = asyncio.get_running_loop()
    before = [served.cpu() for served in watched]
    load = await closed_loop(
        lambda: loop.run_in_executor(pool, call), clients=THREADS, seconds=seconds
    )
    return load, [cpu_share(b, served.cpu()) for b, served in zip(before, watched, strict=True)]


async def _measure_path(
    ctx: Context, pool: ThreadPoolExecutor, path: GrpcPath | SqsPath, watched: list[Served]
) -> dict[str, tuple[Load, list[float]]]:
    body = ctx.body().decode()
    try:
        return {
            "send (1 per call)": await _threaded(
                watched, pool, lambda: path.send(body), ctx.seconds
            ),
            f"send batch of {BATCH}": await _threaded(
                watched, pool, lambda: path.send_batch(body), ctx.seconds
            ),
            f"receive {BATCH} + delete batch": await _threaded(
                watched, pool, path.receive_delete, ctx.seconds
            ),
        }
    finally:
        path.close()


@scenario(
    "sqs_shim",
    f"boto3 through the SQS shim vs gRPC stubs directly, {THREADS} threads each: send, "
    f"send batch of {BATCH}, receive {BATCH} + delete batch",
)
async def sqs_shim(ctx: Context) -> list[Row]:
    server, shim = ctx.postbox(), ctx.sqs()
    body = ctx.body()
    # Enough that the receives of neither side run dry before their time is up.
    stock = int(ctx.seconds + 1) * 10_000
    queues = []
    for hint in ("grpc", "sqs"):
        queue = await ctx.new_queue(server.target, hint)
        await fill_queue(server, queue, lambda i: pb.SendBatchEntry(body=body), stock)
        queues.append(queue)
    with ThreadPoolExecutor(THREADS) as pool:
        direct = await _measure_path(ctx, pool, GrpcPath(server.target, queues[0]), [server])
        sqs_path = await asyncio.to_thread(SqsPath, shim.url, queues[1])
        through_shim = await _measure_path(ctx, pool, sqs_path, [server, shim])
    rows = []
    for workload, (theirs, (direct_cpu,)) in direct.items():
        ours, (server_cpu, shim_cpu) = through_shim[workload]
        rows.append(
            Row(
                f"SQS shim: {workload} x{THREADS}",
                "msgs/s",
                ours.rate,
                theirs.rate,
                "same through gRPC stubs",
                note=(
                    f"p50 {ours.latency_ms(0.5):.1f} ms (gRPC {theirs.latency_ms(0.5):.1f}); "
                    f"CPU shim {shim_cpu:.0%}, server {server_cpu:.0%} (gRPC: {direct_cpu:.0%})"
                ),
            )
        )
    return rows
