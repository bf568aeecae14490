"""Crash safety under write load.

A server subprocess is hammered by 8 writer threads (single creates and batches with client ids, some
with explicit vectors of a custom 16-dim space, some text-only; tier moves, vector and content
updates, deletes) and killed with SIGKILL while they run. A new server on the same data directory
must then hold exactly what was acknowledged:

- every acknowledged create is there (unless an acknowledged delete removed it), every acknowledged
  delete stays deleted, every acknowledged update is in effect;
- an operation in flight at the kill has either fully happened or not at all (a batch: all of its
  memories or none);
- nothing half-written: everything listed is complete (content, model, a vector of the right dimension);
- everything present is found by search as the top hit (its own vector, or its own text), and nothing
  deleted is.

The second test chains kill -9, clean shutdown (index snapshots) and kill -9 again, so the last start
maps a snapshot older than LMDB and replays the newer records.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tiermem.client import MemoryClient, NotFoundError
from tiermem.server.config import TIERS, ServerConfig
from tiermem.server.embedding.hashing import HashEmbedder

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MODEL = "crash-test"
DIM = 16
_CFG = ServerConfig()
BUILTIN_MODEL = _CFG.builtin_model
BUILTIN_DIM = _CFG.builtin_dimension
DEFAULT_TIER = _CFG.default_tier
WRITERS = 8
NAMESPACES = [f"crash/t{t}" for t in range(WRITERS)]  # writer t owns namespace t: one writer per memory
# Every search through the HNSW graphs (by default a search allowing <= 4096 rows scores them exactly,
# which checks the stored vectors but not the graph). test 1 searches exactly, test 2 through HNSW.
FORCE_HNSW = {"TIERMEM_EXACT_SEARCH_MAX_ROWS": "0"}

Key = tuple[str, str]


@dataclass(frozen=True)
class Mem:
    """What a memory should look like: vec is its normalized crash-test vector, None for built-in text."""

    ns: str
    id: str
    content: str
    tier: int
    vec: tuple[float, ...] | None

    @property
    def key(self) -> Key:
        return (self.ns, self.id)


def _unit(v: np.ndarray) -> tuple[float, ...]:
    v = np.asarray(v, np.float32)
    return tuple((v / float(np.linalg.norm(v.astype(np.float64)))).astype(np.float32).tolist())


def _same(a: Mem | None, b: Mem | None) -> bool:
    if a is None or b is None:
        return a is b
    if (a.ns, a.id, a.content, a.tier) != (b.ns, b.id, b.content, b.tier) or (a.vec is None) != (
        b.vec is None
    ):
        return False
    return a.vec is None or b.vec is None or bool(np.allclose(a.vec, b.vec, atol=1e-5))


def _show(m: Mem | None) -> str:
    return (
        "ABSENT"
        if m is None
        else f"{m.ns}/{m.id} tier={m.tier} content={m.content!r} vec={m.vec is not None}"
    )


class Ledger:
    """Possible outcomes per memory: one when every write to it was acknowledged (or surely never
    landed), two (before and after) when a write to it was in flight at the kill."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[Key, tuple[Mem | None, ...]] = {}
        self.inflight_creates: list[tuple[str, list[dict[str, Any]], bool]] = []  # (request_id, specs, batch)
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []

    def settle(self, mem: Mem | None, key: Key, count: str) -> None:
        with self.lock:
            self.outcomes[key] = (mem,)
            self.counts[count] += 1

    def maybe(self, key: Key, before: Mem | None, after: Mem | None) -> None:
        with self.lock:
            self.outcomes[key] = (before, after)

    def add(self, count: str, n: int = 1) -> None:
        with self.lock:
            self.counts[count] += n

    def acked(self) -> int:
        c = self.counts
        return c["created"] + c["updated"] + c["deleted"]

    def present_by_ns(self) -> dict[str, dict[Key, Mem]]:
        out: dict[str, dict[Key, Mem]] = {ns: {} for ns in NAMESPACES}
        for key, outs in self.outcomes.items():
            assert len(outs) == 1, f"{key} is unresolved"
            if outs[0] is not None:
                out[key[0]][key] = outs[0]
        return out


