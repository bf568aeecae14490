"""Graph memory (nodes, edges with validity intervals, breadth-first neighbourhoods) and context
assembly (BuildContext: budget split across scopes, section order, de-duplication, summaries, recent
windows, semantic hits, graph facts, head/tail, accounting, accesses, input validation).

Everything goes through real gRPC with the generated stubs; time is a FakeClock. Expected values are
computed here from the rules in the proto and server/context.py's docstring, not read back from the
server's own helpers.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from conftest import FakeClock
from google.protobuf.timestamp_pb2 import Timestamp

from tiermem.client import MemoryClient
from tiermem.client.errors import TiermemError, from_rpc_error
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

T0 = 1_700_000_000.0
KINDS = ("summary", "recent", "semantic", "graph", "important", "overflow")


# -- helpers ------------------------------------------------------------------------------------
@dataclass
class Env:
    running: RunningServer
    client: MemoryClient
    clock: FakeClock

    @property
    def stub(self) -> Any:
        return self.client.stub


@pytest.fixture
def env(server_factory: Callable[..., RunningServer]) -> Iterator[Env]:
    clock = FakeClock(T0)
    running = server_factory(clock=clock)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        yield Env(running, c, clock)


def _ts(seconds: float) -> Timestamp:
    return Timestamp(seconds=int(seconds), nanos=round((seconds - int(seconds)) * 1e9))


def _secs(ts: Timestamp) -> float:
    return ts.seconds + ts.nanos / 1e9


def _fail(method: Any, request: Any) -> TiermemError:
    with pytest.raises(grpc.RpcError) as info:
        method(request, timeout=30)
    return from_rpc_error(info.value)


def _tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / 4)


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _node(
    stub: Any, ns: str, node_id: str, label: str = "", memory_ids: Sequence[str] = (), **props: Any
) -> Any:
    node = pb.GraphNode(id=node_id, label=label, memory_ids=list(memory_ids))
    for key, value in props.items():
        slot = node.properties[key]
        if isinstance(value, bool):
            slot.bool_value = value
        elif isinstance(value, int):
            slot.int_value = value
        elif isinstance(value, float):
            slot.double_value = value
        else:
            slot.string_value = value
    return stub.UpsertGraphNode(pb.UpsertGraphNodeRequest(namespace=ns, node=node), timeout=30).node


def _edge_msg(
    src: str,
    rel: str,
    dst: str,
    valid_from: float | None = None,
    invalid_from: float | None = None,
    memory_ids: Sequence[str] = (),
) -> pb.GraphEdge:
    e = pb.GraphEdge(source_id=src, target_id=dst, relation=rel, memory_ids=list(memory_ids))
    if valid_from is not None:
        e.valid_from.CopyFrom(_ts(valid_from))
    if invalid_from is not None:
        e.invalid_from.CopyFrom(_ts(invalid_from))
    return e


def _edge(stub: Any, ns: str, src: str, rel: str, dst: str, **kw: Any) -> Any:
    req = pb.AddGraphEdgeRequest(namespace=ns, edge=_edge_msg(src, rel, dst, **kw))
    return stub.AddGraphEdge(req, timeout=30).edge


def _neighbors(
    stub: Any,
    ns: str,
    node_id: str,
    depth: int = 0,
    limit: int = 0,
    as_of: float | None = None,
    include_invalid: bool = False,
) -> Any:
    req = pb.GetGraphNeighborsRequest(
        namespace=ns, node_id=node_id, depth=depth, limit=limit, include_invalid=include_invalid
    )
    if as_of is not None:
        req.as_of.CopyFrom(_ts(as_of))
    return stub.GetGraphNeighbors(req, timeout=30)


def _ids(resp: Any) -> list[str]:
    return [n.id for n in resp.nodes]


def _triples(resp: Any) -> set[tuple[str, str, str]]:
    return {(e.source_id, e.relation, e.target_id) for e in resp.edges}


def _mem(
    stub: Any, ns: str, content: str, tokens: int = 10, kind: str = "", importance: float = 0.5
) -> pb.Memory:
    m = pb.Memory(namespace=ns, content=content, kind=kind, token_cost=tokens, importance=importance)
    resp = stub.CreateMemory(pb.CreateMemoryRequest(memory=m, allow_duplicates=True), timeout=30)
    return resp.memory


def _scope(namespace: str, **kw: Any) -> pb.ContextScope:
    return pb.ContextScope(namespace=namespace, **kw)


def _ctx_req(
    scopes: Sequence[str | pb.ContextScope],
    budget: int,
    query: str = "",
    head_tail: int = 0,
    graph_facts: bool | None = None,
    read_only: bool = False,
) -> pb.BuildContextRequest:
    req = pb.BuildContextRequest(
        token_budget=budget, query_text=query, head_tail=head_tail, read_only=read_only
    )
    for s in scopes:
        req.scopes.append(_scope(s) if isinstance(s, str) else s)
    if graph_facts is not None:
        req.graph_facts = graph_facts
    return req


def _ctx(stub: Any, scopes: Sequence[str | pb.ContextScope], budget: int, **kw: Any) -> Any:
    return stub.BuildContext(_ctx_req(scopes, budget, **kw), timeout=30)


def _section(resp: Any, ns: str, kind: str) -> list[Any]:
    """The items of one section (empty when the section is absent)."""
    items: list[Any] = []
    for s in resp.sections:
        if s.namespace == ns and s.kind == kind:
            items.extend(s.items)
    return items


def _sec_ids(resp: Any, ns: str, kind: str) -> list[str]:
    return [x.memory_id for x in _section(resp, ns, kind)]


def _all_ids(resp: Any) -> list[str]:
    return [x.memory_id for s in resp.sections for x in s.items if x.memory_id]


def _check_package(resp: Any, budget: int, scopes: Sequence[str]) -> None:
    """Invariants every package must satisfy."""
    assert resp.tokens_used <= budget
    assert resp.tokens_used == sum(s.tokens for s in resp.sections)
    for s in resp.sections:
        assert s.tokens == sum(x.tokens for x in s.items), s
        assert s.kind in KINDS
        assert s.namespace in scopes
    # Per scope (in request order): summary, recent, semantic, graph.
    keys = [(list(scopes).index(s.namespace), KINDS.index(s.kind)) for s in resp.sections]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    # Nothing twice: neither the same memory nor the same normalized text.
    mids = [(s.namespace, x.memory_id) for s in resp.sections for x in s.items if x.memory_id]
    assert len(mids) == len(set(mids))
    texts = [_norm(x.text) for s in resp.sections for x in s.items]
    assert len(texts) == len(set(texts))
    assert resp.candidate_tokens >= resp.tokens_used
    expected_ratio = resp.tokens_used / resp.candidate_tokens if resp.candidate_tokens else 1.0
    assert resp.compression_ratio == pytest.approx(expected_ratio)


# -- graph: nodes and edges ---------------------------------------------------------------------
def test_upsert_node_stores_typed_properties_and_replaces_on_second_upsert(env: Env) -> None:
    s = env.stub
    n = _node(s, "g", "ana", "person", ["m1", "m2"], name="Ana", age=33, score=0.25, active=True)
    assert (n.id, n.label, list(n.memory_ids)) == ("ana", "person", ["m1", "m2"])
    kinds = {k: v.WhichOneof("kind") for k, v in n.properties.items()}
    assert kinds == {
        "name": "string_value",
        "age": "int_value",
        "score": "double_value",
        "active": "bool_value",
    }
    assert n.properties["name"].string_value == "Ana"
    assert n.properties["age"].int_value == 33
    assert n.properties["score"].double_value == 0.25
    assert n.properties["active"].bool_value is True
    assert _secs(n.update_time) == pytest.approx(T0)

    env.clock.advance(60)
    n2 = _node(s, "g", "ana", "engineer", ["m3"], team="infra")
    assert (n2.label, list(n2.memory_ids), dict(n2.properties).keys()) == ("engineer", ["m3"], {"team"})
    assert _secs(n2.update_time) == pytest.approx(T0 + 60)
    # The stored node is the replacement, not a merge of both writes.
    stored = _neighbors(s, "g", "ana").nodes[0]
    assert stored.label == "engineer" and list(stored.memory_ids) == ["m3"]
    assert set(stored.properties) == {"team"} and stored.properties["team"].string_value == "infra"
    assert _secs(stored.update_time) == pytest.approx(T0 + 60)

    err = _fail(s.UpsertGraphNode, pb.UpsertGraphNodeRequest(namespace="g", node=pb.GraphNode(id="")))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["node.id"]


def test_edge_needs_both_nodes_a_relation_and_a_sane_interval(env: Env) -> None:
    s = env.stub
    _node(s, "g", "a")

    def add(edge: pb.GraphEdge) -> TiermemError:
        return _fail(s.AddGraphEdge, pb.AddGraphEdgeRequest(namespace="g", edge=edge))

    err = add(_edge_msg("a", "knows", "ghost"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")
    assert "edge.target_id" in err.message and "ghost" in err.message
    err = add(_edge_msg("ghost", "knows", "a"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")
    assert "edge.source_id" in err.message and "ghost" in err.message

    _node(s, "g", "b")
    err = add(_edge_msg("a", "", "b"))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["edge.relation"]
    # invalid_from must come after valid_from (explicit, or the default "now").
    for vf, inv in [(T0 - 100, T0 - 100), (T0 - 100, T0 - 200), (None, T0), (None, T0 - 1)]:
        err = add(_edge_msg("a", "knows", "b", valid_from=vf, invalid_from=inv))
        assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["edge.invalid_from"], (vf, inv)
    # None of the rejected edges was stored.
    resp = _neighbors(s, "g", "a", include_invalid=True)
    assert _ids(resp) == ["a"] and not resp.edges

    e = _edge(s, "g", "a", "knows", "b", memory_ids=["m9"])
    assert len(e.id) == 32 and all(c in "0123456789abcdef" for c in e.id)
    assert (e.source_id, e.relation, e.target_id, list(e.memory_ids)) == ("a", "knows", "b", ["m9"])
    assert _secs(e.valid_from) == pytest.approx(T0) and _secs(e.create_time) == pytest.approx(T0)
    assert not e.HasField("invalid_from")
    e2 = _edge(s, "g", "a", "knew", "b", valid_from=T0 - 100, invalid_from=T0 - 99)
    assert _secs(e2.invalid_from) == pytest.approx(T0 - 99)


def _bfs_levels(edges: Sequence[tuple[str, str]], start: str) -> dict[str, int]:
    """Reference model: undirected breadth-first distances from start."""
    adj: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
        adj[b].add(a)
    level, queue = {start: 0}, [start]
    for n in queue:
        for m in sorted(adj[n]):
            if m not in level:
                level[m] = level[n] + 1
                queue.append(m)
    return level


def test_neighbors_breadth_first_by_depth_with_limit(env: Env) -> None:
    s = env.stub
    # a - b - c - d - e, plus x -> a (an incoming edge), b -> y and a cycle y -> c.
    pairs = [("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("x", "a"), ("b", "y"), ("y", "c")]
    for n in "abcdexy":
        _node(s, "g", n, label=f"node {n}")
    for src, dst in pairs:
        _edge(s, "g", src, "to", dst)
    level = _bfs_levels(pairs, "a")
    assert level == {"a": 0, "b": 1, "x": 1, "c": 2, "y": 2, "d": 3, "e": 4}

    for depth in (1, 2, 3):
        resp = _neighbors(s, "g", "a", depth=depth)
        ids = _ids(resp)
        assert ids[0] == "a"
        assert len(ids) == len(set(ids))
        assert set(ids) == {n for n, lv in level.items() if lv <= depth}, depth
        assert [level[n] for n in ids] == sorted(level[n] for n in ids), ids  # breadth first
        walked = {(src, dst) for src, dst in pairs if min(level[src], level[dst]) < depth}
        assert {(e.source_id, e.target_id) for e in resp.edges} == walked, depth
        assert len(resp.edges) == len(walked)  # each edge once
    # Default depth is 1.
    assert set(_ids(_neighbors(s, "g", "a"))) == {"a", "b", "x"}
    # From the middle of the chain.
    resp = _neighbors(s, "g", "d", depth=2)
    assert set(_ids(resp)) == {n for n, lv in _bfs_levels(pairs, "d").items() if lv <= 2}

    # limit counts the start node; the nodes kept are a breadth-first prefix.
    ordered = sorted(level, key=level.__getitem__)
    for limit in (1, 2, 3, 4, 5):
        resp = _neighbors(s, "g", "a", depth=3, limit=limit)
        ids = _ids(resp)
        assert len(ids) == limit and ids[0] == "a"
        assert [level[n] for n in ids] == sorted(level[n] for n in ids)
        cut = level[ids[-1]]
        assert {n for n in ordered if level[n] < cut} <= set(ids)
        assert all(e.source_id in ids and e.target_id in ids for e in resp.edges)
    assert set(_ids(_neighbors(s, "g", "a", depth=3, limit=3))) == {"a", "b", "x"}

    err = _fail(s.GetGraphNeighbors, pb.GetGraphNeighborsRequest(namespace="g", node_id="a", depth=6))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["depth"]
    err = _fail(s.GetGraphNeighbors, pb.GetGraphNeighborsRequest(namespace="g", node_id="zz"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")


def test_edges_outside_their_validity_interval_are_skipped_unless_include_invalid(env: Env) -> None:
    s = env.stub
    for n in ("p", "future", "past", "now"):
        _node(s, "g", n)
    _edge(s, "g", "p", "will_know", "future", valid_from=T0 + 100)
    _edge(s, "g", "p", "knew", "past", valid_from=T0 - 200, invalid_from=T0 - 100)
    _edge(s, "g", "p", "knows", "now")  # valid from T0 (creation)

    def at(as_of: float | None = None, include_invalid: bool = False) -> set[str]:
        resp = _neighbors(s, "g", "p", as_of=as_of, include_invalid=include_invalid)
        assert {e.target_id for e in resp.edges} == set(_ids(resp)) - {"p"}
        return set(_ids(resp)) - {"p"}

    assert at() == {"now"}
    assert at(include_invalid=True) == {"future", "past", "now"}
    assert at(T0 + 150) == {"future", "now"}
    assert at(T0 - 150) == {"past"}
    assert at(T0 - 150, include_invalid=True) == {"future", "past", "now"}
    # [valid_from, invalid_from): the start counts, the end does not.
    assert at(T0 + 100) == {"future", "now"}
    assert at(T0 + 99.5) == {"now"}
    assert at(T0 - 100) == set()
    assert at(T0 - 200) == {"past"}
    # "now" follows the server clock.
    env.clock.advance(100)
    assert at() == {"future", "now"}


def test_invalidated_edge_drops_out_of_current_answers_but_stays_in_history(env: Env) -> None:
    s = env.stub
    for n in ("ana", "apollo", "zeus"):
        _node(s, "g", n)
    old = _edge(s, "g", "ana", "works_on", "apollo")
    env.clock.advance(1000)
    t1 = T0 + 1000
    inv = s.InvalidateGraphEdge(pb.InvalidateGraphEdgeRequest(namespace="g", edge_id=old.id), timeout=30).edge
    assert inv.id == old.id and _secs(inv.invalid_from) == pytest.approx(t1)
    assert _secs(inv.valid_from) == pytest.approx(T0)
    _edge(s, "g", "ana", "works_on", "zeus")

    def targets(**kw: Any) -> set[str]:
        return {e.target_id for e in _neighbors(s, "g", "ana", **kw).edges}

    assert targets() == {"zeus"}
    assert targets(as_of=t1) == {"zeus"}
    assert targets(as_of=T0 + 500) == {"apollo"}
    assert targets(include_invalid=True) == {"apollo", "zeus"}
    hist = {e.target_id: e for e in _neighbors(s, "g", "ana", include_invalid=True).edges}
    assert _secs(hist["apollo"].invalid_from) == pytest.approx(t1)
    assert not hist["zeus"].HasField("invalid_from")

    # An explicit end time, and the errors.
    env.clock.advance(10)
    zeus = hist["zeus"]
    req = pb.InvalidateGraphEdgeRequest(namespace="g", edge_id=zeus.id, invalid_from=_ts(t1 + 5))
    assert _secs(s.InvalidateGraphEdge(req, timeout=30).edge.invalid_from) == pytest.approx(t1 + 5)
    assert targets() == set() and targets(as_of=t1 + 4) == {"zeus"}
    req = pb.InvalidateGraphEdgeRequest(namespace="g", edge_id=zeus.id, invalid_from=_ts(t1))
    err = _fail(s.InvalidateGraphEdge, req)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and err.fields == ["invalid_from"]
    err = _fail(s.InvalidateGraphEdge, pb.InvalidateGraphEdgeRequest(namespace="g", edge_id="nope"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "EDGE_NOT_FOUND")
    # An edge id is only known in its own namespace.
    err = _fail(s.InvalidateGraphEdge, pb.InvalidateGraphEdgeRequest(namespace="other", edge_id=old.id))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "EDGE_NOT_FOUND")


def test_graph_namespaces_are_isolated_and_deleted_with_the_namespace(env: Env) -> None:
    s = env.stub
    for ns, label, rel in [("team", "t", "knows"), ("team/sub", "ts", "helps"), ("other", "o", "hates")]:
        _node(s, ns, "n1", label=f"{label}1")
        _node(s, ns, "n2", label=f"{label}2")
        _edge(s, ns, "n1", rel, "n2")
    _node(s, "team", "only_team")
    _mem(s, "team", "a memory of the team scope")

    for ns, label, rel in [("team", "t", "knows"), ("team/sub", "ts", "helps"), ("other", "o", "hates")]:
        resp = _neighbors(s, ns, "n1")
        assert [n.label for n in resp.nodes] == [f"{label}1", f"{label}2"]
        assert _triples(resp) == {("n1", rel, "n2")}
    err = _fail(s.GetGraphNeighbors, pb.GetGraphNeighborsRequest(namespace="other", node_id="only_team"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")
    err = _fail(
        s.AddGraphEdge, pb.AddGraphEdgeRequest(namespace="other", edge=_edge_msg("n1", "x", "only_team"))
    )
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")

    s.DeleteNamespace(pb.DeleteNamespaceRequest(namespace="team"), timeout=30)
    for node in ("n1", "n2", "only_team"):
        err = _fail(s.GetGraphNeighbors, pb.GetGraphNeighborsRequest(namespace="team", node_id=node))
        assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")
    # Neither a child scope (without include_children) nor another namespace is touched.
    assert _triples(_neighbors(s, "team/sub", "n1")) == {("n1", "helps", "n2")}
    assert _triples(_neighbors(s, "other", "n1")) == {("n1", "hates", "n2")}
    # Nodes can be written again from scratch, without the old edges.
    _node(s, "team", "n1")
    assert _ids(_neighbors(s, "team", "n1", include_invalid=True)) == ["n1"]

    s.DeleteNamespace(pb.DeleteNamespaceRequest(namespace="team", include_children=True), timeout=30)
    err = _fail(s.GetGraphNeighbors, pb.GetGraphNeighborsRequest(namespace="team/sub", node_id="n1"))
    assert (err.code, err.reason) == (grpc.StatusCode.NOT_FOUND, "NODE_NOT_FOUND")
    assert _triples(_neighbors(s, "other", "n1")) == {("n1", "hates", "n2")}


# -- context assembly -----------------------------------------------------------------------------
def test_package_never_exceeds_the_budget_and_its_token_counts_add_up(env: Env) -> None:
    s = env.stub
    cost: dict[tuple[str, str], int] = {}

    def add(ns: str, text: str, tokens: int, kind: str = "") -> pb.Memory:
        m = _mem(s, ns, text, tokens, kind)
        cost[(ns, m.id)] = tokens
        env.clock.advance(1)
        return m

    task_costs = [3, 8, 1, 15, 6, 9, 2, 11, 4, 7]
    task = [add("inv/task", f"task note {i}: deploy service step {i}", c) for i, c in enumerate(task_costs)]
    add("inv/task", "summary of the task so far: deploy service", 12, "summary")
    for i, c in enumerate([5, 13, 2, 9, 4, 6]):
        add("inv/proj", f"project fact {i} about the deploy service", c)
    add("inv/proj", "TASK NOTE 3:   deploy service step 3", 15)  # same normalized text as a task note
    add("inv/proj", "project summary", 20, "summary")
    for i, c in enumerate([4, 7, 3, 10]):
        add("inv/user", f"user preference {i} for service deploys", c)
    _node(s, "inv/task", "svc", memory_ids=[m.id for m in task[:6]])
    _node(s, "inv/task", "db")
    _node(s, "inv/task", "team-x")
    _edge(s, "inv/task", "svc", "depends_on", "db")
    _edge(s, "inv/task", "team-x", "owns", "svc")

    names = ["inv/task", "inv/proj", "inv/user"]
    scopes = [
        _scope("inv/task"),
        _scope("inv/proj", recent_window=3),
        _scope("inv/user", semantic_k=4),
    ]
    for budget in (5, 7, 13, 20, 37, 50, 99, 150, 250, 500):
        for head_tail in (0, 1, 3):
            resp = _ctx(s, scopes, budget, query="deploy service", head_tail=head_tail)
            _check_package(resp, budget, names)
            for sec in resp.sections:
                for x in sec.items:
                    if x.memory_id:
                        assert x.tokens == cost[(sec.namespace, x.memory_id)]
                    else:
                        assert sec.kind == "graph" and x.tokens == _tokens(x.text)
    # A big budget takes everything there is and shows every kind but the overflow summary (nothing
    # is left out to summarize).
    resp = _ctx(s, scopes, 500, query="deploy service")
    assert {sec.kind for sec in resp.sections if sec.items} == set(KINDS) - {"overflow"}
    assert _section(resp, "inv/task", "summary")[0].text == "summary of the task so far: deploy service"
    facts = {x.text for x in _section(resp, "inv/task", "graph")}
    assert facts == {"svc depends_on db", "team-x owns svc"}


def test_default_shares_split_the_budget_by_position(env: Env) -> None:
    s = env.stub
    mems: dict[str, list[pb.Memory]] = {}
    for ns in ("s1", "s2", "s3"):
        mems[ns] = []
        for i in range(10):
            mems[ns].append(_mem(s, ns, f"{ns} event number {i}", 10))
            env.clock.advance(1)
    scopes = [_scope(ns, recent_window=10) for ns in ("s1", "s2", "s3")]
    resp = _ctx(s, scopes, 100)
    _check_package(resp, 100, ["s1", "s2", "s3"])
    # 0.4 / 0.4 / 0.2 of 100 tokens, newest first: 4, 4 and 2 memories of 10 tokens.
    for ns, n in (("s1", 4), ("s2", 4), ("s3", 2)):
        assert _sec_ids(resp, ns, "recent") == [m.id for m in mems[ns][::-1][:n]], ns
    assert resp.tokens_used == 100
    assert resp.candidate_tokens == 300
    assert resp.compression_ratio == pytest.approx(100 / 300)
    # Budget shares round down: 0.4*25 = 10, 0.4*25 = 10, 0.2*25 = 5 -> 1, 1, 0 memories.
    resp = _ctx(s, scopes, 25)
    assert [len(_section(resp, ns, "recent")) for ns in ("s1", "s2", "s3")] == [1, 1, 0]


def test_unused_tokens_carry_over_to_the_next_scope(env: Env) -> None:
    s = env.stub
    mems: dict[str, list[pb.Memory]] = {"s2": [], "s3": []}
    for ns, n in (("s2", 7), ("s3", 10)):
        for i in range(n):
            mems[ns].append(_mem(s, ns, f"{ns} carried event {i}", 10))
            env.clock.advance(1)
    scopes = [
        _scope("empty", recent_window=10),
        _scope("s2", recent_window=10),
        _scope("s3", recent_window=10),
    ]
    resp = _ctx(s, scopes, 100)
    _check_package(resp, 100, ["empty", "s2", "s3"])
    assert not [x for sec in resp.sections if sec.namespace == "empty" for x in sec.items]
    # s2: its 40 + the first scope's unused 40 = 80 >= its 70 tokens, all taken; 10 left over.
    assert _sec_ids(resp, "s2", "recent") == [m.id for m in mems["s2"][::-1]]
    # s3: its 20 + 10 carried = 30 -> its 3 newest.
    assert _sec_ids(resp, "s3", "recent") == [m.id for m in mems["s3"][::-1][:3]]
    assert resp.tokens_used == 100

    # Without the empty first scope, s2 gets 40 and s3 40 (default shares for positions 0, 1).
    resp = _ctx(s, scopes[1:], 100)
    assert len(_section(resp, "s2", "recent")) == 4 and len(_section(resp, "s3", "recent")) == 4


def test_custom_shares(env: Env) -> None:
    s = env.stub
    mems: dict[str, list[pb.Memory]] = {"a": [], "b": []}
    for ns in mems:
        for i in range(10):
            mems[ns].append(_mem(s, ns, f"{ns} custom share event {i}", 10))
            env.clock.advance(1)

    def counts(share_a: float, share_b: float, budget: int = 100) -> tuple[int, int]:
        scopes = [
            _scope("a", recent_window=10, share=share_a),
            _scope("b", recent_window=10, share=share_b),
        ]
        resp = _ctx(s, scopes, budget)
        _check_package(resp, budget, ["a", "b"])
        return len(_section(resp, "a", "recent")), len(_section(resp, "b", "recent"))

    assert counts(0.7, 0.3) == (7, 3)
    assert counts(0.1, 0.5) == (1, 5)
    assert counts(0.0, 0.3) == (0, 3)
    assert counts(1.0, 0.0) == (10, 0)
    assert counts(0.2, 0.2) == (2, 2)  # shares below 1 leave part of the budget unused
    assert counts(1.0, 1.0) == (5, 5)  # shares above 1 in total are scaled down
    # An explicit share on one scope, the default (0.4 at position 1) on the other.
    resp = _ctx(s, [_scope("a", recent_window=10, share=0.3), _scope("b", recent_window=10)], 100)
    assert (len(_section(resp, "a", "recent")), len(_section(resp, "b", "recent"))) == (3, 4)


def test_nothing_appears_twice_across_sections_and_scopes(env: Env) -> None:
    s = env.stub
    notes = []
    for i in range(4):
        notes.append(_mem(s, "d1", f"database migration note {i}", 5))
        env.clock.advance(1)
    # Recent takes the 2 newest; semantic finds all 4 but may only add the 2 older ones.
    scopes = [_scope("d1", recent_window=2, semantic_k=4)]
    resp = _ctx(s, scopes, 1000, query="database migration note")
    _check_package(resp, 1000, ["d1"])
    assert _sec_ids(resp, "d1", "recent") == [notes[3].id, notes[2].id]
    assert sorted(_sec_ids(resp, "d1", "semantic")) == sorted([notes[0].id, notes[1].id])
    assert sorted(_all_ids(resp)) == sorted(m.id for m in notes)

    # The same content (up to case and whitespace) in a second scope appears once, in the first.
    _mem(s, "d2", "DATABASE  migration\tNOTE 3", 5)
    other = _mem(s, "d2", "a different project memory", 5)
    scopes2 = [_scope("d1", recent_window=4), _scope("d2", recent_window=4)]
    resp = _ctx(s, scopes2, 1000)
    _check_package(resp, 1000, ["d1", "d2"])
    assert _sec_ids(resp, "d2", "recent") == [other.id]
    # ... but it is there when the first scope does not carry it.
    alone = _ctx(s, [_scope("d2", recent_window=4)], 1000)
    assert len(_section(alone, "d2", "recent")) == 2

    # A graph fact whose text equals a memory already taken is not repeated.
    fact_mem = _mem(s, "d3", "ana works_on apollo", 5)
    _node(s, "d3", "ana", memory_ids=[fact_mem.id])
    _node(s, "d3", "apollo")
    _node(s, "d3", "zeus")
    _edge(s, "d3", "ana", "works_on", "apollo")
    _edge(s, "d3", "ana", "likes", "zeus")
    resp = _ctx(s, [_scope("d3", recent_window=5)], 1000)
    _check_package(resp, 1000, ["d3"])
    assert _sec_ids(resp, "d3", "recent") == [fact_mem.id]
    assert [x.text for x in _section(resp, "d3", "graph")] == ["ana likes zeus"]


def test_recent_window_is_newest_first_and_the_current_summary_comes_first(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock(T0)
    running = server_factory(clock=clock, summary_token_threshold=30)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        s = c.stub
        obs, dues = [], []
        for i in range(3):
            m = pb.Memory(namespace="sess", content=f"session event {i}", token_cost=10, importance=0.5)
            r = s.CreateMemory(pb.CreateMemoryRequest(memory=m), timeout=30)
            obs.append(r.memory)
            dues.append(r.summary_due)
            clock.advance(10)
        assert dues == [False, False, False]  # 10, 20, 30 tokens: due only beyond the threshold of 30
        s1 = _mem(s, "sess", "first summary: three events", 6, "summary")
        st = s.GetStats(pb.GetStatsRequest(namespace="sess"), timeout=30)
        assert (st.summary_tokens, st.summary_due) == (0, False)
        clock.advance(10)
        for i in range(3, 6):
            obs.append(_mem(s, "sess", f"session event {i}", 10))
            clock.advance(10)

        resp = _ctx(s, [_scope("sess", recent_window=4)], 1000)
        _check_package(resp, 1000, ["sess"])
        assert resp.sections[0].kind == "summary"
        assert [x.memory_id for x in resp.sections[0].items] == [s1.id]
        # The 4 newest memories that are not summaries (the summary is newer than obs[0..2]).
        assert _sec_ids(resp, "sess", "recent") == [m.id for m in obs[::-1][:4]]
        # A window larger than the scope takes all of it, still without the summary.
        resp = _ctx(s, [_scope("sess", recent_window=50)], 1000)
        assert _sec_ids(resp, "sess", "recent") == [m.id for m in obs[::-1]]
        assert _all_ids(resp).count(s1.id) == 1
        # recent_window 0: no recent section items; the rest of the share takes the scope's other
        # memories, most important first, then most recent (here all rated 0.5).
        resp = _ctx(s, [_scope("sess", recent_window=0)], 1000)
        assert _sec_ids(resp, "sess", "recent") == []
        assert _sec_ids(resp, "sess", "important") == [m.id for m in obs[::-1]]
        assert _all_ids(resp).count(s1.id) == 1

        # A second summary replaces the first everywhere.
        s2 = _mem(s, "sess", "second summary: six events", 6, "summary")
        resp = _ctx(s, [_scope("sess", recent_window=50, semantic_k=10)], 1000, query="summary events")
        _check_package(resp, 1000, ["sess"])
        assert _sec_ids(resp, "sess", "summary") == [s2.id]
        assert s1.id not in _all_ids(resp)
        assert _sec_ids(resp, "sess", "recent") == [m.id for m in obs[::-1]]
        # Each scope brings its own summary, first in its part of the package.
        s3 = _mem(s, "proj", "project summary", 4, "summary")
        resp = _ctx(s, [_scope("sess", recent_window=2), _scope("proj")], 1000)
        assert [(sec.namespace, sec.kind) for sec in resp.sections if sec.items] == [
            ("sess", "summary"),
            ("sess", "recent"),
            ("sess", "important"),  # the rest of the session's share: its other 4 events
            ("proj", "summary"),
        ]
        assert _sec_ids(resp, "proj", "summary") == [s3.id]


def test_semantic_k_and_its_defaults(env: Env) -> None:
    s = env.stub
    by_ns: dict[str, list[pb.Memory]] = {}
    for ns in ("k1", "k2", "k3", "k4"):
        by_ns[ns] = [_mem(s, ns, f"{ns} kubernetes rollout item {i}", 3) for i in range(8)]
    query = "kubernetes rollout item"
    scopes = [_scope(ns, recent_window=0) for ns in ("k1", "k2", "k3", "k4")]
    resp = _ctx(s, scopes, 1000, query=query)
    _check_package(resp, 1000, ["k1", "k2", "k3", "k4"])
    # Defaults by position: 5, 3, 2, then 2.
    assert [len(_section(resp, ns, "semantic")) for ns in ("k1", "k2", "k3", "k4")] == [5, 3, 2, 2]
    for ns in ("k1", "k2", "k3", "k4"):
        assert set(_sec_ids(resp, ns, "semantic")) <= {m.id for m in by_ns[ns]}

    for k in (0, 1, 3, 8):
        resp = _ctx(s, [_scope("k1", recent_window=0, semantic_k=k)], 1000, query=query)
        assert len(_section(resp, "k1", "semantic")) == k
    # Without a query there is no semantic recall.
    resp = _ctx(s, [_scope("k1", recent_window=0, semantic_k=5)], 1000)
    assert not _section(resp, "k1", "semantic")
    # The best match for an exact query comes first.
    target = by_ns["k2"][6]
    resp = _ctx(s, [_scope("k2", recent_window=0, semantic_k=1)], 1000, query=target.content)
    assert _sec_ids(resp, "k2", "semantic") == [target.id]


def test_graph_facts_come_from_nodes_linked_to_chosen_memories_and_valid_edges(env: Env) -> None:
    s = env.stub
    ns = "gf"
    elsewhere = _mem(s, "gf2", "a memory of another namespace", 4)
    bob_mem = _mem(s, ns, "Bob joined the team last week", 8)
    env.clock.advance(1)
    ana_mem = _mem(s, ns, "Ana leads the platform team", 8)
    env.clock.advance(1)
    for n in ("ana", "bob", "apollo", "carol", "dave", "zeus", "eve", "x", "y"):
        links = {"ana": [ana_mem.id], "bob": [bob_mem.id], "x": [elsewhere.id]}.get(n, [])
        _node(s, ns, n, memory_ids=links)
    now = T0 + 2
    _edge(s, ns, "ana", "works_on", "apollo")  # valid since now
    _edge(s, ns, "carol", "manages", "ana")  # an edge into a linked node
    _edge(s, ns, "ana", "reported_to", "eve", valid_from=now - 100, invalid_from=now - 10)  # ended
    _edge(s, ns, "ana", "will_mentor", "dave", valid_from=now + 100)  # not yet
    superseded = _edge(s, ns, "ana", "uses", "zeus", valid_from=now - 50)
    _edge(s, ns, "bob", "works_on", "zeus")
    _edge(s, ns, "x", "knows", "y")  # linked only to a memory of another namespace
    s.InvalidateGraphEdge(pb.InvalidateGraphEdgeRequest(namespace=ns, edge_id=superseded.id), timeout=30)
    env.clock.advance(1)

    def facts(resp: Any) -> set[str]:
        items = _section(resp, ns, "graph")
        assert all(x.memory_id == "" and x.tokens == _tokens(x.text) for x in items)
        return {x.text for x in items}

    # Only ana's memory is chosen (window 1): ana's valid facts, nothing of bob or x.
    resp = _ctx(s, [_scope(ns, recent_window=1)], 1000)
    _check_package(resp, 1000, [ns])
    assert _sec_ids(resp, ns, "recent") == [ana_mem.id]
    assert facts(resp) == {"ana works_on apollo", "carol manages ana"}
    # With bob's memory chosen too, bob's fact joins.
    resp = _ctx(s, [_scope(ns, recent_window=2)], 1000)
    assert facts(resp) == {"ana works_on apollo", "carol manages ana", "bob works_on zeus"}
    # A fact that becomes valid later shows up then.
    env.clock.advance(100)
    resp = _ctx(s, [_scope(ns, recent_window=1)], 1000)
    assert facts(resp) == {"ana works_on apollo", "carol manages ana", "ana will_mentor dave"}
    # graph_facts=false: no facts at all.
    resp = _ctx(s, [_scope(ns, recent_window=2)], 1000, graph_facts=False)
    assert not [x for sec in resp.sections if sec.kind == "graph" for x in sec.items]
    # No chosen memories (budget too small for any): no facts.
    resp = _ctx(s, [_scope(ns, recent_window=2)], 7)
    _check_package(resp, 7, [ns])
    assert not _all_ids(resp) and not facts(resp)
    # A graph's facts stay in its namespace: choosing gf2's memory brings no fact of gf's node x.
    resp = _ctx(s, [_scope("gf2", recent_window=2), _scope(ns, recent_window=2)], 1000)
    _check_package(resp, 1000, ["gf2", ns])
    assert _sec_ids(resp, "gf2", "recent") == [elsewhere.id]
    assert not _section(resp, "gf2", "graph")
    assert "x knows y" not in facts(resp)


def test_head_tail_keeps_both_ends_of_an_overflowing_section(env: Env) -> None:
    s = env.stub
    m = []
    for i in range(6):
        m.append(_mem(s, "ht", f"head tail event {i}", 10))
        env.clock.advance(1)
    newest_first = [x.id for x in m[::-1]]  # the recent section's order: m5 .. m0

    def recent(budget: int, head_tail: int) -> list[str]:
        resp = _ctx(s, [_scope("ht", recent_window=6, share=1.0)], budget, head_tail=head_tail)
        _check_package(resp, budget, ["ht"])
        return _sec_ids(resp, "ht", "recent")

    n = newest_first
    assert recent(30, 0) == n[:3]
    assert recent(30, 1) == [n[0], n[1], n[5]]  # first and last, then the middle in order
    assert recent(40, 1) == [n[0], n[1], n[2], n[5]]
    assert recent(40, 2) == [n[0], n[1], n[4], n[5]]
    assert recent(50, 2) == [n[0], n[1], n[2], n[4], n[5]]
    assert recent(60, 2) == n  # everything fits: nothing to choose
    assert recent(20, 1) == [n[0], n[5]]


def test_compression_ratio_is_tokens_used_over_candidate_tokens(env: Env) -> None:
    s = env.stub
    for i in range(6):
        _mem(s, "cr", f"compression event {i}", 10)
        env.clock.advance(1)
    resp = _ctx(s, [_scope("cr", recent_window=6, share=1.0)], 30)
    assert (resp.tokens_used, resp.candidate_tokens) == (30, 60)
    assert resp.compression_ratio == pytest.approx(0.5)
    resp = _ctx(s, [_scope("cr", recent_window=6, share=1.0)], 1000)
    assert (resp.tokens_used, resp.candidate_tokens, resp.compression_ratio) == (60, 60, 1.0)
    # No candidates at all: 0 tokens used, ratio 1.
    resp = _ctx(s, ["nothing-here"], 100)
    assert (resp.tokens_used, resp.candidate_tokens, resp.compression_ratio) == (0, 0, 1.0)


def test_candidate_tokens_count_each_candidate_once(env: Env) -> None:
    s = env.stub
    for i in range(6):
        _mem(s, "cr", f"compression event {i}", 10)
        env.clock.advance(1)
    scope = _scope("cr", recent_window=6, semantic_k=6, share=1.0)
    resp = _ctx(s, [scope], 30, query="compression event")
    assert resp.tokens_used == 30
    # There are only 60 tokens of material in the scope: 6 distinct candidates of 10 tokens.
    assert resp.candidate_tokens == 60
    assert resp.compression_ratio == pytest.approx(0.5)


def test_building_a_context_counts_accesses_unless_read_only(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock(T0)
    running = server_factory(clock=clock, search_records_access=True)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        s = c.stub
        mems = []
        for i in range(4):
            mems.append(_mem(s, "acc", f"access counted event {i}", 10))
            clock.advance(1)
        _node(s, "acc", "n", memory_ids=[mems[3].id])
        _node(s, "acc", "m")
        _edge(s, "acc", "n", "rel", "m")
        running.engine.flush_access()

        def counts() -> list[int]:
            return [
                s.GetMemory(pb.GetMemoryRequest(namespace="acc", id=m.id), timeout=30).memory.access_count
                for m in mems
            ]

        assert counts() == [0, 0, 0, 0]
        clock.advance(100)
        # 20 tokens: the two newest are included (m3, m2); the two older ones are only candidates,
        # also for the semantic section (read-only search inside), and the graph fact does not fit.
        scope = _scope("acc", recent_window=4, semantic_k=4, share=1.0)
        resp = _ctx(s, [scope], 20, query="access counted event")
        assert sorted(_all_ids(resp)) == sorted([mems[3].id, mems[2].id])
        running.engine.flush_access()
        assert counts() == [0, 0, 1, 1]
        got = s.GetMemory(pb.GetMemoryRequest(namespace="acc", id=mems[3].id), timeout=30).memory
        assert _secs(got.last_access_time) == pytest.approx(T0 + 104)

        resp = _ctx(s, [scope], 20, query="access counted event", read_only=True)
        assert sorted(_all_ids(resp)) == sorted([mems[3].id, mems[2].id])
        running.engine.flush_access()
        assert counts() == [0, 0, 1, 1]

        resp = _ctx(s, [scope], 1000, query="access counted event")
        assert len(_all_ids(resp)) == 4
        running.engine.flush_access()
        assert counts() == [1, 1, 2, 2]


@pytest.mark.parametrize(
    "build,field",
    [
        (lambda: _ctx_req([], 100), "scopes"),
        (lambda: _ctx_req([f"ns{i}" for i in range(9)], 100), "scopes"),
        (lambda: _ctx_req(["a"], 0), "token_budget"),
        (lambda: _ctx_req(["a"], -5), "token_budget"),
        (lambda: _ctx_req(["a", _scope("b", share=1.5)], 100), "scopes[1].share"),
        (lambda: _ctx_req([_scope("a", share=-0.1)], 100), "scopes[0].share"),
        (lambda: _ctx_req(["a"], 100, head_tail=-1), "head_tail"),
        (lambda: _ctx_req([_scope("a", semantic_k=101)], 100), "scopes[0].semantic_k"),
        (lambda: _ctx_req(["a", _scope("b", recent_window=-1)], 100), "scopes[1].recent_window"),
        (lambda: _ctx_req(["a", "bad namespace!"], 100), "scopes[1].namespace"),
    ],
)
def test_build_context_rejects_bad_input_naming_the_field(
    client: MemoryClient, build: Callable[[], pb.BuildContextRequest], field: str
) -> None:
    err = _fail(client.stub.BuildContext, build())
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert err.fields == [field]


def test_eight_scopes_are_accepted(env: Env) -> None:
    s = env.stub
    names = [f"eight{i}" for i in range(8)]
    for ns in names:
        _mem(s, ns, f"memory of {ns}", 2)
    resp = _ctx(s, [_scope(ns, recent_window=1) for ns in names], 100)
    _check_package(resp, 100, names)
    assert resp.tokens_used > 0
