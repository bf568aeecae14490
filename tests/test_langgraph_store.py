"""``tiermem.langgraph.TiermemStore`` end to end against a real server: a conformance suite modelled on
LangGraph's own store tests (the installed langgraph and langgraph-checkpoint ship none to reuse),
with LangGraph's ``InMemoryStore`` as the reference where the semantics are the same, then what is
tiermem's own: the mapping onto memories, TTL as ``expire_time``, a graph using the store.

Every test of a store runs twice: on the sync path (``batch``, ``MemoryClient``) and on the async
path (``ThroughAbatch``: each operation through ``abatch`` and its ``AsyncMemoryClient``)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any, TypedDict

import grpc
import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchOp,
)
from langgraph.store.memory import InMemoryStore
from test_client_usability import Delay, RecordMetadata, front_server

from tiermem.client import InvalidArgumentError, MemoryClient, TiermemError, metadata_dict
from tiermem.langgraph import ForeignMemoryError, TiermemStore
from tiermem.langgraph import filters as lg_filters
from tiermem.langgraph import keys as lg_keys
from tiermem.langgraph import newest as lg_newest
from tiermem.langgraph import values as lg_values

PREFIX = "app:test/lg"


class ThroughAbatch(TiermemStore):
    """A ``TiermemStore`` whose every operation, the sync ones too (``put``, ``search``, ...), goes
    through ``abatch``, its async path, on an event loop of its own thread: the suite's checks made
    of the async path. Its own ``a*`` methods run on the caller's loop (a second one)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def batch(self, ops: Iterable[Any]) -> list[Any]:
        return asyncio.run_coroutine_threadsafe(self.abatch(list(ops)), self.loop).result()

    def close(self) -> None:
        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self.aclose(), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()


@pytest.fixture
def target(server_factory: Callable[..., Any]) -> str:
    return f"127.0.0.1:{server_factory().port}"


@pytest.fixture(params=["sync", "async"])
def make(request: pytest.FixtureRequest) -> Iterator[Callable[..., TiermemStore]]:
    """``make(...)``: ``TiermemStore(...)`` (or ``ThroughAbatch(...)``), closed after the test."""
    made: list[TiermemStore] = []

    def build(*args: Any, **kwargs: Any) -> TiermemStore:
        made.append((TiermemStore if request.param == "sync" else ThroughAbatch)(*args, **kwargs))
        return made[-1]

    yield build
    for s in made:
        s.close()


@pytest.fixture
def store(target: str, make: Callable[..., TiermemStore]) -> Iterator[TiermemStore]:
    with make(target, namespace_prefix=PREFIX) as s:
        s.client.wait_ready()
        yield s


@pytest.fixture
def raw(target: str) -> Iterator[MemoryClient]:
    """The server as tiermem sees it."""
    with MemoryClient(target) as c:
        yield c


def _both(tiermem: BaseStore) -> list[BaseStore]:
    return [tiermem, InMemoryStore()]


NESTED: dict[str, Any] = {
    "text": "Ana prefers window seats on long flights",
    "zeta": 1,
    "alpha": [1, 2.5, -0.0, True, None, "x", {"deep": {"deeper": [[], {}]}}],
    "big": 2**70,
    "small": -(2**60) - 1,
    "float": 0.1 + 0.2,
    "tiny": 5e-324,
    "unicode": 'café ☕ 日本 \u0000 \n\t"quoted" \\',
    "empty": {},
    "null": None,
    "flag": False,
}


# -- put, get, delete ----------------------------------------------------------------------------
@pytest.mark.parametrize("index", [None, ["text"], ["alpha[*]", "unicode"], False])
def test_put_get_round_trips_any_json_value(store: TiermemStore, index: Any) -> None:
    before = datetime.now(timezone.utc)
    store.put(("users", "ana"), "seat", NESTED, index=index)
    item = store.get(("users", "ana"), "seat")
    assert item is not None
    assert item.value == NESTED
    assert list(item.value) == list(NESTED)  # key order kept
    assert list(item.value["alpha"][6]["deep"]) == ["deeper"]
    assert type(item.value["big"]) is int and type(item.value["float"]) is float
    assert math.copysign(1, item.value["alpha"][2]) == -1  # -0.0 stays -0.0
    assert item.key == "seat" and item.namespace == ("users", "ana")
    assert item.created_at.tzinfo is not None and item.created_at == item.updated_at
    assert before.timestamp() - 1 <= item.created_at.timestamp() <= time.time() + 1


def test_non_finite_numbers_and_surrogates_round_trip(store: TiermemStore) -> None:
    value = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "lone": "a\ud800b"}
    store.put(("x",), "odd", value)
    item = store.get(("x",), "odd")
    assert item is not None
    assert math.isnan(item.value["nan"]) and item.value["inf"] == math.inf and item.value["ninf"] == -math.inf
    assert item.value["lone"] == "a\ud800b"


def test_get_missing_and_delete(store: TiermemStore) -> None:
    assert store.get(("users", "ana"), "nothing") is None
    assert store.get(("nobody",), "nothing") is None
    store.put(("users", "ana"), "k", {"v": 1})
    store.delete(("users", "ana"), "k")
    assert store.get(("users", "ana"), "k") is None
    store.delete(("users", "ana"), "k")  # deleting what is not there is fine
    store.delete(("never", "was"), "k")


AWKWARD_KEYS = [
    "",
    " ",
    "a b",
    "user:7",
    "notes.md",
    "a/b\\c",
    "::",
    ":3A",
    "%41",
    "ключ",
    "😀",
    "tab\there",
    "x" * 129,
    "é" * 100,
]
AWKWARD_NAMESPACES = [
    ("users", "ana maria"),
    ("a/b", "c:d"),
    ("日本",),
    ("-", "_", ":"),
    ("users", "ana", "memories", "deep", "er"),
    ("sp ace", "new\nline"),
]


def test_awkward_keys_and_namespaces_round_trip(store: TiermemStore) -> None:
    for ns in AWKWARD_NAMESPACES:
        for i, key in enumerate(AWKWARD_KEYS):
            store.put(ns, key, {"i": i, "key": key})
    for ns in AWKWARD_NAMESPACES:
        for i, key in enumerate(AWKWARD_KEYS):
            item = store.get(ns, key)
            assert item is not None, (ns, key)
            assert (item.namespace, item.key, item.value) == (ns, key, {"i": i, "key": key})
        found = store.search(ns, limit=100)
        assert sorted(it.key for it in found if it.namespace == ns) == sorted(AWKWARD_KEYS)
    assert sorted(store.list_namespaces(limit=100)) == sorted(AWKWARD_NAMESPACES)


def test_a_key_past_what_the_metadata_holds_is_refused_naming_the_key(store: TiermemStore) -> None:
    longest = "k" * lg_values.MAX_KEY_BYTES
    store.put(("users",), longest, {"v": 1})
    got = store.get(("users",), longest)
    assert got is not None and got.key == longest
    with pytest.raises(ValueError, match="a key is at most"):  # (it said the metadata was too large)
        store.put(("users",), longest + "k", {"v": 2})


