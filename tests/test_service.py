"""End-to-end tests of tiermem.v1.MemoryService through a real gRPC server on loopback.

Every test talks to an in-process server started by the ``server_factory`` / ``server`` / ``client``
fixtures (conftest.py) with real LMDB in a temp dir; nothing is mocked. Expected values are computed
here from the contract in proto/tiermem/v1/memory.proto (scores with NumPy, surprise EMA by hand),
not read back from server internals.
"""

from __future__ import annotations

import base64
import contextlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc
import msgpack
import numpy as np
import pytest
from conftest import FakeClock
from google.protobuf import descriptor_pb2, field_mask_pb2, timestamp_pb2
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status

import tiermem
from tiermem.client import (
    AlreadyExistsError,
    InvalidArgumentError,
    MemoryClient,
    NotFoundError,
    TiermemError,
)
from tiermem.client.client import build_memory, metadata_dict
from tiermem.client.errors import from_rpc_error
from tiermem.server.config import ServerConfig
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb

NS = "user:ana/project:x"
MODEL = "test"
DIM = 8
BUILTIN = "tiermem-hash-v1"
T0 = 1_700_000_000.0  # FakeClock's default start
T0_INT = int(T0)
HALF_LIFE = ServerConfig().half_life_hours
FLOOR = 0.1
SERVICE = "tiermem.v1.MemoryService"


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def connect(running: RunningServer) -> Iterator[MemoryClient]:
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=30) as c:
        c.wait_ready()
        yield c


def list_all(
    c: MemoryClient, ns: str, *, page_size: int = 0, include_embedding: bool = False, **flt: Any
) -> list[pb.Memory]:
    """Every memory of a namespace matching the filter, following page tokens."""
    out: list[pb.Memory] = []
    token = ""
    while True:
        page, token = c.list_page(
            ns, page_size=page_size, page_token=token, include_embedding=include_embedding, **flt
        )
        out.extend(page)
        if not token:
            return out


def ts(t: Any) -> float:
    return t.seconds + t.nanos / 1e9


def unit(v: Any) -> np.ndarray:
    a = np.asarray(v, np.float64)
    return a / np.linalg.norm(a)


def raw(c: MemoryClient, method: str, request: Any) -> Any:
    """Call a generated stub method directly, converting failures like the client does."""
    try:
        return getattr(c.stub, method)(request, timeout=30)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def expect_invalid(fn: Callable[[], Any], field: str, reason: str | None = None) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as ei:
        fn()
    e = ei.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.fields, f"expected {field!r} in {e.fields} ({e.message})"
    if reason is not None:
        assert e.reason == reason, e
    return e


def expect_not_found(fn: Callable[[], Any], reason: str = "MEMORY_NOT_FOUND") -> NotFoundError:
    with pytest.raises(NotFoundError) as ei:
        fn()
    assert ei.value.code == grpc.StatusCode.NOT_FOUND
    assert ei.value.reason == reason, ei.value
    return ei.value


def ids_of(items: Any) -> list[str]:
    return [(x.memory.id if hasattr(x, "memory") else x.id) for x in items]


def vec(rng: np.random.Generator, dim: int = DIM) -> list[float]:
    return [float(x) for x in rng.normal(size=dim)]


def f32(x: float) -> float:
    return float(np.float32(x))


def expected_parts(
    q: Any,
    emb: Any,
    base_importance: float,
    tier: int,
    created: float,
    since: float,
    as_of: float,
    tau: float,
) -> tuple[float, float, float]:
    """(relevance, recency, decayed importance) per the contract, in float64; recency decays from
    ``since`` (the creation time, or the last access where the namespace ranks by it)."""
    rel = float(unit(emb) @ unit(q))
    rec = math.exp(-max(0.0, as_of - since) / tau)
    base = f32(base_importance)
    age_h = max(0.0, as_of - created) / 3600.0
    imp = max(base * 0.5 ** (age_h / HALF_LIFE[tier]), FLOOR * base)
    return rel, rec, imp


def state(c: MemoryClient, ns: str = NS) -> tuple[Any, ...]:
    """What a rejected request must not change."""
    s = c.stats()
    return (
        s.memory_count,
        s.writes_committed,
        sorted((sp.embedding_model, sp.dimension) for sp in s.spaces),
        [(m.id, m.SerializeToString(deterministic=True)) for m in list_all(c, ns, include_embedding=True)],
    )


# --------------------------------------------------------------------------------------------
# 1. CRUD
# --------------------------------------------------------------------------------------------


