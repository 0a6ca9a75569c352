"""A worker: handles a queue's messages until SIGTERM or Ctrl-C, then stops gracefully.

    python examples/worker.py [QUEUE] [--exit-when-idle SECONDS]

A handler that returns acks its message; one that raises nacks it (the queue's retry
backoff, then its dead-letter queue). While a handler runs its lease is extended. On
SIGTERM the running handlers finish and the messages not started go back at once.
Needs only the client: pip install ./stubs/python (or postbox-client).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from postbox_client import AsyncClient, ReceivedMessage


async def handle(message: ReceivedMessage) -> None:
    print(f"{message.message_id}: {message.body.decode(errors='replace')}", flush=True)


async def main(queue: str, exit_when_idle: float | None) -> None:
    target = os.environ.get("POSTBOX_TARGET", "localhost:50051")
    async with AsyncClient(target, api_key=os.environ.get("POSTBOX_API_KEY")) as client:
        consumer = client.consumer(queue)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, consumer.stop)
        handled = asyncio.Event()

        async def counted(message: ReceivedMessage) -> None:
            await handle(message)
            handled.set()

        running = asyncio.create_task(consumer.run(counted, concurrency=8))
        if exit_when_idle is not None:  # for scripts and tests: stop after a quiet spell
            while True:
                handled.clear()
                try:
                    await asyncio.wait_for(handled.wait(), exit_when_idle)
                except asyncio.TimeoutError:
                    consumer.stop()
                    break
        await running


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("queue", nargs="?", default="jobs")
    parser.add_argument("--exit-when-idle", type=float, metavar="SECONDS")
    args = parser.parse_args()
    asyncio.run(main(args.queue, args.exit_when_idle))