def test_field_names_no_label_may_hold_are_stored_and_filtered(store: TiermemStore) -> None:
    """A value's field whose name tiermem refuses as a metadata key (a control character, a
    zero-width space, a line separator) is kept in the value, not mirrored, and still filters."""
    odd = ["tab\tname", "zero\u200bwidth", "line\u2028sep", "\u202eflipped"]
    store.put(("odd",), "a", {name: i for i, name in enumerate(odd)} | {"plain": 1})
    store.put(("odd",), "b", {"plain": 2})
    item = store.get(("odd",), "a")
    assert item is not None and item.value == {name: i for i, name in enumerate(odd)} | {"plain": 1}
    for i, name in enumerate(odd):
        assert [it.key for it in store.search(("odd",), filter={name: i})] == ["a"]
    assert lg_values.field_key("zero\u200bwidth") is None
    assert (
        lg_values.field_key("\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645") is not None
    )  # a joiner a word needs
    assert lg_values.field_key("unassigned\u0378") is None  # (a newer server's Unicode may refuse it)


def test_keys_and_labels_map_reversibly() -> None:
    for key in [*AWKWARD_KEYS, "plain-Key_1.2"]:
        mid = lg_keys.memory_id(key)
        assert 1 <= len(mid) <= 128
        assert all(c.isascii() and (c.isalnum() or c in "._:-") for c in mid)
        assert lg_keys.key_of(mid) in (key, None)
    assert lg_keys.memory_id("plain-Key_1.2") == "plain-Key_1.2"
    assert lg_keys.memory_id("user:7") == "user:3A7"
    assert len({lg_keys.memory_id(k) for k in AWKWARD_KEYS}) == len(AWKWARD_KEYS)
    for ns in AWKWARD_NAMESPACES:
        path = lg_keys.namespace_path("p", ns)
        assert lg_keys.namespace_tuple("p", path) == ns
    assert lg_keys.namespace_path("", ("user:ana", "project:x")) == "user:ana/project:x"
    assert lg_keys.namespace_path("", ("ana maria", "a/b")) == "ana.20maria/a.2Fb"
    # Paths no namespace maps to: another client's ('.' of its own, non-canonical escapes).
    for path in ["v1.2/x", "a/.41", "a/.zz", "a//b", "p"]:
        assert lg_keys.namespace_tuple("p" if path == "p" else "", path) is None
    with pytest.raises(ValueError):
        TiermemStore("127.0.0.1:1", namespace_prefix="bad prefix")


def test_namespace_and_id_as_tiermem_sees_them(store: TiermemStore, raw: MemoryClient) -> None:
    store.put(("users", "ana maria"), "user:7", {"text": "hello"})
    memory = raw.get(f"{PREFIX}/users/ana.20maria", "user:3A7")
    assert memory.kind == "langgraph_item"
    assert memory.content == '{"text": "hello"}'
    meta = metadata_dict(memory)
    assert meta["langgraph.key"] == "user:7" and meta["value.text"] == "hello"
    assert "langgraph.value" not in meta  # the content is the value's JSON


def test_put_replaces_keeping_created_at(store: TiermemStore, raw: MemoryClient) -> None:
    ns = ("users", "ana")
    store.put(ns, "profile", {"name": "Ana", "city": "Lisbon", "tags": ["a"]})
    first = store.get(ns, "profile")
    time.sleep(0.01)
    store.put(ns, "profile", {"name": "Ana", "city": "Porto"}, index=["city"])
    second = store.get(ns, "profile")
    assert first is not None and second is not None
    assert second.value == {"name": "Ana", "city": "Porto"}
    assert second.created_at == first.created_at and second.updated_at > first.updated_at
    (memory,) = list(raw.list_memories(f"{PREFIX}/users/ana"))  # replaced, not added
    assert memory.content == "Porto"
    assert metadata_dict(memory).get("value.tags") is None  # the old mirror is gone too
    assert store.search(ns, filter={"city": "Lisbon"}) == []
    assert [it.key for it in store.search(ns, filter={"city": "Porto"})] == ["profile"]


# -- search ----------------------------------------------------------------------------------------
FACTS = {
    "pets": "Ana has two cats named Miso and Tofu",
    "food": "Ana is allergic to peanuts and avoids satay",
    "work": "Ana works as a structural engineer on bridges",
    "travel": "Ana is planning a trip to Japan in April",
    "music": "Ana plays the cello in a community orchestra",
}


def test_search_with_query_ranks_the_right_item_first(store: TiermemStore) -> None:
    for i, (key, text) in enumerate(FACTS.items()):
        store.put(("users", "ana", "facts"), key, {"text": text, "i": i})
    store.put(("users", "bob"), "pets", {"text": "Bob has a dog"})
    for query, key in [
        ("what instrument does she play in the orchestra", "music"),
        ("peanut allergy", "food"),
        ("cats", "pets"),
        ("trip to Japan", "travel"),
    ]:
        found = store.search(("users", "ana"), query=query, limit=3)
        assert found[0].key == key, (query, [(it.key, it.score) for it in found])
        assert all(it.namespace == ("users", "ana", "facts") for it in found)
        scores = [it.score for it in found]
        assert all(isinstance(s, float) for s in scores) and scores == sorted(scores, reverse=True)
    everything = store.search((), query="pets", limit=10)
    assert {(it.namespace, it.key) for it in everything} >= {(("users", "bob"), "pets")}


def test_search_with_query_limit_offset_and_filter(store: TiermemStore) -> None:
    # Graded overlap with the query, so relevance (not recency or importance) decides the order.
    graded = {
        "four": "marmot glacier lantern orchid",
        "three": "marmot glacier lantern",
        "two": "marmot glacier",
        "one": "marmot",
        "none": "unrelated words here",
    }
    for i, (key, text) in enumerate(graded.items()):
        store.put(("users", "ana"), key, {"text": text, "i": i})
    query = "marmot glacier lantern orchid"
    ranked = [it.key for it in store.search(("users",), query=query, limit=5)]
    assert ranked == list(graded)
    assert [it.key for it in store.search(("users",), query=query, limit=2, offset=1)] == ranked[1:3]
    assert [it.key for it in store.search(("users",), query=query, offset=5)] == []
    assert [it.key for it in store.search(("users",), query=query, filter={"i": {"$gte": 2}})] == ranked[2:]
    found = store.search(
        ("users",), query=query, filter={"text": {"$gte": "marmot glacier l", "$lt": "n"}}, limit=10
    )
    assert [it.key for it in found] == ["four", "three"]


