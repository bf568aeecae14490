"""Context assembly for an agent turn (seeds 001, 003, 004).

The token budget is split across scopes (default shares by position: 0.4 task/session, 0.4 project,
0.2 global/user; unused tokens of a scope carry to the next). Within each scope the order is fixed:
summary -> recent window -> semantic hits -> graph facts. Items already taken (same memory, or the
same normalized text) are skipped in later sections and scopes. A section that does not fit takes its
items in order, skipping any that no longer fits; with ``head_tail`` it first keeps its first and
last ``head_tail`` items (seed 001). The package never exceeds the budget. ``candidate_tokens``
counts every distinct candidate once.

Token counts: a memory's ``token_cost`` (the client's, or ceil(bytes / 4)); other text is counted
by ``Assembler.count_tokens``, the same estimate unless replaced (it is pluggable).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tiermem.server.model import validation as check
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.records import Record
from tiermem.server.model.types import Filter
from tiermem.server.search.searcher import SearchQuery
from tiermem.server.storage.store import normalize

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine

DEFAULT_SHARES = (0.4, 0.4, 0.2)
DEFAULT_SEMANTIC_K = (5, 3, 2)


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


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
    kind: str
    items: list[Item] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)


class Assembler:
    def __init__(self, engine: Engine, count_tokens: Callable[[str], int] = estimate_tokens) -> None:
        self.engine = engine
        self.count_tokens = count_tokens

    def build(
        self,
        scopes: list[ScopeSpec],
        query_text: str,
        budget: int,
        head_tail: int = 0,
        graph_facts: bool = True,
        read_only: bool = False,
    ) -> dict[str, Any]:
        eng = self.engine
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

        taken_ids: set[int] = set()
        taken_texts: set[str] = set()
        counted: set[str] = set()  # candidates already counted in candidate_tokens (one count each)

        def count(items: list[Item]) -> int:
            new = 0
            for x in items:
                key = f"r{x.rid}" if x.rid else "t" + normalize(x.text)
                if key not in counted:
                    counted.add(key)
                    new += x.tokens
            return new

        sections: list[Section] = []
        candidate_tokens = used = 0
        carry = 0
        for i, (scope, share) in enumerate(zip(scopes, shares, strict=True)):
            remaining = int(budget * share) + carry
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
            for kind, cands in candidates:
                fresh = self._fresh(cands, taken_ids, taken_texts)
                candidate_tokens += count(fresh)
                section = Section(scope.namespace, kind, self._fit(fresh, remaining, head_tail))
                remaining -= section.tokens
                used += section.tokens
                for x in section.items:
                    taken_ids.add(x.rid)
                    taken_texts.add(normalize(x.text))
                sections.append(section)
            if graph_facts:
                chosen = {x.memory_id for s in sections if s.namespace == scope.namespace for x in s.items}
                facts = self._fresh(self._facts(scope.namespace, chosen), taken_ids, taken_texts)
                candidate_tokens += count(facts)
                section = Section(scope.namespace, "graph", self._fit(facts, remaining, head_tail))
                remaining -= section.tokens
                used += section.tokens
                taken_texts.update(normalize(x.text) for x in section.items)
                sections.append(section)
            carry = remaining
        if not read_only:
            rids = [x.rid for s in sections for x in s.items if x.rid]
            if rids and eng.config.search_records_access:
                eng.record_access(rids, eng.clock())
        return {
            "sections": sections,
            "tokens_used": used,
            "candidate_tokens": candidate_tokens,
            "compression_ratio": used / candidate_tokens if candidate_tokens else 1.0,
        }

    # -- candidates -----------------------------------------------------------------------------
    def _item(self, rec: Record) -> Item:
        return Item(rec.content, rec.token_cost or self.count_tokens(rec.content), rec.id, rec.rid)

    def _summary(self, namespace: str) -> list[Item]:
        eng = self.engine
        rid = eng.scope(namespace)["summary_rid"]
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
        eng = self.engine
        now = eng.clock()
        out = []
        with eng.store.read() as txn:
            for node in eng.store.nodes(txn, namespace):
                if not memory_ids.intersection(node.get("memory_ids", [])):
                    continue
                for eid in eng.store.edges_of(txn, namespace, node["id"]):
                    e = eng.store.get_edge(txn, namespace, eid)
                    if e is None or not (
                        e["valid_from"] <= now and (e["invalid_from"] is None or now < e["invalid_from"])
                    ):
                        continue
                    text = f"{e['source_id']} {e['relation']} {e['target_id']}"
                    out.append(Item(text, self.count_tokens(text)))
        return out

    @staticmethod
    def _fresh(items: list[Item], ids: set[int], texts: set[str]) -> list[Item]:
        out, seen = [], set()
        for x in items:
            key = normalize(x.text)
            if (x.rid and x.rid in ids) or key in texts or key in seen:
                continue
            seen.add(key)
            out.append(x)
        return out

    @staticmethod
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
