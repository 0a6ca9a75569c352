"""Sends messages through a batching Producer: python examples/producer.py [QUEUE] [COUNT].

Needs only the client: pip install ./stubs/python (or postbox-client). The server is
POSTBOX_TARGET (default localhost:50051), the key POSTBOX_API_KEY when auth is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time

from postbox_client import AlreadyExists, AsyncClient


async def main(queue: str, count: int) -> None:
    target = os.environ.get("POSTBOX_TARGET", "localhost:50051")
    async with AsyncClient(target, api_key=os.environ.get("POSTBOX_API_KEY")) as client:
        with contextlib.suppress(AlreadyExists):
            await client.create_queue(queue)
        started = time.monotonic()
        async with client.producer(queue) as producer:
            # Each send() returns at once with a future; the producer batches them.
            futures = [producer.send(f"job {i}", attributes={"n": str(i)}) for i in range(count)]
            ids = await asyncio.gather(*futures)
        took = time.monotonic() - started
        print(f"sent {len(ids)} messages in {producer.batches_sent} batches, {took:.2f} s")


if __name__ == "__main__":
    queue = sys.argv[1] if len(sys.argv) > 1 else "jobs"
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    asyncio.run(main(queue, count))
