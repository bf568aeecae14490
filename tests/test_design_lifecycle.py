"""Importance, decay and the lifecycle as the memory designs tiermem serves spell them out, each a
per-namespace choice (a policy field, or a named preset), asserted with the designs' numbers
through the gRPC API on a real server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import FakeClock

from tiermem.client import FailedPreconditionError, InvalidArgumentError, MemoryClient
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

NS = "design:lifecycle"
T0 = 1_700_000_000.0
HOUR = 3600.0
FAST, MEDIUM, SLOW, GLACIAL = pb.TIER_FAST, pb.TIER_MEDIUM, pb.TIER_SLOW, pb.TIER_GLACIAL


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=60)
    c.wait_ready()
    return c


def configure(
    c: MemoryClient,
    namespace: str,
    *,
    tiers: dict[int, dict[str, Any]] | None = None,
    kind_capacities: dict[str, int] | None = None,
    confirm: bool = False,
    **fields: Any,
) -> pb.UpdateNamespaceConfigResponse:
    """Set policy fields (enums by value or name) with an update mask naming exactly them."""
    return c.update_namespace_config(
        namespace, tiers=tiers, kind_capacities=kind_capacities, confirm=confirm, **fields
    )


def counts(c: MemoryClient, namespace: str) -> dict[int, int]:
    return {int(t.tier): int(t.memory_count) for t in c.stats(namespace).tiers}


# -- importance decay ------------------------------------------------------------------------------


def test_decay_is_a_namespace_choice_with_an_explicit_floor(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock(T0)
    with _client(server_factory(clock=clock)) as c:
        configure(c, "decay:none", importance_decay=pb.IMPORTANCE_DECAY_NONE)
        configure(c, "decay:no-floor", importance_floor=0.0)
        for ns in ("decay:default", "decay:none", "decay:no-floor"):
            c.create(
                ns, "the release checklist", id="m", tier="fast", importance=0.8, create_time=T0 - 5 * HOUR
            )
        decayed = {
            ns: c.search(ns, "release checklist", strategy="importance")[0].importance
            for ns in ("decay:default", "decay:none", "decay:no-floor")
        }
        # FAST's half-life is 1 h: after 5 half-lives 0.8 is 0.025, 0.08 with the floor of 0.1.
        assert decayed["decay:default"] == pytest.approx(0.08, abs=1e-6)
        assert decayed["decay:no-floor"] == pytest.approx(0.8 * 0.5**5, abs=1e-6)  # 0.025
        assert decayed["decay:none"] == pytest.approx(0.8, abs=1e-6)  # the stored rating

        # Under strategy IMPORTANCE a 0.9 from two weeks ago outranks a 0.5 from today without decay;
        # with SLOW's 7-day half-life it is 0.225 and ranks second.
        configure(c, "rank:none", importance_decay=pb.IMPORTANCE_DECAY_NONE)
        for ns in ("rank:none", "rank:default"):
            old = c.create(ns, "old insight about deploys", importance=0.9, create_time=T0 - 14 * 24 * HOUR)
            new = c.create(ns, "new note about deploys", importance=0.5)
            expected = [old.id, new.id] if ns == "rank:none" else [new.id, old.id]
            assert [r.memory.id for r in c.search(ns, "deploys", strategy="importance", limit=2)] == expected

        # The effective policy says which decay and floor apply.
        eff = c.get_namespace_config("decay:no-floor").effective
        assert eff.importance_decay == pb.IMPORTANCE_DECAY_HALF_LIFE
        assert eff.HasField("importance_floor") and eff.importance_floor == 0.0
        assert c.get_namespace_config("decay:default").effective.importance_floor == pytest.approx(0.1)
        assert c.get_namespace_config("decay:none").effective.importance_decay == pb.IMPORTANCE_DECAY_NONE


def test_a_bad_floor_or_decay_changes_nothing(server_factory: Callable[..., RunningServer]) -> None:
    with _client(server_factory()) as c:
        configure(c, NS, importance_floor=0.0)
        for fields, name in (
            ({"importance_floor": 1.5}, "config.policy.importance_floor"),
            ({"importance_decay": 7}, "config.policy.importance_decay"),
            ({"importance_heuristic": 9}, "config.policy.importance_heuristic"),
            ({"preset": "no_such_design"}, "config.policy.preset"),
            ({"evict_share": 1.0}, "config.policy.evict_share"),
            ({"max_items": -1}, "config.policy.max_items"),
        ):
            with pytest.raises(InvalidArgumentError) as e:
                configure(c, NS, **fields)
            assert name in e.value.fields
        with pytest.raises(InvalidArgumentError) as e:
            configure(c, NS, kind_capacities={"Bad Kind": 3})
        assert any("kind_capacities" in f for f in e.value.fields)
        assert dict(c.get_namespace_config(NS).config.policy.ListFields()) == {
            pb.LifecyclePolicy.DESCRIPTOR.fields_by_name["importance_floor"]: 0.0
        }


# -- importance heuristics -------------------------------------------------------------------------


def test_the_ten_point_heuristic_rates_as_its_design_writes(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, NS, importance_heuristic=pb.IMPORTANCE_HEURISTIC_TEN_POINT)
        cases = {
            "This is an important, critical and urgent decision.": 0.5,  # 3 + 4 x 0.5 of 10
            "I believe and feel that we agree.": 0.45,  # 3 + 3 x 0.5
            "We disagree.": 0.4,  # "disagree" contains "agree" too
            "Lunch.": 0.3,  # the baseline
            "x" * 201: 0.4,  # +1 past 200 characters
            "y" * 501 + " urgent": 0.55,  # +1 +1, +0.5
        }
        for text, expected in cases.items():
            assert c.create(NS, text).importance == pytest.approx(expected, abs=1e-6), text
        assert c.create(NS, "Dinner.", importance=0.2, kind="note").importance == pytest.approx(0.2)
        assert c.create(NS, "a reflection", kind="reflection").importance == pytest.approx(0.8)


def test_the_phrase_heuristic_rates_as_its_design_writes(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock(T0)
    with _client(server_factory(clock=clock)) as c:
        configure(c, NS, importance_heuristic=pb.IMPORTANCE_HEURISTIC_PHRASES)
        fresh = {
            ("My name is Ana.", "observation"): 1.0,  # 0.5 + 0.3 + 0.2 fresh
            ("I will ship it on Friday.", "observation"): 0.9,  # 0.5 + 0.2 + 0.2
            ("exit status 0", "tool_result"): 0.8,  # 0.5 + 0.1 + 0.2
            ("The sky is blue.", "observation"): 0.7,  # 0.5 + 0.2
        }
        for (text, kind), expected in fresh.items():
            assert c.create(NS, text, kind=kind).importance == pytest.approx(expected, abs=1e-6), text
        # Freshness is 0.2 - 0.1 per day of age when stored: 0.1 a day old, none after two.
        day_old = c.create(NS, "The lake froze.", create_time=T0 - 24 * HOUR)
        assert day_old.importance == pytest.approx(0.6, abs=1e-6)
        assert c.create(NS, "It thawed.", create_time=T0 - 72 * HOUR).importance == pytest.approx(0.5)
        # The server's default is unchanged: the cue heuristic.
        assert c.create("plain", "My name is Ana.").importance == pytest.approx(0.4, abs=1e-6)


def test_a_memory_without_importance_gets_a_half_where_the_design_says_so(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, NS, preset="tiered_consolidation")
        assert c.create(NS, "This is an important, critical and urgent decision.").importance == 0.5
        assert c.get_namespace_config(NS).effective.default_importance == 0.5


# -- the pass ----------------------------------------------------------------------------------------


def test_one_pass_promotes_through_every_tier_whose_rules_hold(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "through", promote_through_tiers=True)
        for ns in ("through", "one-step"):
            c.create(ns, "the incident timeline", id="m", tier="glacial", importance=0.9)
            for _ in range(5):  # five accesses: promote_access_count
                c.feedback(ns, [{"id": "m", "predicted_relevance": 0.5, "actual_usefulness": 0.5}])
        report = c.consolidate("through", max_reported_moves=10)
        assert report.promoted == 1
        assert [(m.from_tier, m.to_tier) for m in report.moves] == [(GLACIAL, FAST)]
        assert c.get("through", "m").tier == FAST
        c.consolidate("one-step")
        assert c.get("one-step", "m").tier == SLOW  # the default: one tier per pass


def test_a_fresh_memory_below_its_tiers_threshold_can_be_demoted_at_once(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "no-grace", decay_grace=False)
        for ns in ("no-grace", "grace"):
            c.create(ns, "a passing remark", id="m", tier="fast", importance=0.5)  # FAST's threshold: 0.8
        report = c.consolidate("no-grace", max_reported_moves=10)
        assert [(m.to_tier, m.reason) for m in report.moves] == [(MEDIUM, pb.MOVE_REASON_DEMOTE_DECAY)]
        assert c.get("no-grace", "m").tier == MEDIUM
        c.consolidate("grace")
        assert c.get("grace", "m").tier == FAST  # the default waits one TTL in the tier


def test_glacial_over_capacity_deletes_where_the_design_evicts(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "deleting", delete_from_glacial=True)
        configure(c, "summarizing", preset="tiered_consolidation")
        for ns in ("keeping", "deleting", "summarizing"):
            c.create_batch(
                [{"namespace": ns, "content": f"archived note {i}.", "tier": "glacial"} for i in range(101)]
            )
        kept = c.consolidate("keeping")
        assert (kept.over_capacity, counts(c, "keeping")[GLACIAL]) == (1, 101)  # the default keeps all
        deleted = c.consolidate("deleting")
        assert (deleted.over_capacity, deleted.deleted, counts(c, "deleting")[GLACIAL]) == (0, 1, 100)
        summarized = c.consolidate("summarizing")
        # Two deleted, one summary in their place: 100, and the next pass has nothing to do.
        assert (summarized.over_capacity, summarized.deleted, counts(c, "summarizing")[GLACIAL]) == (
            0,
            2,
            100,
        )
        [summary] = c.list_memories("summarizing", kinds=["eviction_summary"])
        assert summary.tier == GLACIAL and len(summary.source_memory_ids) == 2
        again = c.consolidate("summarizing")
        assert (again.deleted, again.evicted, counts(c, "summarizing")[GLACIAL]) == (0, 0, 100)


def test_evicted_memories_are_summarized_when_the_namespace_asks(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "summarized", summarize_evictions=True, tiers={FAST: {"max_items": 3}})
        configure(c, "plain", tiers={FAST: {"max_items": 3}})
        for ns in ("summarized", "plain"):
            for i, imp in enumerate((0.9, 0.95, 0.85, 0.99)):
                c.create(
                    ns, f"Fact number {i} holds. Details follow.", id=f"m{i}", tier="fast", importance=imp
                )
        plain = c.consolidate("plain")
        assert (plain.evicted, counts(c, "plain")[FAST]) == (1, 3)
        assert list(c.list_memories("plain", kinds=["eviction_summary"])) == []
        report = c.consolidate("summarized", max_reported_moves=10)
        # One more evicted than the surplus, to make room for the summary: FAST stays at 3.
        assert report.evicted == 2
        assert counts(c, "summarized")[FAST] == 3 and counts(c, "summarized")[MEDIUM] == 2
        [summary] = c.list_memories("summarized", kinds=["eviction_summary"])
        assert summary.tier == FAST
        assert sorted(summary.source_memory_ids) == ["m0", "m2"]  # the two least important
        assert summary.content == "Fact number 0 holds. Fact number 2 holds."
        assert summary.importance == pytest.approx(0.9)


def test_a_create_crossing_the_cap_deletes_the_least_important_tenth(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "store", preset="task_project_global")
        configure(c, "at-pass", max_items=1000, evict_share=0.1)
        for ns in ("store", "at-pass", "uncapped"):
            items = [
                {"namespace": ns, "content": f"item {i}", "importance": (i % 10) / 10} for i in range(1000)
            ]
            c.create_batch(items)
            assert c.stats(ns).memory_count == 1000
            c.create(ns, "one more item", importance=0.5)
        assert c.stats("store").memory_count == 901  # 1,001 -> 901 before the create returned
        assert min(m.importance for m in c.list_memories("store", page_size=1000)) == pytest.approx(0.1)
        assert c.stats("at-pass").memory_count == 1001  # without evict_on_create: at the next pass
        assert c.consolidate("at-pass").deleted == 100
        assert c.stats("at-pass").memory_count == 901
        c.consolidate("uncapped")
        assert c.stats("uncapped").memory_count == 1001  # the default has no namespace cap


def test_a_create_crossing_the_cap_keeps_itself_and_deletes_from_the_others(
    server_factory: Callable[..., RunningServer],
) -> None:
    """The create's own memory stays, even as the least important: the cap's share is taken from
    the memories stored before it, and the namespace ends within its cap (it stayed over by one)."""
    with _client(server_factory()) as c:
        configure(c, "capped", max_items=5, evict_on_create=True, retention="importance")
        for i in range(5):
            c.create("capped", f"item {i}", id=f"d{i}", importance=0.5 + 0.01 * i)
        c.create("capped", "the least important", id="low", importance=0.1)
        assert sorted(m.id for m in c.list_memories("capped")) == ["d1", "d2", "d3", "d4", "low"]
        configure(c, "share", preset="task_project_global", max_items=10, evict_share=0.3)
        for i in range(10):
            c.create("share", f"item {i}", id=f"t{i}", importance=0.5 + 0.01 * i)
        c.create("share", "the least important", id="low", importance=0.1)
        assert sorted(m.id for m in c.list_memories("share")) == ["low"] + [f"t{i}" for i in range(3, 10)]


def test_reflections_and_observations_have_their_own_caps(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, NS, preset="generative_agents")
        eff = c.get_namespace_config(NS).effective
        assert {k.kind: k.max_items for k in eff.kind_capacities} == {"observation": 1000, "reflection": 100}
        c.create_batch(
            [{"namespace": NS, "content": f"observed {i}", "kind": "observation"} for i in range(1000)]
        )
        c.create(NS, "observed once more", kind="observation")
        c.create_batch(
            [{"namespace": NS, "content": f"insight {i}", "kind": "reflection"} for i in range(101)]
        )
        report = c.consolidate(NS)
        assert report.deleted == 2
        kinds = [m.kind for m in c.list_memories(NS, page_size=1000)]
        assert (kinds.count("observation"), kinds.count("reflection")) == (1000, 100)
        # A namespace's own kind caps replace the preset's list as a whole.
        own = configure(c, NS, kind_capacities={"reflection": 2}).effective
        assert {k.kind: k.max_items for k in own.kind_capacities} == {"reflection": 2}
        c.consolidate(NS)
        kinds = [m.kind for m in c.list_memories(NS, page_size=1000)]
        assert (kinds.count("observation"), kinds.count("reflection")) == (1000, 2)


def test_presets_fill_the_policy_and_own_overrides_apply_over_them(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        resp = configure(c, NS, preset="tiered_consolidation", importance_floor=0.05)
        assert resp.config.policy.preset == "tiered_consolidation"
        eff = resp.effective
        assert eff.preset == "tiered_consolidation"
        assert eff.importance_floor == pytest.approx(0.05)  # the namespace's own, over the preset's 0
        assert eff.promote_through_tiers and not eff.decay_grace and eff.summarize_evictions
        assert eff.delete_from_glacial
        assert {t.tier: t.max_items for t in eff.tiers} == {FAST: 1000, MEDIUM: 500, SLOW: 200, GLACIAL: 100}
        hybrid = configure(c, "hybrid", preset="hybrid_retrieval").effective
        assert hybrid.retention == pb.RETENTION_POLICY_LRU
        assert hybrid.importance_heuristic == pb.IMPORTANCE_HEURISTIC_PHRASES
        assert configure(c, "pyramid", preset="pyramid").effective.summary_token_threshold == 8000
        # A protected namespace's preset is a policy change: it needs confirm.
        c.update_namespace_config("guarded", protected=True)
        with pytest.raises(FailedPreconditionError):
            configure(c, "guarded", preset="task_project_global")
        assert configure(c, "guarded", preset="task_project_global", confirm=True).effective.max_items == 1000


def test_a_create_never_evicts_what_it_stores(server_factory: Callable[..., RunningServer]) -> None:
    with _client(server_factory()) as c:
        configure(c, "small", preset="task_project_global", max_items=10)
        c.create_batch([{"namespace": "small", "content": f"kept {i}", "importance": 0.9} for i in range(10)])
        made = c.create("small", "the least important yet", importance=0.1, request_id="req-1")
        # The create's own memory is the one the cap would delete first: it stays (acknowledged), and
        # one of the others makes room.
        assert c.get("small", made.id).content == "the least important yet"
        assert c.stats("small").memory_count == 10
        again = c.create("small", "the least important yet", importance=0.1, request_id="req-1")
        assert again.id == made.id  # a retry of the acknowledged create returns it
        assert c.consolidate("small").deleted == 0  # within its cap: nothing left for the pass
        assert c.stats("small").memory_count == 10


def test_an_eviction_summary_of_overlong_sentences_is_cut_not_dropped(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        configure(c, "long", summarize_evictions=True, tiers={FAST: {"max_items": 3}})
        for i, imp in enumerate((0.9, 0.95, 0.85, 0.99)):
            words = " ".join(f"word{i}x{j}" for j in range(400))  # one sentence of ~3,000 characters
            c.create("long", words + ".", id=f"m{i}", tier="fast", importance=imp)
        report = c.consolidate("long")
        assert report.evicted == 2
        [summary] = c.list_memories("long", kinds=["eviction_summary"])
        assert summary.content.startswith("word0x0 word0x1")  # the most important evicted, cut to fit
        assert counts(c, "long")[FAST] == 3
