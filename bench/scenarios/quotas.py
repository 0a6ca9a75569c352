"""Tenants' quotas: what checking a send against its tenant's message and byte quotas
costs a Send(1), measured on one server with two tenants taking turns: one with quotas
far above what the run sends (every send is checked), one without (no check). Both
present a key of their tenant, so authentication costs both alike."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Awaitable, Callable

import asyncpg
import grpc
from postbox.v1 import access_service_pb2 as access_pb
from postbox.v1 import (
    access_service_pb2_grpc,
    message_service_pb2_grpc,
    queue_service_pb2,
    queue_service_pb2_grpc,
)
from postbox.v1 import message_service_pb2 as pb

from bench.load import Load, interleaved_rounds, until_seen
from bench.runner import Context, Row, median_range, scenario
from bench.scenarios.throughput import grpc_load
from postbox_server.auth.client import bearer_metadata
from postbox_server.auth.secrets import Credentials

CALLERS = 64
ROUNDS = 6
QUEUE = "sends"
LIMITED, FREE = "bench-quota", "bench-free"
# Far above anything the run stores, yet set: every send of LIMITED is checked.
LARGE_QUOTA = access_pb.TenantQuota(
    max_queues=1000, max_topics=1000, max_messages=10**12, max_bytes=2**50
)


@scenario(
    "send_1_quotas",
    f"Send(1) calls/s with {CALLERS} callers into a tenant with large quotas (every send "
    "checked) vs a tenant without quotas, one server, in turns",
)
async def run(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    turn = max(1.0, ctx.seconds / 2)
    body = ctx.body()
    conn = await asyncpg.connect(ctx.db.url)
    keys = {tenant: Credentials.issue() for tenant in (LIMITED, FREE)}
    try:
        async with grpc.aio.insecure_channel(served.target) as channel:
            # While no key exists anyone may create tenants; the server counts its
            # tenants again at once, so its snapshot holds LIMITED's quota from here on.
            access = access_service_pb2_grpc.AccessServiceStub(channel)
            for made in (
                access_pb.Tenant(name=LIMITED, quota=LARGE_QUOTA),
                access_pb.Tenant(name=FREE),
            ):
                await access.CreateTenant(access_pb.CreateTenantRequest(tenant=made))
            for tenant, credentials in keys.items():
                await conn.execute(
                    "SELECT postbox.create_key($1, $2, $3, $4, $5, NULL, NULL, $6)",
                    f"{tenant}-admin", credentials.secret_sha256, credentials.sigv4_secret,
                    ["admin"], ["*"], tenant,
                )  # fmt: skip
            queues = queue_service_pb2_grpc.QueueServiceStub(channel)

            async def queue_made(tenant: str) -> bool:
                try:
                    await queues.CreateQueue(
                        queue_service_pb2.CreateQueueRequest(
                            queue=queue_service_pb2.Queue(name=QUEUE)
                        ),
                        metadata=bearer_metadata(keys[tenant].secret),
                    )
                except grpc.aio.AioRpcError as error:
                    return error.code() == grpc.StatusCode.ALREADY_EXISTS
                return True

            for tenant in keys:
                await until_seen(functools.partial(queue_made, tenant), f"{tenant}'s key")

        def sends(tenant: str) -> Callable[[], Awaitable[Load]]:
            request = pb.SendRequest(queue=QUEUE, body=body)
            metadata = bearer_metadata(keys[tenant].secret)

            async def measure() -> Load:
                async def call(stub: message_service_pb2_grpc.MessageServiceAsyncStub) -> int:
                    await stub.Send(request, metadata=metadata)
                    return 1

                load, _ = await grpc_load(served, CALLERS, turn, call)
                return load

            return measure

        rounds = await interleaved_rounds(ROUNDS, sends(LIMITED), sends(FREE))
    finally:
        # Deleting the tenants deletes their keys: auth is off again for later scenarios.
        for tenant in keys:
            await conn.execute(
                "SELECT postbox.delete_tenant(name, true) FROM postbox.tenants WHERE name = $1",
                tenant,
            )
        await conn.close()
    on = [loads[0].rate for loads in rounds]
    off = [loads[1].rate for loads in rounds]
    ratios = [loads[0].rate / loads[1].rate for loads in rounds if loads[1].rate > 0]
    row = Row(
        f"Send(1) x{CALLERS} into a tenant with quotas",
        "calls/s",
        statistics.median(on),
        statistics.median(off),
        "a tenant without quotas",
        target=">= 0.95x without quotas",
        note=f"medians of {ROUNDS} rounds of {turn:.1f} s: with {median_range(on)}, without "
        f"{median_range(off)}; same-round ratio {median_range(ratios)}",
    )
    row.met = statistics.median(ratios) >= 0.95 if ratios else None
    return [row]
