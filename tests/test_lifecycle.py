"""End-to-end tests of the tier lifecycle through the real gRPC API.

Promotion (access, surprise, success), demotion (idle, decay), capacity eviction by each retention
policy (with the cascade into slower tiers and GLACIAL deletion), expiry, dry runs, protected
namespaces, clearing scopes, transfers, per-namespace policy overrides, lifecycle statistics and
scheduled (cadenced) passes.

Every server runs with an injected ``FakeClock`` and the background pass off (conftest), so the
tests drive time and passes explicitly and never sleep; the one test of the background thread polls
with a deadline. Expected values are computed here from the contract in
proto/tiermem/v1/memory.proto and the seed-000 defaults (written out below, not read from the server).
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import FakeClock
from google.protobuf import field_mask_pb2

from tiermem.client import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    MemoryClient,
    NotFoundError,
)
from tiermem.client.errors import from_rpc_error
from tiermem.server.model.reports import ConsolidationReport
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

T0 = 1_700_000_000.0  # FakeClock's default start
MODEL = "test"
DIM = 8
FAST, MEDIUM, SLOW, GLACIAL = pb.TIER_FAST, pb.TIER_MEDIUM, pb.TIER_SLOW, pb.TIER_GLACIAL
GONE = pb.TIER_UNSPECIFIED  # to_tier of a deleted memory

P_ACCESS = pb.MOVE_REASON_PROMOTE_ACCESS
P_SURPRISE = pb.MOVE_REASON_PROMOTE_SURPRISE
P_SUCCESS = pb.MOVE_REASON_PROMOTE_SUCCESS
D_IDLE = pb.MOVE_REASON_DEMOTE_IDLE
D_DECAY = pb.MOVE_REASON_DEMOTE_DECAY
EVICT = pb.MOVE_REASON_EVICT_CAPACITY
DELETE_CAP = pb.MOVE_REASON_DELETE_CAPACITY
EXPIRED = pb.MOVE_REASON_EXPIRED

# Seed-000 defaults per tier: (ttl_seconds, max_items, importance_threshold, half_life_hours, cadence_seconds)
DEFAULT_TIERS = {
    FAST: (60.0, 1000, 0.8, 1.0, 5.0),
    MEDIUM: (3600.0, 500, 0.5, 24.0, 60.0),
    SLOW: (86400.0, 200, 0.3, 24.0 * 7, 600.0),
    GLACIAL: (604800.0, 100, 0.0, 24.0 * 30, 3600.0),
}
FLOOR = 0.1
SURPRISE_ALPHA = 0.3
TIER_NAMES = {FAST: "fast", MEDIUM: "medium", SLOW: "slow", GLACIAL: "glacial"}
NEVER = 1e9  # a TTL so long that idleness and decay never fire within a test


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(running: RunningServer) -> Iterator[MemoryClient]:
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        yield c


@dataclass
class Env:
    c: MemoryClient
    clock: FakeClock
    running: RunningServer


@pytest.fixture
def env(server_factory: Callable[..., RunningServer]) -> Iterator[Env]:
    clock = FakeClock()
    running = server_factory(clock=clock)
    with connect(running) as c:
        yield Env(c, clock, running)


Move = tuple[str, str, int, int, int]  # (namespace, id, from_tier, to_tier, reason)


def moves(resp: pb.ConsolidateMemoriesResponse) -> set[Move]:
    out = {(m.namespace, m.id, m.from_tier, m.to_tier, m.reason) for m in resp.moves}
    assert len(out) == len(resp.moves), "each step of a memory's move is reported once"
    return out


def engine_moves(report: ConsolidationReport) -> set[Move]:
    return {(m.namespace, m.id, m.from_tier, m.to_tier, m.reason) for m in report.moves}


def counts(resp: pb.ConsolidateMemoriesResponse) -> tuple[int, int, int, int, int]:
    return resp.promoted, resp.demoted, resp.evicted, resp.deleted, resp.over_capacity


def ts(t: Any) -> float:
    return t.seconds + t.nanos / 1e9


def f32(x: float) -> float:
    return float(np.float32(x))


def unit(v: Any) -> np.ndarray:
    a = np.asarray(v, np.float64)
    return a / np.linalg.norm(a)


def tier_of(c: MemoryClient, ns: str, mid: str) -> int:
    return int(c.get(ns, mid).tier)


def tiers_of(c: MemoryClient, ns: str) -> dict[str, int]:
    return {m.id: int(m.tier) for m in c.list_memories(ns)}


def ids_of(results: Any) -> list[str]:
    return [r.memory.id for r in results]


def access(c: MemoryClient, ns: str, mid: str, n: int = 1, **item: Any) -> list[pb.Memory]:
    """Report ``n`` accesses (one feedback item each) of one memory."""
    return c.feedback(ns, [{"id": mid, **item} for _ in range(n)])


def lifecycle(c: MemoryClient, ns: str = "") -> dict[int, tuple[int, int, int, int]]:
    """Per tier: (promotions_total, demotions_total, evictions_total, deleted_total)."""
    return {
        t.tier: (t.promotions_total, t.demotions_total, t.evictions_total, t.deleted_total)
        for t in c.stats(ns).tiers
    }


def last_hour(c: MemoryClient, ns: str = "") -> dict[int, tuple[int, int, int]]:
    return {
        t.tier: (t.promotions_last_hour, t.demotions_last_hour, t.evictions_last_hour)
        for t in c.stats(ns).tiers
    }


def zeros4() -> dict[int, tuple[int, int, int, int]]:
    return {t: (0, 0, 0, 0) for t in (FAST, MEDIUM, SLOW, GLACIAL)}


def state(c: MemoryClient, *namespaces: str) -> tuple[Any, ...]:
    """Everything a rejected request or a dry run must leave unchanged."""
    s = c.stats()
    return (
        s.memory_count,
        s.writes_committed,
        [t.SerializeToString(deterministic=True) for t in s.tiers],
        [(n.name, n.memory_count) for n in c.list_namespaces()],
        {
            ns: [m.SerializeToString(deterministic=True) for m in c.list_memories(ns, include_embedding=True)]
            for ns in namespaces
        },
    )


def expect_invalid(fn: Callable[[], Any], field: str | re.Pattern[str]) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as ei:
        fn()
    e = ei.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(field, str):
        assert field in e.fields, f"expected {field!r} in {e.fields} ({e.message})"
    else:
        assert any(field.fullmatch(f) for f in e.fields), f"expected {field.pattern} in {e.fields}"
    return e


def expect_protected(fn: Callable[[], Any]) -> None:
    with pytest.raises(FailedPreconditionError) as ei:
        fn()
    assert ei.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert ei.value.reason == "NAMESPACE_PROTECTED", ei.value


def expect_not_found(fn: Callable[[], Any]) -> None:
    with pytest.raises(NotFoundError) as ei:
        fn()
    assert ei.value.reason == "MEMORY_NOT_FOUND"


def raw(c: MemoryClient, method: str, request: Any) -> Any:
    try:
        return getattr(c.stub, method)(request, timeout=30)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def wait_for(pred: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Poll ``pred`` until it holds or ``timeout`` (real) seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def decayed(base: float, age_seconds: float, half_life_hours: float) -> float:
    b = f32(base)
    return max(b * 0.5 ** (max(0.0, age_seconds) / 3600.0 / half_life_hours), FLOOR * b)


# --------------------------------------------------------------------------------------------
# 1-3. Promotion
# --------------------------------------------------------------------------------------------


def test_promotion_by_access_one_tier_per_pass_and_evidence_resets(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "user:ana/project:x"
    for mid in ("five", "four", "ten"):
        c.create(ns, f"memory {mid}", id=mid, tier="slow")
    clock.advance(10)
    access(c, ns, "five", 5)  # the default promote_access_count
    access(c, ns, "four", 4)
    access(c, ns, "ten", 10)  # twice the threshold: still one tier per pass
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "five", SLOW, MEDIUM, P_ACCESS), (ns, "ten", SLOW, MEDIUM, P_ACCESS)}
    assert counts(r) == (2, 0, 0, 0, 0) and r.skipped == 0
    assert tiers_of(c, ns) == {"five": MEDIUM, "four": SLOW, "ten": MEDIUM}
    five = c.get(ns, "five")
    assert ts(five.tier_time) == clock.now and five.access_count == 5  # counters are kept

    # evidence counts from the entry into the new tier: the next pass does not promote again
    r = c.consolidate(ns)
    assert moves(r) == set() and counts(r) == (0, 0, 0, 0, 0)
    assert tiers_of(c, ns) == {"five": MEDIUM, "four": SLOW, "ten": MEDIUM}

    # accesses add up over several feedback calls within a tier; 4 new ones in MEDIUM are not enough
    access(c, ns, "four")
    access(c, ns, "five", 4)
    assert moves(c.consolidate(ns)) == {(ns, "four", SLOW, MEDIUM, P_ACCESS)}
    access(c, ns, "five")
    assert moves(c.consolidate(ns)) == {(ns, "five", MEDIUM, FAST, P_ACCESS)}
    assert tiers_of(c, ns) == {"five": FAST, "four": MEDIUM, "ten": MEDIUM}


def test_promotion_by_surprise_needs_feedback_in_the_tier(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "surprise"
    for mid in ("s", "once", "old"):
        c.create(ns, f"memory {mid}", id=mid, tier="medium")
    clock.advance(5)
    surprising = {"predicted_relevance": 0.0, "actual_usefulness": 1.0}
    # EMA: s <- 0.3 * max(0, actual - predicted) + 0.7 * s, from 0, until it reaches 0.5
    expected, n = 0.0, 0
    while expected < 0.5:
        expected = SURPRISE_ALPHA * 1.0 + (1 - SURPRISE_ALPHA) * expected
        n += 1
    assert n == 2 and n < 5  # fewer accesses than promote_access_count: surprise alone decides
    got = access(c, ns, "s", n, **surprising)
    assert got[-1].surprise_score == pytest.approx(expected, abs=1e-6)
    once = access(c, ns, "once", 1, **surprising)
    assert once[0].surprise_score == pytest.approx(SURPRISE_ALPHA, abs=1e-6)  # below 0.5
    access(c, ns, "old", n, **surprising)
    clock.advance(5)
    c.update(ns, "old", tier="slow")  # enters SLOW after its surprising feedback

    r = c.consolidate(ns)
    assert moves(r) == {(ns, "s", MEDIUM, FAST, P_SURPRISE)}
    assert counts(r) == (1, 0, 0, 0, 0)
    old = c.get(ns, "old")
    assert old.tier == SLOW and old.surprise_score == pytest.approx(expected, abs=1e-6)

    # one plain access in the new tier (no usefulness: surprise unchanged) makes it count
    clock.advance(5)
    access(c, ns, "old")
    assert c.get(ns, "old").surprise_score == pytest.approx(expected, abs=1e-6)
    assert moves(c.consolidate(ns)) == {(ns, "old", SLOW, MEDIUM, P_SURPRISE)}
    # ... and in MEDIUM it again needs an access after entering
    assert moves(c.consolidate(ns)) == set()
    assert tiers_of(c, ns) == {"s": FAST, "once": MEDIUM, "old": MEDIUM}


def test_promotion_by_success(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "success"
    for mid in ("win", "two", "none"):
        c.create(ns, f"memory {mid}", id=mid, tier="slow")
    clock.advance(5)
    access(c, ns, "win", 3, success=True)  # 3 accesses < 5: only the success rule can promote
    access(c, ns, "two", 2, success=True)
    access(c, ns, "none", 3, success=False)
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "win", SLOW, MEDIUM, P_SUCCESS)}
    assert counts(r) == (1, 0, 0, 0, 0)
    # successes in SLOW do not count in MEDIUM
    access(c, ns, "win", 2, success=True)
    assert moves(c.consolidate(ns)) == set()
    access(c, ns, "win", 1, success=True)
    assert moves(c.consolidate(ns)) == {(ns, "win", MEDIUM, FAST, P_SUCCESS)}
    assert c.get(ns, "win").success_count == 6
    assert tiers_of(c, ns) == {"win": FAST, "two": SLOW, "none": SLOW}


# --------------------------------------------------------------------------------------------
# 4-5. Demotion
# --------------------------------------------------------------------------------------------


def test_demotion_by_idleness_from_last_access_or_tier_entry(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "idle"
    ttl = DEFAULT_TIERS[FAST][0]
    c.create(ns, "left alone", id="idle", tier="fast", importance=0.9)
    c.create(ns, "touched later", id="touched", tier="fast", importance=0.9)
    c.create(ns, "entered later", id="entered", tier="slow", importance=0.9)
    clock.advance(30)
    access(c, ns, "touched")  # last access T0+30
    clock.advance(20)
    c.update(ns, "entered", tier="fast")  # tier entry T0+50, last access T0
    clock.advance(9)  # T0+59: nobody idle longer than 60 s
    # decay cannot fire either (not one TTL in the tier yet), and would not: 0.9 decays slowly
    assert decayed(0.9, 111, DEFAULT_TIERS[FAST][3]) > DEFAULT_TIERS[FAST][2]
    r = c.consolidate(ns)
    assert moves(r) == set() and counts(r) == (0, 0, 0, 0, 0)

    clock.advance(2)  # T0+61
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "idle", FAST, MEDIUM, D_IDLE)}
    assert counts(r) == (0, 1, 0, 0, 0)
    assert ts(c.get(ns, "idle").tier_time) == clock.now

    clock.advance(30)  # T0+91: touched idle 61 s (since its access), entered idle 41 s
    assert clock.now - (T0 + 30) > ttl and clock.now - (T0 + 50) < ttl
    assert moves(c.consolidate(ns)) == {(ns, "touched", FAST, MEDIUM, D_IDLE)}
    clock.advance(20)  # T0+111: entered idle 61 s since its tier entry
    assert moves(c.consolidate(ns)) == {(ns, "entered", FAST, MEDIUM, D_IDLE)}
    assert tiers_of(c, ns) == {"idle": MEDIUM, "touched": MEDIUM, "entered": MEDIUM}


def test_a_create_time_ahead_of_the_clock_does_not_hold_off_idle_demotion(env: Env) -> None:
    """A memory created with a create_time ahead of the server's clock (a client's clock running
    ahead) keeps that create_time, but entered its tier and was last accessed now, as an imported
    memory's future times count: idle past the TTL, it is demoted like any other."""
    c, clock = env.c, env.clock
    ns = "future"
    ahead = c.create(
        ns, "from a clock five hours ahead", id="ahead", tier="fast", create_time=clock.now + 5 * 3600
    )
    c.create(ns, "from this clock", id="now", tier="fast")
    assert ts(ahead.create_time) == clock.now + 5 * 3600
    assert ts(ahead.tier_time) == ts(ahead.last_access_time) == ts(ahead.update_time) == clock.now
    clock.advance(DEFAULT_TIERS[FAST][0] + 1)
    assert moves(c.consolidate(ns)) == {
        (ns, "ahead", FAST, MEDIUM, D_IDLE),
        (ns, "now", FAST, MEDIUM, D_IDLE),
    }


