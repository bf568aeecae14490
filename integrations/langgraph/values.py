"""An item's value as a memory's content and metadata, and back. Pure functions, no I/O.

- **content** is the text tiermem searches (embeds and indexes by keyword): the texts at the put's
  ``index`` paths joined by newlines, or the store's default paths', or, without any, the value as
  JSON.
- **the value itself**, losslessly, as JSON (key order, nesting, lists, big integers and floats as
  they were): in ``content`` when content is that JSON, else in the metadata entry
  ``langgraph.value``. A value whose JSON does not fit the metadata beside the rest
  (``METADATA_BYTES``) is stored as when no paths are given: its JSON is also its searched text.
- **metadata** also holds the key (``langgraph.key``), the time of the put (``langgraph.updated_at``),
  the TTL in minutes (``langgraph.ttl_minutes``), ``langgraph.unindexed`` for an item put with
  ``index=False`` (or whose paths found no text: query searches skip it), and each top-level scalar
  of the value as ``value.<field>`` (strings up to ``MIRROR_STRING_BYTES``, booleans, finite numbers,
  integers within 2**53), which tiermem's ``where`` filters compare on the server. A scalar that could
  not be copied there sets ``langgraph.unmirrored``: such an item passes every server-side filter and
  is judged in the client (filters.py).
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from langgraph.store.base import get_text_at_path

from tiermem._labels import blank, label_fault

from .keys import key_of
from .keys import memory_id as id_of_key

KEY = "langgraph.key"
VALUE = "langgraph.value"
UPDATED = "langgraph.updated_at"
TTL = "langgraph.ttl_minutes"
UNINDEXED = "langgraph.unindexed"
UNMIRRORED = "langgraph.unmirrored"
FIELD = "value."  # + a top-level field of the value

# tiermem's default limits (ServerConfig max_metadata_bytes, max_metadata_keys, max_content_bytes).
METADATA_BYTES = 16384
METADATA_KEYS = 64
CONTENT_BYTES = 65536
MIRROR_STRING_BYTES = 512
MAX_LABEL_BYTES = 256  # a metadata key
EXACT_INT = 2**53  # numbers travel as doubles: larger integers would compare rounded
MAX_DEPTH = 256  # levels of objects and arrays in a value (JSON decoding recurses once a level)
MAX_TTL_MINUTES = 1e8  # about 190 years
MAX_KEY_BYTES = 15 * 1024  # a key is kept in the metadata (langgraph.key): 1 KiB of its 16 left to the rest


@dataclass(frozen=True)
class Stored:
    """What a put writes into the memory."""

    content: str
    metadata: dict[str, Any]


def dumps(value: Mapping[str, Any]) -> str:
    """The value as JSON, readable (non-ASCII as is) unless it holds lone surrogates, which UTF-8
    (hence gRPC) cannot carry: then escaped."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value)
    return text


def _search_text(value: Mapping[str, Any], paths: list[str]) -> str:
    """The texts at ``paths`` joined by newlines, made storable: valid UTF-8, no NUL, within
    tiermem's content limit (it is only searched, so cutting it loses nothing of the value)."""
    texts = [t for path in paths for t in get_text_at_path(value, path)]
    text = "\n".join(texts).replace("\x00", " ")
    return text.encode("utf-8", "replace")[: CONTENT_BYTES - 64].decode("utf-8", "ignore")


def _entry_bytes(key: str, value: Any) -> int:
    """An upper bound on one entry's msgpack size (what tiermem counts against its limit)."""
    size = len(key.encode("utf-8", "replace")) + 5
    return size + (len(value.encode("utf-8", "replace")) + 5 if isinstance(value, str) else 9)


def _metadata_bytes(meta: Mapping[str, Any]) -> int:
    return 5 + sum(_entry_bytes(k, v) for k, v in meta.items())


def _storable_string(text: str, limit: int) -> bool:
    try:
        return len(text.encode("utf-8")) <= limit
    except UnicodeEncodeError:
        return False


def field_key(field: str) -> str | None:
    """The metadata key of a top-level field, or None when tiermem cannot hold it as a key
    (too long, not valid UTF-8, a character no label may hold)."""
    key = FIELD + field
    if not _storable_string(key, MAX_LABEL_BYTES) or label_fault(key):
        return None
    # A character this Python's Unicode tables do not know may be a format character to a server's
    # newer ones, which would refuse the whole put: such a field is not mirrored either.
    if any(unicodedata.category(ch) == "Cn" for ch in key if not ch.isascii()):
        return None
    return key


