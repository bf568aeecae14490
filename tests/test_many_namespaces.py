"""Many namespaces (one per session or task), through a real server: a namespace appearing keeps
the lifecycle tables every search reads (server/core/policy_cache.py), a settings change rebuilds
them, and each row holds the policy in effect for its namespace; a deleted namespace leaves
nothing behind that later calls or start-ups go through, while the server's totals stay whole."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tiermem.client import MemoryClient
from tiermem.server.core.policy import Tables
from tiermem.server.core.state import EngineState
from tiermem.server.transport.app import RunningServer


def _row(st: EngineState, tables: Tables, namespace: str) -> tuple[int, int, bool]:
    i = st.columns.namespaces.get(namespace)
    assert i >= 0
    return int(tables.max_items[i]), int(tables.capacity[i, 1]), bool(tables.summarize[i])


def test_new_namespaces_keep_the_tables_and_a_settings_change_rebuilds_them(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory(tier_max_items=(50, 60, 70, 80))
    st = running.engine.state
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.update_namespace_config("user:ana", preset="task_project_global", max_items=7)
        c.create("user:ana", "configured before the others")
        first = st.policy_tables()
        for i in range(40):  # (sessions coming and going: no settings of their own)
            c.create(f"user:ana/session:{i}", f"turn {i}")
        again = st.policy_tables()
        assert again is first  # (not rebuilt: their rows hold the server's policy already)
        assert _row(st, again, "user:ana/session:39") == (2**63 - 1, 50, False)
        configured = _row(st, again, "user:ana")
        assert configured[0] == 7 and configured != _row(st, again, "user:ana/session:39")
        assert st.policy_for("user:ana").max_items == 7

        c.update_namespace_config("user:ana/session:3", max_items=3, summarize_evictions=True)
        changed = st.policy_tables()
        assert changed is not first
        assert _row(st, changed, "user:ana/session:3") == (3, 50, True)
        assert _row(st, changed, "user:ana") == configured
        # Namespaces with equal overrides share one policy, kept until their settings change.
        c.update_namespace_config("user:bo", max_items=3, summarize_evictions=True)
        assert st.policy_for("user:bo") is st.policy_for("user:ana/session:3")
        c.update_namespace_config("user:bo", max_items=4)
        assert st.policy_for("user:bo").max_items == 4 and st.policy_for("user:ana/session:3").max_items == 3
        assert _row(st, st.policy_tables(), "user:bo")[0] == 4
        # The tables act: a consolidation keeps a configured namespace within its cap.
        for i in range(6):
            c.create("user:ana/session:3", f"another turn {i}")
        c.consolidate("user:ana/session:3")
        assert c.stats("user:ana/session:3").memory_count == 3


def _totals(c: MemoryClient, namespace: str = "") -> list[tuple[int, int, int, int]]:
    return [
        (t.promotions_total, t.demotions_total, t.evictions_total, t.deleted_total)
        for t in c.stats(namespace).tiers
    ]


def test_a_deleted_namespace_leaves_its_totals_to_the_server_only(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    running = server_factory(data)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        for ns in ("user:ana/session:1", "user:ana/session:2"):
            c.update_namespace_config(ns, working_token_limit=10)
            c.create(ns, f"a turn of {ns}", tier="fast", token_cost=20)  # (flushed: one demotion each)
        c.search("user:ana/session:1", "turn", read_only=False)
        everyone = _totals(c)
        assert sum(t[1] for t in everyone) == 2 and sum(t[1] for t in _totals(c, "user:ana/session:1")) == 1
        stats_before = c.stats()
        c.delete_namespace("user:ana/session:1")
        assert _totals(c) == everyone  # (the server's totals ever are whole)
        assert sum(t[1] for t in _totals(c, "user:ana/session:1")) == 0
        assert sum(t[1] for t in _totals(c, "user:ana/session:2")) == 1
        after = c.stats()
        assert (after.search_hits, after.search_misses) == (
            stats_before.search_hits,
            stats_before.search_misses,
        )
        assert c.stats("user:ana/session:1").search_hits == 0
        # Made again, it starts from nothing.
        c.update_namespace_config("user:ana/session:1", working_token_limit=10)
        c.create("user:ana/session:1", "a new turn", tier="fast", token_cost=20)
        assert sum(t[1] for t in _totals(c, "user:ana/session:1")) == 1
        c.delete_namespace("user:ana/session:1")
        everyone = _totals(c)
    st = running.engine.state
    with st.store.read() as txn:
        kept = st.store.lifecycle_counters(txn)
    assert {ns for ns, _ in kept} == {"", "user:ana/session:2"}  # (in LMDB: none of the deleted one)
    running.stop(None)
    running = server_factory(data)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        assert _totals(c) == everyone and sum(t[1] for t in everyone) == 3
        assert sum(t[1] for t in _totals(c, "user:ana/session:1")) == 0
    assert {ns for ns, _ in running.engine.state.lifecycle.totals} == {"", "user:ana/session:2"}


def test_hit_counts_keep_at_most_so_many_namespaces() -> None:
    """Searches may name any names (one that was never written misses): past the limit a new name
    is counted in the server's figures only, while those already counted go on."""
    from tiermem.server.core.counters import SearchCounts

    counts = SearchCounts(most=3)
    for i in range(5):
        counts.count([f"made:up/{i}"], set(), False)
    counts.count(["made:up/0"], {"made:up/0"}, True)
    counts.merge({"made:up/1": [2, 0], "made:up/4": [5, 5]}, [7, 5])
    assert counts.hits_misses("made:up/0") == (1, 1) and counts.hits_misses("made:up/1") == (2, 1)
    assert counts.hits_misses("made:up/3") == (0, 0) and counts.hits_misses("made:up/4") == (0, 0)
    assert counts.hits_misses() == (1 + 7, 5 + 5)
    counts.forget({"made:up/2"})
    counts.count(["made:up/4"], set(), False)
    assert counts.hits_misses("made:up/4") == (0, 1)


