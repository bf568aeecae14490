"""Context assembly for an agent turn: ``Assembler.build`` packs memories into a token budget.

The token budget is split across scopes (default shares by position: 0.4 task/session, 0.4 project,
0.2 global/user; unused tokens of a scope carry to the next). Within each scope the order is fixed:
summary -> recent window -> semantic hits -> graph facts -> important (the rest of the scope's share,
filled with its other memories, most important first, then most recent; unless the scope turns
``fill`` off) -> overflow (an extractive summary of the scope's candidates that did not fit, in the
tokens still left; unless the request turns ``summarize_overflow`` off). Items already taken
(same memory, or the same normalized text) are skipped in later sections and scopes.

A section that does not fit takes part of its items: the recent window and the important section the
most important (then the most recent), semantic hits in their ranking order; with ``head_tail`` a
section first keeps its first and last ``head_tail`` items. Items keep their section's order (the
recent window newest first by creation time). The package never exceeds the budget.
``candidate_tokens`` counts every distinct candidate looked at once.

A failing graph part leaves the rest of the package built: its section is empty and the package's
``warnings`` say which scope lost its facts.

Token counts: a memory's ``token_cost`` (the client's, or ceil(bytes / 4)); other text is counted
by ``Assembler.count_tokens``, the same estimate unless replaced (it is pluggable).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from tiermem.server.agent.graph import GraphMemory
from tiermem.server.index.columns import ColumnsView
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import Record
from tiermem.server.model.text import estimate_tokens, first_sentence
from tiermem.server.model.types import Filter
from tiermem.server.search.query import SearchQuery
from tiermem.server.storage.keys import normalize

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine

logger = logging.getLogger(__name__)

DEFAULT_SHARES = (0.4, 0.4, 0.2)
DEFAULT_SEMANTIC_K = (5, 3, 2)
FILL_SCAN = 1000  # memories of a scope looked at (most important first) to fill the rest of its share
ACCESSED = ("recent", "semantic")  # the sections whose memories count as accessed
OVERFLOW_SOURCES = 200  # left-out candidates of a scope its overflow summary draws on (most important)
NOT_SUMMARY = '{"$not": {"kind": "summary"}}'
ALWAYS_SHOWN = frozenset({"summary", "recent", "semantic", "graph"})  # the others only when not empty


@dataclass
class ScopeSpec:
    namespace: str
    share: float | None = None
    semantic_k: int | None = None
    recent_window: int | None = None
    fill: bool = True  # the share's rest filled with the scope's most important other memories


@dataclass(frozen=True)
class _Steps:
    """The request's switches for the optional parts of each scope."""

    graph_facts: bool = True
    summarize_overflow: bool = True


@dataclass
class Item:
    text: str
    tokens: int
    memory_id: str = ""
    rid: int = 0
    importance: float = 0.0
    created: float = 0.0


@dataclass
class Section:
    namespace: str
    kind: str  # "summary", "recent", "semantic", "graph", "important" or "overflow"
    items: list[Item] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)


@dataclass
class ContextPackage:
    """What ``Assembler.build`` made: the sections in order, the tokens they hold, the tokens of
    every distinct candidate, tokens_used / candidate_tokens (1.0 without candidates), and what went
    wrong without stopping the build (e.g. "graph facts of 'ns' unavailable: ...")."""

    sections: list[Section]
    tokens_used: int
    candidate_tokens: int
    compression_ratio: float
    warnings: list[str] = field(default_factory=list)


