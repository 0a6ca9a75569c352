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


@scenario(
    "spark_write",
    "Spark DataFrame write msgs/s through the data source (Arrow writer) vs SendBatch of "
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
                "--only", "plain", "spark-arrow", "--json", str(results), "--skip-client-cpu",
                cwd=ROOT, stdout=output, stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, "GRPC_ENABLE_FORK_SUPPORT": "false"},
            )  # fmt: skip
            code = await process.wait()
        if code != 0:
            raise RuntimeError(f"spark_write.py exited {code}:\n{log.read_text()[-4000:]}")
        rates = json.loads(results.read_text())["rates"]
    return [
        Row(
            f"Spark write {ctx.spark_rows:,} rows, local[{PARTITIONS}]",
            "msgs/s",
            rates["spark-arrow"],
            rates["plain"],
            "plain Python SendBatch(1000)",
            note="JVM start and a 10,000-row warm-up write not counted",
        )
    ]