def test_pages_of_a_query_search_are_slices_of_one_ranking(store: TiermemStore) -> None:
    """Whatever the page size: no item twice, none skipped, the same scores (the ranking's signals
    are normalized over what it ranks, which must not depend on the page)."""
    words = ["purple", "elephant", "violet", "giant", "grey", "animal", "paint", "circus"]
    for i in range(24):
        text = " ".join(words[j % len(words)] for j in range(i % 5, i % 5 + 2 + i % 3))
        store.put(("users", f"u{i % 3}"), f"k{i}", {"text": f"{text} note {i}"})
    query = "purple elephant"
    whole = [(it.key, it.score) for it in store.search(("users",), query=query, limit=24)]
    assert len(whole) == 24
    for size in (2, 3, 5):
        paged = [
            (it.key, it.score)
            for offset in range(0, 24, size)
            for it in store.search(("users",), query=query, limit=size, offset=offset)
        ]
        assert [k for k, _ in paged] == [k for k, _ in whole], size
        # (the same scores, but for float32 rounding of a score computed again)
        assert [score for _, score in paged] == pytest.approx([score for _, score in whole], rel=1e-6)


def test_search_without_query_lists_newest_first(store: TiermemStore) -> None:
    keys = []
    for i in range(12):
        ns = ("docs", "a") if i % 3 else ("docs", "b", "c")
        store.put(ns, f"k{i:02}", {"i": i})
        keys.append(f"k{i:02}")
    newest = keys[::-1]
    found = store.search(("docs",), limit=20)
    assert [it.key for it in found] == newest
    assert all(it.score is None for it in found)
    assert [it.key for it in store.search(("docs",), limit=4, offset=3)] == newest[3:7]
    assert [it.key for it in store.search(("docs", "b"), limit=20)] == [
        k for k in newest if int(k[1:]) % 3 == 0
    ]
    assert store.search(("docs",), limit=0) == []
    assert store.search(("nothing",)) == []
    assert [it.key for it in store.search((), limit=2)] == newest[:2]


def test_search_prefix_is_by_label_not_by_text(store: TiermemStore) -> None:
    store.put(("users", "ana"), "a", {"v": 1})
    store.put(("users", "anabel"), "b", {"v": 2})
    store.put(("users", "ana", "sub"), "c", {"v": 3})
    assert sorted(it.key for it in store.search(("users", "ana"))) == ["a", "c"]
    assert sorted(it.key for it in store.search(("users", "ana"), query="v")) == ["a", "c"]
    assert sorted(it.key for it in store.search(("users",))) == ["a", "b", "c"]


def test_search_across_more_than_64_namespaces(store: TiermemStore) -> None:
    store.batch(
        [
            PutOp(("tenants", f"t{i:03}"), "note", {"text": f"tenant {i} note about invoices"})
            for i in range(70)
        ]
        + [PutOp(("tenants", "t042"), "target", {"text": "the quarterly volcano eruption report"})]
    )
    found = store.search(("tenants",), query="volcano eruption", limit=5)
    assert (found[0].namespace, found[0].key) == (("tenants", "t042"), "target")
    assert len(found) == 5 and [it.score for it in found] == sorted((it.score for it in found), reverse=True)
    assert len(store.search(("tenants",), query="invoices", limit=100)) == 71
    assert len(store.search(("tenants",), limit=100)) == 71
    assert len(store.list_namespaces(prefix=("tenants",), limit=1000)) == 70


def _newest_reference(ops: list[PutOp]) -> tuple[InMemoryStore, list[tuple[tuple[str, ...], str]]]:
    """LangGraph's store after ``ops``, and their keys newest first by first put (a replace keeps
    its place, as created_at does)."""
    reference = InMemoryStore()
    order: dict[tuple[tuple[str, ...], str], None] = {}
    for op in ops:
        reference.batch([op])
        if op.value is None:
            order.pop((op.namespace, op.key), None)
        else:
            order.setdefault((op.namespace, op.key), None)
    return reference, list(reversed(order))


def _uneven_puts() -> list[list[PutOp]]:
    """Batches over 150 namespaces (three searches of 64): one item in each, 300 in one of them,
    another in the first 70, a replace and a delete."""
    counter = itertools.count()

    def put(ns: tuple[str, ...], key: str) -> PutOp:
        i = next(counter)
        return PutOp(ns, key, {"i": i, "even": i % 2 == 0, "meta": {"hit": i % 37 == 0}})

    spaces = [("m", f"n{j:03}") for j in range(150)]
    return [
        [put(ns, "a") for ns in spaces],
        [put(("m", "n007"), f"b{i:03}") for i in range(300)],
        [put(ns, "c") for ns in spaces[:70]],
        [put(("m", "n003"), "a"), PutOp(("m", "n005"), "a", None)],
        [put(("m", "n149", "deep"), "d")],
    ]


NEWEST_SEARCHES: list[dict[str, Any]] = [
    {"limit": 10},
    {"limit": 1},
    {"limit": 5, "offset": 3},
    {"limit": 100, "offset": 250},
    {"limit": 1000, "offset": 100},  # 1,100 wanted: past one search's 1,000
    {"limit": 50, "offset": 600},  # past the end
    {"limit": 7, "filter": {"even": True}},  # on the server
    {"limit": 7, "offset": 2, "filter": {"meta": {"hit": True}}},  # in the client only
    {"limit": 30, "filter": {"i": {"$gte": 300}, "even": False}},
    {"namespace_prefix": ("m", "n007"), "limit": 20, "offset": 290},
    {"namespace_prefix": ("m", "n149"), "limit": 5},
    {"namespace_prefix": (), "limit": 3},
]


