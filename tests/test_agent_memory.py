"""Agent memory on the store: importance heuristic, reflection due signals and candidates, rolling
summaries (due signal, replacement, built-in extractive summary)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from conftest import FakeClock

from tiermem.client import InvalidArgumentError, MemoryClient
from tiermem.server.model.importance import estimate
from tiermem.server.transport.app import RunningServer


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    return c


@pytest.mark.parametrize(
    "content,kind,expected",
    [
        ("ok", "observation", 0.3),
        ("x" * 201, "observation", 0.4),
        ("x" * 501, "observation", 0.5),
        ("We decided: the deploy must wait, it is critical", "observation", 0.6),  # 3 cues (cap 0.3)
        ("I prefer tea and always remember birthdays, never forget my name", "observation", 0.6),
        ("the user likes dark mode", "preference", 0.6),
        ("ran the linter", "tool_result", 0.4),
        ("an insight", "reflection", 0.8),
        ("a summary", "summary", 0.6),
    ],
)
def test_importance_heuristic(content: str, kind: str, expected: float) -> None:
    assert estimate(content, kind) == pytest.approx(expected)


def test_created_memories_without_importance_use_the_heuristic(client: MemoryClient) -> None:
    m = client.create("ns", "We decided to ship on Friday", kind="decision")
    assert m.importance == pytest.approx(0.6)  # 0.3 + cue "decided" + decision kind
    assert client.create("ns", "given", importance=0.05).importance == pytest.approx(0.05)
    with pytest.raises(InvalidArgumentError) as info:
        client.create("ns", "weak insight", kind="reflection", importance=0.5)
    assert info.value.fields == ["memory.importance"]


def test_reflection_is_due_past_the_threshold_and_reset_by_a_reflection(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory(reflection_threshold=2.0)) as c:
        dues, ids = [], []
        for i, imp in enumerate([0.5, 0.5, 0.5, 0.4, 0.3]):
            r = c.observe("agent:1", f"observation {i}", importance=imp)
            dues.append(r.reflection_due)
            ids.append(r.memory.id)
        assert dues == [False, False, False, False, True]  # 0.5+0.5+0.5+0.4 = 1.9 < 2.0, then 2.2
        c.create("agent:1", "a decision, not an observation", kind="decision", importance=1.0)
        assert c.stats("agent:1").reflection_importance == pytest.approx(2.2)
        c.observe("agent:2", "another agent", importance=1.0)
        cand = c.reflection_candidates("agent:1", limit=3)
        assert [m.id for m in cand.observations] == ids[::-1][:3]
        assert cand.reflection_due and cand.threshold == 2.0
        assert cand.accumulated_importance == pytest.approx(2.2)
        reflection = c.reflect(
            "agent:1",
            "The agent keeps observing things",
            source_memory_ids=ids,
            questions=["what does the agent do?"],
        )
        assert reflection.kind == "reflection" and list(reflection.questions) == ["what does the agent do?"]
        assert list(reflection.source_memory_ids) == ids
        st = c.stats("agent:1")
        assert (st.reflection_importance, st.reflection_due) == (0.0, False)
        assert c.stats("agent:2").reflection_importance == pytest.approx(1.0)
        # Reflections rank with observations in search.
        assert reflection.id in {r.memory.id for r in c.search("agent:1", "agent observing")}


def test_clearing_a_scope_with_its_children_clears_the_progress_of_children_left_empty(
    client: MemoryClient,
) -> None:
    """DeleteNamespace with include_children clears every child's progress toward a reflection and
    a summary, also a child whose memories had all gone before (deleted, or moved up to the
    parent): its next observation starts from zero."""
    c = client
    task = "u/proj/task"
    ids = [c.observe(task, f"task event {i}", importance=1.0).memory.id for i in range(4)]
    c.transfer(task, ids[0], mode="move", target_namespace="u/proj")
    for mid in ids[1:]:
        c.delete(task, mid)
    assert c.stats(task).reflection_importance == pytest.approx(4.0) and c.stats(task).summary_tokens > 0
    c.delete_namespace("u", include_children=True)
    st = c.stats(task)
    assert (st.reflection_importance, st.summary_tokens) == (0.0, 0)
    assert c.observe(task, "the first event of a new task", importance=1.0).memory.id
    assert c.stats(task).reflection_importance == pytest.approx(1.0)


def test_summary_due_replacement_and_extractive_summary(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    with _client(server_factory(summary_token_threshold=40, clock=clock)) as c:
        texts = [
            "The build broke on main. Someone pushed a bad config.",
            "We rolled back the config. Builds are green again.",
            "Lunch was pizza.",
            "Decided: config changes need review from now on. This is important.",
        ]
        due = []
        for t in texts:
            due.append(c.observe("task:1", t).summary_due)
            clock.advance(60)
        costs = [math.ceil(len(t.encode()) / 4) for t in texts]
        assert due == [sum(costs[: i + 1]) > 40 for i in range(len(texts))]
        built = c.build_summary("task:1", max_tokens=30)
        assert built.token_count <= 30 + 1 and built.text
        assert len(built.source_memory_ids) == 4
        # Scores 0.7*importance + 0.3*(position/4): the decision (0.5 importance) first, then newest
        # first; first sentences cost ceil(bytes/4)+1 tokens: 14 + 5 + 8 fit in 30, the oldest (7) not.
        assert (
            built.text
            == "We rolled back the config. Lunch was pizza. Decided: config changes need review from now on."
        )
        s1 = c.summarize("task:1", built.text, source_memory_ids=built.source_memory_ids)
        st = c.stats("task:1")
        assert (st.summary_tokens, st.summary_due) == (0, False)
        c.observe("task:1", "After the summary, a new event happened.")
        assert [m.id for m in c.list_memories("task:1", kinds=["summary"])] == [s1.id]
        assert c.build_summary("task:1").source_memory_ids[0] != s1.id  # covers only what came after
        s2 = c.summarize("task:1", "Second summary.", source_memory_ids=[])
        assert [m.id for m in c.list_memories("task:1", kinds=["summary"])] == [s2.id]  # s1 replaced


def test_two_summaries_in_one_batch_keep_only_the_last(client: MemoryClient) -> None:
    client.create_batch(
        [
            {"namespace": "task:2", "content": "first summary", "kind": "summary"},
            {"namespace": "task:2", "content": "second summary", "kind": "summary"},
        ]
    )
    assert [m.content for m in client.list_memories("task:2")] == ["second summary"]
    assert client.stats("task:2").memory_count == 1


def test_importances_that_add_up_to_the_threshold_make_a_reflection_due(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Importances are stored as float32 (0.7 is 0.69999999): two of them must still reach 1.4."""
    with _client(server_factory(reflection_threshold=1.4)) as c:
        assert not c.observe("agent:1", "first", importance=0.7).reflection_due
        assert c.observe("agent:1", "second", importance=0.7).reflection_due
        assert c.reflection_candidates("agent:1").reflection_due