def _mem_of(spec: dict[str, Any]) -> Mem:
    emb = spec.get("embedding")
    return Mem(
        spec["namespace"],
        spec["id"],
        spec["content"],
        spec.get("tier") or DEFAULT_TIER,
        None if emb is None else _unit(np.asarray(emb, np.float32)),
    )


class Load:
    """8 writer threads against one server. ``killing`` is set just before SIGKILL (failures from then
    on are expected and leave the outcome open), ``dead`` once the process is gone (a call that starts
    after that cannot have landed)."""

    def __init__(
        self, target: str, ledger: Ledger, phase: int, pools: dict[str, dict[Key, Mem]] | None = None
    ) -> None:
        self.target = target
        self.ledger = ledger
        self.phase = phase
        self.pools = pools or {}
        self.killing = threading.Event()
        self.dead = threading.Event()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._work, args=(t,), name=f"crash-writer-{t}", daemon=True)
            for t in range(WRITERS)
        ]
        self.inflight: Counter[str] = Counter()
        self.alive_at_kill = 0

    def run(self, min_seconds: float, min_acked: int, max_seconds: float = 20.0) -> float:
        t0 = time.monotonic()
        base = self.ledger.acked()
        for th in self.threads:
            th.start()
        while True:
            time.sleep(0.05)
            elapsed = time.monotonic() - t0
            if not any(th.is_alive() for th in self.threads):
                break
            if elapsed >= max_seconds or (elapsed >= min_seconds and self.ledger.acked() - base >= min_acked):
                break
        return time.monotonic() - t0

    def kill(self, srv: Any) -> None:
        self.alive_at_kill = sum(th.is_alive() for th in self.threads)
        self.killing.set()
        srv.kill9()
        self.dead.set()
        self.stop.set()
        self._join()

    def finish(self) -> None:
        self.stop.set()
        self._join()

    def _join(self) -> None:
        for th in self.threads:
            th.join(timeout=60)
            assert not th.is_alive(), f"{th.name} did not stop"

    # -- one writer -------------------------------------------------------------------------------
    def _work(self, t: int) -> None:
        try:
            self._loop(t)
        except BaseException as e:  # never let a thread die with an exception (warnings are errors)
            with self.ledger.lock:
                self.ledger.errors.append(f"writer {t} crashed: {e!r}")

    def _loop(self, t: int) -> None:
        rng = random.Random(f"crash-{self.phase}-{t}")
        nrng = np.random.default_rng(rng.getrandbits(63))
        ns = NAMESPACES[t]
        mine: dict[Key, Mem] = dict(self.pools.get(ns, {}))  # surely present, owned by this writer
        led = self.ledger
        seq = 0

        def spec() -> dict[str, Any]:
            nonlocal seq
            mid = f"p{self.phase}w{t}-{seq}"
            seq += 1
            s: dict[str, Any] = {
                "namespace": ns,
                "id": mid,
                "content": f"{mid} note {rng.getrandbits(64):016x}",
            }
            tier = rng.choice([None, *TIERS])
            if tier is not None:
                s["tier"] = tier
            if rng.random() < 0.5:
                s["embedding"] = nrng.standard_normal(DIM).astype(np.float32).tolist()
                s["embedding_model"] = MODEL
            return s

        with MemoryClient(self.target, timeout=20) as c:
            while not self.stop.is_set():
                late = self.dead.is_set()
                r = rng.random()
                op = "create"
                if r < 0.30 or len(mine) < 8:
                    op = "create"
                elif r < 0.60:
                    op = "batch"
                elif r < 0.75:
                    op = "tier"
                elif r < 0.87:
                    op = "reembed"
                else:
                    op = "delete"
                rid = uuid.uuid4().hex
                specs: list[dict[str, Any]] = []
                before: Mem | None = None
                after: Mem | None = None
                try:
                    if op in ("create", "batch"):
                        specs = [spec() for _ in range(1 if op == "create" else rng.randint(2, 8))]
                        if op == "create":
                            got = [c.create(request_id=rid, **specs[0])]
                        else:
                            got = c.create_batch(specs, request_id=rid)
                        assert [(m.namespace, m.id) for m in got] == [
                            (s["namespace"], s["id"]) for s in specs
                        ]
                        for s in specs:
                            mem = _mem_of(s)
                            mine[mem.key] = mem
                            led.settle(mem, mem.key, "created")
                        led.add("create_calls" if op == "create" else "batch_calls")
                        continue
                    before = mine[rng.choice(list(mine))]
                    if op == "tier":
                        after = replace(before, tier=rng.choice([x for x in TIERS if x != before.tier]))
                        got1 = c.update(ns, before.id, tier=after.tier)
                        assert got1.tier == after.tier
                    elif op == "reembed" and before.vec is not None:
                        vec = nrng.standard_normal(DIM).astype(np.float32)
                        after = replace(before, vec=_unit(vec))
                        c.update(ns, before.id, embedding=vec.tolist(), embedding_model=MODEL)
                    elif op == "reembed":  # built-in space: new content, the server re-embeds it
                        after = replace(before, content=f"{before.id} revised {rng.getrandbits(64):016x}")
                        got1 = c.update(ns, before.id, content=after.content)
                        assert got1.content == after.content
                    else:
                        c.delete(ns, before.id)
                    if after is None:
                        del mine[before.key]
                        led.settle(None, before.key, "deleted")
                    else:
                        mine[before.key] = after
                        led.settle(after, before.key, "updated")
                    led.add(f"{op}_calls")
                except Exception as e:
                    if late:  # the server was already gone when this call started: nothing landed
                        led.add("refused_after_death")
                        break
                    if not self.killing.is_set():
                        with led.lock:
                            led.errors.append(f"writer {t}: {op} failed before the kill: {e!r}")
                    # In flight at the kill: it happened entirely or not at all.
                    self.inflight[op] += 1
                    led.add("inflight")
                    if specs:
                        for s in specs:
                            led.maybe((ns, s["id"]), None, _mem_of(s))
                        with led.lock:
                            led.inflight_creates.append((rid, specs, op == "batch"))
                    elif before is not None:
                        led.maybe(before.key, before, after)
                    break


