"""Soft counters the engine keeps in memory: search hit rates per namespace, accesses waiting to be
committed, and lifecycle totals with the last hour's events. Each guards itself: searches,
the writer thread, followers' reports and stats read and change them concurrently."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from tiermem.server.model.types import Under, insort_new, remove_sorted
from tiermem.server.storage.lifecycle_counters import RETIRED

# Which namespaces a figure counts: "" every one, a name that one, a predicate those it accepts
# (``Under``, an API key's namespaces: read from each table's sorted names, not by asking the
# predicate about every name the table holds).
Selection = str | Callable[[str], bool]


def selected(sel: Selection, namespace: str) -> bool:
    if callable(sel):
        return sel(namespace)
    return not sel or namespace == sel


PRUNE_SECONDS = 10.0  # a full table of hit counts drops the names holding no memory at most this often


class SearchCounts:
    """Hit rate: a search "hits" a namespace when it returns some of it, and "misses" it otherwise.
    Namespaces past ``most`` are counted in the server's figures only (searches may name any
    names: each would keep an entry). Once full, the entries of namespaces ``holds`` says hold no
    memory (names searched but never written, or emptied) make room for a name that holds some:
    searches of made-up names cannot keep other namespaces' searches from being counted."""

    def __init__(self, most: int = 100_000, holds: Callable[[str], bool] | None = None) -> None:
        self.most = most
        self.holds = holds
        self._pruned = -PRUNE_SECONDS  # when the table was last pruned (time.monotonic) ...
        self._freed = True  # ... and whether that made room
        self._lock = threading.Lock()
        self._by_namespace: dict[str, list[int]] = {}  # namespace -> [hits, misses]
        self._names: list[str] = []  # its keys, sorted
        self._total = [0, 0]  # [searches returning something, searches returning nothing]

    def count(self, namespaces: Iterable[str], found: set[str], any_hit: bool) -> None:
        with self._lock:
            self._total[0 if any_hit else 1] += 1
            for ns in set(namespaces):
                if (counts := self._entry(ns)) is not None:
                    counts[0 if ns in found else 1] += 1

    def hits_misses(self, namespace: Selection = "") -> tuple[int, int]:
        """A namespace's [hits, misses], every search's (``""``), or the sums over the namespaces
        a predicate accepts."""
        with self._lock:
            if isinstance(namespace, Under):
                rows = [self._by_namespace[ns] for ns in namespace.within(self._names)]
                return sum(r[0] for r in rows), sum(r[1] for r in rows)
            if callable(namespace):
                rows = [c for ns, c in self._by_namespace.items() if namespace(ns)]
                return sum(r[0] for r in rows), sum(r[1] for r in rows)
            hits, misses = self._by_namespace.get(namespace, [0, 0]) if namespace else self._total
        return hits, misses

    def _entry(self, namespace: str) -> list[int] | None:
        """The namespace's [hits, misses], made if there is room (under the lock)."""
        counts = self._by_namespace.get(namespace)
        full = len(self._by_namespace) >= self.most
        holds = self.holds
        if counts is None and full and holds is not None and holds(namespace):
            # (a pass over the table, for a name holding memories: again at once while the last
            # one freed room, else not for every such name)
            now = time.monotonic()
            if self._freed or now - self._pruned >= PRUNE_SECONDS:
                self._by_namespace = {ns: c for ns, c in self._by_namespace.items() if holds(ns)}
                self._names = sorted(self._by_namespace)
                self._pruned, self._freed = now, len(self._by_namespace) < self.most
        if counts is None and len(self._by_namespace) < self.most:
            counts = self._by_namespace[namespace] = [0, 0]
            insort_new(self._names, namespace)
        return counts

    def forget(self, namespaces: set[str]) -> None:
        """Drop deleted namespaces' counts (the totals keep them)."""
        with self._lock:
            for ns in namespaces:
                if self._by_namespace.pop(ns, None) is not None:
                    remove_sorted(self._names, ns)

    def take(self) -> tuple[dict[str, list[int]], list[int]]:
        """The counts so far (per namespace, total), leaving zero (a follower hands them over)."""
        with self._lock:
            counts, self._by_namespace, self._names = self._by_namespace, {}, []
            total, self._total = self._total, [0, 0]
        return counts, total

    def merge(self, by_namespace: dict[str, list[int]], total: list[int]) -> None:
        """Add counts taken elsewhere (a follower's) to these."""
        with self._lock:
            for ns, (hits, misses) in by_namespace.items():
                if (counts := self._entry(str(ns))) is not None:
                    counts[0] += int(hits)
                    counts[1] += int(misses)
            self._total[0] += int(total[0])
            self._total[1] += int(total[1])


