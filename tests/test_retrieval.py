"""Retrieval end to end through real gRPC: the JSON ``where`` filter language, search strategies,
scopes (namespace ancestors), the exactness of the weighted ranking on the ANN path, batch search,
searches counted as accesses, and the search hit rate.

Expectations are computed here, independently of the server code: filters by a small Python
evaluator of the grammar over the memories fetched with ListMemories; scores with NumPy from the
contract in proto/tiermem/v1/memory.proto (relevance = cosine, recency = exp(-age/tau), importance
decayed by the tier's half-life with a floor of 0.1 * importance).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from conftest import FakeClock
from google.protobuf import field_mask_pb2

from tiermem.client import InvalidArgumentError, MemoryClient, NotFoundError
from tiermem.client.client import build_filter, build_memory, metadata_dict
from tiermem.client.errors import from_rpc_error
from tiermem.server.config import ServerConfig
from tiermem.server.search.searcher import Turns
from tiermem.server.transport.app import RunningServer, create_server
from tiermem.v1 import memory_pb2 as pb

T0 = 1_700_000_000.0  # FakeClock's default start
MODEL = "t"
DIM = 8
HALF_LIFE = {1: 1.0, 2: 24.0, 3: 168.0, 4: 720.0}
FLOOR = 0.1
DEFAULT_TIER_W = {1: 1.0, 2: 0.85, 3: 0.7, 4: 0.55}
TAU = 86400.0


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(running: RunningServer) -> Iterator[MemoryClient]:
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=60) as c:
        c.wait_ready()
        yield c


def raw(c: MemoryClient, method: str, request: Any) -> Any:
    """Call a generated stub method directly, converting failures like the client does."""
    try:
        return getattr(c.stub, method)(request, timeout=60)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def ts(t: Any) -> float:
    return t.seconds + t.nanos / 1e9


def set_ts(target: Any, seconds: float) -> None:
    target.seconds = int(seconds // 1)
    target.nanos = round((seconds - int(seconds // 1)) * 1e9)


def unit(v: Any) -> np.ndarray:
    a = np.asarray(v, np.float64)
    return a / np.linalg.norm(a)


def key(m: pb.Memory) -> tuple[str, str]:
    return (m.namespace, m.id)


def rkeys(results: Any) -> list[tuple[str, str]]:
    return [key(r.memory) for r in results]


def rids(results: Any) -> list[str]:
    return [r.memory.id for r in results]


def list_all(c: MemoryClient, ns: str, **flt: Any) -> list[pb.Memory]:
    out: list[pb.Memory] = []
    token = ""
    while True:
        page, token = c.list_page(ns, page_size=1000, page_token=token, **flt)
        out.extend(page)
        if not token:
            return out


def sreq(
    namespaces: str | list[str],
    q: Any = None,
    model: str = MODEL,
    *,
    where: Any = None,
    tiers: tuple[Any, ...] = (),
    as_of: float | None = None,
    tier_weights: dict[int, float] | None = None,
    scope_weights: list[float] | None = None,
    **fields: Any,
) -> pb.SearchMemoriesRequest:
    """A SearchMemoriesRequest with the new fields (strategy, weights, scopes, explain, read_only)."""
    r = pb.SearchMemoriesRequest(namespaces=[namespaces] if isinstance(namespaces, str) else list(namespaces))
    if q is not None:
        r.query_embedding.extend([float(x) for x in q])
        r.embedding_model = model
    r.filter.CopyFrom(build_filter(tiers=tiers, where=where))
    if as_of is not None:
        set_ts(r.as_of, as_of)
    for t, w in (tier_weights or {}).items():
        r.tier_weights.add(tier=t, weight=w)
    if scope_weights:
        r.scope_weights.extend(scope_weights)
    for name, value in fields.items():
        setattr(r, name, value)
    return r


def search(c: MemoryClient, *args: Any, **kw: Any) -> list[pb.SearchResult]:
    return list(raw(c, "SearchMemories", sreq(*args, **kw)).results)


def decayed(importance: float, tier: int, created: float, as_of: float) -> float:
    age_h = max(0.0, as_of - created) / 3600.0
    return max(importance * 0.5 ** (age_h / HALF_LIFE[tier]), FLOOR * importance)


def recency(last_access: float, as_of: float, tau: float = TAU) -> float:
    return math.exp(-max(0.0, as_of - last_access) / tau)


def expect_invalid(fn: Callable[[], Any], field: str) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as ei:
        fn()
    e = ei.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.fields, f"expected {field!r} in {e.fields} ({e.message})"
    return e


def rfc3339(t: float, offset_hours: int = 0) -> str:
    tz = dt.timezone(dt.timedelta(hours=offset_hours))
    s = dt.datetime.fromtimestamp(t, tz).isoformat()
    return s.replace("+00:00", "Z") if offset_hours == 0 else s


def start_server(data_dir: Path, clock: Callable[[], float], **overrides: Any) -> RunningServer:
    overrides.setdefault("maintenance_interval_seconds", 0)
    overrides.setdefault("search_records_access", False)
    overrides.setdefault("search_processes", 1)
    cfg = ServerConfig(host="127.0.0.1", port=0, data_dir=data_dir, **overrides)
    return create_server(cfg, clock=clock)


# --------------------------------------------------------------------------------------------
# 1. The filter language, against a Python evaluation of the grammar
# --------------------------------------------------------------------------------------------

FNS = "user:f"
KINDS = ["fact", "observation", "decision", "preference"]
SOURCES = ["agent-a", "agent-b", ""]
TOPICS = ["deploy", "ci", "", "db"]
TIER_NAMES = {"FAST": 1, "MEDIUM": 2, "SLOW": 3, "GLACIAL": 4}
N_FILTER = 48


def _tags(i: int) -> list[str]:
    out = [t for bit, t in ((1, "deploy"), (2, "ci"), (4, "urgent")) if i & bit]
    return [*out, "x"] if i % 7 == 0 else out


def _metadata(i: int) -> dict[str, Any]:
    md: dict[str, Any] = {}
    special = {2: 1400, 7: 1400.0, 12: "1400"}
    if i in special:
        md["build"] = special[i]
    elif i % 5 == 0:
        md["build"] = 1400 + i
    elif i % 5 == 1:
        md["build"] = 1400.5 + i
    elif i % 5 == 2:
        md["build"] = str(1390 + i)
    elif i % 5 == 3:
        md["build"] = i % 2 == 0
    env = ["prod", "dev", "staging", None][i % 4]
    if env is not None:
        md["env"] = env
    if i % 3 != 2:
        md["ok"] = i % 3 == 0
    if i % 2 == 0:
        md["score"] = i / 48
    return md


def _importance(i: int, rng: np.random.Generator) -> float | None:
    if i % 6 == 5:
        return None  # default 0.5
    if i % 6 == 4:
        return 0.7
    if i % 8 == 1:
        return 0.25
    return round(float(rng.uniform(0.05, 1.0)), 2)


@pytest.fixture(scope="module")
def fdata(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MemoryClient, list[pb.Memory], Any]]:
    """One server, namespace FNS with 48 varied memories (one deleted), plus a neighbour namespace."""
    clock = FakeClock()
    running = start_server(tmp_path_factory.mktemp("filters") / "data", clock)
    rng = np.random.default_rng(1)
    try:
        with connect(running) as c:
            specs = []
            for i in range(N_FILTER):
                specs.append(
                    build_memory(
                        FNS,
                        f"memory {i}",
                        id=f"m{i:02d}",
                        kind=KINDS[(i // 2) % 4],
                        tier=i % 4 + 1,
                        importance=_importance(i, rng),
                        source=SOURCES[i % 3],
                        topic=TOPICS[(i // 3) % 4],
                        tags=_tags(i),
                        metadata=_metadata(i),
                        embedding=rng.normal(size=4),
                        embedding_model=MODEL,
                        create_time=T0 - 3600.0 * (i + 1),
                    )
                )
            c.create_batch(specs)
            c.create_batch(
                [
                    build_memory(
                        "user:f2",
                        "elsewhere",
                        id=f"o{i}",
                        embedding=rng.normal(size=4),
                        embedding_model=MODEL,
                    )
                    for i in range(3)
                ]
            )
            # accesses, successes and surprise vary by memory; last_access_time too
            for i in range(0, N_FILTER, 3):
                clock.advance(60)
                items = [{"id": f"m{i:02d}", "actual_usefulness": (i % 5) / 5, "success": i % 2 == 0}]
                if i % 6 == 0:
                    items.append({"id": f"m{i:02d}", "actual_usefulness": 0.9, "success": i % 12 == 0})
                c.feedback(FNS, items)
            # later updates: update_time, tags and metadata change (and the filters must follow)
            clock.advance(3600)
            c.update(FNS, "m05", tags=["ci", "late"], metadata={"build": 1500, "env": "prod"})
            clock.advance(60)
            c.update(FNS, "m10", importance=0.75, metadata={})
            c.delete(FNS, "m11")
            mems = list_all(c, FNS)
            assert len(mems) == N_FILTER - 1
            yield c, mems, clock
    finally:
        running.stop(0)


# --- the reference evaluator -------------------------------------------------------------------


def _num_kind(v: Any) -> str:
    return "b" if isinstance(v, bool) else "n" if isinstance(v, int | float) else "s"


def _to_time(a: Any) -> float:
    if isinstance(a, str):
        t = dt.datetime.fromisoformat(a.replace("Z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.timezone.utc)
        return t.timestamp()
    return float(a)


def _cmp(op: str, x: Any, args: list[Any]) -> bool:
    if op == "$in":
        return any(x == a for a in args)
    if op == "$nin":
        return all(x != a for a in args)
    a = args[0]
    return {
        "$eq": x == a,
        "$ne": x != a,
        "$gt": x > a,
        "$gte": x >= a,
        "$lt": x < a,
        "$lte": x <= a,
    }[op]


def _field_value(m: pb.Memory, name: str) -> Any:
    if name in ("kind", "source", "topic"):
        return getattr(m, name)
    if name == "tier":
        return int(m.tier)
    if name in ("importance", "surprise_score"):
        return np.float32(getattr(m, name))  # stored as proto float: compare as float32
    if name in ("access_count", "success_count"):
        return int(getattr(m, name))
    if name in ("create_time", "update_time", "last_access_time"):
        return ts(getattr(m, name))
    raise AssertionError(name)


def _arg(name: str, a: Any) -> Any:
    if name == "tier" and isinstance(a, str):
        return TIER_NAMES[a.upper().removeprefix("TIER_")]
    if name in ("importance", "surprise_score"):
        return np.float32(a)
    if name in ("create_time", "update_time", "last_access_time"):
        return _to_time(a)
    return a


def _op_holds(m: pb.Memory, name: str, op: str, arg: Any) -> bool:
    args = arg if op in ("$in", "$nin", "$all") else [arg]
    if name == "tags":
        tags = set(m.tags)
        return {
            "$eq": lambda: args[0] in tags,
            "$ne": lambda: args[0] not in tags,
            "$in": lambda: any(a in tags for a in args),
            "$nin": lambda: not any(a in tags for a in args),
            "$all": lambda: all(a in tags for a in args),
        }[op]()
    if name.startswith("metadata."):
        md = metadata_dict(m)
        k = name[len("metadata.") :]
        if k not in md:
            return op in ("$ne", "$nin")
        x = md[k]
        same = [a for a in args if _num_kind(a) == _num_kind(x)]
        if op == "$in":
            return x in same
        if op == "$nin":
            return x not in same
        if not same:
            return op == "$ne"
        return _cmp(op, x, same)
    return _cmp(op, _field_value(m, name), [_arg(name, a) for a in args])


def py_match(m: pb.Memory, node: dict[str, Any]) -> bool:
    for k, v in node.items():
        if k == "$and":
            ok = all(py_match(m, n) for n in v)
        elif k == "$or":
            ok = any(py_match(m, n) for n in v)
        elif k == "$not":
            ok = not py_match(m, v)
        else:
            ops = v if isinstance(v, dict) and v and all(o.startswith("$") for o in v) else {"$eq": v}
            ok = all(_op_holds(m, k, op, a) for op, a in ops.items())
        if not ok:
            return False
    return True


# --- the cases ----------------------------------------------------------------------------------

C1 = T0 - 3600.0 * 10  # create_time of m09
C2 = T0 - 3600.0 * 30  # create_time of m29

FILTER_CASES: list[tuple[str, Any]] = [
    # kind / source / topic (strings)
    ("kind_implicit_eq", {"kind": "fact"}),
    ("kind_eq", {"kind": {"$eq": "decision"}}),
    ("kind_ne", {"kind": {"$ne": "fact"}}),
    ("kind_in", {"kind": {"$in": ["fact", "preference"]}}),
    ("kind_nin", {"kind": {"$nin": ["fact", "preference"]}}),
    ("kind_in_unknown", {"kind": {"$in": ["nope"]}}),
    ("kind_ne_unknown", {"kind": {"$ne": "nope"}}),
    ("source_eq", {"source": "agent-a"}),
    ("source_empty", {"source": ""}),
    ("source_ne", {"source": {"$ne": "agent-b"}}),
    ("source_in", {"source": {"$in": ["agent-b", ""]}}),
    ("source_nin", {"source": {"$nin": ["agent-b", "zzz"]}}),
    ("topic_eq", {"topic": {"$eq": "ci"}}),
    ("topic_ne", {"topic": {"$ne": "ci"}}),
    ("topic_in", {"topic": {"$in": ["ci", "db"]}}),
    ("topic_nin", {"topic": {"$nin": ["ci", "db"]}}),
    # tier by number and by name
    ("tier_num", {"tier": 2}),
    ("tier_name", {"tier": "SLOW"}),
    ("tier_enum_name", {"tier": "TIER_FAST"}),
    ("tier_lower_name", {"tier": "glacial"}),
    ("tier_ne", {"tier": {"$ne": "MEDIUM"}}),
    ("tier_gt", {"tier": {"$gt": 2}}),
    ("tier_gte_name", {"tier": {"$gte": "MEDIUM"}}),
    ("tier_lt_name", {"tier": {"$lt": "SLOW"}}),
    ("tier_lte", {"tier": {"$lte": 3}}),
    ("tier_in_mixed", {"tier": {"$in": [1, "GLACIAL"]}}),
    ("tier_nin_mixed", {"tier": {"$nin": ["FAST", 2]}}),
    # tags
    ("tags_implicit", {"tags": "deploy"}),
    ("tags_eq", {"tags": {"$eq": "urgent"}}),
    ("tags_ne", {"tags": {"$ne": "ci"}}),
    ("tags_in", {"tags": {"$in": ["urgent", "x"]}}),
    ("tags_nin", {"tags": {"$nin": ["deploy", "late"]}}),
    ("tags_all", {"tags": {"$all": ["deploy", "ci"]}}),
    ("tags_all_three", {"tags": {"$all": ["deploy", "ci", "urgent"]}}),
    ("tags_in_unknown", {"tags": {"$in": ["nope"]}}),
    ("tags_all_and_nin", {"tags": {"$all": ["ci"], "$nin": ["urgent"]}}),
    # importance (float32 column)
    ("imp_eq_default", {"importance": 0.5}),
    ("imp_eq_07", {"importance": {"$eq": 0.7}}),
    ("imp_ne", {"importance": {"$ne": 0.5}}),
    ("imp_gt", {"importance": {"$gt": 0.6}}),
    ("imp_gte_exact", {"importance": {"$gte": 0.7}}),
    ("imp_lt", {"importance": {"$lt": 0.3}}),
    ("imp_lte_exact", {"importance": {"$lte": 0.25}}),
    ("imp_in", {"importance": {"$in": [0.5, 0.25, 0.75]}}),
    ("imp_nin", {"importance": {"$nin": [0.5, 0.25]}}),
    ("imp_range", {"importance": {"$gt": 0.2, "$lt": 0.6}}),
    # surprise_score
    ("surprise_eq0", {"surprise_score": 0}),
    ("surprise_ne0", {"surprise_score": {"$ne": 0}}),
    ("surprise_gt", {"surprise_score": {"$gt": 0.1}}),
    ("surprise_gte", {"surprise_score": {"$gte": 0.05}}),
    ("surprise_lt", {"surprise_score": {"$lt": 0.1}}),
    ("surprise_lte", {"surprise_score": {"$lte": 0.0}}),
    ("surprise_in", {"surprise_score": {"$in": [0]}}),
    ("surprise_nin", {"surprise_score": {"$nin": [0]}}),
    # access_count / success_count
    ("access_eq", {"access_count": 1}),
    ("access_ne", {"access_count": {"$ne": 0}}),
    ("access_gt", {"access_count": {"$gt": 1}}),
    ("access_gte", {"access_count": {"$gte": 1}}),
    ("access_lt", {"access_count": {"$lt": 2}}),
    ("access_lte", {"access_count": {"$lte": 0}}),
    ("access_in", {"access_count": {"$in": [2, 7]}}),
    ("access_nin", {"access_count": {"$nin": [0, 2]}}),
    ("success_eq", {"success_count": {"$eq": 1}}),
    ("success_ne", {"success_count": {"$ne": 1}}),
    ("success_gt", {"success_count": {"$gt": 0}}),
    ("success_gte", {"success_count": {"$gte": 1}}),
    ("success_lt", {"success_count": {"$lt": 1}}),
    ("success_lte", {"success_count": {"$lte": 1}}),
    ("success_in", {"success_count": {"$in": [1]}}),
    ("success_nin", {"success_count": {"$nin": [1]}}),
    # times: epoch seconds and RFC 3339
    ("create_eq_epoch", {"create_time": C1}),
    ("create_eq_rfc", {"create_time": {"$eq": rfc3339(C1)}}),
    ("create_ne_rfc", {"create_time": {"$ne": rfc3339(C1)}}),
    ("create_gt_epoch", {"create_time": {"$gt": C1}}),
    ("create_gte_rfc_offset", {"create_time": {"$gte": rfc3339(C1, 2)}}),
    ("create_lt_rfc", {"create_time": {"$lt": rfc3339(C2)}}),
    ("create_lte_epoch", {"create_time": {"$lte": C2}}),
    ("create_range_mixed", {"create_time": {"$gt": rfc3339(C2), "$lte": C1}}),
    ("create_in_mixed", {"create_time": {"$in": [C1, rfc3339(C2, -5)]}}),
    ("create_nin_mixed", {"create_time": {"$nin": [C1, rfc3339(C2)]}}),
    ("create_gt_rfc_fraction", {"create_time": {"$gt": "2023-11-14T12:13:20.5Z"}}),
    ("update_gt", {"update_time": {"$gt": T0 + 1800}}),
    ("update_lte_rfc", {"update_time": {"$lte": rfc3339(T0 + 1800)}}),
    ("update_ne", {"update_time": {"$ne": T0}}),
    ("access_time_gt", {"last_access_time": {"$gt": T0}}),
    ("access_time_lt_rfc", {"last_access_time": {"$lt": rfc3339(C1)}}),
    ("access_time_gte", {"last_access_time": {"$gte": T0 + 300}}),
    ("access_time_in", {"last_access_time": {"$in": [T0 + 120, rfc3339(C2)]}}),
    # metadata: ints, floats, strings, bools; missing keys match only $ne / $nin
    ("md_int_eq", {"metadata.build": 1400}),
    ("md_float_eq", {"metadata.build": {"$eq": 1400.0}}),
    ("md_str_eq", {"metadata.build": "1400"}),
    ("md_ne", {"metadata.build": {"$ne": 1400}}),
    ("md_gt", {"metadata.build": {"$gt": 1420}}),
    ("md_gte_float", {"metadata.build": {"$gte": 1420.5}}),
    ("md_lt", {"metadata.build": {"$lt": 1410}}),
    ("md_lte", {"metadata.build": {"$lte": 1406}}),
    ("md_in_mixed", {"metadata.build": {"$in": [1400, "1400", True]}}),
    ("md_nin", {"metadata.build": {"$nin": [1400, "1407"]}}),
    ("md_bool_true", {"metadata.build": True}),
    ("md_bool_ne", {"metadata.ok": {"$ne": True}}),
    ("md_bool_in", {"metadata.ok": {"$in": [False]}}),
    ("md_str_gt", {"metadata.env": {"$gt": "dev"}}),
    ("md_str_lte", {"metadata.env": {"$lte": "prod"}}),
    ("md_str_ne", {"metadata.env": {"$ne": "prod"}}),
    ("md_str_nin", {"metadata.env": {"$nin": ["prod", "dev"]}}),
    ("md_float_lt", {"metadata.score": {"$lt": 0.5}}),
    ("md_float_gte_int", {"metadata.score": {"$gte": 0}}),
    ("md_missing_eq", {"metadata.nokey": 1}),
    ("md_missing_ne", {"metadata.nokey": {"$ne": 1}}),
    ("md_missing_nin", {"metadata.nokey": {"$nin": [1, "a"]}}),
    ("md_missing_gt", {"metadata.nokey": {"$gt": 0}}),
    ("md_missing_in", {"metadata.nokey": {"$in": [1]}}),
    # logic
    ("and", {"$and": [{"kind": "fact"}, {"importance": {"$gte": 0.3}}]}),
    ("or", {"$or": [{"tags": {"$all": ["deploy", "ci"]}}, {"metadata.build": {"$gt": 1420}}]}),
    ("not", {"$not": {"tier": {"$in": ["FAST", "MEDIUM"]}}}),
    (
        "nested",
        {
            "$and": [
                {"importance": {"$gte": 0.2}},
                {"$or": [{"tags": {"$all": ["deploy", "ci"]}}, {"$not": {"metadata.env": "prod"}}]},
                {"$not": {"$or": [{"source": "agent-b"}, {"access_count": {"$gt": 1}}]}},
            ]
        },
    ),
    ("implicit_and", {"kind": {"$ne": "fact"}, "tier": {"$lte": 3}, "tags": "ci"}),
    (
        "implicit_and_with_logic",
        {"tier": {"$gte": 2}, "$or": [{"topic": "db"}, {"source": ""}], "$not": {"tags": "x"}},
    ),
    ("double_not", {"$not": {"$not": {"kind": "decision"}}}),
    (
        "or_of_and",
        {
            "$or": [
                {"$and": [{"tier": 1}, {"metadata.ok": True}]},
                {"$and": [{"tier": 4}, {"surprise_score": {"$gt": 0}}]},
            ]
        },
    ),
    # empty lists: $in nothing keeps nothing, $nin nothing keeps everything ($all of nothing is
    # refused: test_hostile_input)
    ("tags_in_empty", {"tags": {"$in": []}}),
    ("kind_in_empty", {"kind": {"$in": []}}),
    ("kind_nin_empty", {"kind": {"$nin": []}}),
    ("tier_in_empty", {"tier": {"$in": []}}),
    ("imp_nin_empty", {"importance": {"$nin": []}}),
    ("md_in_empty", {"metadata.build": {"$in": []}}),
    ("md_nin_empty", {"metadata.build": {"$nin": []}}),
]

# Cases whose expected set is empty or everything on purpose (the others must be proper subsets).
TRIVIAL = {
    "kind_in_unknown",
    "kind_ne_unknown",
    "tags_in_unknown",
    "md_missing_eq",
    "md_missing_ne",
    "md_missing_nin",
    "md_missing_gt",
    "md_missing_in",
    "update_ne",
    "tags_in_empty",
    "kind_in_empty",
    "kind_nin_empty",
    "tier_in_empty",
    "imp_nin_empty",
    "md_in_empty",
    "md_nin_empty",
}


def test_filter_cases_list_and_search_match_python(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    c, mems, _clock = fdata
    n = len(mems)
    q = [1.0, 0.5, -0.25, 0.1]
    problems: list[str] = []
    for name, where in FILTER_CASES:
        expected = [m.id for m in mems if py_match(m, where)]
        if name not in TRIVIAL and not 0 < len(expected) < n:
            problems.append(f"{name}: weak case, python keeps {len(expected)} of {n}")
        # ListMemories: creation order
        listed = [m.id for m in list_all(c, FNS, where=where)]
        if listed != expected:
            problems.append(f"{name}: list {listed} != python {expected}")
        # the same filter as a JSON string
        if [m.id for m in list_all(c, FNS, where=json.dumps(where))] != expected:
            problems.append(f"{name}: list with a JSON string differs")
        # SearchMemories with a query, limit large: the same set
        found = rids(raw(c, "SearchMemories", sreq(FNS, q, where=where, limit=1000)).results)
        if sorted(found) != sorted(expected):
            problems.append(f"{name}: search {sorted(found)} != python {sorted(expected)}")
        # ...and without a query (recency ordering)
        req = sreq(FNS, where=where, limit=1000, strategy=pb.SEARCH_STRATEGY_RECENCY)
        if sorted(rids(raw(c, "SearchMemories", req).results)) != sorted(expected):
            problems.append(f"{name}: recency search differs")
    assert not problems, "\n".join(problems)


def test_filter_where_combines_with_structured_filter(
    fdata: tuple[MemoryClient, list[pb.Memory], Any],
) -> None:
    c, mems, _ = fdata
    where = {"importance": {"$gte": 0.3}, "tags": {"$ne": "urgent"}}
    expected = [m.id for m in mems if py_match(m, where) and m.tier in (1, 3) and m.kind != "fact"]
    assert expected
    listed = [
        m.id
        for m in list_all(
            c, FNS, where=where, tiers=["fast", "slow"], kinds=["observation", "decision", "preference"]
        )
    ]
    assert listed == expected
    r = sreq(FNS, [1, 0, 0, 0], where=where, tiers=(1, 3), limit=1000)
    r.filter.kinds.extend(["observation", "decision", "preference"])
    assert sorted(rids(raw(c, "SearchMemories", r).results)) == sorted(expected)
    # tags_any (structured) AND where
    expected = [m.id for m in mems if "ci" in m.tags and py_match(m, {"metadata.env": {"$ne": "dev"}})]
    listed = [m.id for m in list_all(c, FNS, tags_any=["ci"], where={"metadata.env": {"$ne": "dev"}})]
    assert listed == expected


def test_filter_list_paging_with_where(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    c, mems, _ = fdata
    where = {"$or": [{"tier": {"$ne": 2}}, {"tags": "deploy"}]}
    expected = [m.id for m in mems if py_match(m, where)]
    got: list[str] = []
    token = ""
    while True:
        page, token = c.list_page(FNS, page_size=5, page_token=token, where=where)
        assert len(page) <= 5
        got += [m.id for m in page]
        if not token:
            break
    assert got == expected


def test_filter_nesting_limit_is_32(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    c, mems, _ = fdata
    inner: dict[str, Any] = {"kind": "fact"}
    ok = inner
    for _ in range(32):
        ok = {"$not": ok}
    expected = [m.id for m in mems if py_match(m, inner)]  # an even number of $not
    assert [m.id for m in list_all(c, FNS, where=ok)] == expected
    too_deep = {"$not": ok}
    e = expect_invalid(lambda: list_all(c, FNS, where=too_deep), "filter.where")
    assert "$not." * 32 in e.message


def test_float32_columns_in_agrees_with_eq(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    """A value stored as 0.7 (proto float) matches {"$eq": 0.7}, {"$gte": 0.7}, {"$lte": 0.7}: ``$in``
    must agree with ``$eq`` and ``$nin`` with ``$ne``."""
    c, mems, _ = fdata
    eq = [m.id for m in list_all(c, FNS, where={"importance": 0.7})]
    assert eq and eq == [m.id for m in mems if np.float32(m.importance) == np.float32(0.7)]
    assert [m.id for m in list_all(c, FNS, where={"importance": {"$gte": 0.7, "$lte": 0.7}})] == eq
    assert [m.id for m in list_all(c, FNS, where={"importance": {"$in": [0.7]}})] == eq
    found = rids(
        raw(
            c,
            "SearchMemories",
            sreq(FNS, [1, 0, 0, 0], where={"importance": {"$in": [0.7, 0.9]}}, limit=1000),
        ).results
    )
    assert sorted(found) == sorted(
        m.id for m in mems if np.float32(m.importance) in (np.float32(0.7), np.float32(0.9))
    )
    ne = [m.id for m in list_all(c, FNS, where={"importance": {"$ne": 0.7}})]
    assert [m.id for m in list_all(c, FNS, where={"importance": {"$nin": [0.7]}})] == ne


def test_rfc3339_variants(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    c, mems, _ = fdata
    want = [m.id for m in mems if ts(m.create_time) <= C1]
    for text in (rfc3339(C1), rfc3339(C1, 2), rfc3339(C1, -7), "2023-11-14T12:13:20.000000000Z"):
        assert [m.id for m in list_all(c, FNS, where={"create_time": {"$lte": text}})] == want, text
    assert dt.datetime(2023, 11, 14, 12, 13, 20, tzinfo=dt.timezone.utc).timestamp() == C1


def test_rfc3339_lower_case_t_and_z(fdata: tuple[MemoryClient, list[pb.Memory], Any]) -> None:
    c, mems, _ = fdata
    want = [m.id for m in mems if ts(m.create_time) <= C1]
    assert [m.id for m in list_all(c, FNS, where={"create_time": {"$lte": "2023-11-14t12:13:20z"}})] == want


MALFORMED: list[tuple[str, str, str]] = [
    ("invalid_json", '{"kind": "fact"', "not valid JSON"),
    ("not_object", '[{"kind": "fact"}]', "at the top"),
    ("unknown_field", '{"$and": [{"kind": "fact"}, {"colour": "red"}]}', "$and[1].colour"),
    ("unknown_field_metadata_empty", '{"metadata.": 1}', "metadata."),
    ("unknown_operator_field", '{"importance": {"$between": [0, 1]}}', "importance.$between"),
    ("unknown_operator_top", '{"$xor": [{"kind": "fact"}]}', "$xor"),
    ("wrong_type_number", '{"$or": [{"kind": "fact"}, {"importance": "high"}]}', "$or[1].importance.$eq"),
    ("wrong_type_bool_number", '{"access_count": {"$gt": true}}', "access_count.$gt"),
    ("wrong_type_string", '{"kind": 3}', "kind.$eq"),
    ("wrong_type_in_not_list", '{"tags": {"$in": "ci"}}', "tags.$in"),
    ("wrong_type_tier", '{"tier": 7}', "tier.$eq"),
    ("wrong_type_tier_name", '{"tier": {"$in": ["FAST", "HOT"]}}', "tier.$in"),
    ("wrong_type_time", '{"$not": {"create_time": {"$gt": "yesterday"}}}', "$not.create_time.$gt"),
    ("wrong_type_metadata", '{"metadata.build": {"$gt": true}}', "metadata.build.$gt"),
    ("wrong_type_null", '{"importance": {"$gte": null}}', "importance.$gte"),
    ("nan", '{"importance": NaN}', "importance.$eq"),
    ("empty_and", '{"$and": []}', "$and"),
    ("empty_or_nested", '{"$not": {"$or": []}}', "$not.$or"),
    ("gt_on_tags", '{"tags": {"$gt": "a"}}', "tags.$gt"),
    ("all_on_importance", '{"importance": {"$all": [1]}}', "importance.$all"),
    ("not_of_list", '{"$not": [{"kind": "fact"}]}', "$not"),
    ("too_deep", "{" + '"$not": {' * 40 + '"kind": "fact"' + "}" * 41, "$not.$not.$not"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_filters_are_invalid_argument(
    fdata: tuple[MemoryClient, list[pb.Memory], Any], case: tuple[str, str, str]
) -> None:
    c, _, _ = fdata
    name, text, path = case
    calls = [
        lambda: c.list_page(FNS, where=text),
        lambda: raw(c, "SearchMemories", sreq(FNS, [1, 0, 0, 0], where=text)),
        lambda: raw(c, "SearchMemories", sreq(FNS, where=text, strategy=pb.SEARCH_STRATEGY_IMPORTANCE)),
    ]
    for call in calls:
        e = expect_invalid(call, "filter.where")
        assert path in e.message, f"{name}: {path!r} not in {e.message!r}"
        [v] = e.field_violations
        assert path in v.description


# --------------------------------------------------------------------------------------------
# 2. Strategies and explanations
# --------------------------------------------------------------------------------------------

SNS = "user:s"


@pytest.fixture
def sdata(
    server_factory: Callable[..., RunningServer],
) -> Iterator[tuple[MemoryClient, FakeClock, dict[str, Any]]]:
    """16 memories of model "t" across tiers, plus memories of another space and of the built-in one."""
    clock = FakeClock()
    running = server_factory(clock=clock)
    rng = np.random.default_rng(2)
    ages = rng.choice(np.arange(1, 400), size=16, replace=False) * 600.0
    imps = rng.choice(np.arange(5, 100), size=16, replace=False) / 100.0
    vecs = {}
    specs = []
    for i in range(16):
        v = rng.normal(size=DIM)
        vecs[f"s{i:02d}"] = unit(v)
        specs.append(
            build_memory(
                SNS,
                f"m {i}",
                id=f"s{i:02d}",
                tier=i % 4 + 1,
                importance=float(imps[i]),
                embedding=v,
                embedding_model=MODEL,
                create_time=T0 - float(ages[i]),
            )
        )
    other = [
        build_memory(
            SNS,
            "other space 1",
            id="u1",
            tier=2,
            importance=0.93,
            embedding=[1, 2, 3],
            embedding_model="u",
            create_time=T0 - 30,
        ),
        build_memory(
            SNS,
            "other space 2",
            id="u2",
            tier=3,
            importance=0.015,
            embedding=[3, 2, 1],
            embedding_model="u",
            create_time=T0 - 250_000,
        ),
        build_memory(SNS, "built-in text memory", id="b1", tier=1, importance=0.97, create_time=T0 - 45),
    ]
    with connect(running) as c:
        c.create_batch(specs + other)
        c.feedback(SNS, [{"id": "s03"}], as_of=T0 - 20)  # a late access (recency), distinct times
        c.feedback(SNS, [{"id": "s08"}], as_of=T0 - 10)
        mems = {m.id: m for m in list_all(c, SNS)}
        yield c, clock, {"vecs": vecs, "mems": mems}


def _expect(
    data: dict[str, Any],
    q: Any,
    as_of: float,
    a: float = 0.5,
    b: float = 0.3,
    g: float = 0.2,
    tier_w: dict[int, float] | None = None,
    ids: Any = None,
) -> dict[str, dict[str, float]]:
    qu = unit(q) if q is not None else None
    out = {}
    for mid, m in data["mems"].items():
        if ids is not None and mid not in ids:
            continue
        if qu is None:
            rel = 0.0
        elif mid in data["vecs"]:
            rel = float(data["vecs"][mid] @ qu)
        else:
            continue  # another space: never compared with this query
        rec = recency(ts(m.create_time), as_of)  # (recency by creation: the server's default)
        imp = decayed(float(np.float32(m.importance)), m.tier, ts(m.create_time), as_of)
        base = a * rel + b * rec + g * imp
        tw = (tier_w or {}).get(m.tier, 1.0)
        out[mid] = {
            "rel": rel,
            "rec": rec,
            "imp": imp,
            "base": base,
            "tw": tw,
            "score": base * tw,
            "tier": m.tier,
        }
    return out


def _ranked(exp: dict[str, dict[str, float]], part: str = "score") -> list[str]:
    return sorted(exp, key=lambda k: -exp[k][part])


def _check_scores(res: list[pb.SearchResult], exp: dict[str, dict[str, float]]) -> None:
    for r in res:
        e = exp[r.memory.id]
        assert r.relevance == pytest.approx(e["rel"], abs=1e-5), r.memory.id
        assert r.recency == pytest.approx(e["rec"], abs=1e-5), r.memory.id
        assert r.importance == pytest.approx(e["imp"], abs=1e-5), r.memory.id
        assert r.score == pytest.approx(e["score"], abs=1e-5), r.memory.id


def _check_explanation(res: list[pb.SearchResult], strategy: int, abg: tuple[float, float, float]) -> None:
    assert res
    for r in res:
        assert r.HasField("explanation")
        x = r.explanation
        assert x.strategy == strategy
        assert (x.alpha, x.beta, x.gamma) == pytest.approx(abg, abs=1e-6)
        base = x.alpha * r.relevance + x.beta * r.recency + x.gamma * r.importance
        assert x.base_score == pytest.approx(base, abs=1e-5)
        assert r.score == pytest.approx(x.base_score * x.tier_weight * x.scope_weight, abs=1e-5)


def _minmax(x: np.ndarray) -> np.ndarray:
    return (x - x.min()) / (x.max() - x.min()) if x.max() > x.min() else np.full_like(x, 0.5)


def test_a_lone_fused_result_scores_the_middle_of_each_signal(
    sdata: tuple[MemoryClient, FakeClock, dict[str, Any]],
) -> None:
    """A signal equal for every candidate says nothing of their order and normalizes to 0.5: a
    search with one candidate scores it 0.5 (alpha + beta + gamma), not 0, whatever it carries."""
    c = sdata[0]
    c.create("lone", "the only memory here", embedding=list(np.eye(DIM)[0]), embedding_model=MODEL)
    for q in (np.eye(DIM)[0], np.eye(DIM)[1]):
        [hit] = search(c, "lone", q, explain=True)
        assert hit.score == pytest.approx(0.5 * (1.0 + 0.1 + 0.1), abs=1e-6)
        assert hit.relevance == pytest.approx(float(q[0]), abs=1e-6)  # (the raw cosine)


def test_fused_is_the_default(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    """No strategy: the fused ranking, each signal min-max normalized over the candidates (here all
    16 memories of the space), relevance weighing 1, recency and importance 0.1 each."""
    c, _clock, data = sdata
    rng = np.random.default_rng(22)
    as_of = T0 + 900
    for _ in range(3):
        q = rng.normal(size=DIM)
        default = search(c, SNS, q, limit=50, as_of=as_of, explain=True)
        fused = search(c, SNS, q, limit=50, as_of=as_of, explain=True, strategy=pb.SEARCH_STRATEGY_FUSED)
        assert rids(default) == rids(fused) and [r.score for r in default] == [r.score for r in fused]
        exp = _expect(data, q, as_of)
        ids = list(exp)
        part = {k: np.array([exp[i][k] for i in ids]) for k in ("rel", "rec", "imp")}
        ref = _minmax(part["rel"]) + 0.1 * _minmax(part["rec"]) + 0.1 * _minmax(part["imp"])
        want = dict(zip(ids, ref.tolist(), strict=True))
        assert len(default) == 16
        assert rids(default) == sorted(ids, key=lambda i: -want[i])
        for r in default:
            assert r.score == pytest.approx(want[r.memory.id], abs=1e-5)
            assert r.relevance == pytest.approx(exp[r.memory.id]["rel"], abs=1e-5)  # reported raw
            x = r.explanation
            assert x.strategy == pb.SEARCH_STRATEGY_FUSED
            assert (x.alpha, x.beta, x.gamma) == pytest.approx((1.0, 0.1, 0.1))
            assert x.base_score == pytest.approx(r.score, abs=1e-6)  # tier and scope weights 1


def test_comprehensive_is_the_raw_weighted_sum(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, data = sdata
    rng = np.random.default_rng(20)
    as_of = T0 + 900
    comp_only = {"strategy": pb.SEARCH_STRATEGY_COMPREHENSIVE}
    for _ in range(3):
        q = rng.normal(size=DIM)
        default = search(c, SNS, q, limit=50, as_of=as_of, explain=True, **comp_only)
        exp = _expect(data, q, as_of)
        assert len(default) == 16
        _check_scores(default, exp)
        assert rids(default) == _ranked(exp)
        _check_explanation(default, pb.SEARCH_STRATEGY_COMPREHENSIVE, (0.5, 0.3, 0.2))
        assert all(r.explanation.tier_weight == 1.0 and r.explanation.scope_weight == 1.0 for r in default)
        # custom alpha/beta/gamma are reported as used
        custom = search(
            c, SNS, q, limit=50, as_of=as_of, explain=True, alpha=0.9, beta=0.05, gamma=0.6, **comp_only
        )
        exp = _expect(data, q, as_of, 0.9, 0.05, 0.6)
        _check_scores(custom, exp)
        assert rids(custom) == _ranked(exp)
        _check_explanation(custom, pb.SEARCH_STRATEGY_COMPREHENSIVE, (0.9, 0.05, 0.6))
    # explain=false leaves the explanation empty
    plain = search(c, SNS, q, limit=50, as_of=as_of, **comp_only)
    assert plain and not any(r.HasField("explanation") for r in plain)
    # tier_weights apply to COMPREHENSIVE too (other tiers 1.0)
    tw = search(c, SNS, q, limit=50, as_of=as_of, tier_weights={3: 2.5}, explain=True, **comp_only)
    exp = _expect(data, q, as_of, tier_w={1: 1.0, 2: 1.0, 3: 2.5, 4: 1.0})
    _check_scores(tw, exp)
    assert rids(tw) == _ranked(exp)
    assert {r.memory.id: r.explanation.tier_weight for r in tw} == {k: e["tw"] for k, e in exp.items()}


def test_weighted_strategy_tier_weights(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, data = sdata
    rng = np.random.default_rng(21)
    as_of = T0 + 1800
    for _ in range(3):
        q = rng.normal(size=DIM)
        res = search(c, SNS, q, limit=50, as_of=as_of, strategy=pb.SEARCH_STRATEGY_WEIGHTED, explain=True)
        exp = _expect(data, q, as_of, tier_w=DEFAULT_TIER_W)
        assert len(res) == 16
        _check_scores(res, exp)
        assert rids(res) == _ranked(exp)
        _check_explanation(res, pb.SEARCH_STRATEGY_WEIGHTED, (0.5, 0.3, 0.2))
        for r in res:
            assert r.explanation.tier_weight == pytest.approx(DEFAULT_TIER_W[r.memory.tier])
        # custom tier_weights override the defaults; tiers not named keep the WEIGHTED default
        custom = {1: 0.2, 4: 3.0}
        res = search(
            c,
            SNS,
            q,
            limit=50,
            as_of=as_of,
            strategy=pb.SEARCH_STRATEGY_WEIGHTED,
            tier_weights=custom,
            explain=True,
        )
        tw = {**DEFAULT_TIER_W, **custom}
        exp = _expect(data, q, as_of, tier_w=tw)
        _check_scores(res, exp)
        assert rids(res) == _ranked(exp)
        for r in res:
            assert r.explanation.tier_weight == pytest.approx(tw[r.memory.tier])
        # weight 0 is allowed: that tier scores 0 and sinks to the bottom
        res = search(
            c, SNS, q, limit=50, as_of=as_of, strategy=pb.SEARCH_STRATEGY_WEIGHTED, tier_weights={2: 0.0}
        )
        assert len(res) == 16
        assert all(r.score == 0.0 for r in res if r.memory.tier == 2)
        scores = [r.score for r in res]
        assert scores == sorted(scores, reverse=True)
    # an invalid tier weight is rejected, the entry named by its position in the request
    bad = sreq(SNS, q, strategy=pb.SEARCH_STRATEGY_WEIGHTED, tier_weights={1: 0.5, 2: -1.0})
    expect_invalid(lambda: raw(c, "SearchMemories", bad), "tier_weights[1].weight")
    bad = sreq(SNS, q, strategy=pb.SEARCH_STRATEGY_WEIGHTED, tier_weights={3: 1.0, 0: 1.0})
    expect_invalid(lambda: raw(c, "SearchMemories", bad), "tier_weights[1].tier")


def test_fast_first_strategy(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, data = sdata
    rng = np.random.default_rng(22)
    as_of = T0 + 600
    ff = pb.SEARCH_STRATEGY_FAST_FIRST
    for _ in range(3):
        q = rng.normal(size=DIM)
        exp = _expect(data, q, as_of)

        def by_tier(tiers: tuple[int, ...], exp: dict[str, dict[str, float]] = exp) -> list[str]:
            out: list[str] = []
            for t in tiers:
                out += [k for k in _ranked(exp) if exp[k]["tier"] == t]
            return out

        full = search(c, SNS, q, limit=100, as_of=as_of, strategy=ff, explain=True)
        assert rids(full) == by_tier((1, 2, 3, 4))
        tiers = [r.memory.tier for r in full]
        assert tiers == sorted(tiers)
        _check_scores(full, exp)
        _check_explanation(full, ff, (0.5, 0.3, 0.2))
        # limit smaller than the FAST matches: FAST only; a bit larger: falls through to MEDIUM
        assert rids(search(c, SNS, q, limit=3, as_of=as_of, strategy=ff)) == by_tier((1,))[:3]
        assert rids(search(c, SNS, q, limit=6, as_of=as_of, strategy=ff)) == by_tier((1, 2))[:6]
        assert rids(search(c, SNS, q, limit=13, as_of=as_of, strategy=ff)) == by_tier((1, 2, 3, 4))[:13]
        # filter tiers are respected, still fastest first
        got = search(c, SNS, q, limit=100, as_of=as_of, strategy=ff, tiers=(4, 2))
        assert rids(got) == by_tier((2, 4))
        got = search(c, SNS, q, limit=5, as_of=as_of, strategy=ff, where={"tier": {"$ne": "FAST"}})
        assert rids(got) == by_tier((2, 3, 4))[:5]


def test_similarity_strategy(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, data = sdata
    rng = np.random.default_rng(23)
    as_of = T0 + 600
    for _ in range(3):
        q = rng.normal(size=DIM)
        # alpha/beta/gamma in the request are overridden by the single-signal strategy
        res = search(
            c,
            SNS,
            q,
            limit=50,
            as_of=as_of,
            strategy=pb.SEARCH_STRATEGY_SIMILARITY,
            explain=True,
            beta=0.9,
            gamma=0.9,
        )
        exp = _expect(data, q, as_of, 1.0, 0.0, 0.0)
        assert rids(res) == _ranked(exp, "rel")
        _check_scores(res, exp)
        for r in res:
            assert r.score == pytest.approx(r.relevance, abs=1e-6)
        _check_explanation(res, pb.SEARCH_STRATEGY_SIMILARITY, (1.0, 0.0, 0.0))


@pytest.mark.parametrize("strategy", ["recency", "importance"])
def test_recency_and_importance_need_no_query_and_span_spaces(
    sdata: tuple[MemoryClient, FakeClock, dict[str, Any]], strategy: str
) -> None:
    c, _clock, data = sdata
    st = pb.SEARCH_STRATEGY_RECENCY if strategy == "recency" else pb.SEARCH_STRATEGY_IMPORTANCE
    part = "rec" if strategy == "recency" else "imp"
    abg = (0.0, 1.0, 0.0) if strategy == "recency" else (0.0, 0.0, 1.0)
    for as_of in (T0 + 60, T0 + 20 * 3600):
        res = search(c, SNS, limit=50, as_of=as_of, strategy=st, explain=True)
        exp = _expect(data, None, as_of, *abg)
        assert len(res) == 19  # every space: model t, model u and the built-in space
        assert {"u1", "u2", "b1"} <= set(rids(res))
        assert rids(res) == _ranked(exp, part)
        _check_scores(res, exp)
        for r in res:
            assert r.relevance == 0.0
            assert r.score == pytest.approx(
                getattr(r, "recency" if part == "rec" else "importance"), abs=1e-6
            )
        _check_explanation(res, st, abg)
        # with filters and a limit
        res = search(c, SNS, limit=4, as_of=as_of, strategy=st, where={"tier": {"$in": [2, 3]}})
        keep = [k for k in _ranked(exp, part) if data["mems"][k].tier in (2, 3)]
        assert rids(res) == keep[:4]
    # with a query of one space, only that space is ranked (by the single signal)
    q = np.ones(DIM)
    res = search(c, SNS, q, limit=50, as_of=T0 + 60, strategy=st)
    exp = _expect(data, q, T0 + 60, *abg)
    assert rids(res) == _ranked(exp, part)
    # COMPREHENSIVE still needs a query
    expect_invalid(lambda: search(c, SNS, limit=5), "query_embedding")


# --------------------------------------------------------------------------------------------
# 3. Scopes
# --------------------------------------------------------------------------------------------

U = "user:a"
P = "user:a/project:x"
S = "user:a/project:x/session:1"
SIB = "user:a/project:y"
CHILD = "user:a/project:x/session:1/task:9"
OTHERS = [
    "user:b",
    "user:ab",
    "user:a/project:xy",
    "user:ab/project:x/session:1",
    "user:b/project:x/session:1",
]


@pytest.fixture
def scopes(
    server_factory: Callable[..., RunningServer],
) -> Iterator[tuple[MemoryClient, dict[tuple[str, str], dict[str, Any]]]]:
    clock = FakeClock()
    running = server_factory(clock=clock)
    rng = np.random.default_rng(3)
    specs = {}
    for ns in [U, P, S, SIB, CHILD, *OTHERS]:
        for j in range(3):
            v = rng.normal(size=DIM)
            s = {
                "namespace": ns,
                "content": f"{ns} {j}",
                "id": f"k{j}",  # the same ids in every scope
                "tier": int(rng.integers(1, 5)),
                "importance": round(float(rng.uniform(0.1, 1.0)), 3),
                "embedding": v,
                "embedding_model": MODEL,
                "create_time": T0 - float(rng.uniform(0, 86400)),
            }
            specs[(ns, f"k{j}")] = s
    with connect(running) as c:
        c.create_batch(list(specs.values()))
        yield c, specs


def _scope_expect(
    specs: dict[tuple[str, str], dict[str, Any]], q: Any, as_of: float, weights: dict[str, float]
) -> dict[tuple[str, str], float]:
    out = {}
    qu = unit(q)
    for k, s in specs.items():
        if k[0] not in weights:
            continue
        imp = float(np.float32(s["importance"]))
        base = (
            0.5 * float(unit(s["embedding"]) @ qu)
            + 0.3 * recency(s["create_time"], as_of)
            + 0.2 * decayed(imp, s["tier"], s["create_time"], as_of)
        )
        out[k] = base * weights[k[0]]
    return out


def _check_scope(
    c: MemoryClient,
    specs: Any,
    q: Any,
    as_of: float,
    namespaces: list[str],
    weights: dict[str, float],
    **kw: Any,
) -> None:
    kw.setdefault("strategy", pb.SEARCH_STRATEGY_COMPREHENSIVE)  # scope weights on the raw weighted sum
    res = search(c, namespaces, q, limit=100, as_of=as_of, explain=True, **kw)
    exp = _scope_expect(specs, q, as_of, weights)
    assert sorted(rkeys(res)) == sorted(exp), (namespaces, kw)
    assert rkeys(res) == sorted(exp, key=lambda k: -exp[k])
    for r in res:
        assert r.explanation.scope_weight == pytest.approx(weights[r.memory.namespace]), r.memory.namespace
        assert r.score == pytest.approx(exp[key(r.memory)], abs=1e-5)
    _check_explanation(res, pb.SEARCH_STRATEGY_COMPREHENSIVE, (0.5, 0.3, 0.2))


def test_scopes_ancestors_and_weights(
    scopes: tuple[MemoryClient, dict[tuple[str, str], dict[str, Any]]],
) -> None:
    c, specs = scopes
    rng = np.random.default_rng(30)
    as_of = T0 + 60
    for _ in range(3):
        q = rng.normal(size=DIM)
        # isolation: without include_ancestors only the named namespaces
        _check_scope(c, specs, q, as_of, [S], {S: 1.0})
        _check_scope(c, specs, q, as_of, [S, SIB], {S: 1.0, SIB: 1.0})
        _check_scope(c, specs, q, as_of, [P], {P: 1.0})
        # default scope weights by distance: session 1.0, project 0.8, user 0.6
        _check_scope(c, specs, q, as_of, [S], {S: 1.0, P: 0.8, U: 0.6}, include_ancestors=True)
        _check_scope(
            c, specs, q, as_of, [CHILD], {CHILD: 1.0, S: 0.8, P: 0.6, U: 0.4}, include_ancestors=True
        )
        _check_scope(c, specs, q, as_of, [P], {P: 1.0, U: 0.8}, include_ancestors=True)
        _check_scope(c, specs, q, as_of, [SIB], {SIB: 1.0, U: 0.8}, include_ancestors=True)
        # custom scope weights; the last one repeats
        _check_scope(
            c,
            specs,
            q,
            as_of,
            [S],
            {S: 1.0, P: 0.5, U: 0.5},
            include_ancestors=True,
            scope_weights=[1.0, 0.5],
        )
        _check_scope(
            c,
            specs,
            q,
            as_of,
            [S],
            {S: 0.2, P: 1.0, U: 3.0},
            include_ancestors=True,
            scope_weights=[0.2, 1.0, 3.0],
        )
        _check_scope(
            c,
            specs,
            q,
            as_of,
            [CHILD],
            {CHILD: 1.0, S: 0.7, P: 0.3, U: 0.3},
            include_ancestors=True,
            scope_weights=[1.0, 0.7, 0.3],
        )
        # a namespace reached twice keeps its higher weight
        _check_scope(c, specs, q, as_of, [S, U], {S: 1.0, P: 0.8, U: 1.0}, include_ancestors=True)
        _check_scope(
            c,
            specs,
            q,
            as_of,
            [S, P],
            {S: 0.5, P: 0.9, U: 0.9},
            include_ancestors=True,
            scope_weights=[0.5, 0.9],
        )
        _check_scope(c, specs, q, as_of, [S, SIB], {S: 1.0, SIB: 1.0, P: 0.8, U: 0.8}, include_ancestors=True)
        # without include_ancestors, scope_weights[0] weighs the named namespaces
        _check_scope(c, specs, q, as_of, [S], {S: 0.5}, scope_weights=[0.5, 0.25])


def test_scopes_never_leak(scopes: tuple[MemoryClient, dict[tuple[str, str], dict[str, Any]]]) -> None:
    c, specs = scopes
    q = np.ones(DIM)
    for ns, allowed in [
        (S, {S, P, U}),
        (P, {P, U}),
        (SIB, {SIB, U}),
        (U, {U}),
        ("user:a/project:x/session:2", {P, U}),  # an empty scope still sees its ancestors
    ]:
        for strategy in (
            pb.SEARCH_STRATEGY_COMPREHENSIVE,
            pb.SEARCH_STRATEGY_RECENCY,
            pb.SEARCH_STRATEGY_WEIGHTED,
        ):
            for anc in (False, True):
                res = search(
                    c,
                    ns,
                    q if strategy != pb.SEARCH_STRATEGY_RECENCY else None,
                    limit=1000,
                    include_ancestors=anc,
                    strategy=strategy,
                )
                got = {r.memory.namespace for r in res}
                assert got == (allowed if anc else allowed & {ns}), (ns, strategy, anc)
                assert SIB not in got or ns == SIB
                assert CHILD not in got
                assert not got & set(OTHERS)
    # filters apply in ancestor scopes too
    res = search(c, S, q, limit=1000, include_ancestors=True, where={"tier": {"$gte": 3}})
    want = {k for k, s in specs.items() if k[0] in (S, P, U) and s["tier"] >= 3}
    assert set(rkeys(res)) == want
    # invalid scope weights
    expect_invalid(
        lambda: search(c, S, q, include_ancestors=True, scope_weights=[1.0, -0.5]), "scope_weights[1]"
    )


# --------------------------------------------------------------------------------------------
# 4. Exactness of the weighted ranking on the ANN path
# --------------------------------------------------------------------------------------------


def test_weighted_and_scoped_ranking_is_exact_on_ann_path(
    server_factory: Callable[..., RunningServer],
) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, exact_search_max_rows=50)
    rng = np.random.default_rng(4)
    n, dim = 3000, 32
    parent, child = "user:z", "user:z/project:p"
    vecs = rng.normal(size=(n, dim))
    tiers = rng.integers(1, 5, size=n)
    imps = np.round(rng.uniform(0.05, 1.0, size=n), 4)
    created = T0 - rng.uniform(0, 3 * 86400, size=n)
    in_child = rng.random(n) < 0.5
    nss = np.where(in_child, child, parent)
    with connect(running) as c:
        for lo in range(0, n, 1000):
            c.create_batch(
                [
                    build_memory(
                        str(nss[i]),
                        f"v{i}",
                        id=f"v{i}",
                        tier=int(tiers[i]),
                        importance=float(imps[i]),
                        embedding=vecs[i],
                        embedding_model=MODEL,
                        create_time=float(created[i]),
                    )
                    for i in range(lo, min(n, lo + 1000))
                ]
            )
        now = clock.now
        units = vecs / np.linalg.norm(vecs, axis=1, keepdims=True)
        imp32 = imps.astype(np.float32).astype(np.float64)
        age_h = np.maximum(0.0, now - created) / 3600.0
        hl = np.array([HALF_LIFE[int(t)] for t in tiers])
        dimp = np.maximum(imp32 * 0.5 ** (age_h / hl), FLOOR * imp32)
        rec = np.exp(-np.maximum(0.0, now - created) / TAU)
        idx = {f"v{i}": i for i in range(n)}

        def brute(
            q: np.ndarray,
            a: float,
            b: float,
            g: float,
            tier_w: dict[int, float],
            scope_w: dict[str, float],
            where_imp: float | None = None,
        ) -> list[str]:
            cos = units @ unit(q)
            sw = np.array([scope_w.get(ns, 0.0) for ns in nss])
            tw = np.array([tier_w[int(t)] for t in tiers])
            score = (a * cos + b * rec + g * dimp) * tw * sw
            allowed = np.array([ns in scope_w for ns in nss])
            if where_imp is not None:
                allowed &= imp32 >= np.float32(where_imp)
            score = np.where(allowed, score, -np.inf)
            return [f"v{i}" for i in np.argsort(-score, kind="stable")[:10]]

        configs: list[
            tuple[str, dict[str, Any], tuple[float, float, float], dict[int, float], dict[str, float]]
        ] = [
            (
                "weighted",
                dict(namespaces=[child], strategy=pb.SEARCH_STRATEGY_WEIGHTED),
                (0.5, 0.3, 0.2),
                DEFAULT_TIER_W,
                {child: 1.0},
            ),
            (
                "weighted_both",
                dict(
                    namespaces=[child, parent],
                    strategy=pb.SEARCH_STRATEGY_WEIGHTED,
                    alpha=0.9,
                    beta=0.1,
                    gamma=0.3,
                ),
                (0.9, 0.1, 0.3),
                DEFAULT_TIER_W,
                {child: 1.0, parent: 1.0},
            ),
            (
                "weighted_custom",
                dict(
                    namespaces=[child, parent],
                    strategy=pb.SEARCH_STRATEGY_WEIGHTED,
                    tier_weights={1: 0.3, 4: 1.6},
                ),
                (0.5, 0.3, 0.2),
                {**DEFAULT_TIER_W, 1: 0.3, 4: 1.6},
                {child: 1.0, parent: 1.0},
            ),
            (
                "ancestors",
                dict(namespaces=[child], include_ancestors=True),
                (0.5, 0.3, 0.2),
                {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0},
                {child: 1.0, parent: 0.8},
            ),
            (
                "ancestors_weighted",
                dict(
                    namespaces=[child],
                    include_ancestors=True,
                    strategy=pb.SEARCH_STRATEGY_WEIGHTED,
                    scope_weights=[0.6, 1.0],
                    alpha=1.0,
                ),
                (1.0, 0.3, 0.2),
                DEFAULT_TIER_W,
                {child: 0.6, parent: 1.0},
            ),
        ]
        overlaps: dict[str, list[float]] = {}
        for qi in range(12):
            # queries near a stored vector (a few very similar rows) and plain random ones
            q = (
                vecs[rng.integers(n)] + rng.normal(scale=0.5, size=dim)
                if qi % 2 == 0
                else rng.normal(size=dim)
            )
            for name, fields, (a, b, g), tw, sw in configs:
                fields = dict(fields)
                nss_req = fields.pop("namespaces")
                for where_imp in (None, 0.3) if qi < 4 else (None,):
                    where = {"importance": {"$gte": where_imp}} if where_imp is not None else None
                    fields.setdefault("strategy", pb.SEARCH_STRATEGY_COMPREHENSIVE)  # the raw weighted sum
                    res = search(c, nss_req, q, limit=10, where=where, **fields)
                    got = rids(res)
                    want = brute(q, a, b, g, tw, sw, where_imp)
                    overlaps.setdefault(name, []).append(len(set(got) & set(want)) / 10)
                    # the scores returned are the exact combined scores
                    for r in res:
                        i = idx[r.memory.id]
                        exp = (
                            (a * float(units[i] @ unit(q)) + b * rec[i] + g * dimp[i])
                            * tw[int(tiers[i])]
                            * sw[str(nss[i])]
                        )
                        assert r.score == pytest.approx(exp, abs=1e-4)
        mean = {k: float(np.mean(v)) for k, v in overlaps.items()}
        overall = float(np.mean([x for v in overlaps.values() for x in v]))
        print(
            f"\nANN-path top-10 overlap with brute force: overall {overall:.4f}; "
            + ", ".join(f"{k} {v:.3f}" for k, v in mean.items())
        )
        assert overall >= 0.95
        for k, v in mean.items():
            assert v >= 0.9, (k, v)


# --------------------------------------------------------------------------------------------
# 5. Batch search
# --------------------------------------------------------------------------------------------


def test_batch_search_equals_separate_calls(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, _data = sdata
    rng = np.random.default_rng(50)
    as_of = T0 + 300
    searches = [
        sreq(SNS, rng.normal(size=DIM), limit=5, as_of=as_of),
        sreq(
            SNS,
            rng.normal(size=DIM),
            limit=50,
            as_of=as_of,
            strategy=pb.SEARCH_STRATEGY_WEIGHTED,
            explain=True,
        ),
        sreq(SNS, limit=7, as_of=as_of, strategy=pb.SEARCH_STRATEGY_RECENCY),
        sreq(
            SNS,
            rng.normal(size=DIM),
            limit=50,
            as_of=as_of,
            where={"tier": {"$lte": 2}},
            strategy=pb.SEARCH_STRATEGY_FAST_FIRST,
        ),
        sreq("user:nobody", rng.normal(size=DIM), as_of=as_of),  # no results
        sreq(SNS, query_text="built-in text memory", as_of=as_of, limit=3),
        sreq(
            SNS,
            limit=50,
            as_of=as_of,
            strategy=pb.SEARCH_STRATEGY_IMPORTANCE,
            where={"importance": {"$gte": 0.5}},
        ),
    ]
    batch = raw(c, "BatchSearchMemories", pb.BatchSearchMemoriesRequest(searches=searches))
    assert len(batch.responses) == len(searches)
    for i, (req, resp) in enumerate(zip(searches, batch.responses, strict=True)):
        single = raw(c, "SearchMemories", req)
        assert rids(resp.results) == rids(single.results), i
        assert [r.score for r in resp.results] == pytest.approx([r.score for r in single.results], abs=1e-6)
        assert [r.HasField("explanation") for r in resp.results] == [
            r.HasField("explanation") for r in single.results
        ]
    assert len(batch.responses[0].results) == 5
    assert len(batch.responses[4].results) == 0
    assert rids(batch.responses[5].results)[0] == "b1"
    # 100 searches is fine
    many = raw(c, "BatchSearchMemories", pb.BatchSearchMemoriesRequest(searches=[searches[2]] * 100))
    assert len(many.responses) == 100
    assert all(rids(r.results) == rids(many.responses[0].results) for r in many.responses)


def test_batch_search_errors(sdata: tuple[MemoryClient, FakeClock, dict[str, Any]]) -> None:
    c, _clock, _data = sdata
    good = sreq(SNS, np.ones(DIM), limit=3)

    def batch(*searches: pb.SearchMemoriesRequest) -> Any:
        return raw(c, "BatchSearchMemories", pb.BatchSearchMemoriesRequest(searches=list(searches)))

    e = expect_invalid(
        lambda: batch(good, good, sreq(SNS, np.ones(DIM), where={"$and": []})), "searches[2].filter.where"
    )
    assert "$and" in e.message
    expect_invalid(lambda: batch(good, sreq(SNS, np.ones(DIM), limit=-1)), "searches[1].limit")
    expect_invalid(
        lambda: batch(sreq(SNS, np.ones(DIM), tier_weights={3: float("nan")}), good),
        "searches[0].tier_weights[0].weight",
    )
    expect_invalid(
        lambda: batch(good, sreq(SNS, np.ones(DIM), include_ancestors=True, scope_weights=[1, -1])),
        "searches[1].scope_weights[1]",
    )
    expect_invalid(lambda: batch(good, sreq(SNS, limit=3)), "searches[1].query_embedding")
    expect_invalid(lambda: batch(good, sreq([], np.ones(DIM))), "searches[1].namespaces")
    expect_invalid(lambda: batch(sreq(SNS, np.ones(DIM), strategy=42)), "searches[0].strategy")
    expect_invalid(lambda: batch(), "searches")
    expect_invalid(lambda: batch(*([good] * 101)), "searches")
    # Two bad ones (the batch's searches run side by side): the first by position fails the call.
    bad_limit, bad_where = sreq(SNS, np.ones(DIM), limit=-1), sreq(SNS, np.ones(DIM), where={"$and": []})
    expect_invalid(lambda: batch(good, bad_limit, bad_where), "searches[1].limit")
    expect_invalid(lambda: batch(good, bad_where, bad_limit), "searches[1].filter.where")
    # ... also when the later one is refused as it is read (a tier weighted twice), earlier ones as
    # they run (a negative limit, a space that holds nothing)
    twice = sreq(SNS, np.ones(DIM))
    twice.tier_weights.add(tier=3, weight=1.0)
    twice.tier_weights.add(tier=3, weight=2.0)
    expect_invalid(lambda: batch(good, bad_limit, twice), "searches[1].limit")
    expect_invalid(lambda: batch(good, twice, bad_limit), "searches[1].tier_weights[1].tier")
    with pytest.raises(NotFoundError):
        batch(good, sreq(SNS, np.ones(DIM), model="no-such-model"), twice)
    # Not only invalid arguments: a space that holds nothing is NOT_FOUND, naming the search.
    with pytest.raises(NotFoundError) as err:
        batch(good, sreq(SNS, np.ones(DIM), model="no-such-model"))
    assert err.value.reason == "EMBEDDING_SPACE_NOT_FOUND"
    assert "searches[1]: no memories in embedding space 'no-such-model'" in str(err.value)


def test_a_filter_value_no_memory_could_hold_is_refused(
    sdata: tuple[MemoryClient, FakeClock, dict[str, Any]],
) -> None:
    """Checked as a create checks the same field (it matched nothing, silently)."""
    c, _clock, _data = sdata
    for field, value, named in (
        ("tags_any", [""], "filter.tags_any[0]"),
        ("tags_all", ["ok", "x" * 200], "filter.tags_all[1]"),
        ("source", "s" * 10_000, "filter.source"),
        ("topic", "bad\x00topic", "filter.topic"),
    ):
        req = sreq(SNS, np.ones(DIM), limit=3)
        if isinstance(value, list):
            getattr(req.filter, field).extend(value)
        else:
            setattr(req.filter, field, value)
        expect_invalid(lambda req=req: raw(c, "SearchMemories", req), named)
        listed = pb.ListMemoriesRequest(namespace=SNS)
        if isinstance(value, list):
            getattr(listed.filter, field).extend(value)
        else:
            setattr(listed.filter, field, value)
        expect_invalid(lambda listed=listed: raw(c, "ListMemories", listed), named)


def test_the_searches_of_a_batch_run_side_by_side(server_factory: Callable[..., RunningServer]) -> None:
    """A BatchSearchMemories call runs its searches on search_concurrency threads at once: two of
    them meet at a barrier (one after the other, the first would wait there until it broke)."""
    running = server_factory(search_concurrency=2)
    engine = running.engine
    with connect(running) as c:
        for i in range(4):
            c.create(SNS, f"m{i}", id=f"m{i}", embedding=np.eye(DIM)[i].tolist(), embedding_model=MODEL)
        meet = threading.Barrier(2, timeout=10)
        threads: set[str] = set()

        class MeetingTurns(Turns):  # turns of the same size; a search holding one waits for another
            @contextlib.contextmanager
            def take(self, wanted: Callable[[], bool] | None = None) -> Iterator[None]:
                with super().take(wanted):
                    threads.add(threading.current_thread().name)
                    meet.wait()
                    yield

        real = engine.searcher.turns
        engine.searcher.turns = MeetingTurns(2)
        try:
            searches = [sreq(SNS, np.eye(DIM)[i], limit=1) for i in (0, 1)]
            out = raw(c, "BatchSearchMemories", pb.BatchSearchMemoriesRequest(searches=searches))
        finally:
            engine.searcher.turns = real
        assert [rids(r.results) for r in out.responses] == [["m0"], ["m1"]]  # in request order
        assert len(threads) == 2 and not meet.broken


def test_failed_batch_has_no_side_effects(server_factory: Callable[..., RunningServer]) -> None:
    """ "any invalid one fails the call": a call that fails must not count accesses nor searches."""
    clock = FakeClock()
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0)
    ns = "user:fb"
    with connect(running) as c:
        c.create(ns, "x", id="x", embedding=[1, 0, 0, 0], embedding_model=MODEL, create_time=T0 - 100)
        bad = pb.BatchSearchMemoriesRequest(
            searches=[sreq(ns, [1, 0, 0, 0]), sreq(ns, [1, 0, 0, 0], where={"$and": []})]
        )
        expect_invalid(lambda: raw(c, "BatchSearchMemories", bad), "searches[1].filter.where")
        running.engine.flush_access()
        m = c.get(ns, "x")
        s = c.stats()
        assert (m.access_count, ts(m.last_access_time)) == (0, T0 - 100)
        assert (s.search_hits, s.search_misses) == (0, 0)


# --------------------------------------------------------------------------------------------
# 6. Searches count as accesses
# --------------------------------------------------------------------------------------------


def test_searches_count_as_accesses(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0)
    ns = "user:acc"
    rng = np.random.default_rng(6)
    vecs = {f"a{i}": rng.normal(size=DIM) for i in range(5)}
    with connect(running) as c:
        c.create_batch(
            [
                build_memory(
                    ns,
                    k,
                    id=k,
                    tier=3,
                    importance=0.6,
                    tags=[k],
                    embedding=v,
                    embedding_model=MODEL,
                    create_time=T0 - 1000,
                )
                for k, v in vecs.items()
            ]
            + [
                build_memory(
                    ns,
                    "a5",
                    id="a5",
                    tier=3,
                    importance=0.6,
                    tags=["a5"],
                    embedding=[1, 2, 3],
                    embedding_model="u",
                    create_time=T0 - 1000,
                )
            ]
        )
        vecs["a5"] = np.array([1.0, 2.0, 3.0])
        count: dict[str, int] = dict.fromkeys(vecs, 0)
        last: dict[str, float] = dict.fromkeys(vecs, T0 - 1000)

        def note(results: Any, when: float) -> None:
            for r in results:
                count[r.memory.id] += 1
                last[r.memory.id] = max(last[r.memory.id], when)

        note(search(c, ns, vecs["a0"], limit=2, as_of=T0 + 100), T0 + 100)
        note(search(c, ns, vecs["a1"], limit=2, as_of=T0 + 50), T0 + 50)
        note(
            search(c, ns, limit=1, where={"tags": "a2"}, strategy=pb.SEARCH_STRATEGY_RECENCY, as_of=T0 + 200),
            T0 + 200,
        )
        clock.advance(500)
        note(search(c, ns, vecs["a0"], limit=3), clock.now)  # as_of defaults to the clock
        # read_only searches return memories without counting them
        ro = search(c, ns, limit=10, strategy=pb.SEARCH_STRATEGY_IMPORTANCE, read_only=True, as_of=T0 + 9000)
        assert len(ro) == 6
        ro = search(c, ns, vecs["a5"], "u", limit=10, read_only=True)
        assert rids(ro) == ["a5"]
        # a batch counts every search in it (and read_only per search)
        b = raw(
            c,
            "BatchSearchMemories",
            pb.BatchSearchMemoriesRequest(
                searches=[
                    sreq(ns, vecs["a3"], limit=1, as_of=T0 + 300),
                    sreq(ns, vecs["a3"], limit=2, as_of=T0 + 400),
                    sreq(ns, vecs["a3"], limit=5, as_of=T0 + 9999, read_only=True),
                ]
            ),
        )
        note(b.responses[0].results, T0 + 300)
        note(b.responses[1].results, T0 + 400)
        # an empty search counts nothing
        assert search(c, ns, vecs["a0"], where={"tags": "nope"}) == []
        assert count["a5"] == 0 and sum(count.values()) == 2 + 2 + 1 + 3 + 1 + 2
        running.engine.flush_access()
        for k in vecs:
            m = c.get(ns, k)
            assert m.access_count == count[k], k
            assert ts(m.last_access_time) == pytest.approx(last[k], abs=1e-3), k

        # recency decays from creation by default; where the namespace's policy says last access,
        # the next search sees the new last access
        def recency_of_a3() -> float:
            [hit] = search(
                c,
                ns,
                limit=1,
                where={"tags": "a3"},
                strategy=pb.SEARCH_STRATEGY_RECENCY,
                as_of=T0 + 1000,
                read_only=True,
            )
            return hit.recency

        assert recency_of_a3() == pytest.approx(recency(T0 - 1000, T0 + 1000), abs=1e-6)
        by_access = pb.NamespaceConfig(
            namespace=ns, policy=pb.LifecyclePolicy(recency_basis=pb.RECENCY_BASIS_LAST_ACCESS)
        )
        mask = field_mask_pb2.FieldMask(paths=["policy.recency_basis"])
        raw(c, "UpdateNamespaceConfig", pb.UpdateNamespaceConfigRequest(config=by_access, update_mask=mask))
        assert recency_of_a3() == pytest.approx(recency(last["a3"], T0 + 1000), abs=1e-6)
        # nothing pending: a second flush changes nothing
        running.engine.flush_access()
        assert c.get(ns, "a5").access_count == 0
        assert ts(c.get(ns, "a5").last_access_time) == pytest.approx(T0 - 1000)


def test_search_accesses_feed_promotion(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0)
    ns = "user:promo"
    with connect(running) as c:
        c.create_batch(
            [
                build_memory(
                    ns,
                    "hot",
                    id="hot",
                    tier="slow",
                    importance=0.9,
                    tags=["hot"],
                    embedding=[1, 0, 0, 0],
                    embedding_model=MODEL,
                ),
                build_memory(
                    ns,
                    "cold",
                    id="cold",
                    tier="slow",
                    importance=0.9,
                    tags=["cold"],
                    embedding=[0, 1, 0, 0],
                    embedding_model=MODEL,
                ),
            ]
        )
        for _ in range(4):
            assert rids(search(c, ns, [1, 0, 0, 0], limit=1)) == ["hot"]
            clock.advance(1)
        for _ in range(3):  # read_only: not accesses
            assert rids(search(c, ns, [1, 0, 0, 0], limit=1, read_only=True)) == ["hot"]
        running.engine.flush_access()
        assert c.get(ns, "hot").access_count == 4
        r = c.consolidate(ns)
        assert r.promoted == 0
        assert c.get(ns, "hot").tier == pb.TIER_SLOW
        assert rids(search(c, ns, limit=1, where={"tags": "hot"}, strategy=pb.SEARCH_STRATEGY_RECENCY)) == [
            "hot"
        ]
        running.engine.flush_access()
        assert c.get(ns, "hot").access_count == 5
        r = c.consolidate(ns)
        assert r.promoted == 1
        [mv] = r.moves
        assert (mv.id, mv.from_tier, mv.to_tier, mv.reason) == (
            "hot",
            pb.TIER_SLOW,
            pb.TIER_MEDIUM,
            pb.MOVE_REASON_PROMOTE_ACCESS,
        )
        assert c.get(ns, "hot").tier == pb.TIER_MEDIUM
        assert c.get(ns, "cold").tier == pb.TIER_SLOW


# --------------------------------------------------------------------------------------------
# 7. Hit rate
# --------------------------------------------------------------------------------------------


def test_search_hit_rate(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock)
    a, b = "user:h/a", "user:h/b"
    with connect(running) as c:
        c.create_batch(
            [
                build_memory(a, "a1", id="a1", tier=1, embedding=[1, 0, 0, 0], embedding_model=MODEL),
                build_memory(a, "a2", id="a2", tier=2, embedding=[0, 1, 0, 0], embedding_model=MODEL),
                build_memory(b, "b1", id="b1", tier=3, embedding=[0, 0, 1, 0], embedding_model=MODEL),
            ]
        )
        s0 = c.stats()
        assert (s0.search_hits, s0.search_misses, s0.hit_rate) == (0, 0, 0.0)
        q = [1, 1, 1, 1]
        assert search(c, a, q)  # hit a
        assert search(c, a, q, read_only=True)  # hit a (read_only still counts as a search)
        assert not search(c, a, q, where={"tier": 4})  # miss a
        assert search(c, b, q)  # hit b
        assert not search(c, b, q, tiers=(1,))  # miss b
        assert search(c, a, strategy=pb.SEARCH_STRATEGY_RECENCY)  # hit a
        assert not search(c, "user:h/empty", q)  # miss (no memories there)
        batch = raw(
            c,
            "BatchSearchMemories",
            pb.BatchSearchMemoriesRequest(
                searches=[sreq(b, q), sreq(a, q, where={"kind": "nope"}), sreq(b, q, limit=1)]
            ),
        )
        assert [len(r.results) for r in batch.responses] == [1, 0, 1]  # hit b, miss a, hit b
        # invalid searches are not searches
        expect_invalid(lambda: search(c, a, q, where={"$or": []}), "filter.where")
        expect_invalid(lambda: search(c, b, q, limit=-1), "limit")
        s = c.stats()
        hits, misses = 3 + 3, 2 + 1 + 1  # a: 3 hits, 2 misses; b: 3 hits, 1 miss; empty: 1 miss
        assert (s.search_hits, s.search_misses) == (hits, misses)
        assert s.hit_rate == pytest.approx(hits / (hits + misses))
        sa = c.stats(a)
        assert (sa.search_hits, sa.search_misses) == (3, 2)
        assert sa.hit_rate == pytest.approx(3 / 5)
        sb = c.stats(b)
        assert (sb.search_hits, sb.search_misses) == (3, 1)
        assert sb.hit_rate == pytest.approx(0.75)
        se = c.stats("user:h/empty")
        assert (se.search_hits, se.search_misses, se.hit_rate) == (0, 1, 0.0)
        sn = c.stats("user:h/never")
        assert (sn.search_hits, sn.search_misses, sn.hit_rate) == (0, 0, 0.0)


def test_a_metadata_value_changed_to_an_equal_one_of_another_kind_is_filtered_as_the_new_kind(
    server_factory: Callable[..., Any], tmp_path: Path
) -> None:
    """1 == 1.0 == True in Python, but a filter tells a number from a boolean: an update from 1 to
    true (or to 1.0) must reach the filters (whose value arrays were already built), while serving,
    after a restart from a snapshot taken after it, and replayed onto a snapshot taken before it."""

    def found(c: MemoryClient, where: dict[str, Any]) -> list[str]:
        listed = sorted(m.id for m in c.list_memories("kinds", where=where))
        searched = sorted(h.memory.id for h in c.search("kinds", "flag", where=where, limit=10))
        assert listed == searched
        return listed

    data = tmp_path / "d"
    running = server_factory(data_dir=data)
    with connect(running) as c:
        one = c.create("kinds", "flag one", metadata={"flag": 1}).id
        other = c.create("kinds", "flag other", metadata={"flag": 1}).id
        assert found(c, {"metadata.flag": 1}) == sorted([one, other])  # (the filters' arrays built)
        assert found(c, {"metadata.flag": True}) == []
    running.stop()  # a snapshot holding 1 for both
    running = server_factory(data_dir=data, snapshot_on_shutdown=False)
    with connect(running) as c:
        assert found(c, {"metadata.flag": 1}) == sorted([one, other])
        c.update("kinds", one, metadata={"flag": True})
        c.update("kinds", other, metadata={"flag": 1.5})
        c.update("kinds", other, metadata={"flag": 1})
        assert found(c, {"metadata.flag": True}) == [one]
        assert found(c, {"metadata.flag": 1}) == [other]
    running.stop()  # no snapshot: the next start replays the updates onto the one before them
    for start in ("the updates replayed onto the older snapshot", "a snapshot holding the updates"):
        running = server_factory(data_dir=data)
        with connect(running) as c:
            assert found(c, {"metadata.flag": True}) == [one], start
            assert found(c, {"metadata.flag": 1}) == [other], start
        running.stop()  # (the first writes the snapshot the second starts from)


def test_metadata_integers_past_2_53_compare_exactly(server_factory: Callable[..., Any]) -> None:
    """int64 metadata (nanosecond times, snowflake ids) past what float64 holds exactly: two such
    values a few apart were equal to every filter (compared as floats)."""
    running = server_factory()
    a, b = 1759000000123456789, 1759000000123456800  # (the same float64)
    big = 2**62 + 1
    with connect(running) as c:
        ids = {
            c.create("big", "event a", metadata={"ts": a}).id: "a",
            c.create("big", "event b", metadata={"ts": b}).id: "b",
            c.create("big", "event f", metadata={"ts": float(a)}).id: "f",  # the float both round to
            c.create("big", "event s", metadata={"ts": 5}).id: "s",
            c.create("big", "event g", metadata={"ts": big}).id: "g",
        }

        def found(where: dict[str, Any]) -> list[str]:
            listed = sorted(ids[m.id] for m in c.list_memories("big", where=where))
            searched = sorted(ids[h.memory.id] for h in c.search("big", "event", where=where, limit=10))
            assert listed == searched
            return listed

        assert found({"metadata.ts": a}) == ["a"]
        assert found({"metadata.ts": {"$in": [b, 5]}}) == ["b", "s"]
        assert found({"metadata.ts": {"$ne": a}}) == ["b", "f", "g", "s"]
        assert found({"metadata.ts": {"$nin": [a, b]}}) == ["f", "g", "s"]
        assert found({"metadata.ts": {"$gt": a}}) == sorted(
            k for k, v in (("b", b), ("f", float(a)), ("g", big)) if v > a
        )
        assert found({"metadata.ts": {"$gte": b}}) == ["b", "g"]
        assert found({"metadata.ts": {"$lt": b}}) == sorted(
            k for k, v in (("a", a), ("f", float(a)), ("s", 5)) if v < b
        )
        assert found({"metadata.ts": {"$lte": a}}) == sorted(
            k for k, v in (("a", a), ("f", float(a)), ("s", 5)) if v <= a
        )
        assert found({"metadata.ts": float(a)}) == ["f"]
        assert found({"metadata.ts": big}) == ["g"] and found({"metadata.ts": big - 1}) == []