@pytest.mark.parametrize("rounds", ["searched", "read whole"])
def test_search_without_query_over_many_namespaces_agrees_with_the_in_memory_store(
    store: TiermemStore, rounds: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same items, values and filters as LangGraph's store, newest first by creation, offset
    and limit applied; whether the windows are searched or (past the rounds) read whole."""
    if rounds == "read whole":
        monkeypatch.setattr(lg_newest, "ROUNDS", 0)
    ops = [op for batch in _uneven_puts() for op in batch]
    for batch in _uneven_puts():
        store.batch(batch)
    reference, newest_first = _newest_reference(ops)
    for search in NEWEST_SEARCHES:
        prefix = search.get("namespace_prefix", ("m",))
        flt, offset, limit = search.get("filter"), search.get("offset", 0), search["limit"]
        matching = {
            (it.namespace, it.key): it.value for it in reference.search(prefix, filter=flt, limit=10_000)
        }
        want = [(ns, k, matching[(ns, k)]) for ns, k in newest_first if (ns, k) in matching]
        found = store.search(prefix, filter=flt, offset=offset, limit=limit)
        assert [(it.namespace, it.key, it.value) for it in found] == want[offset : offset + limit], search
        assert all(it.score is None for it in found)


def test_search_without_query_costs_a_few_calls_whatever_the_namespaces(
    server_factory: Callable[..., Any], make: Callable[..., TiermemStore]
) -> None:
    """700 namespaces (11 searches of 64): one ListNamespaces and a few BatchSearchMemories, not a
    ListMemories per namespace."""
    running = server_factory()
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        c.wait_ready()
    recorder = RecordMetadata()
    with front_server(running, (recorder,)) as (port, _):
        s = make(f"127.0.0.1:{port}", namespace_prefix=PREFIX)
        s.batch([PutOp(("t", f"n{i:03}"), "k", {"i": i}) for i in range(700)])
        for limit, offset in [(10, 0), (3, 600), (1, 0)]:
            recorder.seen.clear()
            found = s.search(("t",), limit=limit, offset=offset)
            assert [it.namespace for it in found] == [
                ("t", f"n{i:03}") for i in range(699 - offset, 699 - offset - limit, -1)
            ]
            calls = [name for name, _ in recorder.seen]
            assert calls.count("ListNamespaces") == 1 and "ListMemories" not in calls, calls
            assert 1 <= calls.count("BatchSearchMemories") <= 3 and len(calls) <= 4, calls


def test_search_without_query_orders_ties_in_creation_time_by_namespace_then_id(
    store: TiermemStore, raw: MemoryClient
) -> None:
    """Items created at the same instant (by another writer: the store's own puts never are), more
    than a search returns: the window around them cannot be narrowed and is read whole."""
    at = time.time() - 3600
    tied = [
        {
            "namespace": f"{PREFIX}/tie/{ns}",
            "content": json.dumps({"n": i}),
            "id": f"k{i:02}",
            "kind": "langgraph_item",
            "metadata": {"langgraph.key": f"k{i:02}"},
            "create_time": at,
        }
        for ns in ("b", "a")
        for i in range(40)
    ]
    raw.create_batch(tied)
    store.put(("tie", "a"), "newer", {"n": -1})
    store.put(("tie", "c"), "newest", {"n": -2})
    found = store.search(("tie",), limit=30, offset=1)
    ties = [(("tie", ns), f"k{i:02}") for ns in ("a", "b") for i in range(40)]
    assert [(it.namespace, it.key) for it in found] == [(("tie", "a"), "newer"), *ties[:29]]
    assert all(it.created_at.timestamp() == pytest.approx(at) for it in found[1:])


def test_other_memories_in_the_namespaces_are_not_items(store: TiermemStore, raw: MemoryClient) -> None:
    store.put(("users", "ana"), "k", {"text": "an item about cats"})
    raw.create(f"{PREFIX}/users/ana", "an observation about cats", id="obs")
    assert store.get(("users", "ana"), "obs") is None
    assert [it.key for it in store.search(("users",), query="cats")] == ["k"]
    assert [it.key for it in store.search(("users",))] == ["k"]


def test_a_put_or_delete_leaves_memories_that_are_no_items_as_they_are(
    store: TiermemStore, raw: MemoryClient, target: str, make: Callable[..., TiermemStore]
) -> None:
    """A memory of another kind under a key's id is no item: a put refuses to turn it into one, a
    delete leaves it; two stores of different kinds on one prefix keep their own items."""
    ns = f"{PREFIX}/users/ana"
    raw.create(ns, "a fact stored by other means", id="note1", kind="fact")
    raw.create(ns, "a preference", id="note2", kind="preference")
    with pytest.raises(ForeignMemoryError, match="'fact'"):
        store.put(("users", "ana"), "note1", {"text": "replaced?"})
    store.delete(("users", "ana"), "note2")
    assert (raw.get(ns, "note1").kind, raw.get(ns, "note1").content) == (
        "fact",
        "a fact stored by other means",
    )
    assert raw.get(ns, "note2").kind == "preference"
    assert store.get(("users", "ana"), "note1") is None
    with make(target, namespace_prefix=PREFIX, kind="other_item") as other:
        other.put(("users", "ana"), "profile", {"v": "other's"})
        with pytest.raises(ForeignMemoryError):
            store.put(("users", "ana"), "profile", {"v": "mine"})
        store.delete(("users", "ana"), "profile")
        got = other.get(("users", "ana"), "profile")
        assert got is not None and got.value == {"v": "other's"}
    store.put(("users", "ana"), "mine", {"v": 1})
    store.put(("users", "ana"), "mine", {"v": 2})  # (its own items are replaced as before)
    got = store.get(("users", "ana"), "mine")
    assert got is not None and got.value == {"v": 2}


def test_index_false_and_index_fields(store: TiermemStore, raw: MemoryClient) -> None:
    ns = ("docs",)
    store.put(ns, "hidden", {"text": "secret marmalade recipe"}, index=False)
    store.put(ns, "shown", {"text": "marmalade on toast", "body": "unrelated words"}, index=["text"])
    store.put(ns, "nothing", {"body": "marmalade"}, index=["missing.path"])
    assert [it.key for it in store.search(ns, query="marmalade")] == ["shown"]
    assert sorted(it.key for it in store.search(ns)) == ["hidden", "nothing", "shown"]
    shown = raw.get(f"{PREFIX}/docs", "shown")
    assert shown.content == "marmalade on toast"  # only the indexed text is searched
    assert (
        metadata_dict(shown)["langgraph.value"] == '{"text": "marmalade on toast", "body": "unrelated words"}'
    )


def test_store_default_index_fields(
    target: str, raw: MemoryClient, make: Callable[..., TiermemStore]
) -> None:
    with make(target, namespace_prefix=PREFIX, index={"fields": ["title", "tags[*]"]}) as s:
        s.put(("docs",), "d", {"title": "Harbour", "tags": ["boats", "sea"], "body": "x"})
        s.put(("docs",), "e", {"title": "Other", "body": "x"}, index=["body"])
        assert raw.get(f"{PREFIX}/docs", "d").content == "Harbour\nboats\nsea"
        assert raw.get(f"{PREFIX}/docs", "e").content == "x"
        assert s.get(("docs",), "d").value == {"title": "Harbour", "tags": ["boats", "sea"], "body": "x"}  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="embeds on the server"):
        TiermemStore(target, index={"dims": 3, "embed": lambda texts: [[1.0, 0, 0] for _ in texts]})  # type: ignore[typeddict-item]


def test_a_large_value_round_trips(store: TiermemStore, raw: MemoryClient) -> None:
    big = {"text": "summary of the whole thing", "log": [f"line {i} " * 20 for i in range(300)]}
    store.put(("docs",), "big", big, index=["text"])  # its JSON is too large for the metadata
    item = store.get(("docs",), "big")
    assert item is not None and item.value == big
    memory = raw.get(f"{PREFIX}/docs", "big")
    assert "langgraph.value" not in metadata_dict(memory) and memory.content.startswith('{"text"')


# -- filters ---------------------------------------------------------------------------------------
ITEMS: dict[str, dict[str, Any]] = {
    "a": {
        "color": "red",
        "score": 4.5,
        "n": 1,
        "ok": True,
        "meta": {"lang": "en", "v": 2},
        "tags": ["x", "y"],
    },
    "b": {"color": "blue", "score": 3.0, "n": 2, "ok": False, "meta": {"lang": "pt", "v": 2}, "tags": ["x"]},
    "c": {"color": "red", "score": 5.0, "n": 3, "ok": True, "meta": {"lang": "en", "v": 3}},
    "d": {"color": "green", "score": 2, "n": 4, "long": "z" * 2000, "meta": None},
    "e": {"color": None, "score": 1, "n": 2**60, "ok": None},
}
FILTERS: list[dict[str, Any]] = [
    {"color": "red"},
    {"color": {"$eq": "red"}},
    {"color": {"$ne": "red"}},
    {"score": {"$gt": 3.0}},
    {"score": {"$gte": 3.0}},
    {"score": {"$lt": 4.5}},
    {"score": {"$lte": 4.5}},
    {"score": {"$gt": 1, "$lt": 5}},
    {"color": "red", "score": {"$gte": 5}},
    {"n": 2},
    {"n": 2**60},
    {"n": {"$gte": 2**60}},
    {"n": {"$gt": 2}},
    {"ok": True},
    {"ok": False},
    {"ok": {"$ne": True}},
    {"color": None},
    {"meta": {"lang": "en"}},
    {"meta": {"lang": "en", "v": 3}},
    {"tags": ["x", "y"]},
    {"tags": ["x"]},
    {"long": "z" * 2000},
    {"long": {"$ne": "z"}},
    {"missing": {"$ne": 1}},
    {"missing": 1},
    {},
]


@pytest.mark.parametrize("flt", FILTERS, ids=[str(f)[:60] for f in FILTERS])
def test_filters_agree_with_the_in_memory_store(store: TiermemStore, flt: dict[str, Any]) -> None:
    results = []
    for s in _both(store):
        for key, value in ITEMS.items():
            s.put(("f", key[0]), key, value)
        results.append(sorted(it.key for it in s.search(("f",), filter=flt, limit=50)))
    assert results[0] == results[1]
    # With a query the filter keeps the same items, ranked.
    assert (
        sorted(it.key for it in store.search(("f",), query="red blue green", filter=flt, limit=50))
        == results[0]
    )


def test_filters_checked_in_the_client_page_through_enough(store: TiermemStore) -> None:
    """A filter the server cannot apply (a nested object here) is made up in the client: the store
    reads on (more timeline pages, a larger search) until enough items pass."""
    store.batch(
        [
            PutOp(("p", f"n{i % 3}"), f"k{i:03}", {"text": f"walrus {i}", "meta": {"hit": i < 4}})
            for i in range(150)
        ]
    )
    newest_hits = ["k003", "k002", "k001", "k000"]
    flt = {"meta": {"hit": True}}
    assert [it.key for it in store.search(("p",), filter=flt, limit=3)] == newest_hits[:3]
    assert [it.key for it in store.search(("p",), filter=flt, limit=3, offset=2)] == newest_hits[2:]
    assert sorted(it.key for it in store.search(("p",), query="walrus", filter=flt, limit=4)) == sorted(
        newest_hits
    )


def test_filters_with_json_types(store: TiermemStore) -> None:
    """Where LangGraph's in-memory store uses Python's rules (True == 1, float() of strings), the
    store uses JSON's: booleans are not numbers, strings order among strings."""
    for key, value in ITEMS.items():
        store.put(("f",), key, value)

    def keys(flt: dict[str, Any], query: str | None = None) -> list[str]:
        return sorted(it.key for it in store.search(("f",), filter=flt, query=query, limit=50))

    assert keys({"ok": 1}) == []
    assert keys({"n": True}) == []
    assert keys({"color": {"$gt": "green"}}) == ["a", "c"]
    assert keys({"color": {"$lt": 5}}) == []
    assert keys({"ok": {"$gt": False}}) == []
    assert keys({"long": {"$gt": "y"}}, query="z") == ["d"]  # a long string: checked in the client
    with pytest.raises(ValueError, match=r"\$regex"):
        store.search(("f",), filter={"color": {"$regex": "r.*"}})


def test_filters_split_between_server_and_client() -> None:
    where, complete = lg_filters.where({"color": "red", "n": {"$gt": 2, "$lte": 9}})
    assert complete
    assert where == {
        "$or": [
            {"metadata.langgraph.unmirrored": True},
            {
                "$and": [
                    {"metadata.value.color": {"$eq": "red"}},
                    {"metadata.value.n": {"$gt": 2}},
                    {"metadata.value.n": {"$lte": 9}},
                ]
            },
        ]
    }
    for partial in [
        {"meta": {"lang": "en"}},
        {"x": None},
        {"x": [1]},
        {"x": "z" * 600},
        {"x": 2**60},
        {"b": {"$gt": True}},
    ]:
        where, complete = lg_filters.where(partial)
        assert where is None and not complete
    assert lg_filters.where(None) == (None, True)


def test_values_mirror_scalars_within_limits() -> None:
    stored = lg_values.store("k", {f"f{i}": i for i in range(100)}, None, None, 1.0)
    assert len(stored.metadata) <= lg_values.METADATA_KEYS and stored.metadata["langgraph.unmirrored"] is True
    stored = lg_values.store("k", {"a": 1, "b": [1], "c": None, "d": math.nan, "e": {"x": 1}}, None, 5, 1.0)
    assert stored.metadata == {
        "langgraph.key": "k",
        "langgraph.updated_at": 1.0,
        "langgraph.ttl_minutes": 5.0,
        "value.a": 1,
    }
    loaded = lg_values.load(stored.content, stored.metadata)
    assert math.isnan(loaded.pop("d")) and loaded == {"a": 1, "b": [1], "c": None, "e": {"x": 1}}
    assert lg_values.load("not json", {}) == {"content": "not json"}


# -- list_namespaces -------------------------------------------------------------------------------
NAMESPACES = [
    ("a", "b", "c"),
    ("a", "b", "d", "e"),
    ("a", "b", "d", "i"),
    ("a", "b", "f"),
    ("a", "c", "f"),
    ("b", "a", "f"),
    ("users", "123"),
    ("users", "456", "settings"),
    ("admin", "users", "789"),
]
LISTINGS: list[dict[str, Any]] = [
    {},
    {"prefix": ("a", "b")},
    {"prefix": ("a", "b"), "max_depth": 3},
    {"prefix": ("a",), "max_depth": 2},
    {"max_depth": 1},
    {"max_depth": 0},
    {"suffix": ("f",)},
    {"prefix": ("a",), "suffix": ("f",)},
    {"prefix": ("a", "*", "f")},
    {"prefix": ("*", "b")},
    {"suffix": ("*", "f")},
    {"suffix": ("users", "*")},
    {"prefix": ("users",), "max_depth": 2},
    {"limit": 3},
    {"limit": 3, "offset": 3},
    {"offset": 20},
    {"prefix": ("nothing",)},
    {"prefix": ("a", "b", "c", "d")},
]


def test_list_namespaces_agrees_with_the_in_memory_store(store: TiermemStore) -> None:
    stores = _both(store)
    for s in stores:
        for i, ns in enumerate(NAMESPACES):
            s.put(ns, f"k{i}", {"i": i})
    for listing in LISTINGS:
        got, expected = (s.list_namespaces(**listing) for s in stores)
        assert got == expected, listing
    store.delete(("b", "a", "f"), "k5")  # a namespace emptied is gone
    assert ("b", "a", "f") not in store.list_namespaces()


def test_list_namespaces_skips_namespaces_no_label_maps_to(
    target: str, raw: MemoryClient, make: Callable[..., TiermemStore]
) -> None:
    raw.create("v1.2/x", "another client's memory")
    raw.create("plain/ns", "another client's memory")
    with make(target) as s:
        s.put(("mine",), "k", {"v": 1})
        assert s.list_namespaces() == [("mine",), ("plain", "ns")]  # tiermem's namespaces, without '.'
        assert [it.key for it in s.search(())] == ["k"]  # only the store's kind of memory


# -- batches ---------------------------------------------------------------------------------------
def test_batch_with_mixed_ops_agrees_with_the_in_memory_store(store: TiermemStore) -> None:
    ops_before = [PutOp(("b", "x"), "k1", {"v": 1}), PutOp(("b", "y"), "k2", {"v": 2})]
    ops = [
        GetOp(("b", "x"), "k1"),
        PutOp(("b", "x"), "k1", {"v": 10}),
        GetOp(("b", "x"), "k1"),  # reads see the state before the batch's writes
        SearchOp(("b",), filter={"v": {"$gte": 2}}),
        PutOp(("b", "z"), "k3", {"v": 3}),
        PutOp(("b", "y"), "k2", None),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("b",)),)),
        PutOp(("b", "z"), "k3", {"v": 30}),  # the last put of a key wins
        GetOp(("b", "nowhere"), "k"),
    ]

    def summary(result: Any) -> Any:
        if isinstance(result, list):
            return [summary(r) for r in result]
        if result is None or isinstance(result, tuple):
            return result
        return (result.namespace, result.key, result.value)

    outcomes = []
    for s in _both(store):
        s.batch(ops_before)
        outcomes.append(
            (
                [summary(r) for r in s.batch(ops)],
                [
                    summary(s.get(ns, k))
                    for ns, k in [(("b", "x"), "k1"), (("b", "y"), "k2"), (("b", "z"), "k3")]
                ],
            )
        )
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][1] == [(("b", "x"), "k1", {"v": 10}), None, (("b", "z"), "k3", {"v": 30})]


