"""Input checks. Each failure names the request field (e.g. ``memories[3].importance``)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

from tiermem._labels import blank, label_fault
from tiermem.server.config import TIERS, ServerConfig
from tiermem.server.model import importance
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import NewMemory, Record

# Anchored with \Z, never $: "$" also matches before a final newline, so "r/a\n" would pass as a
# namespace beside "r/a". Checks here use fullmatch; the \Z keeps a .match elsewhere exact too.
_SEGMENT = r"[A-Za-z0-9._:\-]+"
NAMESPACE_RE = re.compile(rf"^{_SEGMENT}(?:/{_SEGMENT})*\Z")
ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}\Z")
KIND_RE = re.compile(r"^[a-z0-9_]{1,64}\Z")
MAX_NAMESPACE = 256
MAX_TEXT_FIELD = 256
MAX_TAG = 128
MAX_MODEL = 256
MAX_REQUEST_ID = 128
MAX_LINKED_IDS = 1000  # memory ids a memory or graph item names (as many as a summary covers)
EARLIEST_TIME = -62_135_596_800.0  # 0001-01-01T00:00:00Z, the earliest valid Timestamp
LATEST_TIMESTAMP = 253_402_300_799.0  # 9999-12-31T23:59:59Z, the latest (stored times stop sooner)
MIN_REFLECTION_IMPORTANCE = 0.8  # a reflection distils many observations: it ranks above most of them


def namespace(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_NAMESPACE:
        raise InvalidArgument(field, f"is {len(value)} characters long, the limit is {MAX_NAMESPACE}")
    if not NAMESPACE_RE.fullmatch(value):
        raise InvalidArgument(
            field, "must be segments of [A-Za-z0-9._:-] separated by single '/' (e.g. 'user:ana/project:x')"
        )
    return value


def memory_id(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not ID_RE.fullmatch(value):
        raise InvalidArgument(field, "must be 1-128 characters of [A-Za-z0-9._:-]")
    return value


def request_id(field: str, value: str) -> str:
    if len(value.encode()) > MAX_REQUEST_ID:
        raise InvalidArgument(field, f"is longer than {MAX_REQUEST_ID} bytes")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    return value


def unit_interval(field: str, value: float) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidArgument(field, f"must be in [0, 1], got {value}")
    return float(value)


LATEST_TIME = 1e11  # about year 5138: the times a memory holds, a search's as_of and graph times
TIME_RANGE = "must be a time between years 1 and 5138 (stored times stop there)"


def finite_time(field: str, value: float) -> float:
    """A time a google.protobuf.Timestamp can carry (from year 1), up to about year 5138."""
    if not math.isfinite(value) or not EARLIEST_TIME <= value <= LATEST_TIME:
        raise InvalidArgument(field, TIME_RANGE)
    return value


def text(field: str, value: str, limit: int = MAX_TEXT_FIELD) -> str:
    size = len(value.encode())
    if size > limit:
        raise InvalidArgument(field, f"is {size} bytes, the limit is {limit}", reason="FIELD_TOO_LARGE")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    return value


def label(field: str, value: str, limit: int) -> str:
    """A tag, a metadata key, an edge's relation or an embedding model's name: ``text`` within
    ``limit`` bytes, not blank, its characters as ``label_fault`` allows."""
    text(field, value, limit)
    fault = label_fault(value)
    if fault:
        raise InvalidArgument(field, fault)
    if value and value.isspace():
        raise InvalidArgument(field, "must not be blank")
    return value


def kind(field: str, value: str) -> str:
    if not KIND_RE.fullmatch(value):
        raise InvalidArgument(field, "must be 1-64 characters of [a-z0-9_]")
    return value


def tier(field: str, value: int) -> int:
    if value not in TIERS:
        raise InvalidArgument(field, "must be TIER_FAST, TIER_MEDIUM, TIER_SLOW or TIER_GLACIAL")
    return value


def tags(field: str, values: list[str], config: ServerConfig) -> list[str]:
    out = list(dict.fromkeys(values))
    if len(out) > config.max_tags:
        raise InvalidArgument(
            field, f"has {len(out)} tags, the limit is {config.max_tags}", reason="FIELD_TOO_LARGE"
        )
    for i, t in enumerate(out):
        if not t:
            raise InvalidArgument(f"{field}[{i}]", "must not be empty")
        label(f"{field}[{i}]", t, MAX_TAG)
    return out


def _shown_key(key: str) -> str:
    """A map key as a field name shows it: quoted, and cut when longer than any valid key (an error
    echoing a huge key would pass the client's metadata limit and arrive as RESOURCE_EXHAUSTED)."""
    shown = repr(key)
    return shown if len(shown) <= MAX_TEXT_FIELD + 2 else f"{key[:64]!r}..."


def metadata(field: str, values: dict[str, Any], config: ServerConfig) -> dict[str, Any]:
    if len(values) > config.max_metadata_keys:
        raise InvalidArgument(
            field,
            f"has {len(values)} keys, the limit is {config.max_metadata_keys}",
            reason="FIELD_TOO_LARGE",
        )
    for k, v in values.items():
        if not k:
            raise InvalidArgument(field, "keys must not be empty")
        here = f"{field}[{_shown_key(k)}]"
        label(here, k, MAX_TEXT_FIELD)
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidArgument(here, "must be a finite number")
        if not isinstance(v, str | int | float | bool):
            raise InvalidArgument(here, "must have a value")
    size = len(msgpack.packb(values, use_bin_type=True))
    if size > config.max_metadata_bytes:
        raise InvalidArgument(
            field,
            f"is {size} bytes serialized, the limit is {config.max_metadata_bytes}",
            reason="FIELD_TOO_LARGE",
        )
    return values


def vector(field: str, values: Any, config: ServerConfig) -> np.ndarray:
    """A finite, non-zero vector, returned L2-normalized as float32."""
    vec = np.asarray(values, dtype=np.float32)
    if vec.ndim != 1 or vec.shape[0] == 0:
        raise InvalidArgument(field, "must be a non-empty list of floats")
    if vec.shape[0] > config.max_dimension:
        raise InvalidArgument(
            field,
            f"has dimension {vec.shape[0]}, the limit is {config.max_dimension}",
            reason="FIELD_TOO_LARGE",
        )
    if not np.all(np.isfinite(vec)):
        raise InvalidArgument(field, "must not contain NaN or Inf")
    out = unit(vec)
    if out is None:
        raise InvalidArgument(field, "must have a non-zero norm")
    return out


def unit(vec: np.ndarray) -> np.ndarray | None:
    """``vec`` (float32) at unit length; None when it has no direction (a zero or non-finite norm)."""
    wide = vec.astype(np.float64)  # (in float32 a norm past its range, or of subnormals, divides wrongly)
    norm = float(np.linalg.norm(wide))
    if not norm > 0.0 or not math.isfinite(norm):
        return None
    if abs(norm - 1.0) < 1e-6:
        return vec  # already unit length: normalizing again would only move the last bits
    return (wide / norm).astype(np.float32)


def same_dimension(field: str, model: str, dim: int, space_dim: int | None) -> None:
    """INVALID_ARGUMENT unless a vector of ``dim`` fits embedding space ``model`` of dimension
    ``space_dim`` (None: the space is new and takes this dimension)."""
    if space_dim is not None and space_dim != dim:
        raise InvalidArgument(
            field,
            f"has dimension {dim}, but embedding space {model!r} has dimension {space_dim}",
            reason="EMBEDDING_DIMENSION_MISMATCH",
        )


def model(field: str, value: str) -> str:
    """An embedding space's name: a label ("m\\n" or " " would be a space of its own no one meant),
    without whitespace at either end."""
    if not value:
        raise InvalidArgument(field, "is required with an embedding")
    label(field, value, MAX_MODEL)
    if value != value.strip():
        raise InvalidArgument(field, "must not begin or end with whitespace")
    return value


def memory_ids(field: str, values: list[str]) -> None:
    """At most MAX_LINKED_IDS ids, each valid (``field[i]`` names a bad one)."""
    if len(values) > MAX_LINKED_IDS:
        raise InvalidArgument(
            field, f"has {len(values)} ids, the limit is {MAX_LINKED_IDS}", reason="FIELD_TOO_LARGE"
        )
    for i, v in enumerate(values):
        memory_id(f"{field}[{i}]", v)


def reflection_importance(field: str, kind_: str, value: float) -> None:
    if kind_ == "reflection" and value < MIN_REFLECTION_IMPORTANCE:
        raise InvalidArgument(
            field, f"a reflection's importance must be at least {MIN_REFLECTION_IMPORTANCE}"
        )


def new_memory(prefix: str, m: NewMemory, config: ServerConfig) -> NewMemory:
    """Check and normalize one create request in place; ``prefix`` is e.g. ``memories[2].``."""
    namespace(f"{prefix}namespace", m.namespace)
    if m.id:
        memory_id(f"{prefix}id", m.id)
    if blank(m.content):  # (nothing to find it by, a blank line in a context)
        raise InvalidArgument(
            f"{prefix}content", "is required (white space or invisible characters alone are no content)"
        )
    text(f"{prefix}content", m.content, config.max_content_bytes)
    m.kind = kind(f"{prefix}kind", m.kind) if m.kind else config.default_kind
    m.tier = tier(f"{prefix}tier", m.tier) if m.tier else config.default_tier
    if m.importance is None:
        m.importance = importance.estimate(m.content, m.kind)  # a documented heuristic (importance.py)
    else:
        unit_interval(f"{prefix}importance", m.importance)
    reflection_importance(f"{prefix}importance", m.kind, m.importance)
    text(f"{prefix}source", m.source)
    text(f"{prefix}topic", m.topic)
    m.tags = tags(f"{prefix}tags", m.tags, config)
    metadata(f"{prefix}metadata", m.metadata, config)
    if m.embedding is not None:
        m.embedding = vector(f"{prefix}embedding", m.embedding, config)
        model(f"{prefix}embedding_model", m.embedding_model)
    elif m.embedding_model:
        raise InvalidArgument(f"{prefix}embedding", "is required with embedding_model")
    if m.created_at is not None:
        finite_time(f"{prefix}create_time", m.created_at)
    if m.expire_at is not None:
        finite_time(f"{prefix}expire_time", m.expire_at)
    if m.token_cost < 0:
        raise InvalidArgument(f"{prefix}token_cost", "must be >= 0")
    memory_ids(f"{prefix}source_memory_ids", m.source_ids)
    if len(m.questions) > config.max_tags:
        raise InvalidArgument(
            f"{prefix}questions", f"has {len(m.questions)} questions, the limit is {config.max_tags}"
        )
    for i, q in enumerate(m.questions):
        text(f"{prefix}questions[{i}]", q, 1024)
        if not q.strip():
            raise InvalidArgument(f"{prefix}questions[{i}]", "must not be empty")
    return m


def batch(field: str, items: Sequence[Any], limit: int) -> None:
    if not items:
        raise InvalidArgument(field, "must not be empty")
    if len(items) > limit:
        raise InvalidArgument(
            field, f"holds {len(items)} entries, the limit is {limit}", reason="BATCH_TOO_LARGE"
        )


def page_size(field: str, value: int, config: ServerConfig) -> int:
    if value < 0:
        raise InvalidArgument(field, "must not be negative")
    if value == 0:
        return config.default_page_size
    return min(value, config.max_page_size)


def restored_history(prefix: str, rec: Record) -> None:
    """The output-only fields an import restores as exported (the others are checked as a create's):
    counters, times and origin as this server could have made them (``prefix``: ``memories[2].``)."""
    for name, value in (("access_count", rec.access_count), ("success_count", rec.success_count)):
        if not 0 <= value <= 2**53:
            raise InvalidArgument(prefix + name, "must be in [0, 2^53]")
    if not (math.isfinite(rec.surprise) and 0.0 <= rec.surprise <= 2.0):
        raise InvalidArgument(prefix + "surprise_score", "must be a number in [0, 2]")
    for name, t in (
        ("update_time", rec.updated_at),
        ("last_access_time", rec.accessed_at),
        ("tier_time", rec.tier_since),
    ):
        finite_time(prefix + name, t)
    if rec.origin is not None:
        ns, oid, otier, when = rec.origin
        namespace(prefix + "origin.namespace", ns)
        memory_id(prefix + "origin.id", oid)
        tier(prefix + "origin.tier", otier)
        finite_time(prefix + "origin.transfer_time", when)
