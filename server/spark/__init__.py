"""PySpark data source "postbox": `register(spark)`, then `df.write.format("postbox")`.

Needs the `spark` extra (pyspark and pyarrow); the server itself never imports this.
"""

from __future__ import annotations

import logging
import sys

from pyspark.sql import SparkSession

from server.spark.options import PostboxOptionError
from server.spark.source import PostboxDataSource

__all__ = ["PostboxDataSource", "PostboxOptionError", "register"]

_log = logging.getLogger(__name__)
if not _log.handlers and not logging.getLogger().handlers:
    # Commit, abort and the stream reader run in Python workers of the driver, whose
    # stderr goes to the driver's log; unconfigured, logging would drop INFO lines.
    _handler = logging.StreamHandler(sys.stderr)
    _handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    _log.addHandler(_handler)
    _log.setLevel(logging.INFO)


def register(spark: SparkSession) -> None:
    """Makes format "postbox" available to `spark`'s readers and writers."""
    spark.dataSource.register(PostboxDataSource)