def test_create_and_get_every_field(client: MemoryClient) -> None:
    expire = time.time() + 365 * 86400.0
    emb = [3.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    meta = {"s": "text", "i": -(2**62), "one": 1, "d": 2.5, "b": True, "f": False}
    m = client.create(
        NS,
        "the cat sat on the mat",
        id="m-1",
        kind="fact",
        tier="fast",
        importance=0.75,
        source="agent:1",
        topic="pets",
        tags=["a", "b", "a"],
        metadata=meta,
        embedding=emb,
        embedding_model=MODEL,
        create_time=T0 + 0.25,
        expire_time=expire,
        token_cost=42,
        source_memory_ids=["p1", "p2"],
    )
    assert m.id == "m-1"
    assert m.namespace == NS
    assert m.content == "the cat sat on the mat"
    assert m.kind == "fact"
    assert m.tier == pb.TIER_FAST
    assert m.HasField("importance") and m.importance == 0.75
    assert m.source == "agent:1"
    assert m.topic == "pets"
    assert list(m.tags) == ["a", "b"]  # duplicates removed, order kept
    assert metadata_dict(m) == meta
    kinds = {k: v.WhichOneof("kind") for k, v in m.metadata.items()}
    assert kinds == {
        "s": "string_value",
        "i": "int_value",
        "one": "int_value",
        "d": "double_value",
        "b": "bool_value",
        "f": "bool_value",
    }
    assert len(m.embedding) == 0  # only returned on request
    assert m.embedding_model == MODEL
    assert m.create_time.seconds == int(T0) and m.create_time.nanos == 250_000_000
    assert ts(m.update_time) == pytest.approx(T0 + 0.25, abs=1e-6)
    assert ts(m.last_access_time) == pytest.approx(T0 + 0.25, abs=1e-6)
    assert m.access_count == 0 and m.success_count == 0 and m.surprise_score == 0.0
    assert m.token_cost == 42
    assert list(m.source_memory_ids) == ["p1", "p2"]
    assert m.HasField("expire_time") and ts(m.expire_time) == pytest.approx(expire, abs=1e-6)

    got = client.get(NS, "m-1")
    assert got == m
    with_vec = client.get(NS, "m-1", include_embedding=True)
    assert np.allclose(list(with_vec.embedding), [0.6, 0.8, 0, 0, 0, 0, 0, 0], atol=1e-6)
    assert math.isclose(float(np.linalg.norm(list(with_vec.embedding))), 1.0, abs_tol=1e-6)
    with_vec.ClearField("embedding")
    assert with_vec == m


def test_create_defaults_and_generated_ids(client: MemoryClient) -> None:
    before = time.time()
    a = client.create(NS, "héllo")  # 6 bytes
    b = client.create(NS, "héllo, again")
    after = time.time()
    assert re.fullmatch(r"[0-9a-f]{32}", a.id) and re.fullmatch(r"[0-9a-f]{32}", b.id)
    assert a.id != b.id
    assert a.kind == "observation"
    assert a.tier == pb.TIER_SLOW
    assert a.importance == pytest.approx(0.3)  # no importance given: the heuristic's baseline
    assert a.token_cost == 2  # ceil(6 / 4)
    assert a.embedding_model == BUILTIN
    assert not a.HasField("expire_time")
    assert before - 1 <= ts(a.create_time) <= after + 1
    assert a.update_time == a.create_time == a.last_access_time
    full = client.get(NS, a.id, include_embedding=True)
    assert len(full.embedding) == 384
    assert math.isclose(float(np.linalg.norm(list(full.embedding))), 1.0, abs_tol=1e-5)
    # importance 0 is a value, not "unset"
    z = client.create(NS, "zero", importance=0.0)
    assert z.HasField("importance") and z.importance == 0.0
    assert client.get(NS, z.id).importance == 0.0
    # TIER_UNSPECIFIED on create means the default tier
    u = client.create(NS, "unspecified", tier="TIER_UNSPECIFIED")
    assert u.tier == pb.TIER_SLOW


def test_update_with_field_mask(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock)
    with connect(running) as c:
        emb = [1.0, 2.0, 0, 0, 0, 0, 0, 2.0]
        m = c.create(
            NS,
            "original content",
            id="u1",
            kind="fact",
            tier="slow",
            importance=0.3,
            source="src",
            topic="top",
            tags=["x", "y"],
            metadata={"k": "v", "n": 3},
            embedding=emb,
            embedding_model=MODEL,
            token_cost=7,
            source_memory_ids=["s1"],
        )
        assert ts(m.update_time) == T0 and ts(m.create_time) == T0
        clock.advance(10)
        u = c.update(NS, "u1", importance=0.9, tags=["z"])
        assert u.importance == pytest.approx(0.9) and list(u.tags) == ["z"]
        assert ts(u.update_time) == T0 + 10
        # everything not in the mask is unchanged
        for name in (
            "content",
            "kind",
            "tier",
            "source",
            "topic",
            "metadata",
            "embedding_model",
            "create_time",
            "last_access_time",
            "token_cost",
            "source_memory_ids",
            "access_count",
        ):
            assert getattr(u, name) == getattr(m, name), name
        assert c.get(NS, "u1") == u
        stored = c.get(NS, "u1", include_embedding=True)
        assert np.allclose(list(stored.embedding), unit(emb), atol=1e-6)
        # the tag filter follows the update
        assert ids_of(list_all(c, NS, tags_any=["z"])) == ["u1"]
        assert ids_of(list_all(c, NS, tags_any=["x"])) == []

        clock.advance(5)
        u2 = c.update(
            NS,
            "u1",
            content="new content, longer than before",
            source="",
            metadata={"a": 1.5},
            kind="preference",
        )
        assert u2.content == "new content, longer than before"
        assert u2.token_cost == math.ceil(len(u2.content.encode()) / 4)  # re-estimated
        assert u2.source == "" and u2.kind == "preference"
        assert metadata_dict(u2) == {"a": 1.5}  # replaced, not merged
        assert u2.topic == "top" and list(u2.tags) == ["z"] and u2.importance == pytest.approx(0.9)
        assert ts(u2.update_time) == T0 + 15
        # a custom-space vector does not follow content
        assert np.allclose(list(c.get(NS, "u1", include_embedding=True).embedding), unit(emb), atol=1e-6)

        new_emb = [0, 0, 0, 5.0, 0, 0, 0, 0]
        u3 = c.update(
            NS, "u1", embedding=new_emb, embedding_model=MODEL, token_cost=99, source_memory_ids=["a", "b"]
        )
        assert u3.token_cost == 99 and list(u3.source_memory_ids) == ["a", "b"]
        got = c.get(NS, "u1", include_embedding=True)
        assert np.allclose(list(got.embedding), [0, 0, 0, 1, 0, 0, 0, 0], atol=1e-6)
        [hit] = c.search(NS, new_emb, embedding_model=MODEL, limit=1)
        assert hit.memory.id == "u1" and hit.relevance == pytest.approx(1.0, abs=1e-5)

        # expire_time can be set and cleared
        u4 = c.update(NS, "u1", expire_time=clock.now + 1000)
        assert ts(u4.expire_time) == clock.now + 1000
        req = pb.UpdateMemoryRequest(
            memory=pb.Memory(namespace=NS, id="u1"),
            update_mask=field_mask_pb2.FieldMask(paths=["expire_time"]),
        )
        u5 = raw(c, "UpdateMemory", req).memory
        assert not u5.HasField("expire_time")
        clock.advance(2000)
        assert c.get(NS, "u1").id == "u1"  # no longer expires


def test_update_reads_only_the_fields_its_mask_names(client: MemoryClient) -> None:
    """A field the update_mask leaves out is not read: a malformed value there (a metadata entry
    without a value, a timestamp outside its spec) neither refuses the update nor changes anything.
    Named, the same values are refused naming the field, and nothing changes."""
    c = client
    c.create(NS, "a memory with metadata", id="um1", metadata={"k": "v"}, topic="old")
    m = pb.Memory(namespace=NS, id="um1", topic="new")
    m.metadata["empty"].SetInParent()  # a Value with no kind set
    m.expire_time.nanos = -5
    m.create_time.seconds = -(10**15)
    req = pb.UpdateMemoryRequest(memory=m, update_mask=field_mask_pb2.FieldMask(paths=["topic"]))
    got = raw(c, "UpdateMemory", req).memory
    assert got.topic == "new" and metadata_dict(got) == {"k": "v"} and not got.HasField("expire_time")
    for path, field in (("metadata", "memory.metadata['empty']"), ("expire_time", "memory.expire_time")):
        bad = pb.UpdateMemoryRequest(memory=m, update_mask=field_mask_pb2.FieldMask(paths=["topic", path]))
        bad.memory.topic = "refused"
        expect_invalid(lambda bad=bad: raw(c, "UpdateMemory", bad), field)
    now = c.get(NS, "um1")
    assert now.topic == "new" and metadata_dict(now) == {"k": "v"} and not now.HasField("expire_time")


def test_update_content_reembeds_builtin_memory(client: MemoryClient) -> None:
    m = client.create(NS, "alpha beta gamma")
    client.create(NS, "completely different words here")
    client.update(NS, m.id, content="zebra giraffe elephant")
    [top, *_] = client.search(NS, "zebra giraffe elephant")
    assert top.memory.id == m.id
    assert top.relevance == pytest.approx(1.0, abs=1e-5)
    old = [r for r in client.search(NS, "alpha beta gamma") if r.memory.id == m.id]
    assert not old or old[0].relevance < 0.5


def test_update_tier_move_is_searchable_in_new_tier_only(client: MemoryClient) -> None:
    emb = [1.0, 0, 0, 0, 0, 0, 0, 0]
    client.create(NS, "mover", id="mv", tier="slow", embedding=emb, embedding_model=MODEL)
    client.create(
        NS, "stayer", id="st", tier="slow", embedding=[1.0, 0.1, 0, 0, 0, 0, 0, 0], embedding_model=MODEL
    )
    assert set(ids_of(client.search(NS, emb, embedding_model=MODEL, tiers=["slow"]))) == {"mv", "st"}
    assert ids_of(client.search(NS, emb, embedding_model=MODEL, tiers=["fast"])) == []
    before = {t.tier: t.memory_count for t in client.stats().tiers}

    moved = client.update(NS, "mv", tier="fast")
    assert moved.tier == pb.TIER_FAST
    assert ids_of(client.search(NS, emb, embedding_model=MODEL, tiers=["fast"])) == ["mv"]
    assert ids_of(client.search(NS, emb, embedding_model=MODEL, tiers=["slow"])) == ["st"]
    assert ids_of(client.search(NS, emb, embedding_model=MODEL)) == ["mv", "st"]  # once, not twice
    assert ids_of(list_all(client, NS, tiers=["fast"])) == ["mv"]
    after = {t.tier: t.memory_count for t in client.stats().tiers}
    assert after[pb.TIER_FAST] == before[pb.TIER_FAST] + 1
    assert after[pb.TIER_SLOW] == before[pb.TIER_SLOW] - 1
    # vector unchanged by the move
    assert np.allclose(list(client.get(NS, "mv", include_embedding=True).embedding), emb, atol=1e-6)


def test_update_to_other_embedding_space(client: MemoryClient) -> None:
    client.create(NS, "a", id="a", embedding=[1.0] * DIM, embedding_model=MODEL)
    client.create(NS, "b", id="b", embedding=[1.0] * DIM, embedding_model=MODEL)
    client.update(NS, "a", embedding=[0, 1.0, 0, 0], embedding_model="other")
    assert client.get(NS, "a").embedding_model == "other"
    assert ids_of(client.search(NS, [1.0] * DIM, embedding_model=MODEL)) == ["b"]
    assert ids_of(client.search(NS, [0, 1.0, 0, 0], embedding_model="other")) == ["a"]
    spaces = {sp.embedding_model: (sp.dimension, sp.live_vectors) for sp in client.stats().spaces}
    assert spaces[MODEL] == (DIM, 1) and spaces["other"] == (4, 1)


def test_vectors_of_extreme_magnitude_are_stored_at_unit_length(client: MemoryClient) -> None:
    """A vector whose norm is past float32's range, or made of subnormal numbers, is stored along
    its own direction at unit length: neither zeros (then no export of it restores) nor unscaled
    (then its relevance passes 1)."""
    for mid, values in (
        ("huge", [3e38] * 4 + [0.0] * (DIM - 4)),
        ("tiny", [1e-45, 1e-45] + [0.0] * (DIM - 2)),
    ):
        client.create(NS, mid, id=mid, embedding=values, embedding_model=MODEL)
        stored = np.array(client.get(NS, mid, include_embedding=True).embedding)
        direction = np.array(values, np.float64) / np.linalg.norm(np.array(values, np.float64))
        np.testing.assert_allclose(stored, direction, atol=1e-6)
        hit = client.search(NS, values, embedding_model=MODEL, strategy="similarity", limit=1)[0]
        assert hit.memory.id == mid and hit.relevance == pytest.approx(1.0, abs=1e-5)
    chunks = list(client.export_memories(NS))
    client.import_memories(chunks, target_namespace=NS + "-copy")
    assert client.get(NS + "-copy", "huge").embedding_model == MODEL


def test_a_reflections_importance_stays_at_its_minimum_or_above(client: MemoryClient) -> None:
    """An update can lower a reflection's importance only as far as a create accepts (0.8): an
    export of what an update left must restore."""
    client.create(NS, "what the week taught", id="r", kind="reflection", importance=0.9)
    with pytest.raises(InvalidArgumentError) as err:
        client.update(NS, "r", importance=0.1)
    assert err.value.fields == ["memory.importance"]
    assert client.get(NS, "r").importance == pytest.approx(0.9)
    assert client.update(NS, "r", importance=0.8).importance == pytest.approx(0.8)
    assert client.update(NS, "r", kind="observation", importance=0.1).importance == pytest.approx(0.1)
    client.import_memories(list(client.export_memories(NS)), target_namespace=NS + "-copy")
    assert client.get(NS + "-copy", "r").kind == "observation"


def test_delete(client: MemoryClient) -> None:
    emb = [0, 1.0, 0, 0, 0, 0, 0, 0]
    client.create(NS, "keep", id="keep", embedding=emb, embedding_model=MODEL)
    client.create(NS, "gone", id="gone", embedding=emb, embedding_model=MODEL)
    assert client.stats().memory_count == 2
    assert client.delete(NS, "gone") is None
    expect_not_found(lambda: client.get(NS, "gone"))
    assert ids_of(client.search(NS, emb, embedding_model=MODEL)) == ["keep"]
    assert ids_of(list_all(client, NS)) == ["keep"]
    assert client.stats().memory_count == 1
    expect_not_found(lambda: client.delete(NS, "gone"))
    # the id is free again
    again = client.create(NS, "back", id="gone", embedding=emb, embedding_model=MODEL)
    assert client.get(NS, "gone").content == "back" == again.content
    assert ids_of(list_all(client, NS)) == ["keep", "gone"]


# --------------------------------------------------------------------------------------------
# 2. Ids, idempotency, batches
# --------------------------------------------------------------------------------------------


def test_client_ids_and_duplicates(client: MemoryClient) -> None:
    client.create(NS, "first", id="dup")
    with pytest.raises(AlreadyExistsError) as ei:
        client.create(NS, "second", id="dup")
    assert ei.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert ei.value.reason == "MEMORY_ALREADY_EXISTS"
    assert client.get(NS, "dup").content == "first"
    assert client.stats().memory_count == 1
    # the same id in another namespace is a different memory
    other = client.create("other", "third", id="dup")
    assert other.namespace == "other" and client.get("other", "dup").content == "third"


def test_request_id_retry_and_reuse(client: MemoryClient) -> None:
    a = client.create(NS, "remember me", request_id="req-1", tags=["t"])
    b = client.create(NS, "remember me", request_id="req-1", tags=["t"])
    assert a.id == b.id and a == b
    assert client.stats().memory_count == 1
    assert len(list(list_all(client, NS))) == 1
    with pytest.raises(AlreadyExistsError) as ei:
        client.create(NS, "something else", request_id="req-1", tags=["t"])
    assert ei.value.reason == "REQUEST_ID_REUSED"
    assert client.stats().memory_count == 1
    # batch retries too
    batch = [{"namespace": NS, "content": f"b{i}"} for i in range(3)]
    first = client.create_batch(batch, request_id="req-b")
    second = client.create_batch(batch, request_id="req-b")
    assert ids_of(first) == ids_of(second) and len(set(ids_of(first))) == 3
    assert client.stats().memory_count == 4
    with pytest.raises(AlreadyExistsError) as ei:
        client.create_batch(batch[:2], request_id="req-b")
    assert ei.value.reason == "REQUEST_ID_REUSED"
    assert client.stats().memory_count == 4


def test_request_id_retry_after_delete_is_not_found(client: MemoryClient) -> None:
    m = client.create(NS, "short-lived", request_id="r-del")
    client.delete(NS, m.id)
    with pytest.raises(NotFoundError) as info:
        client.create(NS, "short-lived", request_id="r-del")
    assert info.value.reason == "REQUEST_RESULT_DELETED"
    assert client.stats().memory_count == 0  # the retry did not store it again


def test_request_id_retry_after_the_memory_expired_is_not_found(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A memory past its expire_time is deleted for every read, before the sweep removes it: a
    retry of its create says so (it returned the expired memory)."""
    clock = FakeClock()
    running = server_factory(clock=clock)
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        expires = datetime.fromtimestamp(T0 + 10, tz=timezone.utc)
        c.create(NS, "short-lived", request_id="r-exp", expire_time=expires)
        batch = [{"namespace": NS, "content": f"b{i}", "expire_time": expires} for i in range(2)]
        c.create_batch(batch, request_id="rb-exp")
        assert c.create(NS, "short-lived", request_id="r-exp", expire_time=expires).content == "short-lived"
        clock.advance(11)
        for retry in (
            lambda: c.create(NS, "short-lived", request_id="r-exp", expire_time=expires),
            lambda: c.create_batch(batch, request_id="rb-exp"),
        ):
            with pytest.raises(NotFoundError) as info:
                retry()
            assert info.value.reason == "REQUEST_RESULT_DELETED"
        assert c.stats().memory_count == 0


def test_batch_request_id_retry_after_partial_delete_is_not_found(client: MemoryClient) -> None:
    batch = [{"namespace": NS, "content": f"b{i}", "id": f"b{i}"} for i in range(3)]
    client.create_batch(batch, request_id="rb-del")
    client.delete(NS, "b0")
    with pytest.raises(NotFoundError) as info:
        client.create_batch(batch, request_id="rb-del")
    assert info.value.reason == "REQUEST_RESULT_DELETED"
    assert sorted(ids_of(list_all(client, NS))) == ["b1", "b2"]


def test_batch_create_in_order(client: MemoryClient) -> None:
    items = [build_memory(NS, f"item {i}", id=f"i{i}", importance=i / 10) for i in range(5)]
    out = client.create_batch(items)
    assert ids_of(out) == [f"i{i}" for i in range(5)]
    assert [m.content for m in out] == [f"item {i}" for i in range(5)]
    assert ids_of(list_all(client, NS)) == [f"i{i}" for i in range(5)]


def test_batch_with_invalid_item_stores_nothing(client: MemoryClient) -> None:
    client.create(NS, "pre-existing", id="pre")
    before = state(client)
    items = [{"namespace": NS, "content": f"c{i}", "id": f"n{i}"} for i in range(5)]
    items[3]["importance"] = 2.0
    e = expect_invalid(lambda: client.create_batch(items), "memories[3].importance")
    assert e.fields == ["memories[3].importance"]
    assert state(client) == before
    for i in range(5):
        expect_not_found(lambda i=i: client.get(NS, f"n{i}"))


def test_batch_with_existing_id_stores_nothing(client: MemoryClient) -> None:
    client.create(NS, "pre-existing", id="pre")
    before = state(client)
    items = [{"namespace": NS, "content": f"c{i}", "id": f"n{i}"} for i in range(4)]
    items.append({"namespace": NS, "content": "clash", "id": "pre"})
    items.append({"namespace": NS, "content": "after"})
    with pytest.raises(AlreadyExistsError) as ei:
        client.create_batch(items)
    assert ei.value.reason == "MEMORY_ALREADY_EXISTS"
    assert state(client) == before
    assert client.get(NS, "pre").content == "pre-existing"


def test_batch_with_duplicate_ids_rejected(client: MemoryClient) -> None:
    before = state(client)
    items = [
        {"namespace": NS, "content": f"c{i}", "id": "same" if i in (1, 3) else f"n{i}"} for i in range(5)
    ]
    e = expect_invalid(lambda: client.create_batch(items), "memories[3].id")
    assert "memories[1].id" in e.message
    assert state(client) == before
    # same id in different namespaces of one batch is fine
    out = client.create_batch(
        [{"namespace": "a", "content": "x", "id": "same"}, {"namespace": "b", "content": "y", "id": "same"}]
    )
    assert [(m.namespace, m.id) for m in out] == [("a", "same"), ("b", "same")]


def test_batch_dimension_conflict_inside_batch_rolls_back_space(client: MemoryClient) -> None:
    before = state(client)
    items = [
        {"namespace": NS, "content": "a", "embedding": [1.0] * 4, "embedding_model": "fresh"},
        {"namespace": NS, "content": "b", "embedding": [1.0] * 5, "embedding_model": "fresh"},
    ]
    expect_invalid(
        lambda: client.create_batch(items), "memories[1].embedding", "EMBEDDING_DIMENSION_MISMATCH"
    )
    assert state(client) == before
    assert "fresh" not in {sp.embedding_model for sp in client.stats().spaces}
    # the space was not created, so dimension 5 is now accepted
    client.create(NS, "c", embedding=[1.0] * 5, embedding_model="fresh")
    assert {sp.embedding_model: sp.dimension for sp in client.stats().spaces}["fresh"] == 5


def test_empty_batch_rejected(client: MemoryClient) -> None:
    expect_invalid(lambda: client.create_batch([]), "memories")


# --------------------------------------------------------------------------------------------
# 3. Bad input: INVALID_ARGUMENT naming the field, nothing changed
# --------------------------------------------------------------------------------------------

E = "e1"  # id of the existing memory in the bad-input fixture
V = [1.0, 0, 0, 0, 0, 0, 0, 0]


def _update_raw(c: MemoryClient, paths: list[str], **fields: Any) -> Any:
    req = pb.UpdateMemoryRequest(
        memory=pb.Memory(namespace=NS, id=E, **fields), update_mask=field_mask_pb2.FieldMask(paths=paths)
    )
    return raw(c, "UpdateMemory", req)


BAD_INPUT: list[tuple[str, Callable[[MemoryClient], Any], str, str | None]] = [
    (
        "nan",
        lambda c: c.create(NS, "x", embedding=[1.0, float("nan")] + [0.0] * 6, embedding_model=MODEL),
        "memory.embedding",
        None,
    ),
    (
        "inf",
        lambda c: c.create(NS, "x", embedding=[float("inf")] + [0.0] * 7, embedding_model=MODEL),
        "memory.embedding",
        None,
    ),
    (
        "-inf",
        lambda c: c.create(NS, "x", embedding=[float("-inf")] + [1.0] * 7, embedding_model=MODEL),
        "memory.embedding",
        None,
    ),
    (
        "zero_norm",
        lambda c: c.create(NS, "x", embedding=[0.0] * DIM, embedding_model=MODEL),
        "memory.embedding",
        None,
    ),
    (
        "wrong_dim",
        lambda c: c.create(NS, "x", embedding=[1.0] * (DIM + 1), embedding_model=MODEL),
        "memory.embedding",
        "EMBEDDING_DIMENSION_MISMATCH",
    ),
    (
        "wrong_dim_batch",
        lambda c: c.create_batch(
            [
                {"namespace": NS, "content": "ok"},
                {"namespace": NS, "content": "x", "embedding": [1.0, 2.0], "embedding_model": MODEL},
            ]
        ),
        "memories[1].embedding",
        "EMBEDDING_DIMENSION_MISMATCH",
    ),
    (
        "wrong_dim_update",
        lambda c: c.update(NS, E, embedding=[1.0, 2.0], embedding_model=MODEL),
        "memory.embedding",
        "EMBEDDING_DIMENSION_MISMATCH",
    ),
    ("embedding_without_model", lambda c: c.create(NS, "x", embedding=V), "memory.embedding_model", None),
    ("model_without_embedding", lambda c: c.create(NS, "x", embedding_model=MODEL), "memory.embedding", None),
    ("empty_namespace", lambda c: c.create("", "x"), "memory.namespace", None),
    ("namespace_double_slash", lambda c: c.create("a//b", "x"), "memory.namespace", None),
    ("namespace_leading_slash", lambda c: c.create("/a", "x"), "memory.namespace", None),
    ("namespace_trailing_slash", lambda c: c.create("a/", "x"), "memory.namespace", None),
    ("namespace_space", lambda c: c.create("a b", "x"), "memory.namespace", None),
    ("namespace_too_long", lambda c: c.create("n" * 257, "x"), "memory.namespace", None),
    ("importance_negative", lambda c: c.create(NS, "x", importance=-0.1), "memory.importance", None),
    ("importance_above_one", lambda c: c.create(NS, "x", importance=1.5), "memory.importance", None),
    ("importance_nan", lambda c: c.create(NS, "x", importance=float("nan")), "memory.importance", None),
    ("update_importance_above_one", lambda c: c.update(NS, E, importance=1.5), "memory.importance", None),
    ("update_importance_unset", lambda c: _update_raw(c, ["importance"]), "memory.importance", None),
    (
        "update_to_a_reflection_below_its_minimum",
        lambda c: c.update(NS, E, kind="reflection", importance=0.5),
        "memory.importance",
        None,
    ),
    (
        "update_kind_to_a_reflection_of_low_importance",
        lambda c: c.update(NS, E, kind="reflection"),
        "memory.kind",
        None,
    ),
    ("update_tier_unspecified", lambda c: c.update(NS, E, tier=None), "memory.tier", None),
    (
        "update_too_many_source_ids",
        lambda c: c.update(NS, E, source_memory_ids=[f"s{i}" for i in range(1001)]),
        "memory.source_memory_ids",
        "FIELD_TOO_LARGE",
    ),
    (
        "create_too_many_source_ids",
        lambda c: c.create(NS, "x", source_memory_ids=[f"s{i}" for i in range(1001)]),
        "memory.source_memory_ids",
        "FIELD_TOO_LARGE",
    ),
    (
        "transfer_unknown_mode",
        lambda c: raw(
            c,
            "TransferMemory",
            pb.TransferMemoryRequest(namespace=NS, id=E, mode=99, target_namespace="user:elsewhere"),
        ),
        "mode",
        None,
    ),
    (
        "build_summary_after_before_year_one",
        lambda c: raw(
            c,
            "BuildSummary",
            pb.BuildSummaryRequest(namespace=NS, created_after=timestamp_pb2.Timestamp(seconds=-62135596801)),
        ),
        "created_after",
        None,
    ),
    (
        "create_before_year_one",
        lambda c: raw(
            c,
            "CreateMemory",
            pb.CreateMemoryRequest(
                memory=pb.Memory(
                    namespace=NS, content="x", create_time=timestamp_pb2.Timestamp(seconds=-62135596801)
                )
            ),
        ),
        "memory.create_time",
        None,
    ),
    ("update_tier_out_of_range", lambda c: _update_raw(c, ["tier"], tier=7), "memory.tier", None),
    ("update_unknown_path", lambda c: _update_raw(c, ["bogus"]), "update_mask", None),
    ("update_create_time_path", lambda c: c.update(NS, E, create_time=T0), "update_mask", None),
    ("update_empty_mask", lambda c: _update_raw(c, []), "update_mask", None),
    ("update_empty_content", lambda c: c.update(NS, E, content=""), "memory.content", None),
    ("update_blank_content", lambda c: c.update(NS, E, content=" \n\t "), "memory.content", None),
    ("create_blank_content", lambda c: c.create(NS, "   "), "memory.content", None),
    ("create_invisible_content", lambda c: c.create(NS, "\u200b\ufeff \u2028"), "memory.content", None),
    ("update_invisible_content", lambda c: c.update(NS, E, content=" \u200b "), "memory.content", None),
    (
        "update_too_many_tags",
        lambda c: c.update(NS, E, tags=[f"t{i}" for i in range(33)]),
        "memory.tags",
        "FIELD_TOO_LARGE",
    ),
    (
        "oversized_metadata",
        lambda c: c.create(NS, "x", metadata={"big": "m" * 17000}),
        "memory.metadata",
        "FIELD_TOO_LARGE",
    ),
    (
        "too_many_metadata_keys",
        lambda c: c.create(NS, "x", metadata={f"k{i}": i for i in range(65)}),
        "memory.metadata",
        "FIELD_TOO_LARGE",
    ),
    ("metadata_nan", lambda c: c.create(NS, "x", metadata={"d": float("nan")}), "memory.metadata['d']", None),
    (
        "too_many_tags",
        lambda c: c.create(NS, "x", tags=[f"t{i}" for i in range(33)]),
        "memory.tags",
        "FIELD_TOO_LARGE",
    ),
    ("empty_tag", lambda c: c.create(NS, "x", tags=["ok", ""]), "memory.tags[1]", None),
    ("long_tag", lambda c: c.create(NS, "x", tags=["t" * 129]), "memory.tags[0]", None),
    ("empty_content", lambda c: c.create(NS, ""), "memory.content", None),
    ("bad_id", lambda c: c.create(NS, "x", id="has space"), "memory.id", None),
    ("bad_kind", lambda c: c.create(NS, "x", kind="Fact"), "memory.kind", None),
    (
        "bad_tier",
        lambda c: raw(
            c, "CreateMemory", pb.CreateMemoryRequest(memory=pb.Memory(namespace=NS, content="x", tier=9))
        ),
        "memory.tier",
        None,
    ),
    ("negative_token_cost", lambda c: c.create(NS, "x", token_cost=-1), "memory.token_cost", None),
    (
        "bad_source_memory_id",
        lambda c: c.create(NS, "x", source_memory_ids=["ok", "not ok"]),
        "memory.source_memory_ids[1]",
        None,
    ),
    ("long_source", lambda c: c.create(NS, "x", source="s" * 257), "memory.source", "FIELD_TOO_LARGE"),
    ("long_request_id", lambda c: c.create(NS, "x", request_id="r" * 129), "request_id", None),
    ("list_negative_page_size", lambda c: c.list_page(NS, page_size=-1), "page_size", None),
    ("list_bad_page_token", lambda c: c.list_page(NS, page_token="not-a-token!"), "page_token", None),
    (
        "list_token_of_other_kind",
        lambda c: c.list_page(
            NS, page_token=raw(c, "ListNamespaces", pb.ListNamespacesRequest(page_size=1)).next_page_token
        ),
        "page_token",
        None,
    ),
    (
        "list_forged_token_of_a_bool",  # (msgpack's True is no rid, though Python counts it an int)
        lambda c: c.list_page(NS, page_token=base64.urlsafe_b64encode(msgpack.packb(["v1", True])).decode()),
        "page_token",
        None,
    ),
    ("list_bad_namespace", lambda c: c.list_page("a//b"), "namespace", None),
    ("list_filter_bad_tier", lambda c: c.list_page(NS, tiers=[9]), "filter.tiers[0]", None),
    ("list_filter_bad_kind", lambda c: c.list_page(NS, kinds=["ok", "Bad Kind"]), "filter.kinds[1]", None),
    ("namespaces_negative_page_size", lambda c: list(c.list_namespaces(page_size=-1)), "page_size", None),
    (
        "namespaces_bad_page_token",
        lambda c: raw(c, "ListNamespaces", pb.ListNamespacesRequest(page_token="zzz")),
        "page_token",
        None,
    ),
    ("search_no_query", lambda c: c.search(NS, ""), "query_embedding", None),
    ("search_no_query_vector", lambda c: c.search(NS, [], embedding_model=MODEL), "query_embedding", None),
    ("search_negative_limit", lambda c: c.search(NS, V, embedding_model=MODEL, limit=-1), "limit", None),
    (
        "search_tau_zero",
        lambda c: c.search(NS, V, embedding_model=MODEL, recency_tau_seconds=0.0),
        "recency_tau_seconds",
        None,
    ),
    (
        "search_tau_negative",
        lambda c: c.search(NS, V, embedding_model=MODEL, recency_tau_seconds=-5.0),
        "recency_tau_seconds",
        None,
    ),
    ("search_alpha_negative", lambda c: c.search(NS, V, embedding_model=MODEL, alpha=-0.1), "alpha", None),
    ("search_beta_negative", lambda c: c.search(NS, V, embedding_model=MODEL, beta=-1.0), "beta", None),
    ("search_gamma_negative", lambda c: c.search(NS, V, embedding_model=MODEL, gamma=-0.5), "gamma", None),
    ("search_gamma_inf", lambda c: c.search(NS, V, embedding_model=MODEL, gamma=float("inf")), "gamma", None),
    (
        "search_scope_weight_huge",
        lambda c: c.search(NS, V, embedding_model=MODEL, scope_weights=[1e308]),
        "scope_weights[0]",
        None,
    ),
    ("search_alpha_huge", lambda c: c.search(NS, V, embedding_model=MODEL, alpha=1e7), "alpha", None),
    (
        "search_min_similarity",
        lambda c: c.search(NS, V, embedding_model=MODEL, min_similarity=1.5),
        "min_similarity",
        None,
    ),
    (
        "search_query_wrong_dim",
        lambda c: c.search(NS, [1.0, 2.0], embedding_model=MODEL),
        "query_embedding",
        "EMBEDDING_DIMENSION_MISMATCH",
    ),
    (
        "search_query_nan",
        lambda c: c.search(NS, [float("nan")] * DIM, embedding_model=MODEL),
        "query_embedding",
        None,
    ),
    ("search_query_without_model", lambda c: c.search(NS, V), "embedding_model", None),
    (
        "search_text_beside_a_vector_too_large",
        lambda c: c.search(NS, V, embedding_model=MODEL, keywords="q" * 65537),
        "query_text",
        "FIELD_TOO_LARGE",
    ),
    (
        "search_text_beside_a_vector_with_nul",
        lambda c: c.search(NS, V, embedding_model=MODEL, keywords="a\x00b"),
        "query_text",
        None,
    ),
    ("search_no_namespaces", lambda c: c.search([], V, embedding_model=MODEL), "namespaces", None),
    (
        "search_bad_namespace",
        lambda c: c.search([NS, "a b"], V, embedding_model=MODEL),
        "namespaces[1]",
        None,
    ),
    (
        "search_too_many_namespaces",
        lambda c: c.search([f"n{i}" for i in range(65)], V, embedding_model=MODEL),
        "namespaces",
        None,
    ),
    (
        "search_filter_bad_kind",
        lambda c: c.search(NS, V, embedding_model=MODEL, kinds=["UPPER"]),
        "filter.kinds[0]",
        None,
    ),
    (
        "search_filter_too_many_tags",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS],
                query_text="x",
                filter=pb.MemoryFilter(tags_any=[f"t{i}" for i in range(257)]),
            ),
        ),
        "filter.tags_any",
        "FIELD_TOO_LARGE",
    ),
    (
        "search_filter_too_many_tiers",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS], query_text="x", filter=pb.MemoryFilter(tiers=[1] * 257)
            ),
        ),
        "filter.tiers",
        "FIELD_TOO_LARGE",
    ),
    (
        "list_filter_too_many_kinds",
        lambda c: raw(
            c,
            "ListMemories",
            pb.ListMemoriesRequest(namespace=NS, filter=pb.MemoryFilter(kinds=[f"k{i}" for i in range(257)])),
        ),
        "filter.kinds",
        "FIELD_TOO_LARGE",
    ),
    (
        "search_too_many_scope_weights",
        lambda c: c.search(NS, V, embedding_model=MODEL, scope_weights=[0.5] * 129),
        "scope_weights",
        None,
    ),
    (
        "search_tier_weights_repeated",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS], query_text="x", tier_weights=[pb.TierWeight(tier=1, weight=0.5)] * 5
            ),
        ),
        "tier_weights",
        None,
    ),
    (
        "search_as_of_negative_nanos",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS], query_text="x", as_of=timestamp_pb2.Timestamp(seconds=T0_INT, nanos=-1)
            ),
        ),
        "as_of",
        None,
    ),
    (
        "search_filter_created_after_nanos_too_large",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS],
                query_text="x",
                filter=pb.MemoryFilter(created_after=timestamp_pb2.Timestamp(seconds=T0_INT, nanos=10**9)),
            ),
        ),
        "filter.created_after",
        None,
    ),
    (
        "search_batch_as_of_negative_nanos",
        lambda c: raw(
            c,
            "BatchSearchMemories",
            pb.BatchSearchMemoriesRequest(
                searches=[
                    pb.SearchMemoriesRequest(namespaces=[NS], query_text="x"),
                    pb.SearchMemoriesRequest(
                        namespaces=[NS],
                        query_text="x",
                        as_of=timestamp_pb2.Timestamp(seconds=T0_INT, nanos=-5),
                    ),
                ]
            ),
        ),
        "searches[1].as_of",
        None,
    ),
    (
        "create_time_negative_nanos",
        lambda c: raw(
            c,
            "CreateMemory",
            pb.CreateMemoryRequest(
                memory=pb.Memory(
                    namespace=NS, content="x", create_time=timestamp_pb2.Timestamp(seconds=T0_INT, nanos=-1)
                )
            ),
        ),
        "memory.create_time",
        None,
    ),
    (
        "search_filter_created_before_after_year_9999",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS],
                query_text="x",
                filter=pb.MemoryFilter(created_before=timestamp_pb2.Timestamp(seconds=253402300800)),
            ),
        ),
        "filter.created_before",
        None,
    ),
    (
        "search_tier_weights_a_tier_twice",
        lambda c: raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS],
                query_text="x",
                tier_weights=[pb.TierWeight(tier=1, weight=float("nan")), pb.TierWeight(tier=1, weight=0.5)],
            ),
        ),
        "tier_weights[1].tier",
        None,
    ),
    (
        "search_where_in_too_many_values",
        lambda c: c.search(NS, V, embedding_model=MODEL, where={"tags": {"$all": ["a"] * 257}}),
        "filter.where",
        None,
    ),
    (
        "feedback_as_of_negative_nanos",
        lambda c: raw(
            c,
            "RecordFeedback",
            pb.RecordFeedbackRequest(
                namespace=NS,
                items=[pb.Feedback(id=E)],
                as_of=timestamp_pb2.Timestamp(seconds=T0_INT, nanos=-1),
            ),
        ),
        "as_of",
        None,
    ),
    (
        "create_tag_zero_width_space",
        lambda c: c.create(NS, "x", tags=["de\u200bploy"]),
        "memory.tags[0]",
        None,
    ),
    (
        "create_tag_line_separator",
        lambda c: c.create(NS, "x", tags=["ok", "a\u2028b"]),
        "memory.tags[1]",
        None,
    ),
    (
        "create_tag_direction_override",
        lambda c: c.create(NS, "x", tags=["\u202edeploy"]),
        "memory.tags[0]",
        None,
    ),
    (
        "create_tag_byte_order_mark",
        lambda c: c.create(NS, "x", tags=["\ufeffdeploy"]),
        "memory.tags[0]",
        None,
    ),
    (
        "create_tag_hidden_tag_characters",
        lambda c: c.create(NS, "x", tags=["deploy\U000e0041"]),
        "memory.tags[0]",
        None,
    ),
    (
        "create_tag_trailing_joiner",
        lambda c: c.create(NS, "x", tags=["deploy\u200d"]),
        "memory.tags[0]",
        None,
    ),
    (
        "update_metadata_key_invisible",
        lambda c: c.update(NS, E, metadata={"owner\u2060": "ana"}),
        "memory.metadata['owner\\u2060']",
        None,
    ),
    ("feedback_empty", lambda c: c.feedback(NS, []), "items", None),
    (
        "feedback_bad_predicted",
        lambda c: c.feedback(NS, [{"id": E, "predicted_relevance": 1.5}]),
        "items[0].predicted_relevance",
        None,
    ),
    (
        "feedback_bad_actual",
        lambda c: c.feedback(NS, [{"id": E}, {"id": E, "actual_usefulness": -0.5}]),
        "items[1].actual_usefulness",
        None,
    ),
    ("feedback_bad_id", lambda c: c.feedback(NS, [{"id": ""}]), "items[0].id", None),
    ("get_empty_id", lambda c: c.get(NS, ""), "id", None),
    ("get_bad_namespace", lambda c: c.get("/a", E), "namespace", None),
    ("delete_bad_namespace", lambda c: c.delete("a//b", E), "namespace", None),
    ("delete_namespace_empty", lambda c: c.delete_namespace(""), "namespace", None),
    ("stats_bad_namespace", lambda c: c.stats("a b"), "namespace", None),
]


@pytest.fixture
def seeded(client: MemoryClient) -> MemoryClient:
    client.create(NS, "existing memory", id=E, embedding=V, embedding_model=MODEL, tags=["t"])
    client.create("zz-other", "another namespace, so namespace listings have a second page")
    return client


def _group(name: str) -> str:
    head = name.split("_")[0]
    return head if head in ("update", "list", "namespaces", "search", "feedback") else "create_and_other"


BAD_INPUT_GROUPS = sorted({_group(case[0]) for case in BAD_INPUT})


@pytest.mark.parametrize("group", BAD_INPUT_GROUPS)
def test_bad_input(seeded: MemoryClient, group: str) -> None:
    """Each case: INVALID_ARGUMENT, the field named in BadRequest, a reason, and no change at all.

    Cases are grouped (one server per group) to keep the file fast; every failing case is reported.
    """
    cases = [case for case in BAD_INPUT if _group(case[0]) == group]
    assert cases
    failures = []
    for name, call, field, reason in cases:
        before = state(seeded)
        try:
            call(seeded)
        except InvalidArgumentError as e:
            if e.code != grpc.StatusCode.INVALID_ARGUMENT or field not in e.fields:
                failures.append(f"{name}: fields {e.fields}, expected {field!r} ({e})")
            elif reason is not None and e.reason != reason:
                failures.append(f"{name}: reason {e.reason!r}, expected {reason!r}")
            elif not e.reason:
                failures.append(f"{name}: no ErrorInfo reason")
        except Exception as e:
            failures.append(f"{name}: raised {e!r}")
        else:
            failures.append(f"{name}: accepted")
        if state(seeded) != before:
            failures.append(f"{name}: the rejected request changed the server state")
    assert not failures, "\n".join(failures)


def test_oversized_content_names_limit(server_factory: Callable[..., RunningServer]) -> None:
    with connect(server_factory(max_content_bytes=100)) as c:
        e = expect_invalid(lambda: c.create(NS, "x" * 101), "memory.content", "FIELD_TOO_LARGE")
        assert "100" in e.message and "101" in e.message
        e = expect_invalid(lambda: c.create(NS, "é" * 51), "memory.content")  # 102 bytes, 51 characters
        assert "100" in e.message
        assert c.stats().memory_count == 0
        assert c.create(NS, "x" * 100).content == "x" * 100
        assert c.create(NS, "é" * 50).token_cost == 25
        c.create(NS, "short", id="s")
        expect_invalid(lambda: c.update(NS, "s", content="y" * 101), "memory.content")
        assert c.get(NS, "s").content == "short"
        expect_invalid(lambda: c.search(NS, "q" * 101), "query_text")
        assert c.stats().memory_count == 3


def test_labels_keep_joiners_and_flags_where_text_needs_them(client: MemoryClient) -> None:
    """Invisible characters are refused in labels (BAD_INPUT), but for those words and emoji need."""
    labels = [
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
        "\U0001f468\u200d\U0001f469",
        "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",
    ]
    m = client.create(NS, "x", tags=labels, metadata={label: True for label in labels})
    assert list(m.tags) == labels and set(m.metadata) == set(labels)
    assert [r.id for r in client.list_memories(NS, tags_any=[labels[2]])] == [m.id]


def test_tag_limit_counts_distinct_tags(client: MemoryClient) -> None:
    tags = [f"t{i % 32}" for i in range(40)]
    m = client.create(NS, "x", tags=tags)
    assert list(m.tags) == [f"t{i}" for i in range(32)]


def test_unknown_ids_not_found(seeded: MemoryClient) -> None:
    c = seeded
    before = state(c)
    expect_not_found(lambda: c.get(NS, "nope"))
    expect_not_found(lambda: c.update(NS, "nope", importance=0.1))
    expect_not_found(lambda: c.delete(NS, "nope"))
    expect_not_found(lambda: c.feedback(NS, [{"id": "nope"}]))
    expect_not_found(lambda: c.get("elsewhere", E))
    # feedback is all or nothing: a batch with one unknown id changes no counter
    e = expect_not_found(lambda: c.feedback(NS, [{"id": E, "success": True}, {"id": "nope"}]))
    assert "items[1]" in e.message
    assert c.get(NS, E).access_count == 0 and c.get(NS, E).success_count == 0
    expect_not_found(lambda: c.search(NS, V, embedding_model="no-such-model"), "EMBEDDING_SPACE_NOT_FOUND")
    assert state(c) == before


def test_raw_error_status_details(seeded: MemoryClient) -> None:
    stub = seeded.stub
    with pytest.raises(grpc.RpcError) as ei:
        stub.CreateMemory(
            pb.CreateMemoryRequest(memory=pb.Memory(namespace=NS, content="x", importance=2.0)), timeout=30
        )
    err = ei.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(err)
    assert status is not None and status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    infos, bads = [], []
    for d in status.details:
        if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            d.Unpack(info)
            infos.append(info)
        elif d.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            d.Unpack(bad)
            bads.append(bad)
    assert len(infos) == 1 and len(bads) == 1
    assert infos[0].domain == "tiermem"
    assert infos[0].reason == "INVALID_FIELD"
    assert [v.field for v in bads[0].field_violations] == ["memory.importance"]

    with pytest.raises(grpc.RpcError) as ei:
        stub.GetMemory(pb.GetMemoryRequest(namespace=NS, id="missing"), timeout=30)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    status = rpc_status.from_call(ei.value)
    assert status is not None
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.domain, info.reason) == ("tiermem", "MEMORY_NOT_FOUND")


# --------------------------------------------------------------------------------------------
# 4. Namespaces
# --------------------------------------------------------------------------------------------


def test_namespace_isolation(client: MemoryClient) -> None:
    a, b = "team:1/agent:a", "team:1/agent:b"
    emb = [0.5, 0.5, 0, 0, 0, 0, 0, 1.0]
    ma = client.create(a, "shared fact about paris", embedding=emb, embedding_model=MODEL, topic="A")
    mb = client.create(b, "shared fact about paris", embedding=emb, embedding_model=MODEL, topic="B")
    client.create(a, "same id", id="x", topic="A")
    client.create(b, "same id", id="x", topic="B")
    for _ in range(2):
        ra = client.search(a, emb, embedding_model=MODEL, limit=100)
        assert ids_of(ra) == [ma.id] and ra[0].memory.namespace == a
        rt = client.search(a, "same id", limit=100)  # built-in space: only the "x" memories are in it
        assert [(r.memory.namespace, r.memory.id, r.memory.topic) for r in rt] == [(a, "x", "A")]
    expect_not_found(lambda: client.get(b, ma.id))
    expect_not_found(lambda: client.update(b, ma.id, importance=0.2))
    expect_not_found(lambda: client.delete(b, ma.id))
    expect_not_found(lambda: client.feedback(b, [{"id": ma.id}]))
    assert client.get(a, "x").topic == "A" and client.get(b, "x").topic == "B"
    both = client.search([a, b], emb, embedding_model=MODEL, limit=100, strategy="comprehensive")
    assert sorted((r.memory.namespace, r.memory.id) for r in both) == sorted([(a, ma.id), (b, mb.id)])
    assert both[0].score == pytest.approx(both[1].score, abs=1e-6)
    # a parent namespace is not a wildcard
    assert client.search("team:1", emb, embedding_model=MODEL) == []
    assert [m.namespace for m in list_all(client, a)] == [a, a]


def test_list_and_delete_namespaces(client: MemoryClient) -> None:
    layout = {"team/a": 3, "team/a/sub": 2, "team/b": 1, "team/c": 4, "other": 2}
    for ns, n in layout.items():
        client.create_batch([{"namespace": ns, "content": f"{ns} {i}"} for i in range(n)])
    allns = [(i.name, i.memory_count) for i in client.list_namespaces()]
    assert allns == sorted(layout.items())
    team = [(i.name, i.memory_count) for i in client.list_namespaces("team/")]
    assert team == [("team/a", 3), ("team/a/sub", 2), ("team/b", 1), ("team/c", 4)]
    # explicit paging
    pages, token = [], ""
    while True:
        resp = raw(
            client, "ListNamespaces", pb.ListNamespacesRequest(prefix="team/", page_size=3, page_token=token)
        )
        pages.append([n.name for n in resp.namespaces])
        token = resp.next_page_token
        if not token:
            break
    assert pages == [["team/a", "team/a/sub", "team/b"], ["team/c"]]
    resp = raw(client, "ListNamespaces", pb.ListNamespacesRequest(prefix="team/", page_size=4))
    assert len(resp.namespaces) == 4 and resp.next_page_token == ""
    assert [i.name for i in client.list_namespaces("team/", page_size=1)] == [n for n, _ in team]
    assert list(client.list_namespaces("nothing-here")) == []

    before_stats = client.stats()
    assert before_stats.namespace_count == 5
    assert client.delete_namespace("team/a") == 3
    assert [i.name for i in client.list_namespaces("team/")] == ["team/a/sub", "team/b", "team/c"]
    assert list(list_all(client, "team/a")) == []
    assert len(list(list_all(client, "team/a/sub"))) == 2
    assert len(list(list_all(client, "other"))) == 2
    s = client.stats()
    assert s.memory_count == before_stats.memory_count - 3 and s.namespace_count == 4
    assert client.stats("team/a").memory_count == 0
    assert client.stats("team/c").memory_count == 4
    assert client.search("team/a", "team/a 0") == []
    assert client.delete_namespace("team/a") == 0
    # the namespace can be used again
    client.create("team/a", "fresh")
    assert [(i.name, i.memory_count) for i in client.list_namespaces("team/a")] == [
        ("team/a", 1),
        ("team/a/sub", 2),
    ]


# --------------------------------------------------------------------------------------------
# 5. List paging and filters
# --------------------------------------------------------------------------------------------


def _listing_specs() -> list[dict[str, Any]]:
    specs = []
    for i in range(25):
        tags = ["even" if i % 2 == 0 else "odd"] + (["three"] if i % 3 == 0 else [])
        specs.append(
            {
                "namespace": NS,
                "content": f"memory number {i}",
                "id": f"L{i:02d}",
                "tags": tags,
                "kind": "fact" if i % 2 else "observation",
                "tier": i % 4 + 1,
                "source": f"s{i % 2}",
                "topic": f"t{i % 5}",
                "create_time": T0 + 60 * i,
            }
        )
    return specs


def test_list_paging_and_filters(client: MemoryClient) -> None:
    specs = _listing_specs()
    # insert out of create_time order in two batches plus singles: listing is creation order
    client.create_batch(specs[:10])
    for s in specs[10:15]:
        client.create(**s)
    client.create_batch(specs[15:])
    client.create("other/ns", "not listed", create_time=T0)
    all_ids = [s["id"] for s in specs]

    pages, token, tokens = [], "", []
    for _ in range(5):
        page, token = client.list_page(NS, page_size=10, page_token=token)
        pages.append(ids_of(page))
        tokens.append(token)
        if not token:
            break
    assert [len(p) for p in pages] == [10, 10, 5]
    assert tokens[0] and tokens[1] and tokens[2] == "" and tokens[0] != tokens[1]
    flat = [i for p in pages for i in p]
    assert flat == all_ids and len(set(flat)) == 25
    # default page size (100) returns everything on one page
    page, token = client.list_page(NS)
    assert ids_of(page) == all_ids and token == ""
    # tokens are reusable (stateless)
    again, _ = client.list_page(NS, page_size=10, page_token=tokens[0])
    assert ids_of(again) == pages[1]

    def expect(pred: Callable[[int, dict[str, Any]], bool]) -> list[str]:
        return [s["id"] for i, s in enumerate(specs) if pred(i, s)]

    cases: list[tuple[dict[str, Any], list[str]]] = [
        ({"tiers": ["fast", "glacial"]}, expect(lambda i, s: s["tier"] in (1, 4))),
        ({"kinds": ["fact"]}, expect(lambda i, s: s["kind"] == "fact")),
        ({"kinds": ["fact", "observation"]}, all_ids),
        ({"kinds": ["nonexistent"]}, []),
        ({"tags_any": ["three", "odd"]}, expect(lambda i, s: i % 3 == 0 or i % 2 == 1)),
        ({"tags_all": ["odd", "three"]}, expect(lambda i, s: i % 3 == 0 and i % 2 == 1)),
        ({"tags_any": ["unknown-tag"]}, []),
        ({"source": "s1"}, expect(lambda i, s: i % 2 == 1)),
        ({"source": "unknown"}, []),
        ({"topic": "t2"}, expect(lambda i, s: i % 5 == 2)),
        ({"created_after": T0 + 600, "created_before": T0 + 1200}, expect(lambda i, s: 10 <= i < 20)),
        ({"created_after": T0 + 610}, expect(lambda i, s: i >= 11)),
        ({"created_before": T0 + 60}, ["L00"]),
        (
            {"tiers": ["medium"], "tags_all": ["three"], "source": "s1"},
            expect(lambda i, s: s["tier"] == 2 and i % 3 == 0 and i % 2 == 1),
        ),
    ]
    for flt, want in cases:
        assert ids_of(list_all(client, NS, **flt)) == want, flt
        assert ids_of(list_all(client, NS, page_size=3, **flt)) == want, flt  # filters across pages
    with_vec, _ = client.list_page(NS, page_size=2, include_embedding=True)
    assert all(len(m.embedding) == 384 for m in with_vec)
    without, _ = client.list_page(NS, page_size=2)
    assert all(len(m.embedding) == 0 for m in without)


def test_list_exact_multiple_has_no_trailing_page(client: MemoryClient) -> None:
    client.create_batch([{"namespace": NS, "content": f"c{i}"} for i in range(20)])
    p1, t1 = client.list_page(NS, page_size=10)
    p2, t2 = client.list_page(NS, page_size=10, page_token=t1)
    assert len(p1) == 10 and len(p2) == 10 and t1 and t2 == ""
    # a deleted item between pages does not disturb the next page
    client.delete(NS, p2[0].id)
    p2b, _ = client.list_page(NS, page_size=10, page_token=t1)
    assert ids_of(p2b) == ids_of(p2)[1:]


# --------------------------------------------------------------------------------------------
# 6. Search scoring
# --------------------------------------------------------------------------------------------


@pytest.fixture
def scored(server_factory: Callable[..., RunningServer]) -> Iterator[tuple[MemoryClient, FakeClock, dict]]:
    clock = FakeClock()
    running = server_factory(clock=clock)
    rng = np.random.default_rng(6)
    now = clock.now
    ages = rng.choice(np.arange(1, 240), size=12, replace=False) * 1800.0  # up to 5 days, distinct
    specs: dict[str, dict[str, Any]] = {}
    for i in range(12):
        specs[f"m{i}"] = {
            "namespace": NS,
            "content": f"memory {i}",
            "id": f"m{i}",
            "tier": i % 4 + 1,
            "importance": round(float(rng.uniform(0.05, 1.0)), 3),
            "embedding": vec(rng),
            "embedding_model": MODEL,
            "create_time": now - float(ages[i]),
            "kind": "fact" if i % 3 == 0 else "observation",
        }
    with connect(running) as c:
        c.create_batch(list(specs.values()))
        # a last access apart from create_time: recency (by creation, the default) must ignore it
        c.feedback(NS, [{"id": "m5"}], as_of=now - 600)
        yield c, clock, {"specs": specs}


def _expected(data: dict, q: Any, as_of: float, tau: float, a: float, b: float, g: float) -> dict[str, tuple]:
    out = {}
    for k, s in data["specs"].items():
        rel, rec, imp = expected_parts(
            q, s["embedding"], s["importance"], s["tier"], s["create_time"], s["create_time"], as_of, tau
        )
        out[k] = (a * rel + b * rec + g * imp, rel, rec, imp)
    return out


def search_raw_sum(c: MemoryClient, *args: Any, **kw: Any) -> list[pb.SearchResult]:
    """A search under the comprehensive strategy: the raw weighted sum these tests compute."""
    return c.search(*args, strategy="comprehensive", **kw)


def _check_components(results: list[pb.SearchResult], exp: dict[str, tuple]) -> None:
    for r in results:
        score, rel, rec, imp = exp[r.memory.id]
        assert r.relevance == pytest.approx(rel, abs=1e-5), r.memory.id
        assert r.recency == pytest.approx(rec, abs=1e-5), r.memory.id
        assert r.importance == pytest.approx(imp, abs=1e-5), r.memory.id
        assert r.score == pytest.approx(score, abs=1e-5), r.memory.id
    scores = [r.score for r in results]
    assert scores == sorted(scores, reverse=True)


def _ranked(exp: dict[str, tuple], part: int = 0) -> list[str]:
    return sorted(exp, key=lambda k: -exp[k][part])


def test_a_text_search_naming_another_space_is_refused(client: MemoryClient) -> None:
    """A text query is embedded by the server's embedder: naming another embedding space with it
    (which only a query vector can search) is INVALID_ARGUMENT naming embedding_model, not a search
    of the embedder's space that looks like an answer from the named one."""
    own = client.create(NS, "the deploy failed on friday").embedding_model
    client.create(NS, "a vector of its own", embedding=[1.0, 0.0], embedding_model="mine")
    e = expect_invalid(lambda: client.search(NS, "deploy", embedding_model="mine"), "embedding_model")
    assert own in str(e) and "mine" in str(e)
    assert [h.memory.content for h in client.search(NS, "deploy", embedding_model=own, limit=1)] == [
        "the deploy failed on friday"
    ]


def test_search_score_components(scored: tuple[MemoryClient, FakeClock, dict]) -> None:
    c, clock, data = scored
    rng = np.random.default_rng(60)
    as_of = clock.now + 3600
    for q in [vec(rng) for _ in range(3)] + [data["specs"]["m3"]["embedding"]]:
        res = search_raw_sum(
            c,
            NS,
            q,
            embedding_model=MODEL,
            limit=50,
            as_of=as_of,
            recency_tau_seconds=7200.0,
            alpha=0.6,
            beta=0.25,
            gamma=0.4,
        )
        exp = _expected(data, q, as_of, 7200.0, 0.6, 0.25, 0.4)
        assert len(res) == 12
        _check_components(res, exp)
        assert ids_of(res) == _ranked(exp)
        assert all(len(r.memory.embedding) == 0 for r in res)
    # defaults: alpha .5, beta .3, gamma .2, tau one day, as_of = server clock
    q = vec(rng)
    res = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50)
    exp = _expected(data, q, clock.now, 86400.0, 0.5, 0.3, 0.2)
    _check_components(res, exp)
    assert ids_of(res) == _ranked(exp)
    # the server clock is the default as_of
    clock.advance(7200)
    res = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50)
    _check_components(res, _expected(data, q, clock.now, 86400.0, 0.5, 0.3, 0.2))
    # as_of before creation: no negative ages
    early = T0 - 10 * 86400
    res = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=early)
    assert all(r.recency == pytest.approx(1.0) for r in res)
    _check_components(res, _expected(data, q, early, 86400.0, 0.5, 0.3, 0.2))
    # include_embedding returns the stored normalized vectors
    res = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=3, include_embedding=True)
    for r in res:
        assert np.allclose(list(r.memory.embedding), unit(data["specs"][r.memory.id]["embedding"]), atol=1e-6)