def test_made_up_names_cannot_keep_real_namespaces_from_being_counted(
    server_factory: Callable[..., RunningServer],
) -> None:
    """One tenant searching thousands of names it never wrote filled the table every tenant's hit
    counts share: another tenant's new namespace then counted nothing. Once full, the names that
    hold no memory make room."""
    running = server_factory()
    running.engine.state.searches.most = 50  # (the server's table, made small)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.create("tenant-a/real", "a memory of tenant a")
        c.search("tenant-a/real", "memory", read_only=True)
        for i in range(0, 200, 20):
            c.search_many(
                [{"namespaces": [f"tenant-a/made-up-{i + j}"], "query": "memory"} for j in range(20)]
            )
        c.create("tenant-b/new", "a memory of tenant b")
        for _ in range(3):
            assert c.search("tenant-b/new", "memory", read_only=True)
        assert (c.stats("tenant-b/new").search_hits, c.stats("tenant-a/real").search_hits) == (3, 1)
        assert c.stats().search_misses == 200  # (the server's own figures count them all)


def test_a_start_up_drops_the_rows_of_deleted_memories_once_most_rows_are_theirs(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    """Rows of deleted memories stay in the columns while a server runs and were restored with
    every snapshot: with enough of them, a start-up decodes the live records instead (the deleted
    ones' rows, keywords and names go), and the indexes' snapshots still serve the live ones."""
    from tiermem.server.config import Tuning

    def start(data: Path, dead: int) -> RunningServer:
        return server_factory(data, tuning=Tuning(columns_rebuild_dead=dead, columns_rebuild_dead_share=0.75))

    for dead, rows_after in ((40, 10), (1000, 100)):
        data = tmp_path / f"data{dead}"
        running = start(data, dead)
        with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
            for i in range(100):
                c.create(
                    f"user:s{i}", f"session {i} talked about the {'kept' if i < 10 else 'passing'} topic {i}"
                )
            for i in range(10, 100):
                c.delete_namespace(f"user:s{i}")
        assert running.engine.state.columns.n == 100
        running.stop(None)
        running = start(data, dead)
        st = running.engine.state
        assert (st.columns.n, len(st.columns)) == (rows_after, 10)
        if rows_after == 10:
            assert st.columns.namespaces.get("user:s50") < 0 and len(st.columns.namespaces) == 10
        with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
            assert c.stats().memory_count == 10
            for i in (0, 9):
                found = c.search([f"user:s{j}" for j in range(10)], f"topic {i} kept", limit=3)
                assert found[0].memory.content == f"session {i} talked about the kept topic {i}"
            assert c.search("user:s50", "passing topic 50") == []
        running.stop(None)


def test_policies_asked_for_while_the_tables_are_rebuilt() -> None:
    """Creates, passes and config reads ask for namespaces' policies from other threads while a
    search rebuilds the tables after a settings change: the rebuild must not trip over them
    (it raised "dictionary changed size during iteration": INTERNAL)."""
    import sys
    import threading

    from tiermem.server.config import ServerConfig
    from tiermem.server.core.policy import Policy
    from tiermem.server.core.policy_cache import PolicyCache
    from tiermem.server.index.columns import Interner

    cache, names = PolicyCache(Policy.from_config(ServerConfig())), Interner()
    settings = {f"s:{i}": {"policy": {"max_items": 10 + i % 7}} for i in range(20_000)}
    for ns, s in settings.items():
        names.id(ns)
        cache.policy_of(s, ns)
    stop, errors = threading.Event(), []

    def asking() -> None:
        i = 0
        while not stop.is_set():
            cache.policy_of({"policy": {"max_items": 5}}, f"w:{i}")
            i += 1

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    other = threading.Thread(target=asking)
    other.start()
    try:
        for version in range(1, 13):
            try:
                tables = cache.tables(names, lambda: settings, version)
            except RuntimeError as e:
                errors.append(e)
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)
    assert errors == []
    assert int(tables.max_items[names.get("s:3")]) == 13


def test_deleting_a_scope_with_its_children_retires_the_totals_of_children_left_empty(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A child scope whose memories a pass already deleted (expired) has no memories and no
    settings left, only its lifecycle totals: deleting its parent with its children retires them."""
    from conftest import FakeClock

    clock = FakeClock()
    running = server_factory(clock=clock)
    st = running.engine.state
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.create("user:a", "the parent's memory")
        c.create("user:a/session:1", "a short-lived turn", expire_time=clock.now + 60)
        clock.advance(120)
        c.consolidate("user:a/session:1")
        assert sum(t[3] for t in _totals(c, "user:a/session:1")) == 1
        c.delete_namespace("user:a", include_children=True)
        assert sum(t[3] for t in _totals(c, "user:a/session:1")) == 0
        assert sum(t[3] for t in _totals(c)) == 1
    with st.store.read() as txn:
        assert {ns for ns, _ in st.store.lifecycle_counters(txn)} == {""}
