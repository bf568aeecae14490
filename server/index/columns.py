"""In-memory columns of the per-record fields that kernels read, one row per record.

Rows are assigned in creation order and never reused while the process runs, so a row seen by a
concurrent search always refers to the same record (a dead row stays dead). Only the writer thread
mutates; readers take ``view()``, a consistent set of array references (growth swaps in new arrays,
it never resizes one in place). The columns are derived from LMDB at start-up.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiermem.server.config import Tuning
from tiermem.server.model.records import Record
from tiermem.server.model.types import Under

_CHANGE_LOG = Tuning().columns_change_log
EXACT_INT = 2**53  # float64 holds every integer up to this exactly, not all past it
# Distinct metadata-key (and tag) tuples shared between rows: one object each instead of one a row.
# Beyond this many a table, or this long, a row keeps its own: sets unique to each memory gain
# nothing from sharing, and a table keeps the sets of deleted memories (bounded so).
KEYSETS_MAX = 4096
KEYSET_CHARS = 256
_ABSENT = object()


def exact_float(v: Any) -> bool:
    """Whether float64 holds number ``v`` exactly (every float; an integer up to 2^53)."""
    return not isinstance(v, int) or -EXACT_INT <= v <= EXACT_INT


_SPEC: dict[str, tuple[type, float | int | bool]] = {
    "alive": (np.bool_, False),
    "ns": (np.int32, -1),
    "tier": (np.int8, 0),
    "kind": (np.int32, -1),
    "source": (np.int32, -1),
    "topic": (np.int32, -1),
    "space": (np.int32, -1),
    "vpos": (np.int64, -1),
    "importance": (np.float32, 0.0),
    "created": (np.float64, 0.0),
    "accessed": (np.float64, 0.0),
    "access_count": (np.int64, 0),
    "surprise": (np.float32, 0.0),
    "success": (np.int64, 0),
    "expire": (np.float64, np.inf),
    "rid": (np.int64, 0),
    "tier_since": (np.float64, 0.0),
    "updated": (np.float64, 0.0),
    "access_base": (np.int64, 0),
    "success_base": (np.int64, 0),
    "gen": (np.int64, 0),  # bumped by every change of the row (search.PriorBounds relies on it)
    "vk": (np.int64, 0),  # the record's vector key (maps the row to its HNSW snapshot entry)
    "tokens": (np.int32, 0),  # the record's estimated tokens (token_cost)
}


def _shared(table: dict[tuple[str, ...], tuple[str, ...]], keys: tuple[str, ...]) -> tuple[str, ...]:
    """The tuple equal to ``keys`` that ``table`` shares, entered if there is room."""
    got = table.get(keys)
    if got is None:
        if len(table) >= KEYSETS_MAX or sum(map(len, keys)) > KEYSET_CHARS:
            return keys
        table[keys] = got = keys
    return got


def _by_new_rows(by_row: dict[int, Any]) -> Iterator[tuple[int, Any]]:
    """The (row, value) pairs of a decoded snapshot's map, the rows as new objects: kept, the decoded
    ones would hold pieces of the decoded tree, freed otherwise, scattered over the heap's pages."""
    return zip(np.fromiter(by_row, np.int64, len(by_row)).tolist(), by_row.values(), strict=True)


