"""Tests for the search-path kernels ``prior_bounds``, ``selection_bitmap``, ``tier_counts`` and
``row_weights`` against NumPy references.

The references are written from the documented semantics (kernels/__init__.py), not from the kernels:

* prior_bounds: for each row r with todo[r], bound = w(r) * (base + prior(r)) + 1e-5 where prior is
  beta*rec_ub[r] + gamma*imp_ub[r] if r < len(gen0) and gen[r] == gen0[r] (bounds still valid),
  else beta + gamma*importance[r] (the trivial bound); w = row_w or 1. Rows whose bound > bar are
  returned in row order with their bounds.
* selection_bitmap: bit i (little-endian) set iff slots[i] >= 0, slots[i] < len(allowed) and
  allowed[slots[i]]; equal to ``np.packbits(ok, bitorder="little")``; plus the count of set bits.

Besides randomized comparisons and hand-computed edge cases, the contract that the search path relies
on is checked: bounds computed by ``score_rows`` at t0 bound the exact prior at every later time.
"""

from __future__ import annotations

import numpy as np
import pytest

from tiermem import kernels as K
from tiermem.kernels import _jit

SIZES = [0, 1, 2, 17, 1000]
F32 = {"rtol": 1e-6, "atol": 0.0}
BOUND_TOL = {"rtol": 1e-6, "atol": 1e-6}  # sums of signed terms (a negative base) may cancel
SLACK = 1e-5  # the kernel's documented float32 slack
NOW = 1.7e9
HL = np.array([0.0, 1.0, 24.0, 168.0, np.inf])  # tier 0 and tier 4 never decay


def rng_for(*key: object) -> np.random.Generator:
    """A fixed-seed generator per test case (seed derived from the case parameters, not hash())."""
    seed = 12345
    for part in key:
        for ch in repr(part):
            seed = (seed * 131 + ord(ch)) % (2**32)
    return np.random.default_rng(seed)


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def ref_prior_bounds(
    todo, gen, gen0, rec_ub, imp_ub, importance, beta, gamma, base, bar, row_w=None
) -> tuple[np.ndarray, np.ndarray]:
    n, n0 = len(todo), len(gen0)
    cached = np.zeros(n, np.bool_)
    cached[:n0] = gen[:n0] == gen0
    rec = np.zeros(n, np.float64)
    imp = np.zeros(n, np.float64)
    rec[:n0] = rec_ub
    imp[:n0] = imp_ub
    prior = np.where(cached, beta * rec + gamma * imp, beta + gamma * importance.astype(np.float64))
    b = base + prior
    if row_w is not None:
        b = b * row_w.astype(np.float64)
    b = b + SLACK
    keep = todo & (b > bar)
    return np.flatnonzero(keep).astype(np.int64), b[keep].astype(np.float32)


def ref_selection_bitmap(slots, allowed) -> tuple[np.ndarray, int]:
    ok = (slots >= 0) & (slots < len(allowed))
    ok[ok] = allowed[slots[ok]]
    return np.packbits(ok, bitorder="little"), int(ok.sum())


def ref_prior_exact(cols, now, tau, hl_table, floor, beta, gamma) -> np.ndarray:
    """beta*recency + gamma*decayed importance at ``now`` (float64), from the documented formulas."""
    hl = hl_table[cols["ns"].astype(np.intp), cols["tier"].astype(np.intp)]
    imp = cols["importance"].astype(np.float64)
    with np.errstate(all="ignore"):
        age_h = np.maximum(now - cols["created_at"], 0.0) / 3600.0
        decays = (hl > 0) & np.isfinite(hl)
        d = imp * np.power(0.5, np.where(decays, age_h / np.where(decays, hl, 1.0), 0.0))
        d = np.where(decays, np.maximum(d, floor * imp), imp)
        rec = np.exp(-np.maximum(now - cols["last_access"], 0.0) / tau)
    return beta * rec + gamma * d


# --------------------------------------------------------------------------------------------
# Random inputs
# --------------------------------------------------------------------------------------------


def make_bounds_inputs(n: int, rng: np.random.Generator, n0: int | None = None) -> dict:
    """Random prior_bounds inputs: some rows changed (gen moved), some newer (past len(gen0))."""
    if n0 is None:
        n0 = int(rng.integers(0, n + 1)) if n else 0
    gen0 = rng.integers(0, 5, n0).astype(np.int64) * 2
    gen = np.concatenate([gen0, rng.integers(0, 5, n - n0).astype(np.int64) * 2])
    changed = rng.random(n0) < 0.3
    gen[:n0][changed] += 2
    importance = rng.random(n).astype(np.float32)
    importance[rng.random(n) < 0.1] = 0.0
    importance[rng.random(n) < 0.1] = 1.0
    rec_ub = rng.random(n0).astype(np.float32)
    imp_ub = (importance[:n0] * rng.random(n0)).astype(np.float32)
    row_w = rng.choice(np.array([0.0, 0.4, 0.55, 0.85, 1.0, 1.7], np.float32), n).astype(np.float32)
    return {
        "todo": rng.random(n) < 0.8,
        "gen": gen,
        "gen0": gen0,
        "rec_ub": rec_ub,
        "imp_ub": imp_ub,
        "importance": importance,
        "row_w": row_w,
    }


def call_prior_bounds(args: dict, beta, gamma, base, bar, weighted: bool):
    kw = {k: v for k, v in args.items() if k not in ("todo", "row_w")}
    return K.prior_bounds(
        args["todo"],
        **kw,
        beta=beta,
        gamma=gamma,
        base=base,
        bar=bar,
        row_w=args["row_w"] if weighted else None,
    )


def call_ref(args: dict, beta, gamma, base, bar, weighted: bool):
    return ref_prior_bounds(
        args["todo"],
        args["gen"],
        args["gen0"],
        args["rec_ub"],
        args["imp_ub"],
        args["importance"],
        beta,
        gamma,
        base,
        bar,
        args["row_w"] if weighted else None,
    )


def bar_of(kind: str, bounds: np.ndarray) -> float:
    """A bar below every bound, at their median, above them all, or at zero."""
    return {
        "-inf": -np.inf,
        "median": float(np.median(bounds)) if bounds.size else 0.0,
        "above-all": float(bounds.max()) + 1.0 if bounds.size else 1.0,
        "zero": 0.0,
    }[kind]


def check_same(got, expected, bar: float = -np.inf, ref_all=None) -> None:
    """Rows and bounds as the reference computes them. The kernel may compute in float32: a row whose
    reference bound is within rounding of ``bar`` may go either way (``ref_all``: the reference
    (rows, bounds) at bar = -inf, to find those rows)."""
    rows, bounds = got
    e_rows, e_bounds = expected
    assert rows.dtype == np.int64 and bounds.dtype == np.float32
    assert np.all(np.diff(rows) > 0)  # row order, no repeats
    if ref_all is not None:
        all_rows, all_b = ref_all
        near = all_rows[np.abs(all_b.astype(np.float64) - bar) <= BOUND_TOL["atol"] + 1e-6 * abs(bar)]
        rows_k, e_rows_k = np.setdiff1d(rows, near), np.setdiff1d(e_rows, near)
        np.testing.assert_array_equal(rows_k, e_rows_k)
        keep = np.isin(rows, e_rows)
        rows, bounds = rows[keep], bounds[keep]
        keep = np.isin(e_rows, rows)
        e_rows, e_bounds = e_rows[keep], e_bounds[keep]
    np.testing.assert_array_equal(rows, e_rows)
    np.testing.assert_allclose(bounds, e_bounds, **BOUND_TOL)


