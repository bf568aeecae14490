"""Extractive summaries of a namespace (no LLM): ``build_summary`` picks the first sentence of each
memory since the namespace's last summary, best first, within a token budget. Reads only."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tiermem.server.model import validation as check
from tiermem.server.model.condense import sources
from tiermem.server.model.errors import InvalidArgument
from tiermem.server.model.text import estimate_tokens, first_sentence, fitting_sentences
from tiermem.server.model.types import Filter

if TYPE_CHECKING:
    from tiermem.server.core.engine import Engine

MAX_SOURCE_IDS = 1000  # ids of covered memories returned with a summary


@dataclass
class Summary:
    text: str
    source_ids: list[str]  # the memories it covers, oldest first (at most MAX_SOURCE_IDS)
    tokens: int


def build_summary(
    engine: Engine, namespace: str, max_tokens: int, after: float | None = None, before: float | None = None
) -> Summary:
    """An extractive summary of the namespace's memories since its last summary, or, with a time range,
    of those created in [after, before): the first sentence of each, best first by 0.7 * importance +
    0.3 * rank in time, kept within max_tokens, then put back in time order (by creation)."""
    check.namespace("namespace", namespace)
    for name, t in (("created_after", after), ("created_before", before)):
        if t is not None and not math.isfinite(t):  # (a bound past every stored time excludes none)
            raise InvalidArgument(name, "must be a finite time")
    ranged = after is not None or before is not None
    flt = engine.check_filter(Filter(created_after=after, created_before=before), prefix="")
    view = engine.columns.view()
    allowed, _ = engine.allowed_rows(view, [namespace], flt, engine.clock())
    if not ranged:
        allowed &= view.rid > engine.scope(namespace).covered_rid
    rows = np.flatnonzero(allowed)
    rows = rows[np.lexsort((view.rid[rows], view.created[rows]))]
    with engine.store.read() as txn:
        recs = [
            r
            for r in (engine.store.get(txn, int(view.rid[row])) for row in rows)
            if r and r.kind != "summary"
        ]
    if not recs:
        return Summary("", [], 0)
    n = len(recs)
    order = sorted(range(n), key=lambda i: -(0.7 * recs[i].importance + 0.3 * (i + 1) / n))
    chosen = fitting_sentences([r.content for r in recs], order, max_tokens)
    text = " ".join(first_sentence(recs[i].content) for i in sorted(chosen))
    return Summary(text, [recs[i].id for i in sources(n, chosen, MAX_SOURCE_IDS)], estimate_tokens(text))
