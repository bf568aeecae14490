"""Hostile input gets INVALID_ARGUMENT, never INTERNAL (issue 26): undecodable bytes, filter numbers
beyond int64, filters nested hundreds of levels deep, names with a trailing newline, and a seeded
fuzz over every RPC. A real server on loopback; raw calls send bytes no client would build."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor, field_mask_pb2, message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_reflection.v1alpha import reflection, reflection_pb2

from tiermem.client import MemoryClient
from tiermem.client.errors import InvalidArgumentError, TiermemError, from_rpc_error
from tiermem.server.transport.app import RunningServer
from tiermem.server.transport.decoding import MEMORY_SERVICE, REASON, method_handlers
from tiermem.v1 import memory_pb2 as pb

METHODS: dict[str, MethodDescriptor] = {m.name: m for m in MEMORY_SERVICE.methods}
NS = "hostile"
TIMEOUT = 30.0


# -- raw calls ----------------------------------------------------------------------------------------
def path_of(method: MethodDescriptor) -> str:
    return f"/{MEMORY_SERVICE.full_name}/{method.name}"


def raw_call(channel: grpc.Channel, method: MethodDescriptor, payload: bytes | list[bytes]) -> list[bytes]:
    """Call ``method`` with request bytes as they are (a list: the messages of a client stream);
    returns the response bytes (one for a unary response)."""
    path = path_of(method)
    if method.client_streaming:
        messages = payload if isinstance(payload, list) else [payload]
        if method.server_streaming:
            return list(channel.stream_stream(path)(iter(messages), timeout=TIMEOUT))
        return [channel.stream_unary(path)(iter(messages), timeout=TIMEOUT)]
    assert isinstance(payload, bytes)
    if method.server_streaming:
        return list(channel.unary_stream(path)(payload, timeout=TIMEOUT))
    return [channel.unary_unary(path)(payload, timeout=TIMEOUT)]


def raw_error(channel: grpc.Channel, method: MethodDescriptor, payload: bytes | list[bytes]) -> TiermemError:
    with pytest.raises(grpc.RpcError) as ei:
        raw_call(channel, method, payload)
    return from_rpc_error(ei.value)


def assert_malformed(err: TiermemError) -> None:
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT, err
    assert err.reason == REASON, err
    assert "could not be decoded" in err.message, err


def message_class(d: descriptor.Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(d)


# -- request bytes built by hand ------------------------------------------------------------------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _delimited(number: int, body: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def bad_utf8(d: descriptor.Descriptor, depth: int = 0) -> bytes | None:
    """Bytes of message ``d`` whose shallowest string field holds invalid UTF-8 (None: none within
    a few levels). Encoded by hand: no protobuf library writes such a string."""
    for f in d.fields:
        if f.type == FieldDescriptor.TYPE_STRING:
            return _delimited(f.number, b"ok\xff\xfe\xc3")
    if depth < 4:
        for f in d.fields:
            if f.type == FieldDescriptor.TYPE_MESSAGE:
                inner = bad_utf8(f.message_type, depth + 1)
                if inner is not None:
                    return _delimited(f.number, inner)
    return None


def truncations(raw: bytes, cls: type[Message]) -> list[bytes]:
    """Prefixes of ``raw`` that do not decode as ``cls`` (cut within a field): the last byte
    dropped always is one, and a cut near the middle when it is one too."""
    cuts = [len(raw) - 1, len(raw) // 2]
    out = []
    for cut in cuts:
        try:
            cls.FromString(raw[:cut])
        except DecodeError:
            out.append(raw[:cut])
    assert out, "dropping the last byte of a message always cuts a field"
    return out


# -- valid requests of every RPC (the fuzz's seeds) ----------------------------------------------------
def _ts(seconds: int) -> Any:
    from google.protobuf import timestamp_pb2

    return timestamp_pb2.Timestamp(seconds=seconds)


def _memory(**kw: Any) -> pb.Memory:
    m = pb.Memory(namespace=NS, content="the deploy failed on friday after the migration", kind="observation")
    m.tags.extend(["deploy", "ci"])
    m.metadata["build"].int_value = 1400
    m.metadata["env"].string_value = "prod"
    for k, v in kw.items():
        if isinstance(v, list):
            getattr(m, k).extend(v)
        elif isinstance(v, Message):
            getattr(m, k).CopyFrom(v)
        else:
            setattr(m, k, v)
    return m


def seed_requests() -> dict[str, list[Message]]:
    """A valid request (several for some) of every MemoryService method, in the shapes clients send."""
    where = json.dumps({"$and": [{"importance": {"$gte": 0.1}}, {"metadata.build": {"$gt": 100}}]})
    flt = pb.MemoryFilter(tiers=[pb.TIER_FAST], kinds=["observation"], tags_any=["ci"], where=where)
    search = pb.SearchMemoriesRequest(
        namespaces=[NS],
        query_text="deploy failed",
        filter=flt,
        limit=5,
        as_of=_ts(1_700_000_000),
        explain=True,
        tier_weights=[pb.TierWeight(tier=pb.TIER_FAST, weight=1.5)],
        hybrid=pb.HybridOptions(enabled=True, rrf_k=60.0),
    )
    vector_search = pb.SearchMemoriesRequest(
        namespaces=[NS], query_embedding=[0.5, 0.5, 0.5, 0.5], embedding_model="fz", limit=3
    )
    node = pb.GraphNode(id="ana", label="Ana")
    node.properties["role"].string_value = "dev"
    edge = pb.GraphEdge(
        source_id="ana", target_id="bob", relation="works_with", valid_from=_ts(1_600_000_000)
    )
    policy = pb.LifecyclePolicy()
    seeds: dict[str, list[Message]] = {
        "CreateMemory": [
            pb.CreateMemoryRequest(memory=_memory(), request_id="r1"),
            pb.CreateMemoryRequest(
                memory=_memory(id="m1", embedding=[0.1, 0.2, 0.3, 0.4], embedding_model="fz", importance=0.5)
            ),
        ],
        "BatchCreateMemories": [
            pb.BatchCreateMemoriesRequest(
                memories=[
                    _memory(content="first of two"),
                    _memory(content="second of two", tier=pb.TIER_SLOW),
                ]
            )
        ],
        "GetMemory": [pb.GetMemoryRequest(namespace=NS, id="m1", include_embedding=True)],
        "UpdateMemory": [
            pb.UpdateMemoryRequest(
                memory=_memory(id="m1", content="updated", topic="ops"),
                update_mask=field_mask_pb2.FieldMask(paths=["content", "topic", "tags"]),
            )
        ],
        "DeleteMemory": [pb.DeleteMemoryRequest(namespace=NS, id="gone")],
        "ListMemories": [pb.ListMemoriesRequest(namespace=NS, page_size=10, filter=flt, newest_first=True)],
        "SearchMemories": [search, vector_search],
        "BatchSearchMemories": [pb.BatchSearchMemoriesRequest(searches=[search, vector_search])],
        "RecordFeedback": [
            pb.RecordFeedbackRequest(
                namespace=NS, items=[pb.Feedback(id="m1", actual_usefulness=0.9, success=True)]
            )
        ],
        "GetStats": [pb.GetStatsRequest(namespace=NS)],
        "ListNamespaces": [pb.ListNamespacesRequest(prefix="host", page_size=5)],
        "DeleteNamespace": [pb.DeleteNamespaceRequest(namespace="hostile/child", include_children=True)],
        "GetNamespaceConfig": [pb.GetNamespaceConfigRequest(namespace=NS)],
        "UpdateNamespaceConfig": [
            pb.UpdateNamespaceConfigRequest(
                config=pb.NamespaceConfig(namespace=NS, protected=False, policy=policy),
                update_mask=field_mask_pb2.FieldMask(paths=["protected"]),
            )
        ],
        "ConsolidateMemories": [
            pb.ConsolidateMemoriesRequest(namespace=NS, dry_run=True, max_reported_moves=10)
        ],
        "TransferMemory": [
            pb.TransferMemoryRequest(
                namespace=NS,
                id="m1",
                target_namespace="hostile/copy",
                target_tier=pb.TIER_SLOW,
                mode=pb.TRANSFER_MODE_COPY,
            )
        ],
        "GetReflectionCandidates": [pb.GetReflectionCandidatesRequest(namespace=NS, limit=5)],
        "BuildSummary": [
            pb.BuildSummaryRequest(namespace=NS, max_tokens=50, created_after=_ts(1_000_000_000))
        ],
        "UpsertGraphNode": [pb.UpsertGraphNodeRequest(namespace=NS, node=node)],
        "AddGraphEdge": [pb.AddGraphEdgeRequest(namespace=NS, edge=edge)],
        "InvalidateGraphEdge": [
            pb.InvalidateGraphEdgeRequest(namespace=NS, edge_id="e1", invalid_from=_ts(1_700_000_000))
        ],
        "GetGraphNeighbors": [pb.GetGraphNeighborsRequest(namespace=NS, node_id="ana", depth=2, limit=10)],
        "BuildContext": [
            pb.BuildContextRequest(
                scopes=[pb.ContextScope(namespace=NS, share=1.0, semantic_k=5)],
                query_text="what failed",
                token_budget=200,
            )
        ],
        "ExportMemories": [pb.ExportMemoriesRequest(namespace=NS, include_children=True)],
        "ImportMemories": [
            pb.ImportMemoriesRequest(
                header=pb.ExportHeader(format_version=1, namespace=NS), target_namespace="hostile/imported"
            ),
            pb.ImportMemoriesRequest(memory=_memory(id="imp1", create_time=_ts(1_700_000_000))),
        ],
    }
    # A scope of its own: fencing the namespace the other seeds write would refuse them all.
    seeds["SetScopeRouting"] = [
        pb.SetScopeRoutingRequest(scope="fuzz:elsewhere", routing=pb.SCOPE_ROUTING_FENCED, moved_to="shard-b")
    ]
    # A method added to the proto gets a generic seed until it has one of its own here.
    for name, m in METHODS.items():
        if name not in seeds:
            seeds[name] = [_populated(m.input_type)]
    return seeds


def _populated(d: descriptor.Descriptor, depth: int = 0) -> Message:
    """A message of ``d`` with every scalar field set (a generic seed)."""
    msg = message_class(d)()
    for f in d.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth < 2 and not f.message_type.GetOptions().map_entry:
                sub = _populated(f.message_type, depth + 1)
                (getattr(msg, f.name).add() if _repeated(f) else getattr(msg, f.name)).CopyFrom(sub)
            continue
        value: Any = {
            FieldDescriptor.TYPE_STRING: NS,
            FieldDescriptor.TYPE_BOOL: True,
            FieldDescriptor.TYPE_DOUBLE: 0.5,
            FieldDescriptor.TYPE_FLOAT: 0.5,
            FieldDescriptor.TYPE_ENUM: 1,
        }.get(f.type, 1)
        if f.type == FieldDescriptor.TYPE_BYTES:
            value = b"x"
        if _repeated(f):
            getattr(msg, f.name).append(value)
        else:
            setattr(msg, f.name, value)
    return msg


def _repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def import_payload(chunk: Message) -> list[bytes]:
    """An import stream: the valid header first, then ``chunk``."""
    header = seed_requests()["ImportMemories"][0]
    return [header.SerializeToString(), chunk.SerializeToString()]


# -- fixtures -------------------------------------------------------------------------------------------
@pytest.fixture
def channel(server: RunningServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
        grpc.channel_ready_future(ch).result(timeout=30)
        yield ch


def memory_count(client: MemoryClient) -> int:
    return int(client.stats().memory_count)


def namespaces(client: MemoryClient) -> list[str]:
    return [n.name for n in client.list_namespaces()]


# == (a) undecodable requests ==========================================================================
def test_seeds_cover_every_rpc_and_are_valid() -> None:
    seeds = seed_requests()
    assert set(seeds) == set(METHODS)
    for name, requests in seeds.items():
        for r in requests:
            assert r.DESCRIPTOR is METHODS[name].input_type
            assert r.SerializeToString(), name


@pytest.mark.parametrize("name", list(METHODS))
def test_invalid_utf8_in_a_string_field_is_malformed_request(
    name: str, client: MemoryClient, channel: grpc.Channel
) -> None:
    client.create(NS, "one memory before the attack")
    before, names = memory_count(client), namespaces(client)
    method = METHODS[name]
    payload = bad_utf8(method.input_type)
    assert payload is not None, f"{name}: no string field to corrupt"
    with pytest.raises(DecodeError):
        message_class(method.input_type).FromString(payload)
    err = raw_error(channel, method, payload)
    assert_malformed(err)
    assert method.input_type.full_name in err.message
    assert err.metadata == {"request_type": method.input_type.full_name}
    assert memory_count(client) == before
    assert namespaces(client) == names


@pytest.mark.parametrize("name", list(METHODS))
def test_truncated_requests_are_malformed_request(
    name: str, client: MemoryClient, channel: grpc.Channel
) -> None:
    before, names = memory_count(client), namespaces(client)
    method = METHODS[name]
    cls = message_class(method.input_type)
    for seed in seed_requests()[name]:
        for cut in truncations(seed.SerializeToString(), cls):
            assert_malformed(raw_error(channel, method, cut))
    assert memory_count(client) == before
    assert namespaces(client) == names


def test_a_malformed_chunk_ends_an_import_with_malformed_request(
    client: MemoryClient, channel: grpc.Channel
) -> None:
    method = METHODS["ImportMemories"]
    header, memory = (r.SerializeToString() for r in seed_requests()["ImportMemories"])
    # The chunks before the malformed one reach the import, which stores nothing before its first commit.
    for stream in (
        [header, memory, memory[:-1]],
        [header, bad_utf8(pb.ImportMemoriesRequest.DESCRIPTOR) or b""],
        [header[:-1], memory],
    ):
        assert_malformed(raw_error(channel, method, stream))
    assert memory_count(client) == 0
    assert namespaces(client) == []
    # The same stream without the bad chunk imports.
    (response,) = raw_call(channel, method, [header, memory])
    assert pb.ImportMemoriesResponse.FromString(response).imported == 1
    assert memory_count(client) == 1


def test_well_formed_requests_still_work_through_the_checked_handlers(
    client: MemoryClient, channel: grpc.Channel
) -> None:
    m = client.create(NS, "a memory that decodes fine", tags=["ok"])
    (raw,) = raw_call(
        channel, METHODS["GetMemory"], pb.GetMemoryRequest(namespace=NS, id=m.id).SerializeToString()
    )
    assert pb.GetMemoryResponse.FromString(raw).memory.content == "a memory that decodes fine"
    chunks = raw_call(
        channel, METHODS["ExportMemories"], pb.ExportMemoriesRequest(namespace=NS).SerializeToString()
    )
    assert [pb.ExportMemoriesResponse.FromString(c).WhichOneof("chunk") for c in chunks][:2] == [
        "header",
        "memory",
    ]


def test_bidirectional_streams_are_checked_too() -> None:
    """No MemoryService method streams both ways yet: the handlers are built from any service's
    descriptor, so check that cardinality on gRPC's reflection service."""
    service = reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"]
    servicer = reflection.ReflectionServicer(service_names=(service.full_name,))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, method_handlers(servicer, service)),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = ch.stream_stream(f"/{service.full_name}/ServerReflectionInfo")
            good = reflection_pb2.ServerReflectionRequest(list_services="").SerializeToString()
            assert len(list(call(iter([good, good]), timeout=TIMEOUT))) == 2
            responses = call(iter([good, good[:-1], good]), timeout=TIMEOUT)
            assert reflection_pb2.ServerReflectionResponse.FromString(next(responses)).list_services_response
            with pytest.raises(grpc.RpcError) as ei:
                next(responses)
            assert_malformed(from_rpc_error(ei.value))
    finally:
        server.stop(0).wait()


