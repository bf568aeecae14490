"""Field conversions shared by server and client (tiermem._values): timestamps to the nanosecond."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from tiermem._values import set_timestamp, timestamp_seconds


def _reference(seconds: float) -> tuple[int, int]:
    """Whole seconds toward -inf and the rounded fraction in ns, kept below a second (plain Python)."""
    whole = int(seconds // 1)
    return whole, min(round((seconds - whole) * 1e9), 999_999_999)


def test_timestamps_match_the_plain_reference_and_stay_in_range() -> None:
    rng = np.random.default_rng(7)
    values = [
        *rng.uniform(0, 2e9, 100_000).tolist(),  # epoch seconds, now-ish
        *rng.uniform(-1e9, 1e9, 50_000).tolist(),  # before 1970 too
        *rng.uniform(-5, 5, 50_000).tolist(),  # small, where fractions are finest
        *(float(i) for i in range(-3, 4)),
        0.9999999996,  # rounds up to a whole second: capped
        -0.0000000004,
        1764726201.9999999,
        5.0000000005,
        -0.0,
        2,  # an int, as a record's stored time may be
    ]
    ts = Timestamp()
    for x in values:
        set_timestamp(ts, x)
        assert (ts.seconds, ts.nanos) == _reference(x), x
        assert 0 <= ts.nanos < 1_000_000_000
        assert abs(timestamp_seconds(ts) - x) <= max(1e-9, 4 * math.ulp(x)), x


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_timestamp_that_is_not_finite_is_refused_and_changes_nothing(bad: float) -> None:
    ts = Timestamp(seconds=5, nanos=7)
    with pytest.raises(ValueError, match="finite"):
        set_timestamp(ts, bad)
    assert (ts.seconds, ts.nanos) == (5, 7)