# -- verification -------------------------------------------------------------------------------------

_EMBEDDER = HashEmbedder(BUILTIN_DIM, BUILTIN_MODEL)


def _complete(m: Any, where: str) -> list[str]:
    """Problems of a returned memory that was asked for with include_embedding (empty: complete)."""
    bad = []
    if not m.id or not m.namespace or not m.content:
        bad.append("id, namespace or content empty")
    if not m.embedding_model:
        bad.append("embedding_model empty")
    dims = {MODEL: DIM, BUILTIN_MODEL: BUILTIN_DIM}
    want = dims.get(m.embedding_model)
    if want is None:
        bad.append(f"unknown embedding_model {m.embedding_model!r}")
    elif len(m.embedding) != want:
        bad.append(f"embedding has {len(m.embedding)} values, {m.embedding_model} has dimension {want}")
    elif abs(float(np.linalg.norm(np.asarray(m.embedding, np.float64))) - 1.0) > 1e-3:
        bad.append("embedding not normalized")
    elif m.embedding_model == BUILTIN_MODEL and not np.allclose(
        m.embedding, _EMBEDDER.embed(m.content), atol=1e-5
    ):
        bad.append("built-in embedding does not match the content")
    if m.tier not in TIERS:
        bad.append(f"tier {m.tier}")
    if m.create_time.seconds <= 0:
        bad.append("no create_time")
    return [f"{where} {m.namespace}/{m.id}: {b}" for b in bad]


