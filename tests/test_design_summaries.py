"""Summaries the server keeps itself and the working memory's flush, as the designs tiermem serves
spell them out (a rolling summary past 8,000 new tokens; working memory flushed to episodic past
32,000 tokens; a hierarchical summary past 50,000), with their figures in the stats: through the
gRPC API on a real server."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tiermem.client import InvalidArgumentError, MemoryClient
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

FAST, MEDIUM = pb.TIER_FAST, pb.TIER_MEDIUM


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=60)
    c.wait_ready()
    return c


def summaries(c: MemoryClient, namespace: str) -> list[pb.Memory]:
    return list(c.list_memories(namespace, kinds=["summary"]))


def wait_for_summary(c: MemoryClient, namespace: str, not_id: str = "", timeout: float = 30.0) -> pb.Memory:
    """The namespace's summary once the server stored one (other than ``not_id``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [m for m in summaries(c, namespace) if m.id != not_id]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no summary of {namespace} within {timeout} s")


def event(i: int) -> str:
    return f"Event {i:03d} happened at the harbour. It had details nobody needs later."


def first(i: int) -> str:
    return f"Event {i:03d} happened at the harbour."


def test_a_pyramid_namespace_keeps_a_rolling_summary_once_past_8000_tokens(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    data = tmp_path / "pyramid"
    ns = "pyramid:session"
    running = server_factory(data_dir=data)
    with _client(running) as c:
        c.update_namespace_config(ns, preset="pyramid")
        eff = c.get_namespace_config(ns).effective
        assert eff.auto_summarize and eff.summary_token_threshold == 8000
        assert eff.summary_strategy == pb.SUMMARY_STRATEGY_ROLLING and eff.summary_max_tokens == 2000
        ids = [c.create(ns, event(i), token_cost=400, importance=0.5).id for i in range(20)]
        # 8,000 tokens: not past the threshold ("exceeds"), so no summary is due or kept.
        stats = c.stats(ns)
        assert stats.summary_tokens == 8000 and not stats.summary_due
        assert summaries(c, ns) == [] and stats.summaries_stored == 0
        ids.append(c.create(ns, event(20), token_cost=400, importance=0.5).id)
        s1 = wait_for_summary(c, ns)
        # Every event's first sentence fits 2,000 tokens: all of them, in time order.
        assert s1.content == " ".join(first(i) for i in range(21))
        assert list(s1.source_memory_ids) == ids
        assert s1.source == "tiermem:summarizer" and s1.token_cost <= 2000
        stats = c.stats(ns)
        assert stats.summary_tokens == 0 and not stats.summary_due
        assert stats.summaries_stored == 1
        assert stats.summary_tokens_saved == 21 * 400 - s1.token_cost
        assert c.stats().summaries_stored == 1  # server-wide too
        # The raw events all stay.
        assert len([m for m in c.list_memories(ns) if m.kind != "summary"]) == 21
    running.stop(0)

    # After a restart the next summary rolls the previous one forward over what followed only.
    with _client(server_factory(data_dir=data)) as c:
        later = [c.create(ns, event(i), token_cost=400, importance=0.5).id for i in range(21, 42)]
        s2 = wait_for_summary(c, ns, not_id=s1.id)
        assert [m.id for m in summaries(c, ns)] == [s2.id]  # it replaced the first
        assert s2.content == " ".join(first(i) for i in range(42))
        assert list(s2.source_memory_ids) == later
        assert c.stats(ns).summaries_stored == 1  # (counted since this start)


def test_a_rolling_summary_keeps_the_most_important_within_its_budget(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns = "rolling:budget"
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, auto_summarize=True, summary_token_threshold=150, summary_max_tokens=30)
        # Due at the eighth (160 > 150 tokens). Ten tokens per sentence and its space: three fit.
        # The important old one and the important new one, then the newest of the rest.
        importances = [0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.8]
        for i, imp in enumerate(importances):
            c.create(ns, event(i), token_cost=20, importance=imp)
        s = wait_for_summary(c, ns)
        assert s.content == " ".join(first(i) for i in (0, 6, 7))
        assert s.token_cost <= 30
        assert s.importance == pytest.approx(0.9)


def test_a_hybrid_retrieval_namespace_keeps_a_hierarchical_summary_past_50000_tokens(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns = "hybrid:agent"

    def text(i: int) -> str:
        return f"Memory {i:03d} records that the deployment of service {i:03d} finished without errors today."

    with _client(server_factory()) as c:
        c.update_namespace_config(ns, preset="hybrid_retrieval")
        eff = c.get_namespace_config(ns).effective
        assert eff.summary_strategy == pb.SUMMARY_STRATEGY_HIERARCHICAL
        assert eff.summary_token_threshold == 50000 and eff.summary_max_tokens == 2000
        # Within each run of ten, one memory is the most important ((7 i) mod 10 is a permutation).
        importance = [0.05 + ((7 * i) % 10) / 10 for i in range(126)]
        c.create_batch(
            [
                {"namespace": ns, "content": text(i), "token_cost": 400, "importance": importance[i]}
                for i in range(125)
            ]
        )
        assert not c.stats(ns).summary_due  # 50,000 tokens: not past it
        c.create(ns, text(125), token_cost=400, importance=importance[125])
        s = wait_for_summary(c, ns)
        # 126 sentences of ~24 tokens do not fit 2,000: each run of ten gives its most important one.
        best = [max(range(lo, min(lo + 10, 126)), key=lambda i: importance[i]) for lo in range(0, 126, 10)]
        assert s.content == " ".join(text(i) for i in best)
        assert len(s.source_memory_ids) == 126
        stats = c.stats(ns)
        assert stats.summaries_stored == 1 and stats.summary_tokens_saved == 126 * 400 - s.token_cost


def test_a_hierarchical_summary_condenses_level_by_level_until_it_fits(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns = "hierarchy:levels"
    with _client(server_factory()) as c:
        c.update_namespace_config(
            ns,
            auto_summarize=True,
            summary_strategy="hierarchical",
            summary_token_threshold=1000,
            summary_max_tokens=30,
        )
        importance = [0.5] * 130
        importance[37], importance[120] = 0.9, 0.8
        c.create_batch(
            [
                {"namespace": ns, "content": event(i), "token_cost": 8, "importance": importance[i]}
                for i in range(130)
            ]
        )
        s = wait_for_summary(c, ns)
        # 130 -> 13 sentences (still over 30 tokens) -> 2: the most important of each hundred.
        assert s.content == f"{first(37)} {first(120)}"
        assert s.importance == pytest.approx(0.9)


@pytest.mark.parametrize("strategy", ["rolling", "hierarchical"])
def test_a_kept_summary_of_over_1000_memories_names_every_one_it_quotes(
    server_factory: Callable[..., RunningServer], strategy: str
) -> None:
    """Past 1,000 memories the summary names every one it quotes (an old, important one here), then
    the newest of the others, 1,000 in all."""
    ns = f"sources:{strategy}"
    with _client(server_factory()) as c:
        c.update_namespace_config(
            ns,
            auto_summarize=True,
            summary_strategy=strategy,
            summary_token_threshold=9500,  # due only with the second batch: one summary of all 1,200
            summary_max_tokens=30,
        )
        ids: list[str] = []
        for lo, hi in ((0, 1000), (1000, 1200)):
            batch = [
                {"namespace": ns, "content": event(i), "token_cost": 8, "importance": 1.0 if i == 5 else 0.1}
                for i in range(lo, hi)
            ]
            ids += [m.id for m in c.create_batch(batch)]
        s = wait_for_summary(c, ns)
        assert first(5) in s.content
        assert len(s.source_memory_ids) == 1000
        assert set(s.source_memory_ids) == {ids[5], *ids[201:]}
        assert list(s.source_memory_ids) == [ids[5], *ids[201:]]  # in time order


def test_working_memory_is_flushed_to_episodic_past_32000_tokens(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns, other = "hybrid:working", "plain:working"
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, preset="hybrid_retrieval")
        assert c.get_namespace_config(ns).effective.working_token_limit == 32000
        for i in range(4):
            c.create(ns, f"turn {i} of the conversation", tier="fast", token_cost=8000)
            c.create(other, f"turn {i} of the conversation", tier="fast", token_cost=8000)
        tiers = {t.tier: t for t in c.stats(ns).tiers}
        assert tiers[FAST].memory_count == 4  # 32,000 tokens: not past the limit
        # The create that passes it moves the whole working memory, itself included, before it
        # returns, and answers it as stored: in MEDIUM.
        made = c.create(ns, "turn 4 of the conversation", tier="fast", token_cost=8000)
        assert made.tier == MEDIUM
        [stored] = [m for m in c.list_memories(ns) if m.id == made.id]
        assert stored.tier_time == made.tier_time
        tiers = {t.tier: t for t in c.stats(ns).tiers}
        assert tiers[FAST].memory_count == 0 and tiers[MEDIUM].memory_count == 5
        assert tiers[FAST].demotions_total == 5
        assert {m.tier for m in c.list_memories(ns)} == {MEDIUM}
        # A namespace without the limit keeps its working memory.
        c.create(other, "turn 4 of the conversation", tier="fast", token_cost=8000)
        assert {t.tier: t.memory_count for t in c.stats(other).tiers}[FAST] == 5
        # The limit is the namespace's own: off (0) again, nothing moves.
        c.update_namespace_config(ns, working_token_limit=0)
        for i in range(5):
            c.create(ns, f"later turn {i}", tier="fast", token_cost=8000)
        assert {t.tier: t.memory_count for t in c.stats(ns).tiers}[FAST] == 5


def test_eviction_summaries_count_in_the_summary_stats(server_factory: Callable[..., RunningServer]) -> None:
    ns = "evict:stats"
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, summarize_evictions=True, tiers={"fast": {"max_items": 3}})
        for i in range(5):
            c.create(ns, event(i), tier="fast", token_cost=50, importance=0.1 * (i + 1))
        c.consolidate(ns)
        evicted = [m for m in c.list_memories(ns) if m.kind == "eviction_summary"]
        assert len(evicted) == 1
        stats = c.stats(ns)
        covered = 50 * len(evicted[0].source_memory_ids)
        assert stats.summaries_stored == 1 and stats.summary_tokens_saved == covered - evicted[0].token_cost
        assert stats.summary_failures == 0


def test_summary_and_working_memory_settings_are_checked(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns = "settings:checked"
    with _client(server_factory()) as c:
        for fields, name in (
            ({"summary_max_tokens": 0}, "config.policy.summary_max_tokens"),
            ({"working_token_limit": -1}, "config.policy.working_token_limit"),
            ({"summary_strategy": 7}, "config.policy.summary_strategy"),
            ({"kind_capacities": {f"k{i}": 1 for i in range(65)}}, "config.policy.kind_capacities"),
        ):
            with pytest.raises(InvalidArgumentError) as err:
                c.update_namespace_config(ns, **fields)  # type: ignore[arg-type]
            assert name in str(err.value)
        assert not c.get_namespace_config(ns).config.policy.HasField("summary_max_tokens")
        with pytest.raises(ValueError, match="summary_strategy"):
            c.update_namespace_config(ns, summary_strategy="map_reduce")
        # Turned on, then off: a due summary is then only reported.
        c.update_namespace_config(ns, auto_summarize=False, summary_token_threshold=10)
        for i in range(3):
            c.create(ns, event(i), token_cost=10)
        assert c.stats(ns).summary_due
        time.sleep(0.5)
        assert summaries(c, ns) == []


def test_a_generative_agents_namespace_keeps_importance_over_recency(
    server_factory: Callable[..., RunningServer],
) -> None:
    """0.7 x importance on its 1-10 scale + 0.3 x recency: a 5 from a month ago stays over a fresh 3."""
    ns = "ga:retention"
    day = 86400.0
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, preset="generative_agents", kind_capacities={"observation": 2})
        assert c.get_namespace_config(ns).effective.retention == pb.RETENTION_POLICY_TEN_POINT_WEIGHTED
        now = time.time()
        old = c.create(ns, "an old but notable talk with Klaus", importance=0.5, create_time=now - 30 * day)
        keep = c.create(ns, "the most important plan of all", importance=0.9)
        c.create(ns, "a fresh mundane moment", importance=0.3)
        c.consolidate(ns)
        assert {m.id for m in c.list_memories(ns)} == {old.id, keep.id}
        # A kind cap of 0 is no cap, like max_items 0: the namespace lifts the preset's.
        c.update_namespace_config(ns, kind_capacities={"observation": 0})
        for i in range(3):
            c.create(ns, f"another moment {i}", importance=0.3)
        c.consolidate(ns)
        assert len(list(c.list_memories(ns))) == 5


def test_creates_leave_a_kept_summary_to_the_server(server_factory: Callable[..., RunningServer]) -> None:
    """With auto_summarize, creates do not answer summary_due (no agent should race the server);
    stats still say one is due until it is stored."""
    ns = "kept:no-race"
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, auto_summarize=True, summary_token_threshold=100)
        for i in range(3):
            resp = c.stub.CreateMemory(
                pb.CreateMemoryRequest(memory=pb.Memory(namespace=ns, content=event(i), token_cost=40)),
                timeout=10,
            )
            assert not resp.summary_due
        wait_for_summary(c, ns)
        plain = "plain:due"
        c.update_namespace_config(plain, summary_token_threshold=100)
        for i in range(3):
            resp = c.stub.CreateMemory(
                pb.CreateMemoryRequest(memory=pb.Memory(namespace=plain, content=event(i), token_cost=40)),
                timeout=10,
            )
        assert resp.summary_due and summaries(c, plain) == []


def test_a_rolling_summary_lets_new_memories_in_after_an_important_one(
    server_factory: Callable[..., RunningServer],
) -> None:
    ns = "rolling:moves-on"
    with _client(server_factory()) as c:
        c.update_namespace_config(ns, auto_summarize=True, summary_token_threshold=50, summary_max_tokens=40)
        c.create(ns, event(0), token_cost=30, importance=1.0)
        c.create(ns, event(1), token_cost=30, importance=0.6)
        s = wait_for_summary(c, ns)
        for round_ in range(1, 4):
            first_new = 2 * round_
            c.create(ns, event(first_new), token_cost=30, importance=0.6)
            c.create(ns, event(first_new + 1), token_cost=30, importance=0.6)
            s = wait_for_summary(c, ns, not_id=s.id)
            # The latest memories make it in; the summary does not freeze on the first one.
            assert first(first_new + 1) in s.content, (round_, s.content)


def test_a_protected_namespace_keeps_its_summary_unless_it_asked_for_kept_ones(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        by_preset, own = "protected:preset", "protected:own"
        c.update_namespace_config(by_preset, preset="pyramid", summary_token_threshold=100)
        c.update_namespace_config(own, auto_summarize=True, summary_token_threshold=100)
        curated_ids = {}
        for ns in (by_preset, own):
            curated_ids[ns] = c.summarize(ns, "The curated summary.", source_memory_ids=[]).id
            c.update_namespace_config(ns, protected=True)
            for i in range(3):
                c.create(ns, event(i), token_cost=40)
        kept = wait_for_summary(c, own, not_id=curated_ids[own])
        assert kept.source == "tiermem:summarizer"
        time.sleep(0.5)
        [curated] = summaries(c, by_preset)
        assert curated.content == "The curated summary."


def test_a_summary_built_before_a_deletion_is_not_stored(
    server_factory: Callable[..., RunningServer],
) -> None:
    """The write re-checks what the summary was built from: a namespace cleared meanwhile stays cleared."""
    from tiermem.server.core.create import SummaryCovers, create_detailed
    from tiermem.server.model.errors import FailedPrecondition
    from tiermem.server.model.records import NewMemory

    running = server_factory()
    ns = "stale:deleted"
    with _client(running) as c:
        ids = [c.create(ns, event(i), token_cost=10).id for i in range(3)]
        st = running.engine.state
        progress = running.engine.scope(ns)
        view = st.columns.view()
        rids = [int(r) for r in view.rid[: view.n]]
        covers = SummaryCovers(max(rids), 30, progress.summary_rid, progress.covered_rid)
        assert c.delete_namespace(ns) == 3
        with pytest.raises(FailedPrecondition) as e:
            create_detailed(
                st,
                [NewMemory(namespace=ns, content="Secret.", kind="summary")],
                confirm=True,
                summary_covers=covers,
            )
        assert e.value.reason == "SUMMARY_STALE"
        assert list(c.list_memories(ns)) == [] and len(ids) == 3


def test_a_summary_due_before_a_restart_or_a_policy_change_is_kept_without_another_create(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """A create requests its namespace's summary in memory only: after a restart, or a policy that
    turns auto_summarize on over tokens already counted, no create may come (an agent whose session
    ended), and the namespace stayed due with no summary."""
    data = tmp_path / "data"
    running = server_factory(data_dir=data, summary_token_threshold=50)
    with _client(running) as c:
        for i in range(12):
            c.create("due:later", event(i))
            c.create("due:now", event(i))
        assert c.stats("due:now").summary_due and summaries(c, "due:now") == []
        c.update_namespace_config("due:now", auto_summarize=True)  # (over the tokens counted)
        assert wait_for_summary(c, "due:now").source == "tiermem:summarizer"
    running.stop(5)
    # Started again with the server keeping every summary: the one due is kept at the start.
    running = server_factory(data_dir=data, summary_token_threshold=50, auto_summarize=True)
    with _client(running) as c:
        assert wait_for_summary(c, "due:later").source == "tiermem:summarizer"
        assert not c.stats("due:later").summary_due


def test_a_summary_level_that_fits_its_budget_is_kept_and_sentences_do_not_run_together() -> None:
    """The fit is the joined text's (each sentence was counted a token more, so 13 sentences of 88
    tokens did not fit 100 and were condensed again to 2); pieces without an end mark get one, so
    a summary does not read as one run-on sentence (nor does the next summary, which splits it)."""
    from tiermem.server.model.condense import Piece, hierarchical, rolling
    from tiermem.server.model.text import estimate_tokens, sentences

    pieces = [Piece(f"Note {i:03d} was filed.", 0.5) for i in range(126)]  # 24 bytes: 6 tokens
    text, depth, quoted = hierarchical(pieces, 100)
    assert (depth, len(quoted)) == (1, 13) and estimate_tokens(text) <= 100
    plain = [Piece("deploy failed on staging", 0.9), Piece("rollback done by ana", 0.5), Piece("Done!", 0.1)]
    for summary in (rolling(plain, 100)[0], hierarchical(plain, 100)[0]):
        assert summary == "deploy failed on staging. rollback done by ana. Done!"
        assert sentences(summary) == ["deploy failed on staging.", "rollback done by ana.", "Done!"]
