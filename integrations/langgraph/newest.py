"""A search without a query: the newest items (by creation) of many namespaces, in a few calls
whatever the number of namespaces.

tiermem lists one namespace per ``ListMemories``, but one ``SearchMemories`` covers 64 namespaces
and one ``BatchSearchMemories`` 100 searches, so the namespaces are searched in groups of 64, all
groups in one call (per 100 groups, or per ``RESULTS_PER_CALL`` results asked). A search has no order exact enough to page by (its recency
score is a 32-bit float: memories put within a few milliseconds of each other tie), so what makes
the answer exact is a window on ``create_time`` (a ``where``): a search over the window
``[lo, top)`` that returns fewer results than its limit returned every memory of the window. Its
recency ranking only helps to choose the windows.

Each round searches every group that may still hold one of the ``needed`` newest items:

- ``cut`` is the creation time of the ``needed``-th newest item seen so far (-inf while fewer have
  been seen): an item created before it can never be among the newest.
- A group knows every item created at or after its ``top`` (+inf at first). It is searched over
  ``[max(cut, pivot), top)`` while ``top > cut``.
- Fewer results than the limit (``2 * want + 1``): the window is complete; ``top`` moves down to
  its lower end, and the group's next window (if it still needs one: items the client's filter
  dropped) aims at twice as many items.
- As many as the limit: the window holds too many; the results (the newest by recency, ties
  aside) give the ``pivot`` of the next window, the creation time of the ``want``-th newest of
  them, where the next window holds about ``want`` items.

Usually two or three rounds do (one to find the cut, one or two to confirm it). A group whose window cannot be
narrowed (more than half of a window's results created at one instant), or still searched after
``ROUNDS`` rounds, has the rest of its window read whole, namespace by namespace (``ListMemories``).

The results are those of reading every namespace's timeline and merging them newest first: every
item created at or after the final cut is known, so the ``needed`` newest are exact, ties in
creation time in the order of namespace, then id. (A memory deleted or expiring while a search
ranks it is left out of that search's answer, which may then look complete one item early.)"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tiermem.client import Memory

from .calls import All, Call, Steps, one

GROUP = 64  # namespaces of one search (tiermem's most)
SEARCHES_PER_CALL = 100  # searches of one BatchSearchMemories (tiermem's most)
RESULTS_PER_CALL = 5000  # results of one BatchSearchMemories, to keep an answer within the message limit
MAX_RESULTS = 1000  # results of one search (max_search_limit)
MAX_PAGE = 1000  # memories of one ListMemories page (max_page_size)
ROUNDS = 24  # rounds of searches before a group's window is read whole
COARSE_TAU = 1e6  # recency_tau_seconds of a window open below: 0.1 s apart ranks apart, for 3 years


def created(memory: Memory) -> float:
    """A memory's creation time in epoch seconds: the float the server filters ``create_time`` on."""
    return float(memory.create_time.seconds + memory.create_time.nanos / 1e9)


@dataclass
class _Group:
    paths: Sequence[str]
    want: int  # how many items its next window aims to hold
    top: float = math.inf  # every item of the group created at or after ``top`` is known
    pivot: float = -math.inf  # the lower end of the next window (at least the cut)
    whole: bool = False  # the next window is read whole, namespace by namespace


def _window(where: Mapping[str, Any] | None, lo: float, top: float) -> Mapping[str, Any] | None:
    bounds: dict[str, float] = {}
    if lo > -math.inf:
        bounds["$gte"] = lo
    if top < math.inf:
        bounds["$lt"] = top
    if not bounds:
        return where
    within = {"create_time": bounds}
    return within if where is None else {"$and": [where, within]}