def test_a_search_follower_answers_malformed_requests_alike(
    server_factory: Callable[..., RunningServer],
) -> None:
    """A follower decodes its searches itself and forwards the other calls to the leader: both
    answer MALFORMED_REQUEST."""
    srv = server_factory(search_processes=2)
    assert srv.followers is not None
    (fpid,) = srv.followers.pids()
    seen = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        # One connection per try: the kernel spreads new connections over the two processes.
        with grpc.insecure_channel(
            f"127.0.0.1:{srv.port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as ch:
            probe = pb.SearchMemoriesRequest(namespaces=["probe"], query_text="probe", read_only=True)
            _, done = ch.unary_unary(
                path_of(METHODS["SearchMemories"]),
                request_serializer=pb.SearchMemoriesRequest.SerializeToString,
                response_deserializer=pb.SearchMemoriesResponse.FromString,
            ).with_call(probe, timeout=TIMEOUT)
            pid = int(dict(done.trailing_metadata())["tiermem-search-process"])
            if pid in seen:
                continue
            seen.add(pid)
            for name in ("SearchMemories", "BatchSearchMemories", "CreateMemory"):
                method = METHODS[name]
                payload = bad_utf8(method.input_type)
                assert payload is not None
                err = raw_error(ch, method, payload)
                assert_malformed(err)
                assert err.metadata == {"request_type": method.input_type.full_name}, (pid, name)
    assert seen == {os.getpid(), fpid}


# == (b) filters and names ===========================================================================
def call(client: MemoryClient, name: str, request: Message) -> Any:
    """``request`` to method ``name`` as it is, errors raised as the client's."""
    try:
        return getattr(client.stub, name)(request, timeout=TIMEOUT)
    except grpc.RpcError as e:
        raise from_rpc_error(e) from None


def expect_invalid(fn: Callable[[], Any], field: str) -> InvalidArgumentError:
    with pytest.raises(InvalidArgumentError) as ei:
        fn()
    e = ei.value
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in e.fields, f"expected {field!r} in {e.fields} ({e.message})"
    return e


@pytest.fixture
def counted(client: MemoryClient) -> MemoryClient:
    """Three memories in NS with access counts 0, 2 and 3."""
    ids = [client.create(NS, f"memory number {i} of three", id=f"c{i}").id for i in range(3)]
    for n, mid in ((2, ids[1]), (3, ids[2])):
        for _ in range(n):
            client.feedback(NS, [{"id": mid}])  # each item counts as an access
    counts = {m.id: m.access_count for m in client.list_memories(NS)}
    assert counts == {"c0": 0, "c1": 2, "c2": 3}
    return client


def _listed(client: MemoryClient, where: Any) -> list[str]:
    return sorted(m.id for m in client.list_memories(NS, where=where))


def _searched(client: MemoryClient, where: Any) -> list[str]:
    req = pb.SearchMemoriesRequest(namespaces=[NS], query_text="memory", limit=10)
    req.filter.where = where if isinstance(where, str) else json.dumps(where)
    return sorted(r.memory.id for r in call(client, "SearchMemories", req).results)


@pytest.mark.parametrize(
    "where, expected",
    [
        # A bound beyond int64 on an integer field compares as it reads (it is a number like any other).
        ({"access_count": {"$gt": 1e300}}, []),
        ({"access_count": {"$gte": 1e300}}, []),
        ({"access_count": {"$lt": 1e300}}, ["c0", "c1", "c2"]),
        ({"access_count": {"$gt": -1e300}}, ["c0", "c1", "c2"]),
        ({"access_count": 1e300}, []),
        ({"access_count": {"$ne": 1e300}}, ["c0", "c1", "c2"]),
        ({"access_count": {"$in": [1e300, 2]}}, ["c1"]),
        ({"access_count": {"$nin": [1e300, 2]}}, ["c0", "c2"]),
        ({"access_count": {"$gt": 9223372036854775808}}, []),  # 2**63 as a JSON integer
        ({"success_count": {"$lt": 1.7e308}}, ["c0", "c1", "c2"]),
        ({"importance": {"$lt": 1e300}}, ["c0", "c1", "c2"]),  # beyond float32 too
        ({"importance": {"$gt": 1e300}}, []),
        # ... and a fraction is not cut off: 2 is not >= 2.5, 2 is < 2.5, nothing equals 2.5.
        ({"access_count": {"$gte": 2.5}}, ["c2"]),
        ({"access_count": {"$lt": 2.5}}, ["c0", "c1"]),
        ({"access_count": 2.5}, []),
        ({"metadata.n": {"$lt": 1e300}}, []),  # no memory has the key
    ],
)
def test_filter_bounds_beyond_int64_compare_as_numbers(
    counted: MemoryClient, where: Any, expected: list[str]
) -> None:
    assert _listed(counted, where) == expected
    assert _searched(counted, where) == expected


@pytest.mark.parametrize(
    "where",
    [
        '{"access_count": {"$gt": 1' + "0" * 400 + "}}",  # an integer beyond any float
        '{"metadata.n": {"$lt": -1' + "0" * 400 + "}}",
        '{"create_time": {"$gt": 1' + "0" * 400 + "}}",
        '{"importance": ' + "9" * 5000 + "}",  # beyond Python's 4300 digits
        '{"access_count": {"$gt": 1e400}}',  # Infinity
    ],
)
def test_filter_numbers_beyond_any_float_are_invalid_argument(counted: MemoryClient, where: str) -> None:
    e = expect_invalid(lambda: counted.list_page(NS, where=where), "filter.where")
    assert len(e.message) < 1000
    expect_invalid(lambda: _searched(counted, where), "filter.where")


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ('{"metadata.n": 1, "metadata.n": 2}', "metadata.n"),
        ('{"importance": {"$gt": 0.2, "$gt": 0.9}}', "$gt"),
        ('{"$or": [{"kind": "fact"}, {"tags": "x", "tags": "y"}]}', "tags"),
    ],
)
def test_a_where_key_given_twice_in_one_object_is_invalid_argument(
    counted: MemoryClient, where: str, key: str
) -> None:
    """JSON parsers keep the last of two equal keys: a filter with two conditions on one field
    would silently apply one of them."""
    e = expect_invalid(lambda: counted.list_page(NS, where=where), "filter.where")
    assert f"names {key!r} twice" in e.message, e.message
    expect_invalid(lambda: _searched(counted, where), "filter.where")