def test_search_weights_change_ranking(scored: tuple[MemoryClient, FakeClock, dict]) -> None:
    c, clock, data = scored
    as_of = clock.now
    q = data["specs"]["m7"]["embedding"]
    exp = _expected(data, q, as_of, 86400.0, 1, 1, 1)

    importance_only = search_raw_sum(
        c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, alpha=0, beta=0, gamma=1
    )
    assert ids_of(importance_only) == _ranked(exp, 3)
    assert all(r.score == pytest.approx(r.importance, abs=1e-6) for r in importance_only)

    relevance_only = search_raw_sum(
        c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, alpha=1, beta=0, gamma=0
    )
    assert ids_of(relevance_only) == _ranked(exp, 1)
    assert relevance_only[0].memory.id == "m7" and relevance_only[0].relevance == pytest.approx(1.0, abs=1e-5)

    recency_only = search_raw_sum(
        c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, alpha=0, beta=1, gamma=0
    )
    assert ids_of(recency_only) == _ranked(exp, 2)

    # the three rankings really differ, so the weights matter
    assert len({tuple(ids_of(x)) for x in (importance_only, relevance_only, recency_only)}) == 3
    # all-zero weights are allowed: every score is 0
    zero = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, alpha=0, beta=0, gamma=0)
    assert len(zero) == 12 and all(r.score == 0.0 for r in zero)