def mirrorable(value: Any) -> bool:
    """Whether a scalar can be compared on the server exactly as the client compares it."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= EXACT_INT
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return _storable_string(value, MIRROR_STRING_BYTES)
    return False


def _like_missing(value: Any) -> bool:
    """Whether every server-side comparison treats this value as a missing field does (so leaving
    it out of the metadata changes no filter's answer): null, objects, arrays, NaN."""
    return value is None or isinstance(value, dict | list) or (isinstance(value, float) and math.isnan(value))


def _mirror(meta: dict[str, Any], value: Mapping[str, Any]) -> None:
    """Copy the value's top-level scalars into ``meta`` while tiermem's limits allow; flag the item
    when one that matters for a filter could not be copied."""
    complete = True
    size = _metadata_bytes(meta) + _entry_bytes(UNMIRRORED, True)
    for field, v in value.items():
        if _like_missing(v):
            continue
        key = field_key(field) if isinstance(field, str) else None
        if key is None or not mirrorable(v):
            complete = False
            continue
        grown = size + _entry_bytes(key, v)
        if grown > METADATA_BYTES or len(meta) + 2 > METADATA_KEYS:
            complete = False
            continue
        meta[key], size = v, grown
    if not complete:
        meta[UNMIRRORED] = True


def store(
    key: str,
    value: Mapping[str, Any],
    paths: list[str] | Literal[False] | None,
    ttl_minutes: float | None,
    now: float,
) -> Stored:
    """The content and metadata of an item put at ``now`` (epoch seconds). ``paths``: the texts to
    search (None: the value as JSON; False: not indexed)."""
    value_json = dumps(value)
    meta: dict[str, Any] = {UPDATED: now}
    if storable(key):  # (else its memory id spells it: check_put)
        meta[KEY] = key
    if ttl_minutes is not None:
        meta[TTL] = float(ttl_minutes)
    text = None if paths is False else value_json if paths is None else _search_text(value, paths)
    content = value_json
    if text is None or blank(text):  # (the server refuses such content: stored unindexed)
        meta[UNINDEXED] = True
    elif (
        text != value_json
        and _metadata_bytes({**meta, VALUE: value_json, UNMIRRORED: True}) <= METADATA_BYTES
    ):
        content, meta[VALUE] = text, value_json
    _mirror(meta, value)
    return Stored(content, meta)


def storable(text: str) -> bool:
    """Whether ``text`` is valid Unicode text, which UTF-8 (hence gRPC) can carry."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_put(key: str, value: Any, ttl: Any) -> None:
    """What a put must hold for its item to be stored and read back: ValueError (TypeError for a
    type) naming what is wrong, before anything is written."""
    if not isinstance(key, str):
        raise TypeError(f"a key is a str, not {type(key).__name__}")
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > MAX_KEY_BYTES:
        raise ValueError(
            f"a key is at most {MAX_KEY_BYTES} bytes of UTF-8 (it is kept in the metadata), not {size}"
        )
    if not storable(key) and key_of(id_of_key(key)) is None:
        raise ValueError(
            "a key holding a lone surrogate (not valid Unicode text) must be short enough for its memory id to spell it"
        )
    if not isinstance(value, dict):
        raise TypeError(f"a value must be a dict, not {type(value).__name__}")
    _check_depth(value)
    check_ttl("ttl", ttl)


def check_ttl(name: str, ttl: Any) -> None:
    """ValueError unless ``ttl`` is None or a number of minutes in (0, MAX_TTL_MINUTES]."""
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_MINUTES
    ):
        raise ValueError(f"{name} is a number of minutes in (0, {MAX_TTL_MINUTES:g}], got {ttl!r}")


def _check_depth(value: dict[str, Any]) -> None:
    """Values nest at most MAX_DEPTH levels: JSON decoding deeper ones runs out of Python's stack,
    and one such item would break every search that reads it."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if not isinstance(v, dict | list | tuple):
            continue  # (a scalar is no level)
        if depth > MAX_DEPTH:
            raise ValueError(f"a value nests at most {MAX_DEPTH} levels of objects and arrays")
        stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))


def load(content: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The value stored by ``store``. A memory written by other means (not JSON, or not an object,
    or nested past what Python decodes) reads as ``{"content": <its content>}``."""
    raw = metadata.get(VALUE)
    try:
        value = json.loads(raw if isinstance(raw, str) else content)
    except (ValueError, RecursionError):
        return {"content": content}
    return value if isinstance(value, dict) else {"content": content}


def key(memory_id: str, metadata: Mapping[str, Any]) -> str:
    stored = metadata.get(KEY)
    if isinstance(stored, str):
        return stored
    decoded = key_of(memory_id)
    return memory_id if decoded is None else decoded


def ttl_minutes(metadata: Mapping[str, Any]) -> float | None:
    ttl = metadata.get(TTL)
    return float(ttl) if isinstance(ttl, int | float) and not isinstance(ttl, bool) else None
