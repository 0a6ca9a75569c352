"""What a payload schema costs a send: SendBatch(100) of 1 KiB JSON bodies to a queue
with a JSON Schema (2020-12) against the same to a queue without one, same server,
same run.

The queues take turns within each round (the order alternating), so the machine's
drift falls on both, and each figure is a median of the rounds with its range. The
schema is a realistic order document's: required fields, types, a pattern, bounds
and additionalProperties false over nested objects, so every body is walked whole.
"""

from __future__ import annotations

import json
import statistics
import time

import grpc
from postbox.v1 import message_pb2 as msg
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc, queue_service_pb2_grpc
from postbox.v1 import queue_service_pb2 as qpb

from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import BATCH_CLIENTS, grpc_load

ROUNDS = 5
BATCH = 100
BODY_SIZE = 1024
QUEUES = {"plain": "bench_schema_plain", "schema": "bench_schema_checked"}
ITEM = {
    "type": "object",
    "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 1000},
        "price": {"type": "number", "exclusiveMinimum": 0},
    },
    "required": ["sku", "quantity", "price"],
    "additionalProperties": False,
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "id": {"type": "string", "minLength": 1},
        "customer": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
            "required": ["name"],
        },
        "items": {"type": "array", "items": ITEM, "minItems": 1},
        "note": {"type": "string"},
    },
    "required": ["id", "customer", "items"],
    "additionalProperties": False,
}


def order_body(size: int = BODY_SIZE) -> bytes:
    """An order the schema accepts, padded by its note to exactly `size` bytes."""
    items = [{"sku": f"ABC-{i:04d}", "quantity": i + 1, "price": 9.5 + i} for i in range(12)]
    order = {
        "id": "order-000001",
        "customer": {"name": "Ada Lovelace", "email": "ada@example.com"},
        "items": items,
        "note": "",
    }
    room = size - len(json.dumps(order).encode())
    assert room >= 0, "the order is larger than the body size"
    order["note"] = "x" * room
    body = json.dumps(order).encode()
    assert len(body) == size
    return body


@scenario(
    "payload_schema",
    f"SendBatch({BATCH}) of {BODY_SIZE} B JSON, x{BATCH_CLIENTS} clients: a queue with a "
    "JSON Schema against one without, same run",
)
async def run(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    async with grpc.aio.insecure_channel(served.target) as channel:
        queues = queue_service_pb2_grpc.QueueServiceStub(channel)
        for kind, name in QUEUES.items():
            schema = msg.PayloadSchema(json_schema=json.dumps(SCHEMA)) if kind == "schema" else None
            await queues.CreateQueue(
                qpb.CreateQueueRequest(queue=qpb.Queue(name=name, payload_schema=schema))
            )
    body = order_body()
    seconds = max(1.0, ctx.seconds / 2)
    rates: dict[str, list[float]] = {kind: [] for kind in QUEUES}
    # The server's CPU per message (microseconds): what the check adds, little moved by
    # a loaded machine, which moves the rates a lot.
    cpu_us: dict[str, list[float]] = {kind: [] for kind in QUEUES}
    for round_ in range(ROUNDS):
        order = list(QUEUES) if round_ % 2 == 0 else list(reversed(QUEUES))
        for kind in order:
            request = pb.SendBatchRequest(
                queue=QUEUES[kind], entries=[pb.SendBatchEntry(body=body)] * BATCH
            )

            async def call(
                stub: message_service_pb2_grpc.MessageServiceAsyncStub,
                request: pb.SendBatchRequest = request,
            ) -> int:
                return len((await stub.SendBatch(request)).message_ids)

            load, cpu = await grpc_load(served, BATCH_CLIENTS, seconds, call)
            rates[kind].append(load.rate)
            cpu_us[kind].append(cpu / load.rate * 1e6)
    checked, plain = statistics.median(rates["schema"]), statistics.median(rates["plain"])
    ratios = [c / p for c, p in zip(rates["schema"], rates["plain"], strict=True)]
    return [
        Row(
            f"SendBatch({BATCH}) x{BATCH_CLIENTS}, {BODY_SIZE} B JSON, with schema",
            "msgs/s",
            checked,
            plain,
            "same without schema, same run",
            note=(
                f"medians of {ROUNDS} rounds of {seconds:.1f} s: with schema "
                f"{median_range(rates['schema'])}, without {median_range(rates['plain'])}; "
                f"with/without per round {median_range(ratios)}; server CPU per message "
                f"{median_range(cpu_us['schema'], ' us')} with, "
                f"{median_range(cpu_us['plain'], ' us')} without; the check alone "
                f"{_check_alone_us(body):.1f} us of CPU per body in one process"
            ),
        )
    ]


def _check_alone_us(body: bytes, bodies: int = 20_000) -> float:
    """CPU microseconds per body of the server's check alone (parse + validate), in this
    process: CPU time, not wall time, which a loaded machine stretches."""
    from postbox_server.services.payload_schemas import JsonSchemaCheck

    check = JsonSchemaCheck(json.dumps(SCHEMA))
    assert check.violation(body) is None
    began = time.process_time()
    for _ in range(bodies):
        check.violation(body)
    return (time.process_time() - began) / bodies * 1e6
