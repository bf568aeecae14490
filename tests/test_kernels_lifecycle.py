"""Tests for the lifecycle kernels of ``tiermem.kernels`` against plain NumPy / Python references.

Covered: ``plan_moves``, ``retention_scores``, ``select_evictions`` (and its jitted kernel:
``_jit.select_evictions``, or ``_jit.mark_evictions`` walking a sorted order in the earlier design),
and the per-namespace half-life table form of ``score_rows``.
The references are written from the documented rules (the wrappers' and kernels' docstrings), not
from the kernel code:

* decay (as ``decay_importance``): importance * 0.5**(max(0, now - created)/3600 / half_life),
  never below floor * importance; a half-life <= 0 or infinite means no decay.
* recency: exp(-max(0, now - accessed) / tau).
* plan_moves, per row, with k = ns, t = tier; tiers 1 (FAST) .. 4 (GLACIAL):
  - an invalid namespace (k < 0 or k >= table rows) or tier (not 1..4): action 0, decayed = importance;
  - otherwise decayed = decay(importance, now - created, half_life[k, t]); ineligible rows: action 0;
  - promotion (not from FAST), first rule that holds:
    1 access_count - access_base >= promote_access[k];
    2 surprise >= promote_surprise[k] and an access since entering the tier (access_count > access_base);
    3 success_count - success_base >= promote_success[k];
  - else demotion (not from GLACIAL): 4 idle, now - max(accessed_at, tier_since) > ttl[k, t]
    ("longer than"); 5 decay, decayed < threshold[k, t] ("below") and, where decay_grace[k] (the
    default), now - tier_since > ttl[k, t] (after one TTL in the tier).
  - the floor is one value or a per-namespace table floor[k].
  Reading taken where the docs are terse: promotion is checked before demotion (the kernel
  docstring lists it first and a row moves one tier per pass); "after one TTL" is strict like "longer
  than"; the decay test compares the decayed importance as returned (float32) with the threshold.
* retention_scores by policy[ns]: 1 -> 0.7*decayed + 0.3*recency(accessed), 2 -> created_at,
  3 -> tier_since, 4 -> accessed_at, 5 -> decayed, 6 -> 7*decayed + 0.3*recency(created). (The wrapper docstring writes exp(-(now - accessed)/tau); the
  kernel docstring says "recency", which is clamped at 1 for accesses in the future; we follow that.)
* select_evictions: among candidates, per group, the count - capacity lowest scores (ties: lower
  row index first) are marked; nothing if count <= capacity; NaN candidate scores are rejected.

Each kernel: seeded random comparisons (sizes 0, 1, 2, 50, 1000), hand-computed edge cases, a pure
Python run of the kernel body (``.py_func`` with the jitted helpers swapped for theirs), and the
wrapper's argument validation.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest

from tiermem import kernels as K
from tiermem.kernels import _jit

SIZES = [0, 1, 2, 50, 1000]
F32: dict[str, Any] = {"rtol": 1e-6, "atol": 0.0}
NOW = 1.7e9
HOUR = 3600.0
STEP = 600.0  # times are on a 10-minute grid so that differences hit TTLs exactly
GRID = np.array([0.0, 0.25, 0.5, 0.75, 1.0], np.float32)  # exact values so thresholds tie
FAST, GLACIAL = 1, 4
NONE, P_ACCESS, P_SURPRISE, P_SUCCESS, D_IDLE, D_DECAY = range(6)


def rng_for(*key: object) -> np.random.Generator:
    """A fixed-seed generator per test case (seed derived from the case parameters, not hash())."""
    seed = 424242
    for part in key:
        for ch in repr(part):
            seed = (seed * 131 + ord(ch)) % (2**32)
    return np.random.default_rng(seed)


@pytest.fixture
def pure_python(monkeypatch):
    """Make the jitted helpers resolve to plain Python inside the kernels' py_func bodies."""
    for helper in ("_decayed", "_recency"):
        monkeypatch.setattr(_jit, helper, getattr(_jit, helper).py_func)
    # (_floor_at is a plain function with a compiled overload: it is plain Python already)
    with np.errstate(all="ignore"):
        yield


# --------------------------------------------------------------------------------------------
# Reference implementations
# --------------------------------------------------------------------------------------------


def ref_decay64(importance, age_seconds, half_life, floor) -> np.ndarray:
    """Decay with one half-life per row (already looked up), float64."""
    imp = np.asarray(importance, np.float32).astype(np.float64)
    hl = np.asarray(half_life, np.float64)
    with np.errstate(all="ignore"):
        decays = (hl > 0) & np.isfinite(hl)
        age_hours = np.maximum(np.asarray(age_seconds, np.float64) / 3600.0, 0.0)
        exponent = np.where(decays, age_hours / np.where(decays, hl, 1.0), 0.0)
        decayed = np.maximum(imp * np.power(0.5, exponent), imp * floor)
    return np.where(decays, decayed, imp)


def ref_recency64(accessed, now, tau) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.exp(-np.maximum(now - np.asarray(accessed, np.float64), 0.0) / tau)