class Assembler:
    """Builds context packages from the engine's memories and the graph's facts."""

    def __init__(
        self, engine: Engine, graph: GraphMemory, count_tokens: Callable[[str], int] = estimate_tokens
    ) -> None:
        self.engine = engine
        self.graph = graph
        self.count_tokens = count_tokens

    def build(
        self,
        scopes: list[ScopeSpec],
        query_text: str,
        budget: int,
        head_tail: int = 0,
        graph_facts: bool = True,
        read_only: bool = False,
        summarize_overflow: bool = True,
        record: bool = True,
    ) -> ContextPackage:
        """``record`` false: the caller calls ``record_accesses`` once it sends the package."""
        shares = _shares(scopes, budget, head_tail)
        # (checked as a search's, whether or not a scope searches: the same request fails alike)
        check.text("query_text", query_text, self.engine.config.max_content_bytes)
        package = _Package(head_tail)
        carry = 0
        steps = _Steps(graph_facts, summarize_overflow)
        for i, (scope, share) in enumerate(zip(scopes, shares, strict=True)):
            carry = self._fill_scope(package, i, scope, int(budget * share) + carry, query_text, steps)
        result = package.result()
        if not read_only and record:
            self.record_accesses(result)
        return result

    def record_accesses(self, package: ContextPackage) -> None:
        # What was asked for counts as accessed; the fill by importance would promote the same
        # memories build after build.
        rids = [x.rid for s in package.sections if s.kind in ACCESSED for x in s.items if x.rid]
        eng = self.engine
        if rids and eng.config.search_records_access:
            eng.record_access(rids, eng.clock())

    def _fill_scope(
        self, package: _Package, i: int, scope: ScopeSpec, remaining: int, query_text: str, steps: _Steps
    ) -> int:
        """Add the sections of the ``i``-th scope within ``remaining`` tokens; returns what is left."""
        ns = scope.namespace
        k = (
            scope.semantic_k
            if scope.semantic_k is not None
            else (DEFAULT_SEMANTIC_K[i] if i < len(DEFAULT_SEMANTIC_K) else 2)
        )
        window = scope.recent_window if scope.recent_window is not None else (10 if i == 0 else 0)
        remaining -= package.add(ns, "summary", self._summary(ns), remaining)
        remaining -= package.add(ns, "recent", self._recent(ns, window), remaining, by_importance=True)
        semantic = self._semantic(ns, query_text, k) if query_text and k else []
        remaining -= package.add(ns, "semantic", semantic, remaining)
        if steps.graph_facts:
            remaining -= package.add(ns, "graph", self._facts(package, ns), remaining)
        important = self._important(ns, remaining, package) if remaining > 0 and scope.fill else []
        remaining -= package.add(ns, "important", important, remaining, by_importance=True)
        if remaining > 0 and steps.summarize_overflow:
            remaining -= package.add(
                ns, "overflow", self._overflow(package.left_out(ns), remaining), remaining
            )
        return remaining

    # -- candidates -----------------------------------------------------------------------------
    def _item(self, rec: Record) -> Item:
        tokens = rec.token_cost or self.count_tokens(rec.content)
        return Item(rec.content, tokens, rec.id, rec.rid, rec.importance, rec.created_at)

    def _summary(self, namespace: str) -> list[Item]:
        eng = self.engine
        rid = eng.scope(namespace).summary_rid
        if not rid:
            return []
        with eng.store.read() as txn:
            rec = eng.store.get(txn, rid)
        ok = rec is not None and rec.namespace == namespace and rec.kind == "summary" and not eng.expired(rec)
        return [self._item(rec)] if ok and rec is not None else []

    def _recent(self, namespace: str, window: int) -> list[Item]:
        """The ``window`` newest memories by creation time (ties by arrival), summaries aside."""
        if window <= 0:
            return []
        flt = self.engine.check_filter(Filter(where=NOT_SUMMARY))
        recs, _ = self.engine.list_memories(namespace, window, "", flt, newest_first=True)
        return [self._item(r) for r in recs]

    def _semantic(self, namespace: str, query_text: str, k: int) -> list[Item]:
        hits = self.engine.search(
            SearchQuery(namespaces=[namespace], text=query_text, limit=k, read_only=True)
        )
        return [self._item(h.record) for h in hits if h.record.kind != "summary"]

    def _important(self, namespace: str, budget: int, package: _Package) -> list[Item]:
        """The scope's memories not taken yet, most important first, then most recent (summaries
        aside): read until ``budget`` is filled or ``FILL_SCAN`` were looked at."""
        eng = self.engine
        view = eng.columns.view()
        mask, _ = eng.allowed_rows(
            view, [namespace], eng.check_filter(Filter(where=NOT_SUMMARY)), eng.clock()
        )
        rows = _most_important(view, np.flatnonzero(mask), FILL_SCAN + len(package.taken_ids))
        out: list[Item] = []
        left, looked = budget, 0
        with eng.store.read() as txn:
            for rid in view.rid[rows].tolist():
                if left <= 0 or looked >= FILL_SCAN:
                    break
                if rid in package.taken_ids:
                    continue
                looked += 1
                rec = eng.store.get(txn, int(rid))
                if rec is None or rec.namespace != namespace or rec.kind == "summary":
                    continue
                item = self._item(rec)
                out.append(item)
                if item.tokens <= left and not package.is_taken(item):
                    left -= item.tokens
        return out

    def _facts(self, package: _Package, namespace: str) -> list[Item]:
        """Currently valid edges of the graph nodes linked to the chosen memories, as sentences; none
        (and a warning in the package) when the graph cannot be read."""
        memory_ids = package.memory_ids(namespace)
        if not memory_ids:
            return []
        try:
            edges = self.graph.edges_of_memories(namespace, memory_ids, self.engine.clock())
        except Exception as e:  # the graph part never stops the build (the rest is still useful)
            logger.warning(
                "graph facts of %r unavailable; context built without them", namespace, exc_info=True
            )
            package.warnings.append(f"graph facts of {namespace!r} unavailable: {type(e).__name__}: {e}")
            return []
        texts = (f"{edge['source_id']} {edge['relation']} {edge['target_id']}" for edge in edges)
        return [Item(text, self.count_tokens(text)) for text in texts]

    def _overflow(self, left_out: list[Item], budget: int) -> list[Item]:
        """One item summarizing what did not fit, extractively: the first sentence of each left-out
        memory, most important (then most recent) first while the text fits ``budget``, put back in
        time order. None when not even one sentence fits."""
        ranked = sorted(left_out, key=_priority)[:OVERFLOW_SOURCES]
        chosen: list[Item] = []
        seen: set[str] = set()
        for x in ranked:
            sentence = first_sentence(x.text)
            if not sentence or normalize(sentence) in seen:
                continue
            trial = [*chosen, Item(sentence, 0, x.memory_id, x.rid, x.importance, x.created)]
            if self.count_tokens(_joined(trial)) <= budget:
                chosen = trial
                seen.add(normalize(sentence))
        if not chosen:
            return []
        text = _joined(chosen)
        return [Item(text, self.count_tokens(text))]