def newest(
    paths: Sequence[str],
    *,
    kind: str,
    where: Mapping[str, Any] | None,
    keep: Callable[[Memory], bool] | None,
    needed: int,
    want: int,
) -> Steps[list[Memory]]:
    """The ``needed`` newest memories of ``paths`` of ``kind`` matching ``where`` (tiermem's) that
    ``keep`` keeps (None: all), newest first. ``want``: how many items a window aims to hold
    (``needed``, or more when ``keep`` drops some)."""
    known: dict[tuple[str, str], tuple[float, Memory]] = {}
    groups = [_Group(paths[i : i + GROUP], want) for i in range(0, len(paths), GROUP)]
    rounds = 0
    while True:
        times = heapq.nlargest(needed, (entry[0] for entry in known.values()))
        cut = times[-1] if len(times) == needed else -math.inf
        asked = [g for g in groups if g.top > cut]
        if not asked:
            break
        rounds += 1
        for g in asked:
            g.pivot = max(cut, g.pivot)
            g.whole = g.whole or rounds > ROUNDS
        searched = [g for g in asked if not g.whole]
        read = [g for g in asked if g.whole]
        hits, listed = yield All([_search_all(searched, kind, where), _read_all(read, kind, where)])
        for g, found in [*zip(searched, hits, strict=True), *zip(read, listed, strict=True)]:
            for memory in found:
                if keep is None or keep(memory):
                    known[(memory.namespace, memory.id)] = (created(memory), memory)
            if g.whole or len(found) < _limit(g):  # the window is complete
                g.top, g.pivot, g.whole = g.pivot, -math.inf, False
                g.want = min(2 * g.want, MAX_RESULTS // 2)  # still asked next round: it needs more
            else:
                # The pivot: where a window holds about ``want`` items (the newest of a full window).
                pivot = sorted((created(m) for m in found), reverse=True)[min(g.want, _limit(g) // 2) - 1]
                g.whole = pivot <= g.pivot  # half the window at its lower end: no narrower one
                g.pivot = pivot
    ordered = sorted(known.values(), key=lambda e: (-e[0], e[1].namespace, e[1].id))
    return [memory for _, memory in ordered[:needed]]


def _limit(g: _Group) -> int:
    """The most results of a search of ``g``'s window: fewer tell the window is complete."""
    return min(MAX_RESULTS, 2 * g.want + 1)


def _search_all(
    groups: Sequence[_Group], kind: str, where: Mapping[str, Any] | None
) -> Steps[list[list[Memory]]]:
    """Each group's window searched: its memories (the newest by recency, ``_limit`` at most)."""
    if not groups:
        return []
    now = time.time()
    searches = []
    for g in groups:
        open_below, open_above = g.pivot == -math.inf, g.top == math.inf
        span = (now if open_above else g.top) - g.pivot
        searches.append(
            {
                "namespaces": list(g.paths),
                "strategy": "recency",
                "limit": _limit(g),
                "kinds": [kind],
                "where": _window(where, g.pivot, g.top),
                "read_only": True,
                # Ranked from the window's top with a time constant of a 16th of its span: the score
                # falls from 1 to e^-16 across the window (a normal float32 still), so items 1e-8
                # of the span apart rank apart.
                "as_of": None if open_above else g.top,
                "recency_tau_seconds": COARSE_TAU if open_below else max(span / 16, 1e-6),
            }
        )
    per_call = max(1, min(SEARCHES_PER_CALL, RESULTS_PER_CALL // max(map(_limit, groups))))
    calls = [Call.to("search_many", searches[i : i + per_call]) for i in range(0, len(searches), per_call)]
    answers = yield All([one(c) for c in calls])
    return [[r.memory for r in results] for answer in answers for results in answer]


def _read_all(
    groups: Sequence[_Group], kind: str, where: Mapping[str, Any] | None
) -> Steps[list[list[Memory]]]:
    """Each group's window read whole, every namespace of it listed."""
    reads = [
        Call.listing(
            "list_memories", path, page_size=MAX_PAGE, kinds=[kind], where=_window(where, g.pivot, g.top)
        )
        for g in groups
        for path in g.paths
    ]
    if not reads:
        return []
    listed = iter((yield All([one(c) for c in reads])))
    return [[m for _ in g.paths for m in next(listed)] for g in groups]
