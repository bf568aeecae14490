"""Consolidation pass benchmark: the server's kernel-based pass against a plain NumPy version of the
same pass, on the same 1,000,000 memories, in the same run.

What is timed is the decision of a pass over whole columns (the part the kernels do): decayed
importance, promotion and demotion rules, retention scores and capacity evictions per namespace and
tier with cascades. Both versions must produce the identical plan (checked). Applying the moves
(LMDB commits and HNSW re-adds) is timed separately on a real engine with ``--engine N`` memories.

    python bench/consolidation.py                       # 1,000,000 memories, 1,000 namespaces
    python bench/consolidation.py --n 200000 --engine 20000 --json bench/results/consolidation.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tiermem.server.config import TIERS, ServerConfig
from tiermem.server.core.policy import (
    DELETE_CAPACITY,
    DEMOTE_DECAY,
    DEMOTE_IDLE,
    EVICT_CAPACITY,
    EXPIRED,
    PROMOTE_ACCESS,
    PROMOTE_SUCCESS,
    PROMOTE_SURPRISE,
    Plan,
    Policy,
    Tables,
    plan_pass,
)
from tiermem.server.index.columns import _SPEC as COLUMN_SPEC
from tiermem.server.index.columns import ColumnsView

NOW = 1_700_000_000.0


def synthetic_view(n: int, namespaces: int, seed: int) -> ColumnsView:
    """Columns of n live memories spread over namespaces and tiers, with ages up to 30 days."""
    rng = np.random.default_rng(seed)
    created = NOW - rng.uniform(0, 30 * 86400, n)
    tier_since = created + rng.uniform(0, 1, n) * (NOW - created)
    accessed = tier_since + rng.uniform(0, 1, n) * (NOW - tier_since)
    access_count = rng.poisson(3, n).astype(np.int64)
    success = rng.poisson(1, n).astype(np.int64)
    expire = np.where(rng.random(n) < 0.01, NOW - 1.0, np.inf)
    cols = dict(
        n=n,
        alive=np.ones(n, np.bool_),
        ns=rng.integers(0, namespaces, n).astype(np.int32),
        tier=rng.integers(1, 5, n).astype(np.int8),
        kind=np.zeros(n, np.int32),
        source=np.zeros(n, np.int32),
        topic=np.zeros(n, np.int32),
        space=np.zeros(n, np.int32),
        vpos=np.arange(n, dtype=np.int64),
        importance=rng.uniform(0, 1, n).astype(np.float32),
        created=created,
        accessed=accessed,
        access_count=access_count,
        surprise=rng.beta(1, 4, n).astype(np.float32),
        success=success,
        expire=expire,
        rid=np.arange(1, n + 1, dtype=np.int64),
        tier_since=tier_since,
        access_base=np.minimum(access_count, rng.poisson(1, n)).astype(np.int64),
        success_base=np.minimum(success, rng.poisson(1, n)).astype(np.int64),
    )
    # Columns the pass does not read (e.g. updated, words) get their defaults, whatever ColumnsView holds.
    for f in dataclasses.fields(ColumnsView):
        if f.name not in cols:
            dtype, fill = COLUMN_SPEC.get(f.name, (np.int64, 0))
            cols[f.name] = np.full(n, fill, dtype)
    return ColumnsView(**cols)  # type: ignore[arg-type]


def numpy_pass(
    v: ColumnsView,
    t: Tables,
    *,
    now: float,
    floor: float,
    tau_seconds: float,
    in_scope: np.ndarray,
    due: np.ndarray,
) -> Plan:
    """The same pass as lifecycle.plan_pass, written with NumPy array operations only."""
    ns, tier = v.ns, v.tier
    expired = in_scope & (v.expire <= now)
    live = in_scope & ~expired
    eligible = live & due[ns, tier]

    def decay(idx: np.ndarray | slice, tiers: np.ndarray) -> np.ndarray:
        hl = t.half_life[ns[idx], tiers]
        age_h = np.maximum(now - v.created[idx], 0.0) / 3600.0
        with np.errstate(divide="ignore", invalid="ignore"):
            factor = np.where((hl <= 0) | np.isinf(hl), 1.0, 0.5 ** (age_h / hl))
        imp = v.importance[idx].astype(np.float64)
        return np.maximum(imp * factor, imp * floor).astype(np.float32)

    def retention_of(idx: np.ndarray | slice, decayed: np.ndarray, since: np.ndarray) -> np.ndarray:
        policy = t.retention[ns[idx]]
        recency = np.exp(-np.maximum(now - v.accessed[idx], 0.0) / tau_seconds)
        return np.select(
            [policy == 2, policy == 3, policy == 4],
            [v.created[idx], since, v.accessed[idx]],
            0.7 * decayed.astype(np.float64) + 0.3 * recency,
        )

    decayed = decay(slice(None), tier)
    can_promote = eligible & (tier > 1)
    p_access = can_promote & (v.access_count - v.access_base >= t.promote_access[ns])
    p_surprise = (
        can_promote & ~p_access & (v.surprise >= t.promote_surprise[ns]) & (v.access_count > v.access_base)
    )
    p_success = can_promote & ~p_access & ~p_surprise & (v.success - v.success_base >= t.promote_success[ns])
    promoted = p_access | p_surprise | p_success
    ttl = t.ttl[ns, tier]
    can_demote = eligible & ~promoted & (tier < 4)
    d_idle = can_demote & (now - np.maximum(v.accessed, v.tier_since) > ttl)
    d_decay = can_demote & ~d_idle & (now - v.tier_since > ttl) & (decayed < t.threshold[ns, tier])
    reason = np.zeros(v.n, np.int8)
    reason[p_access], reason[p_surprise], reason[p_success] = (
        PROMOTE_ACCESS,
        PROMOTE_SURPRISE,
        PROMOTE_SUCCESS,
    )
    reason[d_idle], reason[d_decay] = DEMOTE_IDLE, DEMOTE_DECAY
    target = tier.copy()
    target[promoted] -= 1
    target[d_idle | d_decay] += 1
    reason[expired] = EXPIRED
    target[expired] = 0
    retention = retention_of(slice(None), decayed, v.tier_since)

    def enter(idx: np.ndarray) -> None:  # rows moving into target rank there as just entered
        retention[idx] = retention_of(idx, decay(idx, target[idx]), np.full(idx.shape[0], now))

    home_retention = retention.copy()
    enter(np.flatnonzero(live & (target != tier)))
    over_capacity = 0
    for tr in TIERS:
        cand = np.flatnonzero(live & (target == tr) & due[ns, tr])
        if cand.shape[0] == 0:
            continue
        g = ns[cand].astype(np.int64)
        order = cand[np.lexsort((cand, retention[cand], g))]
        g_sorted = ns[order].astype(np.int64)
        starts = np.r_[0, np.flatnonzero(np.diff(g_sorted)) + 1]
        first = np.repeat(starts, np.diff(np.r_[starts, order.shape[0]]))
        position = np.arange(order.shape[0]) - first
        count = np.bincount(g, minlength=t.capacity.shape[0])
        evict = order[position < count[g_sorted] - t.capacity[g_sorted, tr]]
        turned = evict[tier[evict] > tr]  # promoted into tr: one tier less, most back where they were
        target[turned] = tr + 1
        home = turned[tier[turned] == tr + 1]
        reason[home] = 0
        retention[home] = home_retention[home]
        enter(turned[tier[turned] != tr + 1])
        evict = evict[tier[evict] <= tr]
        if tr < TIERS[-1]:
            target[evict] = tr + 1
            reason[evict] = EVICT_CAPACITY
            enter(evict)
        else:
            allowed = evict[t.delete_glacial[ns[evict]]]
            target[allowed] = 0
            reason[allowed] = DELETE_CAPACITY
            over_capacity += evict.shape[0] - allowed.shape[0]
    changed = np.flatnonzero(in_scope & ((target != tier) | expired))
    return Plan(
        rows=changed,
        from_tier=tier[changed].copy(),
        to_tier=target[changed],
        reason=reason[changed],
        over_capacity=over_capacity,
    )


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def engine_pass(n: int, seed: int) -> dict[str, float]:
    """A real pass (plan + LMDB commits + HNSW moves) on an in-process engine with n memories."""
    from tiermem.server.core.engine import Engine
    from tiermem.server.model.records import NewMemory

    rng = np.random.default_rng(seed)
    vecs = rng.standard_normal((n, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="tiermem-bench-") as tmp:
        # Small capacities so the pass has real work: most memories get evicted down the tiers.
        cfg = ServerConfig(
            data_dir=Path(tmp), maintenance_interval_seconds=0, tier_max_items=(0, 50, 100, 200, 1e9)
        )
        engine = Engine(cfg, clock=lambda: NOW)
        for lo in range(0, n, 1000):
            engine.create(
                [
                    NewMemory(
                        namespace=f"ns{(lo + j) % 20}",
                        content=f"m{lo + j}",
                        embedding=v,
                        embedding_model="bench-64",
                        tier=1,
                        importance=float(rng.random()),
                    )
                    for j, v in enumerate(vecs[lo : lo + 1000])
                ],
                batch=True,
            )
        t0 = time.perf_counter()
        report = engine.consolidate(max_reported=0)
        total = time.perf_counter() - t0
        engine.close()
    return {
        "memories": n,
        "moved": report.moved,
        "plan_s": report.plan_seconds,
        "apply_s": report.apply_seconds,
        "total_s": total,
        "max_search_pause_ms": report.max_pause_seconds * 1000,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--namespaces", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument(
        "--engine", type=int, default=0, help="also time a real pass on an engine with this many memories"
    )
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    view = synthetic_view(args.n, args.namespaces, args.seed)
    base = Policy.from_config(ServerConfig())
    # A tenth of the namespaces override retention and capacities, so the per-namespace tables matter.
    overrides = {
        i: base.with_overrides({"retention": 1 + i % 4, "tiers": {1: {"max_items": 200}}})
        for i in range(0, args.namespaces, 10)
    }
    tables = Tables.build(args.namespaces, base, [(p, np.array([i])) for i, p in overrides.items()])
    kw = {
        "now": NOW,
        "floor": 0.1,
        "tau_seconds": 86400.0,
        "in_scope": view.alive,
        "due": np.ones((args.namespaces, 5), np.bool_),
    }

    plan_pass(
        synthetic_view(1000, 10, 1),
        Tables.build(10, base),
        **{**kw, "in_scope": np.ones(1000, bool), "due": np.ones((10, 5), bool)},
    )  # compile
    t_kernel, kplan = timed(lambda: plan_pass(view, tables, **kw), args.repeat)
    t_numpy, nplan = timed(lambda: numpy_pass(view, tables, **kw), args.repeat)
    assert isinstance(kplan, Plan) and isinstance(nplan, Plan)
    identical = (
        np.array_equal(kplan.rows, nplan.rows)
        and np.array_equal(kplan.to_tier, nplan.to_tier)
        and np.array_equal(kplan.reason, nplan.reason)
        and kplan.over_capacity == nplan.over_capacity
    )
    counts = {
        name: int(np.isin(kplan.reason, codes).sum())
        for name, codes in (
            ("promoted", (PROMOTE_ACCESS, PROMOTE_SURPRISE, PROMOTE_SUCCESS)),
            ("demoted", (DEMOTE_IDLE, DEMOTE_DECAY)),
            ("evicted", (EVICT_CAPACITY,)),
            ("deleted", (DELETE_CAPACITY, EXPIRED)),
        )
    }
    print(
        f"consolidation pass over {args.n:,} memories in {args.namespaces:,} namespaces "
        f"(median of {args.repeat}, {os.cpu_count()} cores, {platform.processor() or platform.machine()})"
    )
    print(f"  moves planned: {counts}, left over capacity in GLACIAL: {kplan.over_capacity:,}")
    print(f"  kernels (tiermem): {t_kernel * 1000:8.1f} ms")
    print(f"  plain NumPy:       {t_numpy * 1000:8.1f} ms")
    print(f"  NumPy / kernels:   {t_numpy / t_kernel:8.2f}x   (plans identical: {identical})")
    results: dict[str, object] = {
        "n": args.n,
        "namespaces": args.namespaces,
        "kernel_ms": t_kernel * 1000,
        "numpy_ms": t_numpy * 1000,
        "ratio": t_numpy / t_kernel,
        "identical": identical,
        "counts": counts,
    }
    if args.engine:
        e = engine_pass(args.engine, args.seed)
        results["engine"] = e
        print(
            f"  real pass on an engine with {e['memories']:,} memories: {e['moved']:,} moves, plan "
            f"{e['plan_s'] * 1000:.1f} ms, apply {e['apply_s']:.2f} s, longest search pause "
            f"{e['max_search_pause_ms']:.2f} ms"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if not identical:
        raise SystemExit("the kernel and NumPy passes disagree")


if __name__ == "__main__":
    main()