class PendingAccesses:
    """Accesses recorded by searches, by record id: (how many, last access time), until flushed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int, float]] = {}

    def add(self, accesses: Iterable[tuple[int, int, float]]) -> None:
        """Add (rid, accesses, last access time) to the accesses waiting for the next flush."""
        with self._lock:
            for rid, count, when in accesses:
                n, last = self._pending.get(rid, (0, when))
                self._pending[rid] = (n + count, max(last, when))

    def take(self) -> dict[int, tuple[int, float]]:
        with self._lock:
            pending, self._pending = self._pending, {}
        return pending


# Kinds of lifecycle events, the columns of a totals row.
PROMOTION, DEMOTION, EVICTION, DELETION = range(4)


class LifecycleTotals:
    """Promotions, demotions, evictions and deletions per (namespace, tier): totals ever (persisted
    in LMDB as well, loaded at start-up) and the events of the last hour (memory only). Changed by
    the writer thread only; read by stats."""

    def __init__(self, totals: dict[tuple[str, int], list[int]] | None = None) -> None:
        self.totals: dict[tuple[str, int], list[int]] = {}
        self._names: list[str] = []  # the namespaces in ``totals``, sorted
        self._all = np.zeros((5, 4), np.int64)  # (their sum: the server's, read without a loop)
        self._events: deque[tuple[float, str, int, int, int]] = deque()  # (time, ns, tier, kind, n)
        self.add(totals or {}, -np.inf)

    def add(self, deltas: dict[tuple[str, int], list[int]], when: float) -> None:
        for (ns, tier), d in deltas.items():
            total = self.totals.get((ns, tier))
            if total is None:
                total = self.totals[(ns, tier)] = [0, 0, 0, 0]
                insort_new(self._names, ns)
            for kind in range(4):
                total[kind] += d[kind]
                self._all[tier, kind] += d[kind]
                if d[kind] and kind < DELETION and when > -np.inf:
                    self._events.append((when, ns, tier, kind, d[kind]))
        while self._events and self._events[0][0] < when - 3600:
            self._events.popleft()

    def retire(self, namespaces: set[str]) -> None:
        """The totals and last hour's events of deleted namespaces, moved to ``RETIRED`` (as in
        LMDB: ``Store.retire_lifecycle_counters``)."""
        for ns in namespaces - {RETIRED}:
            for tier in range(5):
                counts = self.totals.pop((ns, tier), None)
                if counts is not None:
                    kept = self.totals.setdefault((RETIRED, tier), [0, 0, 0, 0])
                    kept[:] = [a + b for a, b in zip(kept, counts, strict=True)]
                    insort_new(self._names, RETIRED)
            remove_sorted(self._names, ns)
        if any(e[1] in namespaces for e in list(self._events)):
            self._events = deque(
                (e if e[1] not in namespaces else (e[0], RETIRED, *e[2:])) for e in self._events
            )

    def by_tier(self, namespace: Selection = "") -> np.ndarray:
        """tier x [promotions, demotions, evictions, deleted], ever, of the namespaces selected."""
        if not namespace:
            return self._all.copy()
        totals = np.zeros((5, 4), np.int64)
        if not callable(namespace) or isinstance(namespace, Under):
            # (a copy: the writer changes the list without a lock, and bisection reads it several times)
            names = (
                namespace.within(list(self._names)) - {RETIRED}
                if isinstance(namespace, Under)
                else [namespace]
            )
            for ns in names:
                for t in range(5):
                    totals[t] += self.totals.get((ns, t), (0, 0, 0, 0))
            return totals
        for (ns, t), c in list(self.totals.items()):
            if ns != RETIRED and namespace(ns):
                totals[t] += c
        return totals

    def since(self, when: float, namespace: Selection = "") -> np.ndarray:
        """tier x [promotions, demotions, evictions, 0] of the events at ``when`` or later."""
        recent = np.zeros((5, 4), np.int64)
        for at, ns, t, kind, n in list(self._events):
            if at >= when and selected(namespace, ns) and (ns != RETIRED or not namespace):
                recent[t, kind] += n
        return recent


class SummaryCounts:
    """Summaries the server stored itself (kept and eviction summaries), the tokens they saved and
    the ones that failed, per namespace and in all, since the server started."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_namespace: dict[str, list[int]] = {}  # namespace -> [stored, tokens saved, failures]
        self._names: list[str] = []  # its keys, sorted

    def stored(self, namespace: str, tokens_saved: int) -> None:
        with self._lock:
            counts = self._counts(namespace)
            counts[0] += 1
            counts[1] += tokens_saved

    def failed(self, namespace: str) -> None:
        with self._lock:
            self._counts(namespace)[2] += 1

    def _counts(self, namespace: str) -> list[int]:
        counts = self._by_namespace.get(namespace)
        if counts is None:
            counts = self._by_namespace[namespace] = [0, 0, 0]
            insort_new(self._names, namespace)
        return counts

    def forget(self, namespaces: set[str]) -> None:
        """Deleted namespaces' figures, kept in the server's only (as ``RETIRED``'s)."""
        with self._lock:
            for ns in namespaces - {RETIRED}:
                counts = self._by_namespace.pop(ns, None)
                if counts is not None:
                    remove_sorted(self._names, ns)
                    kept = self._counts(RETIRED)
                    kept[:] = [a + b for a, b in zip(kept, counts, strict=True)]

    def figures(self, namespace: Selection = "") -> tuple[int, int, int]:
        """(stored, tokens saved, failures) of the namespaces selected."""
        with self._lock:
            if isinstance(namespace, Under):
                rows = [self._by_namespace[ns] for ns in namespace.within(self._names) - {RETIRED}]
            elif namespace and not callable(namespace):
                rows = [self._by_namespace.get(namespace, [0, 0, 0])]
            else:
                rows = [
                    c
                    for ns, c in self._by_namespace.items()
                    if not namespace or (ns != RETIRED and namespace(ns))
                ]
            return sum(r[0] for r in rows), sum(r[1] for r in rows), sum(r[2] for r in rows)
