"""The argument checks every public kernel wrapper runs before a kernel sees an array (Numba checks no
bounds or types at run time)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


def _check(name: str, a: np.ndarray, dtype: type, n: int | None = None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.dtype(dtype):
        raise ValueError(f"{name} must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be contiguous")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must have length {n}, got {a.shape[0]}")
    return a


def _table(name: str, table: np.ndarray | list[Any], dtype: type, width: int | None = 5) -> np.ndarray:
    """A per-namespace lookup table: (namespaces, width) or, with width None, (namespaces,)."""
    t: np.ndarray = np.ascontiguousarray(table, dtype=dtype)
    if width is None:
        if t.ndim != 1 or t.shape[0] == 0:
            raise ValueError(f"{name} must be a non-empty 1-D table indexed by namespace id")
    elif t.ndim != 2 or t.shape[1] != width or t.shape[0] == 0:
        raise ValueError(f"{name} must have shape (namespaces, {width})")
    if t.dtype.kind == "f" and np.any(np.isnan(t)):
        raise ValueError(f"{name} must not hold NaN")
    return t


def _half_life_table(half_life_hours: np.ndarray | list[Any]) -> np.ndarray:
    """One row of 5 (every namespace) or a (namespaces, 5) table, as float64."""
    hl = np.asarray(half_life_hours, dtype=np.float64)
    return _table("half_life_hours", hl.reshape(1, -1) if hl.ndim == 1 else hl, np.float64)


def _floor_table(floor: float | np.ndarray, rows: int) -> np.ndarray:
    """The decay floor per namespace, float64 (rows,): one value for all, or a table of that length."""
    if np.ndim(floor) == 0:
        if not 0.0 <= float(floor) <= 1.0:  # (NaN fails too)
            raise ValueError("floor must be in [0, 1]")
        return np.full(rows, float(floor), np.float64)
    t = _table("floor", floor, np.float64, None)  # type: ignore[arg-type]
    if t.shape[0] != rows:
        raise ValueError("floor must have one entry per row of the half-life table")
    return t


class ScoreTables(NamedTuple):
    """A half-life table and its floor table as the kernels read them, checked once when built
    (``score_tables``): a caller that scores rows with the same policy at every search passes these
    instead of checking its tables again each time."""

    half_life: np.ndarray  # float64, (namespaces, 5), or (1, 5) for every namespace
    floor: np.ndarray  # float64, one per row of half_life


def score_tables(half_life_hours: np.ndarray | list[Any], floor: float | np.ndarray) -> ScoreTables:
    """``half_life_hours`` and ``floor`` (as the scoring kernels take them) checked, as ScoreTables. The
    caller must not change the arrays afterwards."""
    hl = _half_life_table(half_life_hours)
    return ScoreTables(hl, _floor_table(floor, hl.shape[0]))


def score_columns(
    importance: np.ndarray,
    created_at: np.ndarray,
    last_access: np.ndarray,
    tier: np.ndarray,
    tau_seconds: float,
    half_life_hours: np.ndarray | list[Any] | ScoreTables,
    floor: float | np.ndarray | None,
    ns: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The columns and tables a row's recency and decayed importance are read from, checked:
    returns (half-life table, floor table, namespace column; a one-entry placeholder when the
    half-life table has one row for every namespace). ``half_life_hours`` may be ScoreTables (then
    ``floor`` is None: the tables hold it)."""
    n = _check("importance", importance, np.float32).shape[0]
    _check("created_at", created_at, np.float64, n)
    _check("last_access", last_access, np.float64, n)
    _check("tier", tier, np.int8, n)
    if not tau_seconds > 0:
        raise ValueError("tau_seconds must be > 0")
    if isinstance(half_life_hours, ScoreTables):
        if floor is not None:
            raise ValueError("floor must be None with ScoreTables (they hold the floor table)")
        hl, fl = half_life_hours  # (their values checked when built; their shapes, which bound reads, here)
        if not _shaped(hl, (hl.shape[0], 5)) or hl.shape[0] == 0 or not _shaped(fl, (hl.shape[0],)):
            raise ValueError("ScoreTables must come from score_tables()")
    else:
        if floor is None:
            raise ValueError("floor is required with a half_life_hours table")
        hl = _half_life_table(half_life_hours)
        fl = _floor_table(floor, hl.shape[0])
    if hl.shape[0] > 1:
        if ns is None:
            raise ValueError("ns is required with a per-namespace half_life_hours table")
        _check("ns", ns, np.int32, n)
    else:
        ns = _ONE_NAMESPACE
    return hl, fl, ns


def _shaped(a: np.ndarray, shape: tuple[int, ...]) -> bool:
    return isinstance(a, np.ndarray) and a.dtype == np.float64 and a.shape == shape and a.flags.c_contiguous


_ONE_NAMESPACE = np.zeros(1, np.int32)  # (the kernels read ns only with a per-namespace table)
