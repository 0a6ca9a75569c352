"""PySpark data source "postbox": `register(spark)`, then `df.write.format("postbox")`.

Needs the `spark` extra (pyspark and pyarrow); the server itself never imports this.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from server.spark.options import PostboxOptionError
from server.spark.source import PostboxDataSource

__all__ = ["PostboxDataSource", "PostboxOptionError", "register"]


def register(spark: SparkSession) -> None:
    """Makes format "postbox" available to `spark`'s readers and writers."""
    spark.dataSource.register(PostboxDataSource)
