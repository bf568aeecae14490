"""The ``where`` filter language: one JSON grammar for every search and list.

    where     := {"$and": [where, ...]} | {"$or": [where, ...]} | {"$not": where}
               | {field: value, ...}                  (several keys: all must hold)
               | {field: {op: value, ...}}            (several ops: all must hold)
    op        := $eq $ne $gt $gte $lt $lte $in $nin   ($all too, for tags)
    field     := kind | source | topic | tier | tags | importance | surprise_score | access_count
               | success_count | create_time | update_time | last_access_time | metadata.<key>

- ``{field: value}`` means ``{field: {"$eq": value}}``.
- ``tags``: ``{"tags": "x"}`` has tag x; ``{"tags": ["x", "y"]}`` has both (as ``$all``); ``$in`` any
  of; ``$all`` all of (not of an empty list); ``$nin`` none of; ``$ne`` not x.
- ``tier``: 1-4 or a name ("FAST", "TIER_FAST").
- times: epoch seconds or an RFC 3339 string ("2026-11-21T10:00:00Z").
- ``metadata.<key>``: compares with values of the same type (numbers with numbers, strings with
  strings, booleans with booleans); a memory without the key matches only ``$ne`` and ``$nin``.
- numbers: any finite JSON number. Integer fields compare exactly, fractions and bounds beyond
  int64 included: ``{"access_count": {"$gt": 1e300}}`` matches nothing, ``{"$gte": 2.5}`` keeps 3
  and not 2. NaN, Infinity and integers beyond the floats' range are INVALID_ARGUMENT.
- at most 32 levels of ``$and``/``$or``/``$not`` and 1000 nodes; text nesting arrays and objects
  more than 128 deep is refused before it is parsed.

A filter compiles to a boolean mask over the in-memory columns, so it costs the same whether it keeps
one memory or all of them, and search ranks exactly over what it keeps.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from tiermem.server.index.columns import EXACT_INT, Columns, ColumnsView, exact_float
from tiermem.server.model.errors import InvalidArgument

FIELD = "filter.where"
MAX_DEPTH = 32
MAX_NODES = 1000
MAX_LIST_VALUES = 256  # values one list may hold ($in, $nin, $all; a filter's tiers, kinds, tags)
# Text nesting arrays and objects deeper than this is refused before it is parsed: json.loads
# recurses once per level, and a few hundred levels reach the interpreter's recursion limit
# (RecursionError, which was INTERNAL). A filter needs at most 2 * MAX_DEPTH + 3 levels (a where node
# at depth d is an object nested 2d + 1 deep, as $and and $or hold lists of objects, and its deepest
# value, {field: {op: [values]}}, is two below that); the margin above it lets a filter a little too
# deep get the message naming where it is too deep.
MAX_NESTING = 4 * MAX_DEPTH
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SHOWN = 80  # characters of a request's value (or key) quoted in an error message
_SHOWN_PATH = 400  # ... and of the path to it

_COMPARE = {"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"}
_SETS = {"$in", "$nin"}
_ORDER = {"$gt": operator.gt, "$gte": operator.ge, "$lt": operator.lt, "$lte": operator.le}
_NUMERIC = {
    "importance": "importance",
    "surprise_score": "surprise",
    "access_count": "access_count",
    "success_count": "success",
}
_TIMES = {"create_time": "created", "update_time": "updated", "last_access_time": "accessed"}
_INTERNED = {"kind": "kinds", "source": "sources", "topic": "topics"}
_TIER_NAMES = {"FAST": 1, "MEDIUM": 2, "SLOW": 3, "GLACIAL": 4}

Mask = Callable[[ColumnsView, Columns], np.ndarray]


def compile_where(text: str) -> Mask | None:
    """Parse and check a ``where`` JSON text; returns a function building the mask, or None if empty."""
    if not text.strip():
        return None
    if _nesting(text) > MAX_NESTING:
        raise InvalidArgument(
            FIELD,
            f"nests arrays and objects more than {MAX_NESTING} levels deep (a filter: {MAX_DEPTH} at most)",
        )
    try:
        tree = json.loads(text, object_pairs_hook=_object)
    except _DuplicateKey as e:
        raise InvalidArgument(
            FIELD, f"names {_show(e.key)} twice in one object (JSON would keep only the last)"
        ) from None
    except json.JSONDecodeError as e:
        raise InvalidArgument(FIELD, f"is not valid JSON: {e.msg} at position {e.pos}") from None
    except (ValueError, RecursionError) as e:  # e.g. an integer of more than 4300 digits
        raise InvalidArgument(FIELD, f"is not valid JSON: {_short(str(e))}") from None
    counter = [0]
    return _node(tree, "", 0, counter)


class _DuplicateKey(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object; a key given twice is refused: of two conditions on one field only the last
    would count, silently."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return out


def _nesting(text: str) -> int:
    """How deep arrays and objects nest in a JSON text (brackets within strings do not count; in
    text that is not JSON, an estimate), without parsing it."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if len(brackets) <= MAX_NESTING:
        return len(brackets)  # an upper bound, and small enough
    codes = np.frombuffer(brackets.encode("ascii"), np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def _short(text: str, limit: int = _SHOWN) -> str:
    """``text`` cut to ``limit`` characters, for an error message: a request's text can be long, and
    a status whose details pass the client's metadata limit (8 KiB) reaches it as RESOURCE_EXHAUSTED."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _show(value: Any) -> str:
    return _short(repr(value))


def _fail(path: str, msg: str) -> InvalidArgument:
    return InvalidArgument(FIELD, f"at {_short(path, _SHOWN_PATH) if path else 'the top'}: {msg}")


def _node(tree: Any, path: str, depth: int, counter: list[int]) -> Mask:
    counter[0] += 1
    if depth > MAX_DEPTH or counter[0] > MAX_NODES:
        raise _fail(path, f"the filter is too large (depth {MAX_DEPTH}, {MAX_NODES} nodes at most)")
    if not isinstance(tree, dict) or not tree:
        raise _fail(path, "expected a non-empty JSON object")
    parts: list[Mask] = []
    for key, value in tree.items():
        here = f"{path}.{_short(key)}" if path else _short(key)
        if key in ("$and", "$or"):
            if not isinstance(value, list) or not value:
                raise _fail(here, "expects a non-empty list of filters")
            subs = [_node(v, f"{here}[{i}]", depth + 1, counter) for i, v in enumerate(value)]
            parts.append(_all(subs) if key == "$and" else _any(subs))
        elif key == "$not":
            parts.append(_negate(_node(value, here, depth + 1, counter)))
        elif key.startswith("$"):
            raise _fail(here, f"unknown operator {_show(key)} (use $and, $or, $not at this level)")
        else:
            parts.append(_field(key, value, here))
    return _all(parts)


def _negate(part: Mask) -> Mask:
    return lambda v, c: ~part(v, c)


def _all(parts: list[Mask]) -> Mask:
    if len(parts) == 1:
        return parts[0]

    def mask(v: ColumnsView, c: Columns) -> np.ndarray:
        out = parts[0](v, c)
        for p in parts[1:]:
            out &= p(v, c)
        return out

    return mask


def _any(parts: list[Mask]) -> Mask:
    def mask(v: ColumnsView, c: Columns) -> np.ndarray:
        out = parts[0](v, c)
        for p in parts[1:]:
            out |= p(v, c)
        return out

    return mask


def _ops(value: Any) -> dict[str, Any]:
    if isinstance(value, dict) and value and all(isinstance(k, str) and k.startswith("$") for k in value):
        return value
    return {"$eq": value}


def _field(name: str, value: Any, path: str) -> Mask:
    ops = _ops(value)
    if name == "tags":
        return _all([_tags(op, arg, f"{path}.{op}") for op, arg in ops.items()])
    if name == "tier":
        return _all([_column_op("tier", op, _tier_arg(op, arg, f"{path}.{op}")) for op, arg in ops.items()])
    if name in _NUMERIC:
        return _all(
            [_column_op(_NUMERIC[name], op, _number_arg(op, arg, f"{path}.{op}")) for op, arg in ops.items()]
        )
    if name in _TIMES:
        return _all(
            [_column_op(_TIMES[name], op, _time_arg(op, arg, f"{path}.{op}")) for op, arg in ops.items()]
        )
    if name in _INTERNED:
        return _all([_interned(_INTERNED[name], name, op, arg, f"{path}.{op}") for op, arg in ops.items()])
    if name.startswith("metadata.") and len(name) > len("metadata."):
        key = name[len("metadata.") :]
        return _all([_metadata(key, op, arg, f"{path}.{op}") for op, arg in ops.items()])
    raise _fail(
        path,
        f"unknown field {_show(name)}; fields: tags, tier, {', '.join(sorted(_NUMERIC))}, "
        f"{', '.join(sorted(_TIMES))}, {', '.join(sorted(_INTERNED))}, metadata.<key>",
    )


def _check_op(op: str, path: str, allowed: set[str]) -> None:
    if op not in allowed:
        raise _fail(
            path, f"operator {_show(op)} is not allowed here; use one of {', '.join(sorted(allowed))}"
        )


def _listed(op: str, arg: Any, path: str) -> list[Any]:
    if op in _SETS or op == "$all":
        if not isinstance(arg, list):
            raise _fail(path, f"{op} expects a list")
        if len(arg) > MAX_LIST_VALUES:  # (as a filter's own lists: each value costs a pass)
            raise _fail(path, f"{op} lists more than {MAX_LIST_VALUES} values")
        return arg
    return [arg]


def _finite(a: Any) -> float | None:
    """A JSON number as a finite float; None for anything else (booleans, NaN, Infinity, and an
    integer beyond the floats' range, which ``float`` cannot convert)."""
    if isinstance(a, bool) or not isinstance(a, int | float):
        return None
    try:
        x = float(a)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _number_arg(op: str, arg: Any, path: str) -> list[float]:
    _check_op(op, path, _COMPARE | _SETS)
    out = []
    for a in _listed(op, arg, path):
        x = _finite(a)
        if x is None:
            raise _fail(path, f"expects finite numbers, got {_show(a)}")
        out.append(x)
    return out


def _tier_arg(op: str, arg: Any, path: str) -> list[float]:
    _check_op(op, path, _COMPARE | _SETS)
    out = []
    for a in _listed(op, arg, path):
        if isinstance(a, str):
            a = _TIER_NAMES.get(a.upper().removeprefix("TIER_"), a)
        if isinstance(a, bool) or a not in (1, 2, 3, 4):
            raise _fail(path, f"expects a tier (1-4 or FAST, MEDIUM, SLOW, GLACIAL), got {_show(a)}")
        out.append(float(a))
    return out


def _time_arg(op: str, arg: Any, path: str) -> list[float]:
    _check_op(op, path, _COMPARE | _SETS)
    out = []
    for a in _listed(op, arg, path):
        x = _finite(a)
        if isinstance(a, str):
            try:
                t = dt.datetime.fromisoformat(a.upper().replace("Z", "+00:00"))
                x = (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()
            except (ValueError, OverflowError):
                x = None
        if x is None:
            raise _fail(path, f"expects epoch seconds or an RFC 3339 time, got {_show(a)}")
        out.append(x)
    return out


def _compare(col: np.ndarray, op: str, values: list[float]) -> np.ndarray:
    if np.issubdtype(col.dtype, np.integer):
        # Integer columns (counts, tier) compare in float64, exactly (counts stay far below 2**53):
        # a bound cast to the column's type would lose its fraction ({"$gte": 2.5} would keep 2) and
        # cannot hold a bound beyond int64 (OverflowError). So a bound beyond any count compares as
        # it reads: {"access_count": {"$gt": 1e300}} matches nothing, {"$lt": 1e300} everything.
        typed = np.asarray(values, dtype=np.float64)
    else:
        # Float columns compare in their precision (float32 importance stores 0.7 as 0.699999988...);
        # a bound beyond float32 becomes +-inf, which orders against every stored value as it did.
        with np.errstate(over="ignore"):
            typed = np.asarray(values, dtype=col.dtype)
    if op == "$in":
        return np.isin(col, typed)
    if op == "$nin":
        return ~np.isin(col, typed)
    x = typed[0]
    return {
        "$eq": col == x,
        "$ne": col != x,
        "$gt": col > x,
        "$gte": col >= x,
        "$lt": col < x,
        "$lte": col <= x,
    }[op]


def _column_op(column: str, op: str, values: list[float]) -> Mask:
    return lambda v, c: _compare(getattr(v, column), op, values)


def _interned(table: str, name: str, op: str, arg: Any, path: str) -> Mask:
    _check_op(op, path, {"$eq", "$ne", "$in", "$nin"})
    values = _listed(op, arg, path)
    for a in values:
        if not isinstance(a, str):
            raise _fail(path, f"{name} values are strings, got {_show(a)}")
    column = {"kinds": "kind", "sources": "source", "topics": "topic"}[table]

    def mask(v: ColumnsView, c: Columns) -> np.ndarray:
        ids = [getattr(c, table).get(a) for a in values]
        hit = np.isin(getattr(v, column), [i for i in ids if i >= 0])
        return ~hit if op in ("$ne", "$nin") else hit

    return mask


def _tags(op: str, arg: Any, path: str) -> Mask:
    _check_op(op, path, {"$eq", "$ne", "$in", "$nin", "$all"})
    if op == "$eq" and isinstance(arg, list):
        op = "$all"  # {"tags": ["a", "b"]}: has these tags, every one of them
    values = _listed(op, arg, path)
    if op == "$all" and not values:  # (a list built from nothing would let every memory through)
        raise _fail(path, "all of no tags holds for every memory: leave the condition out instead")
    for a in values:
        if not isinstance(a, str):
            raise _fail(path, f"tags are strings, got {_show(a)}")

    def mask(v: ColumnsView, c: Columns) -> np.ndarray:
        m = c.tag_mask(values, v.n, require_all=op == "$all")
        return ~m if op in ("$ne", "$nin") else m

    return mask


def _compare_exactly(
    op: str,
    col: np.ndarray,
    exact: np.ndarray | None,
    numbers: list[Any],
    floats: list[float],
    res: np.ndarray,
) -> None:
    """Compare again, in Python's exact arithmetic, the rows float64 could have got wrong: those
    whose value's float equals a wanted number's (``floats``, of ``numbers``), where either is an
    integer past 2^53 (a strict float comparison is right whatever the rounding, which keeps order)."""
    near = np.isin(col, floats) & (np.abs(col) >= EXACT_INT)
    order = _ORDER.get(op)
    for i in np.flatnonzero(near):
        value = col[i].item() if exact is None else exact[i]  # (None: the stored numbers are exact floats)
        res[i] = order(value, numbers[0]) if order is not None else any(value == w for w in numbers)


def _metadata(key: str, op: str, arg: Any, path: str) -> Mask:
    _check_op(op, path, _COMPARE | _SETS)
    values = _listed(op, arg, path)
    for a in values:
        if not isinstance(a, str | bool) and _finite(a) is None:
            raise _fail(path, f"metadata values are strings, finite numbers or booleans, got {_show(a)}")
    if (
        op not in ("$eq", "$ne", "$in", "$nin")
        and not all(isinstance(a, int | float) and not isinstance(a, bool) for a in values)
        and not all(isinstance(a, str) for a in values)
    ):
        raise _fail(path, f"{op} compares numbers with numbers or strings with strings")

    # The operator's values by type; each compares only with stored values of its type.
    numbers = [a for a in values if isinstance(a, int | float) and not isinstance(a, bool)]
    groups: dict[int, list[Any]] = {
        0: [a for a in values if isinstance(a, bool)],
        1: [float(a) for a in numbers],
        2: [a for a in values if isinstance(a, str)],
    }
    inexact = not all(exact_float(a) for a in numbers)  # an integer past 2^53 among them

    def mask(v: ColumnsView, c: Columns) -> np.ndarray:
        arr = c.metadata_arrays(key)
        found = []  # rows whose value of the key satisfies the comparison
        for k, wanted in groups.items():
            rows, col = arr.rows[k], arr.values[k]
            if not wanted or not rows.shape[0]:
                continue
            exact = arr.exact if k == 1 else None
            if arr.max_row >= v.n:  # a view older than the arrays: rows past it are not in it
                keep = rows < v.n
                rows, col = rows[keep], col[keep]
                exact = None if exact is None else exact[keep]
            if op in ("$in", "$nin", "$eq", "$ne"):
                res = np.isin(col, np.array(wanted, dtype=col.dtype))
            else:
                # (a string as a 0-d object array: as a bare str NumPy would make it a np.str_,
                # which drops trailing NULs, and "a\x00" would compare as "a")
                bound = np.array(wanted[0], dtype=object) if k == 2 else wanted[0]
                res = np.asarray(_ORDER[op](col, bound), np.bool_)
            if k == 1 and (inexact or exact is not None):
                _compare_exactly(op, col, exact, numbers, wanted, res)
            found.append(rows[res])
        if op in ("$ne", "$nin"):  # a memory without the key (or with another type) is "not equal"
            out = np.ones(v.n, np.bool_)
            for hit in found:
                out[hit] = False
            return out
        out = np.zeros(v.n, np.bool_)
        for hit in found:
            out[hit] = True
        return out

    return mask