def test_demotion_by_decay_after_one_ttl_in_the_tier(env: Env) -> None:
    c, clock = env.c, env.clock
    ns, other = "decay/fast-forget", "decay/default"
    c.update_namespace_config(ns, tiers={"medium": {"half_life_hours": 1.0, "ttl_seconds": 3600.0}})
    c.create(ns, "fading", id="fading", tier="medium", importance=0.6)
    c.create(other, "lasting", id="lasting", tier="medium", importance=0.6)
    threshold = DEFAULT_TIERS[MEDIUM][2]

    clock.advance(3500)
    access(c, ns, "fading")  # not idle
    access(c, other, "lasting")
    # already below the threshold, but not yet one TTL (3600 s) in the tier: no demotion
    assert decayed(0.6, 3500, 1.0) < threshold
    assert moves(c.consolidate()) == set()

    clock.advance(200)  # T0+3700: 3700 s in the tier, idle 200 s
    exp = decayed(0.6, 3700, 1.0)
    assert exp == pytest.approx(0.6 * 0.5 ** (3700 / 3600)) and exp < threshold
    hit = c.search(ns, "fading", limit=1)[0]
    assert hit.memory.id == "fading" and hit.importance == pytest.approx(exp, abs=1e-5)
    # the default MEDIUM half-life (24 h) keeps the other namespace's memory above the threshold
    assert decayed(0.6, 3700, DEFAULT_TIERS[MEDIUM][3]) > threshold
    r = c.consolidate()
    assert moves(r) == {(ns, "fading", MEDIUM, SLOW, D_DECAY)}
    assert counts(r) == (0, 1, 0, 0, 0)
    assert tier_of(c, other, "lasting") == MEDIUM


def test_importance_floor_keeps_very_old_memories_positive(env: Env) -> None:
    c = env.c
    ns = "floor"
    year = 365 * 86400.0
    for tier, imp in ((FAST, 0.8), (GLACIAL, 0.3)):
        c.create(
            ns, f"ancient memory {tier}", id=f"t{tier}", tier=tier, importance=imp, create_time=T0 - year
        )
        raw_decay = f32(imp) * 0.5 ** (year / 3600 / DEFAULT_TIERS[tier][3])
        assert raw_decay < FLOOR * f32(imp)  # without the floor it would be (nearly) 0
        hit = c.search(ns, f"ancient memory {tier}", limit=10, tiers=[tier])
        assert ids_of(hit) == [f"t{tier}"]
        assert hit[0].importance == pytest.approx(FLOOR * f32(imp), abs=1e-6)
        assert hit[0].importance > 0


# --------------------------------------------------------------------------------------------
# 6. Capacity and retention policies
# --------------------------------------------------------------------------------------------

# Six FAST memories whose orders by importance, creation, tier entry and last access all differ.
EVICT_IMPORTANCE = [0.2, 0.9, 0.3, 0.8, 0.6, 0.7]
EVICT_CREATED_DAYS_AGO = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
EVICT_ACCESSED_DAYS_AGO = [0.95, 1.9, 0.2, 3.5, 0.1, 5.5]
EVICT_ENTRY_ORDER = [2, 3, 5, 1, 0, 4]  # the order in which they are moved into FAST
EVICT_HALF_LIFE_H = 24.0
POLICIES = ("importance_weighted", "recency", "fifo", "lru")


def expected_evictions(
    policy: str,
    importance: list[float],
    created: np.ndarray,
    accessed: np.ndarray,
    entered: np.ndarray,
    now: float,
    n_evict: int,
    half_life_h: float,
) -> set[int]:
    """The indexes a tier over capacity evicts first under ``policy`` (lowest score leaves)."""
    imp = np.asarray(importance, np.float32).astype(np.float64)
    if policy == "importance_weighted":
        dec = np.maximum(imp * 0.5 ** ((now - created) / 3600.0 / half_life_h), FLOOR * imp)
        keep = 0.7 * dec + 0.3 * np.exp(-(now - accessed) / 86400.0)
    elif policy == "recency":
        keep = created
    elif policy == "fifo":
        keep = entered
    else:
        keep = accessed
    order = np.argsort(keep, kind="stable")
    assert keep[order[n_evict - 1]] < keep[order[n_evict]]  # no tie at the boundary
    return {int(i) for i in order[:n_evict]}


@pytest.mark.parametrize("policy", POLICIES)
def test_capacity_eviction_order_by_retention_policy(env: Env, policy: str) -> None:
    c, clock = env.c, env.clock
    ns = f"evict/{policy}"
    c.update_namespace_config(
        ns,
        retention=policy,
        tiers={
            "fast": {
                "max_items": 3,
                "ttl_seconds": NEVER,
                "importance_threshold": 0.0,
                "half_life_hours": EVICT_HALF_LIFE_H,
            },
            "medium": {"ttl_seconds": NEVER, "importance_threshold": 0.0},
        },
    )
    n = len(EVICT_IMPORTANCE)
    ids = [f"m{i}" for i in range(n)]
    created = T0 - np.array(EVICT_CREATED_DAYS_AGO) * 86400.0
    accessed = T0 - np.array(EVICT_ACCESSED_DAYS_AGO) * 86400.0
    for i in range(n):  # created in SLOW (long ago), then accessed, then moved into FAST one by one
        c.create(
            ns, f"memory {i}", id=ids[i], tier="slow", importance=EVICT_IMPORTANCE[i], create_time=created[i]
        )
        c.feedback(ns, [{"id": ids[i]}], as_of=float(accessed[i]))
    entered = np.zeros(n)
    for i in EVICT_ENTRY_ORDER:
        clock.advance(10)
        c.update(ns, ids[i], tier="fast")
        entered[i] = clock.now
    clock.advance(10)
    now = clock.now
    for i in range(n):  # the server saw the times this test intends
        m = c.get(ns, ids[i])
        assert (ts(m.create_time), ts(m.last_access_time), ts(m.tier_time)) == pytest.approx(
            (created[i], accessed[i], entered[i])
        )

    every = {
        p: expected_evictions(p, EVICT_IMPORTANCE, created, accessed, entered, now, 3, EVICT_HALF_LIFE_H)
        for p in POLICIES
    }
    assert len({frozenset(s) for s in every.values()}) == len(POLICIES)  # the data tells them apart
    want = every[policy]

    r = c.consolidate(ns)
    assert moves(r) == {(ns, ids[i], FAST, MEDIUM, EVICT) for i in want}
    assert counts(r) == (0, 0, 3, 0, 0)
    assert tiers_of(c, ns) == {ids[i]: (MEDIUM if i in want else FAST) for i in range(n)}
    assert lifecycle(c, ns)[FAST] == (0, 0, 3, 0)
    # within capacity now: a second pass moves nothing
    assert moves(c.consolidate(ns)) == set()