def _priority(x: Item) -> tuple[float, float, int]:
    """Sort key: most important first, then most recent, then latest stored."""
    return (-x.importance, -x.created, -x.rid)


def _joined(items: list[Item]) -> str:
    """The sentences of ``items`` in time order (by creation, then arrival)."""
    return " ".join(x.text for x in sorted(items, key=lambda x: (x.created, x.rid)))


def _shares(scopes: list[ScopeSpec], budget: int, head_tail: int) -> list[float]:
    """Check the request; each scope's share of the budget (scaled down when they add up past 1)."""
    if not 1 <= len(scopes) <= 8:
        raise InvalidArgument("scopes", "must hold 1 to 8 scopes")
    if budget <= 0:
        raise InvalidArgument("token_budget", "must be > 0")
    if head_tail < 0:
        raise InvalidArgument("head_tail", "must not be negative")
    shares = []
    for i, s in enumerate(scopes):
        check.namespace(f"scopes[{i}].namespace", s.namespace)
        if s.share is not None and not 0.0 <= s.share <= 1.0:
            raise InvalidArgument(f"scopes[{i}].share", "must be in [0, 1]")
        for name in ("semantic_k", "recent_window"):
            value = getattr(s, name)
            if value is not None and not 0 <= value <= 100:
                raise InvalidArgument(f"scopes[{i}].{name}", "must be in 0..100")
        default = DEFAULT_SHARES[i] if i < len(DEFAULT_SHARES) else 0.0
        shares.append(default if s.share is None else s.share)
    total = sum(shares)
    if total > 1.0:  # shares above the whole budget are scaled down
        shares = [x / total for x in shares]
    return shares


