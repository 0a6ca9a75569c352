"""Spark write: bench/spark_write.py's measurement against the run's server (long: --only).

The script runs as a subprocess: pyspark forks its JVM launcher, which gRPC's
fork handlers can crash in a process that already has channels open, as this
one has; and the JVM and its Python workers stay out of the run's process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

from bench.processes import ROOT
from bench.runner import Context, Row, scenario

PARTITIONS = 2
# Rounds in rotated order: each ratio compares runs side by side on a noisy machine.
ROUNDS = 3


@scenario(
    "spark_write",
    "Spark DataFrame write and writeStream msgs/s through the data source vs SendBatch of "
    "1,000 from a plain Python client with as many calls in flight (--spark-rows, default 1M)",
)
async def spark_write(ctx: Context) -> list[Row]:
    served = ctx.postbox()
    with tempfile.TemporaryDirectory(prefix="postbox-bench-spark-") as directory:
        results = Path(directory) / "rates.json"
        log = Path(directory) / "spark.log"
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                sys.executable, str(ROOT / "bench" / "spark_write.py"),
                "--target", served.target, "--rows", str(ctx.spark_rows),
                "--body-size", str(ctx.body_size), "--partitions", str(PARTITIONS),
                "--only", "plain", "spark-arrow", "spark-stream", "--rounds", str(ROUNDS),
                "--json", str(results), "--skip-client-cpu",
                cwd=ROOT, stdout=output, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
            )  # fmt: skip
            code = await process.wait()
        if code != 0:
            raise RuntimeError(f"spark_write.py exited {code}:\n{log.read_text()[-4000:]}")
        measured = json.loads(results.read_text())
    rates, ratios = measured["rates"], measured["ratios"]
    return [
        Row(
            f"Spark {kind} {ctx.spark_rows:,} rows, local[{PARTITIONS}]",
            "msgs/s",
            rates[variant],
            rates["plain"],
            "plain Python SendBatch(1000)",
            note=f"medians of {ROUNDS} rounds; same-round ratios"
            f" {', '.join(f'{r:.2f}' for r in ratios[variant])}; JVM start and warm-up not counted",
        )
        for kind, variant in (("write", "spark-arrow"), ("writeStream", "spark-stream"))
    ]
