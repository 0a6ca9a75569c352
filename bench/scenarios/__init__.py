"""Every scenario module; importing this package registers them all with bench.runner."""

from bench.scenarios import (
    auth,
    brokers,
    console,
    death_spiral,
    durability,
    engine,
    history,
    http,
    idle,
    instructions,
    latency,
    payload_schema,
    pgque,
    pgque_instructions,
    producer,
    receiving,
    replication,
    soak,
    spark,
    sqs,
    streams,
    sustained,
    throughput,
    topics,
)

# Scenarios too long for a default run; they run when named with --only.
LONG = frozenset(
    {
        "death_spiral",
        "soak",
        "spark_write",
        "sustained",
        "sustained_stream",
        "send_sync_replication",
    }
)

__all__ = [
    "LONG",
    "auth",
    "brokers",
    "console",
    "death_spiral",
    "durability",
    "engine",
    "history",
    "http",
    "idle",
    "instructions",
    "latency",
    "payload_schema",
    "pgque",
    "pgque_instructions",
    "producer",
    "receiving",
    "replication",
    "soak",
    "spark",
    "sqs",
    "streams",
    "sustained",
    "throughput",
    "topics",
]