def test_capacity_eviction_cascades_into_the_next_tier(env: Env) -> None:
    c = env.c
    ns = "cascade"
    long = {"ttl_seconds": NEVER, "importance_threshold": 0.0}
    c.update_namespace_config(
        ns, tiers={"fast": {"max_items": 2, **long}, "medium": {"max_items": 2, **long}, "slow": long}
    )
    # created now and never accessed: retention = 0.7 * importance + 0.3 * 1
    for mid, tier, imp in (
        ("f_lo", "fast", 0.2),
        ("f_hi", "fast", 0.9),
        ("f_mid", "fast", 0.8),
        ("m_lo", "medium", 0.1),
        ("m_hi", "medium", 0.7),
    ):
        c.create(ns, f"memory {mid}", id=mid, tier=tier, importance=imp)
    # MEDIUM holds 2 <= 2 on its own; only the memory evicted from FAST pushes it over capacity
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "f_lo", FAST, MEDIUM, EVICT), (ns, "m_lo", MEDIUM, SLOW, EVICT)}
    assert counts(r) == (0, 0, 2, 0, 0)
    assert tiers_of(c, ns) == {"f_lo": MEDIUM, "f_hi": FAST, "f_mid": FAST, "m_lo": SLOW, "m_hi": MEDIUM}
    stats = lifecycle(c, ns)
    assert stats[FAST] == (0, 0, 1, 0) and stats[MEDIUM] == (0, 0, 1, 0)


def test_fifo_cascade_evicts_the_first_to_have_entered_the_tier(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "cascade/fifo"
    long = {"ttl_seconds": NEVER, "importance_threshold": 0.0}
    c.update_namespace_config(
        ns, retention="fifo", tiers={"fast": {"max_items": 1, **long}, "medium": {"max_items": 1, **long}}
    )
    c.create(ns, "first in fast", id="f_old", tier="fast")  # enters FAST at T0
    clock.advance(10)
    c.create(ns, "in medium", id="m", tier="medium")  # enters MEDIUM at T0+10
    clock.advance(10)
    c.create(ns, "second in fast", id="f_new", tier="fast")  # enters FAST at T0+20
    clock.advance(10)
    # FAST evicts f_old (first in); it enters MEDIUM now, after m, so MEDIUM evicts m (first in)
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "f_old", FAST, MEDIUM, EVICT), (ns, "m", MEDIUM, SLOW, EVICT)}


def test_a_memory_moved_into_a_full_tier_and_evicted_on_reports_each_step(env: Env) -> None:
    c = env.c
    demoted, evicted = "cascade/demoted", "cascade/evicted"
    c.update_namespace_config(
        demoted, decay_grace=False, retention="importance", tiers={"medium": {"max_items": 2}}
    )
    c.create(demoted, "kept one", id="m1", tier="medium", importance=0.9)
    c.create(demoted, "kept two", id="m2", tier="medium", importance=0.9)
    c.create(demoted, "a passing remark", id="x", tier="fast", importance=0.5)  # under FAST's 0.8
    c.update_namespace_config(
        evicted, retention="importance", tiers={"fast": {"max_items": 1}, "medium": {"max_items": 1}}
    )
    c.create(evicted, "medium", id="m1", tier="medium", importance=0.95)
    c.create(evicted, "fast, kept", id="f1", tier="fast", importance=0.99)
    c.create(evicted, "fast, evicted twice", id="f2", tier="fast", importance=0.90)

    # x is demoted into a full MEDIUM where it ranks last: evicted on to SLOW in the same pass
    dry = c.consolidate(demoted, dry_run=True)
    r = c.consolidate(demoted)
    for report in (dry, r):
        assert [(m.id, m.from_tier, m.to_tier, m.reason) for m in report.moves] == [
            ("x", FAST, MEDIUM, D_DECAY),
            ("x", MEDIUM, SLOW, EVICT),
        ]
        assert counts(report) == (0, 1, 1, 0, 0)
    assert tiers_of(c, demoted) == {"m1": MEDIUM, "m2": MEDIUM, "x": SLOW}
    # each step booked to the tier it left
    assert lifecycle(c, demoted) == {**zeros4(), FAST: (0, 1, 0, 0), MEDIUM: (0, 0, 1, 0)}

    # f2 is evicted from FAST into a full MEDIUM where it ranks last, and evicted again
    r = c.consolidate(evicted)
    assert [(m.id, m.from_tier, m.to_tier, m.reason) for m in r.moves] == [
        ("f2", FAST, MEDIUM, EVICT),
        ("f2", MEDIUM, SLOW, EVICT),
    ]
    assert counts(r) == (0, 0, 2, 0, 0)
    assert tiers_of(c, evicted) == {"m1": MEDIUM, "f1": FAST, "f2": SLOW}
    assert lifecycle(c, evicted) == {**zeros4(), FAST: (0, 0, 1, 0), MEDIUM: (0, 0, 1, 0)}
    for ns in (demoted, evicted):
        assert moves(c.consolidate(ns)) == set()
    assert c.consolidate(max_reported_moves=1).moves == []


def test_a_promotion_into_a_full_tier_that_turns_it_away_is_no_move(env: Env) -> None:
    c = env.c
    ns, through = "full/summarized", "full/through"
    c.update_namespace_config(
        ns, retention="importance", summarize_evictions=True, tiers={"fast": {"max_items": 2}}
    )
    c.update_namespace_config(
        through, retention="importance", promote_through_tiers=True, tiers={"fast": {"max_items": 1}}
    )
    for i, imp in enumerate((0.95, 0.99)):
        c.create(ns, f"Fast fact {i}.", id=f"f{i}", tier="fast", importance=imp)
    c.create(ns, "A medium fact.", id="m", tier="medium", importance=0.6)
    c.create(through, "Fast fact.", id="f", tier="fast", importance=0.99)
    c.create(through, "A slow fact.", id="s", tier="slow", importance=0.6)
    access(c, ns, "m", 5)  # promote_access_count: m is promoted into FAST, where it ranks last
    access(c, through, "s", 5)
    # it outranks a resident, but not once the summary of that resident's eviction takes a place
    outranks = "full/outranks"
    c.update_namespace_config(
        outranks, retention="importance", summarize_evictions=True, importance_decay="none",
        tiers={"medium": {"max_items": 2}},
    )  # fmt: skip
    for mid, imp in (("keep", 0.95), ("low", 0.5)):
        c.create(outranks, f"Resident {mid}.", id=mid, tier="medium", importance=imp)
    c.create(outranks, "Promoted one.", id="p", tier="slow", importance=0.9)
    access(c, outranks, "p", 5)
    for space in (ns, outranks):
        before = tiers_of(c, space)
        for _ in range(2):  # and again: no churn, no summary of a memory that never left its tier
            r = c.consolidate(space)
            assert (moves(r), counts(r)) == (set(), (0, 0, 0, 0, 0))
            assert tiers_of(c, space) == before
            assert list(c.list_memories(space, kinds=["eviction_summary"])) == []
        assert lifecycle(c, space) == zeros4()

    # promoted through the tiers into a full FAST: it goes as far as MEDIUM
    r = c.consolidate(through)
    assert (moves(r), counts(r)) == ({(through, "s", SLOW, MEDIUM, P_ACCESS)}, (1, 0, 0, 0, 0))
    assert tiers_of(c, through) == {"f": FAST, "s": MEDIUM}
    assert lifecycle(c, through) == {**zeros4(), SLOW: (1, 0, 0, 0)}


def test_an_eviction_summary_makes_room_in_a_full_namespace_in_the_same_pass(env: Env) -> None:
    c = env.c
    ns, capped = "full/namespace", "full/kind"
    keep = {"retention": "importance", "importance_decay": "none", "summarize_evictions": True}
    c.update_namespace_config(ns, max_items=5, tiers={"fast": {"max_items": 2}}, **keep)
    for mid, imp in (("f1", 0.97), ("f2", 0.92), ("f3", 0.88), ("m1", 0.55), ("m2", 0.75)):
        c.create(ns, f"Fact {mid}.", id=mid, tier="fast" if mid[0] == "f" else "medium", importance=imp)
    # FAST evicts f3 and f2 (one for the summary's place): the summary is the namespace's sixth
    # memory, so its lowest-retention one goes now, not in the next pass
    r = c.consolidate(ns)
    assert moves(r) == {
        (ns, "f2", FAST, MEDIUM, EVICT),
        (ns, "f3", FAST, MEDIUM, EVICT),
        (ns, "m1", MEDIUM, GONE, DELETE_CAP),
    }
    assert counts(r) == (0, 0, 2, 1, 0)
    (summary,) = c.list_memories(ns, kinds=["eviction_summary"])
    assert tiers_of(c, ns) == {"f1": FAST, summary.id: FAST, "f2": MEDIUM, "f3": MEDIUM, "m2": MEDIUM}
    assert (moves(c.consolidate(ns)), len(tiers_of(c, ns))) == (set(), 5)

    # a cap on the summaries' kind: the older summary, evicted into MEDIUM, goes in the same pass
    c.update_namespace_config(
        capped, kind_capacities={"eviction_summary": 1}, tiers={"fast": {"max_items": 1}}, **keep
    )
    for mid, imp in (("a1", 0.9), ("a2", 0.85)):
        c.create(capped, f"Fact {mid}.", id=mid, tier="fast", importance=imp)
    c.consolidate(capped)
    (first,) = c.list_memories(capped, kinds=["eviction_summary"])
    for mid, imp in (("b1", 0.95), ("b2", 0.86)):
        c.create(capped, f"Fact {mid}.", id=mid, tier="fast", importance=imp)
    r = c.consolidate(capped)
    assert (capped, first.id, MEDIUM, GONE, DELETE_CAP) in moves(r)
    assert (capped, first.id, FAST, MEDIUM, EVICT) in moves(r)
    (second,) = c.list_memories(capped, kinds=["eviction_summary"])
    assert second.id != first.id and first.id in second.source_memory_ids
    assert moves(c.consolidate(capped)) == set()

    # both caps: the older summary makes the room in the namespace too (one deletion, not two)
    both = "full/both"
    c.update_namespace_config(
        both, max_items=5, kind_capacities={"eviction_summary": 1}, tiers={"fast": {"max_items": 1}}, **keep
    )
    for mids in ((("a1", 0.9), ("a2", 0.85)), (("b1", 0.95), ("b2", 0.86))):
        for mid, imp in mids:
            c.create(both, f"Fact {mid}.", id=mid, tier="fast", importance=imp)
        r = c.consolidate(both)
    assert [m.reason for m in r.moves].count(DELETE_CAP) == 1
    assert len(tiers_of(c, both)) == 5 and moves(c.consolidate(both)) == set()

    # a deletion for the room counts in GLACIAL's over_capacity (what is left over it, after)
    glacial = "full/glacial"
    c.update_namespace_config(
        glacial, max_items=4, tiers={"fast": {"max_items": 1}, "glacial": {"max_items": 1}}, **keep
    )
    for mid, tier, imp in (
        ("g1", "glacial", 0.1),
        ("g2", "glacial", 0.2),
        ("f1", "fast", 0.9),
        ("f2", "fast", 0.8),
    ):
        c.create(glacial, f"Fact {mid}.", id=mid, tier=tier, importance=imp)
    r = c.consolidate(glacial)
    assert (glacial, "g1", GLACIAL, GONE, DELETE_CAP) in moves(r)  # (the namespace's lowest)
    assert counts(r)[4] == 0 and sum(t == GLACIAL for t in tiers_of(c, glacial).values()) == 1


