"""Behaviours the memory designs tiermem unifies spell out with numbers, asserted through the gRPC API
on a real server."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tiermem.client import InvalidArgumentError, MemoryClient
from tiermem.server.transport.app import RunningServer

NS = "design:1"


def _client(running: RunningServer) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=30)
    c.wait_ready()
    return c


@pytest.mark.parametrize(
    "item,surprise",
    [
        ({"predicted_relevance": 0.1}, 0.3 * (0.5 - 0.1)),  # usefulness taken as 0.5: 0.12
        ({"predicted_relevance": 0.9}, 0.0),  # less useful than predicted: no surprise
        ({"actual_usefulness": 0.9}, 0.3 * (0.9 - 0.5)),  # prediction taken as 0.5
        ({"success": True}, 0.0),  # neither: an access, not a rating
    ],
)
def test_feedback_with_one_rating_takes_the_other_as_half(
    server_factory: Callable[..., RunningServer], item: dict[str, float], surprise: float
) -> None:
    with _client(server_factory()) as c:
        c.create(NS, "the deploy runbook", id="m")
        [m] = c.feedback(NS, [{"id": "m", **item}])
        assert m.surprise_score == pytest.approx(surprise, abs=1e-6)
        assert m.access_count == 1


def test_a_summary_is_due_once_the_tokens_exceed_the_threshold(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory(summary_token_threshold=8000)) as c:
        due = [c.observe(NS, f"event {i}", token_cost=4000).summary_due for i in range(2)]
        assert due == [False, False]  # exactly 8,000: not beyond it
        assert c.stats(NS).summary_due is False
        assert c.observe(NS, "one more", token_cost=1).summary_due is True
        assert c.stats(NS).summary_due is True


def test_a_list_of_tags_in_a_filter_means_has_these(server_factory: Callable[..., RunningServer]) -> None:
    with _client(server_factory()) as c:
        c.create(NS, "fixed the null check", id="a", kind="code", tags=["bug_fix", "python"])
        c.create(NS, "fixed the typo", id="b", kind="code", tags=["bug_fix"])
        c.create(NS, "wrote the parser", id="c", kind="code", tags=["feature"])
        c.create(NS, "fixed the deploy", id="d", kind="note", tags=["bug_fix"])

        def ids(where: dict[str, object]) -> list[str]:
            return sorted(m.id for m in c.list_memories(NS, where=where))

        assert ids({"kind": "code", "tags": ["bug_fix"]}) == ["a", "b"]  # the design's own filter
        assert ids({"tags": ["bug_fix", "python"]}) == ["a"]  # every one of them
        assert ids({"tags": "bug_fix"}) == ["a", "b", "d"]
        assert [r.memory.id for r in c.search(NS, "fixed", where={"tags": ["bug_fix", "python"]})] == ["a"]


def test_the_memory_stream_is_newest_first_by_creation_time(
    server_factory: Callable[..., RunningServer],
) -> None:
    t0 = 1_700_000_000.0
    with _client(server_factory()) as c:
        for minute in (2, 0, 3, 1):  # arrival order is not time order
            c.observe(NS, f"event at minute {minute}", id=f"e{minute}", create_time=t0 + 60 * minute)
        assert [m.id for m in c.timeline(NS)] == ["e3", "e2", "e1", "e0"]
        assert [m.id for m in c.timeline(NS, page_size=1)] == ["e3", "e2", "e1", "e0"]  # across pages
        assert [m.id for m in c.timeline(NS, since=t0 + 30, until=t0 + 150)] == ["e2", "e1"]
        recent = c.reflection_candidates(NS, limit=2)
        assert [m.id for m in recent.observations] == ["e3", "e2"]
        ctx = c.build_context([{"namespace": NS, "recent_window": 3}], token_budget=1000, read_only=True)
        window = [x.memory_id for sec in ctx.sections if sec.kind == "recent" for x in sec.items]
        assert window == ["e3", "e2", "e1"]


def test_a_timeline_page_token_is_checked(server_factory: Callable[..., RunningServer]) -> None:
    import grpc

    from tiermem.v1 import memory_pb2 as pb

    with _client(server_factory()) as c:
        for i in range(3):
            c.observe(NS, f"event {i}")
        first = c.stub.ListMemories(pb.ListMemoriesRequest(namespace=NS, page_size=1), timeout=30)
        assert first.next_page_token
        for token in (first.next_page_token, "bm90IGEgdG9rZW4="):  # a storage-order token; garbage
            with pytest.raises(grpc.RpcError) as e:
                c.stub.ListMemories(
                    pb.ListMemoriesRequest(namespace=NS, page_size=1, newest_first=True, page_token=token),
                    timeout=30,
                )
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "page_token" in (e.value.details() or "")


def test_a_protected_namespace_keeps_its_policy_without_confirm(
    server_factory: Callable[..., RunningServer],
) -> None:
    from tiermem.client import FailedPreconditionError

    with _client(server_factory()) as c:
        for i in range(3):
            c.create(NS, f"preference {i}", id=f"p{i}", tier="glacial")
        c.update_namespace_config(NS, protected=True)
        wipe = {"tiers": {t: {"max_items": 0} for t in ("fast", "medium", "slow", "glacial")}}
        with pytest.raises(FailedPreconditionError) as e:
            c.update_namespace_config(NS, delete_from_glacial=True, **wipe)
        assert e.value.reason == "NAMESPACE_PROTECTED"
        c.consolidate(NS)
        assert sorted(m.id for m in c.list_memories(NS)) == ["p0", "p1", "p2"]  # nothing changed
        assert not c.get_namespace_config(NS).config.policy.tiers
        c.update_namespace_config(NS, delete_from_glacial=True, confirm=True, **wipe)  # asked for: done
        assert c.get_namespace_config(NS).config.policy.delete_from_glacial


def test_an_event_log_keeps_every_event(server_factory: Callable[..., RunningServer]) -> None:
    with _client(server_factory()) as c:
        first = c.observe(NS, "Yes, go ahead.").memory
        second = c.observe(NS, "Yes, go ahead.").memory
        assert first.id != second.id
        assert [m.content for m in c.timeline(NS)] == ["Yes, go ahead."] * 2
        merged = c.observe(NS, "Yes, go ahead.", allow_duplicates=False).memory  # opt-in
        assert merged.id in (first.id, second.id)
        assert len(list(c.timeline(NS))) == 2


def test_build_summary_takes_a_time_range(server_factory: Callable[..., RunningServer]) -> None:
    t0 = 1_700_000_000.0
    with _client(server_factory()) as c:
        for minute in (3, 0, 2, 1):  # arrival order is not time order
            c.observe(
                NS, f"Event at minute {minute}. More detail.", id=f"e{minute}", create_time=t0 + 60 * minute
            )
        s = c.build_summary(NS, since=t0 + 30, until=t0 + 150)  # minutes 1 and 2
        assert sorted(s.source_memory_ids) == ["e1", "e2"]
        assert s.text == "Event at minute 1. Event at minute 2."  # in time order, first sentences
        c.summarize(NS, s.text, source_memory_ids=s.source_memory_ids)
        since_last = c.build_summary(NS)  # no range: what came since the last summary
        assert since_last.source_memory_ids == []
        whole = c.build_summary(NS, since=t0)  # a range reaches behind the last summary
        assert whole.source_memory_ids == ["e0", "e1", "e2", "e3"]


def test_reflection_and_summary_thresholds_are_set_per_namespace(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory(reflection_threshold=10.0, summary_token_threshold=8000)) as c:
        c.update_namespace_config("agent:a", reflection_threshold=1.5, summary_token_threshold=25)
        c.update_namespace_config("agent:off", reflection_threshold=0, summary_token_threshold=0)
        eff = c.get_namespace_config("agent:a").effective
        assert (eff.reflection_threshold, eff.summary_token_threshold) == (1.5, 25)
        for ns in ("agent:a", "agent:off", "agent:default"):
            got = [c.observe(ns, f"event {i}", importance=0.8, token_cost=10) for i in range(3)]
            due = [(r.reflection_due, r.summary_due) for r in got]
            if ns == "agent:a":  # importance 0.8, 1.6, 2.4 against 1.5; tokens 10, 20, 30 beyond 25
                assert due == [(False, False), (True, False), (True, True)]
            else:  # turned off, or the server's 10 and 8,000
                assert due == [(False, False)] * 3
        assert c.reflection_candidates("agent:a").threshold == 1.5
        assert c.reflection_candidates("agent:default").threshold == 10.0
        with pytest.raises(InvalidArgumentError) as e:
            c.update_namespace_config("agent:a", reflection_threshold=-1)
        assert e.value.fields == ["config.policy.reflection_threshold"]


def test_a_namespace_can_store_memories_without_importance_at_a_fixed_value(
    server_factory: Callable[..., RunningServer],
) -> None:
    with _client(server_factory()) as c:
        c.update_namespace_config("stream:a", default_importance=0.5)
        text = "This is an important, critical and urgent decision."
        assert c.observe("stream:a", text).memory.importance == pytest.approx(0.5)
        assert c.observe("stream:a", "ok", importance=0.9).memory.importance == pytest.approx(0.9)
        assert c.reflect("stream:a", "an insight", source_memory_ids=[]).importance >= 0.8
        assert c.observe("stream:b", text).memory.importance != pytest.approx(0.5)  # estimated there
        assert c.get_namespace_config("stream:a").effective.default_importance == pytest.approx(0.5)
        assert not c.get_namespace_config("stream:b").effective.HasField("default_importance")


def test_a_protected_namespace_takes_a_preference_or_a_summary_only_with_confirm(
    server_factory: Callable[..., RunningServer],
) -> None:
    from tiermem.client import FailedPreconditionError

    with _client(server_factory()) as c:
        s1 = c.summarize(NS, "the first summary", source_memory_ids=[])
        c.create(NS, "likes tea", kind="preference", id="p1")
        c.update_namespace_config(NS, protected=True)
        for attempt in (
            lambda confirm: c.summarize(NS, "a rewrite", source_memory_ids=[], confirm=confirm),
            lambda confirm: c.create(NS, "likes coffee", kind="preference", confirm=confirm),
            lambda confirm: c.create_batch(
                [{"namespace": NS, "content": "x", "kind": "preference"}], confirm=confirm
            ),
        ):
            with pytest.raises(FailedPreconditionError) as e:
                attempt(False)
            assert e.value.reason == "NAMESPACE_PROTECTED"
        assert [m.id for m in c.list_memories(NS, kinds=["summary"])] == [s1.id]  # not replaced
        assert [m.id for m in c.list_memories(NS, kinds=["preference"])] == ["p1"]
        c.create(NS, "an ordinary observation")  # other kinds need no confirm
        s2 = c.summarize(NS, "a rewrite", source_memory_ids=[], confirm=True)
        assert [m.id for m in c.list_memories(NS, kinds=["summary"])] == [s2.id]
        c.create(NS, "likes coffee", kind="preference", confirm=True)
        assert len(list(c.list_memories(NS, kinds=["preference"]))) == 2


def test_a_summary_copied_moved_or_updated_within_its_namespace_is_its_one_summary(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A summary replaces the namespace's current one however it gets there: renamed by a move
    (the context still shows it, and the next summary replaces it), copied, or made one by an
    update of its kind; a preference or a summary copied within a protected namespace needs
    confirm like one stored there."""
    from tiermem.client import FailedPreconditionError

    def summaries() -> list[str]:
        return [m.content for m in c.list_memories(NS, kinds=["summary"])]

    def in_context() -> list[str]:
        ctx = c.build_context([NS], token_budget=500, read_only=True)
        return [x.text for s in ctx.sections if s.kind == "summary" for x in s.items]

    with _client(server_factory()) as c:
        c.create(NS, "an observation to summarize")
        first = c.summarize(NS, "the first summary", source_memory_ids=[])
        moved = c.transfer(NS, first.id, mode="move", target_id="renamed")
        assert moved.id == "renamed" and in_context() == ["the first summary"]
        c.summarize(NS, "the second summary", source_memory_ids=[])
        assert summaries() == ["the second summary"] and in_context() == ["the second summary"]
        second = next(iter(c.list_memories(NS, kinds=["summary"])))
        copy = c.transfer(NS, second.id, mode="copy")
        assert [m.id for m in c.list_memories(NS, kinds=["summary"])] == [copy.id]
        note = c.create(NS, "the third summary, first stored as a note")
        c.update(NS, note.id, kind="summary")
        assert summaries() == ["the third summary, first stored as a note"]
        assert in_context() == ["the third summary, first stored as a note"]
        insight = c.create(NS, "an insight first stored as an observation", importance=0.9)
        assert c.reflection_candidates(NS).accumulated_importance > 0.9
        c.update(NS, insight.id, kind="reflection")  # (as if stored so: the accumulator resets)
        assert c.reflection_candidates(NS).accumulated_importance == 0.0
        c.create(NS, "likes tea", kind="preference", id="p1")
        c.update_namespace_config(NS, protected=True)
        for kept in ("p1", note.id):
            with pytest.raises(FailedPreconditionError) as e:
                c.transfer(NS, kept, mode="copy")
            assert e.value.reason == "NAMESPACE_PROTECTED"
        assert [m.id for m in c.list_memories(NS, kinds=["preference"])] == ["p1"]
        assert summaries() == ["the third summary, first stored as a note"]
        c.transfer(NS, "p1", mode="copy", confirm=True)
        assert len(list(c.list_memories(NS, kinds=["preference"]))) == 2


