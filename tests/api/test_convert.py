"""Conversions the server does per message, against protobuf's own."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from postbox_server.services import convert


@pytest.mark.parametrize(
    "value",
    [
        datetime(9999, 12, 31, 23, 59, 59, 999999),  # asyncpg's 'infinity', naive
        datetime(1, 1, 1),  # and '-infinity'
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=timezone.utc),
        datetime(1970, 1, 1, tzinfo=timezone.utc),
        datetime(2026, 11, 23, 18, 0, 0, 123456, tzinfo=timezone(timedelta(hours=-5))),
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=14))),
    ],
)
def test_timestamp_matches_protobufs_own_conversion(value):
    expected = Timestamp()
    expected.FromDatetime(value)
    assert convert.timestamp(value) == expected


def test_no_timestamp_stays_unset():
    assert convert.timestamp(None) is None