def test_an_older_summary_deleted_from_the_tier_of_the_new_one_is_its_room(env: Env) -> None:
    """A tier that summarizes evicts one memory more than its surplus, room for the new summary;
    where the cap on the summaries' kind deletes the older summary from that same tier, that is
    the room: the tier keeps the best of the two it evicted and ends at max_items (it ended one
    below, and GLACIAL deleted a memory for nothing)."""
    c, clock = env.c, env.clock
    for tier in ("fast", "glacial"):
        ns, here = f"room/{tier}", pb.Tier.Value(f"TIER_{tier.upper()}")
        c.update_namespace_config(
            ns,
            retention="lru",  # (the older summary, written by the first pass, is the most recent)
            summarize_evictions=True,
            delete_from_glacial=True,
            kind_capacities={"eviction_summary": 1},
            tiers={tier: {"max_items": 3, "ttl_seconds": NEVER, "importance_threshold": 0.0}},
        )
        for i in range(1, 5):
            c.create(ns, f"Old fact {i}.", id=f"x{i}", tier=tier, importance=0.9)
            clock.advance(1)
        c.consolidate(ns)  # (4 in 3: x1 for the surplus, x2 for the summary's room)
        (first,) = c.list_memories(ns, kinds=["eviction_summary"])
        assert {m for m, t in tiers_of(c, ns).items() if t == here} == {"x3", "x4", first.id}
        clock.advance(10)
        c.create(ns, "New fact y.", id="y", tier=tier, importance=0.9)
        clock.advance(1)
        r = c.consolidate(ns)  # 4 in 3 again: x3 for the surplus; the older summary is the room
        x3 = (GONE, DELETE_CAP) if tier == "glacial" else (MEDIUM, EVICT)
        assert moves(r) == {
            (ns, "x3", here, *x3),
            (ns, first.id, here, GONE, DELETE_CAP),
        }
        (second,) = c.list_memories(ns, kinds=["eviction_summary"])
        assert {m for m, t in tiers_of(c, ns).items() if t == here} == {"x4", "y", second.id}
        assert list(second.source_memory_ids) == ["x3"]
        assert moves(c.consolidate(ns)) == set()

    # the memory kept had gone on into a full GLACIAL, which had made room for it: GLACIAL keeps
    # one more of its own in turn (it deleted one memory for nothing)
    ns = "room/cascade"
    c.update_namespace_config(
        ns,
        retention="lru",
        summarize_evictions=True,
        delete_from_glacial=True,
        kind_capacities={"eviction_summary": 2},
        tiers={
            t: {"max_items": n, "ttl_seconds": NEVER, "importance_threshold": 0.0}
            for t, n in (("slow", 3), ("glacial", 2))
        },
    )
    for i in range(1, 5):
        c.create(ns, f"Old fact {i}.", id=f"s{i}", tier="slow", importance=0.9)
        clock.advance(1)
    c.consolidate(ns)  # (SLOW: s1 and s2 into GLACIAL, a summary of them)
    (first,) = c.list_memories(ns, kinds=["eviction_summary"])
    clock.advance(10)
    c.create(ns, "New fact y.", id="y", tier="slow", importance=0.9)
    clock.advance(1)
    assert moves(c.consolidate(ns)) == {
        (ns, first.id, SLOW, GONE, DELETE_CAP),
        (ns, "s3", SLOW, GLACIAL, EVICT),
        (ns, "s1", GLACIAL, GONE, DELETE_CAP),
        (ns, "s2", GLACIAL, GONE, DELETE_CAP),
    }
    held = {m.id: (m.tier, list(m.source_memory_ids)) for m in c.list_memories(ns)}
    assert sorted(v for v in held.values() if v[0] == GLACIAL) == [(GLACIAL, []), (GLACIAL, ["s1", "s2"])]
    assert held["s3"] == (GLACIAL, []) and held["s4"][0] == held["y"][0] == SLOW
    assert moves(c.consolidate(ns)) == set()

    def holds(ns: str) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        for m in c.list_memories(ns):
            out.setdefault(m.tier, set()).add(m.id if m.kind != "eviction_summary" else "summary")
        return out

    by_importance = {"retention": "importance", "importance_decay": "none", "summarize_evictions": True}
    # every memory MEDIUM evicted came into it this pass (demoted from FAST): it keeps the best
    ns = "room/newcomers"
    tiers = {
        t: {"max_items": 1000, "ttl_seconds": NEVER, "importance_threshold": 0.0} for t in ("fast", "medium")
    }
    tiers["fast"]["ttl_seconds"], tiers["medium"]["max_items"] = 5, 3
    c.update_namespace_config(ns, kind_capacities={"eviction_summary": 1}, tiers=tiers, **by_importance)
    for mid, tier, kind, imp in (("S", "medium", "eviction_summary", 0.9), ("m1", "medium", "", 0.8)):
        c.create(ns, f"Fact {mid}.", id=mid, tier=tier, kind=kind, importance=imp)
    for mid, imp in (("d1", 0.1), ("d2", 0.2), ("d3", 0.3)):
        c.create(ns, f"Fact {mid}.", id=mid, tier="fast", importance=imp)
    clock.advance(10)
    c.consolidate(ns)  # (d1-d3 idle into MEDIUM, which evicts d1 and d2: S, the older summary, goes)
    assert holds(ns) == {MEDIUM: {"summary", "m1", "d3"}, SLOW: {"d1", "d2"}}
    assert moves(c.consolidate(ns)) == set()

    # an older summary GLACIAL's capacity deleted is not kept back: the kind's cap counted it gone
    ns = "room/summaries"
    c.update_namespace_config(
        ns,
        delete_from_glacial=True,
        kind_capacities={"eviction_summary": 2},
        tiers={
            t: {"max_items": n, "ttl_seconds": NEVER, "importance_threshold": 0.0}
            for t, n in (("slow", 2), ("glacial", 3))
        },
        **by_importance,
    )
    for mid, tier, kind, imp in (
        ("Sa", "glacial", "eviction_summary", 0.3),
        ("Sb", "glacial", "eviction_summary", 0.9),
        ("g1", "glacial", "", 0.1),
        ("a", "slow", "", 0.2),
        ("b", "slow", "", 0.8),
        ("c", "slow", "", 0.85),
    ):
        c.create(ns, f"Fact {mid}.", id=mid, tier=tier, kind=kind, importance=imp)
        clock.advance(1)
    c.consolidate(ns)
    summaries = [m for m in c.list_memories(ns) if m.kind == "eviction_summary"]
    assert len(summaries) == 2 and not {"Sa", "Sb"} & {m.id for m in summaries}
    assert moves(c.consolidate(ns)) == set()


def test_a_tier_that_evicted_to_summarize_ends_full_when_later_steps_freed_room(env: Env) -> None:
    """Older summaries deleted for their kind's cap from several tiers in one pass, and more new
    summaries than that cap: every tier that evicted memories of its own ends the pass at its
    max_items, its new summary counted (GLACIAL ended below it, having deleted memories for
    nothing), and a second pass moves nothing. Two namespaces a fuzz of random small ones found."""
    c, clock = env.c, env.clock
    cases = (
        (
            {"fast": 1, "medium": 2, "slow": 1, "glacial": 4},
            3,
            (
                ("m0", "medium", 0.36), ("m1", "medium", 0.2), ("m2", "medium", 0.02),
                ("m3S", "medium", 0.12), ("s0", "slow", 0.23), ("s1", "slow", 0.33),
                ("g0", "glacial", 0.34), ("g1", "glacial", 0.18), ("g2", "glacial", 0.1),
                ("g3S", "glacial", 0.86), ("g4S", "glacial", 0.47),
            ),
        ),
        (
            {"fast": 2, "medium": 2, "slow": 2, "glacial": 3},
            2,
            (
                ("f0", "fast", 0.01), ("f1", "fast", 0.76), ("f2", "fast", 0.78), ("f3", "fast", 0.43),
                ("m0", "medium", 0.09), ("m1S", "medium", 0.34), ("m2", "medium", 0.19),
                ("s0S", "slow", 0.22),
            ),
        ),
    )  # fmt: skip
    for k, (caps, kind_cap, layout) in enumerate(cases):
        ns = f"refill/{k}"
        c.update_namespace_config(
            ns,
            retention="importance",
            importance_decay="none",
            summarize_evictions=True,
            delete_from_glacial=True,
            kind_capacities={"eviction_summary": kind_cap},
            tiers={
                t: {"max_items": n, "ttl_seconds": NEVER, "importance_threshold": 0.0}
                for t, n in caps.items()
            },
        )
        for mid, tier, imp in layout:
            kind = "eviction_summary" if mid.endswith("S") else ""
            c.create(ns, f"Fact {mid}.", id=mid, tier=tier, kind=kind, importance=imp)
        clock.advance(10)
        r = c.consolidate(ns)
        held: dict[int, int] = {}
        for m in c.list_memories(ns):
            held[m.tier] = held.get(m.tier, 0) + 1
        # (the tiers that evicted or deleted memories of their own, not older summaries)
        evicted = {mv.from_tier for mv in r.moves if mv.reason in (EVICT, DELETE_CAP) and mv.id[-1] != "S"}
        assert GLACIAL in evicted
        assert {t: held.get(t, 0) for t in evicted} == {t: caps[TIER_NAMES[t]] for t in evicted}, ns
        stored = [m.id for m in c.list_memories(ns, kinds=["eviction_summary"])]
        clock.advance(1)
        again = moves(c.consolidate(ns))
        if len(stored) <= kind_cap:
            assert again == set(), ns
        else:  # (three tiers summarized under a cap of two: the next pass holds the kind to its cap)
            assert {(mid, to) for _, mid, _, to, _ in again} <= {(mid, GONE) for mid in stored}
            assert len(list(c.list_memories(ns, kinds=["eviction_summary"]))) == kind_cap