def _as_mem(m: Any) -> Mem:
    vec = _unit(np.asarray(m.embedding, np.float32)) if m.embedding_model == MODEL else None
    return Mem(m.namespace, m.id, m.content, int(m.tier), vec)


def _search(c: MemoryClient, mem: Mem) -> list[Any]:
    query: Any = mem.content if mem.vec is None else list(mem.vec)
    return c.search(
        NAMESPACES,
        query,
        embedding_model="" if mem.vec is None else MODEL,
        limit=3,
        alpha=1.0,
        beta=0.0,
        gamma=0.0,
    )


def _pmap(fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(fn, items))


def verify(target: str, ledger: Ledger, label: str) -> dict[str, Any]:
    """Check the restarted server against the ledger, then resolve the ledger to what was found and
    retry the creates that were in flight (same request_id: exactly once)."""
    t0 = time.monotonic()
    problems: list[str] = []
    with MemoryClient(target, timeout=30) as c:
        c.wait_ready()
        keys = sorted(ledger.outcomes)

        def fetch(key: Key) -> Mem | None:
            try:
                m = c.get(key[0], key[1], include_embedding=True)
            except NotFoundError:
                return None
            problems.extend(_complete(m, "get"))
            return _as_mem(m)

        found = dict(zip(keys, _pmap(fetch, keys), strict=True))
        for key in keys:
            outs = ledger.outcomes[key]
            if not any(_same(found[key], o) for o in outs):
                want = " or ".join(_show(o) for o in outs)
                problems.append(f"{key[0]}/{key[1]}: found {_show(found[key])}, expected {want}")

        # Batches in flight at the kill: all or nothing.
        batches: Counter[str] = Counter()
        for rid, specs, is_batch in ledger.inflight_creates:
            there = [found[(s["namespace"], s["id"])] is not None for s in specs]
            landed = "all" if all(there) else "none" if not any(there) else "PARTIAL"
            batches[f"{'batch' if is_batch else 'single'}:{landed}"] += 1
            if landed == "PARTIAL":
                problems.append(f"batch {rid} half-written: {sum(there)} of {len(there)} memories present")

        # Nothing half-written, nothing unknown, list agrees with get.
        listed: dict[Key, Mem] = {}
        ns_infos = list(c.list_namespaces(prefix="crash/"))
        for info in ns_infos:
            n, token = 0, ""
            while True:
                page, token = c.list_page(info.name, page_size=1000, page_token=token, include_embedding=True)
                for m in page:
                    problems.extend(_complete(m, "list"))
                    listed[(m.namespace, m.id)] = _as_mem(m)
                    n += 1
                if not token:
                    break
            if n != info.memory_count:
                problems.append(
                    f"namespace {info.name}: listed {n} memories, ListNamespaces says {info.memory_count}"
                )
        present = {k for k, v in found.items() if v is not None}
        for k in sorted(set(listed) - present):
            problems.append(
                f"{k[0]}/{k[1]}: listed but {'unknown' if k not in found else 'not found by get'}"
            )
        for k in sorted(present - set(listed)):
            problems.append(f"{k[0]}/{k[1]}: found by get but not listed")
        for k in sorted(present & set(listed)):
            if not _same(listed[k], found[k]):
                problems.append(f"{k[0]}/{k[1]}: list shows {_show(listed[k])}, get shows {_show(found[k])}")
        stats = c.stats()
        if stats.memory_count != len(present):
            problems.append(f"GetStats memory_count {stats.memory_count}, {len(present)} memories present")

        # Search: every present memory is the top hit for its own vector / text, exactly once; nothing
        # absent (deleted, or a create that did not land) is returned for its own last vector / text.
        def probe(key: Key) -> list[str]:
            mem = found[key]
            if mem is not None:
                hits = _search(c, mem)
                got = [(h.memory.namespace, h.memory.id) for h in hits]
                if not got or got[0] != key:
                    return [
                        f"search for {key[0]}/{key[1]} by its own {'text' if mem.vec is None else 'vector'}: "
                        f"top hits {got}"
                    ]
                out = []
                if got.count(key) != 1:
                    out.append(f"search for {key[0]}/{key[1]}: returned {got.count(key)} times")
                if hits[0].relevance < 0.999:
                    out.append(f"search for {key[0]}/{key[1]}: self relevance {hits[0].relevance}")
                if hits[0].memory.tier != mem.tier:
                    out.append(
                        f"search for {key[0]}/{key[1]}: tier {hits[0].memory.tier}, expected {mem.tier}"
                    )
                return out
            last = next((o for o in ledger.outcomes[key] if o is not None), None)
            if last is None:
                return []
            got = [(h.memory.namespace, h.memory.id) for h in _search(c, last)]
            return [f"search returned absent {key[0]}/{key[1]}"] if key in got else []

        searches = len(keys)
        for out in _pmap(probe, keys):
            problems.extend(out)
        verify_s = time.monotonic() - t0

        # Resolve the ledger and retry in-flight creates with their request ids.
        for key in keys:
            ledger.outcomes[key] = (found[key],)
        retried = 0
        for rid, specs, is_batch in ledger.inflight_creates:
            got = (
                c.create_batch(specs, request_id=rid) if is_batch else [c.create(request_id=rid, **specs[0])]
            )
            if [(m.namespace, m.id) for m in got] != [(s["namespace"], s["id"]) for s in specs]:
                problems.append(f"retry of request {rid} returned {[m.id for m in got]}")
            for s in specs:
                mem = _mem_of(s)
                if found[mem.key] is not None and not _same(
                    _as_mem(c.get(mem.ns, mem.id, include_embedding=True)), found[mem.key]
                ):
                    problems.append(f"retry of request {rid} changed {mem.ns}/{mem.id}")
                ledger.outcomes[mem.key] = (mem,)
            retried += 1
        ledger.inflight_creates.clear()
        spaces = {
            sp.embedding_model: (sp.live_vectors, sp.indexed_vectors + sp.pending_vectors)
            for sp in c.stats().spaces
        }

    figures = {
        "memories_present": len(present),
        "absent": len(keys) - len(present),
        "searches": searches,
        "inflight_creates": dict(batches),
        "retried_inflight_creates": retried,
        "verify_s": round(verify_s, 2),
        "spaces(live,indexed)": spaces,
    }
    print(f"[{label}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))
    if problems:
        shown = "\n  ".join(problems[:30])
        pytest.fail(f"[{label}] {len(problems)} problems after restart:\n  {shown}", pytrace=False)
    return figures


class Servers:
    """Server subprocesses from the ``server_process`` fixture, with their start-up time printed."""

    def __init__(self, start: Callable[..., Any]) -> None:
        self._start = start

    def start(self, data: Path, label: str, env: dict[str, str] | None = None) -> Any:
        t0 = time.monotonic()
        srv = self._start(data, env=env)
        print(f"[{label}] server start took {time.monotonic() - t0:.2f} s (until SERVING)")
        return srv


@pytest.fixture
def servers(server_process: Callable[..., Any]) -> Any:
    return Servers(server_process)


def _phase(
    srv: Any,
    ledger: Ledger,
    phase: int,
    *,
    kill: bool,
    seconds: float,
    min_acked: int,
    pools: dict[str, dict[Key, Mem]] | None = None,
) -> Load:
    before = Counter(ledger.counts)
    load = Load(srv.target, ledger, phase, pools)
    elapsed = load.run(seconds, min_acked)
    if kill:
        load.kill(srv)
    else:
        load.finish()
    d = ledger.counts - before
    acked = d["created"] + d["updated"] + d["deleted"]
    print(
        f"[phase {phase}] {elapsed:.2f} s of load, {acked} acknowledged writes ({d['created']} creates in "
        f"{d['create_calls']} single + {d['batch_calls']} batch calls, {d['updated']} updates, {d['deleted']} "
        f"deletes); in flight at the kill: {sum(load.inflight.values())} {dict(load.inflight)}; "
        f"refused after death: {d['refused_after_death']}"
    )
    assert not ledger.errors, "\n".join(ledger.errors)
    assert acked >= min_acked, f"only {acked} acknowledged writes"
    if kill:
        assert load.alive_at_kill == WRITERS, f"only {load.alive_at_kill} writers were running at the kill"
    if not kill:
        assert not load.inflight
    return load


def test_kill9_under_write_load(servers: Servers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ledger = Ledger()
    srv = servers.start(data, "first start")
    _phase(srv, ledger, 1, kill=True, seconds=2.5, min_acked=400)
    srv = servers.start(data, "restart after kill -9")
    verify(srv.target, ledger, "after kill -9")


def test_kill9_then_clean_restart_twice(servers: Servers, tmp_path: Path) -> None:
    data = tmp_path / "data"
    ledger = Ledger()
    srv = servers.start(data, "first start")
    _phase(srv, ledger, 1, kill=True, seconds=1.0, min_acked=300)

    srv = servers.start(data, "1st restart, after kill -9", env=FORCE_HNSW)
    verify(srv.target, ledger, "1st restart, after kill -9")
    _phase(srv, ledger, 2, kill=False, seconds=1.0, min_acked=300, pools=ledger.present_by_ns())
    t0 = time.monotonic()
    assert srv.stop() == 0
    manifests = [json.loads(p.read_text()) for p in sorted((data / "indexes").glob("*-t[0-9].json"))]
    print(
        f"[clean stop] {time.monotonic() - t0:.2f} s, snapshots: {[(m['model'], m['n']) for m in manifests]}"
    )
    assert {m["model"] for m in manifests} == {MODEL, BUILTIN_MODEL}

    srv = servers.start(data, "2nd restart, after clean stop", env=FORCE_HNSW)
    verify(srv.target, ledger, "2nd restart, after clean stop")
    _phase(srv, ledger, 3, kill=True, seconds=1.0, min_acked=300, pools=ledger.present_by_ns())

    srv = servers.start(data, "3rd restart, snapshot + replay", env=FORCE_HNSW)
    verify(srv.target, ledger, "3rd restart, snapshot + replay")


def test_kill9_while_periodic_snapshots_run(servers: Servers, tmp_path: Path) -> None:
    """Columns and index snapshots taken every few hundred writes while 8 writers run; kill -9 lands
    between or during them. The restart restores the last snapshot and reloads the records changed
    after it (storage "changes" log), and must hold exactly what was acknowledged."""
    data = tmp_path / "data"
    ledger = Ledger()
    often = {"TIERMEM_SNAPSHOT_INTERVAL_SECONDS": "0.3", "TIERMEM_SNAPSHOT_MIN_CHANGES": "50"}
    srv = servers.start(data, "first start", env=often)
    _phase(srv, ledger, 1, kill=True, seconds=3.0, min_acked=400)
    manifest = json.loads((data / "indexes" / "columns.json").read_text())
    print(f"[kill -9] last columns snapshot at commit {manifest['seq']}")
    srv = servers.start(data, "restart after kill -9", env={**often, **FORCE_HNSW})
    verify(srv.target, ledger, "restart after kill -9")
    _phase(srv, ledger, 2, kill=True, seconds=2.0, min_acked=300, pools=ledger.present_by_ns())
    srv = servers.start(data, "2nd restart after kill -9", env=FORCE_HNSW)
    verify(srv.target, ledger, "2nd restart after kill -9")
