"""API keys: what authentication costs a Send(1), measured on one server with a key on
every call (auth on) and without (no key exists: auth off), taking turns."""

from __future__ import annotations

import asyncpg
import grpc
from postbox.v1 import message_service_pb2 as pb
from postbox.v1 import message_service_pb2_grpc

from bench.load import Load, interleaved, until_seen
from bench.runner import Context, Row, scenario
from bench.scenarios.throughput import grpc_load
from postbox_server.auth.client import bearer_metadata
from postbox_server.auth.secrets import Credentials

CLIENTS = 16
KEY = "bench-sender"
# More turns than the other comparisons: the difference sought (a few µs of a ~600 µs
# call) is far below this shared machine's drift over seconds.
TURNS = 5


@scenario(
    "send_1_auth",
    f"Send(1) calls/s with {CLIENTS} clients presenting an API key (auth on) vs no key "
    "existing (auth off), one server, in turns",
)
async def run(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    queue = await ctx.new_queue(served.target, "send1auth")
    seconds = max(1, round(ctx.seconds / TURNS))
    request = pb.SendRequest(queue=queue, body=ctx.body())
    credentials = Credentials.issue()

    async def sends(metadata: tuple[tuple[str, str], ...]) -> Load:
        async def call(stub: message_service_pb2_grpc.MessageServiceAsyncStub) -> int:
            await stub.Send(request, metadata=metadata)
            return 1

        load, _ = await grpc_load(served, CLIENTS, seconds, call)
        return load

    async def answers(metadata: tuple[tuple[str, str], ...]) -> bool:
        async with grpc.aio.insecure_channel(served.target) as channel:
            try:
                await message_service_pb2_grpc.MessageServiceStub(channel).Send(
                    request, metadata=metadata
                )
            except grpc.aio.AioRpcError:
                return False
        return True

    async def anonymous_refused() -> bool:
        return not await answers(())

    conn = await asyncpg.connect(ctx.db.url)

    async def auth_on() -> Load:
        await conn.execute(
            "SELECT postbox.create_key($1, $2, $3, $4, $5)", KEY, credentials.secret_sha256,
            credentials.sigv4_secret, ["send"], [queue],
        )  # fmt: skip
        # Auth is on once an anonymous Send is refused, and the key works.
        await until_seen(anonymous_refused, "the key")
        await until_seen(lambda: answers(bearer_metadata(credentials.secret)), "the key")
        try:
            return await sends(bearer_metadata(credentials.secret))
        finally:
            await conn.execute("SELECT postbox.delete_key($1)", KEY)
            await until_seen(lambda: answers(()), "the revocation")

    async def auth_off() -> Load:
        return await sends(())

    try:
        on, off = await interleaved(TURNS, auth_on, auth_off)
    finally:
        await conn.execute("DELETE FROM postbox.api_keys WHERE name = $1", KEY)
        await conn.close()
    row = Row(
        f"Send(1) x{CLIENTS} with an API key",
        "calls/s",
        on.rate,
        off.rate,
        "auth off (no key exists)",
        target=">= 0.95x auth off",
        note=f"p50 {on.latency_ms(0.5):.1f} / p99 {on.latency_ms(0.99):.1f} ms "
        f"(off: {off.latency_ms(0.5):.1f} / {off.latency_ms(0.99):.1f}); {TURNS} turns each",
    )
    row.met = (row.ratio or 0) >= 0.95
    return [row]