def test_a_summary_of_an_evicted_summary_keeps_what_it_summarized(env: Env) -> None:
    """An eviction summary that a later pass evicts gives the new summary every sentence it holds
    (within the budget; its first ranks with the evicted memories' first sentences, the rest after
    them all), not only its first; deleted from GLACIAL, it is listed by its sources (it is gone),
    moved on, by its own id (it is in the next tier). Its sentences are split in one pass: a
    client's 64 KiB memory of that kind took seconds."""
    c, clock = env.c, env.clock
    keep = {"retention": "importance", "importance_decay": "none", "summarize_evictions": True}
    for tier in ("glacial", "fast"):
        ns = f"lineage/{tier}"
        c.update_namespace_config(
            ns, delete_from_glacial=True, tiers={tier: {"max_items": 1, "ttl_seconds": NEVER}}, **keep
        )
        batches = [[("a", "Alpha is the key fact. It has detail.", 1.0), ("b", "Beta note.", 0.2)]]
        batches += [[("c", "Gamma note.", 0.3)], [("d", "Delta note.", 0.4)]]
        summaries = []
        for batch in batches:
            for mid, text, imp in batch:
                c.create(ns, text, id=mid, tier=tier, importance=imp)
            clock.advance(1)
            c.consolidate(ns)
            here = [
                m
                for m in c.list_memories(ns, kinds=["eviction_summary"])
                if m.tier == pb.Tier.Value(f"TIER_{tier.upper()}")
            ]
            assert len(here) == 1
            summaries.append(here[0])
        assert summaries[-1].content == "Alpha is the key fact. Beta note. Gamma note. Delta note."

        if tier == "glacial":
            # (the memories it evicted first, then what the deleted summaries listed, newest first)
            assert list(summaries[-1].source_memory_ids) == ["d", "c", "a", "b"]
        else:
            assert list(summaries[-1].source_memory_ids) == [summaries[-2].id, "d"]

    # the inherited sentences fill what the budget leaves; a long summary is split in one pass
    ns = "lineage/budget"
    c.update_namespace_config(ns, tiers={"fast": {"max_items": 1, "ttl_seconds": NEVER}}, **keep)
    trivia = "A. " * 20000  # (60 KB of short sentences: each split re-read the rest, 8 s)
    c.create(ns, "Key fact. " + trivia, id="old", kind="eviction_summary", tier="fast", importance=1.0)
    c.create(ns, "An important new fact that matters.", id="new", tier="fast", importance=0.9)
    started = time.monotonic()
    c.consolidate(ns)
    assert time.monotonic() - started < 2
    (made,) = [m for m in c.list_memories(ns, kinds=["eviction_summary"]) if m.id != "old"]
    assert made.content.startswith("Key fact. A. A.")  # (in creation order)
    assert made.content.endswith("An important new fact that matters.") and made.token_cost <= 400