class Interner:
    """Maps strings to dense ids (and back) for columns and lookup tables."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.names: list[str] = []

    def id(self, name: str) -> int:
        i = self.ids.get(name)
        if i is None:
            i = len(self.names)
            self.names.append(name)  # before publishing the id: a reader holding it finds the name
            self.ids[name] = i
        return i

    def get(self, name: str) -> int:
        return self.ids.get(name, -1)

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True)
class ColumnsView:
    """A consistent snapshot of array references (rows [0, n))."""

    n: int
    alive: np.ndarray
    ns: np.ndarray
    tier: np.ndarray
    kind: np.ndarray
    source: np.ndarray
    topic: np.ndarray
    space: np.ndarray
    vpos: np.ndarray
    importance: np.ndarray
    created: np.ndarray
    accessed: np.ndarray
    access_count: np.ndarray
    surprise: np.ndarray
    success: np.ndarray
    expire: np.ndarray
    rid: np.ndarray
    tier_since: np.ndarray
    updated: np.ndarray
    access_base: np.ndarray
    success_base: np.ndarray
    gen: np.ndarray
    vk: np.ndarray
    tokens: np.ndarray


@dataclass(frozen=True)
class MetadataArrays:
    """One metadata key over the rows that have it, split by the value's kind (0 bool, 1 number,
    2 string): ``rows[k]`` and ``values[k]`` are parallel arrays (bool, float64, object)."""

    rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    values: tuple[np.ndarray, np.ndarray, np.ndarray]
    max_row: int  # the highest row of any kind, -1 when none has the key
    # The numbers as stored (Python ints and floats) when one is an integer past 2^53, which float64
    # cannot hold exactly (None otherwise): filters compare those rows again with them.
    exact: np.ndarray | None = None


class Columns:
    """The columns of every record; ``change_log``: how many row refreshes ``changed_since`` can
    answer for (``Tuning.columns_change_log``)."""

    def __init__(self, capacity: int = 1024, change_log: int = _CHANGE_LOG) -> None:
        self.n = 0
        self._arrays: dict[str, np.ndarray] = {
            name: np.full(capacity, fill, dtype) for name, (dtype, fill) in _SPEC.items()
        }
        self._view = self._make_view()
        self.rows: dict[int, int] = {}  # rid -> row
        self.namespaces = Interner()
        self.kinds = Interner()
        self.sources = Interner()
        self.topics = Interner()
        self.ns_counts: dict[str, int] = {}
        self._ns_sorted: list[str] = []  # names with live memories, sorted (guarded by _ns_lock)
        self._ns_lock = threading.Lock()
        self.tags: dict[str, set[int]] = {}  # tag -> rows of live records carrying it
        self._row_tags: dict[int, tuple[str, ...]] = {}
        self.metadata: dict[str, dict[int, Any]] = {}  # key -> {row: value} of live records
        self._meta_version: dict[str, int] = {}  # bumped whenever a key's values change
        self._meta_arrays: dict[str, tuple[int, MetadataArrays]] = {}
        self._row_meta: dict[int, tuple[str, ...]] = {}  # row -> its metadata keys (values: ``metadata``)
        self._shared_keys: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._shared_tags: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.max_importance = 0.0  # the highest importance any row has had (never lowered): a bound
        self.changes = 0  # rows refreshed by ``set`` so far (search.PriorBounds: how stale its bounds are)
        # The rows of the last ``change_log_size`` refreshes, entry i at _change_log[i % size]; each
        # is written before its row's generation moves (see ``changed_since``).
        self.change_log_size = change_log
        self._change_log = np.zeros(change_log, np.int64)
        self._set_lock = threading.Lock()  # one ``set`` at a time against ``generations``
        self.earliest_expire = np.inf  # no row expires before this (never raised): expiry checks skip
        # Moves after any change a row mask can see (a refresh, a removal, rows published): a mask
        # computed between two equal readings of it is still current (see masks.MaskCache).
        self.epoch = 0

    def _make_view(self) -> ColumnsView:
        return ColumnsView(n=self.n, **{k: v[: self.n] for k, v in self._arrays.items()})

    def view(self) -> ColumnsView:
        return self._view

    def __len__(self) -> int:
        return len(self.rows)

    def _grow(self, need: int) -> None:
        cap = next(iter(self._arrays.values())).shape[0]
        if need <= cap:
            return
        new_cap = max(need, cap * 2)
        for name, (dtype, fill) in _SPEC.items():
            grown: np.ndarray = np.full(new_cap, fill, dtype)
            grown[: self.n] = self._arrays[name][: self.n]
            self._arrays[name] = grown
        self._view = self._make_view()  # readers must not keep arrays that no longer get updates

    def add(self, rec: Record, space: int) -> int:
        """Append a hidden row for ``rec``; ``activate`` makes it visible once its vector is indexed."""
        row = self.n
        self._grow(row + 1)
        a = self._arrays
        a["rid"][row] = rec.rid
        a["ns"][row] = self.namespaces.id(rec.namespace)
        a["created"][row] = rec.created_at
        self.n = row + 1
        self.rows[rec.rid] = row
        count = self.ns_counts.get(rec.namespace, 0) + 1
        self.ns_counts[rec.namespace] = count
        if count == 1:
            with self._ns_lock:
                bisect.insort(self._ns_sorted, rec.namespace)
        self.set(row, rec, space, -1)
        a["alive"][row] = False
        return row

    def relocate(self, rows: np.ndarray, vpos: np.ndarray) -> None:
        """New vector locations of rows (their index was compacted, or -1: their entry is gone).
        Views share the array: readers see the change at once."""
        self._arrays["vpos"][rows] = vpos

    def activate(self, rows: np.ndarray, vpos: np.ndarray) -> None:
        """Set the vector locations of new rows, then publish them to readers."""
        self.relocate(rows, vpos)
        self._arrays["alive"][rows] = True
        self._view = self._make_view()
        self.epoch += 1

    def is_live(self, view: ColumnsView) -> bool:
        """Whether ``view`` still shares the columns' arrays (growth leaves older views frozen)."""
        return view.gen.base is self._arrays["gen"]

    def generations(self, view: ColumnsView) -> tuple[int, np.ndarray]:
        """(``changes``, a copy of ``view``'s generations), taken together: every refresh logged
        before that count is complete in the copy, every later one moves a generation past it.
        ``changes`` is -1 when the view is frozen (growth replaced the arrays: later refreshes do
        not reach it, so the log says nothing about it). Checked after the copy: growth cannot be
        undone, so a view still live then was live during the copy."""
        with self._set_lock:
            changes, gen = self.changes, view.gen.copy()
        return (changes if self.is_live(view) else -1), gen

    def changed_since(self, start: int) -> tuple[np.ndarray, int] | None:
        """(the change log, ``changes``) when it still holds every row refreshed from the
        ``start``-th refresh on (entries start..changes-1 at index i % change_log_size), else None. A
        row whose generation a reader sees moved is logged by then: its entry is written first.
        The ring holds change_log_size - 1 entries safely: a refresh in progress may have written the
        next slot before counting it."""
        end = self.changes
        if end - start >= self.change_log_size or end < start:
            return None
        return self._change_log, end

    def set(self, row: int, rec: Record, space: int, vpos: int) -> None:
        """Refresh the mutable fields of a live row from its record."""
        with self._set_lock:
            self._set(row, rec, space, vpos)

    def _set(self, row: int, rec: Record, space: int, vpos: int) -> None:
        a = self._arrays
        gen = a["gen"]
        self._change_log[self.changes % self.change_log_size] = row  # logged before the generation moves
        self.changes += 1
        gen[row] += 1  # before and after the change: a reader that copied the generation mid-change
        if rec.importance > self.max_importance:  # raised before the column: it bounds every row
            self.max_importance = float(rec.importance)
        a["tier"][row] = rec.tier
        a["kind"][row] = self.kinds.id(rec.kind)
        a["source"][row] = self.sources.id(rec.source)
        a["topic"][row] = self.topics.id(rec.topic)
        a["space"][row] = space
        a["vpos"][row] = vpos
        a["importance"][row] = rec.importance
        a["accessed"][row] = rec.accessed_at
        a["access_count"][row] = rec.access_count
        a["surprise"][row] = rec.surprise
        a["success"][row] = rec.success_count
        a["expire"][row] = np.inf if rec.expire_at is None else rec.expire_at
        a["tier_since"][row] = rec.tier_since or rec.created_at
        a["updated"][row] = rec.updated_at
        a["tokens"][row] = min(rec.token_cost, np.iinfo(np.int32).max)
        self._set_meta(row, rec.metadata)
        a["vk"][row] = rec.vk
        a["access_base"][row] = rec.access_base
        a["success_base"][row] = rec.success_base
        old = self._row_tags.get(row, ())
        new = _shared(self._shared_tags, tuple(rec.tags))
        if old != new:
            for t in old:
                rows = self.tags.get(t)
                if rows is not None:
                    rows.discard(row)
                    if not rows:
                        del self.tags[t]
            for t in new:
                self.tags.setdefault(t, set()).add(row)
            self._row_tags[row] = new
        if rec.expire_at is not None and rec.expire_at < self.earliest_expire:
            self.earliest_expire = float(rec.expire_at)
        gen[row] += 1  # ... sees it move again, so bounds computed from half-written fields are discarded
        self.epoch += 1

    def _set_meta(self, row: int, meta: dict[str, Any]) -> None:
        old = self._row_meta.get(row, ())
        for k in old:
            if k not in meta:
                self._drop_meta(k, row)
        for k, v in meta.items():
            rows = self.metadata.setdefault(k, {})
            was = rows.get(row, _ABSENT)
            # (by type too: 1 == True == 1.0, but filters tell a number from a boolean)
            if was is _ABSENT or type(was) is not type(v) or was != v:
                rows[row] = v
                self._meta_version[k] = self._meta_version.get(k, 0) + 1
        keys = tuple(meta)
        if keys != old:
            if keys:
                self._row_meta[row] = _shared(self._shared_keys, keys)
            else:
                self._row_meta.pop(row, None)

    def _row_meta_dicts(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for row, keys in self._row_meta.items():
            out[row] = {k: self.metadata[k][row] for k in keys}
        return out

    # -- snapshots (writer thread: nothing changes while the state is copied) --------------------
    def state(self) -> dict[str, Any]:
        """A copy of everything the rows hold, for ``restore`` (see engine.Engine.snapshot)."""
        rids = np.fromiter(self.rows.keys(), np.int64, len(self.rows))
        rows = np.fromiter(self.rows.values(), np.int64, len(self.rows))
        return {
            "n": self.n,
            "arrays": {k: v[: self.n].copy() for k, v in self._arrays.items()},
            "rows": (rids, rows),
            "interners": {
                name: list(getattr(self, name).names) for name in ("namespaces", "kinds", "sources", "topics")
            },
            "row_tags": dict(self._row_tags),
            "row_meta": self._row_meta_dicts(),
            "max_importance": self.max_importance,
            "earliest_expire": self.earliest_expire,
        }

    @classmethod
    def restore(cls, state: dict[str, Any], change_log: int = _CHANGE_LOG) -> Columns:
        """Columns from ``state()``; derived indexes (namespace counts, tags, metadata) are rebuilt.
        The change log starts empty (counted from 0)."""
        n = int(state["n"])
        cols = cls(max(1024, n), change_log)
        for name, (dtype, _) in _SPEC.items():
            saved = state["arrays"].get(name)
            if saved is not None:
                cols._arrays[name][:n] = saved.astype(dtype, copy=False)
        cols.n = n
        for name, names in state["interners"].items():
            interner = getattr(cols, name)
            for value in names:
                interner.id(value)
        rids, rows = state["rows"]
        cols.rows = dict(zip(rids.tolist(), rows.tolist(), strict=True))
        ns_names = cols.namespaces.names
        counts = np.bincount(cols._arrays["ns"][rows], minlength=len(ns_names))
        cols.ns_counts = {ns_names[i]: int(c) for i, c in enumerate(counts.tolist()) if c}
        cols._ns_sorted = sorted(cols.ns_counts)
        cols._row_tags = {
            row: _shared(cols._shared_tags, tuple(tags)) for row, tags in _by_new_rows(state["row_tags"])
        }
        for row, tags in cols._row_tags.items():
            for t in tags:
                cols.tags.setdefault(t, set()).add(row)
        values, keys_of, table = cols.metadata, cols._row_meta, cols._shared_keys
        for row, meta in _by_new_rows(state["row_meta"]):
            if meta:  # (new columns: nothing to compare with or drop, no version to move)
                for k, v in meta.items():
                    values.setdefault(k, {})[row] = v
                keys_of[row] = _shared(table, tuple(meta))
        cols.max_importance = float(state["max_importance"])
        cols.earliest_expire = float(state["earliest_expire"])
        cols._view = cols._make_view()
        return cols

    def column(self, name: str) -> np.ndarray:
        """Rows [0, n) of one column, including rows not yet published to views (start-up)."""
        return self._arrays[name][: self.n]

    def namespace_of(self, row: int) -> str:
        return self.namespaces.names[int(self._arrays["ns"][row])]

    def metadata_arrays(self, key: str) -> MetadataArrays:
        """A key's values as arrays (cached until the key's values change), for vectorized filters."""
        version = self._meta_version.get(key, 0)
        cached = self._meta_arrays.get(key)
        if cached is not None and cached[0] == version:
            return cached[1]
        split: tuple[list[int], list[int], list[int]] = ([], [], [])
        vals: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        for row, v in list(self.metadata.get(key, {}).items()):
            k = 0 if isinstance(v, bool) else 1 if isinstance(v, int | float) else 2
            split[k].append(row)
            vals[k].append(v)
        rows = (np.array(split[0], np.int64), np.array(split[1], np.int64), np.array(split[2], np.int64))
        arrays = MetadataArrays(
            rows=rows,
            values=(
                np.array(vals[0], np.bool_),
                np.array([float(v) for v in vals[1]], np.float64),
                np.array(vals[2], dtype=object),
            ),
            max_row=max((int(r.max()) for r in rows if r.shape[0]), default=-1),
            exact=np.array(vals[1], dtype=object) if any(not exact_float(v) for v in vals[1]) else None,
        )
        self._meta_arrays[key] = (version, arrays)
        return arrays

    def _drop_meta(self, key: str, row: int) -> None:
        rows = self.metadata.get(key)
        if rows is not None:
            rows.pop(row, None)
            if not rows:
                del self.metadata[key]
        # (after the value went: a reader that sees the new version cannot have read it, and
        # cache arrays holding it under that version)
        self._meta_version[key] = self._meta_version.get(key, 0) + 1

    def remove(self, rid: int, namespace: str) -> int:
        row = self.rows.pop(rid)
        self._arrays["alive"][row] = False
        self.epoch += 1
        for k in self._row_meta.pop(row, ()):
            self._drop_meta(k, row)
        for t in self._row_tags.pop(row, ()):
            rows = self.tags.get(t)
            if rows is not None:
                rows.discard(row)
                if not rows:
                    del self.tags[t]
        left = self.ns_counts[namespace] - 1
        if left:
            self.ns_counts[namespace] = left
        else:
            del self.ns_counts[namespace]
            with self._ns_lock:
                self._ns_sorted.pop(bisect.bisect_left(self._ns_sorted, namespace))
        return row

    def namespaces_under(self, under: Under) -> frozenset[str]:
        """The names with live memories that ``under`` covers (found by bisection)."""
        with self._ns_lock:
            return frozenset(under.within(self._ns_sorted))

    def namespaces_page_under(
        self, under: Under, prefix: str, after: str, size: int
    ) -> tuple[list[tuple[str, int]], bool]:
        """``namespaces_page`` of the names ``under`` covers, read from their ranges of the sorted
        names: a page costs its own names, however many others lie between them."""
        with self._ns_lock:
            names = self._ns_sorted
            lo = bisect.bisect_right(names, after) if after >= prefix else bisect.bisect_left(names, prefix)
            page: list[tuple[str, int]] = []
            for i, j in under.spans(names):
                for k in range(max(i, lo), j):
                    if not names[k].startswith(prefix):  # (past lo, none after it has the prefix)
                        return page, False
                    if len(page) == size:
                        return page, True
                    page.append((names[k], self.ns_counts.get(names[k], 0)))
            return page, False

    def namespaces_page(self, prefix: str, after: str, size: int) -> tuple[list[tuple[str, int]], bool]:
        """Up to ``size`` (name, count) with ``prefix``, names > ``after``; and whether more follow."""
        with self._ns_lock:
            names = self._ns_sorted
            i = bisect.bisect_right(names, after) if after >= prefix else bisect.bisect_left(names, prefix)
            page: list[tuple[str, int]] = []
            while i < len(names) and names[i].startswith(prefix) and len(page) < size:
                page.append((names[i], self.ns_counts.get(names[i], 0)))
                i += 1
            return page, i < len(names) and names[i].startswith(prefix)

    def tag_mask(self, tags: list[str], n: int, require_all: bool) -> np.ndarray:
        """Rows [0, n) carrying any (or all) of ``tags``."""
        mask = np.ones(n, np.bool_) if require_all else np.zeros(n, np.bool_)
        for t in tags:
            # list() copies the set atomically under the GIL while the writer may be changing it.
            rows = np.fromiter(list(self.tags.get(t, ())), np.int64)
            rows = rows[rows < n]
            if require_all:
                m = np.zeros(n, np.bool_)
                m[rows] = True
                mask &= m
            else:
                mask[rows] = True
        return mask
