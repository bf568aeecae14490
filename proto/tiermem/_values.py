"""Conversions between Python values and tiermem.v1 message fields, shared by server and client."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp


def set_timestamp(ts: Timestamp, seconds: float) -> None:
    """Set ``ts`` to epoch ``seconds`` (fractions kept to the nanosecond)."""
    # (on every search hit's path four times: math.floor and a comparison, not int(x // 1) and min())
    if not math.isfinite(seconds):
        raise ValueError(f"a timestamp must be a finite number of seconds, not {seconds!r}")
    whole = math.floor(seconds)
    nanos = round((seconds - whole) * 1e9)
    ts.seconds = whole
    ts.nanos = nanos if nanos < 1_000_000_000 else 999_999_999


def timestamp_seconds(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def set_metadata(target: Any, values: Mapping[str, Any]) -> None:
    """Fill a ``map<string, Value>`` field from str, int, float and bool values."""
    for key, v in values.items():
        slot = target[key]
        if isinstance(v, bool):  # before int: bool is an int
            slot.bool_value = v
        elif isinstance(v, int):
            if not -(2**63) <= v < 2**63:
                raise ValueError(f"metadata[{key!r}] is an integer outside int64 (-2^63 to 2^63 - 1)")
            slot.int_value = v
        elif isinstance(v, float):
            slot.double_value = v
        elif isinstance(v, str):
            slot.string_value = v
        else:
            raise TypeError(f"metadata[{key!r}] must be str, int, float or bool, not {type(v).__name__}")


def metadata_values(field: Any) -> dict[str, Any]:
    """A ``map<string, Value>`` field as Python values; a Value with nothing set maps to None."""
    out: dict[str, Any] = {}
    for key, v in field.items():
        which = v.WhichOneof("kind")
        out[key] = None if which is None else getattr(v, which)
    return out
