"""Conversions between Python values and tiermem.v1 message fields, shared by server and client."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

# Labels (tags, metadata keys) never hold control characters ("deploy\n" beside "deploy" is a second
# label no one meant), invisible characters (Unicode's format category: zero-width spaces, direction
# overrides, byte-order marks, tag characters) or line and paragraph separators: each makes a label
# that looks like another one, or hides text in it. Two are kept where text needs them: joiners
# between two non-ASCII characters (Persian and Indic words, emoji sequences), and tag characters in
# the run that follows a black flag (the flags of regions, such as Scotland's).
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INVISIBLE = frozenset(("Cf", "Zl", "Zp"))
_BLACK_FLAG = "\U0001f3f4"


def label_fault(text: str) -> str | None:
    """Why ``text`` cannot be a tag or a metadata key (its characters), or None when it can."""
    if _CONTROL_RE.search(text):
        return "must not contain control characters (e.g. a newline or a tab)"
    if not text.isascii():
        for i, ch in enumerate(text):
            if unicodedata.category(ch) in _INVISIBLE and not _kept(text, i):
                return f"must not contain invisible or line-separating characters (U+{ord(ch):04X})"
    return None


def _kept(text: str, i: int) -> bool:
    code = ord(text[i])
    if code in (0x200C, 0x200D):  # a joiner, between two characters it can join
        return 0 < i < len(text) - 1 and not text[i - 1].isascii() and not text[i + 1].isascii()
    if 0xE0020 <= code <= 0xE007F:  # a tag character, in a black flag's run
        j = i
        while j > 0 and 0xE0020 <= ord(text[j - 1]) <= 0xE007E:
            j -= 1
        return j > 0 and text[j - 1] == _BLACK_FLAG
    return False


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