def test_string_ranges_keep_trailing_nul_characters(client: MemoryClient) -> None:
    """A metadata string ending in NUL ("a\\x00") orders after "a", as Python orders them: range
    operators compare the whole string (NumPy's str scalars drop trailing NULs)."""
    values = {"plain": "a", "nul_end": "a\x00", "two_nul": "a\x00\x00", "nul_mid": "a\x00b", "b": "b"}
    for mid, v in values.items():
        client.create(NS, f"memory {mid}", id=mid, metadata={"s": v})
    checks = {"$lt": str.__lt__, "$lte": str.__le__, "$gt": str.__gt__, "$gte": str.__ge__, "$eq": str.__eq__}
    for op, holds in checks.items():
        for operand in ("a", "a\x00", "a\x00\x00", "a\x00c"):
            want = sorted(m for m, v in values.items() if holds(v, operand))
            assert _listed(client, {"metadata.s": {op: operand}}) == want, (op, operand)


@pytest.mark.parametrize("where", ['{"tags": []}', '{"tags": {"$all": []}}', '{"$or": [{"tags": []}]}'])
def test_all_of_no_tags_is_invalid_argument(counted: MemoryClient, where: str) -> None:
    """Every memory has all of no tags: a list built empty by a client would let every memory
    through. ($in of none matches nothing, $nin of none everything: those stay.)"""
    e = expect_invalid(lambda: counted.list_page(NS, where=where), "filter.where")
    assert "leave the condition out" in e.message, e.message
    expect_invalid(lambda: _searched(counted, where), "filter.where")
    assert _listed(counted, {"tags": {"$in": []}}) == []
    every = sorted(m.id for m in counted.list_memories(NS))
    assert every and _listed(counted, {"tags": {"$nin": []}}) == every