# --------------------------------------------------------------------------------------------
# prior_bounds: randomized
# --------------------------------------------------------------------------------------------

WEIGHTS = [(0.3, 0.2, 0.0), (0.3, 0.2, 0.25), (0.0, 0.0, 0.4), (1.0, 0.0, -0.2), (0.0, 1.0, 0.1)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bgb", WEIGHTS, ids=lambda w: "b{}-g{}-base{}".format(*w))
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "row_w"])
@pytest.mark.parametrize("bar_kind", ["-inf", "median", "above-all", "zero"])
def test_prior_bounds_random(n, bgb, weighted, bar_kind):
    beta, gamma, base = bgb
    args = make_bounds_inputs(n, rng_for("prior", n, bgb, weighted, bar_kind))
    saved = {k: v.copy() for k, v in args.items()}
    _, all_b = call_ref(args, beta, gamma, base, -np.inf, weighted)
    bar = bar_of(bar_kind, all_b)
    got = call_prior_bounds(args, beta, gamma, base, bar, weighted)
    ref_all = call_ref(args, beta, gamma, base, -np.inf, weighted)
    check_same(got, call_ref(args, beta, gamma, base, bar, weighted), bar, ref_all)
    if bar_kind == "-inf":
        np.testing.assert_array_equal(got[0], np.flatnonzero(args["todo"]))
    if bar_kind == "above-all":
        assert got[0].shape == (0,) and got[1].shape == (0,)
    for k, v in args.items():  # inputs untouched
        np.testing.assert_array_equal(v, saved[k])


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("n0_kind", ["none", "all", "half"])
def test_prior_bounds_gen0_lengths(n, n0_kind):
    """gen0 shorter than todo: rows at or past len(gen0) are newer and get the trivial bound."""
    n0 = {"none": 0, "all": n, "half": n // 2}[n0_kind]
    args = make_bounds_inputs(n, rng_for("prior-n0", n, n0_kind), n0=n0)
    args["todo"][:] = True
    rows, bounds = call_prior_bounds(args, 0.3, 0.2, 0.1, -np.inf, False)
    check_same((rows, bounds), call_ref(args, 0.3, 0.2, 0.1, -np.inf, False))
    newer = np.arange(n) >= n0
    expected_newer = (0.1 + 0.3 + 0.2 * args["importance"].astype(np.float64) + SLACK).astype(np.float32)
    np.testing.assert_allclose(bounds[newer], expected_newer[newer], **F32)


def test_prior_bounds_todo_all_false():
    args = make_bounds_inputs(50, rng_for("todo-false"))
    args["todo"][:] = False
    for weighted in (False, True):
        rows, bounds = call_prior_bounds(args, 0.3, 0.2, 0.5, -np.inf, weighted)
        assert rows.shape == (0,) and bounds.shape == (0,)


def test_prior_bounds_hand_computed():
    # rows: 0 cached, 1 changed (gen moved), 2 cached, 3 newer (past gen0), 4 not todo
    todo = np.array([True, True, True, True, False])
    gen = np.array([4, 7, 0, 1, 0], np.int64)
    gen0 = np.array([4, 6, 0], np.int64)
    rec_ub = np.array([0.5, 0.9, 0.0], np.float32)
    imp_ub = np.array([0.25, 0.9, 0.0], np.float32)
    importance = np.array([1.0, 0.5, 0.0, 1.0, 1.0], np.float32)
    beta, gamma, base = 0.4, 0.2, 0.1
    common = {"gen": gen, "gen0": gen0, "rec_ub": rec_ub, "imp_ub": imp_ub, "importance": importance}
    rows, bounds = K.prior_bounds(todo, **common, beta=beta, gamma=gamma, base=base, bar=-np.inf)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])
    expected = [
        0.1 + 0.4 * 0.5 + 0.2 * 0.25,  # cached bounds
        0.1 + 0.4 + 0.2 * 0.5,  # changed: recency <= 1, decayed importance <= importance
        0.1 + 0.0,  # cached, both bounds zero
        0.1 + 0.4 + 0.2 * 1.0,  # newer row
    ]
    np.testing.assert_allclose(bounds, np.array(expected) + SLACK, rtol=1e-6)
    # row weights, including 0 (a row with weight 0 keeps only the slack)
    w = np.array([2.0, 0.0, 1.0, 0.5, 1.0], np.float32)
    rows, bounds = K.prior_bounds(todo, **common, beta=beta, gamma=gamma, base=base, bar=-np.inf, row_w=w)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])
    np.testing.assert_allclose(bounds, np.array(expected) * w[:4] + SLACK, rtol=1e-6)
    # the bar is strict: a bound equal to it is dropped; the slack counts towards the bound
    rows, _ = K.prior_bounds(todo, **common, beta=beta, gamma=gamma, base=base, bar=SLACK, row_w=w)
    np.testing.assert_array_equal(rows, [0, 2, 3])
    rows, _ = K.prior_bounds(todo, **common, beta=beta, gamma=gamma, base=base, bar=0.1)
    np.testing.assert_array_equal(rows, [0, 1, 2, 3])  # 0.1 + slack > 0.1
    rows, _ = K.prior_bounds(todo, **common, beta=beta, gamma=gamma, base=base, bar=0.5)
    np.testing.assert_array_equal(rows, [1, 3])
    # beta = gamma = 0: every bound is the base (times the weight)
    rows, bounds = K.prior_bounds(todo, **common, beta=0.0, gamma=0.0, base=0.3, bar=-np.inf)
    np.testing.assert_allclose(bounds, np.full(4, 0.3 + SLACK), rtol=1e-6)