def test_search_min_similarity_limit_filters(scored: tuple[MemoryClient, FakeClock, dict]) -> None:
    c, clock, data = scored
    as_of = clock.now
    q = data["specs"]["m2"]["embedding"]
    exp = _expected(data, q, as_of, 86400.0, 0.5, 0.3, 0.2)
    rels = sorted(v[1] for v in exp.values())
    # a threshold between two well-separated similarities
    gaps = [(rels[i + 1] - rels[i], i) for i in range(len(rels) - 1) if rels[i] > -0.5]
    _, gi = max(gaps)
    thr = (rels[gi] + rels[gi + 1]) / 2
    res = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, min_similarity=thr)
    want = {k for k, v in exp.items() if v[1] >= thr}
    assert 0 < len(want) < 12
    assert set(ids_of(res)) == want
    assert all(r.relevance >= thr for r in res)
    _check_components(res, exp)

    full = ids_of(search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of))
    assert full == _ranked(exp)
    assert ids_of(search_raw_sum(c, NS, q, embedding_model=MODEL, limit=3, as_of=as_of)) == full[:3]
    assert ids_of(search_raw_sum(c, NS, q, embedding_model=MODEL, limit=1, as_of=as_of)) == full[:1]
    assert len(search_raw_sum(c, NS, q, embedding_model=MODEL, limit=0, as_of=as_of)) == 10  # default limit

    facts = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, kinds=["fact"])
    assert ids_of(facts) == [k for k in full if data["specs"][k]["kind"] == "fact"]
    tiers = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, tiers=["fast", "glacial"])
    assert ids_of(tiers) == [k for k in full if data["specs"][k]["tier"] in (1, 4)]
    none = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, kinds=["nothing"])
    assert none == []
    # created_before filter keeps the older half
    cutoff = sorted(s["create_time"] for s in data["specs"].values())[6]
    old = search_raw_sum(c, NS, q, embedding_model=MODEL, limit=50, as_of=as_of, created_before=cutoff)
    assert ids_of(old) == [k for k in full if data["specs"][k]["create_time"] < cutoff]
    assert len(old) == 6