def test_an_update_into_a_reflection_or_a_summary_counts_as_one_stored_then(
    server_factory: Callable[..., RunningServer],
) -> None:
    """Its tokens were counted toward the next summary when it was created: an update into a
    reflection does not count them again; one into a summary covers what is stored at that
    moment, so the next extractive summary has nothing before it to quote."""
    with _client(server_factory()) as c:
        m = c.create(NS, "an observation worth reflecting on", importance=0.5, token_cost=100)
        before = c.stats(NS).summary_tokens
        c.update(NS, m.id, kind="reflection", importance=0.9)
        assert c.stats(NS).summary_tokens == before == 100
        a = c.create(NS, "alpha happened first.", token_cost=10)
        c.create(NS, "beta happened second.", token_cost=10)
        c.update(NS, a.id, kind="summary", content="summary: alpha and beta.")
        assert c.stats(NS).summary_tokens == 0
        assert c.build_summary(NS).text == ""
        c.create(NS, "gamma happened third.", token_cost=10)
        assert c.build_summary(NS).text == "gamma happened third."


def _set_policy(c: MemoryClient, ns: str, policy: object, paths: list[str], confirm: bool = False) -> object:
    """UpdateNamespaceConfig with a raw LifecyclePolicy and mask paths (the contract as any client sends it)."""
    from google.protobuf import field_mask_pb2

    from tiermem.v1 import memory_pb2 as pb

    req = pb.UpdateNamespaceConfigRequest(
        config=pb.NamespaceConfig(namespace=ns, policy=policy),
        update_mask=field_mask_pb2.FieldMask(paths=paths),
        confirm=confirm,
    )
    return c.stub.UpdateNamespaceConfig(req, timeout=30)


