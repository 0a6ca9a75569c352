"""HTTP/JSON against gRPC: Send(1) calls/s on one server, through its gRPC port (grpc.aio
stubs) and its HTTP/JSON port (aiohttp, the Connect unary wire), taking turns."""

from __future__ import annotations

import base64
import json
import statistics
from typing import Any, cast

import aiohttp
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

from bench.load import Load, closed_loop
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import grpc_load, measured

CLIENTS = 16
ROUNDS = 3


@scenario(
    "send_1_http",
    f"Send(1) calls/s with {CLIENTS} clients over HTTP/JSON (Connect) vs over gRPC, one "
    "server, in turns",
)
async def run(ctx: Context) -> list[Row]:
    served, base = ctx.postbox_http()
    queue = await ctx.new_queue(served.target, "send1http")
    body = ctx.body()
    seconds = max(1, round(ctx.seconds / ROUNDS))
    request = pb.SendRequest(queue=queue, body=body)
    json_body = json.dumps({"queue": queue, "body": base64.b64encode(body).decode()}).encode()
    headers = {"Content-Type": "application/json"}

    async def over_grpc() -> Load:
        async def call(stub: message_service_pb2_grpc.MessageServiceStub) -> int:
            # A grpc.aio stub, which the generated types describe as a sync one.
            await cast(Any, stub.Send)(request)
            return 1

        load, _ = await grpc_load(served, CLIENTS, seconds, call)
        return load

    async def over_http() -> Load:
        # One kept-alive connection per client, as a pool of HTTP/1.1 clients would hold.
        connector = aiohttp.TCPConnector(limit=CLIENTS)
        async with aiohttp.ClientSession(base, connector=connector) as session:

            async def call() -> int:
                async with session.post(
                    "/postbox.v1.MessageService/Send", data=json_body, headers=headers
                ) as response:
                    await response.read()
                    if response.status != 200:
                        raise RuntimeError(f"HTTP Send answered {response.status}")
                return 1

            load, _ = await measured(
                served, lambda: closed_loop(call, clients=CLIENTS, seconds=seconds)
            )
            return load

    loads: dict[str, list[Load]] = {"http": [], "grpc": []}
    for _ in range(ROUNDS):
        loads["http"].append(await over_http())
        loads["grpc"].append(await over_grpc())
    ratios = [h.rate / g.rate for h, g in zip(loads["http"], loads["grpc"], strict=True) if g.rate]
    http_rate = statistics.median(load.rate for load in loads["http"])
    grpc_rate = statistics.median(load.rate for load in loads["grpc"])
    http_all = sum(loads["http"], Load(0, 0.0))
    grpc_all = sum(loads["grpc"], Load(0, 0.0))
    return [
        Row(
            f"Send(1) x{CLIENTS} over HTTP/JSON",
            "calls/s",
            http_rate,
            grpc_rate,
            "gRPC, same server",
            note=f"medians of {ROUNDS} rounds of {seconds} s; HTTP/gRPC per round "
            f"{median_range(ratios)}; p50 {http_all.latency_ms(0.5):.1f} / p99 "
            f"{http_all.latency_ms(0.99):.1f} ms (gRPC {grpc_all.latency_ms(0.5):.1f} / "
            f"{grpc_all.latency_ms(0.99):.1f})",
        )
    ]
