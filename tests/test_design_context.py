"""Context assembly as the memory designs spell it out, with their numbers, through the gRPC API on a
real server: the 40/40/20 budget split filled across task, project and global scopes, the most
important memories chosen within a scope's share, the build going on when the graph part fails, and
what does not fit summarized in the tokens left."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import FakeClock

from tiermem.client import MemoryClient
from tiermem.server.agent.graph import GraphMemory
from tiermem.server.transport.app import RunningServer

T0 = 1_700_000_000.0
TASK, PROJECT, USER = "user:ana/project:x/task:7", "user:ana/project:x", "user:ana"
SCOPES = (TASK, PROJECT, USER)


@pytest.fixture
def mem(server_factory: Callable[..., RunningServer]) -> Iterator[tuple[MemoryClient, FakeClock]]:
    clock = FakeClock(T0)
    running = server_factory(clock=clock)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        yield c, clock


def _fill(
    c: MemoryClient, clock: FakeClock, ns: str, importances: list[float], tokens: int = 50
) -> list[str]:
    """One memory per importance, a minute apart (oldest first); their ids."""
    ids = []
    for i, imp in enumerate(importances):
        text = f"{ns} billing deploy note {i}: the job ran step {i} of the rollout."
        ids.append(
            c.create(ns, text, id=f"{ns.rsplit(':', 1)[-1]}-{i}", importance=imp, token_cost=tokens).id
        )
        clock.advance(60)
    return ids


def _tokens_by_scope(ctx: Any) -> dict[str, int]:
    out = dict.fromkeys(SCOPES, 0)
    for s in ctx.sections:
        out[s.namespace] += s.tokens
    return out


def _ids(ctx: Any, ns: str, kind: str) -> list[str]:
    return [x.memory_id for s in ctx.sections if (s.namespace, s.kind) == (ns, kind) for x in s.items]


def _best(ids: list[str], importances: list[float], n: int) -> list[str]:
    """The ``n`` most important, then most recent (later in the list), in that order."""
    order = sorted(range(len(ids)), key=lambda i: (-importances[i], -i))
    return [ids[i] for i in order[:n]]


# -- 1. the designed split fills every scope's share -------------------------------------------------
@pytest.mark.parametrize("query", ["", "billing deploy rollout"])
def test_the_40_40_20_split_fills_task_project_and_global_shares(
    mem: tuple[MemoryClient, FakeClock], query: str
) -> None:
    c, clock = mem
    for ns in SCOPES:
        _fill(c, clock, ns, [0.5] * 12)
    ctx = c.build_context(list(SCOPES), token_budget=1000, query=query, read_only=True)
    # 12 x 50 tokens per scope: 400, 400 and 200 of a 1,000-token budget (before: {400, 0, 0}
    # without a query, {400, 150, 100} with one).
    assert _tokens_by_scope(ctx) == {TASK: 400, PROJECT: 400, USER: 200}
    assert ctx.tokens_used == 1000
    if query:  # the semantic hits (3 and 2 by default) come first, then the rest of the share
        assert len(_ids(ctx, PROJECT, "semantic")) == 3 and len(_ids(ctx, USER, "semantic")) == 2
        assert len(_ids(ctx, PROJECT, "important")) == 5 and len(_ids(ctx, USER, "important")) == 2


def test_within_a_share_the_most_important_then_the_most_recent_are_chosen(
    mem: tuple[MemoryClient, FakeClock],
) -> None:
    c, clock = mem
    # Task: its two newest memories are its least important.
    task_imp = [0.9, 0.8, 0.6, 0.7, 0.9, 0.5, 0.6, 0.8, 0.7, 0.6, 0.1, 0.2]
    other_imp = [0.9, 0.2, 0.9, 0.5, 0.2, 0.7, 0.5, 0.2, 0.9, 0.5, 0.2, 0.7]
    task = _fill(c, clock, TASK, task_imp)
    project = _fill(c, clock, PROJECT, other_imp)
    user = _fill(c, clock, USER, other_imp)
    ctx = c.build_context(list(SCOPES), token_budget=1000, read_only=True)
    # The task's recent window (its 10 newest) does not fit its 400 tokens: its 8 most important
    # are kept, not the 8 newest, still shown newest first.
    window = task[2:]
    kept = set(_best(window, task_imp[2:], 8))
    assert _ids(ctx, TASK, "recent") == [i for i in reversed(window) if i in kept]
    assert task[-1] not in kept and task[-2] not in kept
    # Project and global have no recent window by default: their shares take their 8 and 4 most
    # important memories, equal importance going to the most recent.
    assert _ids(ctx, PROJECT, "important") == _best(project, other_imp, 8)
    assert _ids(ctx, USER, "important") == _best(user, other_imp, 4)
    assert _ids(ctx, USER, "important") == [user[i] for i in (8, 2, 0, 11)]


def test_an_explicit_recent_window_stays_the_newest_by_creation_time(
    mem: tuple[MemoryClient, FakeClock],
) -> None:
    c, _ = mem
    for minute in (2, 0, 3, 1):  # arrival order is not time order
        c.create(
            TASK, f"event at minute {minute}", id=f"e{minute}", create_time=T0 + 60 * minute, token_cost=10
        )
    ctx = c.build_context([{"namespace": TASK, "recent_window": 3}], token_budget=1000, read_only=True)
    assert _ids(ctx, TASK, "recent") == ["e3", "e2", "e1"]
    assert _ids(ctx, TASK, "important") == ["e0"]  # the rest of the share


# -- 2. the graph part fails: the rest is built ------------------------------------------------------
def test_a_failing_graph_part_leaves_the_rest_of_the_context_built(
    mem: tuple[MemoryClient, FakeClock], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    c, clock = mem
    ids = _fill(c, clock, TASK, [0.5] * 4, tokens=10)
    c.upsert_node(TASK, "billing", memory_ids=ids)
    c.upsert_node(TASK, "ana")
    c.add_edge(TASK, "ana", "owns", "billing")
    c.summarize(TASK, "The billing rollout is half done.", source_memory_ids=ids)
    healthy = c.build_context([TASK, PROJECT], token_budget=1000, read_only=True)
    assert [x.text for s in healthy.sections if s.kind == "graph" for x in s.items] == ["ana owns billing"]

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise OSError("graph store unreadable")

    monkeypatch.setattr(GraphMemory, "edges_of_memories", broken)
    with caplog.at_level(logging.WARNING, logger="tiermem.server.agent.context"):
        ctx = c.build_context([TASK, PROJECT], token_budget=1000, read_only=True)
    # Everything but the facts: the summary, the recent window, the same tokens less the fact's.
    assert [x.memory_id for s in ctx.sections if s.kind != "graph" for x in s.items] == [
        x.memory_id for s in healthy.sections if s.kind != "graph" for x in s.items
    ]
    assert not [x for s in ctx.sections if s.kind == "graph" for x in s.items]
    assert ctx.tokens_used == healthy.tokens_used - math.ceil(len("ana owns billing") / 4)
    assert any(TASK in r.getMessage() and "graph facts" in r.getMessage() for r in caplog.records)
    # ... and the response says so: one warning naming the scope and the failure
    assert list(healthy.warnings) == []
    [warning] = ctx.warnings
    assert warning.startswith(f"graph facts of {TASK!r} unavailable") and "graph store unreadable" in warning


# -- 3. what does not fit is summarized --------------------------------------------------------------
def test_what_does_not_fit_the_budget_is_summarized_in_the_tokens_left(
    mem: tuple[MemoryClient, FakeClock],
) -> None:
    c, clock = mem
    texts = [
        f"Deploy {i} failed on staging. The log shows a long trace of retries and timeouts." for i in range(5)
    ]
    importances = [0.3, 0.9, 0.5, 0.8, 0.4]
    for i, text in enumerate(texts):
        c.create(PROJECT, text, id=f"d{i}", importance=importances[i], token_cost=30)
        clock.advance(60)
    scope = {"namespace": PROJECT, "share": 1.0, "recent_window": 0}
    ctx = c.build_context([scope], token_budget=100, read_only=True)
    # 3 of the 5 memories fit (90 tokens, the most important: d1, d3, d2); the 10 tokens left hold
    # the first sentences of the two left out, most important first while they fit, in time order.
    assert _ids(ctx, PROJECT, "important") == ["d1", "d3", "d2"]
    [overflow] = [x for s in ctx.sections if s.kind == "overflow" for x in s.items]
    assert overflow.text == "Deploy 4 failed on staging."  # both would take 14 tokens
    assert overflow.tokens == math.ceil(len(overflow.text) / 4) == 7
    assert overflow.memory_id == ""
    assert ctx.tokens_used == 97 <= 100
    # A larger remainder takes both sentences (put back in time order); with room for everything
    # nothing is left out and there is no overflow summary.
    ctx = c.build_context([scope], token_budget=104, read_only=True)
    [overflow] = [x for s in ctx.sections if s.kind == "overflow" for x in s.items]
    assert overflow.text == "Deploy 0 failed on staging. Deploy 4 failed on staging."
    assert overflow.tokens == 14 and ctx.tokens_used == 104
    ctx = c.build_context([scope], token_budget=150, read_only=True)
    assert not [s for s in ctx.sections if s.kind == "overflow"]
    assert ctx.tokens_used == 150


# -- 4. each part of a share can be turned off ---------------------------------------------------------
def test_turning_off_fill_or_the_overflow_summary_removes_its_section(
    mem: tuple[MemoryClient, FakeClock],
) -> None:
    c, clock = mem
    for i in range(5):
        text = f"Deploy {i} failed on staging. The log shows a long trace of retries and timeouts."
        c.create(PROJECT, text, id=f"d{i}", importance=[0.3, 0.9, 0.5, 0.8, 0.4][i], token_cost=30)
        clock.advance(60)
    _fill(c, clock, USER, [0.5] * 3, tokens=40)
    scope = {"namespace": PROJECT, "share": 1.0, "recent_window": 1}

    def kinds(ctx: Any) -> list[str]:
        return [s.kind for s in ctx.sections]

    both = c.build_context([scope], token_budget=100, read_only=True)
    assert kinds(both) == ["summary", "recent", "semantic", "graph", "important", "overflow"]
    assert _ids(both, PROJECT, "recent") == ["d4"] and _ids(both, PROJECT, "important") == ["d1", "d3"]
    # no overflow summary: the tokens it took stay unused
    plain = c.build_context([scope], token_budget=100, read_only=True, summarize_overflow=False)
    assert kinds(plain) == ["summary", "recent", "semantic", "graph", "important"]
    assert plain.tokens_used == 90 < both.tokens_used
    # no fill: the window alone (it left nothing out, so there is no overflow either)
    unfilled = c.build_context([{**scope, "fill": False}], token_budget=100, read_only=True)
    assert kinds(unfilled) == ["summary", "recent", "semantic", "graph"]
    assert unfilled.tokens_used == 30
    # the share a scope does not fill carries to the next: the user scope's 0.4 of 200 (two of its
    # three 40-token memories) plus the project's unused 70 take all three
    split = [{"namespace": PROJECT, "share": 0.5, "recent_window": 1, "fill": False}, {"namespace": USER}]
    ctx = c.build_context(split, token_budget=200, read_only=True)
    assert not _ids(ctx, PROJECT, "important")
    by_scope = {ns: sum(s.tokens for s in ctx.sections if s.namespace == ns) for ns in (PROJECT, USER)}
    assert by_scope == {PROJECT: 30, USER: 120}
    filled = c.build_context([{**split[0], "fill": True}, split[1]], token_budget=200, read_only=True)
    assert _ids(filled, PROJECT, "important") == ["d1", "d3"]
    none = c.build_context([scope], token_budget=100, read_only=True, summarize_overflow=False)
    assert not [s for s in none.sections if s.kind == "overflow"]


def test_only_the_recent_and_semantic_memories_count_as_accessed(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock(T0)
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0.1)
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    _fill(c, clock, TASK, [0.5] * 12)
    _fill(c, clock, PROJECT, [0.9, 0.2, 0.9, 0.5, 0.2, 0.7, 0.5, 0.2, 0.9, 0.5, 0.2, 0.7])
    ctx = c.build_context([TASK, PROJECT], token_budget=1000)  # not read-only
    recent, important = _ids(ctx, TASK, "recent"), _ids(ctx, PROJECT, "important")
    assert recent and important
    end = time.monotonic() + 10  # accesses are committed within about a second
    while time.monotonic() < end and c.get(TASK, recent[0]).access_count == 0:
        time.sleep(0.1)
    assert all(c.get(TASK, i).access_count == 1 for i in recent)
    assert all(c.get(PROJECT, i).access_count == 0 for i in important)  # the fill by importance
    c.close()


def test_a_bad_query_text_is_refused_whether_or_not_a_scope_searches(
    mem: tuple[MemoryClient, FakeClock],
) -> None:
    """The query text is checked as a search's always: a scope with ``semantic_k`` 0 does not let a
    text a search would refuse through (the same request failed only when a scope searched)."""
    from tiermem.client import InvalidArgumentError

    c, _ = mem
    c.create(TASK, "a memory of the task")
    for scopes in ([{"namespace": TASK, "semantic_k": 0}], [{"namespace": TASK}]):
        with pytest.raises(InvalidArgumentError) as e:
            c.build_context(scopes, token_budget=100, query="bad\x00text", read_only=True)
        assert e.value.fields == ["query_text"]
    assert c.build_context([{"namespace": TASK, "semantic_k": 0}], token_budget=100, query="fine").sections
