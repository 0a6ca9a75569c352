"""PySpark data source "postbox": `register(spark)`, then `df.write.format("postbox")`.

Needs the `spark` extra (pyspark and pyarrow); the server itself never imports this.
"""

from __future__ import annotations

import logging
import os
import sys

from pyspark.sql import SparkSession

from postbox_client.spark.options import PostboxOptionError
from postbox_client.spark.source import PostboxDataSource

__all__ = ["PostboxDataSource", "PostboxOptionError", "register"]

_log = logging.getLogger(__name__)
_FORMAT = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
# Commit, abort and the stream reader run in Python workers of the driver, whose
# stderr ends up in the JVM's stderr among Spark's own lines; a file set here
# (the workers inherit the driver's environment) collects just this source's.
LOG_FILE_VARIABLE = "POSTBOX_SPARK_LOG_FILE"


def _configure_logging() -> None:
    handlers: list[logging.Handler] = []
    if not _log.handlers and not logging.getLogger().handlers:
        # Unconfigured, logging would drop INFO lines.
        handlers.append(logging.StreamHandler(sys.stderr))
    log_file = os.environ.get(LOG_FILE_VARIABLE)
    if log_file and not any(isinstance(h, logging.FileHandler) for h in _log.handlers):
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(_FORMAT)
        _log.addHandler(handler)
    if handlers and _log.level == logging.NOTSET:
        _log.setLevel(logging.INFO)


_configure_logging()


def register(spark: SparkSession) -> None:
    """Makes format "postbox" available to `spark`'s readers and writers."""
    spark.dataSource.register(PostboxDataSource)