def _nested(levels: int, kind: str) -> str:
    if kind == "not":
        return '{"$not": ' * (levels - 1) + '{"kind": "fact"}' + "}" * (levels - 1)
    if kind == "and":
        return '{"$and": [' * (levels - 1) + '{"kind": "fact"}' + "]}" * (levels - 1)
    return '{"tags": ' + "[" * levels + '"x"' + "]" * levels + "}"  # arrays in a value


@pytest.mark.parametrize("levels", [300, 492, 500, 5000])
@pytest.mark.parametrize("kind", ["not", "and", "array"])
def test_deeply_nested_filters_are_invalid_argument(client: MemoryClient, levels: int, kind: str) -> None:
    client.create(NS, "one memory")
    where = _nested(levels, kind)
    e = expect_invalid(lambda: client.list_page(NS, where=where), "filter.where")
    assert "nests arrays and objects more than" in e.message, e.message
    expect_invalid(lambda: _searched(client, where), "filter.where")
    batch = pb.BatchSearchMemoriesRequest(
        searches=[
            pb.SearchMemoriesRequest(namespaces=[NS], query_text="x", filter=pb.MemoryFilter(where=where))
        ]
    )
    expect_invalid(
        lambda: call(client, "BatchSearchMemories", batch),
        "searches[0].filter.where",
    )
    assert memory_count(client) == 1