def test_batch_puts_of_new_and_existing_keys(store: TiermemStore, raw: MemoryClient) -> None:
    store.put(("b",), "k2", {"v": "old"})
    store.batch([PutOp(("b",), f"k{i}", {"v": i}) for i in range(5)])  # k2 exists: one by one
    assert [store.get(("b",), f"k{i}").value for i in range(5)] == [{"v": i} for i in range(5)]  # type: ignore[union-attr]
    assert len(list(raw.list_memories(f"{PREFIX}/b"))) == 5


@pytest.mark.parametrize("bad", [{"when": datetime(2026, 1, 1)}, {"n": 10**5000}, {(1, 2): "x"}])
def test_a_batch_with_a_value_json_cannot_carry_changes_nothing(store: TiermemStore, bad: dict) -> None:
    """A value JSON cannot carry (a datetime, an integer past Python's digit limit, a tuple key)
    fails its batch before anything is written: the batch's deletes too."""
    store.put(("b",), "keep", {"v": 1})
    ops = [PutOp(("b",), "keep", None), PutOp(("b",), "new", {"v": 2}), PutOp(("b",), "bad", bad)]
    with pytest.raises((TypeError, ValueError)):
        store.batch(ops)
    assert store.get(("b",), "keep").value == {"v": 1}  # type: ignore[union-attr]
    assert store.get(("b",), "new") is None


