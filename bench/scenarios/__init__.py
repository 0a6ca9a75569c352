"""Every scenario module; importing this package registers them all with bench.runner."""

from bench.scenarios import (
    idle,
    latency,
    pending,
    receiving,
    sqs,
    sustained,
    throughput,
    topics,
)

# Scenarios too long for a default run; they run when named with --only.
LONG = frozenset({"sustained"})

__all__ = [
    "LONG",
    "idle",
    "latency",
    "pending",
    "receiving",
    "sqs",
    "sustained",
    "throughput",
    "topics",
]