def test_brackets_within_strings_do_not_count_as_nesting(client: MemoryClient) -> None:
    client.create(NS, "one memory", tags=["[[[[{{{{"])
    where = json.dumps({"tags": {"$in": ["[" * 500, "{" * 500, "[[[[{{{{"]}})
    assert len(_listed(client, where)) == 1


def test_long_filter_values_are_quoted_short_in_errors(client: MemoryClient) -> None:
    """A status whose details pass the client's metadata limit arrives as RESOURCE_EXHAUSTED."""
    for where in (
        {"tier": "x" * 60000},
        {"y" * 60000: 1},
        {"$and": [{"kind": "fact"}, {"importance": {"$" + "z" * 60000: 1}}]},
    ):
        e = expect_invalid(lambda w=where: client.list_page(NS, where=w), "filter.where")  # type: ignore[misc]
        assert len(e.message) < 1000


def test_a_huge_metadata_key_is_quoted_short_in_errors(client: MemoryClient) -> None:
    for call_it, prefix in (
        (lambda: client.create(NS, "a memory", metadata={"k" * 70000: 1}), "memory.metadata['kkk"),
        (lambda: client.upsert_node(NS, "ana", properties={"k" * 70000: 1}), "node.properties['kkk"),
    ):
        with pytest.raises(InvalidArgumentError) as ei:
            call_it()
        [field] = ei.value.fields
        assert field.startswith(prefix) and len(field) < 100, field
        assert len(ei.value.message) < 1000
    assert namespaces(client) == []