def test_evidence_from_before_a_tier_entry_never_promotes_again(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Promotion evidence counts from the tier entry. Three ways evidence from before it counted
    after it, promoting a memory pass after pass with no access in between: feedback dated in the
    future (now counted as now, as a search's accesses), feedback committed while a pass ran
    (a memory now enters its tier no earlier than its last access), and an import (whose memories'
    counts now all lie before their entry)."""
    from tiermem.server.core import lifecycle as lifecycle_module

    c, clock = env.c, env.clock
    tiers = {
        t: {"ttl_seconds": NEVER, "importance_threshold": 0.0} for t in ("fast", "medium", "slow", "glacial")
    }
    surprising = {"predicted_relevance": 0.0, "actual_usefulness": 1.0}

    def twice_then_once(ns: str) -> list[set[Move]]:
        out = []
        for _ in range(2):
            clock.advance(1)
            out.append(moves(c.consolidate(ns)))
        return out

    ns = "entry/future"  # feedback dated a day ahead: surprise 0.51 and two accesses, in SLOW
    c.update_namespace_config(ns, tiers=tiers)
    c.create(ns, "A surprising fact.", id="m", tier="slow", importance=0.5)
    clock.advance(10)
    c.feedback(ns, [{"id": "m", **surprising}] * 2, as_of=clock.now + 86400)
    assert c.get(ns, "m").last_access_time.seconds == int(clock.now)
    assert twice_then_once(ns) == [{(ns, "m", SLOW, MEDIUM, pb.MOVE_REASON_PROMOTE_SURPRISE)}, set()]

    ns = "entry/race"  # a plain access committed after the pass planned, before it applied
    c.update_namespace_config(ns, tiers=tiers)
    c.create(ns, "Another surprising fact.", id="m", tier="slow", importance=0.5)
    clock.advance(10)
    c.feedback(ns, [{"id": "m", **surprising}] * 2)
    apply_plan = lifecycle_module._apply_plan

    def feedback_first(*args: Any) -> Any:
        clock.advance(1)
        c.feedback(ns, [{"id": "m"}])
        return apply_plan(*args)

    monkeypatch.setattr(lifecycle_module, "_apply_plan", feedback_first)
    clock.advance(1)
    assert moves(c.consolidate(ns)) == {(ns, "m", SLOW, MEDIUM, pb.MOVE_REASON_PROMOTE_SURPRISE)}
    monkeypatch.setattr(lifecycle_module, "_apply_plan", apply_plan)
    m = c.get(ns, "m")
    assert m.tier_time.seconds == m.last_access_time.seconds == int(clock.now)
    assert twice_then_once(ns) == [set(), set()]

    ns, copy = "entry/source", "entry/copy"  # promoted by accesses just before the export
    for space in (ns, copy):
        c.update_namespace_config(space, tiers=tiers)
    c.create(ns, "A well used fact.", id="m", tier="slow", importance=0.5)
    clock.advance(10)
    c.feedback(ns, [{"id": "m"}] * 5)
    assert moves(c.consolidate(ns)) == {(ns, "m", SLOW, MEDIUM, pb.MOVE_REASON_PROMOTE_ACCESS)}
    assert c.import_memories(c.export_memories(ns), target_namespace=copy).imported == 1
    assert c.get(copy, "m").tier == MEDIUM
    assert twice_then_once(copy) == [set(), set()]
    c.feedback(copy, [{"id": "m"}] * 5)  # (evidence after the import still counts)
    assert moves(c.consolidate(copy)) == {(copy, "m", MEDIUM, FAST, pb.MOVE_REASON_PROMOTE_ACCESS)}

    # a surprising memory whose last access is dated a day ahead (exported by a server whose clock
    # ran ahead): the surprise rule counts accesses since the entry, it does not compare times
    ns, ahead = "entry/surprising", "entry/ahead"
    for space in (ns, ahead):
        c.update_namespace_config(space, tiers=tiers)
    c.create(ns, "A surprising fact.", id="m", tier="glacial", importance=0.5)
    c.feedback(ns, [{"id": "m", **surprising}] * 2)
    chunks = list(c.export_memories(ns))
    memory = next(ch.memory for ch in chunks if ch.WhichOneof("chunk") == "memory")
    memory.last_access_time.seconds = int(clock.now) + 86400
    assert c.import_memories(chunks, target_namespace=ahead).imported == 1
    assert twice_then_once(ahead) == [set(), set()]
    c.feedback(ahead, [{"id": "m"}])  # (an access after the import: the surprise promotes now)
    assert moves(c.consolidate(ahead)) == {(ahead, "m", GLACIAL, SLOW, pb.MOVE_REASON_PROMOTE_SURPRISE)}
    assert twice_then_once(ahead) == [set(), set()]

    # imported access and tier times ahead of the clock count as now: idle demotion goes on
    ns, idle = "entry/idle-source", "entry/idle"
    for space in (ns, idle):
        c.update_namespace_config(space, tiers={"slow": {"ttl_seconds": 60.0, "importance_threshold": 0.0}})
    for mid in ("plain", "accessed", "entered"):
        c.create(ns, f"Fact {mid}.", id=mid, tier="slow", importance=0.5)
    chunks = list(c.export_memories(ns))
    for ch in chunks[1:]:
        if ch.memory.id == "accessed":
            ch.memory.last_access_time.seconds = int(clock.now) + 365 * 86400
        if ch.memory.id == "entered":
            ch.memory.tier_time.seconds = int(clock.now) + 365 * 86400
    assert c.import_memories(chunks, target_namespace=idle).imported == 3
    clock.advance(7200)
    assert moves(c.consolidate(idle)) == {
        (idle, m, SLOW, GLACIAL, pb.MOVE_REASON_DEMOTE_IDLE) for m in ("plain", "accessed", "entered")
    }


def test_glacial_over_capacity_reports_or_deletes(env: Env) -> None:
    c = env.c
    ns = "archive"
    c.update_namespace_config(ns, tiers={"glacial": {"max_items": 2}})
    imps = {"g1": 0.1, "g9": 0.9, "g3": 0.3, "g7": 0.7}
    for mid, imp in imps.items():
        c.create(ns, f"archived {mid}", id=mid, tier="glacial", importance=imp)
    before = state(c, ns)
    r = c.consolidate(ns)
    assert moves(r) == set()
    assert counts(r) == (0, 0, 0, 0, 2)  # two above capacity, deleting not allowed
    assert state(c, ns) == before
    assert lifecycle(c, ns) == zeros4()

    resp = c.update_namespace_config(ns, delete_from_glacial=True)
    assert resp.effective.delete_from_glacial and resp.config.policy.delete_from_glacial
    r = c.consolidate(ns)
    assert moves(r) == {(ns, "g1", GLACIAL, GONE, DELETE_CAP), (ns, "g3", GLACIAL, GONE, DELETE_CAP)}
    assert counts(r) == (0, 0, 0, 2, 0)
    for mid in ("g1", "g3"):
        expect_not_found(functools.partial(c.get, ns, mid))
    assert sorted(tiers_of(c, ns)) == ["g7", "g9"]
    assert lifecycle(c, ns)[GLACIAL] == (0, 0, 2, 2)  # deleted and evicted
    assert lifecycle(c)[GLACIAL] == (0, 0, 2, 2)
    assert last_hour(c, ns)[GLACIAL] == (0, 0, 2)
    assert c.stats(ns).tiers[3].memory_count == 2


# --------------------------------------------------------------------------------------------
# 7-8. Dry run and expiry
# --------------------------------------------------------------------------------------------


def test_dry_run_reports_the_same_moves_and_changes_nothing(env: Env) -> None:
    c, clock = env.c, env.clock
    a, b = "dry/a", "dry/b"
    c.update_namespace_config(b, tiers={"fast": {"max_items": 2, "ttl_seconds": NEVER}})
    c.create(a, "idle fast", id="idle", tier="fast", importance=0.9)
    c.create(a, "popular", id="popular", tier="slow")
    c.create(a, "short lived", id="temp", tier="slow", expire_time=T0 + 150)
    c.create(a, "stays", id="stays", tier="slow")
    clock.advance(100)
    access(c, a, "popular", 5)
    for mid, imp in (("b1", 0.9), ("b2", 0.1), ("b3", 0.5)):
        c.create(b, f"fresh {mid}", id=mid, tier="fast", importance=imp)
    clock.advance(100)  # T0+200: idle 200 s, temp expired
    want = {
        (a, "idle", FAST, MEDIUM, D_IDLE),
        (a, "popular", SLOW, MEDIUM, P_ACCESS),
        (a, "temp", SLOW, GONE, EXPIRED),
        (b, "b2", FAST, MEDIUM, EVICT),
    }
    before = state(c, a, b)
    dry = c.consolidate(dry_run=True)
    assert moves(dry) == want
    assert counts(dry) == (1, 1, 1, 1, 0)
    assert dry.apply_seconds == 0
    assert state(c, a, b) == before  # tiers, stats, namespace counts and writes unchanged
    assert moves(c.consolidate(dry_run=True)) == want  # still all pending
    capped = c.consolidate(dry_run=True, max_reported_moves=1)
    assert len(capped.moves) == 1 and counts(capped) == (1, 1, 1, 1, 0)  # counts stay complete

    real = c.consolidate()
    assert moves(real) == want and counts(real) == counts(dry)
    assert tiers_of(c, a) == {"idle": MEDIUM, "popular": MEDIUM, "stays": SLOW}
    assert tiers_of(c, b) == {"b1": FAST, "b2": MEDIUM, "b3": FAST}
    assert state(c, a, b) != before


def test_expired_memories_are_hidden_then_deleted_by_a_pass(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "expiry"
    c.create(ns, "keep this memory", id="keep", tier="medium")
    c.create(ns, "gone soon memory", id="gone", tier="medium", expire_time=T0 + 100)
    c.create(ns, "gone later memory", id="later", tier="medium", expire_time=T0 + 1000)

    def visible() -> tuple[set[str], set[str]]:
        found = set(ids_of(c.search(ns, "gone soon memory", limit=50)))
        return found, set(tiers_of(c, ns))

    clock.advance(99)
    assert visible() == ({"keep", "gone", "later"},) * 2
    assert c.get(ns, "gone").id == "gone"
    clock.advance(2)  # past expire_time
    expect_not_found(lambda: c.get(ns, "gone"))
    assert visible() == ({"keep", "later"},) * 2
    assert c.stats(ns).memory_count == 2 and c.stats(ns).tiers[1].memory_count == 2
    assert [(n.name, n.memory_count) for n in c.list_namespaces(ns)] == [(ns, 3)]  # until deleted

    r = c.consolidate(ns)
    assert moves(r) == {(ns, "gone", MEDIUM, GONE, EXPIRED)}
    assert counts(r) == (0, 0, 0, 1, 0)
    assert [(n.name, n.memory_count) for n in c.list_namespaces(ns)] == [(ns, 2)]
    assert lifecycle(c, ns)[MEDIUM] == (0, 0, 0, 1)  # deleted, not an eviction
    assert moves(c.consolidate(ns)) == set()


# --------------------------------------------------------------------------------------------
# 9-10. Protected namespaces, clearing scopes
# --------------------------------------------------------------------------------------------


def test_protected_namespace_needs_confirm(env: Env) -> None:
    c = env.c
    vault, other = "user:ana/vault", "user:ana/scratch"
    for mid in ("a", "b", "c", "d"):
        c.create(vault, f"secret {mid}", id=mid, tier="slow")
    c.create(other, "incoming", id="a")
    resp = c.update_namespace_config(vault, protected=True)
    assert resp.config.protected
    assert c.get_namespace_config(vault).config.protected
    assert not c.get_namespace_config(other).config.protected

    attempts: dict[str, Callable[[bool], Any]] = {
        "update": lambda confirm: c.update(vault, "a", importance=0.9, confirm=confirm),
        "delete": lambda confirm: c.delete(vault, "b", confirm=confirm),
        "move out": lambda confirm: c.transfer(
            vault, "c", mode="move", target_namespace=other, target_id="c_moved", confirm=confirm
        ),
        "overwrite in": lambda confirm: c.transfer(
            other, "a", mode="copy", target_namespace=vault, target_id="d", overwrite=True, confirm=confirm
        ),
        "clear": lambda confirm: c.delete_namespace(vault, confirm=confirm),
        "clear parent": lambda confirm: c.delete_namespace(
            "user:ana", include_children=True, confirm=confirm
        ),
    }
    before = state(c, vault, other)
    for name, attempt in attempts.items():
        expect_protected(functools.partial(attempt, False))
        assert state(c, vault, other) == before, name

    # adding to a protected namespace is allowed: create, and transfer in without overwriting
    c.create(vault, "new secret", id="e")
    copied = c.transfer(vault, "a", mode="copy", target_namespace=other, target_id="a_copy")  # copy out
    assert copied.origin.namespace == vault
    c.transfer(other, "a", mode="copy", target_namespace=vault, target_id="f")
    assert sorted(tiers_of(c, vault)) == ["a", "b", "c", "d", "e", "f"]

    assert c.update(vault, "a", importance=0.9, confirm=True).importance == pytest.approx(0.9)
    c.delete(vault, "b", confirm=True)
    c.transfer(vault, "c", mode="move", target_namespace=other, target_id="c_moved", confirm=True)
    d = c.transfer(
        other, "a", mode="copy", target_namespace=vault, target_id="d", overwrite=True, confirm=True
    )
    assert d.content == "incoming" and c.get(vault, "d").content == "incoming"
    assert sorted(tiers_of(c, vault)) == ["a", "d", "e", "f"]
    assert sorted(tiers_of(c, other)) == ["a", "a_copy", "c_moved"]
    assert c.delete_namespace(vault, confirm=True) == 4
    assert tiers_of(c, vault) == {}

    # unprotecting needs confirm too; afterwards plain calls work
    c.create(vault, "again", id="g")
    expect_protected(lambda: c.update_namespace_config(vault, protected=False))
    assert c.get_namespace_config(vault).config.protected
    assert not c.update_namespace_config(vault, protected=False, confirm=True).config.protected
    c.delete(vault, "g")
    assert c.delete_namespace("user:ana", include_children=True) == 3


def test_clearing_a_task_namespace_is_one_call(env: Env) -> None:
    c = env.c
    proj = "user:a/project:x"
    task = f"{proj}/task:1"
    layout = {proj: 2, task: 3, f"{task}/sub": 2, f"{proj}/task:10": 1}

    def fill(ns: str, n: int) -> None:
        for i in range(n):
            c.create(ns, f"note {i} of {ns}", tier=i % 4 + 1)

    for ns, n in layout.items():
        fill(ns, n)

    def population() -> dict[str, int]:
        return {n.name: n.memory_count for n in c.list_namespaces("user:a")}

    assert population() == layout
    assert c.delete_namespace(task) == 3
    assert population() == {proj: 2, f"{task}/sub": 2, f"{proj}/task:10": 1}
    assert c.search(task, "note 0 of " + task) == []

    fill(task, 3)
    assert c.delete_namespace(task, include_children=True) == 5
    assert population() == {proj: 2, f"{proj}/task:10": 1}  # "task:10" is not a child of "task:1"
    assert len(list(c.list_memories(proj))) == 2
    assert c.stats().memory_count == 3


# --------------------------------------------------------------------------------------------
# 11. Transfers
# --------------------------------------------------------------------------------------------


def test_transfer_copy_move_tier_and_conflicts(env: Env) -> None:
    c, clock = env.c, env.clock
    glob, proj = "user:a", "user:a/project:x"
    task = f"{proj}/task:1"
    rng = np.random.default_rng(11)
    emb = [float(x) for x in rng.normal(size=DIM)]
    src = c.create(
        task,
        "the build uses bazel",
        id="m1",
        tier="fast",
        importance=0.7,
        kind="fact",
        topic="ci",
        tags=["build"],
        metadata={"k": 1},
        embedding=emb,
        embedding_model=MODEL,
    )
    for i in range(3):  # other memories in the target, so search has to rank
        c.create(
            proj, f"other {i}", embedding=[float(x) for x in rng.normal(size=DIM)], embedding_model=MODEL
        )
    src_vec = list(c.get(task, "m1", include_embedding=True).embedding)
    assert src_vec == pytest.approx(list(unit(emb)), abs=1e-6)

    clock.advance(100)
    copy = c.transfer(task, "m1", mode="copy", target_namespace=proj)
    assert (copy.namespace, copy.id, copy.tier) == (proj, "m1", FAST)  # id and tier kept
    assert (copy.origin.namespace, copy.origin.id, copy.origin.tier) == (task, "m1", FAST)
    assert ts(copy.origin.transfer_time) == clock.now and ts(copy.tier_time) == clock.now
    for f in ("content", "kind", "topic", "tags", "metadata", "importance", "embedding_model"):
        assert getattr(copy, f) == getattr(src, f), f
    got = c.get(proj, "m1", include_embedding=True)
    assert list(got.embedding) == src_vec and got.origin == copy.origin
    kept = c.get(task, "m1")
    assert kept.content == src.content and not kept.HasField("origin")  # COPY keeps the source as it was
    res = c.search(proj, emb, embedding_model=MODEL, limit=10)
    assert res[0].memory.id == "m1" and res[0].memory.namespace == proj
    assert res[0].relevance == pytest.approx(1.0, abs=1e-5)

    # target_tier changes the tier; the origin keeps the source's tier
    up = c.transfer(task, "m1", mode="copy", target_namespace=glob, target_tier="slow")
    assert up.tier == SLOW and up.origin.tier == FAST and up.origin.namespace == task
    assert ids_of(c.search(glob, emb, embedding_model=MODEL, tiers=["slow"])) == ["m1"]
    assert c.search(glob, emb, embedding_model=MODEL, tiers=["fast"]) == []

    # COPY inside the namespace gets a generated id
    dup = c.transfer(task, "m1", mode="copy")
    assert dup.namespace == task and re.fullmatch(r"[0-9a-f]{32}", dup.id)

    # an existing target id conflicts unless overwrite=true
    before = state(c, task, proj, glob)
    with pytest.raises(AlreadyExistsError) as ei:
        c.transfer(task, "m1", mode="move", target_namespace=proj)
    assert ei.value.reason == "MEMORY_ALREADY_EXISTS"
    assert state(c, task, proj, glob) == before

    clock.advance(50)
    writes = c.stats().writes_committed
    total = c.stats().memory_count
    moved = c.transfer(task, "m1", mode="move", target_namespace=proj, overwrite=True, target_tier="medium")
    assert c.stats().writes_committed == writes + 1  # source deleted in the same commit
    assert c.stats().memory_count == total - 1  # the overwritten copy and the source are gone, one added
    assert moved.tier == MEDIUM and ts(moved.origin.transfer_time) == clock.now
    expect_not_found(lambda: c.get(task, "m1"))
    assert "m1" not in ids_of(c.search(task, emb, embedding_model=MODEL, limit=50))
    assert [m.id for m in c.list_memories(proj)].count("m1") == 1
    res = c.search(proj, emb, embedding_model=MODEL, limit=50)
    assert ids_of(res).count("m1") == 1 and res[0].memory.tier == MEDIUM

    # mode is required
    before = state(c, task, proj, glob)
    expect_invalid(lambda: c.transfer(task, dup.id, mode="unspecified", target_namespace=proj), "mode")
    assert state(c, task, proj, glob) == before


# --------------------------------------------------------------------------------------------
# 12. Per-namespace overrides
# --------------------------------------------------------------------------------------------


def effective_tiers(policy: pb.LifecyclePolicy) -> dict[int, tuple[float, int, float, float, float]]:
    return {
        tp.tier: (
            tp.ttl_seconds,
            tp.max_items,
            tp.importance_threshold,
            tp.half_life_hours,
            tp.cadence_seconds,
        )
        for tp in policy.tiers
    }


def default_tiers() -> dict[int, tuple[float, int, float, float, float]]:
    return {t: (ttl, mx, f32(thr), hl, cad) for t, (ttl, mx, thr, hl, cad) in DEFAULT_TIERS.items()}


def test_namespace_config_defaults_overrides_and_validation(env: Env) -> None:
    c, clock = env.c, env.clock
    a, b = "cfg/a", "cfg/b"
    fresh = c.get_namespace_config(a)
    assert fresh.config.namespace == a and not fresh.config.protected
    assert fresh.config.policy == pb.LifecyclePolicy()  # nothing stored
    eff = fresh.effective
    assert effective_tiers(eff) == default_tiers()
    assert [tp.tier for tp in eff.tiers] == [FAST, MEDIUM, SLOW, GLACIAL]
    assert eff.retention == pb.RETENTION_POLICY_IMPORTANCE_WEIGHTED
    assert not eff.delete_from_glacial
    assert (eff.promote_access_count, eff.promote_success_count) == (5, 3)
    assert eff.promote_surprise == pytest.approx(0.5)

    resp = c.update_namespace_config(
        a, tiers={"fast": {"ttl_seconds": 30.0, "max_items": 7}}, retention="lru", promote_access_count=2
    )
    stored = resp.config.policy
    assert [(tp.tier, tp.ttl_seconds, tp.max_items) for tp in stored.tiers] == [(FAST, 30.0, 7)]
    assert not stored.tiers[0].HasField("importance_threshold")  # only what was set is stored
    assert stored.retention == pb.RETENTION_POLICY_LRU and stored.promote_access_count == 2
    assert not stored.HasField("promote_surprise")
    want = default_tiers()
    want[FAST] = (30.0, 7, f32(0.8), 1.0, 5.0)
    assert effective_tiers(resp.effective) == want
    assert resp.effective.retention == pb.RETENTION_POLICY_LRU
    assert resp.effective.promote_access_count == 2 and resp.effective.promote_success_count == 3
    got = c.get_namespace_config(a)
    assert got.config == resp.config and got.effective == resp.effective
    other = c.get_namespace_config(b)  # another namespace keeps the server's settings
    assert other.config.policy == pb.LifecyclePolicy() and other.effective == fresh.effective

    # the overrides drive the lifecycle of that namespace only
    for ns in (a, b):
        c.create(ns, "fast note", id="f", tier="fast", importance=0.9)
        c.create(ns, "slow note", id="s", tier="slow")
        access(c, ns, "s", 2)
    clock.advance(45)  # idle 45 s: beyond a's 30 s, within the default 60 s
    r = c.consolidate()
    assert moves(r) == {(a, "f", FAST, MEDIUM, D_IDLE), (a, "s", SLOW, MEDIUM, P_ACCESS)}

    # bad values: INVALID_ARGUMENT naming the field, nothing stored
    def tier_field(name: str) -> re.Pattern[str]:
        return re.compile(rf"config\.policy\.tiers\[0\]\.{name}")

    bad: list[tuple[dict[str, Any], str | re.Pattern[str]]] = [
        ({"tiers": {"fast": {"max_items": -1}}}, tier_field("max_items")),
        ({"tiers": {"medium": {"importance_threshold": 1.5}}}, tier_field("importance_threshold")),
        ({"tiers": {"slow": {"ttl_seconds": 0.0}}}, tier_field("ttl_seconds")),
        ({"tiers": {"slow": {"half_life_hours": -1.0}}}, tier_field("half_life_hours")),
        ({"tiers": {"slow": {"cadence_seconds": -1.0}}}, tier_field("cadence_seconds")),
        ({"tiers": {0: {"ttl_seconds": 10.0}}}, "config.policy.tiers[0].tier"),
        ({"promote_access_count": 0}, "config.policy.promote_access_count"),
        ({"promote_surprise": 1.5}, "config.policy.promote_surprise"),
    ]
    for kwargs, field in bad:
        expect_invalid(functools.partial(c.update_namespace_config, a, **kwargs), field)
        assert c.get_namespace_config(a) == got, kwargs
    dup = pb.UpdateNamespaceConfigRequest(
        config=pb.NamespaceConfig(
            namespace=a,
            policy=pb.LifecyclePolicy(
                tiers=[pb.TierPolicy(tier=FAST, ttl_seconds=5.0), pb.TierPolicy(tier=FAST, max_items=3)]
            ),
        ),
        update_mask=field_mask_pb2.FieldMask(paths=["policy.tiers"]),
    )
    expect_invalid(lambda: raw(c, "UpdateNamespaceConfig", dup), "config.policy.tiers[1].tier")
    assert c.get_namespace_config(a) == got
    for tiers, field in (
        ([pb.TierPolicy(tier=17, ttl_seconds=5.0)], "config.policy.tiers[0].tier"),
        (
            [pb.TierPolicy(tier=FAST, ttl_seconds=5.0), pb.TierPolicy(tier=SLOW, ttl_seconds=0.0)],
            "config.policy.tiers[1].ttl_seconds",
        ),
    ):
        req = pb.UpdateNamespaceConfigRequest(
            config=pb.NamespaceConfig(namespace=a, policy=pb.LifecyclePolicy(tiers=tiers)),
            update_mask=field_mask_pb2.FieldMask(paths=["policy.tiers"]),
        )
        expect_invalid(lambda req=req: raw(c, "UpdateNamespaceConfig", req), field)
        assert c.get_namespace_config(a) == got

    # replacing the tier overrides and resetting the policy
    resp = c.update_namespace_config(a, tiers={"medium": {"max_items": 9}})
    want = default_tiers()
    want[MEDIUM] = (3600.0, 9, f32(0.5), 24.0, 60.0)
    assert effective_tiers(resp.effective) == want
    assert resp.effective.retention == pb.RETENTION_POLICY_LRU  # other overrides kept
    resp = c.update_namespace_config(a, reset_policy=True)
    assert resp.config.policy == pb.LifecyclePolicy() and resp.effective == fresh.effective


def test_half_life_override_changes_search_importance(env: Env) -> None:
    c, clock = env.c, env.clock
    short, default = "hl/short", "hl/default"
    c.update_namespace_config(short, tiers={"medium": {"half_life_hours": 2.0}})
    age = 6 * 3600.0
    for ns in (short, default):
        c.create(
            ns, "a six hour old memory", id="m", tier="medium", importance=0.8, create_time=clock.now - age
        )
    got = {ns: c.search(ns, "a six hour old memory", limit=1)[0].importance for ns in (short, default)}
    assert got[short] == pytest.approx(decayed(0.8, age, 2.0), abs=1e-6)  # 0.8 / 8
    assert got[default] == pytest.approx(decayed(0.8, age, 24.0), abs=1e-6)
    assert got[short] < got[default]


# --------------------------------------------------------------------------------------------
# 13. Stats
# --------------------------------------------------------------------------------------------


def test_lifecycle_stats_scopes_last_hour_and_restart(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    clock = FakeClock()
    data_dir = tmp_path / "stats"
    s, t = "stats/s", "stats/t"
    first = server_factory(data_dir=data_dir, clock=clock)
    with connect(first) as c:
        c.update_namespace_config(s, tiers={"fast": {"max_items": 1}})
        c.create(s, "idle in fast", id="d", tier="fast", importance=0.9)
        c.create(t, "idle in fast too", id="d", tier="fast", importance=0.9)
        c.create(s, "popular", id="p", tier="slow")
        clock.advance(61)
        access(c, s, "p", 5)
        c.create(s, "fresh keep", id="e1", tier="fast", importance=0.9)
        c.create(s, "fresh evict", id="e2", tier="fast", importance=0.1)
        assert lifecycle(c) == zeros4()
        r = c.consolidate()
        assert moves(r) == {
            (s, "d", FAST, MEDIUM, D_IDLE),
            (t, "d", FAST, MEDIUM, D_IDLE),
            (s, "p", SLOW, MEDIUM, P_ACCESS),
            (s, "e2", FAST, MEDIUM, EVICT),
        }
        want_s = zeros4() | {FAST: (0, 1, 1, 0), SLOW: (1, 0, 0, 0)}
        want_t = zeros4() | {FAST: (0, 1, 0, 0)}
        want_all = zeros4() | {FAST: (0, 2, 1, 0), SLOW: (1, 0, 0, 0)}
        assert lifecycle(c, s) == want_s
        assert lifecycle(c, t) == want_t
        assert lifecycle(c) == want_all
        assert lifecycle(c, "stats/nobody") == zeros4()
        assert last_hour(c, s) == {k: v[:3] for k, v in want_s.items()}
        assert last_hour(c) == {k: v[:3] for k, v in want_all.items()}

        clock.advance(3599)  # still within the hour
        assert last_hour(c) == {k: v[:3] for k, v in want_all.items()}
        clock.advance(2)  # more than an hour after the moves
        assert last_hour(c) == {k: (0, 0, 0) for k in want_all}
        assert last_hour(c, s) == {k: (0, 0, 0) for k in want_s}
        assert lifecycle(c) == want_all and lifecycle(c, s) == want_s  # totals stay
        config = c.get_namespace_config(s)
    first.stop(0)

    second = server_factory(data_dir=data_dir, clock=clock)
    with connect(second) as c:
        assert lifecycle(c) == want_all
        assert lifecycle(c, s) == want_s
        assert lifecycle(c, t) == want_t
        assert c.get_namespace_config(s) == config  # overrides survive too
        st = c.stats()
        assert (st.search_hits, st.search_misses, st.hit_rate) == (0, 0, 0.0)


def test_search_hit_rate_per_namespace_and_server(env: Env) -> None:
    c = env.c
    s, e = "hits/s", "hits/empty"
    c.create(s, "something to find", id="x", tier="slow")
    assert c.stats().hit_rate == 0.0
    assert len(c.search(s, "something to find")) == 1  # hit
    assert c.search(e, "something to find") == []  # miss
    assert len(c.search([s, e], "something to find")) == 1  # hit overall, for s; miss for e
    assert c.search(s, "something to find", tiers=["glacial"]) == []  # miss
    want = {"": (2, 2, 0.5), s: (2, 1, 2 / 3), e: (0, 2, 0.0), "hits/other": (0, 0, 0.0)}
    for ns, (hits, misses, rate) in want.items():
        st = c.stats(ns)
        assert (st.search_hits, st.search_misses) == (hits, misses), ns
        assert st.hit_rate == pytest.approx(rate), ns


# --------------------------------------------------------------------------------------------
# 14. Scheduled passes
# --------------------------------------------------------------------------------------------


def test_scheduled_pass_honours_per_tier_cadence(env: Env) -> None:
    c, clock, engine = env.c, env.clock, env.running.engine
    ns = "sched"
    c.update_namespace_config(ns, tiers={"fast": {"ttl_seconds": 10.0}, "medium": {"ttl_seconds": 10.0}})
    c.create(ns, "fast note", id="f", tier="fast", importance=0.9)
    c.create(ns, "medium note", id="m", tier="medium", importance=0.9)
    assert engine_moves(engine.consolidate(scheduled=True)) == set()  # T0: all due, none idle yet

    clock.advance(20)  # both idle 20 s > 10 s; FAST cadence (5 s) elapsed, MEDIUM's (60 s) not
    # an explicit pass ignores cadence (and a dry run leaves the schedule alone)
    assert moves(c.consolidate(ns, dry_run=True)) == {
        (ns, "f", FAST, MEDIUM, D_IDLE),
        (ns, "m", MEDIUM, SLOW, D_IDLE),
    }
    assert engine_moves(engine.consolidate(scheduled=True)) == {(ns, "f", FAST, MEDIUM, D_IDLE)}
    assert tiers_of(c, ns) == {"f": MEDIUM, "m": MEDIUM}

    clock.advance(20)  # T0+40: both idle in MEDIUM, but 40 s since MEDIUM's last scheduled pass
    assert engine_moves(engine.consolidate(scheduled=True)) == set()
    clock.advance(20)  # T0+60: MEDIUM's cadence elapsed
    assert engine_moves(engine.consolidate(scheduled=True)) == {
        (ns, "f", MEDIUM, SLOW, D_IDLE),
        (ns, "m", MEDIUM, SLOW, D_IDLE),
    }
    assert tiers_of(c, ns) == {"f": SLOW, "m": SLOW}


def test_background_pass_demotes_idle_fast_memory(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, maintenance_interval_seconds=0.2)
    ns = "background"
    with connect(running) as c:
        c.create(ns, "fast note", id="f", tier="fast", importance=0.9)
        c.create(ns, "short lived", id="x", tier="slow", expire_time=clock.now + 1)
        clock.advance(2)

        def population() -> int:
            return sum(n.memory_count for n in c.list_namespaces(ns))

        # the expired memory disappearing shows a background pass ran at T0+2 ...
        assert wait_for(lambda: population() == 1), "no background pass within 5 s"
        assert tier_of(c, ns, "f") == FAST  # ... and it did not demote a memory idle for 2 s
        clock.advance(60)  # idle 62 s
        assert wait_for(lambda: tier_of(c, ns, "f") == MEDIUM), "idle FAST memory not demoted within 5 s"
        m = c.get(ns, "f")
        assert clock.now - 60 < ts(m.tier_time) <= clock.now  # moved at fake time
        assert lifecycle(c, ns)[FAST] == (0, 1, 0, 0)


def test_background_expiry_counts_as_lifecycle_deletion(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, maintenance_interval_seconds=0.2)
    ns = "background/expiry"
    with connect(running) as c:
        c.create(ns, "short lived", id="x", tier="slow", expire_time=clock.now + 1)
        c.create(ns, "stays", id="y", tier="slow")
        clock.advance(2)
        assert wait_for(lambda: sum(n.memory_count for n in c.list_namespaces(ns)) == 1)
        assert lifecycle(c, ns)[SLOW] == (0, 0, 0, 1)


# --------------------------------------------------------------------------------------------
# 15. Moved memories stay searchable in their new tier
# --------------------------------------------------------------------------------------------


def test_moved_memories_are_searchable_in_their_new_tier_only(env: Env) -> None:
    c, clock = env.c, env.clock
    ns = "moves"
    c.update_namespace_config(ns, tiers={"fast": {"max_items": 1}})
    rng = np.random.default_rng(15)
    embs: dict[str, list[float]] = {}

    def make(mid: str, tier: str, importance: float = 0.5) -> None:
        embs[mid] = [float(x) for x in rng.normal(size=DIM)]
        c.create(
            ns,
            f"memory {mid}",
            id=mid,
            tier=tier,
            importance=importance,
            embedding=embs[mid],
            embedding_model=MODEL,
        )

    make("idle", "fast", 0.9)
    make("popular", "slow")
    make("archived", "glacial")
    make("stays", "slow")
    clock.advance(61)
    access(c, ns, "popular", 5)
    access(c, ns, "archived", 5)
    make("keep", "fast", 0.9)
    make("evicted", "fast", 0.1)
    r = c.consolidate(ns)
    want = {
        (ns, "idle", FAST, MEDIUM, D_IDLE),
        (ns, "popular", SLOW, MEDIUM, P_ACCESS),
        (ns, "archived", GLACIAL, SLOW, P_ACCESS),
        (ns, "evicted", FAST, MEDIUM, EVICT),
    }
    assert moves(r) == want
    for _, mid, old, new, _ in want:
        found_new = c.search(ns, embs[mid], embedding_model=MODEL, limit=50, tiers=[new])
        assert mid in ids_of(found_new), mid
        assert next(x for x in found_new if x.memory.id == mid).relevance == pytest.approx(1.0, abs=1e-5)
        assert mid not in ids_of(c.search(ns, embs[mid], embedding_model=MODEL, limit=50, tiers=[old])), mid
        assert tier_of(c, ns, mid) == new
    everything = ids_of(c.search(ns, embs["idle"], embedding_model=MODEL, limit=50))
    assert sorted(everything) == sorted(embs)  # each memory exactly once: no stale index entries
    space = {sp.embedding_model: sp for sp in c.stats().spaces}[MODEL]
    assert space.live_vectors == len(embs)
    assert c.stats(ns).memory_count == len(embs)


def test_a_transfer_stores_as_a_create_in_the_target_would(env: Env) -> None:
    """A preference or a summary copied into a protected namespace needs confirm, as a create
    there does; a summary replaces the target's current one; the copy counts toward the target's
    summary (and a reflection's importance), as a create would."""
    c = env.c
    c.update_namespace_config("prot", protected=True)
    pref = c.create("free", "I prefer tea", kind="preference", importance=0.7)
    summary = c.summarize("free", "Summary of free.", source_memory_ids=[])
    for m in (pref, summary):
        with pytest.raises(FailedPreconditionError) as e:
            c.transfer("free", m.id, target_namespace="prot")
        assert e.value.reason == "NAMESPACE_PROTECTED"
    assert [m.id for m in c.timeline("prot")] == []
    assert c.transfer("free", pref.id, target_namespace="prot", confirm=True).kind == "preference"

    old = c.summarize("dst", "Old summary of dst.", source_memory_ids=[])
    before = c.stats("dst")
    copied = c.transfer("free", summary.id, target_namespace="dst")
    assert [m.id for m in c.timeline("dst") if m.kind == "summary"] == [copied.id]
    with pytest.raises(NotFoundError):
        c.get("dst", old.id)
    obs = c.create("free", "an observation worth a lot", importance=0.9)
    c.transfer("free", obs.id, target_namespace="dst")
    after = c.stats("dst")
    assert after.reflection_importance == pytest.approx(before.reflection_importance + 0.9)


def test_a_transfer_keeps_the_targets_caps_and_working_memory_as_a_create_would(env: Env) -> None:
    """A namespace capped on create, and one whose working memory flushes past its limit: memories
    transferred there count at once (they stayed over the cap until the next create or pass)."""
    c = env.c
    proj = "tp/project"
    c.update_namespace_config(proj, preset="task_project_global", max_items=3)
    for i in range(3):
        c.create(proj, f"project note {i}", importance=0.5)
    for i in range(3):
        env.clock.advance(1)
        c.create("tp/project/task:1", f"task finding {i}", id=f"t{i}", importance=0.9)
        moved = c.transfer("tp/project/task:1", f"t{i}", mode="move", target_namespace=proj)
        assert c.stats(proj).memory_count == 3 and c.get(proj, moved.id).content == f"task finding {i}"
    c.update_namespace_config("tp/working", working_token_limit=10)
    for i in range(4):
        c.create("tp/src", f"working memory item number {i}", id=f"w{i}", tier="fast", importance=0.9)
        c.transfer("tp/src", f"w{i}", mode="copy", target_namespace="tp/working")
    fast = [m for m in c.list_memories("tp/working") if m.tier == FAST]
    assert sum(m.token_cost for m in fast) <= 10


def _updates_racing_passes(c: MemoryClient, ns: str, ids: list[str]) -> tuple[list[Any], list[Any]]:
    """Eight threads update ``ids`` to GLACIAL while a ninth runs three passes over ``ns``: (what
    failed, the moves the passes reported)."""
    import threading

    start, errors, reported = threading.Barrier(9), [], []

    def update(part: list[str]) -> None:
        start.wait()
        for mid in part:
            if c.update(ns, mid, tier="glacial").tier != GLACIAL:
                errors.append(mid)

    def consolidate() -> None:
        start.wait()
        for _ in range(3):
            try:
                reported.extend(c.consolidate(ns).moves)
            except Exception as e:  # (collected: the caller asserts there are none)
                errors.append(e)

    threads = [threading.Thread(target=update, args=(ids[k::8],)) for k in range(8)]
    threads.append(threading.Thread(target=consolidate))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors, reported


def test_a_pass_racing_tier_updates_never_moves_a_memory_by_a_tier_it_left(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Passes planned while updates move memories to GLACIAL: every acknowledged update stays (a
    move planned from the tier a memory left is skipped, not applied from the tier it entered),
    the passes never fail, and every move they report is a real step between two tiers."""
    clock = FakeClock()
    running = server_factory(clock=clock)
    with connect(running) as c:
        for rnd in range(4):
            ns = f"race/{rnd}"
            memories = [
                pb.Memory(namespace=ns, content=f"idle memory {rnd} {i}", tier=pb.TIER_FAST, importance=0.9)
                for i in range(300)
            ]
            made = c.stub.BatchCreateMemories(pb.BatchCreateMemoriesRequest(memories=memories))
            ids = [m.id for m in made.memories]
            clock.advance(61)  # idle past FAST's TTL: a pass demotes them
            errors, reported = _updates_racing_passes(c, ns, ids)
            assert errors == []
            assert {m.id: m.tier for m in c.list_memories(ns)} == dict.fromkeys(ids, GLACIAL)
            assert all(m.reason != 0 and m.from_tier != m.to_tier for m in reported)