def test_expired_memories_are_hidden(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    with connect(server_factory(clock=clock)) as c:
        emb = [1.0, 1.0, 0, 0, 0, 0, 0, 0]
        c.create(NS, "temporary", id="tmp", embedding=emb, embedding_model=MODEL, expire_time=clock.now + 100)
        c.create(NS, "permanent", id="perm", embedding=emb, embedding_model=MODEL)
        past = c.create(
            NS, "already expired", id="past", embedding=emb, embedding_model=MODEL, expire_time=clock.now - 1
        )
        assert past.id == "past"
        expect_not_found(lambda: c.get(NS, "past"))

        def visible() -> tuple[set[str], set[str]]:
            return (
                set(ids_of(c.search(NS, emb, embedding_model=MODEL, limit=50))),
                set(ids_of(list_all(c, NS))),
            )

        assert visible() == ({"tmp", "perm"}, {"tmp", "perm"})
        clock.advance(99)
        assert c.get(NS, "tmp").id == "tmp"
        assert visible() == ({"tmp", "perm"}, {"tmp", "perm"})
        clock.advance(1)  # expire_time reached
        expect_not_found(lambda: c.get(NS, "tmp"))
        assert visible() == ({"perm"}, {"perm"})
        expect_not_found(lambda: c.update(NS, "tmp", importance=0.9))
        expect_not_found(lambda: c.delete(NS, "tmp"))  # (as every read: it was answered OK)
        expect_not_found(lambda: c.delete(NS, "past"))
        # search with an old as_of still does not resurrect it: expiry follows the server clock
        assert ids_of(c.search(NS, emb, embedding_model=MODEL, as_of=T0)) == ["perm"]


def test_feedback_on_expired_memory_is_not_found(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    with connect(server_factory(clock=clock)) as c:
        c.create(NS, "temporary", id="tmp", expire_time=clock.now + 10)
        clock.advance(10)
        expect_not_found(lambda: c.get(NS, "tmp"))
        expect_not_found(lambda: c.feedback(NS, [{"id": "tmp", "success": True}]))


# --------------------------------------------------------------------------------------------
# 7. Ranking exactness on the ANN path
# --------------------------------------------------------------------------------------------


def test_ann_ranking_matches_brute_force(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    running = server_factory(clock=clock, exact_search_max_rows=50)
    n, dim = 2000, 32
    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    importance = rng.uniform(0, 1, n).astype(np.float32)
    created = clock.now - np.round(rng.uniform(0, 5 * 86400, n))
    tiers = rng.integers(1, 5, n)
    keep = rng.uniform(0, 1, n) < 0.3
    ids = [f"r{i}" for i in range(n)]
    with connect(running) as c:
        for start in range(0, n, 500):
            batch = [
                build_memory(
                    NS,
                    f"rec {i}",
                    id=ids[i],
                    embedding=vecs[i],
                    embedding_model="ann",
                    importance=float(importance[i]),
                    create_time=float(created[i]),
                    tier=int(tiers[i]),
                    tags=["keep"] if keep[i] else ["drop"],
                )
                for i in range(start, start + 500)
            ]
            assert len(c.create_batch(batch)) == 500
        assert c.stats().memory_count == n

        unit_vecs = vecs.astype(np.float64) / np.linalg.norm(vecs.astype(np.float64), axis=1, keepdims=True)
        hl = np.asarray(HALF_LIFE)[tiers]
        as_of = clock.now
        base = importance.astype(np.float64)
        age_h = np.maximum(0, as_of - created) / 3600
        imp = np.maximum(base * 0.5 ** (age_h / hl), FLOOR * base)
        tau = 86400.0
        rec = np.exp(-np.maximum(0, as_of - created) / tau)
        queries = [rng.normal(size=dim) for _ in range(8)]
        queries += [vecs[i] + 0.3 * rng.normal(size=dim) for i in rng.choice(n, 8, replace=False)]
        weights = [(0.5, 0.3, 0.2), (1.0, 0.0, 0.0), (0.3, 0.4, 0.4)]
        report = []
        for flt_name, flt, allowed in (
            ("all", {}, np.ones(n, bool)),
            ("tags_any", {"tags_any": ["keep"]}, keep),
        ):
            for a, b, g in weights:
                overlaps = []
                for q in queries:
                    rel = unit_vecs @ unit(q)
                    score = a * rel + b * rec + g * imp
                    score[~allowed] = -np.inf
                    want = [ids[i] for i in np.argsort(-score, kind="stable")[:10]]
                    res = search_raw_sum(
                        c,
                        NS,
                        q,
                        embedding_model="ann",
                        limit=10,
                        as_of=as_of,
                        alpha=a,
                        beta=b,
                        gamma=g,
                        **flt,
                    )
                    got = ids_of(res)
                    assert len(got) == 10 and len(set(got)) == 10
                    for r in res:
                        i = int(r.memory.id[1:])
                        assert allowed[i], "filter violated"
                        assert r.score == pytest.approx(score[i], abs=1e-5)
                    assert [r.score for r in res] == sorted((r.score for r in res), reverse=True)
                    overlaps.append(len(set(got) & set(want)) / 10)
                mean = float(np.mean(overlaps))
                report.append((flt_name, (a, b, g), mean, min(overlaps)))
        for name, w, mean, low in report:
            print(f"ANN overlap filter={name} weights={w} mean={mean:.3f} min={low:.2f}")
        for flt_name, w, mean, _ in report:
            assert mean >= 0.9, f"overlap {mean:.3f} for filter={flt_name} weights={w}"


# --------------------------------------------------------------------------------------------
# 8. Feedback
# --------------------------------------------------------------------------------------------


def test_feedback_surprise_counters_and_access_time(server_factory: Callable[..., RunningServer]) -> None:
    clock = FakeClock()
    with connect(server_factory(clock=clock)) as c:
        c.create(NS, "fb", id="a", embedding=[1.0] * DIM, embedding_model=MODEL)
        s = 0.0
        steps: list[tuple[dict[str, Any], float | None]] = [
            ({"predicted_relevance": 0.2, "actual_usefulness": 0.9}, 0.9 - 0.2),
            ({"actual_usefulness": 0.8}, 0.8 - 0.5),  # predicted defaults to 0.5
            ({"predicted_relevance": 0.9, "actual_usefulness": 0.1}, 0.0),  # negative gain counts as 0
            ({"success": True}, None),  # no actual: surprise unchanged
            ({"predicted_relevance": 0.0, "actual_usefulness": 1.0, "success": True}, 1.0),
        ]
        successes = 0
        for n, (item, gain) in enumerate(steps, start=1):
            when = T0 + 100 * n
            clock.advance(when - clock.now)  # (an as_of later than now counts as now: see below)
            if gain is not None:
                s = 0.3 * gain + 0.7 * s
            successes += int(item.get("success", False))
            [m] = c.feedback(NS, [{"id": "a", **item}], as_of=when)
            assert m.surprise_score == pytest.approx(s, abs=1e-5), n
            assert m.access_count == n
            assert m.success_count == successes
            assert ts(m.last_access_time) == when
            assert c.get(NS, "a") == m
        # feedback without as_of uses the server clock, and a later as_of counts as now
        clock.advance(5000 - 500)
        [m] = c.feedback(NS, [{"id": "a"}])
        assert ts(m.last_access_time) == clock.now and m.surprise_score == pytest.approx(s, abs=1e-5)
        [m] = c.feedback(NS, [{"id": "a"}], as_of=clock.now + 3600)
        assert ts(m.last_access_time) == clock.now
        # recency is measured from the creation by default, from the last access where asked
        [hit] = c.search(NS, [1.0] * DIM, embedding_model=MODEL)
        assert hit.recency == pytest.approx(math.exp(-5000 / 86400))
        c.update_namespace_config(NS, recency_basis="last_access")
        [hit] = c.search(NS, [1.0] * DIM, embedding_model=MODEL)
        assert hit.recency == pytest.approx(1.0)
        # stats average the surprise
        slow = next(t for t in c.stats().tiers if t.tier == pb.TIER_SLOW)
        assert slow.avg_surprise == pytest.approx(s, abs=1e-5)


def test_feedback_repeated_ids_compound_in_order(client: MemoryClient) -> None:
    for mid in ("a", "b", "c"):
        client.create(NS, mid, id=mid, create_time=time.time() - 100)
    when = float(int(time.time()) - 50)  # after creation, not after now (server clock is real time here)
    out = client.feedback(
        NS,
        [
            {"id": "a", "predicted_relevance": 0.0, "actual_usefulness": 1.0},
            {"id": "b", "predicted_relevance": 0.5, "actual_usefulness": 0.5},
            {"id": "a", "predicted_relevance": 0.5, "actual_usefulness": 0.5, "success": True},
            {"id": "b", "predicted_relevance": 0.0, "actual_usefulness": 1.0},
            {"id": "a", "success": True},
            {"id": "c"},
        ],
        as_of=when,
    )
    assert ids_of(out) == ["a", "b", "a", "b", "a", "c"]
    a, b, cc = client.get(NS, "a"), client.get(NS, "b"), client.get(NS, "c")
    # a: gain 1 then gain 0 -> 0.3 then 0.21; b: gain 0 then gain 1 -> 0 then 0.3 (order matters)
    assert a.surprise_score == pytest.approx(0.21, abs=1e-6)
    assert b.surprise_score == pytest.approx(0.3, abs=1e-6)
    assert cc.surprise_score == 0.0
    assert (a.access_count, b.access_count, cc.access_count) == (3, 2, 1)
    assert (a.success_count, b.success_count, cc.success_count) == (2, 0, 0)
    assert out[0].access_count == 3 and out[0].surprise_score == pytest.approx(0.21, abs=1e-6)
    assert ts(a.last_access_time) == ts(b.last_access_time) == ts(cc.last_access_time) == when


# --------------------------------------------------------------------------------------------
# 9. Persistence across restart
# --------------------------------------------------------------------------------------------


def _snapshot_state(c: MemoryClient, queries: list[list[float]], as_of: float) -> dict[str, Any]:
    return {
        "memories": [
            m.SerializeToString(deterministic=True) for m in list_all(c, NS, include_embedding=True)
        ],
        "text": [
            (r.memory.id, round(r.score, 5))
            for r in c.search(NS, "persistent text memory", limit=20, as_of=as_of)
        ],
        "vector": [
            [
                (r.memory.id, round(r.score, 5))
                for r in c.search(NS, q, embedding_model=MODEL, limit=20, as_of=as_of)
            ]
            for q in queries
        ],
        "count": c.stats().memory_count,
        "tiers": [(t.tier, t.memory_count) for t in c.stats().tiers],
        "spaces": sorted((sp.embedding_model, sp.dimension, sp.live_vectors) for sp in c.stats().spaces),
    }


def test_persistence_across_restart(server_factory: Callable[..., RunningServer], tmp_path: Path) -> None:
    data_dir = tmp_path / "persist"
    rng = np.random.default_rng(9)
    queries = [vec(rng) for _ in range(3)]
    as_of = T0 + 86400
    first = server_factory(data_dir=data_dir)
    with connect(first) as c:
        vs = {f"v{i}": vec(rng) for i in range(8)}
        for k, v in vs.items():
            c.create(
                NS,
                f"vector memory {k}",
                id=k,
                embedding=v,
                embedding_model=MODEL,
                tier="slow",
                create_time=T0,
                importance=0.4,
            )
        c.create_batch(
            [
                {
                    "namespace": NS,
                    "content": f"persistent text memory {i}",
                    "id": f"t{i}",
                    "create_time": T0 + i,
                }
                for i in range(4)
            ],
            request_id="batch-req",
        )
        c.update(NS, "v1", tier="fast")
        c.update(NS, "v2", embedding=vs["v0"], embedding_model=MODEL)
        c.delete(NS, "v3")
        c.delete(NS, "t0")
        c.feedback(NS, [{"id": "v4", "actual_usefulness": 1.0, "success": True}], as_of=T0 + 10)
        single = c.create(NS, "persistent text memory single", request_id="single-req", create_time=T0)
        before = _snapshot_state(c, queries, as_of)
        writes = c.stats().writes_committed
    assert writes == 15  # 8 creates, 1 batch, 2 updates, 2 deletes, 1 feedback, 1 create
    first.stop(0)
    index_files = list((data_dir / "indexes").iterdir())
    assert index_files, "a clean stop writes index snapshots"

    second = server_factory(data_dir=data_dir)
    with connect(second) as c:
        assert _snapshot_state(c, queries, as_of) == before
        expect_not_found(lambda: c.get(NS, "v3"))
        expect_not_found(lambda: c.get(NS, "t0"))
        q = vs["v1"]
        assert "v1" in ids_of(c.search(NS, q, embedding_model=MODEL, tiers=["fast"]))
        assert "v1" not in ids_of(c.search(NS, q, embedding_model=MODEL, tiers=["slow"]))
        v4 = c.get(NS, "v4")
        assert (v4.access_count, v4.success_count) == (1, 1)
        assert v4.surprise_score == pytest.approx(0.3 * 0.5, abs=1e-6)
        # request ids survive the restart: a retry returns the original memory and stores nothing
        again = c.create(NS, "persistent text memory single", request_id="single-req", create_time=T0)
        assert again == single
        assert c.stats().memory_count == before["count"]
        with pytest.raises(AlreadyExistsError) as ei:
            c.create(NS, "other content", request_id="single-req")
        assert ei.value.reason == "REQUEST_ID_REUSED"
        # new writes continue after the restored ones
        new = c.create(NS, "after restart")
        assert new.id != single.id
        assert ids_of(list_all(c, NS))[-1] == new.id
        assert c.stats().writes_committed <= 2  # counts since start, not since the data dir was made
        before = _snapshot_state(c, queries, as_of)
    second.stop(0)

    for p in (data_dir / "indexes").iterdir():
        p.unlink()
    third = server_factory(data_dir=data_dir)
    with connect(third) as c:
        assert _snapshot_state(c, queries, as_of) == before
        assert "v1" in ids_of(c.search(NS, vs["v1"], embedding_model=MODEL, tiers=["fast"]))
        stats = {sp.embedding_model: sp for sp in c.stats().spaces}
        # rebuilt from LMDB: only live vectors are indexed
        assert stats[MODEL].indexed_vectors + stats[MODEL].pending_vectors == stats[MODEL].live_vectors == 7


# --------------------------------------------------------------------------------------------
# 10. Stats
# --------------------------------------------------------------------------------------------


def test_stats(client: MemoryClient) -> None:
    s0 = client.stats()
    assert s0.memory_count == 0 and s0.namespace_count == 0
    assert [t.tier for t in s0.tiers] == [pb.TIER_FAST, pb.TIER_MEDIUM, pb.TIER_SLOW, pb.TIER_GLACIAL]
    assert all(t.memory_count == 0 and t.avg_importance == 0 for t in s0.tiers)
    assert s0.server_version == tiermem.__version__
    assert s0.uptime_seconds > 0 and s0.storage_bytes > 0

    w0 = s0.writes_committed
    client.create("A", "f1", tier="fast", importance=0.2)
    assert client.stats().writes_committed == w0 + 1
    client.create_batch(
        [
            {"namespace": "A", "content": "f2", "tier": "fast", "importance": 0.4},
            {"namespace": "A", "content": "m1", "tier": "medium", "importance": 1.0},
            {"namespace": "A", "content": "s1", "embedding": [1.0] * DIM, "embedding_model": MODEL},
            {"namespace": "A", "content": "s2", "importance": 0.1, "id": "s2"},
            {"namespace": "A", "content": "s3", "importance": 0.3},
        ]
    )
    client.create("B", "g1", tier="glacial", importance=0.9, embedding=[1.0, 2.0] * 4, embedding_model=MODEL)
    s = client.stats()
    assert s.writes_committed == w0 + 3
    assert s.commit_groups >= 1
    assert s.memory_count == 7 and s.namespace_count == 2
    got = [(t.tier, t.memory_count) for t in s.tiers]
    assert got == [(1, 2), (2, 1), (3, 3), (4, 1)]
    avg = {t.tier: t.avg_importance for t in s.tiers}
    assert avg[1] == pytest.approx((f32(0.2) + f32(0.4)) / 2, abs=1e-6)
    assert avg[3] == pytest.approx((f32(0.3) + f32(0.1) + f32(0.3)) / 3, abs=1e-6)  # s1: heuristic 0.3
    assert avg[4] == pytest.approx(f32(0.9), abs=1e-6)
    spaces = {
        sp.embedding_model: (sp.dimension, sp.live_vectors, sp.indexed_vectors + sp.pending_vectors)
        for sp in s.spaces
    }
    assert spaces == {BUILTIN: (384, 5, 5), MODEL: (DIM, 2, 2)}

    sa = client.stats("A")
    assert sa.memory_count == 6 and sa.namespace_count == 1
    assert [(t.tier, t.memory_count) for t in sa.tiers] == [(1, 2), (2, 1), (3, 3), (4, 0)]
    assert {sp.embedding_model for sp in sa.spaces} == {BUILTIN, MODEL}  # spaces are server-wide
    sn = client.stats("nobody")
    assert sn.memory_count == 0 and sn.namespace_count == 0

    # a failed write is not counted; a delete and a tier move are
    with pytest.raises(AlreadyExistsError):
        client.create("A", "dup", id="s2")
    assert client.stats().writes_committed == w0 + 3
    client.delete("A", "s2")
    s2 = client.stats()
    assert s2.writes_committed == w0 + 4
    assert s2.memory_count == 6
    spaces = {
        sp.embedding_model: (sp.live_vectors, sp.indexed_vectors + sp.pending_vectors) for sp in s2.spaces
    }
    assert spaces[BUILTIN] == (4, 5)  # the deleted vector is a tombstone
    client.update("B", client.list_page("B")[0][0].id, tier="fast")
    s3 = client.stats()
    assert s3.writes_committed == w0 + 5
    assert [(t.tier, t.memory_count) for t in s3.tiers] == [(1, 3), (2, 1), (3, 2), (4, 0)]
    assert {
        sp.embedding_model: (sp.live_vectors, sp.indexed_vectors + sp.pending_vectors) for sp in s3.spaces
    }[MODEL] == (2, 3)


# --------------------------------------------------------------------------------------------
# 11. Health and reflection
# --------------------------------------------------------------------------------------------


def test_health_and_reflection(client: MemoryClient) -> None:
    health = health_pb2_grpc.HealthStub(client.channel)
    for name in ("", SERVICE):
        resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    with pytest.raises(grpc.RpcError) as ei:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND

    refl = reflection_pb2_grpc.ServerReflectionStub(client.channel)
    responses = list(
        refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
        )
    )
    assert len(responses) == 1
    names = {s.name for s in responses[0].list_services_response.service}
    assert SERVICE in names
    assert "grpc.health.v1.Health" in names
    responses = list(
        refl.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)]), timeout=10
        )
    )
    protos = responses[0].file_descriptor_response.file_descriptor_proto
    assert protos, responses[0]
    files = [descriptor_pb2.FileDescriptorProto.FromString(p) for p in protos]
    memory_file = next(f for f in files if f.package == "tiermem.v1")
    assert "MemoryService" in [s.name for s in memory_file.service]