def ref_plan_moves(c: dict, t: dict, now: float, floor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (action int8, decayed float32, decayed float64), vectorised over rows."""
    ns = c["ns"].astype(np.int64)
    tier = c["tier"].astype(np.int64)
    rows = t["half_life_hours"].shape[0]
    valid = (ns >= 0) & (ns < rows) & (tier >= 1) & (tier <= 4)
    k = np.where(valid, ns, 0)
    ti = np.where(valid, tier, 1)
    fl = np.asarray(floor, np.float64)[k] if np.ndim(floor) else floor
    d64 = ref_decay64(c["importance"], now - c["created_at"], t["half_life_hours"][k, ti], fl)
    d64 = np.where(valid, d64, c["importance"].astype(np.float64))
    act = c["eligible"] & valid
    up = act & (tier != FAST)
    down = act & (tier != GLACIAL)
    r_access = up & (c["access_count"] - c["access_base"] >= t["promote_access"][k])
    r_surprise = up & (c["surprise"] >= t["promote_surprise"][k]) & (c["access_count"] > c["access_base"])
    r_success = up & (c["success_count"] - c["success_base"] >= t["promote_success"][k])
    ttl = t["ttl_seconds"][k, ti]
    last = np.maximum(c["accessed_at"], c["tier_since"])
    r_idle = down & (now - last > ttl)
    thr = t["threshold"][k, ti].astype(np.float64)
    grace = np.asarray(t.get("decay_grace", np.ones(rows, np.bool_)), np.bool_)[k]
    waited = ~grace | (now - c["tier_since"] > ttl)
    r_decay = down & waited & (d64.astype(np.float32).astype(np.float64) < thr)
    action = np.select(
        [r_access, r_surprise, r_success, r_idle, r_decay],
        [P_ACCESS, P_SURPRISE, P_SUCCESS, D_IDLE, D_DECAY],
        NONE,
    ).astype(np.int8)
    return action, d64.astype(np.float32), d64


def ref_retention(ns, policy, decayed, accessed_at, created_at, tier_since, now, tau_seconds) -> np.ndarray:
    pol = np.asarray(policy)[np.asarray(ns, np.intp)]
    weighted = 0.7 * decayed.astype(np.float64) + 0.3 * ref_recency64(accessed_at, now, tau_seconds)
    ten_point = 7.0 * decayed.astype(np.float64) + 0.3 * ref_recency64(created_at, now, tau_seconds)
    return np.select(
        [pol == 2, pol == 3, pol == 4, pol == 5, pol == 6],
        [created_at, tier_since, accessed_at, decayed.astype(np.float64), ten_point],
        weighted,
    )


def ref_order(group, score, candidates) -> list[int]:
    """Candidate rows by (group, score ascending, row): the order a walk-the-order kernel expects."""
    rows = [i for i in range(len(group)) if candidates[i]]
    return sorted(rows, key=lambda i: (int(group[i]), float(score[i]), i))


def ref_select(group, score, candidates, capacity) -> np.ndarray:
    """Pure Python: per group, evict the len - capacity lowest (score, row) candidates."""
    by_group: dict[int, list[int]] = {}
    for i in range(len(group)):
        if candidates[i]:
            by_group.setdefault(int(group[i]), []).append(i)
    evict = np.zeros(len(group), np.bool_)
    for g, rows in by_group.items():
        rows.sort(key=lambda i: (float(score[i]), i))
        excess = len(rows) - int(capacity[g])
        for i in rows[: max(0, excess)]:
            evict[i] = True
    return evict


def ref_score_rows_ns(rows, relevance, cols, ns, table, now, tau_seconds, floor, alpha, beta, gamma):
    r = np.asarray(rows, np.intp)
    hl = table[ns[r].astype(np.intp), cols["tier"][r].astype(np.intp)]
    imp64 = ref_decay64(cols["importance"][r], now - cols["created_at"][r], hl, floor)
    rec64 = ref_recency64(cols["last_access"][r], now, tau_seconds)
    score = alpha * relevance.astype(np.float64) + beta * rec64 + gamma * imp64
    return score.astype(np.float32), rec64.astype(np.float32), imp64.astype(np.float32)


# --------------------------------------------------------------------------------------------
# plan_moves data
# --------------------------------------------------------------------------------------------

COLUMN_DTYPES = {
    "eligible": np.bool_,
    "ns": np.int32,
    "tier": np.int8,
    "importance": np.float32,
    "created_at": np.float64,
    "accessed_at": np.float64,
    "tier_since": np.float64,
    "access_count": np.int64,
    "access_base": np.int64,
    "surprise": np.float32,
    "success_count": np.int64,
    "success_base": np.int64,
}
TABLE_SPECS = {  # name: (dtype, 2-D with 5 tier columns?)
    "half_life_hours": (np.float64, True),
    "ttl_seconds": (np.float64, True),
    "threshold": (np.float32, True),
    "promote_access": (np.int64, False),
    "promote_surprise": (np.float32, False),
    "promote_success": (np.int64, False),
}


def grid_or_random(n: int, rng: np.random.Generator) -> np.ndarray:
    return np.where(rng.random(n) < 0.5, rng.choice(GRID, n), rng.random(n)).astype(np.float32)


def make_plan_columns(n: int, rng: np.random.Generator, namespaces: int, invalid_ns: bool) -> dict:
    ns = rng.integers(0, namespaces, n)
    if invalid_ns:
        bad = rng.random(n) < 0.08
        ns[bad] = rng.choice([-1, namespaces, namespaces + 7, -(2**31), 2**31 - 1], int(bad.sum()))
    # Ages up to ~20 h on the 10-minute grid, so that idle times and TTLs often tie exactly.
    created_at = NOW - STEP * rng.integers(-6, 120, n)  # some created in the future
    tier_since = created_at + STEP * rng.integers(0, 60, n)  # some entered the tier in the future
    kind = rng.integers(0, 4, n)
    accessed_at = np.select(
        [kind == 0, kind == 1, kind == 2],
        [tier_since, tier_since - STEP * rng.integers(1, 30, n), NOW + STEP * rng.integers(-3, 3, n)],
        tier_since + STEP * rng.integers(1, 30, n),
    )
    access_base = rng.integers(0, 50, n)
    success_base = rng.integers(0, 50, n)
    return {
        "eligible": rng.random(n) < 0.85,
        "ns": ns.astype(np.int32),
        "tier": rng.choice(5, n, p=[0.06, 0.24, 0.24, 0.22, 0.24]).astype(np.int8),
        "importance": grid_or_random(n, rng),
        "created_at": created_at,
        "accessed_at": accessed_at,
        "tier_since": tier_since,
        "access_count": access_base + rng.integers(0, 6, n),
        "access_base": access_base,
        "surprise": grid_or_random(n, rng),
        "success_count": success_base + rng.integers(0, 6, n),
        "success_base": success_base,
    }


def make_plan_tables(namespaces: int, rng: np.random.Generator) -> dict:
    shape = (namespaces, 5)
    return {
        "half_life_hours": rng.choice([0.0, -1.0, 1.0, 24.0, 168.0, np.inf], shape),
        "ttl_seconds": rng.choice([0.0, 6 * STEP, 2 * HOUR, 4 * HOUR, 24 * HOUR, np.inf], shape),
        "threshold": np.where(rng.random(shape) < 0.6, rng.choice(GRID, shape), rng.random(shape)).astype(
            np.float32
        ),
        "promote_access": rng.integers(0, 6, namespaces).astype(np.int64),
        "promote_surprise": rng.choice(GRID, namespaces).astype(np.float32),
        "promote_success": rng.integers(1, 6, namespaces).astype(np.int64),
    }


def run_plan(c: dict, t: dict, now: float = NOW, floor: Any = 0.0):
    return K.plan_moves(**c, **t, now=now, floor=floor)


def run_plan_py(c: dict, t: dict, now: float = NOW, floor: Any = 0.0):
    n = len(c["eligible"])
    action = np.full(n, -1, np.int8)
    decayed = np.full(n, np.nan, np.float32)
    grace = t.get("decay_grace", np.ones(t["half_life_hours"].shape[0], np.bool_))
    tables = (t[name] for name in TABLE_SPECS)
    _jit.plan_moves.py_func(*(c[name] for name in COLUMN_DTYPES), now, floor, *tables, grace, action, decayed)
    return action, decayed


def check_plan(c: dict, t: dict, action, decayed, now: float = NOW, floor: Any = 0.0) -> None:
    e_action, e_decayed, _ = ref_plan_moves(c, t, now, floor)
    assert action.dtype == np.int8 and decayed.dtype == np.float32
    np.testing.assert_array_equal(action, e_action)
    np.testing.assert_allclose(decayed, e_decayed, **F32)
    # Rows without a valid namespace and tier keep their importance bit for bit.
    rows = t["half_life_hours"].shape[0]
    invalid = (c["ns"] < 0) | (c["ns"] >= rows) | (c["tier"] < 1) | (c["tier"] > 4)
    np.testing.assert_array_equal(decayed[invalid], c["importance"][invalid])


# --------------------------------------------------------------------------------------------
# plan_moves: random
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("namespaces", [1, 3])
@pytest.mark.parametrize("floor", [0.0, 0.3])
def test_plan_moves_random(n, namespaces, floor):
    rng = rng_for("plan", n, namespaces, floor)
    c = make_plan_columns(n, rng, namespaces, invalid_ns=True)
    t = make_plan_tables(namespaces, rng)
    action, decayed = run_plan(c, t, floor=floor)
    check_plan(c, t, action, decayed, floor=floor)


def test_plan_moves_random_exercises_every_action():
    """Guard for the random data: every action and the interesting tiers occur."""
    rng = rng_for("plan", 1000, 3, 0.0)
    c = make_plan_columns(1000, rng, 3, invalid_ns=True)
    t = make_plan_tables(3, rng)
    action, _ = run_plan(c, t)
    assert set(np.unique(action).tolist()) == {0, 1, 2, 3, 4, 5}
    for tier in (1, 2, 3, 4):
        assert np.any(c["eligible"] & (c["tier"] == tier))
    assert not np.any((c["tier"] == FAST) & (action >= P_ACCESS) & (action <= P_SUCCESS))
    assert not np.any((c["tier"] == GLACIAL) & (action >= D_IDLE))
    assert np.any(c["accessed_at"] == c["tier_since"])


@pytest.mark.parametrize("n", SIZES)
def test_plan_moves_all_eligible_no_invalid(n):
    rng = rng_for("plan-all", n)
    c = make_plan_columns(n, rng, 2, invalid_ns=False)
    c["eligible"][:] = True
    t = make_plan_tables(2, rng)
    action, decayed = run_plan(c, t, floor=0.5)
    check_plan(c, t, action, decayed, floor=0.5)


@pytest.mark.parametrize("n", [0, 1, 2, 50, 300])
@pytest.mark.parametrize("floor", [0.0, 0.5])
def test_py_func_plan_moves(pure_python, n, floor):
    rng = rng_for("plan-py", n, floor)
    c = make_plan_columns(n, rng, 3, invalid_ns=True)
    t = make_plan_tables(3, rng)
    action, decayed = run_plan_py(c, t, floor=floor)
    check_plan(c, t, action, decayed, floor=floor)


@pytest.mark.parametrize("n", [0, 1, 2, 50, 1000])
@pytest.mark.parametrize("impl", ["jit", "py_func"])
def test_plan_moves_per_namespace_floor_and_decay_grace(request, n, impl):
    """A floor and a decay_grace per namespace (the policy's importance_floor and decay_grace)."""
    if impl == "py_func":
        request.getfixturevalue("pure_python")
    rng = rng_for("plan-grace", n)
    c = make_plan_columns(n, rng, 3, invalid_ns=True)
    c["eligible"][:] = True
    t = make_plan_tables(3, rng)
    t["decay_grace"] = np.array([True, False, False], np.bool_)
    floor = np.array([0.1, 0.0, 0.5], np.float64)
    run = run_plan_py if impl == "py_func" else run_plan
    action, decayed = run(c, t, floor=floor)
    check_plan(c, t, action, decayed, floor=floor)


def test_plan_moves_without_grace_demotes_a_fresh_memory_below_threshold():
    c = columns_of(base_row(tier=FAST, importance=0.5, created_at=NOW, accessed_at=NOW, tier_since=NOW))
    t = base_tables(1)
    t["threshold"][0, FAST] = 0.8
    t["ttl_seconds"][0, FAST] = 60.0
    assert run_plan(c, t)[0].tolist() == [NONE]
    t["decay_grace"] = np.zeros(1, np.bool_)
    assert run_plan(c, t)[0].tolist() == [D_DECAY]
    check_plan(c, t, *run_plan(c, t))


def test_plan_moves_rejects_bad_floor_and_grace_tables():
    kw = valid_plan_kwargs()
    with pytest.raises(ValueError, match="floor"):
        K.plan_moves(**{**kw, "floor": np.zeros(3, np.float64)})
    with pytest.raises(ValueError, match="floor"):
        K.plan_moves(**{**kw, "floor": 1.5})
    with pytest.raises(ValueError, match="one row per namespace"):
        K.plan_moves(**{**kw, "decay_grace": np.ones(3, np.bool_)})


def test_score_rows_per_namespace_floor():
    """score_rows takes the floor per namespace too: 0.8 after 5 half-lives is 0.025 without a floor,
    0.08 with 0.1, and 0.8 where the half-life is infinite (no decay)."""
    rows = np.arange(3, dtype=np.int64)
    hl = np.array([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0] + [np.inf] * 4], np.float64)
    _, _, imp = K.score_rows(
        rows,
        np.zeros(3, np.float32),
        importance=np.full(3, 0.8, np.float32),
        created_at=np.full(3, NOW - 5 * HOUR),
        last_access=np.full(3, NOW),
        tier=np.full(3, FAST, np.int8),
        now=NOW,
        tau_seconds=60.0,
        half_life_hours=hl,
        floor=np.array([0.1, 0.0, 0.1]),
        alpha=0.0,
        beta=0.0,
        gamma=1.0,
        ns=np.arange(3, dtype=np.int32),
    )
    np.testing.assert_allclose(imp, [0.08, 0.025, 0.8], **F32)
    expected = ref_decay64(
        np.full(3, 0.8, np.float32), np.full(3, 5 * HOUR), hl[:, FAST], np.array([0.1, 0.0, 0.1])
    )
    np.testing.assert_allclose(imp, expected.astype(np.float32), **F32)


# --------------------------------------------------------------------------------------------
# plan_moves: hand-computed edge cases (one row, one namespace unless stated)
# --------------------------------------------------------------------------------------------


def base_row(**overrides) -> dict:
    """A tier-2 row, eligible, no promotion signal, recently accessed, no decay below threshold."""
    row = {
        "eligible": True,
        "ns": 0,
        "tier": 2,
        "importance": 0.5,
        "created_at": NOW - 10 * HOUR,
        "accessed_at": NOW - HOUR,
        "tier_since": NOW - 5 * HOUR,
        "access_count": 10,
        "access_base": 10,
        "surprise": 0.0,
        "success_count": 3,
        "success_base": 3,
    }
    row.update(overrides)
    return row


def columns_of(*rows: dict) -> dict:
    return {name: np.array([r[name] for r in rows], dtype) for name, dtype in COLUMN_DTYPES.items()}


def base_tables(namespaces: int = 1, **overrides) -> dict:
    t = {
        "half_life_hours": np.full((namespaces, 5), np.inf),
        "ttl_seconds": np.full((namespaces, 5), 2 * HOUR),
        "threshold": np.full((namespaces, 5), 0.25, np.float32),
        "promote_access": np.full(namespaces, 3, np.int64),
        "promote_surprise": np.full(namespaces, 0.75, np.float32),
        "promote_success": np.full(namespaces, 2, np.int64),
    }
    for name, value in overrides.items():
        dtype, two_d = TABLE_SPECS[name]
        t[name] = np.array(value, dtype).reshape((namespaces, 5) if two_d else (namespaces,))
    return t


# (case id, row overrides, table overrides, expected action, expected decayed or None = importance)
PLAN_EDGES = [
    ("baseline", {}, {}, NONE, None),
    ("access-at-threshold", {"access_count": 13}, {}, P_ACCESS, None),
    ("access-below-threshold", {"access_count": 12}, {}, NONE, None),
    ("access-zero-threshold", {}, {"promote_access": [0]}, P_ACCESS, None),
    ("surprise-at-threshold", {"surprise": 0.75, "access_count": 11}, {}, P_SURPRISE, None),
    (
        "surprise-below-threshold",
        {"surprise": np.nextafter(np.float32(0.75), np.float32(0)), "access_count": 11},
        {},
        NONE,
        None,
    ),
    ("surprise-no-access-since-entry", {"surprise": 1.0}, {}, NONE, None),
    # (counted, not dated: an access time ahead of the clock is no access since every later entry)
    ("surprise-access-dated-ahead", {"surprise": 1.0, "accessed_at": NOW + 24 * HOUR}, {}, NONE, None),
    (
        "surprise-counted-access-dated-before-entry",
        {"surprise": 1.0, "access_count": 11, "accessed_at": NOW - 2 * HOUR, "tier_since": NOW - HOUR},
        {},
        P_SURPRISE,
        None,
    ),
    (
        "surprise-accessed-before-tier",
        {"surprise": 1.0, "accessed_at": NOW - 2 * HOUR, "tier_since": NOW - HOUR},
        {},
        NONE,
        None,
    ),
    ("success-at-threshold", {"success_count": 5}, {}, P_SUCCESS, None),
    ("success-below-threshold", {"success_count": 4}, {}, NONE, None),
    ("access-beats-surprise", {"access_count": 20, "surprise": 1.0, "success_count": 9}, {}, P_ACCESS, None),
    (
        "surprise-beats-success",
        {"surprise": 1.0, "access_count": 11, "success_count": 9},
        {},
        P_SURPRISE,
        None,
    ),
    ("promote-beats-idle", {"success_count": 9, "accessed_at": NOW - 9 * HOUR}, {}, P_SUCCESS, None),
    (
        "no-promotion-from-fast",
        {"tier": 1, "access_count": 99, "surprise": 1.0, "success_count": 99},
        {},
        NONE,
        None,
    ),
    ("fast-still-demotes", {"tier": 1, "access_count": 99, "accessed_at": NOW - 3 * HOUR}, {}, D_IDLE, None),
    ("glacial-promotes", {"tier": 4, "access_count": 13}, {}, P_ACCESS, None),
    (
        "no-demotion-from-glacial",
        {"tier": 4, "accessed_at": NOW - 99 * HOUR, "tier_since": NOW - 99 * HOUR},
        {},
        NONE,
        None,
    ),
    ("idle-exactly-ttl", {"accessed_at": NOW - 2 * HOUR, "tier_since": NOW - 5 * HOUR}, {}, NONE, None),
    (
        "idle-just-over-ttl",
        {"accessed_at": NOW - 2 * HOUR - 1, "tier_since": NOW - 5 * HOUR},
        {},
        D_IDLE,
        None,
    ),
    (
        "idle-accessed-eq-tier-since",
        {"accessed_at": NOW - 3 * HOUR, "tier_since": NOW - 3 * HOUR},
        {},
        D_IDLE,
        None,
    ),
    (
        "idle-eq-tier-since-at-ttl",
        {"accessed_at": NOW - 2 * HOUR, "tier_since": NOW - 2 * HOUR},
        {},
        NONE,
        None,
    ),
    ("idle-recent-tier-entry", {"accessed_at": NOW - 50 * HOUR, "tier_since": NOW - HOUR}, {}, NONE, None),
    (
        "idle-zero-ttl",
        {"accessed_at": NOW - 1, "tier_since": NOW - 1},
        {"ttl_seconds": [[0.0] * 5]},
        D_IDLE,
        None,
    ),
    ("idle-zero-ttl-now", {"accessed_at": NOW, "tier_since": NOW}, {"ttl_seconds": [[0.0] * 5]}, NONE, None),
    (
        "idle-inf-ttl",
        {"accessed_at": NOW - 1e9, "tier_since": NOW - 1e9},
        {"ttl_seconds": [[np.inf] * 5]},
        NONE,
        None,
    ),
    ("future-tier-since", {"accessed_at": NOW - 50 * HOUR, "tier_since": NOW + HOUR}, {}, NONE, None),
    ("future-access", {"accessed_at": NOW + HOUR, "tier_since": NOW - 50 * HOUR}, {}, NONE, None),
    # decay: half-life 1 h, importance 1.0, created 3 h ago -> 0.125 exactly
    (
        "decay-below",
        {"importance": 1.0, "created_at": NOW - 3 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        D_DECAY,
        0.125,
    ),
    (
        "decay-equal-threshold",
        {"importance": 1.0, "created_at": NOW - 2 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        0.25,
    ),
    (
        "decay-tier-time-exactly-ttl",
        {"importance": 1.0, "created_at": NOW - 3 * HOUR, "tier_since": NOW - 2 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        0.125,
    ),
    (
        "decay-tier-time-over-ttl",
        {"importance": 1.0, "created_at": NOW - 3 * HOUR, "tier_since": NOW - 2 * HOUR - 1},
        {"half_life_hours": [[1.0] * 5]},
        D_DECAY,
        0.125,
    ),
    (
        "decay-inf-ttl",
        {"importance": 1.0, "created_at": NOW - 3 * HOUR},
        {"half_life_hours": [[1.0] * 5], "ttl_seconds": [[np.inf] * 5]},
        NONE,
        0.125,
    ),
    (
        "decay-floor-holds",
        {"importance": 1.0, "created_at": NOW - 30 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        D_DECAY,
        "floor",
    ),
    (
        "decay-floor-above-threshold",
        {"importance": 1.0, "created_at": NOW - 30 * HOUR},
        {"half_life_hours": [[1.0] * 5], "threshold": [[0.0625] * 5]},
        NONE,
        "floor",
    ),
    (
        "decay-no-decay-hl-zero",
        {"importance": 0.2, "created_at": NOW - 99 * HOUR},
        {"half_life_hours": [[0.0] * 5]},
        D_DECAY,
        0.2,
    ),
    (
        "decay-no-decay-hl-negative",
        {"importance": 0.25, "created_at": NOW - 99 * HOUR},
        {"half_life_hours": [[-5.0] * 5]},
        NONE,
        0.25,
    ),
    (
        "decay-negative-age",
        {"importance": 1.0, "created_at": NOW + 5 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        1.0,
    ),
    ("decay-zero-importance-zero-threshold", {"importance": 0.0}, {"threshold": [[0.0] * 5]}, NONE, 0.0),
    (
        "glacial-decays-no-move",
        {"tier": 4, "importance": 1.0, "created_at": NOW - 3 * HOUR},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        0.125,
    ),
    (
        "ineligible-keeps-decay",
        {"eligible": False, "importance": 1.0, "created_at": NOW - 3 * HOUR, "access_count": 99},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        0.125,
    ),
    (
        "invalid-ns-minus-one",
        {"ns": -1, "importance": 1.0, "created_at": NOW - 3 * HOUR, "access_count": 99},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        1.0,
    ),
    (
        "invalid-ns-table-rows",
        {
            "ns": 1,
            "importance": 1.0,
            "created_at": NOW - 3 * HOUR,
            "accessed_at": NOW - 99 * HOUR,
            "tier_since": NOW - 99 * HOUR,
        },
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        1.0,
    ),
    ("invalid-ns-int32-max", {"ns": 2**31 - 1, "importance": 0.7}, {}, NONE, 0.7),
    ("invalid-ns-int32-min", {"ns": -(2**31), "importance": 0.7}, {}, NONE, 0.7),
    (
        "tier-zero",
        {"tier": 0, "importance": 1.0, "created_at": NOW - 3 * HOUR, "access_count": 99},
        {"half_life_hours": [[1.0] * 5]},
        NONE,
        1.0,
    ),
]


@pytest.mark.parametrize("case", PLAN_EDGES, ids=[c[0] for c in PLAN_EDGES])
@pytest.mark.parametrize("impl", ["jit", "py_func"])
def test_plan_moves_edge_cases(request, case, impl):
    _, row, tables, expected_action, expected_decayed = case
    floor = 0.1
    c = columns_of(base_row(**row))
    t = base_tables(**tables)
    if impl == "py_func":
        request.getfixturevalue("pure_python")
        action, decayed = run_plan_py(c, t, floor=floor)
    else:
        action, decayed = run_plan(c, t, floor=floor)
    assert int(action[0]) == expected_action
    if expected_decayed is None:
        expected_decayed = c["importance"][0]
    elif expected_decayed == "floor":
        expected_decayed = c["importance"][0] * floor  # 2**-30 < floor
    np.testing.assert_allclose(decayed, np.float32(expected_decayed), **F32)
    check_plan(c, t, action, decayed, floor=floor)


def test_plan_moves_namespaces_with_different_policies():
    """The same row in three namespaces: each reads its own table row."""
    row = {"importance": 1.0, "created_at": NOW - 3 * HOUR, "access_count": 12, "surprise": 0.5}
    c = columns_of(*(base_row(ns=k, **row) for k in range(3)), base_row(ns=3, **row))
    t = base_tables(
        3,
        half_life_hours=[[1.0] * 5, [np.inf] * 5, [1.0] * 5],
        ttl_seconds=[[2 * HOUR] * 5, [2 * HOUR] * 5, [np.inf] * 5],
        threshold=[[0.5] * 5, [0.5] * 5, [0.5] * 5],
        promote_access=[3, 2, 5],
        promote_surprise=[0.75, 0.75, 0.5],
        promote_success=[2, 2, 2],
    )
    action, decayed = run_plan(c, t)
    # ns 0: decays to 0.125 < 0.5 after > 1 TTL in the tier; ns 1: no decay, 2 accesses >= 2;
    # ns 2: surprise 0.5 >= 0.5 with an access since the tier entry; ns 3: no such namespace.
    np.testing.assert_array_equal(action, [D_DECAY, P_ACCESS, P_SURPRISE, NONE])
    np.testing.assert_allclose(decayed, [0.125, 1.0, 0.125, 1.0], **F32)
    check_plan(c, t, action, decayed)


def test_plan_moves_tier_columns_of_tables():
    """half_life, ttl and threshold are read at [ns, tier]."""
    row = {
        "importance": 1.0,
        "created_at": NOW - 2 * HOUR,
        "accessed_at": NOW - 3 * HOUR,
        "tier_since": NOW - 3 * HOUR,
    }
    c = columns_of(*(base_row(tier=tier, **row) for tier in range(5)))
    t = base_tables(
        half_life_hours=[[1.0, 2.0, 1.0, 0.5, 1.0]],
        ttl_seconds=[[0.0, 4 * HOUR, 4 * HOUR, 2 * HOUR, 0.0]],
        threshold=[[1.0, 1.0, 0.125, 0.5, 1.0]],
    )
    action, decayed = run_plan(c, t)
    # tier 0 invalid; tier 1: 0.5 < 1 but 3 h < 4 h TTL; tier 2: 0.25 not < 0.125; tier 3: idle 3 h > 2 h;
    # tier 4: GLACIAL.
    np.testing.assert_array_equal(action, [NONE, NONE, NONE, D_IDLE, NONE])
    np.testing.assert_allclose(decayed, [1.0, 0.5, 0.25, 0.0625, 0.25], **F32)
    check_plan(c, t, action, decayed)


def test_plan_moves_tables_as_lists_and_other_dtypes():
    """Lookup tables are small and converted; the result matches typed tables."""
    rng = rng_for("plan-lists")
    c = make_plan_columns(50, rng, 2, invalid_ns=True)
    t = make_plan_tables(2, rng)
    expected = run_plan(c, t)
    loose = {
        "half_life_hours": t["half_life_hours"].tolist(),
        "ttl_seconds": t["ttl_seconds"].astype(np.float32),
        "threshold": t["threshold"].astype(np.float64),
        "promote_access": t["promote_access"].astype(np.int32),
        "promote_surprise": t["promote_surprise"].tolist(),
        "promote_success": t["promote_success"].tolist(),
    }
    loose["ttl_seconds"] = t["ttl_seconds"].tolist()  # float32 would round TTLs; keep them exact
    got = run_plan(c, loose)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])


def test_plan_moves_does_not_modify_inputs():
    rng = rng_for("plan-inputs")
    c = make_plan_columns(50, rng, 2, invalid_ns=True)
    t = make_plan_tables(2, rng)
    before = {k: v.copy() for k, v in {**c, **t}.items()}
    run_plan(c, t)
    for k, v in before.items():
        np.testing.assert_array_equal({**c, **t}[k], v)


def test_plan_moves_decay_demotion_agrees_with_returned_decayed():
    """Documented: demote for decay when the decayed importance is *below* the threshold. Here the
    decayed importance (as returned, float32) equals the threshold 0.5, so there must be no move."""
    c = columns_of(base_row(importance=1.0, created_at=NOW - HOUR * (1 + 1e-9), tier_since=NOW - 3 * HOUR))
    t = base_tables(half_life_hours=[[1.0] * 5], threshold=[[0.5] * 5])
    action, decayed = run_plan(c, t)
    assert decayed[0] == np.float32(0.5)  # holds
    assert int(action[0]) == NONE


# --------------------------------------------------------------------------------------------
# plan_moves: validation
# --------------------------------------------------------------------------------------------

WRONG_DTYPE = {
    np.dtype(np.float32): np.float64,
    np.dtype(np.float64): np.float32,
    np.dtype(np.int8): np.int16,
    np.dtype(np.int32): np.int64,
    np.dtype(np.int64): np.int32,
    np.dtype(np.bool_): np.uint8,
}


def valid_plan_kwargs(n: int = 4) -> dict:
    rng = rng_for("plan-valid", n)
    return {
        **make_plan_columns(n, rng, 2, invalid_ns=False),
        **make_plan_tables(2, rng),
        "now": NOW,
        "floor": 0.1,
    }


def strided(a: np.ndarray) -> np.ndarray:
    s = np.repeat(a, 2)[::2]
    assert not s.flags.c_contiguous and len(s) == len(a)
    return s


def test_plan_moves_valid_kwargs_are_valid():
    K.plan_moves(**valid_plan_kwargs())


@pytest.mark.parametrize("name", list(COLUMN_DTYPES))
def test_plan_moves_rejects_wrong_dtype(name):
    kw = valid_plan_kwargs()
    kw[name] = kw[name].astype(WRONG_DTYPE[kw[name].dtype])
    with pytest.raises(ValueError, match=name):
        K.plan_moves(**kw)


@pytest.mark.parametrize("name", list(COLUMN_DTYPES))
def test_plan_moves_rejects_non_contiguous(name):
    kw = valid_plan_kwargs()
    kw[name] = strided(kw[name])
    with pytest.raises(ValueError, match=name):
        K.plan_moves(**kw)


@pytest.mark.parametrize("name", list(COLUMN_DTYPES))
@pytest.mark.parametrize("delta", [-1, 1])
def test_plan_moves_rejects_wrong_length(name, delta):
    kw = valid_plan_kwargs()
    a = kw[name]
    kw[name] = a[:-1].copy() if delta < 0 else np.concatenate([a, a[:1]])
    with pytest.raises(ValueError):
        K.plan_moves(**kw)


@pytest.mark.parametrize("name", list(COLUMN_DTYPES))
def test_plan_moves_rejects_2d_and_lists(name):
    kw = valid_plan_kwargs()
    a = kw[name]
    with pytest.raises(ValueError):
        K.plan_moves(**{**kw, name: a.reshape(2, 2)})
    with pytest.raises(ValueError):
        K.plan_moves(**{**kw, name: a.tolist()})


def bad_table_shapes(name: str) -> list:
    dtype, two_d = TABLE_SPECS[name]
    if two_d:
        return [
            np.ones(5, dtype),
            np.ones((2, 4), dtype),
            np.ones((2, 6), dtype),
            np.ones((0, 5), dtype),
            np.ones((2, 5, 1), dtype),
        ]
    return [np.ones((2, 1), dtype), np.ones((1, 2), dtype), np.ones(0, dtype)]


@pytest.mark.parametrize("name", list(TABLE_SPECS))
def test_plan_moves_rejects_tables_of_wrong_shape(name):
    for bad in bad_table_shapes(name):
        kw = valid_plan_kwargs()
        kw[name] = bad
        with pytest.raises(ValueError, match=name):
            K.plan_moves(**kw)


@pytest.mark.parametrize("name", list(TABLE_SPECS))
@pytest.mark.parametrize("rows", [1, 3])
def test_plan_moves_rejects_mismatched_table_rows(name, rows):
    kw = valid_plan_kwargs()  # every table has 2 rows
    dtype, two_d = TABLE_SPECS[name]
    kw[name] = np.ones((rows, 5) if two_d else rows, dtype)
    with pytest.raises(ValueError, match="one row per namespace"):
        K.plan_moves(**kw)


@pytest.mark.parametrize("name", [n for n, (dtype, _) in TABLE_SPECS.items() if dtype != np.int64])
def test_plan_moves_rejects_nan_in_tables(name):
    kw = valid_plan_kwargs()
    kw[name] = kw[name].copy()
    kw[name].flat[1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        K.plan_moves(**kw)


# --------------------------------------------------------------------------------------------
# retention_scores
# --------------------------------------------------------------------------------------------


def make_retention_inputs(n: int, rng: np.random.Generator, namespaces: int) -> dict:
    return {
        "ns": rng.integers(0, namespaces, n).astype(np.int32),
        "policy": rng.integers(1, 7, namespaces).astype(np.int8),
        "decayed": grid_or_random(n, rng),
        "accessed_at": NOW - rng.uniform(-2 * HOUR, 1000 * HOUR, n),  # some in the future
        "created_at": NOW - rng.uniform(-2 * HOUR, 1000 * HOUR, n),
        "tier_since": NOW - rng.uniform(-2 * HOUR, 1000 * HOUR, n),
        "now": NOW,
        "tau_seconds": float(rng.choice([1.0, HOUR, 24 * HOUR, 1e9])),
    }


def check_retention(args: dict, out: np.ndarray) -> None:
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref_retention(**args), **F32)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("namespaces", [1, 4, 9])
def test_retention_scores_random(n, namespaces):
    args = make_retention_inputs(n, rng_for("retention", n, namespaces), namespaces)
    check_retention(args, K.retention_scores(**args))


@pytest.mark.parametrize("policy", [1, 2, 3, 4, 5, 6])
def test_retention_scores_single_policy(policy):
    args = make_retention_inputs(200, rng_for("retention-single", policy), 1)
    args["policy"] = np.array([policy], np.int8)
    out = K.retention_scores(**args)
    check_retention(args, out)
    exact = {2: args["created_at"], 3: args["tier_since"], 4: args["accessed_at"]}
    if policy in exact:
        np.testing.assert_array_equal(out, exact[policy])


def test_retention_scores_edge_values():
    tau = 100.0
    args = {
        "ns": np.array([0, 0, 0, 0, 1, 2, 3, 1, 2, 3], np.int32),
        "policy": np.array([1, 2, 3, 4], np.int8),
        "decayed": np.array([1.0, 0.5, 0.0, 0.25, 0.9, 0.9, 0.9, 0, 0, 0], np.float32),
        "accessed_at": np.array(
            [NOW, NOW - 100.0, NOW + 50.0, NOW - 1e9, 1.0, 2.0, 3.0, -np.inf, -5.0, np.inf]
        ),
        "created_at": np.array([0.0, 0.0, 0.0, 0.0, 11.0, 12.0, 13.0, 7.0, np.inf, 8.0]),
        "tier_since": np.array([0.0, 0.0, 0.0, 0.0, 21.0, 22.0, 23.0, 4.0, 5.0, -np.inf]),
        "now": NOW,
        "tau_seconds": tau,
    }
    out = K.retention_scores(**args)
    expected = [
        0.7 * 1.0 + 0.3 * 1.0,  # accessed now
        0.7 * 0.5 + 0.3 * math.exp(-1.0),  # one tau ago
        0.0 + 0.3 * 1.0,  # accessed in the future: recency 1
        0.7 * 0.25 + 0.0,  # long ago: recency 0
        11.0,  # recency policy: created_at
        22.0,  # fifo: tier_since
        3.0,  # lru: accessed_at
        7.0,
        5.0,
        np.inf,
    ]
    np.testing.assert_allclose(out, expected, **F32)
    check_retention(args, out)


def test_retention_scores_namespaces_with_different_policies():
    """The same row data scored under each namespace's policy."""
    n = 4
    args = {
        "ns": np.arange(n, dtype=np.int32),
        "policy": np.array([4, 3, 2, 1], np.int8),
        "decayed": np.full(n, 0.5, np.float32),
        "accessed_at": np.full(n, NOW - 10.0),
        "created_at": np.full(n, NOW - 30.0),
        "tier_since": np.full(n, NOW - 20.0),
        "now": NOW,
        "tau_seconds": 10.0,
    }
    out = K.retention_scores(**args)
    np.testing.assert_allclose(
        out, [NOW - 10.0, NOW - 20.0, NOW - 30.0, 0.35 + 0.3 * math.exp(-1.0)], rtol=1e-12
    )


@pytest.mark.parametrize("n", [0, 1, 2, 50, 300])
def test_py_func_retention_scores(pure_python, n):
    args = make_retention_inputs(n, rng_for("retention-py", n), 4)
    out = np.full(n, np.nan)
    _jit.retention_scores.py_func(
        args["ns"],
        args["policy"],
        args["decayed"],
        args["accessed_at"],
        args["created_at"],
        args["tier_since"],
        args["now"],
        args["tau_seconds"],
        out,
    )
    check_retention(args, out)


RETENTION_COLUMNS = {
    "ns": np.int32,
    "decayed": np.float32,
    "accessed_at": np.float64,
    "created_at": np.float64,
    "tier_since": np.float64,
}


def valid_retention_kwargs() -> dict:
    return make_retention_inputs(4, rng_for("retention-valid"), 3)


def test_retention_scores_valid_kwargs_are_valid():
    K.retention_scores(**valid_retention_kwargs())


@pytest.mark.parametrize("name", list(RETENTION_COLUMNS))
def test_retention_scores_rejects_bad_columns(name):
    kw = valid_retention_kwargs()
    a = kw[name]
    bad = [
        a.astype(WRONG_DTYPE[a.dtype]),
        strided(a),
        a.reshape(2, 2),
        a.tolist(),
    ]
    if name != "ns":  # ns sets the length
        bad += [a[:-1].copy(), np.concatenate([a, a[:1]])]
    for b in bad:
        with pytest.raises(ValueError):
            K.retention_scores(**{**kw, name: b})


@pytest.mark.parametrize("bad", [np.ones(0, np.int8), np.ones((3, 1), np.int8), np.ones((1, 3), np.int8)])
def test_retention_scores_rejects_policy_table_shape(bad):
    with pytest.raises(ValueError, match="policy"):
        K.retention_scores(**{**valid_retention_kwargs(), "policy": bad})


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan")])
def test_retention_scores_rejects_bad_tau(tau):
    with pytest.raises(ValueError, match="tau"):
        K.retention_scores(**{**valid_retention_kwargs(), "tau_seconds": tau})


def test_retention_scores_policy_as_list():
    kw = valid_retention_kwargs()
    expected = K.retention_scores(**kw)
    np.testing.assert_array_equal(K.retention_scores(**{**kw, "policy": kw["policy"].tolist()}), expected)


# --------------------------------------------------------------------------------------------
# select_evictions
# --------------------------------------------------------------------------------------------


def make_eviction_inputs(n: int, rng: np.random.Generator, groups: int) -> dict:
    group = rng.integers(0, groups, n).astype(np.int64)
    kind = rng.choice(3, n, p=[0.6, 0.2, 0.2])  # mostly integer scores: many ties
    score = np.select(
        [kind == 0, kind == 1],
        [rng.integers(0, 4, n).astype(np.float64), rng.choice([-np.inf, np.inf, -0.0, 0.0], n)],
        rng.normal(size=n),
    )
    per_group = max(1, n // groups)  # ~0.7 of these are candidates: most groups are cut, some not
    capacity = rng.integers(0, per_group + 2, groups).astype(np.int64)
    capacity[rng.random(groups) < 0.15] = 0
    capacity[rng.random(groups) < 0.15] = np.iinfo(np.int64).max
    return {"group": group, "score": score, "candidates": rng.random(n) < 0.7, "capacity": capacity}


def check_select(args: dict, evict: np.ndarray) -> None:
    assert evict.dtype == np.bool_
    np.testing.assert_array_equal(evict, ref_select(**args))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("groups", [1, 3, 10])
def test_select_evictions_random(n, groups):
    args = make_eviction_inputs(n, rng_for("select", n, groups), groups)
    check_select(args, K.select_evictions(**args))


@pytest.mark.parametrize("n", [0, 1, 2, 50, 1000])
def test_select_evictions_random_all_candidates_tight_capacity(n):
    rng = rng_for("select-tight", n)
    args = make_eviction_inputs(n, rng, 4)
    args["candidates"][:] = True
    args["capacity"] = rng.integers(0, max(1, n // 4), 4).astype(np.int64)
    evict = K.select_evictions(**args)
    check_select(args, evict)
    # Per group, exactly max(0, count - capacity) rows are marked.
    counts = Counter(args["group"].tolist())
    for g in range(4):
        assert int(evict[args["group"] == g].sum()) == max(0, counts[g] - int(args["capacity"][g]))


def test_select_evictions_cuts_inside_runs_of_ties():
    """Integer scores in 0..3: each group's cut falls inside a run of tied scores."""
    rng = rng_for("select-ties")
    n = 1000
    args = {
        "group": rng.integers(0, 3, n).astype(np.int64),
        "score": rng.integers(0, 4, n).astype(np.float64),
        "candidates": rng.random(n) < 0.9,
        "capacity": np.array([100, 150, 220], np.int64),
    }
    evict = K.select_evictions(**args)
    check_select(args, evict)
    for g in range(3):
        in_g = args["candidates"] & (args["group"] == g)
        kept, gone = in_g & ~evict, in_g & evict
        assert int(kept.sum()) == args["capacity"][g]
        # The highest evicted score equals the lowest kept one; within it, lower rows went first.
        edge = args["score"][gone].max()
        assert edge == args["score"][kept].min()
        assert (
            np.flatnonzero(gone & (args["score"] == edge)).max()
            < np.flatnonzero(kept & (args["score"] == edge)).min()
        )


# (id, group, score, candidates, capacity, expected evict)
SELECT_EDGES = [
    ("empty", [], [], [], [0], []),
    ("one-row-cap-0", [0], [1.0], [True], [0], [True]),
    ("one-row-cap-1", [0], [1.0], [True], [1], [False]),
    ("one-row-not-candidate", [0], [1.0], [False], [0], [False]),
    ("zero-capacity-all", [0, 0, 0], [3.0, 1.0, 2.0], [True] * 3, [0], [True] * 3),
    ("capacity-equal-count", [0, 0, 0], [3.0, 1.0, 2.0], [True] * 3, [3], [False] * 3),
    ("capacity-larger", [0, 0, 0], [3.0, 1.0, 2.0], [True] * 3, [10], [False] * 3),
    ("capacity-int64-max", [0, 0], [1.0, 2.0], [True] * 2, [2**63 - 1], [False] * 2),
    ("lowest-evicted", [0, 0, 0], [3.0, 1.0, 2.0], [True] * 3, [2], [False, True, False]),
    ("ties-lower-row-first", [0, 0, 0, 0], [1.0, 1.0, 1.0, 0.5], [True] * 4, [2], [True, False, False, True]),
    ("ties-all-equal", [0] * 5, [2.0] * 5, [True] * 5, [2], [True, True, True, False, False]),
    ("signed-zero-tie", [0, 0], [0.0, -0.0], [True] * 2, [1], [True, False]),
    ("infinities", [0, 0, 0], [np.inf, -np.inf, 0.0], [True] * 3, [1], [False, True, True]),
    (
        "non-candidates-ignored",
        [0, 0, 0, 0],
        [0.0, 5.0, -1.0, 6.0],
        [False, True, False, True],
        [1],
        [False, True, False, False],
    ),
    (
        "non-candidates-do-not-count",
        [0, 0, 0],
        [0.0, 1.0, 2.0],
        [False, False, True],
        [1],
        [False, False, False],
    ),
    (
        "groups-independent",
        [0, 1, 0, 1, 2],
        [1.0, 1.0, 2.0, 0.0, -5.0],
        [True] * 5,
        [1, 1, 1],
        [True, False, False, True, False],
    ),
    ("group-without-rows", [2, 2], [1.0, 0.0], [True] * 2, [0, 0, 1], [False, True]),
    (
        "interleaved-groups-ties",
        [1, 0, 1, 0, 1, 0],
        [1.0] * 6,
        [True] * 6,
        [1, 2],
        [True, True, False, True, False, False],
    ),
]


@pytest.mark.parametrize("case", SELECT_EDGES, ids=[c[0] for c in SELECT_EDGES])
def test_select_evictions_edge_cases(case):
    _, group, score, candidates, capacity, expected = case
    args = {
        "group": np.array(group, np.int64),
        "score": np.array(score, np.float64),
        "candidates": np.array(candidates, np.bool_),
        "capacity": np.array(capacity, np.int64),
    }
    evict = K.select_evictions(**args)
    np.testing.assert_array_equal(evict, np.array(expected, np.bool_))
    check_select(args, evict)


def test_select_evictions_ignores_non_candidate_groups_and_scores():
    """Rows outside ``candidates`` are not examined: any group id and a NaN score are fine there."""
    args = {
        "group": np.array([0, -1, 0, 99, 0], np.int64),
        "score": np.array([1.0, np.nan, 0.0, np.nan, 2.0]),
        "candidates": np.array([True, False, True, False, True]),
        "capacity": np.array([1], np.int64),
    }
    np.testing.assert_array_equal(K.select_evictions(**args), [True, False, True, False, False])


@pytest.mark.parametrize("where", [0, 3, 4])
def test_select_evictions_rejects_nan_candidate_score(where):
    args = make_eviction_inputs(5, rng_for("select-nan"), 2)
    args["candidates"][:] = True
    args["score"][where] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        K.select_evictions(**args)


@pytest.mark.parametrize("bad_group", [-1, 2, 2**62, -(2**63)])
def test_select_evictions_rejects_candidate_group_out_of_range(bad_group):
    args = make_eviction_inputs(5, rng_for("select-range"), 2)
    args["candidates"][:] = True
    args["group"][2] = bad_group
    with pytest.raises(ValueError, match="group"):
        K.select_evictions(**args)


SELECT_COLUMNS = {"group": np.int64, "score": np.float64, "candidates": np.bool_}


def valid_select_kwargs() -> dict:
    args = make_eviction_inputs(4, rng_for("select-valid"), 2)
    args["candidates"][:] = True
    return args


def test_select_evictions_valid_kwargs_are_valid():
    K.select_evictions(**valid_select_kwargs())


@pytest.mark.parametrize("name", list(SELECT_COLUMNS))
def test_select_evictions_rejects_bad_columns(name):
    kw = valid_select_kwargs()
    a = kw[name]
    bad = [a.astype(WRONG_DTYPE[a.dtype]), strided(a), a.reshape(2, 2), a.tolist()]
    if name != "group":  # group sets the length
        bad += [a[:-1].copy(), np.concatenate([a, a[:1]])]
    for b in bad:
        with pytest.raises(ValueError):
            K.select_evictions(**{**kw, name: b})


@pytest.mark.parametrize("bad", [np.ones(0, np.int64), np.ones((2, 1), np.int64), np.ones((1, 2), np.int64)])
def test_select_evictions_rejects_capacity_shape(bad):
    with pytest.raises(ValueError, match="capacity"):
        K.select_evictions(**{**valid_select_kwargs(), "capacity": bad})


def test_select_evictions_capacity_table_too_short_for_groups():
    kw = valid_select_kwargs()
    kw["group"] = np.array([0, 1, 2, 0], np.int64)
    with pytest.raises(ValueError, match="group"):
        K.select_evictions(**{**kw, "capacity": np.array([1, 1], np.int64)})


# -- the eviction kernel itself, jitted and pure Python -------------------------------------------
# Depending on the version, the wrapper either sorts and lets ``_jit.mark_evictions`` walk the order, or
# hands the columns to ``_jit.select_evictions``; test whichever kernels exist.

EVICTION_KERNELS = [name for name in ("select_evictions", "mark_evictions") if hasattr(_jit, name)]


def run_eviction_kernel(fn, name: str, args: dict) -> tuple[np.ndarray, int]:
    n = len(args["group"])
    evict = np.zeros(n, np.bool_)
    if name == "mark_evictions":
        order = np.array(ref_order(args["group"], args["score"], args["candidates"]), np.int64)
        counts = Counter(args["group"][args["candidates"]].tolist())
        count = np.array([counts[g] for g in range(len(args["capacity"]))], np.int64)
        marked = fn(order, args["group"], args["capacity"], count, evict)
    else:
        marked = fn(args["group"], args["score"], args["candidates"], args["capacity"], evict)
    return evict, int(marked)


def test_an_eviction_kernel_exists():
    assert EVICTION_KERNELS


@pytest.mark.parametrize("name", EVICTION_KERNELS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("groups", [1, 3, 10])
@pytest.mark.parametrize("impl", ["jit", "py_func"])
def test_eviction_kernel(request, name, n, groups, impl):
    if impl == "py_func":
        request.getfixturevalue("pure_python")
    fn = getattr(_jit, name)
    args = make_eviction_inputs(n, rng_for("evict-kernel", n, groups), groups)
    evict, marked = run_eviction_kernel(fn.py_func if impl == "py_func" else fn, name, args)
    expected = ref_select(**args)
    np.testing.assert_array_equal(evict, expected)
    assert marked == int(expected.sum())


@pytest.mark.parametrize("name", EVICTION_KERNELS)
@pytest.mark.parametrize("case", SELECT_EDGES, ids=[c[0] for c in SELECT_EDGES])
def test_py_func_eviction_kernel_edge_cases(pure_python, name, case):
    _, group, score, candidates, capacity, expected = case
    args = {
        "group": np.array(group, np.int64),
        "score": np.array(score, np.float64),
        "candidates": np.array(candidates, np.bool_),
        "capacity": np.array(capacity, np.int64),
    }
    evict, marked = run_eviction_kernel(getattr(_jit, name).py_func, name, args)
    np.testing.assert_array_equal(evict, np.array(expected, np.bool_))
    assert marked == sum(expected)


@pytest.mark.parametrize("bad", ["nan", "group"])
def test_py_func_select_evictions_wrapper_checks(pure_python, monkeypatch, bad):
    """The wrapper's checks hold with the kernel run as plain Python (wherever they live)."""
    for name in EVICTION_KERNELS:
        monkeypatch.setattr(_jit, name, getattr(_jit, name).py_func)
    args = make_eviction_inputs(6, rng_for("evict-py-checks"), 2)
    args["candidates"][:] = True
    if bad == "nan":
        args["score"][4] = np.nan
    else:
        args["group"][4] = 2
    with pytest.raises(ValueError):
        K.select_evictions(**args)
    args["candidates"][4] = False  # the bad row is no longer a candidate
    check_select(args, K.select_evictions(**args))


def test_select_evictions_negative_capacity(pure_python, monkeypatch):
    """A capacity below zero must be rejected (ValueError) or treated as zero (evict every candidate);
    run through the wrapper with the kernel as plain Python, because the jitted kernel may crash."""
    for name in EVICTION_KERNELS:
        monkeypatch.setattr(_jit, name, getattr(_jit, name).py_func)
    args = {
        "group": np.zeros(3, np.int64),
        "score": np.array([3.0, 1.0, 2.0]),
        "candidates": np.ones(3, np.bool_),
        "capacity": np.array([-1], np.int64),
    }
    try:
        evict = K.select_evictions(**args)
    except ValueError:
        return
    np.testing.assert_array_equal(evict, [True, True, True])


# --------------------------------------------------------------------------------------------
# score_rows with a per-namespace half-life table
# --------------------------------------------------------------------------------------------

SCORE = {"tau_seconds": 900.0, "floor": 0.2, "alpha": 0.5, "beta": 0.3, "gamma": 0.2}


def make_score_inputs(
    n: int, m: int, rng: np.random.Generator, namespaces: int
) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    cols = {
        "importance": grid_or_random(n, rng),
        "created_at": NOW - rng.uniform(-2 * HOUR, 1000 * HOUR, n),
        "last_access": NOW - rng.exponential(HOUR, n) + rng.choice([0.0, 600.0], n, p=[0.9, 0.1]),
        "tier": rng.integers(0, 5, n).astype(np.int8),
    }
    ns = rng.integers(0, namespaces, n).astype(np.int32)
    table = rng.choice([0.0, -1.0, 1.0, 24.0, 168.0, np.inf], (namespaces, 5))
    rows = rng.integers(0, n, m).astype(np.int64) if n else np.zeros(0, np.int64)
    rel = rng.uniform(-1.0, 1.0, len(rows)).astype(np.float32)
    return cols, ns, table, rows, rel


def check_score(got, expected) -> None:
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)  # the score sums signed terms


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("namespaces", [2, 5])
def test_score_rows_per_namespace_random(n, namespaces):
    rng = rng_for("score-ns", n, namespaces)
    m = {0: 0, 1: 1, 2: 3}.get(n, n // 2)
    cols, ns, table, rows, rel = make_score_inputs(n, m, rng, namespaces)
    got = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=ns, **SCORE)
    check_score(got, ref_score_rows_ns(rows, rel, cols, ns, table, NOW, **SCORE))


def test_score_rows_per_namespace_reads_each_namespace_row():
    """The same row in two namespaces decays by each namespace's half-life for its tier."""
    cols = {
        "importance": np.ones(4, np.float32),
        "created_at": np.full(4, NOW - 2 * HOUR),
        "last_access": np.full(4, NOW),
        "tier": np.array([2, 2, 3, 3], np.int8),
    }
    ns = np.array([0, 1, 0, 1], np.int32)
    table = np.array([[0, 0, 1.0, 2.0, 0], [0, 0, 4.0, np.inf, 0]])
    rows = np.arange(4, dtype=np.int64)
    params = {**SCORE, "floor": 0.0}
    _, _, imp = K.score_rows(
        rows, np.zeros(4, np.float32), **cols, now=NOW, half_life_hours=table, ns=ns, **params
    )
    np.testing.assert_allclose(imp, [0.25, 2**-0.5, 0.5, 1.0], **F32)


@pytest.mark.parametrize("n", [1, 50])
def test_score_rows_one_row_table_matches_flat_and_ignores_ns(n):
    """Documented: with one table row it applies to every row and ``ns`` is not read."""
    rng = rng_for("score-one-row", n)
    cols, _, table, rows, rel = make_score_inputs(n, n, rng, 1)
    flat = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table[0], **SCORE)
    as_table = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, **SCORE)
    bogus_ns = np.full(n, 77, np.int32)
    with_ns = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=bogus_ns, **SCORE)
    for a, b, c in zip(flat, as_table, with_ns, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    check_score(flat, ref_score_rows_ns(rows, rel, cols, np.zeros(n, np.int32), table, NOW, **SCORE))


def test_score_rows_per_namespace_table_as_list():
    rng = rng_for("score-list")
    cols, ns, table, rows, rel = make_score_inputs(30, 20, rng, 3)
    a = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=ns, **SCORE)
    b = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table.tolist(), ns=ns, **SCORE)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("floor", ["one", "per-namespace"])
def test_score_tables_checked_once_score_as_the_tables_they_hold(floor):
    """ScoreTables (checked once by score_tables) give what the raw tables give, in score_rows and in
    both fusion kernels."""
    from tiermem.kernels import fusion

    rng = rng_for("score-tables", floor)
    cols, ns, table, rows, rel = make_score_inputs(60, 40, rng, 3)
    floors = SCORE["floor"] if floor == "one" else np.array([0.0, 0.2, 0.9])
    params = {**SCORE, "floor": floors}
    checked = K.score_tables(table, floors)
    raw = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=ns, **params)
    got = K.score_rows(
        rows, rel, **cols, now=NOW, half_life_hours=checked, ns=ns, **{**params, "floor": None}
    )
    for a, b in zip(raw, got, strict=True):
        np.testing.assert_array_equal(a, b)
    v_rows, k_rows = np.unique(rows)[:10], np.unique(rows)[5:20]
    v_sims = rng.random(v_rows.shape[0]).astype(np.float32)
    k_sims, k_scores = (rng.random(k_rows.shape[0]).astype(np.float32) for _ in range(2))
    probed = rng.random(v_rows.shape[0]).astype(np.float32)
    fused = {
        "use_sim": True,
        "use_kw": True,
        "w_sim": 0.5,
        "w_kw": 0.5,
        "alpha": 1.0,
        "beta": 0.1,
        "gamma": 0.1,
    }
    common = {**cols, "now": NOW, "tau_seconds": SCORE["tau_seconds"], "ns": ns, **fused}
    a = fusion.fused_rank(v_rows, v_sims, k_rows, k_sims, k_scores, probed, **common,
                          half_life_hours=table, floor=floors)  # fmt: skip
    b = fusion.fused_rank(v_rows, v_sims, k_rows, k_sims, k_scores, probed, **common,
                          half_life_hours=checked, floor=None)  # fmt: skip
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    vector = (v_rows, v_sims, v_sims, probed, probed)
    rrf = {"rrf_k": 60.0, "w_vec": 1.0, "w_kw": 1.0, "row_w": None, "min_similarity": None, "alpha": 0.5,
           "beta": 0.3, "gamma": 0.2, **cols, "now": NOW, "tau_seconds": SCORE["tau_seconds"], "ns": ns}  # fmt: skip
    a2 = fusion.rrf_rank(vector, k_rows, k_sims, k_scores, **rrf, half_life_hours=table, floor=floors)
    b2 = fusion.rrf_rank(vector, k_rows, k_sims, k_scores, **rrf, half_life_hours=checked, floor=None)
    for x, y in zip(a2, b2, strict=True):
        np.testing.assert_array_equal(x, y)


def test_score_tables_refuse_what_the_raw_tables_refuse():
    table = np.full((2, 5), 24.0)
    with pytest.raises(ValueError, match="half_life_hours must not hold NaN"):
        K.score_tables(np.full((2, 5), np.nan), 0.1)
    with pytest.raises(ValueError, match="floor must be in"):
        K.score_tables(table, 1.5)
    with pytest.raises(ValueError, match="one entry per row"):
        K.score_tables(table, np.array([0.1, 0.2, 0.3]))
    cols = {
        "importance": np.ones(2, np.float32),
        "created_at": np.full(2, NOW),
        "last_access": np.full(2, NOW),
        "tier": np.array([1, 2], np.int8),
    }
    rows, rel = np.arange(2, dtype=np.int64), np.zeros(2, np.float32)
    args = {**cols, "now": NOW, "tau_seconds": 60.0, "alpha": 1.0, "beta": 0.0, "gamma": 0.0}
    with pytest.raises(ValueError, match="floor must be None with ScoreTables"):
        K.score_rows(rows, rel, **args, half_life_hours=K.score_tables(table[:1], 0.1), floor=0.1)
    with pytest.raises(ValueError, match="floor is required"):
        K.score_rows(rows, rel, **args, half_life_hours=table[:1], floor=None)
    # Built by hand with a floor table shorter than the half-life table: the kernel would read past it.
    short = K.ScoreTables(np.full((3, 5), 24.0), np.full(2, 0.1))
    with pytest.raises(ValueError, match="must come from score_tables"):
        K.score_rows(rows, rel, **args, ns=np.array([0, 2], np.int32), half_life_hours=short, floor=None)
    with pytest.raises(ValueError, match="must come from score_tables"):
        K.score_rows(
            rows,
            rel,
            **args,
            half_life_hours=K.ScoreTables(np.full((1, 4), 24.0), np.full(1, 0.1)),
            floor=None,
        )


def run_score_rows_py(rows, rel, cols, ns, table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m = len(rows)
    score, rec, imp = (np.full(m, np.nan, np.float32) for _ in range(3))
    _jit.score_rows.py_func(
        rows,
        rel,
        cols["importance"],
        cols["created_at"],
        cols["last_access"],
        cols["tier"],
        ns,
        NOW,
        SCORE["tau_seconds"],
        table,
        SCORE["floor"],
        SCORE["alpha"],
        SCORE["beta"],
        SCORE["gamma"],
        score,
        rec,
        imp,
    )
    return score, rec, imp


@pytest.mark.parametrize("n", [0, 1, 2, 50, 300])
def test_py_func_score_rows_per_namespace(pure_python, n):
    cols, ns, table, rows, rel = make_score_inputs(n, n, rng_for("score-ns-py", n), 3)
    got = run_score_rows_py(rows, rel, cols, ns, table)
    check_score(got, ref_score_rows_ns(rows, rel, cols, ns, table, NOW, **SCORE))


@pytest.mark.parametrize("bad_ns", [-1, 3, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize("impl", ["jit", "py_func"])
def test_score_rows_rejects_namespace_out_of_range(request, bad_ns, impl):
    cols, ns, table, _, rel = make_score_inputs(6, 4, rng_for("score-bad-ns"), 3)
    rows = np.array([0, 5, 2, 1], np.int64)
    ns[5] = bad_ns
    if impl == "jit":
        with pytest.raises(ValueError, match="namespace"):
            K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=ns, **SCORE)
    else:
        request.getfixturevalue("pure_python")
        with pytest.raises(ValueError, match="namespace"):
            run_score_rows_py(rows, rel, cols, ns, table)


def test_score_rows_namespace_out_of_range_in_unscored_row_is_fine():
    cols, ns, table, _, rel = make_score_inputs(6, 4, rng_for("score-bad-ns-unread"), 3)
    rows = np.array([0, 1, 2, 3], np.int64)
    ns[5] = -1
    ns[4] = 3
    got = K.score_rows(rows, rel, **cols, now=NOW, half_life_hours=table, ns=ns, **SCORE)
    check_score(got, ref_score_rows_ns(rows, rel, cols, ns, table, NOW, **SCORE))


def valid_score_kwargs() -> dict:
    cols, ns, table, rows, rel = make_score_inputs(5, 3, rng_for("score-valid"), 2)
    return {"rows": rows, "relevance": rel, **cols, "now": NOW, "half_life_hours": table, "ns": ns, **SCORE}


def test_score_rows_per_namespace_valid_kwargs_are_valid():
    K.score_rows(**valid_score_kwargs())


def test_score_rows_per_namespace_requires_ns():
    kw = valid_score_kwargs()
    del kw["ns"]
    with pytest.raises(ValueError, match="ns"):
        K.score_rows(**kw)


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros(5, np.int64),
        np.zeros(5, np.int16),
        np.zeros(4, np.int32),
        np.zeros(6, np.int32),
        np.zeros(10, np.int32)[::2],
        np.zeros((5, 1), np.int32),
        [0, 0, 0, 0, 0],
    ],
    ids=["int64", "int16", "short", "long", "strided", "2d", "list"],
)
def test_score_rows_rejects_bad_ns(bad):
    with pytest.raises(ValueError, match="ns"):
        K.score_rows(**{**valid_score_kwargs(), "ns": bad})


@pytest.mark.parametrize(
    "bad",
    [
        np.ones((2, 4)),
        np.ones((2, 6)),
        np.ones((0, 5)),
        np.ones((2, 5, 1)),
        np.ones(4),
        np.ones(6),
        np.array([[1.0, 2.0, np.nan, 1.0, 1.0], [1.0] * 5]),
    ],
    ids=["2x4", "2x6", "0x5", "3d", "flat4", "flat6", "nan"],
)
def test_score_rows_rejects_half_life_table_shape(bad):
    with pytest.raises(ValueError, match="half_life_hours"):
        K.score_rows(**{**valid_score_kwargs(), "half_life_hours": bad})


# --------------------------------------------------------------------------------------------
# Parallel (prange) kernels run under kernels.PARALLEL_LOCK
# --------------------------------------------------------------------------------------------


def lifecycle_call(name: str) -> None:
    if name == "plan_moves":
        K.plan_moves(**valid_plan_kwargs())
    elif name == "retention_scores":
        K.retention_scores(**valid_retention_kwargs())
    else:
        K.select_evictions(**valid_select_kwargs())


@pytest.mark.parametrize(
    "name",
    [
        "plan_moves",
        "retention_scores",
        "select_evictions",
    ],
)
def test_parallel_kernels_run_under_the_lock(monkeypatch, name):
    """Documented in _jit: parallel kernels' public wrappers hold ``kernels.PARALLEL_LOCK``."""
    kernel = getattr(_jit, name)
    if not kernel.targetoptions.get("parallel"):
        return  # a serial kernel needs no lock
    held: list[bool] = []

    def spy(*args):
        held.append(K.PARALLEL_LOCK.locked())
        return kernel(*args)

    monkeypatch.setattr(_jit, name, spy)
    lifecycle_call(name)
    assert held == [True]
