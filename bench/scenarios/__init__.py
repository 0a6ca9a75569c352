"""Every scenario module; importing this package registers them all with bench.runner."""

from bench.scenarios import (
    idle,
    latency,
    receiving,
    spark,
    sqs,
    sustained,
    throughput,
    topics,
)

# Scenarios too long for a default run; they run when named with --only.
LONG = frozenset({"spark_write", "sustained"})

__all__ = [
    "LONG",
    "idle",
    "latency",
    "receiving",
    "spark",
    "sqs",
    "sustained",
    "throughput",
    "topics",
]
