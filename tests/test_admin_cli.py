"""The ``tiermem`` administration commands, run as subprocesses (``python -m tiermem``) against real
servers: backup and restore through a backup file (memories with vectors, graph, scope progress),
damaged files refused before anything is sent, stats / namespaces / health, API keys and TLS; the
backup file format read in-process; the packaging files (Dockerfile, systemd unit) checked by
reading them, since no image is built here."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import ipaddress
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tiermem.client import MemoryClient, NotFoundError, metadata_dict
from tiermem.client import backup as backup_module
from tiermem.client.backup import FORMAT_VERSION, MAGIC, BackupFileError, backup, restore, verify
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer

ROOT = Path(__file__).resolve().parent.parent
Factory = Callable[..., RunningServer]


def tiermem(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tiermem ARGS`` (TIERMEM_API_KEY only from ``env``)."""
    base = {k: v for k, v in os.environ.items() if k != "TIERMEM_API_KEY"}
    return subprocess.run(
        [sys.executable, "-m", "tiermem", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


def addr(running: RunningServer) -> str:
    return f"127.0.0.1:{running.port}"


def connect(running: RunningServer, **kw: Any) -> MemoryClient:
    c = MemoryClient(addr(running), timeout=30, **kw)
    c.wait_ready()
    return c


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


# -- what a server holds --------------------------------------------------------------------------

NAMESPACES = ("p", "p/c", "other")


def fill(c: MemoryClient) -> None:
    """Memories with and without vectors in three namespaces, a graph, and scope progress."""
    for i in range(12):
        vector = {"embedding": [float(i), 1.0, -0.5 * i, 0.25], "embedding_model": "m"} if i % 3 else {}
        c.create(
            "p",
            f"memory number {i} about deploys",
            id=f"m{i}",
            tier=["fast", "medium", "slow", "glacial"][i % 4],
            importance=0.1 + 0.07 * i,
            tags=[f"t{i % 2}"],
            metadata={"n": i, "odd": bool(i % 2), "who": "ana"},
            **vector,
        )
    c.create("p/c", "a child scope memory", id="child", embedding=[0.0, 0.0, 1.0, 0.0], embedding_model="m")
    c.create("other", "another namespace", id="o1", tier="slow")
    c.observe("p", "the deploy failed twice on friday", importance=0.6)
    c.observe("p/c", "the child saw it too", importance=0.3)
    c.upsert_node("p", "ana", label="person", properties={"age": 41}, memory_ids=["m1"])
    c.upsert_node("p", "billing", label="service")
    c.add_edge("p", "ana", "owns", "billing", properties={"since": 2021})


def memories(c: MemoryClient, ns: str) -> dict[str, tuple[Any, ...]]:
    out = {}
    for m in c.list_memories(ns):
        full = c.get(ns, m.id, include_embedding=True)
        out[m.id] = (
            full.content,
            full.kind,
            full.tier,
            round(full.importance, 6),
            tuple(full.tags),
            tuple(sorted(metadata_dict(full).items())),
            full.embedding_model,
            tuple(round(x, 6) for x in full.embedding),
        )
    return out


def graph(c: MemoryClient, ns: str) -> tuple[Any, ...]:
    around = c.neighbors(ns, "ana")
    nodes = sorted((n.id, n.label, tuple(sorted(metadata_dict(n).items())), tuple(n.memory_ids)) for n in around.nodes)  # fmt: skip
    edges = sorted((e.source_id, e.relation, e.target_id, tuple(sorted(metadata_dict(e).items()))) for e in around.edges)  # fmt: skip
    return tuple(nodes), tuple(edges)


def progress(c: MemoryClient, ns: str) -> tuple[float, int]:
    st = c.stats(ns)
    return round(st.reflection_importance, 6), st.summary_tokens


def state(c: MemoryClient) -> dict[str, Any]:
    return {
        "memories": {ns: memories(c, ns) for ns in NAMESPACES},
        "graph": graph(c, "p"),
        "progress": {ns: progress(c, ns) for ns in NAMESPACES},
        "namespaces": sorted(n.name for n in c.list_namespaces()),
    }


# -- backup and restore ---------------------------------------------------------------------------


def test_backup_and_restore_through_the_cli_carry_everything(server_factory: Factory, tmp_path: Path) -> None:
    source = server_factory(data_dir=tmp_path / "source")
    with connect(source) as c:
        fill(c)
        c.update_namespace_config("p", protected=True, max_items=40)
        c.update_namespace_config("p/c", promote_access_count=5)
        before = state(c)
        settings = {ns: c.get_namespace_config(ns).config for ns in ("p", "p/c")}
    assert len(before["memories"]["p"]) == 13  # 12 and the observation
    assert any(v[7] for v in before["memories"]["p"].values())  # vectors are compared
    assert before["progress"]["p"][0] > 0 and before["progress"]["p"][1] > 0
    assert before["graph"][1]

    file = tmp_path / "backups" / "all.tmb"
    file.parent.mkdir()
    out = tiermem("backup", "--target", addr(source), str(file))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["memories"] == 16 and summary["nodes"] == 2 and summary["edges"] == 1
    assert summary["scopes"] >= 2 and summary["namespace"] == "" and summary["settings"] == 2
    assert summary["size_bytes"] == file.stat().st_size and file.read_bytes().startswith(MAGIC)
    assert file.stat().st_mode & 0o077 == 0  # the owner's only: it holds every memory
    assert [p.name for p in file.parent.iterdir()] == ["all.tmb"]  # no temporary file left

    target = server_factory(data_dir=tmp_path / "other")
    with connect(target) as c:
        assert list(c.list_namespaces()) == []
        out = tiermem("restore", "--target", addr(target), str(file))
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"imported": 16, "graph_items": 3, "reembedded": 0, "settings": 2}
        assert state(c) == before
        assert {ns: c.get_namespace_config(ns).config for ns in settings} == settings

    # One namespace and its children, restored elsewhere.
    part = tmp_path / "p.tmb"
    out = tiermem("backup", "--target", addr(source), str(part), "--namespace", "p", "--include-children")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["memories"] == 15
    out = tiermem("restore", "--target", addr(target), str(part), "--target-namespace", "q")
    assert out.returncode == 0, out.stderr
    with connect(target) as c:
        assert memories(c, "q") == before["memories"]["p"]
        assert memories(c, "q/c") == before["memories"]["p/c"]
        assert progress(c, "q") == before["progress"]["p"]
        assert graph(c, "q") == before["graph"]
        restored = c.get_namespace_config("q").config
        assert restored.protected and restored.policy == settings["p"].policy


def test_restoring_a_preference_into_a_protected_namespace_needs_confirm(
    server_factory: Factory, tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "source")
    with connect(source) as c:
        c.create("s", "prefers short answers", id="pref", kind="preference")
    file = tmp_path / "s.tmb"
    assert tiermem("backup", "--target", addr(source), str(file)).returncode == 0
    target = server_factory(data_dir=tmp_path / "other")
    with connect(target) as c:
        c.create("s", "already here", id="n0")
        c.update_namespace_config("s", protected=True)
        out = tiermem("restore", "--target", addr(target), str(file))
        assert out.returncode == 1 and "NAMESPACE_PROTECTED" in out.stderr, out.stderr
        assert [m.id for m in c.list_memories("s")] == ["n0"]
        out = tiermem("restore", "--target", addr(target), str(file), "--confirm")
        assert out.returncode == 0, out.stderr
        assert c.get("s", "pref").kind == "preference"


def _flip_inside(data: bytes, needle: bytes) -> bytes:
    at = data.index(needle) + 3
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_a_damaged_or_truncated_file_is_refused_and_restores_nothing(
    server_factory: Factory, tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "source")
    with connect(source) as c:
        fill(c)
    good = tmp_path / "good.tmb"
    assert tiermem("backup", "--target", addr(source), str(good)).returncode == 0
    data = good.read_bytes()
    target = server_factory(data_dir=tmp_path / "other")

    cases = {
        "flipped.tmb": (_flip_inside(data, b"memory number 7"), "checksum mismatch"),
        "cut-trailer.tmb": (data[:-10], "truncated"),
        "cut-record.tmb": (data[: len(data) // 2], "truncated"),
        "not-a-backup.tmb": (b'{"memories": []}\n', "not a tiermem backup"),
    }
    for name, (content, problem) in cases.items():
        bad = tmp_path / name
        bad.write_bytes(content)
        out = tiermem("restore", "--target", addr(target), str(bad))
        line = one_error_line(out)
        assert line.startswith("tiermem restore: ") and str(bad) in line and problem in line, line
        assert out.stdout == ""
    with connect(target) as c:
        assert list(c.list_namespaces()) == []
        assert c.stats().memory_count == 0
        with pytest.raises(NotFoundError):
            c.neighbors("p", "ana")


def test_the_file_format_is_checked_part_by_part(server_factory: Factory, tmp_path: Path) -> None:
    """In-process: the summary, and each way a file can be wrong, named in a BackupFileError."""
    running = server_factory()
    path = tmp_path / "b.tmb"
    with connect(running) as c:
        c.create("p", "one", id="a", embedding=[1.0, 0.0], embedding_model="m")
        c.create("p", "two", id="b")
        written = backup(c, path, "p")
    assert written == verify(path)
    assert (written.memories, written.messages, written.namespace, written.format_version) == (2, 4, "p", 1)
    data = path.read_bytes()
    assert data[: len(MAGIC)] == MAGIC and struct.unpack(">I", data[len(MAGIC) : len(MAGIC) + 4]) == (1,)
    assert data[-32:].hex() == written.sha256 and struct.unpack(">Q", data[-40:-32]) == (written.messages,)

    def refused(content: bytes) -> BackupFileError:
        bad = tmp_path / "bad.tmb"
        bad.write_bytes(content)
        with pytest.raises(BackupFileError) as e:
            verify(bad)
        assert isinstance(e.value, ValueError) and e.value.path == bad and str(bad) in str(e.value)
        return e.value

    head = len(MAGIC) + 4
    newer = data[: len(MAGIC)] + struct.pack(">I", FORMAT_VERSION + 1) + data[head:]
    assert "format version 2 is not supported" in refused(newer).problem
    assert refused(b"").problem.startswith("not a tiermem backup")
    assert refused(MAGIC[:5]).problem.startswith("truncated")
    assert refused(data + b"\0").problem == "damaged: 1 unexpected bytes follow the trailer"
    assert refused(data[:-1]).problem.startswith("truncated")
    assert refused(_flip_inside(data, b"two")).problem.startswith("checksum mismatch")
    # A trailer whose count is wrong, with a checksum that matches: the count is still checked.
    miscounted = data[:-44] + struct.pack(">IQ", 0xFFFFFFFF, 9)
    miscounted += hashlib.sha256(miscounted).digest()
    assert refused(miscounted).problem == "damaged: the trailer counts 9 messages, the file holds 4"
    # restore checks the file before it sends anything: nothing reached the server.
    with connect(running) as c, pytest.raises(BackupFileError):
        restore(c, tmp_path / "bad.tmb", "elsewhere")
    with connect(running) as c:
        assert [n.name for n in c.list_namespaces()] == ["p"]


def test_a_file_changed_after_its_check_stops_the_restore_with_the_file_named(
    server_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks sent are read again and checked as they go: a damaged file that got past the
    first check (here skipped) cancels the import with a BackupFileError, not a bare CANCELLED."""
    running = server_factory()
    path = tmp_path / "b.tmb"
    with connect(running) as c:
        c.create("p", "memory number one", id="a")
        backup(c, path, "p")
        path.write_bytes(_flip_inside(path.read_bytes(), b"memory number one"))
        monkeypatch.setattr(backup_module, "_check", lambda f, p: None)
        with pytest.raises(BackupFileError) as e:
            restore(c, path, "q")
        assert e.value.path == path and e.value.problem.startswith("changed while it was restored (checksum")
        assert "the batches the server committed before that stay restored" in e.value.problem


def test_a_restore_the_server_refuses_names_the_file(server_factory: Factory, tmp_path: Path) -> None:
    running = server_factory()
    path = tmp_path / "b.tmb"
    with connect(running) as c:
        c.create("p", "memory number one", id="a")
        backup(c, path, "p")
    out = tiermem("restore", "--target", addr(running), str(path))  # its memories are there already
    assert out.returncode == 1
    assert one_error_line(out).startswith(f"tiermem restore: {path}: ALREADY_EXISTS")


def test_a_failed_backup_leaves_the_previous_file(server_factory: Factory, tmp_path: Path) -> None:
    running = server_factory(api_keys=str(_keys(tmp_path)))
    path = tmp_path / "keep.tmb"
    path.write_bytes(b"the previous backup")
    out = tiermem("backup", "--target", addr(running), str(path))  # no key: refused
    line = one_error_line(out)
    assert "UNAUTHENTICATED" in line and "API_KEY_MISSING" in line
    assert line.startswith(f"tiermem backup: {path}: ")  # (the line names the file, as restore's)
    assert path.read_bytes() == b"the previous backup"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "keep.tmb", "keys.jsonl"]


# -- figures, health, keys, TLS -------------------------------------------------------------------


def _keys(tmp_path: Path) -> Path:
    keys = tmp_path / "keys.jsonl"
    if not keys.exists():
        add_key(keys, [""], "admin")
    return keys


def test_stats_namespaces_and_health(server_factory: Factory, tmp_path: Path) -> None:
    running = server_factory()
    with connect(running) as c:
        c.create("user:ana", "one")
        c.create("user:ana/project:x", "two")
        c.create("team:x", "three")
    out = tiermem("stats", "--target", addr(running))
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["memory_count"] == 3 and figures["namespace_count"] == 3
    assert [t["tier"] for t in figures["tiers"]] == ["TIER_FAST", "TIER_MEDIUM", "TIER_SLOW", "TIER_GLACIAL"]
    out = tiermem("stats", "--target", addr(running), "--namespace", "team:x")
    assert json.loads(out.stdout)["memory_count"] == 1

    out = tiermem("namespaces", "--target", addr(running), "--prefix", "user:")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [
        {"name": "user:ana", "memory_count": 1},
        {"name": "user:ana/project:x", "memory_count": 1},
    ]

    out = tiermem("health", "--target", addr(running))
    assert (out.returncode, out.stdout, out.stderr) == (0, "SERVING\n", "")
    running.stop(0)
    out = tiermem("health", "--target", addr(running), "--timeout", "1")
    assert out.stdout == "NOT_SERVING\n"
    assert one_error_line(out).startswith("tiermem health: ")


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for args in (
        ["backup", "--target", "127.0.0.1:1"],
        ["stats"],
        ["frobnicate"],
        [],
        ["shard", "namespaces", "--shard", "a"],  # (NAME=HOST:PORT)
    ):
        out = tiermem(*args)
        assert out.returncode == 2 and "usage: tiermem" in out.stderr, args
    for bad in ("0", "-1", "nan", "inf", "1e10", "soon"):  # (inf and 1e10 waited for ever)
        out = tiermem("health", "--target", "127.0.0.1:1", "--timeout", bad)
        assert out.returncode == 2 and "argument --timeout" in out.stderr, bad
    out = tiermem("restore", "--target", "127.0.0.1:1", str(tmp_path / "missing.tmb"))
    assert "missing.tmb: no such file" in one_error_line(out)
    out = tiermem("restore", "--target", "127.0.0.1:1", str(tmp_path))  # a directory is not missing
    assert out.returncode == 1 and f"{tmp_path}: not a regular file" in one_error_line(out)
    os.mkfifo(tmp_path / "pipe.tmb")  # (opening it would wait for a writer)
    with pytest.raises(BackupFileError, match="not a regular file"):
        verify(tmp_path / "pipe.tmb")
    with pytest.raises(FileNotFoundError, match=r"cannot write .*nodir/b\.tmb"):
        backup(MemoryClient("127.0.0.1:1"), tmp_path / "nodir" / "b.tmb")


def test_a_server_with_keys_needs_api_key(server_factory: Factory, tmp_path: Path) -> None:
    keys = tmp_path / "keys.jsonl"
    admin = add_key(keys, [""], "admin")
    reader = add_key(keys, ["user:ana"], "read")
    running = server_factory(api_keys=str(keys))
    with connect(running, api_key=admin) as c:
        c.create("user:ana", "hello", id="h")
        c.create("user:bob", "hi", id="b")

    out = tiermem("stats", "--target", addr(running))
    assert "API_KEY_MISSING" in one_error_line(out)
    assert tiermem("health", "--target", addr(running)).returncode == 0  # health needs no key
    out = tiermem("stats", "--target", addr(running), "--api-key", admin)
    assert out.returncode == 0 and json.loads(out.stdout)["memory_count"] == 2
    out = tiermem("namespaces", "--target", addr(running), env={"TIERMEM_API_KEY": reader})
    assert out.returncode == 0 and [n["name"] for n in json.loads(out.stdout)] == ["user:ana"]

    file = tmp_path / "ana.tmb"
    out = tiermem(
        "backup", "--target", addr(running), str(file), "--namespace", "user:ana", "--api-key", reader
    )
    assert out.returncode == 0, out.stderr  # reading is enough to export
    out = tiermem("restore", "--target", addr(running), str(file), "--target-namespace", "user:ana/copy", "--api-key", reader)  # fmt: skip
    assert "PERMISSION_DENIED" in one_error_line(out)  # importing needs admin
    out = tiermem("restore", "--target", addr(running), str(file), "--target-namespace", "user:cy", env={"TIERMEM_API_KEY": admin})  # fmt: skip
    assert out.returncode == 0, out.stderr
    with connect(running, api_key=admin) as c:
        assert c.get("user:cy", "h").content == "hello"


def _pki(directory: Path) -> dict[str, Path]:
    """A CA and a server certificate for localhost and 127.0.0.1, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def cert(name: str, issuer: Any, key: Any, signer: Any, ca: bool) -> Any:
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            b = b.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = cert(
        "test CA", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")]), ca_key, ca_key, True
    )
    server = cert("localhost", ca.subject, server_key, ca_key, False)
    paths = {"ca": directory / "ca.crt", "crt": directory / "server.crt", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["crt"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return paths


def test_tls_with_a_ca_file(server_factory: Factory, tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    running = server_factory(tls_cert=str(pki["crt"]), tls_key=str(pki["key"]))
    out = tiermem("health", "--target", f"localhost:{running.port}", "--tls-ca", str(pki["ca"]))
    assert (out.returncode, out.stdout) == (0, "SERVING\n"), out.stderr
    out = tiermem("stats", "--target", addr(running), "--tls-ca", str(pki["ca"]))
    assert out.returncode == 0 and json.loads(out.stdout)["memory_count"] == 0
    out = tiermem("health", "--target", addr(running), "--timeout", "1")  # plaintext to a TLS port
    assert out.returncode == 1 and out.stdout == "NOT_SERVING\n"
    assert "it answers with TLS: connect with TLS" in one_error_line(out) and "--tls-ca" in one_error_line(
        out
    )
    out = tiermem("stats", "--target", addr(running), "--tls-ca", str(tmp_path / "nope.crt"))
    assert "nope.crt" in one_error_line(out)


def test_a_target_or_a_pem_file_that_cannot_work_is_refused_at_once(tmp_path: Path) -> None:
    """Not after a 30 s wait for a server, with gRPC's own log lines: one line naming the flag."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    started = time.monotonic()
    assert "target is empty" in one_error_line(tiermem("stats", "--target", ""))
    ca = one_error_line(tiermem("stats", "--target", "127.0.0.1:1", "--tls-ca", str(junk)))
    assert f"--tls-ca {junk}: holds no PEM certificate" in ca
    pair = ("--tls-cert", str(junk), "--tls-key", str(junk))
    key = one_error_line(tiermem("stats", "--target", "127.0.0.1:1", "--tls", *pair))
    assert f"--tls-key {junk}: holds no PEM private key" in key
    assert time.monotonic() - started < 25  # (each waited 30 s for a server before)
    with pytest.raises(ValueError, match="target is empty"):
        MemoryClient(" ")
    with pytest.raises(ValueError, match="holds no PEM certificate"):
        MemoryClient("127.0.0.1:1", tls=b"junk")


def test_mutual_tls_with_a_client_certificate(server_factory: Factory, tmp_path: Path) -> None:
    pki = _pki(tmp_path)
    running = server_factory(tls_cert=str(pki["crt"]), tls_key=str(pki["key"]), tls_client_ca=str(pki["ca"]))
    target = ("--target", f"localhost:{running.port}", "--tls-ca", str(pki["ca"]), "--timeout", "2")
    # (the CA signed the server's certificate: presented by the client, it is one from the CA)
    out = tiermem("health", *target, "--tls-cert", str(pki["crt"]), "--tls-key", str(pki["key"]))
    assert (out.returncode, out.stdout) == (0, "SERVING\n"), out.stderr
    out = tiermem("health", *target)  # no client certificate: no connection
    assert (out.returncode, out.stdout) == (1, "NOT_SERVING\n")
    out = tiermem("stats", *target, "--tls-cert", str(pki["crt"]))
    assert out.returncode == 2 and out.stderr == "tiermem stats: --tls-cert and --tls-key go together\n"


def test_keys_add_still_works_as_python_m_tiermem(tmp_path: Path) -> None:
    keys = tmp_path / "keys.jsonl"
    out = tiermem("keys", "add", "--file", str(keys), "--namespace", "team:x", "--role", "read")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("tm_") and '"role": "read"' in keys.read_text()


# -- packaging ------------------------------------------------------------------------------------


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile: continuation lines joined, comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in dockerfile.splitlines() if not ln.lstrip().startswith("#"))
    )
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), " ".join(rest.split())))
    return out


def _words(command: str) -> str:
    """A command in exec form (a JSON array, one or several lines) or shell form, as one line."""
    return " ".join(re.sub(r'[\[\]",]', " ", command).split())


def test_the_dockerfile_has_the_essentials() -> None:
    steps = _instructions((ROOT / "Dockerfile").read_text())
    # The stages' images by default: the ARGs before the first FROM, each resolved in turn.
    defaults: dict[str, str] = {}

    def resolve(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}", lambda m: defaults.get(m[1], m[0]), text)

    for word, args in steps[: next(i for i, (w, _) in enumerate(steps) if w == "FROM")]:
        if word == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name] = resolve(value)
    froms = [resolve(args) for word, args in steps if word == "FROM"]
    assert len(froms) >= 2 and froms[-1].startswith("python:") and "slim" in froms[-1]  # multi-stage, slim
    runtime = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    words = {w for w, _ in runtime}
    assert {"USER", "VOLUME", "HEALTHCHECK", "EXPOSE", "ENV", "CMD"} <= words
    user = [a for w, a in runtime if w == "USER"][-1]
    assert user.split(":")[0] not in ("root", "0")
    assert any("/data" in a for w, a in runtime if w == "VOLUME")
    assert any("50051" in a for w, a in runtime if w == "EXPOSE")
    health = _words(next(a for w, a in runtime if w == "HEALTHCHECK").partition(" CMD ")[2])
    assert health.startswith("tiermem health --target 127.0.0.1:50051")
    env = " ".join(a for w, a in runtime if w == "ENV")
    assert "TIERMEM_DATA_DIR=/data" in env and "TIERMEM_HOST=0.0.0.0" in env
    assert any("pip install" in a and " ." in a for w, a in steps[: len(steps) - len(runtime)] if w == "RUN")
    assert (ROOT / ".dockerignore").is_file()


def _unit(text: str) -> dict[str, list[str]]:
    """A systemd unit's settings, each with its values (continued lines joined)."""
    fields: dict[str, list[str]] = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")) and "=" in line:
            key, _, value = line.partition("=")
            fields.setdefault(key.strip(), []).append(value.strip())
    return fields


def test_the_systemd_unit_runs_a_hardened_service() -> None:
    unit = _unit((ROOT / "deploy" / "tiermem.service").read_text())
    assert unit["User"] and unit["User"][0] != "root"
    start = " ".join(unit["ExecStart"][0].split())
    assert start.startswith("/opt/tiermem/bin/tiermem-server ") and "--data-dir /var/lib/tiermem" in start
    assert "--api-keys /etc/tiermem/keys.jsonl" in start and "--tls-cert" in start
    assert unit["Restart"] == ["on-failure"]
    assert unit["NoNewPrivileges"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    assert "/var/lib/tiermem" in " ".join(unit["ReadWritePaths"])
    assert float(unit["TimeoutStopSec"][0].rstrip("s")) >= 30


def test_compose_and_license() -> None:
    compose = (ROOT / "deploy" / "compose.yaml").read_text()
    assert "CMD tiermem health --target" in _words(compose)
    assert ":/data" in compose and ":ro" in compose
    assert "TIERMEM_API_KEYS" in compose and "TIERMEM_TLS_CERT" in compose
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


@pytest.mark.slow
def test_warm_up_fills_the_kernel_cache(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    out = subprocess.run(
        [sys.executable, "-m", "tiermem", "warm-up"], capture_output=True, text=True, env=env, timeout=600
    )
    assert out.returncode == 0 and "kernels compiled" in out.stdout
    assert any((tmp_path / "numba").rglob("*.nbi"))  # Numba's cache index files


def test_the_image_copies_every_package_directory() -> None:
    """``pip install .`` in the image's build stage needs every folder pyproject maps packages from:
    copied by the Dockerfile and let through by .dockerignore (an integration once was neither)."""
    import tomllib

    dirs = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    )
    tops = {d.split("/")[0] for d in dirs}
    copied = {
        args.split()[0] for word, args in _instructions((ROOT / "Dockerfile").read_text()) if word == "COPY"
    }
    allowed = {
        ln[1:].rstrip("/") for ln in (ROOT / ".dockerignore").read_text().splitlines() if ln.startswith("!")
    }
    assert tops <= copied, f"the Dockerfile does not copy {sorted(tops - copied)}"
    assert tops <= allowed, f".dockerignore keeps out {sorted(tops - allowed)}"


def test_a_reader_that_goes_away_is_no_error_report(server_factory: Factory) -> None:
    """``tiermem namespaces | head -1``: the pipe closed under the command is not reported as a
    failure on stderr (it said "[Errno 32] Broken pipe")."""
    running = server_factory()
    with connect(running) as c:
        for i in range(3000):  # (a listing longer than a pipe's buffer)
            c.create(f"team:{i:05d}/with/a/long/enough/name", "x")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tiermem", "namespaces", "--target", addr(running)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip()
    proc.stdout.close()  # (as head does once it has its line)
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 1 and err == "", err


def test_tls_files_that_do_not_load_stop_the_server_naming_the_setting(tmp_path: Path) -> None:
    """Exit status 2 and one line naming the setting (it was status 1 and 'the port is in use',
    after gRPC's log lines): not PEM, a key of another certificate, a CA file that is no CA."""
    from tiermem.server.config import ServerConfig

    pki, other = _pki(tmp_path), _pki(tmp_path / "other") if (tmp_path / "other").mkdir() is None else None
    assert other is not None
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for settings, named in (
        ({"tls_cert": str(junk), "tls_key": str(pki["key"])}, "tls_cert"),
        ({"tls_cert": str(pki["crt"]), "tls_key": str(other["key"])}, "tls_cert"),
        (
            {"tls_cert": str(pki["crt"]), "tls_key": str(pki["key"]), "tls_client_ca": str(junk)},
            "tls_client_ca",
        ),
    ):
        with pytest.raises(ValueError, match=f"setting {named}="):
            ServerConfig(data_dir=tmp_path / "d", **settings)
    out = subprocess.run(
        [sys.executable, "-m", "tiermem.server", "--data-dir", str(tmp_path / "d"), "--port", "0",
         "--tls-cert", str(pki["crt"]), "--tls-key", str(other["key"])],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and "tls_cert" in out.stderr and not (tmp_path / "d").exists(), out.stderr


def test_the_systemd_unit_waits_for_the_server_to_say_ready() -> None:
    unit = _unit((ROOT / "deploy" / "tiermem.service").read_text())
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert float(unit["TimeoutStartSec"][0].rstrip("s")) >= 60


def test_the_server_tells_systemd_ready_once_serving_and_stopping_at_sigterm(tmp_path: Path) -> None:
    """sd_notify over a real unix datagram socket, as systemd listens under Type=notify: READY=1
    arrives when health already answers SERVING (the port comes with it), STOPPING=1 at SIGTERM."""
    import signal
    import socket
    import tempfile
    import threading

    import grpc
    from conftest import spawn_server
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    sock_dir = Path(tempfile.mkdtemp(dir="/tmp"))  # (a unix socket's path is at most 107 bytes)
    path = sock_dir / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(120)
    got: list[tuple[str, str]] = []

    def listen() -> None:
        while (msg := listener.recv(4096).decode()).startswith("STATUS="):
            got.append((msg, "before READY"))
        port = re.search(r"STATUS=serving on 127\.0\.0\.1:(\d+)", msg)
        status = "no port"
        if port:
            with grpc.insecure_channel(f"127.0.0.1:{port.group(1)}") as ch:
                answer = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        got.append((msg, status))

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    proc = spawn_server(tmp_path / "data", env={"NOTIFY_SOCKET": str(path)})
    try:
        t.join(60)
        assert got[0] == ("STATUS=loading the data and the kernels", "before READY"), got
        assert got[-1][0].startswith("READY=1\n") and got[-1][1] == "SERVING", got
        assert f":{proc.port}" in got[-1][0] and len(got) == 2
        proc.proc.send_signal(signal.SIGTERM)
        assert listener.recv(4096) == b"STOPPING=1"
        assert proc.proc.wait(60) == 0
    finally:
        proc.close()
        listener.close()
        path.unlink()
        sock_dir.rmdir()


def test_notify_reaches_an_abstract_socket_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from tiermem.server.transport.sdnotify import notify

    name = f"tiermem-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind("\0" + name)
        listener.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1") and listener.recv(64) == b"READY=1"
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify")  # (systemd gone: logged, not raised)
    assert not notify("STOPPING=1")
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not notify("READY=1")


def test_a_stop_asked_for_during_the_start_up_is_never_told_ready(tmp_path: Path) -> None:
    """SIGTERM while the server loads (slowed here by 3 s before its engine opens): it finishes
    the start-up, then stops; systemd hears STOPPING=1, never READY=1 (it heard READY=1, then at
    once STOPPING=1), and the exit status is 0."""
    import signal
    import socket
    import tempfile

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import time\n"
        "import tiermem.server.core.engine as engine\n"
        "_init = engine.Engine.__init__\n"
        "def _slow(self, *a, **k):\n"
        "    time.sleep(3)\n"
        "    _init(self, *a, **k)\n"
        "engine.Engine.__init__ = _slow\n"
    )
    sock_dir = Path(tempfile.mkdtemp(dir="/tmp"))
    path = sock_dir / "notify"
    env = {
        **os.environ,
        "NOTIFY_SOCKET": str(path),
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(str(path))
        listener.settimeout(60)
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiermem.server", "--port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        try:
            assert listener.recv(4096).startswith(b"STATUS=")  # (loading: its handlers are in place)
            proc.send_signal(signal.SIGTERM)
            told = [listener.recv(4096)]
            assert proc.wait(60) == 0
            listener.settimeout(0.5)
            with contextlib.suppress(TimeoutError):
                told.append(listener.recv(4096))
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            path.unlink()
            sock_dir.rmdir()
    assert told == [b"STOPPING=1"], told


def test_tls_options_that_do_not_go_together_are_usage_errors_and_grpc_stays_quiet(
    server_factory: Factory, tmp_path: Path
) -> None:
    """``--tls-cert`` without ``--tls-key`` (or without TLS) is a usage error, exit status 2 (it was
    1); health with a CA file it cannot read prints NOT_SERVING, as for any failure; and a TLS
    handshake a plaintext server fails leaves one line on stderr (gRPC's own INFO lines, one a
    retry, came before it)."""
    running = server_factory()
    cert = tmp_path / "c.pem"
    cert.write_text("not read")
    for args in (["--tls-cert", str(cert)], ["--tls-cert", str(cert), "--tls-key", str(cert)]):
        out = tiermem("health", "--target", addr(running), *args)
        assert out.returncode == 2 and out.stdout == "", (args, out)
        assert len(out.stderr.splitlines()) == 1 and "--tls" in out.stderr, out.stderr
    out = tiermem("health", "--target", addr(running), "--tls-ca", str(tmp_path / "missing.crt"))
    assert (out.returncode, out.stdout) == (1, "NOT_SERVING\n") and "missing.crt" in one_error_line(out)
    out = tiermem("health", "--target", addr(running), "--tls", "--timeout", "2")
    assert (out.returncode, out.stdout) == (1, "NOT_SERVING\n")
    assert one_error_line(out).startswith("tiermem health: "), out.stderr


def test_a_stop_while_the_server_imports_exits_0_quietly(tmp_path: Path) -> None:
    """SIGTERM or SIGINT in the half second of imports before the server's own handlers are in
    place: exit status 0 and nothing printed (it was killed by the signal, status -15, or a
    KeyboardInterrupt traceback from inside an import). Sent as soon as the process catches
    SIGTERM, read from /proc."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiermem.server", "--port", "0", "--data-dir", str(tmp_path / "data")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # (SigCgt: the signals it catches, bit n-1 for n)
                caught = next(
                    int(line.split()[1], 16)
                    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                    if line.startswith("SigCgt:")
                )
                if caught >> (signal.SIGTERM - 1) & 1:
                    break
                time.sleep(0.001)
            proc.send_signal(signum)
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert (proc.returncode, out) == (0, ""), (signum, proc.returncode, out)
    assert not (tmp_path / "data").exists()  # (stopped before it opened anything)