def test_an_indexed_field_of_invisible_characters_alone_is_stored_unindexed(store: TiermemStore) -> None:
    """A value whose indexed text shows nothing (a zero-width space) is stored as one with no text
    to search: the server refuses such content, so it must not be sent as the memory's content."""
    store.put(("b",), "k", {"text": "\u200b\ufeff", "body": "x"}, index=["text"])
    assert store.get(("b",), "k").value == {"text": "\u200b\ufeff", "body": "x"}  # type: ignore[union-attr]
    assert [i.key for i in store.search(("b",), filter={"body": "x"})] == ["k"]


def test_invalid_namespaces_are_refused(store: TiermemStore) -> None:
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "x"), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.batch([PutOp(("a.b",), "k", {"v": 1})])  # not ("a", "b")
    with pytest.raises(InvalidNamespaceError):
        store.batch([GetOp(("",), "k")])
    with pytest.raises(ValueError):
        store.batch([SearchOp(("a",), limit=-1)])
    assert store.get((), "k") is None


# -- TTL -------------------------------------------------------------------------------------------
def _expiry(raw: MemoryClient, ns: str, key: str) -> float | None:
    memory = raw.get(f"{PREFIX}/{ns}", lg_keys.memory_id(key))
    return (
        memory.expire_time.seconds + memory.expire_time.nanos / 1e9
        if memory.HasField("expire_time")
        else None
    )


def test_ttl_is_the_memory_expire_time(store: TiermemStore, raw: MemoryClient) -> None:
    assert store.supports_ttl
    start = time.time()
    store.put(("t",), "k", {"v": 1}, ttl=1)
    expiry = _expiry(raw, "t", "k")
    assert expiry is not None and start + 60 <= expiry <= time.time() + 60
    time.sleep(0.05)
    assert store.get(("t",), "k", refresh_ttl=False) is not None
    assert _expiry(raw, "t", "k") == expiry
    item = store.get(("t",), "k")  # a read refreshes the TTL
    refreshed = _expiry(raw, "t", "k")
    assert item is not None and refreshed is not None and refreshed > expiry
    assert item.updated_at.timestamp() < start + 1  # a refresh is no update
    store.search(("t",), query="v")
    assert _expiry(raw, "t", "k") > refreshed  # type: ignore[operator]
    store.put(("t",), "k", {"v": 2})  # no TTL any more
    assert _expiry(raw, "t", "k") is None
    store.get(("t",), "k")
    assert _expiry(raw, "t", "k") is None


def test_an_item_is_gone_after_its_ttl(store: TiermemStore) -> None:
    store.put(("t",), "short", {"v": 1}, ttl=0.002)  # 120 ms
    store.put(("t",), "long", {"v": 2}, ttl=10)
    assert store.get(("t",), "short", refresh_ttl=False) is not None
    time.sleep(0.3)
    assert store.get(("t",), "short") is None
    assert [it.key for it in store.search(("t",))] == ["long"]
    assert [it.key for it in store.search(("t",), query="v")] == ["long"]
    store.put(("t",), "short", {"v": 3})  # the key is free again
    assert store.get(("t",), "short").value == {"v": 3}  # type: ignore[union-attr]


