"""Statistics of the server or of one namespace: memories per tier, lifecycle totals and the last
hour's events, embedding spaces and their indexes, search hit rates, summaries, writes and storage. Read
without locks from the columns and counters: figures of one moment, not of one transaction."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tiermem import __version__
from tiermem.server.config import TIERS
from tiermem.server.core.counters import Selection, selected
from tiermem.server.core.state import EngineState
from tiermem.server.model import validation as check
from tiermem.server.model.reports import SpaceStats, StatsReport, TierStats
from tiermem.server.model.types import Under


def stats(st: EngineState, namespace: str = "", within: Callable[[str], bool] | None = None) -> StatsReport:
    """The figures of one namespace, or of all; ``within``: only the namespaces it accepts (an API
    key's), and no server-wide figures (writes, storage, spaces)."""
    view = st.columns.view()
    mask = view.alive & (view.expire > st.clock())
    sel: Selection = namespace
    if namespace:
        check.namespace("namespace", namespace)
        mask &= view.ns == st.columns.namespaces.get(namespace)
    elif within is not None:
        sel = within
        if isinstance(within, Under):  # (an API key's: its names by bisection, not every name asked)
            live = st.columns.namespaces_under(within)
            ids = [st.columns.namespaces.get(name) for name in live]
        else:
            ids = [i for i, name in enumerate(list(st.columns.namespaces.names)) if within(name)]
        mask &= np.isin(view.ns, np.asarray(ids, np.int32))
    tiers = view.tier[mask]
    counts = np.bincount(tiers, minlength=5)
    imp = np.bincount(tiers, weights=view.importance[mask], minlength=5)
    sur = np.bincount(tiers, weights=view.surprise[mask], minlength=5)
    if namespace:
        ns_count = int(namespace in st.columns.ns_counts)
    elif within is None:
        ns_count = len(st.columns.ns_counts)
    elif isinstance(within, Under):
        ns_count = len(live)
    else:
        ns_count = sum(1 for n in list(st.columns.ns_counts) if selected(sel, n))
    totals = st.lifecycle.by_tier(sel)
    recent = st.lifecycle.since(st.clock() - 3600, sel)
    hits, misses = st.searches.hits_misses(sel)
    stored, saved, failed = st.summaries.figures(sel)
    server_wide = within is None
    return StatsReport(
        search_hits=hits,
        search_misses=misses,
        memory_count=int(mask.sum()),
        namespace_count=ns_count,
        tiers=[
            TierStats(
                tier=t,
                count=int(counts[t]),
                avg_importance=float(imp[t] / counts[t]) if counts[t] else 0.0,
                avg_surprise=float(sur[t] / counts[t]) if counts[t] else 0.0,
                totals=totals[t].tolist(),
                last_hour=recent[t].tolist(),
            )
            for t in TIERS
        ],
        spaces=_space_stats(st) if server_wide else [],
        writes_committed=st.writer.ops_committed if server_wide else 0,
        commit_groups=st.writer.groups_committed if server_wide else 0,
        uptime_seconds=time.monotonic() - st.started,
        storage_bytes=st.store.used_bytes() if server_wide else 0,
        version=__version__,
        summaries_stored=stored,
        summary_tokens_saved=saved,
        summary_failures=failed,
    )


def _space_stats(st: EngineState) -> list[SpaceStats]:
    out = []
    for sp in list(st.spaces.values()):
        figures = [idx.counts() for idx in list(sp.indexes.values())]  # each index's read together
        out.append(
            SpaceStats(
                model=sp.model,
                dim=sp.dim,
                live=sum(f[2] for f in figures),
                indexed=sum(f[0] for f in figures),
                pending=sum(f[1] for f in figures),
            )
        )
    return out