@pytest.mark.parametrize("n", [1, 17, 1000])
def test_prior_bounds_importance_extremes_and_zero_weights(n):
    rng = rng_for("prior-extremes", n)
    args = make_bounds_inputs(n, rng, n0=n // 2)
    args["importance"][:] = np.where(rng.random(n) < 0.5, 0.0, 1.0).astype(np.float32)
    args["imp_ub"][:] = args["importance"][: n // 2]
    args["row_w"][:] = 0.0
    for beta, gamma in ((0.0, 0.0), (0.3, 0.2), (0.0, 1.0)):
        for weighted in (False, True):
            for bar in (-np.inf, 0.0, 0.2, 1.0):
                got = call_prior_bounds(args, beta, gamma, 0.05, bar, weighted)
                ref_all = call_ref(args, beta, gamma, 0.05, -np.inf, weighted)
                check_same(got, call_ref(args, beta, gamma, 0.05, bar, weighted), bar, ref_all)
                if weighted and bar >= SLACK:
                    assert got[0].shape == (0,)  # weight 0: only the slack is left


# --------------------------------------------------------------------------------------------
# prior_bounds: the contract the search path relies on
# --------------------------------------------------------------------------------------------

TAU = 3600.0
FLOOR = 0.1


def make_rows(n: int, rng: np.random.Generator, n_ns: int) -> dict[str, np.ndarray]:
    importance = rng.random(n).astype(np.float32)
    importance[rng.random(n) < 0.1] = 0.0
    importance[rng.random(n) < 0.1] = 1.0
    created_at = NOW - rng.uniform(-7200.0, 1000.0 * 3600.0, n)  # some created in the future
    created_at[rng.random(n) < 0.05] = NOW
    last_access = NOW - rng.exponential(3600.0, n)
    last_access[rng.random(n) < 0.1] = NOW + rng.uniform(0.0, 7200.0)  # accessed "after" t0
    return {
        "importance": importance,
        "created_at": created_at,
        "last_access": last_access,
        "tier": rng.integers(0, 5, n).astype(np.int8),
        "ns": rng.integers(0, n_ns, n).astype(np.int32),
    }


def _score_rows(cols, now, hl, beta, gamma):
    n = cols["importance"].shape[0]
    return K.score_rows(
        np.arange(n, dtype=np.int64),
        np.zeros(n, np.float32),
        importance=cols["importance"],
        created_at=cols["created_at"],
        last_access=cols["last_access"],
        tier=cols["tier"],
        now=now,
        tau_seconds=TAU,
        half_life_hours=hl,
        floor=FLOOR,
        alpha=0.0,
        beta=beta,
        gamma=gamma,
        ns=cols["ns"],
    )


HL_TABLES = {
    "one-row": np.array([HL]),
    "per-namespace": np.array(
        [
            HL,
            [0.0, 1e-3, 0.5, 2.0, 1e6],
            [-1.0, np.inf, 3.0, 0.0, 24.0],
        ]
    ),
}
LATER = [0.0, 1e-3, 1.0, 60.0, 3600.0, 86400.0, 30 * 86400.0, 1e9]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("hl_kind", list(HL_TABLES))
@pytest.mark.parametrize("bg", [(0.3, 0.2), (1.0, 0.0), (0.0, 1.0), (0.25, 0.75)], ids=str)
def test_prior_bounds_bound_exact_priors_later(n, hl_kind, bg):
    """rec/imp from score_rows at t0 (alpha=0), rows unchanged: for every t >= t0 the exact prior
    (beta*recency + gamma*decayed importance, as score_rows computes it at t) is <= the bound."""
    beta, gamma = bg
    hl = HL_TABLES[hl_kind]
    rng = rng_for("contract", n, hl_kind, bg)
    cols = make_rows(n, rng, hl.shape[0])
    _, rec_ub, imp_ub = _score_rows(cols, NOW, hl, 0.0, 0.0)
    gen = rng.integers(0, 100, n).astype(np.int64)
    todo = np.ones(n, np.bool_)
    w = rng.choice(np.array([0.0, 0.55, 1.0, 3.0], np.float32), n).astype(np.float32)
    common = {"gen": gen, "gen0": gen.copy(), "rec_ub": rec_ub, "imp_ub": imp_ub}
    rows, bound = K.prior_bounds(
        todo, **common, importance=cols["importance"], beta=beta, gamma=gamma, base=0.0, bar=-np.inf
    )
    np.testing.assert_array_equal(rows, np.arange(n))
    rows_w, bound_w = K.prior_bounds(
        todo, **common, importance=cols["importance"], beta=beta, gamma=gamma, base=0.0, bar=-np.inf, row_w=w
    )
    np.testing.assert_array_equal(rows_w, np.arange(n))
    for dt in LATER:
        exact, _, _ = _score_rows(cols, NOW + dt, hl, beta, gamma)  # what the search scores
        assert np.all(exact <= bound), dt
        assert np.all(exact * w <= bound_w), dt
        ref = ref_prior_exact(cols, NOW + dt, TAU, hl, FLOOR, beta, gamma)
        assert np.all(ref <= bound.astype(np.float64)), dt


@pytest.mark.parametrize("n", [17, 1000])
def test_prior_bounds_bound_changed_and_newer_rows(n):
    """Rows that change after the bounds were cached (importance raised, accessed now) and rows added
    later are bounded too, as long as their generation moved / they are past gen0."""
    rng = rng_for("contract-changed", n)
    hl = HL_TABLES["per-namespace"]
    cols = make_rows(n, rng, hl.shape[0])
    n0 = n - n // 5  # the last fifth is added after the bounds were computed
    old = {k: v[:n0].copy() for k, v in cols.items()}
    _, rec_ub, imp_ub = _score_rows(old, NOW, hl, 0.0, 0.0)
    gen0 = np.zeros(n0, np.int64)
    gen = np.zeros(n, np.int64)
    t = NOW + 7200.0
    changed = np.flatnonzero(rng.random(n0) < 0.2)
    cols["importance"][changed] = 1.0
    cols["last_access"][changed] = t
    cols["tier"][changed] = rng.integers(0, 5, changed.shape[0]).astype(np.int8)
    gen[changed] += 2
    cols["last_access"][n0:] = t
    for beta, gamma in ((0.3, 0.2), (0.0, 1.0), (1.0, 0.0)):
        _, bound = K.prior_bounds(
            np.ones(n, np.bool_),
            gen=gen,
            gen0=gen0,
            rec_ub=rec_ub,
            imp_ub=imp_ub,
            importance=cols["importance"],
            beta=beta,
            gamma=gamma,
            base=0.0,
            bar=-np.inf,
        )
        for dt in (7200.0, 7201.0, 86400.0):
            exact, _, _ = _score_rows(cols, NOW + dt, hl, beta, gamma)
            assert np.all(exact <= bound), (beta, gamma, dt)
            if beta > 0 and changed.size and dt == 7200.0:
                # without the generation bump the cached bounds would be wrong for changed rows
                stale = beta * rec_ub[changed] + gamma * imp_ub[changed] + SLACK
                assert np.any(exact[changed] > stale)


# --------------------------------------------------------------------------------------------
# ordered_bounds: prior_bounds from bounds kept in sorted order plus a change log
# --------------------------------------------------------------------------------------------


def ref_ordered_bounds(todo, n0, order, prior, importance, log, log_from, log_to, beta, gamma, base, bar):
    """The documented procedure, in float64: logged rows, then newer rows (from n0 on), with the
    trivial bound; then ``order`` while base + prior beats the bar, rows below n0 still to do. Each
    row is examined once (todo cleared). Returns (rows, bounds, todo after)."""
    n, cap = len(todo), len(log)
    todo = todo.copy()
    rows: list[int] = []
    bounds: list[float] = []

    def trivial(r: int) -> None:
        todo[r] = False
        b = base + beta + gamma * float(importance[r]) + SLACK
        if b > bar:
            rows.append(r)
            bounds.append(b)

    for j in range(log_from, log_to):
        r = int(log[j % cap])
        if 0 <= r < n and todo[r]:
            trivial(r)
    for r in range(min(n0, n), n):
        if todo[r]:
            trivial(r)
    for i in range(len(order)):
        b = base + float(prior[i]) + SLACK
        if not b > bar:
            break
        r = int(order[i])
        if r < n and r < n0 and todo[r]:
            todo[r] = False
            rows.append(r)
            bounds.append(b)
    return np.array(rows, np.int64), np.array(bounds, np.float64), todo


def make_ordered_inputs(n: int, rng: np.random.Generator, cap: int = 64, n_view: int | None = None) -> dict:
    """A consistent state: the rows changed since the bounds (gen moved) are exactly the rows logged
    in the window (some twice, plus entries of rows past the view or unused slots of the ring), the
    window may wrap around the ring, and ``order`` sorts the cached rows by their float32 prior.
    ``n_view``: a view shorter than the rows the bounds cover (its rows only are examined)."""
    a = make_bounds_inputs(n, rng)
    beta, gamma = 0.3, 0.2
    n0 = len(a["gen0"])
    changed = np.flatnonzero(a["gen"][:n0] != a["gen0"])
    entries = np.concatenate([changed, rng.choice(changed, len(changed) // 3)]) if len(changed) else changed
    entries = np.concatenate([entries, [n + 3, -1]]).astype(np.int64)  # ignored: no such row
    rng.shuffle(entries)
    cap = max(cap, len(entries))
    log = rng.integers(-1, max(n, 1), cap).astype(np.int64)  # stale ring contents outside the window
    log_from = int(rng.integers(0, 3 * cap))
    for k, r in enumerate(entries):
        log[(log_from + k) % cap] = r
    prior = np.float32(beta) * a["rec_ub"] + np.float32(gamma) * a["imp_ub"]
    order = np.argsort(-prior, kind="stable")
    if n_view is not None:
        for k in ("todo", "gen", "importance", "row_w"):
            a[k] = a[k][:n_view].copy()
    return a | {
        "order": order,
        "prior": prior[order],
        "log": log,
        "log_from": log_from,
        "log_to": log_from + len(entries),
        "beta": beta,
        "gamma": gamma,
    }


def call_ordered(a: dict, base: float, bar: float, todo: np.ndarray | None = None):
    keys = ("order", "prior", "importance", "log", "log_from", "log_to", "beta", "gamma")
    return K.ordered_bounds(
        a["todo"] if todo is None else todo, n0=len(a["gen0"]), **{k: a[k] for k in keys}, base=base, bar=bar
    )


def call_ordered_ref(a: dict, base: float, bar: float):
    return ref_ordered_bounds(
        a["todo"], len(a["gen0"]), a["order"], a["prior"], a["importance"], a["log"],
        a["log_from"], a["log_to"], a["beta"], a["gamma"], base, bar,
    )  # fmt: skip


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("base", [0.0, 0.25, -0.2])
@pytest.mark.parametrize("bar_kind", ["-inf", "median", "above-all", "zero"])
@pytest.mark.parametrize("view", ["all", "shorter"])
def test_ordered_bounds_random(n, base, bar_kind, view):
    rng = rng_for("ordered", n, base, bar_kind, view)
    a = make_ordered_inputs(n, rng, n_view=(n * 2) // 3 if view == "shorter" else None)
    saved = {k: v.copy() for k, v in a.items() if isinstance(v, np.ndarray)}
    _, all_b, _ = call_ordered_ref(a, base, -np.inf)
    bar = bar_of(bar_kind, all_b)
    e_rows, e_bounds, e_todo = call_ordered_ref(a, base, bar)
    todo = a["todo"].copy()
    rows, bounds = call_ordered(a, base, bar, todo)
    assert rows.dtype == np.int64 and bounds.dtype == np.float32
    # float32 sums against the reference's float64: rows within rounding of the bar may go either way
    near = lambda r, b: np.abs(b - bar) <= 1e-6 + 1e-6 * abs(bar)  # noqa: E731
    keep = ~near(rows, bounds.astype(np.float64))
    e_keep = ~near(e_rows, e_bounds)
    np.testing.assert_array_equal(rows[keep], e_rows[e_keep])  # same rows, in the same order
    np.testing.assert_allclose(bounds[keep], e_bounds[e_keep], **BOUND_TOL)
    assert len(np.unique(rows)) == len(rows)  # no row twice
    if bar_kind != "median":
        np.testing.assert_array_equal(todo, e_todo)  # every examined row cleared, no other
    for k, v in saved.items():  # inputs other than todo untouched
        np.testing.assert_array_equal(a[k], v)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("bgb", WEIGHTS, ids=lambda w: "b{}-g{}-base{}".format(*w))
@pytest.mark.parametrize("q", [0.0, 0.5, 0.9])
def test_ordered_bounds_equals_prior_bounds(n, bgb, q):
    """The contract the search path relies on: with every changed row logged, the rows and bounds
    are those of a full prior_bounds pass (as sets; rounding aside), for any bar."""
    beta, gamma, base = bgb
    a = make_ordered_inputs(n, rng_for("ordered-eq", n, bgb, q))
    prior = np.float32(beta) * a["rec_ub"] + np.float32(gamma) * a["imp_ub"]
    order = np.argsort(-prior, kind="stable")
    a |= {"order": order, "prior": prior[order], "beta": beta, "gamma": gamma}
    pb = {k: a[k] for k in ("todo", "gen", "gen0", "rec_ub", "imp_ub", "importance", "row_w")}
    full_rows, full_b = call_prior_bounds(pb, beta, gamma, base, -np.inf, False)
    bar = float(np.quantile(full_b, q)) if full_b.size else 0.0
    e_rows, e_b = call_prior_bounds(pb, beta, gamma, base, bar, False)
    rows, b = call_ordered(a, base, bar, a["todo"].copy())
    order_rows = np.argsort(rows, kind="stable")
    check_same((rows[order_rows], b[order_rows]), (e_rows, e_b), bar, (full_rows, full_b))


def test_ordered_bounds_hand_computed():
    # rows: 0 cached, 1 changed and logged, 2 cached (prior 0), 3 newer (past gen0), 4 not todo,
    # 5 cached; the log window wraps a ring of 4 and names row 1 twice and a row past the view
    todo = np.array([True, True, True, True, False, True])
    n0 = 3  # rows 3..5 are newer than the bounds
    importance = np.array([1.0, 0.5, 0.0, 1.0, 1.0, 0.8], np.float32)
    beta, gamma, base = 0.4, 0.2, 0.1
    order = np.array([0, 1, 2], np.int64)  # cached priors 0.25, 0.2 (stale: row 1 changed), 0.0
    prior = np.array([0.25, 0.2, 0.0], np.float32)
    log = np.array([9, 1, 1, 42], np.int64)  # window 5..7 = ring slots 1 and 2: row 1, twice
    common = {"n0": n0, "order": order, "prior": prior, "importance": importance, "log": log}
    w = {"beta": beta, "gamma": gamma, "base": base}
    t = todo.copy()
    rows, bounds = K.ordered_bounds(t, **common, log_from=5, log_to=7, **w, bar=-np.inf)
    np.testing.assert_array_equal(rows, [1, 3, 5, 0, 2])
    expected = [
        0.1 + 0.4 + 0.2 * 0.5,  # logged: recency <= 1, decayed importance <= importance
        0.1 + 0.4 + 0.2 * 1.0,  # newer rows 3..5 (4 is not todo)
        0.1 + 0.4 + 0.2 * 0.8,
        0.1 + 0.25,  # then the order: row 0, (row 1 examined already), row 2
        0.1 + 0.0,
    ]
    np.testing.assert_allclose(bounds, np.array(expected) + SLACK, rtol=1e-6)
    np.testing.assert_array_equal(t, [False, False, False, False, False, False])
    # the walk stops at the first prior that no longer beats the bar (row 2 is not even examined)
    t = todo.copy()
    rows, _ = K.ordered_bounds(t, **common, log_from=5, log_to=7, **w, bar=0.2)
    np.testing.assert_array_equal(rows, [1, 3, 5, 0])
    assert t[2]
    # an empty window: a row not logged is taken as unchanged (the caller raises the bounds of rows
    # logged after the window was read): row 1 comes with its cached prior, in order
    rows, bounds = K.ordered_bounds(todo.copy(), **common, log_from=7, log_to=7, **w, bar=-np.inf)
    np.testing.assert_array_equal(rows, [3, 5, 0, 1, 2])
    np.testing.assert_allclose(bounds[3], 0.1 + 0.2 + SLACK, rtol=1e-6)
    # a window is at most the ring; positions are counted from 0
    for lo, hi in ((0, 5), (3, 2), (-1, 1)):
        with pytest.raises(ValueError):
            K.ordered_bounds(todo.copy(), **common, log_from=lo, log_to=hi, **w, bar=0.0)
    with pytest.raises(ValueError):
        K.ordered_bounds(
            todo.copy(), **(common | {"log": np.empty(0, np.int64)}), log_from=0, log_to=0, **w, bar=0.0
        )
    with pytest.raises(ValueError):
        K.ordered_bounds(todo.copy(), **(common | {"prior": prior[:2]}), log_from=0, log_to=0, **w, bar=0.0)
    with pytest.raises(ValueError):
        K.ordered_bounds(todo.copy(), **(common | {"n0": -1}), log_from=0, log_to=0, **w, bar=0.0)


# --------------------------------------------------------------------------------------------
# selection_bitmap
# --------------------------------------------------------------------------------------------


def make_slots(n: int, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    slots = rng.permutation(max(n, m) + 5)[:n].astype(np.int64)  # some slots >= len(allowed)
    slots[rng.random(n) < 0.2] = -1  # dead entries
    allowed = rng.random(m) < 0.5
    return slots, allowed


def slots_case(tag: str, n: int, m_kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Random slots for n entries and an ``allowed`` column of the given kind of length."""
    m = {"empty": 0, "short": n // 2, "same": n, "long": 2 * n + 3}[m_kind]
    return make_slots(n, m, rng_for(tag, n, m_kind))


def assert_unchanged(slots: np.ndarray, allowed: np.ndarray, saved: tuple[np.ndarray, np.ndarray]) -> None:
    np.testing.assert_array_equal(slots, saved[0])
    np.testing.assert_array_equal(allowed, saved[1])


@pytest.mark.parametrize("n", [*SIZES, 8, 9, 64, 1001])
@pytest.mark.parametrize("m_kind", ["empty", "short", "same", "long"])
def test_selection_bitmap_random(n, m_kind):
    slots, allowed = slots_case("bitmap", n, m_kind)
    saved = slots.copy(), allowed.copy()
    bitmap, count = K.selection_bitmap(slots, allowed)
    e_bitmap, e_count = ref_selection_bitmap(slots, allowed)
    assert bitmap.dtype == np.uint8 and bitmap.shape == ((n + 7) // 8,)
    np.testing.assert_array_equal(bitmap, e_bitmap)
    assert isinstance(count, int) and count == e_count
    assert_unchanged(slots, allowed, saved)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 1000])
def test_selection_bitmap_all_allowed(n):
    slots = np.arange(n, dtype=np.int64)[::-1].copy()
    bitmap, count = K.selection_bitmap(slots, np.ones(n, np.bool_))
    np.testing.assert_array_equal(bitmap, np.packbits(np.ones(n, np.bool_), bitorder="little"))
    assert count == n
    if n % 8:
        assert bitmap[-1] == (1 << (n % 8)) - 1  # padding bits stay clear


def test_selection_bitmap_hand_computed():
    slots = np.array([3, -1, 0, 7, 2, 2, 100, -5, 1], np.int64)
    allowed = np.array([True, False, True, True, False, True, True, True])
    bitmap, count = K.selection_bitmap(slots, allowed)
    # entries allowed: 0 (row 3), 2 (row 0), 3 (row 7), 4 and 5 (row 2); 6 past the end; 8 row 1 no
    np.testing.assert_array_equal(bitmap, [0b00111101, 0])
    assert count == 5
    bitmap, count = K.selection_bitmap(np.empty(0, np.int64), allowed)
    assert bitmap.shape == (0,) and count == 0
    bitmap, count = K.selection_bitmap(slots, np.zeros(0, np.bool_))
    np.testing.assert_array_equal(bitmap, [0, 0])
    assert count == 0
    bitmap, count = K.selection_bitmap(np.full(9, -1, np.int64), np.ones(9, np.bool_))
    np.testing.assert_array_equal(bitmap, [0, 0])
    assert count == 0


# --------------------------------------------------------------------------------------------
# allowed_entries
# --------------------------------------------------------------------------------------------


def ref_allowed_entries(slots: np.ndarray, allowed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = (slots >= 0) & (slots < allowed.shape[0])
    ok[ok] = allowed[slots[ok]]
    ids = np.flatnonzero(ok)
    return ids, slots[ids]


@pytest.mark.parametrize("n", [*SIZES, 9, 1001, 100_003])
@pytest.mark.parametrize("m_kind", ["empty", "short", "same", "long"])
def test_allowed_entries_random(n, m_kind):
    slots, allowed = slots_case("allowed-entries", n, m_kind)
    saved = slots.copy(), allowed.copy()
    ids, rows = K.allowed_entries(slots, allowed)
    e_ids, e_rows = ref_allowed_entries(slots, allowed)
    assert ids.dtype == rows.dtype == np.int64
    np.testing.assert_array_equal(ids, e_ids)
    np.testing.assert_array_equal(rows, e_rows)
    assert ids.shape[0] == K.selection_bitmap(slots, allowed)[1]  # the same entries as the bitmap's
    assert_unchanged(slots, allowed, saved)


def test_allowed_entries_hand_computed():
    slots = np.array([3, -1, 0, 7, 2, 2, 100, -5, 1], np.int64)
    allowed = np.array([True, False, True, True, False, True, True, True])
    ids, rows = K.allowed_entries(slots, allowed)
    # entries allowed: 0 (row 3), 2 (row 0), 3 (row 7), 4 and 5 (row 2); 6 past the end; 8 row 1 no
    np.testing.assert_array_equal(ids, [0, 2, 3, 4, 5])
    np.testing.assert_array_equal(rows, [3, 0, 7, 2, 2])
    ids, rows = K.allowed_entries(np.empty(0, np.int64), allowed)
    assert ids.shape == rows.shape == (0,)
    ids, rows = K.allowed_entries(slots, np.zeros(0, np.bool_))
    assert ids.shape == rows.shape == (0,)
    with pytest.raises(ValueError, match="slots must have dtype int64"):
        K.allowed_entries(slots.astype(np.int32), allowed)
    with pytest.raises(ValueError, match="allowed must have dtype bool"):
        K.allowed_entries(slots, allowed.astype(np.int8))


# --------------------------------------------------------------------------------------------
# tier_counts
# --------------------------------------------------------------------------------------------


def ref_tier_counts(mask: np.ndarray, tier: np.ndarray) -> np.ndarray:
    """Rows allowed by mask in each tier 0..4; other tier values are not counted."""
    return np.array([int(np.sum(mask & (tier == t))) for t in range(5)], np.int64)


@pytest.mark.parametrize("n", [*SIZES, 31, 32, 33, 100_003])
@pytest.mark.parametrize("density", [0.0, 0.1, 0.9, 1.0])
def test_tier_counts_random(n, density):
    rng = rng_for("tier-counts", n, density)
    tier = rng.integers(0, 5, n).astype(np.int8)
    mask = rng.random(n) < density
    saved = mask.copy(), tier.copy()
    got = K.tier_counts(mask, tier)
    assert got.dtype == np.int64 and got.shape == (5,)
    np.testing.assert_array_equal(got, ref_tier_counts(mask, tier))
    assert int(got.sum()) == int(mask.sum())
    np.testing.assert_array_equal(mask, saved[0])
    np.testing.assert_array_equal(tier, saved[1])


def test_tier_counts_hand_computed():
    tier = np.array([1, 1, 4, 0, 2, 3, 3, 3, -1, 5, 127, -128], np.int8)
    mask = np.array([1, 0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1], np.bool_)
    # tier values outside 0..4 (-1, 5, 127, -128) are not counted, whatever the mask says
    np.testing.assert_array_equal(K.tier_counts(mask, tier), [1, 1, 1, 2, 1])
    np.testing.assert_array_equal(K.tier_counts(np.zeros(12, np.bool_), tier), [0] * 5)
    np.testing.assert_array_equal(K.tier_counts(np.empty(0, np.bool_), np.empty(0, np.int8)), [0] * 5)


def test_tier_counts_rejects_bad_input():
    with pytest.raises(ValueError, match="tier must have length 3"):
        K.tier_counts(np.ones(3, np.bool_), np.ones(4, np.int8))
    with pytest.raises(ValueError, match="mask must have dtype bool"):
        K.tier_counts(np.ones(3, np.int8), np.ones(3, np.int8))
    with pytest.raises(ValueError, match="tier must have dtype int8"):
        K.tier_counts(np.ones(3, np.bool_), np.ones(3, np.int64))


# --------------------------------------------------------------------------------------------
# split_top
# --------------------------------------------------------------------------------------------


def ref_split_top(bounds: np.ndarray, bar: float, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions above bar: the size largest (ties: lower position first), then the others; each
    set in position order."""
    above = np.flatnonzero(bounds > bar)  # NaN compares False: never above
    order = np.lexsort((above, -bounds[above].astype(np.float64)))
    return np.sort(above[order[:size]]), np.sort(above[order[size:]])


def _split_bounds(n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return rng.random(n).astype(np.float32)
    if kind == "ties":  # five distinct values: the size-th largest is almost always tied
        return (rng.integers(0, 5, n) / 4).astype(np.float32)
    if kind == "equal":
        return np.full(n, 0.5, np.float32)
    if kind == "sorted":  # ascending and descending runs: bad pivots for a naive selection
        b = np.sort(rng.standard_normal(n).astype(np.float32))
        return np.concatenate([b[: n // 2], b[n // 2 :][::-1]]).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)  # "nan_inf"
    b[rng.random(n) < 0.1] = np.nan
    b[rng.random(n) < 0.05] = np.inf
    b[rng.random(n) < 0.05] = -np.inf
    return b


@pytest.mark.parametrize("n", [*SIZES, 4096, 30_001])
@pytest.mark.parametrize("kind", ["uniform", "ties", "equal", "sorted", "nan_inf"])
@pytest.mark.parametrize("bar", [-np.inf, 0.0, 0.5, 0.9])
def test_split_top_random(n, kind, bar):
    rng = rng_for("split-top", n, kind, bar)
    bounds = _split_bounds(n, kind, rng)
    saved = bounds.copy()
    for size in sorted({1, 2, 7, max(1, n // 3), 1024, n + 1}):
        top, rest = K.split_top(bounds, bar, size)
        want_top, want_rest = ref_split_top(bounds, bar, size)
        assert top.dtype == rest.dtype == np.int64
        np.testing.assert_array_equal(top, want_top)
        np.testing.assert_array_equal(rest, want_rest)
        if top.size and rest.size:
            assert bounds[top].min() >= bounds[rest].max()
    np.testing.assert_array_equal(bounds, saved)  # the selection works on a copy


def test_split_top_hand_computed():
    b = np.array([0.2, 0.9, 0.5, 0.9, np.nan, 0.1, 0.5, 0.7], np.float32)
    top, rest = K.split_top(b, 0.15, 3)
    np.testing.assert_array_equal(top, [1, 3, 7])  # 0.9, 0.9, 0.7
    np.testing.assert_array_equal(rest, [0, 2, 6])  # 0.2 and both 0.5; 0.1 and NaN are not above 0.15
    top, rest = K.split_top(b, 0.15, 4)
    np.testing.assert_array_equal(top, [1, 2, 3, 7])  # of the tied 0.5s, the lower position
    np.testing.assert_array_equal(rest, [0, 6])
    top, rest = K.split_top(b, 0.9, 2)
    assert top.size == 0 and rest.size == 0  # nothing strictly above the bar
    top, rest = K.split_top(np.empty(0, np.float32), -np.inf, 5)
    assert top.size == 0 and rest.size == 0


def test_split_top_rejects_bad_input():
    with pytest.raises(ValueError, match="bounds must have dtype float32"):
        K.split_top(np.ones(3, np.float64), 0.0, 1)
    with pytest.raises(ValueError, match="size must be >= 1"):
        K.split_top(np.ones(3, np.float32), 0.0, 0)
    with pytest.raises(ValueError, match="bounds must be 1-D"):
        K.split_top(np.ones((2, 2), np.float32), 0.0, 1)


# --------------------------------------------------------------------------------------------
# Kernel bodies in pure Python (.py_func)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def pure_python():
    with np.errstate(all="ignore"):
        yield


def _bar_between(bounds: np.ndarray, q: float) -> float:
    """A bar at quantile q that no bound is within 1e-4 of (the py_func may round in float32)."""
    if bounds.size == 0:
        return 0.0
    values = np.unique(bounds.astype(np.float64))
    gaps = np.flatnonzero(np.diff(values) > 2e-4)
    if gaps.size == 0:
        return float(values[0]) - 1.0
    i = gaps[min(int(q * gaps.size), gaps.size - 1)]
    return float((values[i] + values[i + 1]) / 2)


@pytest.mark.parametrize("n", [0, 1, 2, 17, 300])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("q", [-1.0, 0.5])
def test_py_func_prior_bounds(pure_python, n, weighted, q):
    args = make_bounds_inputs(n, rng_for("pyfunc-prior", n, weighted, q))
    beta, gamma, base = 0.3, 0.2, 0.15
    _, all_b = call_ref(args, beta, gamma, base, -np.inf, weighted)
    bar = -np.inf if q < 0 else _bar_between(all_b, q)
    rows = np.empty(n, np.int64)
    bounds = np.empty(n, np.float32)
    w = args["row_w"] if weighted else np.ones(1, np.float32)
    c = _jit.prior_bounds.py_func(
        args["todo"],
        args["gen"],
        args["gen0"],
        args["rec_ub"],
        args["imp_ub"],
        args["importance"],
        beta,
        gamma,
        base,
        w,
        weighted,
        bar,
        rows,
        bounds,
    )
    e_rows, e_bounds = call_ref(args, beta, gamma, base, bar, weighted)
    np.testing.assert_array_equal(rows[:c], e_rows)  # the bar is never within rounding of a bound
    np.testing.assert_allclose(bounds[:c], e_bounds, **BOUND_TOL)
    # and the compiled kernel agrees with its body
    check_same(call_prior_bounds(args, beta, gamma, base, bar, weighted), (rows[:c], bounds[:c]))


@pytest.mark.parametrize("n", [0, 1, 8, 13, 200])
def test_py_func_selection_bitmap(pure_python, n):
    slots, allowed = make_slots(n, n // 2 + 1, rng_for("pyfunc-bitmap", n))
    bitmap = np.zeros((n + 7) // 8, np.uint8)
    count = _jit.selection_bitmap.py_func(slots, allowed, bitmap)
    e_bitmap, e_count = ref_selection_bitmap(slots, allowed)
    np.testing.assert_array_equal(bitmap, e_bitmap)
    assert int(count) == e_count


@pytest.mark.parametrize("n", [0, 1, 2, 17, 300])
@pytest.mark.parametrize("q", [-1.0, 0.5])
def test_py_func_ordered_bounds(pure_python, n, q):
    a = make_ordered_inputs(n, rng_for("pyfunc-ordered", n, q), cap=16)
    base = 0.15
    _, all_b, _ = call_ordered_ref(a, base, -np.inf)
    bar = -np.inf if q < 0 else _bar_between(all_b.astype(np.float32), q)
    size = a["log_to"] - a["log_from"] + n + len(a["order"])
    rows, bounds = np.empty(size, np.int64), np.empty(size, np.float32)
    todo = a["todo"].copy()
    c = _jit.ordered_bounds.py_func(
        todo, len(a["gen0"]), a["order"], a["prior"], a["importance"], a["log"], a["log_from"],
        a["log_to"], a["beta"], a["gamma"], base, bar, rows, bounds,
    )  # fmt: skip
    e_rows, e_bounds, e_todo = call_ordered_ref(a, base, bar)
    np.testing.assert_array_equal(rows[:c], e_rows)
    np.testing.assert_allclose(bounds[:c], e_bounds, **BOUND_TOL)
    np.testing.assert_array_equal(todo, e_todo)


# --------------------------------------------------------------------------------------------
# Argument validation: ValueError before any kernel runs
# --------------------------------------------------------------------------------------------

NV, NV0 = 6, 4


def valid_prior_kwargs() -> dict:
    return {
        "todo": np.ones(NV, np.bool_),
        "gen": np.zeros(NV, np.int64),
        "gen0": np.zeros(NV0, np.int64),
        "rec_ub": np.full(NV0, 0.5, np.float32),
        "imp_ub": np.full(NV0, 0.5, np.float32),
        "importance": np.full(NV, 0.5, np.float32),
        "beta": 0.3,
        "gamma": 0.2,
        "base": 0.1,
        "bar": 0.0,
        "row_w": np.ones(NV, np.float32),
    }


def valid_bitmap_kwargs() -> dict:
    return {"slots": np.array([0, -1, 2, 5], np.int64), "allowed": np.ones(3, np.bool_)}


def call(fn: str, kw: dict):
    if fn == "prior_bounds":
        kw = dict(kw)
        return K.prior_bounds(kw.pop("todo"), **kw)
    return K.selection_bitmap(**kw)


def valid(fn: str) -> dict:
    return valid_prior_kwargs() if fn == "prior_bounds" else valid_bitmap_kwargs()


# (wrapper, array argument, which length it must have: "n", "n0" or None for any)
ARRAY_ARGS = [
    ("prior_bounds", "todo", None),
    ("prior_bounds", "gen", "n"),
    ("prior_bounds", "gen0", None),
    ("prior_bounds", "rec_ub", "n0"),
    ("prior_bounds", "imp_ub", "n0"),
    ("prior_bounds", "importance", "n"),
    ("prior_bounds", "row_w", "n"),
    ("selection_bitmap", "slots", None),
    ("selection_bitmap", "allowed", None),
]
WRONG_DTYPE = {
    np.dtype(np.float32): np.float64,
    np.dtype(np.int64): np.int32,
    np.dtype(np.bool_): np.uint8,
}


def _ids(case):
    return f"{case[0]}-{case[1]}"


def test_valid_kwargs_are_valid():
    rows, _ = call("prior_bounds", valid_prior_kwargs())
    np.testing.assert_array_equal(rows, np.arange(NV))
    assert call("selection_bitmap", valid_bitmap_kwargs())[1] == 2
    assert call("prior_bounds", {**valid_prior_kwargs(), "row_w": None})[0].shape == (NV,)


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_wrong_dtype(case):
    fn, arg, _ = case
    kw = valid(fn)
    kw[arg] = kw[arg].astype(WRONG_DTYPE[kw[arg].dtype])
    with pytest.raises(ValueError, match=arg):
        call(fn, kw)


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_non_contiguous(case):
    fn, arg, _ = case
    kw = valid(fn)
    strided = np.repeat(kw[arg], 2)[::2]
    assert not strided.flags.c_contiguous and len(strided) == len(kw[arg])
    kw[arg] = strided
    with pytest.raises(ValueError, match="contiguous"):
        call(fn, kw)


@pytest.mark.parametrize("case", ARRAY_ARGS, ids=_ids)
def test_rejects_2d_and_non_arrays(case):
    fn, arg, _ = case
    kw = valid(fn)
    with pytest.raises(ValueError):
        call(fn, {**kw, arg: kw[arg].reshape(1, -1)})
    with pytest.raises(ValueError):
        call(fn, {**kw, arg: kw[arg].tolist()})


@pytest.mark.parametrize("case", [c for c in ARRAY_ARGS if c[2]], ids=_ids)
@pytest.mark.parametrize("delta", [-1, 1])
def test_rejects_wrong_length(case, delta):
    fn, arg, _ = case
    kw = valid(fn)
    a = kw[arg]
    kw[arg] = a[:-1].copy() if delta < 0 else np.concatenate([a, a[:1]])
    with pytest.raises(ValueError, match=arg):
        call(fn, kw)


def test_prior_bounds_rejects_gen0_longer_than_todo():
    kw = valid_prior_kwargs()
    n1 = NV + 1
    kw.update(gen0=np.zeros(n1, np.int64), rec_ub=np.zeros(n1, np.float32), imp_ub=np.zeros(n1, np.float32))
    with pytest.raises(ValueError, match="gen0"):
        call("prior_bounds", kw)
    # gen0 as long as todo, or empty, is fine
    kw.update(gen0=np.zeros(NV, np.int64), rec_ub=np.zeros(NV, np.float32), imp_ub=np.zeros(NV, np.float32))
    call("prior_bounds", kw)
    kw.update(gen0=np.zeros(0, np.int64), rec_ub=np.zeros(0, np.float32), imp_ub=np.zeros(0, np.float32))
    call("prior_bounds", kw)


def test_selection_bitmap_allowed_may_have_any_length():
    slots = np.array([0, 1, 2, 3], np.int64)
    for m in (0, 1, 4, 100):
        bitmap, count = K.selection_bitmap(slots, np.ones(m, np.bool_))
        assert count == min(m, 4)
        np.testing.assert_array_equal(bitmap, ref_selection_bitmap(slots, np.ones(m, np.bool_))[0])


# --------------------------------------------------------------------------------------------
# row_weights
# --------------------------------------------------------------------------------------------


def ref_row_weights(ns, tier, by_ns, by_tier) -> np.ndarray:
    ok = (ns >= 0) & (ns < len(by_ns)) & (tier >= 0) & (tier < len(by_tier))
    out = np.zeros(len(ns), np.float64)
    out[ok] = by_ns[ns[ok]].astype(np.float64) * by_tier[tier[ok].astype(np.intp)]
    return out


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("tables", ["scopes", "one-namespace", "zero-weights"])
def test_row_weights_random(n, tables):
    """Scope weight per namespace id times tier weight, on seeded rows with ids out of range (-1 for
    unused rows, ids past the table for namespaces created after it, tier 5) weighing 0."""
    rng = rng_for("row_weights", n, tables)
    m = {"scopes": 7, "one-namespace": 1, "zero-weights": 4}[tables]
    by_ns = rng.choice(np.array([0.4, 0.6, 0.8, 1.0, 1.7], np.float32), m).astype(np.float32)
    by_tier = np.array([1.0, 1.0, 0.85, 0.7, 0.55], np.float32)
    if tables == "zero-weights":
        by_ns[::2] = 0.0
        by_tier[3] = 0.0
    ns = rng.integers(-1, m + 2, n).astype(np.int32)
    tier = rng.integers(0, 6, n).astype(np.int8)
    saved = (ns.copy(), tier.copy(), by_ns.copy(), by_tier.copy())
    got = K.row_weights(ns, tier, by_ns, by_tier)
    assert got.dtype == np.float32 and got.shape == (n,)
    np.testing.assert_allclose(got, ref_row_weights(ns, tier, by_ns, by_tier), **F32)
    for a, b in zip((ns, tier, by_ns, by_tier), saved, strict=True):
        np.testing.assert_array_equal(a, b)


def test_row_weights_rejects_bad_columns():
    ns, tier = np.zeros(3, np.int32), np.ones(3, np.int8)
    tables = (np.ones(2, np.float32), np.ones(5, np.float32))
    with pytest.raises(ValueError, match="ns must have dtype int32"):
        K.row_weights(ns.astype(np.int64), tier, *tables)
    with pytest.raises(ValueError, match="tier must have length 3"):
        K.row_weights(ns, tier[:2], *tables)


@pytest.mark.parametrize("n", [0, 1, 9, 200])
def test_py_func_tier_counts(pure_python, n):
    rng = rng_for("pyfunc-tier-counts", n)
    tier = rng.integers(-1, 6, n).astype(np.int8)
    mask = rng.random(n) < 0.5
    out = np.zeros(5, np.int64)
    _jit.tier_counts.py_func(mask, tier, out)
    np.testing.assert_array_equal(out, ref_tier_counts(mask, tier))


@pytest.mark.parametrize("n", [0, 1, 9, 200])
@pytest.mark.parametrize("kind", ["uniform", "ties", "nan_inf"])
def test_py_func_split_top(pure_python, monkeypatch, n, kind):
    monkeypatch.setattr(_jit, "_kth_largest", _jit._kth_largest.py_func)
    bounds = _split_bounds(n, kind, rng_for("pyfunc-split-top", n, kind))
    for size in (1, 3, max(1, n // 2), n + 1):
        top = np.empty(min(n, size), np.int64)
        rest = np.empty(max(n - size, 0), np.int64)
        nt, nr = _jit.split_top.py_func(bounds, 0.0, size, top, rest)
        want_top, want_rest = ref_split_top(bounds, 0.0, size)
        np.testing.assert_array_equal(top[:nt], want_top)
        np.testing.assert_array_equal(rest[:nr], want_rest)


@pytest.mark.parametrize("n", [0, 1, 9, 200])
def test_py_func_allowed_entries(pure_python, n):
    slots, allowed = make_slots(n, n, rng_for("pyfunc-allowed-entries", n))
    ids = np.empty(n, np.int64)
    rows = np.empty(n, np.int64)
    c = _jit.allowed_entries.py_func(slots, allowed, ids, rows)
    e_ids, e_rows = ref_allowed_entries(slots, allowed)
    np.testing.assert_array_equal(ids[:c], e_ids)
    np.testing.assert_array_equal(rows[:c], e_rows)


@pytest.mark.parametrize("dtype", [np.int8, np.int32])
@pytest.mark.parametrize("n", [0, 1, 17, 5000])
def test_mask_equal_matches_numpy(dtype, n):
    rng = rng_for("mask-equal", n, np.dtype(dtype).name)
    mask = rng.random(n) < 0.6
    column = rng.integers(-1, 4, n).astype(dtype)
    saved = mask.copy()
    got, count = K.mask_equal(mask, column, 2)
    want = mask & (column == 2)
    np.testing.assert_array_equal(got, want)
    assert count == int(want.sum())
    np.testing.assert_array_equal(mask, saved)  # a new mask: the one given is left as it was
    with pytest.raises(ValueError, match="column"):
        K.mask_equal(mask, column.astype(np.int64), 2)