def test_ttl_config_default_ttl(target: str, raw: MemoryClient, make: Callable[..., TiermemStore]) -> None:
    with make(target, namespace_prefix=PREFIX, ttl={"default_ttl": 5, "refresh_on_read": False}) as s:
        start = time.time()
        s.put(("t",), "k", {"v": 1})
        expiry = _expiry(raw, "t", "k")
        assert expiry is not None and start + 300 <= expiry <= time.time() + 300
        s.get(("t",), "k")
        assert _expiry(raw, "t", "k") == expiry  # refresh_on_read False
        s.put(("t",), "forever", {"v": 1}, ttl=None)
        assert _expiry(raw, "t", "forever") is None


@pytest.mark.parametrize("default", [-5, 0, "5", True, float("nan")])
def test_a_ttl_config_whose_default_no_put_could_take_is_refused_at_once(
    target: str, raw: MemoryClient, default: Any
) -> None:
    """A default_ttl that would fail every put taking it is a ValueError when the store is made."""
    with pytest.raises(ValueError, match="default_ttl"):
        TiermemStore(target, namespace_prefix=PREFIX, ttl={"default_ttl": default})


# -- async and graphs ------------------------------------------------------------------------------
def test_async_api(store: TiermemStore) -> None:
    async def run() -> None:
        await store.aput(("users", "ana"), "a", {"text": "Ana collects vintage stamps"})
        await asyncio.gather(
            *(store.aput(("users", "bob"), f"b{i}", {"text": f"Bob note {i}"}) for i in range(5))
        )
        item = await store.aget(("users", "ana"), "a")
        assert item is not None and item.value == {"text": "Ana collects vintage stamps"}
        found = await store.asearch(("users",), query="stamp collection", limit=3)
        assert found[0].key == "a"
        assert len(await store.asearch(("users", "bob"), limit=10)) == 5
        assert await store.alist_namespaces(prefix=("users",)) == [("users", "ana"), ("users", "bob")]
        await store.adelete(("users", "ana"), "a")
        assert await store.aget(("users", "ana"), "a") is None
        results = await store.abatch([GetOp(("users", "bob"), "b1"), SearchOp(("users",), limit=2)])
        assert results[0].value == {"text": "Bob note 1"}  # type: ignore[union-attr]
        assert len(results[1]) == 2  # type: ignore[arg-type]

    asyncio.run(run())


def test_an_async_client_per_event_loop_closed_with_the_store(target: str) -> None:
    """The async path opens an AsyncMemoryClient on each event loop using the store (a grpc.aio
    channel belongs to its loop): loops one after another, two at once in two threads, one kept
    running in a thread; close() closes them, and the store cannot be used after."""
    store = TiermemStore(target, namespace_prefix=PREFIX)

    async def put_get(key: str) -> Any:
        await store.aput(("loops",), key, {"v": key})
        item = await store.aget(("loops",), key)
        return None if item is None else item.value

    assert asyncio.run(put_get("a")) == {"v": "a"}
    assert asyncio.run(put_get("b")) == {"v": "b"}  # a new loop (the first loop's client went with it)
    got: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda k=k: got.__setitem__(k, asyncio.run(put_get(k)))) for k in "cd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {"c": {"v": "c"}, "d": {"v": "d"}}
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    try:
        assert asyncio.run_coroutine_threadsafe(put_get("e"), loop).result() == {"v": "e"}
        assert sorted(it.key for it in store.search(("loops",))) == list("abcde")  # (the sync path too)
        store.close()
        for attempt in (
            lambda: asyncio.run_coroutine_threadsafe(store.aget(("loops",), "a"), loop).result(),
            lambda: asyncio.run(store.aget(("loops",), "a")),
            lambda: store.get(("loops",), "a"),
        ):
            with pytest.raises(RuntimeError, match="closed"):
                attempt()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def test_closing_the_store_fails_the_calls_under_way(server_factory: Callable[..., Any]) -> None:
    """aclose() (async with) or close() from another thread while calls are under way: they fail
    with TiermemError CANCELLED; a task cancelled by its caller raises CancelledError."""
    running = server_factory()
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        c.wait_ready()
    with front_server(running, (Delay(0.5),)) as (port, _):
        slow = f"127.0.0.1:{port}"

        async def main() -> None:
            async with TiermemStore(slow, namespace_prefix=PREFIX) as store:
                under_way = asyncio.ensure_future(store.aget(("x",), "k"))
                searching = asyncio.ensure_future(store.asearch(("x",)))
                cancelled = asyncio.ensure_future(store.aget(("x",), "k"))
                await asyncio.sleep(0.2)
                cancelled.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await cancelled
                await store.aclose()
                for task in (under_way, searching):
                    with pytest.raises(TiermemError) as e:
                        await task
                    assert e.value.code == grpc.StatusCode.CANCELLED

        asyncio.run(main())

        store = TiermemStore(slow, namespace_prefix=PREFIX)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever)
        thread.start()
        try:
            under_way = asyncio.run_coroutine_threadsafe(store.aget(("x",), "k"), loop)
            time.sleep(0.2)
            store.close()  # closes that loop's client there
            with pytest.raises(TiermemError) as e:
                under_way.result()
            assert e.value.code == grpc.StatusCode.CANCELLED
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()


def test_abatch_makes_independent_calls_at_once(server_factory: Callable[..., Any]) -> None:
    """The reads of a batch on the async path are under way together (the sync path: in turn)."""
    running = server_factory()
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        c.wait_ready()
    with front_server(running, (Delay(0.3),)) as (port, _), TiermemStore(f"127.0.0.1:{port}") as store:
        ops = [GetOp(("x",), f"k{i}") for i in range(6)]

        async def both() -> float:
            await store.aget(("x",), "warm")  # (the loop's client opened and connected)
            began = time.monotonic()
            assert await store.abatch(ops) == [None] * 6
            return time.monotonic() - began

        took = asyncio.run(both())
        began = time.monotonic()
        assert store.batch(ops) == [None] * 6
        assert time.monotonic() - began >= 6 * 0.3 > 1.2 > took


class State(TypedDict):
    user: str
    fact: str
    recalled: list[str]


