"""Throughput of boto3 through the SQS shim against the same work over gRPC directly.

Starts a postbox server and the shim (subprocesses, free ports) on the database given,
then runs each workload both ways in the same run and prints messages per second and
the shim/gRPC ratio. A benchmark, not a test: it prints figures and asserts nothing.

    python bench/sqs_throughput.py --database-url postgresql://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import grpc
from botocore.config import Config
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2, queue_service_pb2_grpc

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "server", "--log-level", "WARNING", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not start")
        time.sleep(0.1)


def http_answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


class Grpc:
    """The workloads over the postbox gRPC API, with the generated stubs."""

    name = "gRPC"

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.queues = queue_service_pb2_grpc.QueueServiceStub(self.channel)
        self.messages = message_service_pb2_grpc.MessageServiceStub(self.channel)

    def create(self, name: str) -> str:
        request = queue_service_pb2.CreateQueueRequest(queue=queue_service_pb2.Queue(name=name))
        self.queues.CreateQueue(request)
        return name

    def delete(self, queue: str) -> None:
        self.queues.DeleteQueue(queue_service_pb2.DeleteQueueRequest(name=queue))

    def send(self, queue: str, body: str) -> None:
        self.messages.Send(pb.SendRequest(queue=queue, body=body.encode()))

    def send_batch(self, queue: str, bodies: list[str]) -> None:
        entries = [pb.SendBatchEntry(body=body.encode()) for body in bodies]
        self.messages.SendBatch(pb.SendBatchRequest(queue=queue, entries=entries))

    def receive_delete(self, queue: str) -> int:
        request = pb.ReceiveRequest(queue=queue, max_messages=10)
        request.wait_time.seconds = 1
        received = [m for batch in self.messages.Receive(request) for m in batch.messages]
        if received:
            receipts = [m.receipt for m in received]
            self.messages.DeleteBatch(pb.DeleteBatchRequest(queue=queue, receipts=receipts))
        return len(received)


class Sqs:
    """The same workloads with boto3 through the shim (JSON protocol)."""

    name = "SQS shim"

    def __init__(self, endpoint: str) -> None:
        self.client = boto3.client(
            "sqs",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            config=Config(max_pool_connections=64, retries={"max_attempts": 1}),
        )

    def create(self, name: str) -> str:
        return self.client.create_queue(QueueName=name)["QueueUrl"]

    def delete(self, queue: str) -> None:
        self.client.delete_queue(QueueUrl=queue)

    def send(self, queue: str, body: str) -> None:
        self.client.send_message(QueueUrl=queue, MessageBody=body)

    def send_batch(self, queue: str, bodies: list[str]) -> None:
        entries = [{"Id": str(i), "MessageBody": body} for i, body in enumerate(bodies)]
        response = self.client.send_message_batch(QueueUrl=queue, Entries=entries)
        assert not response.get("Failed"), response["Failed"]

    def receive_delete(self, queue: str) -> int:
        messages = self.client.receive_message(
            QueueUrl=queue, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        if messages:
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            self.client.delete_message_batch(QueueUrl=queue, Entries=entries)
        return len(messages)


def run(path: Grpc | Sqs, messages: int, workers: int) -> dict[str, float]:
    """Messages per second of each workload along one path."""
    rates = {}
    queue = path.create(f"bench_{uuid.uuid4().hex[:10]}")
    try:
        with ThreadPoolExecutor(workers) as pool:
            started = time.perf_counter()
            list(pool.map(lambda i: path.send(queue, f"message {i}"), range(messages)))
            rates["send (1 per call)"] = messages / (time.perf_counter() - started)

            started = time.perf_counter()
            drained = 0
            while drained < messages:
                drained += sum(pool.map(lambda _: path.receive_delete(queue), range(workers)))
            rates["receive 10 + delete batch"] = messages / (time.perf_counter() - started)

            batches = [[f"message {i}-{j}" for j in range(10)] for i in range(messages // 10)]
            started = time.perf_counter()
            list(pool.map(lambda bodies: path.send_batch(queue, bodies), batches))
            rates["send batch of 10"] = messages / (time.perf_counter() - started)
            drained = 0
            while drained < len(batches) * 10:
                drained += sum(pool.map(lambda _: path.receive_delete(queue), range(workers)))
    finally:
        path.delete(queue)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"), required=False)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    if not args.database_url:
        parser.error("give --database-url (or DATABASE_URL)")

    grpc_port, http_port = free_port(), free_port()
    target, endpoint = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
    server = spawn("serve", "--database-url", args.database_url, "--grpc-host", "127.0.0.1",
                   "--grpc-port", str(grpc_port))  # fmt: skip
    shim = spawn("sqs", "--host", "127.0.0.1", "--port", str(http_port), "--grpc-target", target)
    try:
        channel = grpc.insecure_channel(target)
        grpc.channel_ready_future(channel).result(timeout=60)
        wait_for(lambda: http_answers(endpoint), "the shim")
        direct = Grpc(target)
        through_shim = Sqs(endpoint)
        run(direct, 200, args.workers)  # warm-up: connections, plans, caches
        run(through_shim, 200, args.workers)
        results = {
            path.name: run(path, args.messages, args.workers) for path in (direct, through_shim)
        }
    finally:
        for process in (shim, server):
            process.terminate()
            process.wait(30)

    print(f"{args.messages} messages, {args.workers} client threads, one machine")
    print(f"{'workload':28} {'gRPC msg/s':>12} {'shim msg/s':>12} {'shim/gRPC':>10}")
    for workload, grpc_rate in results["gRPC"].items():
        shim_rate = results["SQS shim"][workload]
        print(f"{workload:28} {grpc_rate:12.0f} {shim_rate:12.0f} {shim_rate / grpc_rate:10.2f}")


if __name__ == "__main__":
    main()
