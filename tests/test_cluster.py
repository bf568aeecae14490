"""Tenant shards behind a real HAProxy on loopback (``make test-cluster``; docs/scaling.md): three
``--sharded`` server processes (shard c with a replica on another port, acknowledging writes
synchronously), 50 tenants written through the proxy, one tenant moved to another shard while it
and another tenant keep writing, one shard killed with SIGKILL and restarted, then shard c killed
under writes and its replica promoted; every acknowledged write is present exactly once, on its
tenant's one shard, and no tenant sees another's memories.

Needs Debian's haproxy (``make proxy-toolchain``); skipped without it unless
TIERMEM_REQUIRE_HAPROXY=1 (CI), which makes a missing proxy a failure."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from conftest import ServerProcess, haproxy_or_skip, spawn_server

from tiermem.client import MemoryClient, TiermemError, haproxy
from tiermem.client.shards import Shards, move_scope

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

TENANTS = 50


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    base: Path
    ports: dict[str, int]
    shards: dict[str, ServerProcess] = field(default_factory=dict)
    replica: ServerProcess | None = None
    proxy_port: int = 0
    map_file: Path = Path()
    admin_socket: Path = Path()

    @property
    def proxy(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def addresses(self) -> dict[str, str]:
        return {name: f"127.0.0.1:{port}" for name, port in self.ports.items()}

    def start_shard(self, name: str) -> None:
        if name in self.shards:
            self.shards[name].close()  # (its process is gone: this closes its pipe)
        replicated = ("--replication", "--replica-ack", "sync") if name == "c" else ()
        self.shards[name] = spawn_server(
            self.base / name, "--port", str(self.ports[name]), "--sharded", *replicated
        )

    def start_replica(self) -> None:
        """Shard c's replica, on a port of its own."""
        self.replica = spawn_server(
            self.base / "c-replica", "--sharded", "--replica-of", self.addresses()["c"]
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    binary = haproxy_or_skip("the cluster test")
    c = Cluster(tmp_path, {name: _free_port() for name in ("a", "b", "c")})
    for name in c.ports:
        c.start_shard(name)
    c.start_replica()
    c.proxy_port = _free_port()
    c.map_file, c.admin_socket = tmp_path / "routes.map", tmp_path / "admin.sock"
    c.map_file.write_text("")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy.config(c.addresses(), c.proxy, c.map_file, c.admin_socket))
    log = (tmp_path / "haproxy.log").open("w")
    proxy = subprocess.Popen([binary, "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not c.admin_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proxy.poll() is None, (tmp_path / "haproxy.log").read_text()
        yield c
    finally:
        proxy.kill()
        proxy.wait()
        log.close()
        for shard in [*c.shards.values(), *([c.replica] if c.replica else [])]:
            shard.close()


class Ledger:
    """Every write the proxy acknowledged: tenant -> {(namespace, id): content}."""

    def __init__(self) -> None:
        self.acked: dict[str, dict[tuple[str, str], str]] = {}
        self.unanswered: set[str] = set()  # contents of writes that failed: stored or not, never twice
        self._lock = threading.Lock()

    def add(self, tenant: str, namespace: str, id_: str, content: str) -> None:
        with self._lock:
            self.acked.setdefault(tenant, {})[(namespace, id_)] = content

    def count(self) -> int:
        return sum(len(v) for v in self.acked.values())


def _stored(c: MemoryClient, tenant: str) -> list[tuple[str, str, str]]:
    """Every memory of ``tenant``'s tree, as seen through ``c``."""
    route = [("tiermem-route", tenant)]
    out = []
    for ns in c.list_namespaces(tenant, call_metadata=route):
        if ns.name == tenant or ns.name.startswith(tenant + "/"):
            out += [(m.namespace, m.id, m.content) for m in c.list_memories(ns.name, call_metadata=route)]
    return out


def _check_exactly_once(c: MemoryClient, ledger: Ledger, tenants: list[str]) -> None:
    for tenant in tenants:
        stored = _stored(c, tenant)
        keys = [(ns, id_) for ns, id_, _ in stored]
        assert len(keys) == len(set(keys)), f"{tenant}: a memory stored twice"
        contents = [content for _, _, content in stored]
        assert len(contents) == len(set(contents)), f"{tenant}: a write applied twice"
        held = {(ns, id_): content for ns, id_, content in stored}
        missing = {k: v for k, v in ledger.acked[tenant].items() if held.get(k) != v}
        assert not missing, f"{tenant}: acknowledged writes missing: {missing}"
        extra = {k: v for k, v in held.items() if k not in ledger.acked[tenant]}
        assert set(extra.values()) <= ledger.unanswered, f"{tenant}: memories nobody wrote: {extra}"


def _writer(
    c: MemoryClient, tenants: list[str], ledger: Ledger, stop: threading.Event, errors: list[BaseException]
) -> None:
    n = 0
    while not stop.is_set():
        tenant = tenants[n % len(tenants)]
        ns = f"{tenant}/session:live"
        content = f"{tenant} live write {threading.get_ident()}-{n}"
        try:
            m = c.create(ns, content, timeout=20)
            ledger.add(tenant, ns, m.id, content)
        except TiermemError as e:  # (not acknowledged: it may or may not be stored, never twice)
            errors.append(e)
            ledger.unanswered.add(content)
        n += 1


def test_tenants_on_shards_behind_haproxy(cluster: Cluster) -> None:
    ledger = Ledger()
    tenants = [f"user:t{i}" for i in range(TENANTS)]
    with MemoryClient(cluster.proxy, sharded=True, timeout=20) as c, Shards(cluster.addresses()) as shards:
        # -- 50 tenants, each a scope tree, written through the proxy.
        for t in tenants:
            for ns in (t, f"{t}/project:p"):
                for k in range(2):
                    content = f"{t} fact {k} about {ns.rsplit('/', 1)[-1]}"
                    ledger.add(t, ns, c.create(ns, content).id, content)
        placed = {t: shards.locate(t) for t in tenants}
        assert all(len(where) == 1 for where in placed.values()), placed
        assert len({where[0] for where in placed.values()}) == 3, "consistent hashing used every shard"

        # -- Move one tenant while it and another tenant keep writing.
        moving, other = tenants[0], tenants[1]
        source = placed[moving][0]
        target = next(n for n in cluster.ports if n != source)
        stop, errors = threading.Event(), []
        writers = [
            threading.Thread(target=_writer, args=(c, [moving, other], ledger, stop, errors))
            for _ in range(2)
        ]
        for w in writers:
            w.start()
        time.sleep(0.5)
        try:
            report = move_scope(
                moving,
                shards.clients[source],
                shards.clients[target],
                lambda: haproxy.set_route(cluster.admin_socket, cluster.map_file, moving, target),
                moved_to=target,
            )
            time.sleep(0.5)
        finally:
            stop.set()
            for w in writers:
                w.join()
        print(f"move under writes: {report}")
        assert errors == [], errors[:3]  # fenced writes were made again, never failed
        assert report.memories >= 4 and report.copied >= 4, report
        assert shards.locate(moving) == [target]
        assert cluster.map_file.read_text() == f"{moving} {haproxy.backend_of(target)}\n"
        live = [k for k in ledger.acked[moving] if k[0].endswith("session:live")]
        assert len(live) > 10, "writes went on through the move"
        # The source answers a stale route with UNAVAILABLE, never with an empty scope.
        plain = grpc.insecure_channel(cluster.addresses()[source])
        with MemoryClient(channel=plain, timeout=0.3) as stale, pytest.raises(TiermemError) as refused:
            stale.list_namespaces(moving, call_metadata=[("tiermem-route", moving)])
            list(stale.list_memories(moving, call_metadata=[("tiermem-route", moving)]))
        assert refused.value.reason == "SCOPE_MOVED"
        _check_exactly_once(c, ledger, [moving, other])

        # -- A shard killed with SIGKILL: its tenants are unavailable, never answered by another
        # shard; restarted, it has every acknowledged write.
        victim = placed[tenants[2]][0]
        cluster.shards[victim].kill9()
        with (
            MemoryClient(cluster.proxy, sharded=True, timeout=1) as impatient,
            pytest.raises(TiermemError) as down,
        ):
            impatient.search(tenants[2], "fact")
        assert down.value.code.name in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), down.value
        cluster.start_shard(victim)
        shards.clients[victim].wait_ready(timeout=60)
        _check_exactly_once(c, ledger, tenants)

        # -- Isolation: each tenant finds only its own memories; a key for one tenant cannot reach another.
        for t in tenants[:10]:
            hits = c.search(t, "fact about", include_ancestors=False, limit=50)
            assert hits and {h.memory.namespace for h in hits} == {t}
        with MemoryClient(cluster.proxy, timeout=5) as manual, pytest.raises(TiermemError) as mismatch:
            manual.search(tenants[3], "fact", call_metadata=[("tiermem-route", tenants[4])])
        assert mismatch.value.reason == "ROUTE_MISMATCH"

        # -- Shard c lost under writes: its replica (synchronous) is promoted and takes its calls.
        on_c = [t for t in tenants if shards.locate(t) == ["c"]]
        assert on_c, "consistent hashing put no tenant on shard c"
        # Shard c may have been the one restarted above: its replica reconnects with a backoff (up to
        # 2 s), and until it does c's synchronous writes wait. One confirmed write says it is back.
        deadline = time.monotonic() + 30
        while True:
            try:
                probe = c.create(on_c[0], "confirmed by the replica", request_id="probe")
                break
            except TiermemError as e:
                assert e.reason == "REPLICA_NOT_CONFIRMED" and time.monotonic() < deadline, e
        ledger.add(on_c[0], on_c[0], probe.id, "confirmed by the replica")
        stop, errors = threading.Event(), []
        writer = threading.Thread(target=_writer, args=(c, on_c, ledger, stop, errors))
        writer.start()
        time.sleep(1.0)
        cluster.shards["c"].kill9()  # (writes in flight fail: not acknowledged)
        time.sleep(0.3)
        stop.set()
        writer.join()
        assert cluster.replica is not None

        def promote(shard: str) -> subprocess.CompletedProcess[str]:
            assert cluster.replica is not None
            return subprocess.run(
                [sys.executable, "-m", "tiermem", "shard", "promote", "--replica", cluster.replica.target,
                 "--shard", shard, "--haproxy-socket", str(cluster.admin_socket)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip

        # A shard HAProxy does not know is refused before the replica is promoted.
        typo = promote("cc")
        assert typo.returncode == 1 and "HAProxy has no shard 'cc'" in typo.stderr
        promoted = promote("c")
        assert promoted.returncode == 0, promoted.stderr
        assert json.loads(promoted.stdout)["switched"] is True
        again = promote("c")  # (a retry, as after a lost answer: the same promotion, switched again)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["applied_seq"] == json.loads(promoted.stdout)["applied_seq"]
        assert sum(1 for t in on_c for k in ledger.acked[t] if "session:live" in k[0]) > 5
        _check_exactly_once(c, ledger, tenants)  # (c's tenants now answered by the promoted replica)
        m = c.create(on_c[0], "written after the takeover")
        assert c.get(on_c[0], m.id).content == "written after the takeover"
        for t in tenants[:10]:
            hits = c.search(t, "fact about", include_ancestors=False, limit=50)
            assert hits and {h.memory.namespace for h in hits} == {t}


def test_the_shard_command_moves_a_tenant_and_lists_every_shard(cluster: Cluster) -> None:
    tenants = [f"user:cli{i}" for i in range(6)]
    with MemoryClient(cluster.proxy, sharded=True, timeout=20) as c, Shards(cluster.addresses()) as shards:
        for t in tenants:
            c.create(f"{t}/project:p", f"{t} keeps notes")
        tenant = tenants[0]
        source = shards.locate(tenant)[0]
        target = next(n for n in cluster.ports if n != source)
        addresses = cluster.addresses()

        def tiermem(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tiermem", *args], capture_output=True, text=True, timeout=120
            )

        # What would strand the scope behind its fence is refused before anything moves: a
        # --to-shard HAProxy sends elsewhere, a map path HAProxy does not know, --from as --to.
        move = ["shard", "move", "--scope", tenant, "--from", addresses[source]]
        hap = ["--haproxy-socket", str(cluster.admin_socket)]
        for args, says in (
            (["--to", addresses[target], "--to-shard", source, *hap, "--haproxy-map", str(cluster.map_file)],
             f"HAProxy sends shard {source!r} to"),
            (["--to", addresses[target], "--to-shard", target, *hap, "--haproxy-map", "routes.map"],
             "HAProxy has no map routes.map"),
            (["--to", addresses[source], "--to-shard", source, *hap, "--haproxy-map", str(cluster.map_file)],
             "--from and --to are the same shard"),
        ):  # fmt: skip
            refused = tiermem(*move, *args)
            assert refused.returncode == 1 and says in refused.stderr, refused.stderr
        assert shards.locate(tenant) == [source] and cluster.map_file.read_text() == ""
        with MemoryClient(addresses[source], sharded=True) as s:
            assert s.get_scope_routing(tenant).routing == 0
        dup = tiermem(
            "shard", "namespaces", f"--shard=x={addresses[source]}", f"--shard=x={addresses[target]}"
        )
        assert dup.returncode == 1 and "--shard names 'x' twice" in dup.stderr

        moved = tiermem(
            "shard", "move", "--scope", tenant, "--from", addresses[source], "--to", addresses[target],
            "--to-shard", target, "--haproxy-socket", str(cluster.admin_socket),
            "--haproxy-map", str(cluster.map_file),
        )  # fmt: skip
        assert moved.returncode == 0, moved.stderr
        report = json.loads(moved.stdout)
        assert (report["scope"], report["memories"]) == (tenant, 1)
        assert [step for step, _ in report["steps"]] == [
            "copy",
            "fence",
            "catch up",
            "switch",
            "retire",
            "done",
        ]
        c.create(tenant, "written after the move")
        assert shards.locate(tenant) == [target]
        assert sorted(m.content for m in c.list_memories(tenant)) == ["written after the move"]

        shard_args = [f"--shard={name}={addr}" for name, addr in addresses.items()]
        listed = tiermem("shard", "namespaces", "--prefix", "user:cli", *shard_args)
        assert listed.returncode == 0, listed.stderr
        where = {(row["shard"], row["name"]) for row in json.loads(listed.stdout)}
        assert (target, tenant) in where and (target, f"{tenant}/project:p") in where
        assert len(where) == len(tenants) + 1
        stats = json.loads(tiermem("shard", "stats", *shard_args).stdout)
        assert stats["memory_count"] == len(tenants) + 1 and set(stats["shards"]) == set(addresses)

        # A scope that is not top-level is refused before anything moves (exit 1, one line).
        bad = tiermem(
            "shard", "move", "--scope", f"{tenants[1]}/project:p", "--from", addresses[source],
            "--to", addresses[target], "--to-shard", target, "--haproxy-socket", str(cluster.admin_socket),
            "--haproxy-map", str(cluster.map_file),
        )  # fmt: skip
        assert bad.returncode == 1 and "not a top-level scope" in bad.stderr


# A move killed just before the proxy switch ("before", "filed") or right after it ("after"): a
# process of its own, ended by os._exit.
_KILLED_MOVE = """
import os, sys
from tiermem.client import MemoryClient, haproxy
from tiermem.client.shards import move_scope
source, target, shard, scope, socket_path, map_path, when = sys.argv[1:8]
def switch():
    if when == "after":
        haproxy.set_route(socket_path, map_path, scope, shard)
    os._exit(9)
with MemoryClient(source, timeout=30) as s, MemoryClient(target, timeout=30) as t:
    move_scope(scope, s, t, switch, moved_to=shard)
sys.exit(3)
"""


def test_the_shard_command_ends_a_killed_move_as_the_proxy_routes_it(cluster: Cluster) -> None:
    addresses = cluster.addresses()

    def tiermem(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tiermem", *args], capture_output=True, text=True, timeout=120
        )

    with MemoryClient(cluster.proxy, sharded=True, timeout=20) as c, Shards(addresses) as shards:
        for when, ended in (("before", "undone"), ("after", "finished"), ("filed", "finished")):
            tenant = f"user:end-{when}"
            for text in ("deploys on fridays", "likes tea"):
                c.create(f"{tenant}/project:p", f"{tenant} {text}")
            source = shards.locate(tenant)[0]
            target = next(n for n in sorted(addresses) if n != source)
            killed = subprocess.run(
                [sys.executable, "-c", _KILLED_MOVE, addresses[source], addresses[target], target, tenant,
                 str(cluster.admin_socket), str(cluster.map_file), when],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert killed.returncode == 9, killed.stderr
            if when == "filed":  # killed between the switch's two writes: the map file's, then HAProxy's
                with cluster.map_file.open("a") as f:
                    f.write(f"{tenant} {haproxy.backend_of(target)}\n")
            assert sorted(shards.locate(tenant)) == sorted([source, target])  # (the copy is there)
            move = ["--scope", tenant, "--from", addresses[source], "--haproxy-socket", str(cluster.admin_socket),
                    "--haproxy-map", str(cluster.map_file)]  # fmt: skip
            # --to must be where HAProxy sends --to-shard: else refused, nothing changed.
            other = next(n for n in sorted(addresses) if n not in (source, target))
            wrong = tiermem("shard", "end-move", *move, "--to", addresses[other], "--to-shard", target)
            assert wrong.returncode == 1 and "HAProxy sends shard" in wrong.stderr, wrong.stderr
            unknown = tiermem("shard", "end-move", *move, "--to", addresses[target], "--to-shard", "zz")
            assert unknown.returncode == 1 and unknown.stderr.strip().splitlines() == [
                "tiermem shard end-move: HAProxy has no shard 'zz' (backend shard-zz): Can't find backend."
            ], unknown.stderr
            assert sorted(shards.locate(tenant)) == sorted([source, target])

            done = tiermem("shard", "end-move", *move, "--to", addresses[target], "--to-shard", target)
            assert done.returncode == 0, done.stderr
            report = json.loads(done.stdout)
            assert (report["ended"], report["switched"], report["source_was"]) == (
                ended,
                when != "before",
                "fenced",
            )
            holder = source if when == "before" else target
            assert shards.locate(tenant) == [holder]
            pinned = f"{tenant} {haproxy.backend_of(target)}" in cluster.map_file.read_text().splitlines()
            assert pinned == (when != "before")
            # Through the proxy the tenant writes and reads where it is, nothing lost or doubled.
            c.create(f"{tenant}/project:p", f"{tenant} writes after the move ended")
            stored = sorted(m.content for m in c.list_memories(f"{tenant}/project:p"))
            assert stored == sorted(
                f"{tenant} {t}" for t in ("deploys on fridays", "likes tea", "writes after the move ended")
            )
            assert shards.locate(tenant) == [holder]
            again = tiermem("shard", "end-move", *move, "--to", addresses[target], "--to-shard", target)
            assert again.returncode == 0 and json.loads(again.stdout)["ended"] == "nothing to end", (
                again.stderr
            )