def _graph(store: BaseStore) -> Any:
    def remember(state: State, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        ns = ("users", state["user"], "memories")
        runtime.store.put(ns, f"m{len(runtime.store.search(ns, limit=100))}", {"text": state["fact"]})
        return {}

    def recall(state: State, runtime: Runtime[None]) -> dict[str, Any]:
        assert runtime.store is not None
        found = runtime.store.search(("users", state["user"]), query=state["fact"], limit=1)
        return {"recalled": [it.value["text"] for it in found]}

    builder = StateGraph(State)
    builder.add_node("remember", remember)
    builder.add_node("recall", recall)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", "recall")
    builder.add_edge("recall", END)
    return builder.compile(store=store)


def test_a_graph_uses_the_store(store: TiermemStore) -> None:
    graph = _graph(store)
    graph.invoke({"user": "ana", "fact": "Ana's dog is called Pretzel", "recalled": []})
    out = graph.invoke({"user": "ana", "fact": "Ana drinks oolong tea every morning", "recalled": []})
    assert out["recalled"] == ["Ana drinks oolong tea every morning"]
    assert sorted(it.value["text"] for it in store.search(("users", "ana"))) == [
        "Ana drinks oolong tea every morning",
        "Ana's dog is called Pretzel",
    ]
    out = asyncio.run(graph.ainvoke({"user": "bob", "fact": "Bob sails on weekends", "recalled": []}))
    assert out["recalled"] == ["Bob sails on weekends"]
    assert store.list_namespaces(suffix=("memories",)) == [
        ("users", "ana", "memories"),
        ("users", "bob", "memories"),
    ]


def test_shares_a_client(target: str, make: Callable[..., TiermemStore]) -> None:
    with MemoryClient(target) as c:
        s = make(client=c, namespace_prefix="shared")
        s.put(("n",), "k", {"v": 1})  # (async: the client's calls on worker threads)
        s.close()  # not the client's owner: the client stays open
        assert c.get("shared/n", "k").kind == "langgraph_item"
        with pytest.raises(ValueError):
            TiermemStore(client=c, api_key="secret")


def test_a_read_key_reads_items_with_a_ttl(
    server_factory: Callable[..., Any], tmp_path: Any, make: Callable[..., TiermemStore]
) -> None:
    """A read's TTL refresh is best effort: a read-only key still gets the item."""
    from tiermem.server.security.keys import add_key

    keys = tmp_path / "keys.jsonl"
    writer, reader = add_key(keys, ["app"], "write"), add_key(keys, ["app"], "read")
    running = server_factory(api_keys=str(keys))
    target = f"127.0.0.1:{running.port}"
    make(target, api_key=writer, namespace_prefix="app").put(("u",), "k", {"v": 1}, ttl=5)
    ro = make(target, api_key=reader, namespace_prefix="app")
    item = ro.get(("u",), "k")
    assert item is not None and item.value == {"v": 1}
    assert [i.key for i in ro.search(("u",))] == ["k"]


def test_puts_and_deletes_racing_on_one_key_never_fail(store: TiermemStore) -> None:
    import threading

    errors: list[BaseException] = []

    def churn(i: int) -> None:
        try:
            for j in range(25):
                if (i + j) % 2:
                    store.put(("race",), "k", {"i": i, "j": j})
                else:
                    store.delete(("race",), "k")
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    store.put(("race",), "k", {"final": True})
    item = store.get(("race",), "k")
    assert item is not None and item.value == {"final": True}


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


def test_a_namespace_too_long_to_hold_items_reads_as_empty(store: TiermemStore) -> None:
    """As LangGraph's InMemoryStore: nothing there (a put says why it cannot store there)."""
    long = ("\u00fc" * 50,)  # (encoded, past the 256 characters a namespace may have)
    assert store.get(long, "k") is None
    store.delete(long, "k")
    assert store.search(long) == []
    with pytest.raises(InvalidArgumentError):
        store.put(long, "k", {"v": 1})


def test_a_put_the_store_could_not_read_back_is_refused_and_writes_nothing(store: TiermemStore) -> None:
    """A value nested past what JSON decoding reads, a value that is no dict, a bad ttl, or a long
    key that is not valid Unicode text: a clear error before anything is stored (a deep value was
    stored, then broke every search over its namespace)."""
    store.put(("deep",), "ok", {"text": "hi", "nested": _nested(lg_values.MAX_DEPTH - 1)})
    leaf = _nested(lg_values.MAX_DEPTH - 1)  # the deepest object holding a scalar: still MAX_DEPTH levels
    inner = leaf
    while inner:
        inner = inner["a"]
    inner["x"] = 1
    store.put(("deep-leaf",), "leaf", {"nested": leaf})
    assert store.get(("deep-leaf",), "leaf") is not None
    bad: list[tuple[str, Any, Any, type[Exception]]] = [
        ("deep", _nested(lg_values.MAX_DEPTH + 1), None, ValueError),
        ("deeper", _nested(985), None, ValueError),
        ("list", [1, 2], None, TypeError),
        ("ttl-negative", {"v": 1}, -1, ValueError),
        ("ttl-zero", {"v": 1}, 0, ValueError),
        ("ttl-nan", {"v": 1}, math.nan, ValueError),
        ("ttl-huge", {"v": 1}, 1e300, ValueError),
        ("ttl-str", {"v": 1}, "5", ValueError),
        ("ttl-bool", {"v": 1}, True, ValueError),
        ("\ud800" * 200, {"v": 1}, None, ValueError),
    ]
    for key, value, ttl, error in bad:
        with pytest.raises(error):
            store.put(("deep",), key, value, ttl=ttl)
        with pytest.raises(error):  # in a batch, its other puts are not stored either
            store.batch([PutOp(("deep",), "batched", {"v": 2}), PutOp(("deep",), key, value, ttl=ttl)])
        assert store.get(("deep",), key[:100]) is None and store.get(("deep",), "batched") is None
    assert [it.key for it in store.search(("deep",))] == ["ok"]
    assert [it.key for it in store.search(("deep",), query="hi")] == ["ok"]


def test_a_short_key_with_a_lone_surrogate_round_trips(store: TiermemStore) -> None:
    store.batch([PutOp(("s",), "ok", {"v": 4}), PutOp(("s",), "a\ud800b", {"v": 3})])
    item = store.get(("s",), "a\ud800b")
    assert item is not None and item.key == "a\ud800b" and item.value == {"v": 3}
    assert sorted(it.key for it in store.search(("s",))) == ["a\ud800b", "ok"]


def test_an_index_or_a_query_of_the_wrong_type_is_refused(store: TiermemStore) -> None:
    """``index="text"`` was taken as the paths t, e, x, t (the item silently unsearchable); a query
    that is no str, or not valid Unicode text, failed from deep inside."""
    with pytest.raises(TypeError, match="index"):
        store.put(("q",), "a", {"text": "harbour boats"}, index="text")  # type: ignore[arg-type]
    assert store.get(("q",), "a") is None
    store.put(("q",), "a", {"text": "harbour boats"}, index=["text"])
    with pytest.raises(TypeError, match="query"):
        store.search(("q",), query=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="query"):
        store.search(("q",), query="harbour \ud800")
    assert [it.key for it in store.search(("q",), query="harbour")] == ["a"]


def test_an_unsupported_filter_is_refused_even_where_nothing_is_stored(store: TiermemStore) -> None:
    with pytest.raises(ValueError, match=r"\$regex"):
        store.search(("nothing", "here"), filter={"color": {"$regex": "r.*"}})
    with pytest.raises(ValueError, match=r"\$regex"):
        store.search(("nothing", "here"), query="red", filter={"color": {"$regex": "r.*"}})
