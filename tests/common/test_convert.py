"""Timestamps built by integer arithmetic equal protobuf's own conversion."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from services.common.convert import timestamp


def _protobufs(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value.astimezone(UTC))
    return stamp


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 1, 16, 52, 3, 123456, tzinfo=UTC),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500000, tzinfo=UTC),  # before the epoch
        datetime(2026, 3, 29, 1, 30, tzinfo=timezone(timedelta(hours=-7, minutes=-30))),
        datetime(2026, 3, 29, 1, 30),  # naive: local time, as protobuf reads it
    ],
)
def test_timestamp_equals_protobufs_conversion(value: datetime) -> None:
    assert timestamp(value) == _protobufs(value)


def test_none_stays_none() -> None:
    assert timestamp(None) is None
