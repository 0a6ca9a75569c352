"""The "postbox" data source: options in, planned writers and the stream reader out."""

from __future__ import annotations

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from postbox_client.spark.client import check_auth_token
from postbox_client.spark.options import (
    PostboxOptionError,
    read_plan,
    reads_topic,
    topic_read_plan,
    write_plan,
)
from postbox_client.spark.reader import SCHEMA, PostboxStreamReader
from postbox_client.spark.topic_reader import TOPIC_SCHEMA, PostboxTopicStreamReader
from postbox_client.spark.writer import PostboxStreamWriter, PostboxWriter


def _append_only(overwrite: bool) -> None:
    if overwrite:
        raise PostboxOptionError(
            "a queue cannot be overwritten: use mode('append') (batch) or"
            " outputMode('append') (streaming)"
        )


class PostboxDataSource(DataSource):
    """Writes DataFrames to a postbox queue (batch and streaming); reads a queue, or a
    stream topic's log through a consumer group, as a stream."""

    @classmethod
    def name(cls) -> str:
        return "postbox"

    def schema(self) -> str:
        return TOPIC_SCHEMA if reads_topic(self.options) else SCHEMA

    def writer(self, schema: StructType, overwrite: bool) -> PostboxWriter:
        _append_only(overwrite)
        plan = write_plan(self.options, schema, streaming=False)
        check_auth_token(plan.connection, plan.queue, plan.topic)
        return PostboxWriter(plan)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PostboxStreamWriter:
        _append_only(overwrite)
        plan = write_plan(self.options, schema, streaming=True)
        check_auth_token(plan.connection, plan.queue, plan.topic)
        return PostboxStreamWriter(plan)

    def streamReader(self, schema: StructType) -> PostboxTopicStreamReader:
        """A stream topic's reader, whose micro-batches Spark tasks read; a queue's reader
        is the simple one, which Spark falls back to on PySparkNotImplementedError."""
        if not reads_topic(self.options):
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        plan = topic_read_plan(self.options)
        check_auth_token(plan.connection, None, plan.topic)
        return PostboxTopicStreamReader(plan)

    def simpleStreamReader(self, schema: StructType) -> PostboxStreamReader:
        plan = read_plan(self.options)
        check_auth_token(plan.connection, plan.queue, None)
        return PostboxStreamReader(plan)