@pytest.mark.parametrize("bad", ["r/a\n", "r/a\r\n", "\nr/a", "r/a\n\n", "r/a\x00"])
def test_a_namespace_with_a_newline_is_invalid_argument(client: MemoryClient, bad: str) -> None:
    client.create("r/a", "the one namespace")
    expect_invalid(lambda: client.create(bad, "a second namespace?"), "memory.namespace")
    expect_invalid(
        lambda: client.create_batch(
            [{"namespace": "r/a", "content": "ok"}, {"namespace": bad, "content": "no"}]
        ),
        "memories[1].namespace",
    )
    expect_invalid(lambda: client.upsert_node(bad, "n1", label="x"), "namespace")
    expect_invalid(lambda: client.transfer("r/a", "x", target_namespace=bad, mode="copy"), "target_namespace")
    assert namespaces(client) == ["r/a"]
    assert memory_count(client) == 1


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"id": "m1\n"}, "memory.id"),
        ({"kind": "fact\n"}, "memory.kind"),
        ({"tags": ["deploy\n"]}, "memory.tags[0]"),
        ({"tags": ["ok", "dep\tloy"]}, "memory.tags[1]"),
        ({"metadata": {"env\n": "prod"}}, "memory.metadata['env\\n']"),
        ({"source_memory_ids": ["m0\n"]}, "memory.source_memory_ids[0]"),
    ],
)
def test_names_with_a_trailing_newline_are_invalid_argument(
    client: MemoryClient, fields: dict[str, Any], field: str
) -> None:
    expect_invalid(lambda: client.create(NS, "a memory", **fields), field)
    assert memory_count(client) == 0
    assert namespaces(client) == []


@pytest.mark.parametrize("model", ["m\n", " ", "\u3000", " m", "m ", "m\u202e", "m\u200b"])
def test_an_embedding_model_name_no_one_meant_is_invalid_argument(client: MemoryClient, model: str) -> None:
    """A model's name is a label, not blank, without whitespace at its ends: "m\\n" or " m" would
    be an embedding space of its own beside "m" (refused when storing and when searching)."""
    vec = [1.0, 0.0, 0.0]
    expect_invalid(
        lambda: client.create(NS, "a memory", embedding=vec, embedding_model=model), "memory.embedding_model"
    )
    assert memory_count(client) == 0 and list(client.stats().spaces) == []
    client.create(NS, "a memory", embedding=vec, embedding_model="m")
    expect_invalid(lambda: client.search(NS, vec, embedding_model=model), "embedding_model")
    assert [s.embedding_model for s in client.stats().spaces] == ["m"]


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"tags": [" "]}, "memory.tags[0]"),
        ({"tags": ["ok", "\u3000\u3000"]}, "memory.tags[1]"),
        ({"metadata": {" ": "x"}}, "memory.metadata[' ']"),
    ],
)
def test_blank_labels_are_invalid_argument(client: MemoryClient, fields: dict[str, Any], field: str) -> None:
    expect_invalid(lambda: client.create(NS, "a memory", **fields), field)
    assert memory_count(client) == 0


@pytest.mark.parametrize("questions, field", [(["why?", ""], "questions[1]"), (["  "], "questions[0]")])
def test_an_empty_question_of_a_reflection_is_invalid_argument(
    client: MemoryClient, questions: list[str], field: str
) -> None:
    client.create(NS, "what happened", id="m0")
    with pytest.raises(grpc.RpcError) as ei:
        client.stub.CreateMemory(
            pb.CreateMemoryRequest(
                memory=pb.Memory(
                    namespace=NS,
                    content="an insight",
                    kind="reflection",
                    questions=questions,
                    source_memory_ids=["m0"],
                )
            ),
            timeout=TIMEOUT,
        )
    e = from_rpc_error(ei.value)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and e.fields == [f"memory.{field}"], e
    assert memory_count(client) == 1


def test_an_edge_relation_is_a_label(client: MemoryClient) -> None:
    client.upsert_node(NS, "ana", label="Ana")
    client.upsert_node(NS, "bob", label="Bob")
    for relation in ("knows\n", "kno\u200bws", " "):
        expect_invalid(lambda r=relation: client.add_edge(NS, "ana", r, "bob"), "edge.relation")
    assert [e.relation for e in client.neighbors(NS, "ana").edges] == []
    client.add_edge(NS, "ana", "knows well", "bob")
    assert [e.relation for e in client.neighbors(NS, "ana").edges] == ["knows well"]


def test_an_error_repeating_megabytes_of_input_still_fits_its_trailers(client: MemoryClient) -> None:
    """A field violation whose description (or field name) quotes a huge input is cut with the
    message: the client gets INVALID_ARGUMENT naming the field, not a bare RESOURCE_EXHAUSTED for
    trailers over gRPC's limit."""
    client.create(NS, "a memory", id="m1")
    huge = "p" * (1 << 20)
    with pytest.raises(grpc.RpcError) as ei:
        client.stub.UpdateMemory(
            pb.UpdateMemoryRequest(
                memory=pb.Memory(namespace=NS, id="m1"), update_mask=field_mask_pb2.FieldMask(paths=[huge])
            ),
            timeout=TIMEOUT,
        )
    e = from_rpc_error(ei.value)
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT and e.fields == ["update_mask"], e
    assert len(e.field_violations[0].description) < 1000 and len(e.message) < 2000
    header = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1, namespace="h" * (1 << 20)))
    memory = pb.ExportMemoriesResponse(memory=pb.Memory(namespace="o", id="o", content="o"))
    e = expect_invalid(
        lambda: client.import_memories([header, memory], target_namespace="z"), "chunks[1].memory.namespace"
    )
    assert len(e.field_violations[0].description) < 1000
    assert [m.id for m in client.list_memories(NS)] == ["m1"] and "z" not in [
        n.name for n in client.list_namespaces()
    ]


