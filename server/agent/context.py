"""Context assembly for an agent turn: ``Assembler.build`` packs memories into a token budget.

The token budget is split across scopes (default shares by position: 0.4 task/session, 0.4 project,
0.2 global/user; unused tokens of a scope carry to the next). Within each scope the order is fixed:
summary -> recent window -> semantic hits -> graph facts. Items already taken (same memory, or the
same normalized text) are skipped in later sections and scopes. A section that does not fit takes its
items in order, skipping any that no longer fits; with ``head_tail`` it first keeps its first and
last ``head_tail`` items. The package never exceeds the budget. ``candidate_tokens`` counts every
distinct candidate once.

Token counts: a memory's ``token_cost`` (the client's, or ceil(bytes / 4)); other text is counted
by ``Assembler.count_tokens``, the same estimate unless replaced (it is pluggable).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tiermem.server.agent.graph import GraphMemory
from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import Record
from tiermem.server.model.text import estimate_tokens
from tiermem.server.model.types import Filter
from tiermem.server.search.query import SearchQuery
from tiermem.server.storage.keys import normalize

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine

DEFAULT_SHARES = (0.4, 0.4, 0.2)
DEFAULT_SEMANTIC_K = (5, 3, 2)


@dataclass
class ScopeSpec:
    namespace: str
    share: float | None = None
    semantic_k: int | None = None
    recent_window: int | None = None


@dataclass
class Item:
    text: str
    tokens: int
    memory_id: str = ""
    rid: int = 0


@dataclass
class Section:
    namespace: str
    kind: str  # "summary", "recent", "semantic" or "graph"
    items: list[Item] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)


@dataclass
class ContextPackage:
    """What ``Assembler.build`` made: the sections in order, the tokens they hold, the tokens of
    every distinct candidate, and tokens_used / candidate_tokens (1.0 without candidates)."""

    sections: list[Section]
    tokens_used: int
    candidate_tokens: int
    compression_ratio: float


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
    ) -> ContextPackage:
        shares = _shares(scopes, budget, head_tail)
        package = _Package(head_tail)
        carry = 0
        for i, (scope, share) in enumerate(zip(scopes, shares, strict=True)):
            carry = self._fill_scope(package, i, scope, int(budget * share) + carry, query_text, graph_facts)
        if not read_only:
            rids = [x.rid for s in package.sections for x in s.items if x.rid]
            eng = self.engine
            if rids and eng.config.search_records_access:
                eng.record_access(rids, eng.clock())
        return package.result()

    def _fill_scope(
        self, package: _Package, i: int, scope: ScopeSpec, remaining: int, query_text: str, graph_facts: bool
    ) -> int:
        """Add the sections of the ``i``-th scope within ``remaining`` tokens; returns what is left."""
        k = (
            scope.semantic_k
            if scope.semantic_k is not None
            else (DEFAULT_SEMANTIC_K[i] if i < len(DEFAULT_SEMANTIC_K) else 2)
        )
        window = scope.recent_window if scope.recent_window is not None else (10 if i == 0 else 0)
        candidates = [
            ("summary", self._summary(scope.namespace)),
            ("recent", self._recent(scope.namespace, window)),
            ("semantic", self._semantic(scope.namespace, query_text, k) if query_text and k else []),
        ]
        for kind, items in candidates:
            remaining -= package.add(scope.namespace, kind, items, remaining)
        if graph_facts:
            facts = self._facts(scope.namespace, package.memory_ids(scope.namespace))
            remaining -= package.add(scope.namespace, "graph", facts, remaining)
        return remaining

    # -- candidates -----------------------------------------------------------------------------
    def _item(self, rec: Record) -> Item:
        return Item(rec.content, rec.token_cost or self.count_tokens(rec.content), rec.id, rec.rid)

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
        if window <= 0:
            return []

        flt = self.engine.check_filter(Filter(where='{"$not": {"kind": "summary"}}'))
        recs, _ = self.engine.list_memories(namespace, window, "", flt, newest_first=True)
        return [self._item(r) for r in recs]

    def _semantic(self, namespace: str, query_text: str, k: int) -> list[Item]:
        hits = self.engine.search(
            SearchQuery(namespaces=[namespace], text=query_text, limit=k, read_only=True)
        )
        return [self._item(h.record) for h in hits if h.record.kind != "summary"]

    def _facts(self, namespace: str, memory_ids: set[str]) -> list[Item]:
        """Currently valid edges of the graph nodes linked to the chosen memories, as sentences."""
        if not memory_ids:
            return []
        out = []
        for e in self.graph.edges_of_memories(namespace, memory_ids, self.engine.clock()):
            text = f"{e['source_id']} {e['relation']} {e['target_id']}"
            out.append(Item(text, self.count_tokens(text)))
        return out


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
    """A package being built: its sections, what they hold (skipped in later sections), and the
    candidates counted so far (each counted once in candidate_tokens)."""

    def __init__(self, head_tail: int) -> None:
        self.head_tail = head_tail
        self.sections: list[Section] = []
        self.used = 0
        self.candidate_tokens = 0
        self.taken_ids: set[int] = set()
        self.taken_texts: set[str] = set()
        self.counted: set[str] = set()

    def add(self, namespace: str, kind: str, candidates: list[Item], budget: int) -> int:
        """Add a section of the candidates not taken yet, fitted to ``budget``; returns its tokens."""
        fresh = _fresh(candidates, self.taken_ids, self.taken_texts)
        self.candidate_tokens += self._count(fresh)
        section = Section(namespace, kind, _fit(fresh, budget, self.head_tail))
        self.used += section.tokens
        for x in section.items:
            if x.rid:
                self.taken_ids.add(x.rid)
            self.taken_texts.add(normalize(x.text))
        self.sections.append(section)
        return section.tokens

    def memory_ids(self, namespace: str) -> set[str]:
        """The memories the package holds from ``namespace``."""
        return {x.memory_id for s in self.sections if s.namespace == namespace for x in s.items}

    def result(self) -> ContextPackage:
        ratio = self.used / self.candidate_tokens if self.candidate_tokens else 1.0
        return ContextPackage(self.sections, self.used, self.candidate_tokens, ratio)

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


def _fit(items: list[Item], budget: int, head_tail: int) -> list[Item]:
    if sum(x.tokens for x in items) <= budget:
        return list(items)
    chosen: set[int] = set()
    used = 0
    order = list(range(len(items)))
    if head_tail and len(items) > 2 * head_tail:
        ends = order[:head_tail] + order[-head_tail:]
        order = ends + order[head_tail:-head_tail]
    for i in order:
        if used + items[i].tokens <= budget:
            chosen.add(i)
            used += items[i].tokens
    return [items[i] for i in sorted(chosen)]