def test_health_not_serving_after_stop(server_factory: Callable[..., RunningServer]) -> None:
    running = server_factory()
    with connect(running) as c:
        c.create(NS, "x")
        health = health_pb2_grpc.HealthStub(c.channel)
        assert (
            health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=10).status
            == health_pb2.HealthCheckResponse.SERVING
        )
    running.stop(0)
    with MemoryClient(f"127.0.0.1:{running.port}", timeout=2) as c, pytest.raises(TiermemError):
        c.get(NS, "x")


def test_the_handler_pool_drains_queued_calls_and_waits_for_running_ones() -> None:
    """What a stopping server waits on before it closes LMDB: calls still queued are dropped, a
    running one is waited for, and a drain that times out says so (it returns False)."""
    from tiermem.server.transport.process import HandlerPool

    pool = HandlerPool(1)
    release, ran = threading.Event(), []
    running = pool.submit(release.wait, 30)
    queued = pool.submit(ran.append, "queued")
    assert not pool.drain(0.2)  # (the running call holds it)
    assert queued.cancelled() and not running.done()
    release.set()
    assert pool.drain(5) and running.result() is True and ran == []


# --------------------------------------------------------------------------------------------
# 12. Concurrency
# --------------------------------------------------------------------------------------------


def test_concurrent_creates_and_searches(client: MemoryClient) -> None:
    n_threads, per_thread = 8, 50
    created: list[list[str]] = [[] for _ in range(n_threads)]
    errors: list[BaseException] = []
    done = threading.Event()
    search_counts = []

    def writer(t: int) -> None:
        try:
            rng = np.random.default_rng(t)
            for i in range(per_thread):
                m = client.create(
                    NS, f"thread {t} memory {i}", embedding=vec(rng), embedding_model=MODEL, tags=[f"t{t}"]
                )
                created[t].append(m.id)
        except BaseException as e:  # reported below
            errors.append(e)

    def searcher(seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        n = 0
        try:
            while not done.is_set():
                res = client.search(NS, vec(rng), embedding_model=MODEL, limit=5)
                assert len(res) <= 5
                res = client.search(NS, "thread memory", limit=5)
                n += 1
        except BaseException as e:
            errors.append(e)
        search_counts.append(n)

    # the space exists before the searchers start
    client.create("warm", "warm", embedding=[1.0] * DIM, embedding_model=MODEL)
    w0 = client.stats().writes_committed
    g0 = client.stats().commit_groups
    threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
    searchers = [threading.Thread(target=searcher, args=(s,)) for s in range(2)]
    for th in searchers + threads:
        th.start()
    for th in threads:
        th.join(60)
    done.set()
    for th in searchers:
        th.join(60)
    assert not errors, errors
    all_ids = [i for ids in created for i in ids]
    assert len(all_ids) == n_threads * per_thread and len(set(all_ids)) == len(all_ids)
    listed = ids_of(list_all(client, NS, page_size=1000))
    assert sorted(listed) == sorted(all_ids)
    for t in range(n_threads):
        # per-thread creation order is kept
        assert ids_of(list_all(client, NS, tags_any=[f"t{t}"])) == created[t]
    s = client.stats()
    assert s.memory_count == n_threads * per_thread + 1
    writes, groups = s.writes_committed - w0, s.commit_groups - g0
    assert writes == n_threads * per_thread
    print(f"concurrency: {writes} writes in {groups} commit groups; searches per thread {search_counts}")
    assert sum(search_counts) > 0


def test_concurrent_same_id_and_same_request_id(client: MemoryClient) -> None:
    n = 8
    barrier = threading.Barrier(n)
    outcomes: list[Any] = [None] * n

    def same_id(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = client.create(NS, f"racer {i}", id="race").content
        except AlreadyExistsError as e:
            outcomes[i] = e.reason
        except BaseException as e:
            outcomes[i] = e

    threads = [threading.Thread(target=same_id, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    winners = [o for o in outcomes if isinstance(o, str) and o.startswith("racer")]
    assert len(winners) == 1, outcomes
    assert outcomes.count("MEMORY_ALREADY_EXISTS") == n - 1, outcomes
    assert client.get(NS, "race").content == winners[0]

    barrier = threading.Barrier(n)
    got: list[Any] = [None] * n

    def same_request(i: int) -> None:
        barrier.wait()
        try:
            got[i] = client.create(NS, "idempotent", request_id="same-req").id
        except BaseException as e:
            got[i] = e

    threads = [threading.Thread(target=same_request, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert all(isinstance(g, str) for g in got), got
    assert len(set(got)) == 1
    assert [m.content for m in list_all(client, NS)].count("idempotent") == 1


# --------------------------------------------------------------------------------------------
# The Python client's search options (strategies, scopes, hybrid, read_only, explain)
# --------------------------------------------------------------------------------------------


def test_client_search_options_reach_the_server(server_factory: Callable[..., RunningServer]) -> None:
    """Every SearchMemoriesRequest option the engine supports is reachable from MemoryClient.search,
    with the same results as the request built by hand."""
    clock = FakeClock()
    running = server_factory(clock=clock, search_records_access=True, access_flush_seconds=0)
    with connect(running) as c:
        parent, child = "org:a", "org:a/proj:b"
        c.create(parent, "parent note on rust lifetimes", id="p1", importance=0.9)
        clock.advance(60)
        c.create(child, "child note on python generators", id="c1", importance=0.5)
        clock.advance(60)
        c.create(child, "child note on rust borrow checker", id="c2", importance=0.2)
        clock.advance(60)

        # Strategies by name, no query needed for the single-signal orderings.
        newest = c.search(child, strategy="recency", read_only=True)
        assert [r.memory.id for r in newest] == ["c2", "c1"]
        by_importance = c.search(child, strategy="IMPORTANCE", read_only=True)
        assert [r.memory.id for r in by_importance] == ["c1", "c2"]
        with pytest.raises(ValueError, match="unknown search strategy"):
            c.search(child, "rust", strategy="loudest")
        with pytest.raises(ValueError, match="unknown tier"):
            c.search(child, "rust", tier_weights={"lukewarm": 1.0})
        with pytest.raises(ValueError, match="rrf_k only apply with hybrid"):
            c.search(child, "rust", rrf_k=10)

        # Ancestors: the parent's memory joins at scope weight 0.8 (explained).
        scoped = c.search(child, "rust", include_ancestors=True, explain=True, read_only=True)
        ids = {r.memory.id: r for r in scoped}
        assert set(ids) == {"p1", "c1", "c2"}
        assert ids["p1"].explanation.scope_weight == pytest.approx(0.8)
        assert ids["c2"].explanation.scope_weight == pytest.approx(1.0)
        custom = c.search(
            child, "rust", include_ancestors=True, scope_weights=[1.0, 0.5], explain=True, read_only=True
        )
        assert {r.memory.id: r.explanation.scope_weight for r in custom}["p1"] == pytest.approx(0.5)

        # Tier weights (by name) under the weighted strategy.
        weighted = c.search(
            child, "rust", strategy="weighted", tier_weights={"slow": 0.25}, explain=True, read_only=True
        )
        assert len(weighted) == 2
        assert all(r.explanation.strategy == pb.SEARCH_STRATEGY_WEIGHTED for r in weighted)
        assert all(r.explanation.tier_weight == pytest.approx(0.25) for r in weighted)  # all are SLOW

        # Hybrid: keyword ranks are reported; the same request built by hand gives the same ranking.
        fused = c.search(
            child, "borrow checker", hybrid=True, rrf_k=10, keyword_weight=2.0, explain=True, read_only=True
        )
        assert fused[0].memory.id == "c2" and fused[0].explanation.keyword_rank == 1
        req = pb.SearchMemoriesRequest(
            namespaces=[child], query_text="borrow checker", limit=10, read_only=True, explain=True
        )
        req.hybrid.enabled, req.hybrid.rrf_k, req.hybrid.keyword_weight = True, 10, 2.0
        by_hand = raw(c, "SearchMemories", req).results
        assert [r.memory.id for r in fused] == [r.memory.id for r in by_hand]
        assert [r.score for r in fused] == [r.score for r in by_hand]
        # Hybrid with the caller's own vector: the keywords come separately.
        c1 = c.get(child, "c1", include_embedding=True)
        own = c.search(
            child,
            c1.embedding,
            embedding_model=c1.embedding_model,
            hybrid=True,
            keywords="borrow checker",
            explain=True,
            read_only=True,
        )
        ranks = {r.memory.id: (r.explanation.vector_rank, r.explanation.keyword_rank) for r in own}
        assert ranks == {"c1": (1, 0), "c2": (2, 1)}  # vector ranks from c1's vector, keywords match c2
        with pytest.raises(ValueError, match="keywords"):
            c.search(child, "rust", hybrid=True, keywords="borrow")

        # read_only: results are not counted as accessed; without it they are.
        assert running.engine.flush_access() == 0  # the searches above were read-only: nothing recorded
        before = c.get(child, "c2").access_count
        c.search(child, "rust borrow", read_only=True)
        running.engine.flush_access()
        assert c.get(child, "c2").access_count == before
        c.search(child, "rust borrow")
        running.engine.flush_access()  # (access_flush_seconds=0: recorded when flushed)
        assert c.get(child, "c2").access_count == before + 1


def test_range_bounds_take_any_timestamp_and_held_times_stop_at_5138(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A filter's or a summary window's bound may be any Timestamp (year 9999 excludes nothing);
    a time a memory holds, or a search's as_of, is refused past year 5138 with one message, as
    before year 1."""
    from google.protobuf.timestamp_pb2 import Timestamp

    running = server_factory()
    y9999, y6000 = Timestamp(seconds=253402300799), Timestamp(seconds=127_000_000_000)
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        m = c.create(
            NS, "the deploy moved to friday. it waits for the freeze", embedding=V, embedding_model=MODEL
        )
        window = pb.MemoryFilter(created_after=Timestamp(seconds=-62135596800), created_before=y9999)
        listed = raw(c, "ListMemories", pb.ListMemoriesRequest(namespace=NS, filter=window))
        assert [x.id for x in listed.memories] == [m.id]
        found = raw(
            c,
            "SearchMemories",
            pb.SearchMemoriesRequest(
                namespaces=[NS], query_embedding=V, embedding_model=MODEL, filter=window
            ),
        )
        assert [h.memory.id for h in found.results] == [m.id]
        summary = raw(
            c, "BuildSummary", pb.BuildSummaryRequest(namespace=NS, max_tokens=50, created_before=y9999)
        )
        assert list(summary.source_memory_ids) == [m.id]
        refused = [
            ("memory.create_time", "CreateMemory", pb.CreateMemoryRequest(memory=pb.Memory(namespace=NS, content="x", create_time=y6000))),
            ("memory.create_time", "CreateMemory", pb.CreateMemoryRequest(memory=pb.Memory(namespace=NS, content="x", create_time=Timestamp(seconds=-62135596801)))),
            ("memory.expire_time", "CreateMemory", pb.CreateMemoryRequest(memory=pb.Memory(namespace=NS, content="x", expire_time=y9999))),
            ("as_of", "SearchMemories", pb.SearchMemoriesRequest(namespaces=[NS], query_text="x", as_of=y6000)),
        ]  # fmt: skip
        for field_, method, request in refused:
            with pytest.raises(InvalidArgumentError) as e:
                raw(c, method, request)
            assert e.value.fields == [field_] and "between years 1 and 5138" in str(e.value), (
                field_,
                e.value,
            )
        past = pb.MemoryFilter(created_before=Timestamp(seconds=253402300800))  # (year 10000: no Timestamp)
        with pytest.raises(InvalidArgumentError) as e:
            raw(c, "ListMemories", pb.ListMemoriesRequest(namespace=NS, filter=past))
        assert e.value.fields == ["filter.created_before"] and "years 1 and 9999" in str(e.value)
        assert c.stats().memory_count == 1
