"""A search's ``filter`` on value fields: its server part (a tiermem ``where`` on the ``value.<field>``
metadata that values.py copies) and its exact check in the client. Pure functions, no I/O.

Semantics (LangGraph's in-memory store's, with JSON's types): ``{"field": x}`` and ``$eq`` mean equal
(objects and arrays compared whole; ``true`` is not ``1``); ``$ne`` not equal (a missing field is not
equal to anything but null); ``$gt``, ``$gte``, ``$lt``, ``$lte`` compare numbers with numbers and
strings with strings, and nothing else matches; ``{"field": {"sub": x}}`` (no operators) matches an
object field whose ``sub`` matches ``x``; an array matches an array of matching elements.

The server applies every condition on a top-level field with a scalar operand it can hold (strings
up to 512 bytes, booleans, finite numbers, integers within 2**53; no ordering of booleans); the rest
(nested objects, arrays, null, longer strings) are checked in the client only, on what the server
returns. The server part never drops an item the client check keeps (items whose scalars could not
all be copied pass it), and the client check always runs, so results are exact either way."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .values import UNMIRRORED, field_key, mirrorable

OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})
_ORDER = {"$gt", "$gte", "$lt", "$lte"}


def _operators(condition: Any) -> dict[str, Any] | None:
    """The operators of a condition (``{"$gt": 3}``), ``{"$eq": x}`` for a plain scalar, None for a
    nested object or an array (checked in the client only). Unknown operators are a ValueError."""
    if isinstance(condition, dict):
        if not any(isinstance(k, str) and k.startswith("$") for k in condition):
            return None
        unknown = sorted(str(k) for k in condition if k not in OPERATORS)
        if unknown:
            raise ValueError(
                f"unsupported filter operator {unknown[0]!r}; use {', '.join(sorted(OPERATORS))}"
            )
        return condition
    if isinstance(condition, list | tuple):
        return None
    return {"$eq": condition}


def server_where(flt: Mapping[str, Any] | None) -> tuple[list[dict[str, Any]], bool]:
    """The conditions of ``flt`` tiermem can apply (each on ``metadata.value.<field>``), and whether
    that is all of it."""
    conditions: list[dict[str, Any]] = []
    complete = True
    for field, condition in (flt or {}).items():
        ops = _operators(condition)
        key = field_key(field) if isinstance(field, str) else None
        if ops is None or key is None:
            complete = False
            continue
        for op, operand in ops.items():
            if mirrorable(operand) and not (op in _ORDER and isinstance(operand, bool)):
                conditions.append({f"metadata.{key}": {op: operand}})
            else:
                complete = False
    return conditions, complete


def where(
    flt: Mapping[str, Any] | None, *, extra: Sequence[Mapping[str, Any]] = ()
) -> tuple[Mapping[str, Any] | None, bool]:
    """The tiermem ``where`` of a search (the filter's server part, items flagged unmirrored let
    through, and ``extra`` conditions) and whether the server applies the whole filter."""
    conditions, complete = server_where(flt)
    parts: list[Mapping[str, Any]] = list(extra)
    if conditions:
        matched = conditions[0] if len(conditions) == 1 else {"$and": conditions}
        parts.append({"$or": [{f"metadata.{UNMIRRORED}": True}, matched]})
    if not parts:
        return None, complete
    return (parts[0] if len(parts) == 1 else {"$and": parts}), complete


def matches(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Whether ``value`` passes ``flt`` (the module's semantics)."""
    return all(_compare(value.get(field), condition) for field, condition in (flt or {}).items())


def _compare(item: Any, condition: Any) -> bool:
    ops = _operators(condition)
    if ops is not None:
        return all(_apply(item, op, operand) for op, operand in ops.items())
    if isinstance(condition, dict):
        return isinstance(item, dict) and all(_compare(item.get(k), v) for k, v in condition.items())
    return (
        isinstance(item, list | tuple)
        and len(item) == len(condition)
        and all(_compare(i, c) for i, c in zip(item, condition, strict=True))
    )


def _apply(item: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return equal(item, operand)
    if op == "$ne":
        return not equal(item, operand)
    if not (_both_numbers(item, operand) or (isinstance(item, str) and isinstance(operand, str))):
        return False
    if op == "$gt":
        return bool(item > operand)
    if op == "$gte":
        return bool(item >= operand)
    if op == "$lt":
        return bool(item < operand)
    return bool(item <= operand)


def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _both_numbers(a: Any, b: Any) -> bool:
    return _is_number(a) and _is_number(b)


def equal(a: Any, b: Any) -> bool:
    """JSON equality: booleans are not numbers; objects and arrays compare element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _both_numbers(a, b):
        return bool(a == b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list | tuple) or isinstance(b, dict | list | tuple):
        return False
    return bool(a == b)