def test_graph_ids_and_kind_caps_with_a_trailing_newline_are_invalid_argument(client: MemoryClient) -> None:
    expect_invalid(lambda: client.upsert_node(NS, "ana\n", label="Ana"), "node.id")
    expect_invalid(lambda: client.add_edge(NS, "ana", "knows", "bob\n"), "edge.target_id")
    expect_invalid(lambda: client.add_edge(NS, "ana\n", "knows", "bob"), "edge.source_id")
    expect_invalid(lambda: client.upsert_node(NS, "ana", memory_ids=["m1", "m2\n"]), "node.memory_ids[1]")
    client.upsert_node(NS, "bob", label="Bob")
    expect_invalid(
        lambda: client.add_edge(NS, "bob", "knows", "bob", memory_ids=["m\x00"]), "edge.memory_ids[0]"
    )
    expect_invalid(
        lambda: client.add_edge(NS, "bob", "knows", "bob", memory_ids=["x" * 129]), "edge.memory_ids[0]"
    )
    expect_invalid(lambda: client.add_edge(NS, "bob", "knows", "bob", memory_ids=[""]), "edge.memory_ids[0]")
    many = [f"m{i}" for i in range(1001)]
    expect_invalid(lambda: client.add_edge(NS, "bob", "knows", "bob", memory_ids=many), "edge.memory_ids")
    expect_invalid(lambda: client.upsert_node(NS, "bob", memory_ids=many), "node.memory_ids")
    assert [e.relation for e in client.neighbors(NS, "bob").edges] == []
    client.upsert_node(NS, "bob", memory_ids=many[:1000])  # the limit itself is accepted
    expect_invalid(lambda: client.neighbors(NS, "ana\n"), "node_id")
    expect_invalid(
        lambda: client.update_namespace_config(NS, kind_capacities={"fact\n": 3}),
        "config.policy.kind_capacities[0].kind",
    )
    expect_invalid(
        lambda: client.update_namespace_config(NS, kind_capacities={"fact": 3, "note": -1}),
        "config.policy.kind_capacities[1].max_items",
    )
    client.upsert_node(NS, "ana", label="Ana", memory_ids=["m1"])
    assert [n.id for n in client.neighbors(NS, "ana").nodes] == ["ana"]
    client.add_edge(NS, "ana", "knows", "bob", memory_ids=["m1", "m2"])
    assert [list(e.memory_ids) for e in client.neighbors(NS, "ana").edges] == [["m1", "m2"]]


@pytest.mark.parametrize(
    "chunk",
    [
        pb.ImportMemoriesRequest(node=pb.GraphNode(id="ana"), graph_namespace=NS),
        pb.ImportMemoriesRequest(
            edge=pb.GraphEdge(id="e1", source_id="a", target_id="b"), graph_namespace=NS
        ),
    ],
    ids=["node", "edge"],
)
def test_imported_graph_items_without_times_do_not_break_exports(
    client: MemoryClient, channel: grpc.Channel, chunk: pb.ImportMemoriesRequest
) -> None:
    header = pb.ImportMemoriesRequest(header=pb.ExportHeader(format_version=1, namespace=NS))
    try:
        raw_call(channel, METHODS["ImportMemories"], [header.SerializeToString(), chunk.SerializeToString()])
    except grpc.RpcError as e:  # refusing the chunk is fine too (an edge between no nodes: NOT_FOUND)
        assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), e
    list(client.export_memories(NS))


def test_huge_token_costs_do_not_break_build_context(client: MemoryClient) -> None:
    client.create(NS, "what failed: the deploy", token_cost=2**31 - 1)
    client.create(NS, "what failed: the migration")
    client.build_context([NS], token_budget=200, query="what failed")


# == (c) seeded fuzz ===================================================================================
def mutate(rng: random.Random, raw: bytes, others: list[bytes]) -> bytes:
    """``raw`` with one random change: a bit flipped, a byte set, a cut, bytes inserted or
    deleted, a slice repeated, or a splice with another request's bytes."""
    b = bytearray(raw)
    n = len(b)
    op = rng.randrange(8)
    if op == 0 and n:
        i = rng.randrange(n)
        b[i] ^= 1 << rng.randrange(8)
    elif op == 1 and n:
        b[rng.randrange(n)] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)])
    elif op == 2 and n:
        del b[rng.randrange(n) :]
    elif op == 3:
        i = rng.randrange(n + 1)
        b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif op == 4 and n:
        i = rng.randrange(n)
        del b[i : i + rng.randint(1, 8)]
    elif op == 5 and n:
        i = rng.randrange(n)
        j = rng.randint(i, min(n, i + 16))
        b[j:j] = b[i:j] * rng.randint(1, 4)
    elif op == 6:
        other = rng.choice(others)
        b = b[: rng.randint(0, n)] + bytearray(other[rng.randint(0, len(other)) :])
    else:  # a large varint or a huge length where a length or a value may sit
        i = rng.randrange(n + 1)
        b[i:i] = _varint(rng.choice([2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1]))
    return bytes(b)


_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1e300, -1e300, 1e-300, 3.5e38, -1.0, 2.0]
_STRINGS = [
    "",
    "r/a\n",
    "a\x00b",
    "x" * 70000,
    "é" * 300,
    "\U0001f600",
    "/",
    "a//b",
    "{",
    '{"$not": ' * 600,
    '{"access_count": {"$gt": 1e300}}',
    '{"metadata.k": {"$in": [1, "a", true, null]}}',
    "fact",
    "TIER_FAST",
    NS,
]


def _extreme(rng: random.Random, f: FieldDescriptor) -> Any:
    """A value for scalar field ``f`` from its type's edge cases."""
    if f.type in _INT_RANGES:
        lo, hi = _INT_RANGES[f.type]
        return rng.choice([lo, hi, 0, -1 if lo else 1, 1, rng.randint(lo, hi)])
    if f.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return rng.choice(_FLOATS)
    if f.type == FieldDescriptor.TYPE_STRING:
        return rng.choice(_STRINGS)
    if f.type == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 64))
    if f.type == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if f.type == FieldDescriptor.TYPE_ENUM:
        return rng.choice([0, 1, 2, 4, 5, 99, -1, 2**31 - 1])
    raise AssertionError(f"no edge cases for {f.full_name}")