def _episodes(c: MemoryClient, ns: str, t0: float) -> None:
    """Events created at minutes 0..3 (in another order), then feedback on the oldest, 3 hours on."""
    for minute in (2, 0, 3, 1):
        c.observe(ns, f"episode at minute {minute}", id=f"e{minute}", create_time=t0 + 60 * minute)
    c.feedback(ns, [{"id": "e0", "actual_usefulness": 1.0, "success": True}])


def _by_recency(c: MemoryClient, ns: str) -> list[str]:
    return [r.memory.id for r in c.search(ns, strategy="recency", read_only=True)]


def test_recency_is_by_creation_unless_the_namespace_asks_for_last_access(
    server_factory: Callable[..., RunningServer],
) -> None:
    from conftest import FakeClock

    from tiermem.v1 import memory_pb2 as pb

    t0 = 1_700_000_000.0
    clock = FakeClock(t0 + 3 * 3600)  # the episodes are 3 hours old when the feedback comes
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0)
    with _client(running) as c:
        _episodes(c, "agent:a", t0)
        assert c.get("agent:a", "e0").access_count == 1
        assert _by_recency(c, "agent:a") == ["e3", "e2", "e1", "e0"]  # the feedback moves nothing
        c.search("agent:a", "minute 1", limit=1)  # nor does a search counted as an access
        running.engine.flush_access()
        assert c.get("agent:a", "e1").access_count == 1
        assert _by_recency(c, "agent:a") == ["e3", "e2", "e1", "e0"]
        eff = c.get_namespace_config("agent:a").effective
        assert eff.recency_basis == pb.RECENCY_BASIS_CREATION  # the server's default, reported
        # recency by last access, where the namespace asks for it
        _set_policy(
            c,
            "agent:b",
            pb.LifecyclePolicy(recency_basis=pb.RECENCY_BASIS_LAST_ACCESS),
            ["policy.recency_basis"],
        )
        _episodes(c, "agent:b", t0)
        assert _by_recency(c, "agent:b") == ["e0", "e3", "e2", "e1"]
        eff = c.get_namespace_config("agent:b").effective
        assert eff.recency_basis == pb.RECENCY_BASIS_LAST_ACCESS
        # each namespace keeps its own in a search over both (the score is recency alone)
        both = c.search(["agent:a", "agent:b"], strategy="recency", limit=8, read_only=True)
        got = [(r.memory.namespace, r.memory.id) for r in both]
        assert got[0] == ("agent:b", "e0") and set(got[1:3]) == {("agent:a", "e3"), ("agent:b", "e3")}
        # and in the weighted sum's recency
        [top] = c.search(
            "agent:b", "episode", strategy="comprehensive", beta=1.0, alpha=0.0, gamma=0.0, limit=1
        )
        assert top.memory.id == "e0" and top.recency == pytest.approx(1.0, abs=1e-6)


