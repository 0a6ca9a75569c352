"""Helpers of the Spark tests: what a queue holds, a writer aimed at the test server, and
a gRPC proxy in front of it that watches (and can fail) the writers' SendBatch calls."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import queue_service_pb2 as qpb
from support import free_port, seconds

SEND_BATCH = "/postbox.v1.MessageService/SendBatch"


@dataclass(frozen=True)
class Fault:
    """What the proxy does to one SendBatch call instead of answering it."""

    code: grpc.StatusCode
    # Forward first: the server commits, and the writer sees only the failure.
    after_forwarding: bool = False


@dataclass
class SendBatchProxy:
    """A real gRPC server on a local port that forwards SendBatch to `target`.

    It records every call by the peer's address (a writer task's channel is one
    connection), how many calls each peer had under way at once, the entries of
    each request and its authorization metadata. Each call is held for `hold`
    seconds so that calls a writer pipelines overlap; the first calls get the
    `faults`, in order, instead of their answers. A call for which `gate(proxy,
    peer, request)` is true waits for `resume` to be set (`paused` holds the peers
    waiting). `key` and `certificate` make it a TLS endpoint (as a load balancer in
    front of postbox would be).
    """

    target: str
    hold: float = 0.0
    faults: list[Fault] = field(default_factory=list)
    gate: Callable[[SendBatchProxy, str, pb.SendBatchRequest], bool] | None = None
    key: bytes | None = None
    certificate: bytes | None = None
    calls: Counter[str] = field(default_factory=Counter, init=False)
    max_concurrent: Counter[str] = field(default_factory=Counter, init=False)
    chunk_sizes: list[int] = field(default_factory=list, init=False)
    authorizations: list[str | None] = field(default_factory=list, init=False)
    faults_given: list[Fault] = field(default_factory=list, init=False)
    # Seconds from the end of a call to the start of the same request again.
    retry_gaps: list[float] = field(default_factory=list, init=False)
    forwarded: int = field(default=0, init=False)
    paused: set[str] = field(default_factory=set, init=False)
    resume: threading.Event = field(default_factory=threading.Event, init=False)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._concurrent: Counter[str] = Counter()
        self._ended: dict[bytes, float] = {}
        self._upstream = grpc.insecure_channel(self.target)
        forward = self._upstream.unary_unary(SEND_BATCH)  # raw bytes both ways

        def send_batch(request: bytes, context: grpc.ServicerContext) -> bytes:
            peer = context.peer()
            with self._lock:
                if request in self._ended:
                    self.retry_gaps.append(time.monotonic() - self._ended[request])
                self.calls[peer] += 1
                self._concurrent[peer] += 1
                self.max_concurrent[peer] = max(self.max_concurrent[peer], self._concurrent[peer])
                self.chunk_sizes.append(len(pb.SendBatchRequest.FromString(request).entries))
                self.authorizations.append(dict(context.invocation_metadata()).get("authorization"))
                fault = self.faults.pop(0) if self.faults else None
                if fault:
                    self.faults_given.append(fault)
            try:
                time.sleep(self.hold)
                if self.gate is not None and self.gate(
                    self, peer, pb.SendBatchRequest.FromString(request)
                ):
                    with self._lock:
                        self.paused.add(peer)
                    self.resume.wait(300)
                if fault and not fault.after_forwarding:
                    context.abort(fault.code, f"proxy fault {fault.code.name}")
                response = forward(request)
                with self._lock:
                    self.forwarded += len(pb.SendBatchRequest.FromString(request).entries)
                if fault:
                    context.abort(fault.code, f"proxy fault {fault.code.name} after forwarding")
                return response
            finally:
                with self._lock:
                    self._concurrent[peer] -= 1
                    self._ended[request] = time.monotonic()

        handler = grpc.method_handlers_generic_handler(
            "postbox.v1.MessageService",
            {"SendBatch": grpc.unary_unary_rpc_method_handler(send_batch)},
        )
        self.port = free_port()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
        self._server.add_generic_rpc_handlers((handler,))
        address = f"127.0.0.1:{self.port}"
        if self.key is not None and self.certificate is not None:
            credentials = grpc.ssl_server_credentials([(self.key, self.certificate)])
            self._server.add_secure_port(address, credentials)
        else:
            self._server.add_insecure_port(address)
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._server.stop(None)
        self._upstream.close()


def receive_all(messages, queue: str, visibility: float = 600) -> list[msg.Message]:
    """Every message visible in the queue now, left in flight for `visibility` seconds."""
    received: list[msg.Message] = []
    while True:
        request = pb.ReceiveRequest(
            queue=queue,
            max_messages=1000,
            wait_time=seconds(0),
            visibility_timeout=seconds(visibility),
        )
        batch = [m for response in messages.Receive(request) for m in response.messages]
        if not batch:
            return received
        received.extend(batch)


def stats(queues, queue: str) -> qpb.QueueStats:
    return queues.GetQueue(qpb.GetQueueRequest(name=queue)).queue.stats


def writer(df, server, queue: str, **options: str):
    """`df.write.format("postbox")` with the target and queue set, in append mode."""
    write = df.write.format("postbox").option("target", server.target).option("queue", queue)
    for key, value in options.items():
        write = write.option(key, value)
    return write.mode("append")


def wait_for(
    condition: Callable[[], object], timeout: float, what: str, *, every: float = 0.2
) -> None:
    """Until `condition()` holds, looking every `every` seconds; TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout} s")
        time.sleep(every)