def mutate_fields(rng: random.Random, msg: Message, depth: int = 0) -> None:
    """Set one field somewhere in ``msg`` (in place) to an edge case of its type: values that
    decode but that no well-behaved client sends."""
    fields = list(msg.DESCRIPTOR.fields)
    f = rng.choice(fields)
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        m = getattr(msg, f.name)
        key = _extreme(rng, f.message_type.fields_by_name["key"])
        value_field = f.message_type.fields_by_name["value"]
        if value_field.message_type is None:
            m[key] = _extreme(rng, value_field)
        else:
            mutate_fields(rng, m[key], depth + 1)
    elif f.message_type is not None:
        if f.is_repeated:
            items = getattr(msg, f.name)
            target = items.add() if not len(items) or rng.random() < 0.3 else rng.choice(items)
            if rng.random() < 0.1:
                for _ in range(rng.randint(100, 1000)):
                    items.add().CopyFrom(target)
        else:
            target = getattr(msg, f.name)
        if depth < 5:
            mutate_fields(rng, target, depth + 1)
        else:
            target.SetInParent()
    elif f.is_repeated:
        values = getattr(msg, f.name)
        many = [1, 2, 20] if f.type == FieldDescriptor.TYPE_STRING else [1, 2, 200, 5000]
        values.extend(_extreme(rng, f) for _ in range(rng.choice(many)))
    else:
        setattr(msg, f.name, _extreme(rng, f))


BAD_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
MUTATIONS = 400
SEED = 26
MAX_CASE_BYTES = 1 << 20


def fuzz_case(rng: random.Random, name: str, seeds: dict[str, list[bytes]], everything: list[bytes]) -> bytes:
    """Request bytes of method ``name``: a seed with its bytes mutated (half the time) or with one
    to three fields set to edge cases of their type (so the bytes decode and reach validation)."""
    raw = rng.choice(seeds[name])
    if rng.random() < 0.5:
        return mutate(rng, raw, everything)
    msg = message_class(METHODS[name].input_type).FromString(raw)
    for _ in range(rng.randint(1, 3)):
        mutate_fields(rng, msg)
    out = msg.SerializeToString()
    return out if len(out) <= MAX_CASE_BYTES else mutate(rng, raw, everything)


def fuzz(
    channel: grpc.Channel, rng: random.Random, cases: int, seeds: dict[str, list[bytes]]
) -> tuple[dict[str, int], list[str]]:
    """Send ``cases`` fuzzed requests, every RPC in turn: (count by status code, the calls
    answered INTERNAL or UNKNOWN, described)."""
    everything = [raw for rs in seeds.values() for raw in rs]
    names = sorted(seeds)
    bad: list[str] = []
    codes: dict[str, int] = {}
    for i in range(cases):
        name = names[i % len(names)]  # every RPC gets its share
        method = METHODS[name]
        raw = fuzz_case(rng, name, seeds, everything)
        payload: bytes | list[bytes] = raw
        if method.client_streaming:  # a fuzzed header, or a fuzzed chunk after the valid header
            payload = [raw] if rng.random() < 0.3 else [seeds[name][0], raw]
        try:
            raw_call(channel, method, payload)
            code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            code = e.code()
            if code in BAD_CODES:
                try:
                    shown = repr(message_class(method.input_type).FromString(raw))[:2000]
                except DecodeError:
                    shown = repr(raw[:2000])
                bad.append(f"{name} {shown}: {code.name} {e.details()}")
        codes[code.name] = codes.get(code.name, 0) + 1
    return codes, bad


def run_seeds(channel: grpc.Channel, seeds: dict[str, list[bytes]]) -> None:
    """Each seed once, in the proto's order, so there is data to get, search, move and export."""
    for name in METHODS:
        for raw in seeds[name]:
            payload = [seeds["ImportMemories"][0], raw] if METHODS[name].client_streaming else raw
            try:
                raw_call(channel, METHODS[name], payload)
            except grpc.RpcError as e:
                assert e.code() not in BAD_CODES, (name, e.code(), e.details())


def test_fuzzed_requests_of_every_rpc_never_get_internal(
    client: MemoryClient, channel: grpc.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="tiermem")
    seeds = {name: [r.SerializeToString() for r in rs] for name, rs in seed_requests().items()}
    run_seeds(channel, seeds)
    assert memory_count(client) > 0
    codes, bad = fuzz(channel, random.Random(SEED), MUTATIONS, seeds)
    tracebacks = "\n".join(r.getMessage() + "\n" + (r.exc_text or "") for r in caplog.records)
    assert not bad, "\n".join(bad) + "\n" + tracebacks
    # The cases reach both the decoder and the servicer's own checks, and some succeed.
    assert codes.get("INVALID_ARGUMENT", 0) > MUTATIONS // 4, codes
    assert codes.get("OK", 0) > MUTATIONS // 20, codes
    # And the server still answers (once its scope serves again: a fuzzed SetScopeRouting, an
    # admin's call, may have fenced it).
    client.stub.SetScopeRouting(pb.SetScopeRoutingRequest(scope=NS.split("/")[0]), timeout=TIMEOUT)
    m = client.create(NS, "after the fuzz")
    assert client.get(NS, m.id).content == "after the fuzz"
    assert memory_count(client) > 0