class _Package:
    """A package being built: its sections, what they hold (skipped in later sections), the
    candidates counted so far (each counted once in candidate_tokens), the memory candidates left
    out of each scope, and the warnings."""

    def __init__(self, head_tail: int) -> None:
        self.head_tail = head_tail
        self.sections: list[Section] = []
        self.used = 0
        self.candidate_tokens = 0
        self.taken_ids: set[int] = set()
        self.taken_texts: set[str] = set()
        self.counted: set[str] = set()
        self.considered: dict[str, dict[int, Item]] = {}  # namespace -> rid -> memory candidate
        self.warnings: list[str] = []

    def add(
        self, namespace: str, kind: str, candidates: list[Item], budget: int, by_importance: bool = False
    ) -> int:
        """Add a section of the candidates not taken yet, fitted to ``budget``; returns its tokens."""
        fresh = _fresh(candidates, self.taken_ids, self.taken_texts)
        self.candidate_tokens += self._count(fresh)
        seen = self.considered.setdefault(namespace, {})
        seen.update((x.rid, x) for x in fresh if x.rid)
        section = Section(namespace, kind, _fit(fresh, budget, self.head_tail, by_importance))
        self.used += section.tokens
        for x in section.items:
            if x.rid:
                self.taken_ids.add(x.rid)
            self.taken_texts.add(normalize(x.text))
        if section.items or kind in ALWAYS_SHOWN:
            self.sections.append(section)
        return section.tokens

    def is_taken(self, item: Item) -> bool:
        return bool(item.rid and item.rid in self.taken_ids) or normalize(item.text) in self.taken_texts

    def left_out(self, namespace: str) -> list[Item]:
        """The memory candidates of ``namespace`` the package did not take."""
        return [x for x in self.considered.get(namespace, {}).values() if not self.is_taken(x)]

    def memory_ids(self, namespace: str) -> set[str]:
        """The memories the package holds from ``namespace``."""
        return {
            x.memory_id for s in self.sections if s.namespace == namespace for x in s.items if x.memory_id
        }

    def result(self) -> ContextPackage:
        ratio = self.used / self.candidate_tokens if self.candidate_tokens else 1.0
        return ContextPackage(self.sections, self.used, self.candidate_tokens, ratio, self.warnings)

    def _count(self, items: list[Item]) -> int:
        new = 0
        for x in items:
            key = f"r{x.rid}" if x.rid else "t" + normalize(x.text)
            if key not in self.counted:
                self.counted.add(key)
                new += x.tokens
        return new


def _fresh(items: list[Item], ids: set[int], texts: set[str]) -> list[Item]:
    out, seen = [], set()
    for x in items:
        key = normalize(x.text)
        if (x.rid and x.rid in ids) or key in texts or key in seen:
            continue
        seen.add(key)
        out.append(x)
    return out


def _fit(items: list[Item], budget: int, head_tail: int, by_importance: bool = False) -> list[Item]:
    """The items that fit ``budget``, in their order: with ``head_tail`` both ends first, then the
    rest in order, or ``by_importance`` most important (then most recent) first."""
    if sum(x.tokens for x in items) <= budget:
        return list(items)
    order = list(range(len(items)))
    ends: list[int] = []
    if head_tail and len(items) > 2 * head_tail:
        ends = order[:head_tail] + order[-head_tail:]
        order = order[head_tail:-head_tail]
    if by_importance:
        order.sort(key=lambda i: _priority(items[i]))
    chosen: set[int] = set()
    used = 0
    for i in ends + order:
        if used + items[i].tokens <= budget:
            chosen.add(i)
            used += items[i].tokens
    return [items[i] for i in sorted(chosen)]


def _most_important(view: ColumnsView, rows: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` of ``rows`` with the highest importance, then the latest created, in that order:
    a selection first, so a large namespace is not sorted whole."""
    imp = view.importance[rows]
    if rows.shape[0] > k:
        bar = np.partition(imp, rows.shape[0] - k)[rows.shape[0] - k]
        above, tied = rows[imp > bar], rows[imp == bar]
        need = k - above.shape[0]
        if tied.shape[0] > need:
            tied = tied[np.argpartition(-view.created[tied], need - 1)[:need]] if need > 0 else tied[:0]
        rows = np.concatenate([above, tied])
    return rows[np.lexsort((view.rid[rows], view.created[rows], view.importance[rows]))[::-1]]