def _facts(c: MemoryClient) -> list[str]:
    ctx = c.build_context(["user:ana"], query="who owns billing", token_budget=500)
    return [x.text for s in ctx.sections if s.kind == "graph" for x in s.items]


def test_invalidating_an_edge_again_never_brings_the_fact_back(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock()
    with _client(server_factory(clock=clock)) as c:
        m = c.create("user:ana", "ana works on billing")
        c.upsert_node("user:ana", "ana")
        c.upsert_node("user:ana", "billing", memory_ids=[m.id])  # (context shows its memories' facts)
        edge = c.add_edge("user:ana", "ana", "owns", "billing")
        assert _facts(c) == ["ana owns billing"]
        clock.advance(60)
        first = c.invalidate_edge("user:ana", edge.id).invalid_from.ToSeconds()
        clock.advance(60)
        assert c.invalidate_edge("user:ana", edge.id).invalid_from.ToSeconds() == first  # (now: later)
        later = c.invalidate_edge("user:ana", edge.id, at=clock.now + 3600)
        assert later.invalid_from.ToSeconds() == first
        assert list(c.neighbors("user:ana", "ana").edges) == []
        assert _facts(c) == []
        earlier = c.invalidate_edge("user:ana", edge.id, at=first - 30)  # an earlier end moves it back
        assert earlier.invalid_from.ToSeconds() == first - 30


def test_a_summary_of_more_than_a_thousand_memories_names_those_it_quotes(client: MemoryClient) -> None:
    memories = []
    for start in (0, 550):
        batch = [
            {
                "namespace": "task:1",
                "content": f"Item {i} happened. More detail.",
                "importance": 1.0 if i == 5 else 0.3,
            }
            for i in range(start, start + 550)
        ]
        memories += client.create_batch(batch)
    built = client.build_summary("task:1", max_tokens=60)
    quoted = [m.id for i, m in enumerate(memories) if f"Item {i} happened." in built.text]
    assert memories[5].id in quoted and memories[-1].id in quoted and len(built.source_memory_ids) == 1000
    assert set(quoted) <= set(built.source_memory_ids)  # the old important one too
    order = {m.id: i for i, m in enumerate(memories)}
    assert [order[i] for i in built.source_memory_ids] == sorted(order[i] for i in built.source_memory_ids)
    assert memories[6].id not in built.source_memory_ids  # past 1,000: the newest of the others