def test_the_server_default_recency_basis_is_a_setting(server_factory: Callable[..., RunningServer]) -> None:
    from conftest import FakeClock

    from tiermem.v1 import memory_pb2 as pb

    t0 = 1_700_000_000.0
    with _client(server_factory(clock=FakeClock(t0 + 3 * 3600), recency_basis="last_access")) as c:
        _episodes(c, NS, t0)
        assert _by_recency(c, NS) == ["e0", "e3", "e2", "e1"]
        assert c.get_namespace_config(NS).effective.recency_basis == pb.RECENCY_BASIS_LAST_ACCESS
        _set_policy(
            c, NS, pb.LifecyclePolicy(recency_basis=pb.RECENCY_BASIS_CREATION), ["policy.recency_basis"]
        )
        assert _by_recency(c, NS) == ["e3", "e2", "e1", "e0"]
    with pytest.raises(ValueError, match="recency_basis"):
        from tiermem.server.config import ServerConfig

        ServerConfig(recency_basis="access")


def test_a_bad_recency_basis_is_refused_and_changes_nothing(
    server_factory: Callable[..., RunningServer],
) -> None:
    import grpc

    from tiermem.v1 import memory_pb2 as pb

    with _client(server_factory()) as c:
        _set_policy(c, NS, pb.LifecyclePolicy(max_items=50), ["policy.max_items"])
        before = c.get_namespace_config(NS)
        bad = pb.LifecyclePolicy(max_items=7)
        bad.recency_basis = 9  # type: ignore[assignment]  # (an enum value the contract does not have)
        with pytest.raises(grpc.RpcError) as e:
            _set_policy(c, NS, bad, ["policy.recency_basis", "policy.max_items"])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config.policy.recency_basis" in (e.value.details() or "")
        assert c.get_namespace_config(NS) == before  # nothing changed, max_items neither


def test_a_protected_namespace_changes_its_recency_basis_only_with_confirm(
    server_factory: Callable[..., RunningServer],
) -> None:
    import grpc

    from tiermem.client import FailedPreconditionError
    from tiermem.client.errors import from_rpc_error
    from tiermem.v1 import memory_pb2 as pb

    with _client(server_factory()) as c:
        c.update_namespace_config(NS, protected=True)
        by_access = pb.LifecyclePolicy(recency_basis=pb.RECENCY_BASIS_LAST_ACCESS)
        with pytest.raises(grpc.RpcError) as e:
            _set_policy(c, NS, by_access, ["policy.recency_basis"])
        err = from_rpc_error(e.value)
        assert isinstance(err, FailedPreconditionError) and err.reason == "NAMESPACE_PROTECTED"
        assert c.get_namespace_config(NS).effective.recency_basis == pb.RECENCY_BASIS_CREATION
        _set_policy(c, NS, by_access, ["policy.recency_basis"], confirm=True)
        assert c.get_namespace_config(NS).effective.recency_basis == pb.RECENCY_BASIS_LAST_ACCESS
