"""Namespace settings (protection, lifecycle policy overrides) travel with an export: a backup
restores them, set after the import's memories, never removing a protection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tiermem.client import (
    FailedPreconditionError,
    InvalidArgumentError,
    MemoryClient,
    PermissionDeniedError,
)
from tiermem.client.backup import backup, restore, verify
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer
from tiermem.v1 import memory_pb2 as pb


def _client(running: RunningServer, token: str | None = None) -> MemoryClient:
    c = MemoryClient(f"127.0.0.1:{running.port}", timeout=60, api_key=token)
    c.wait_ready()
    return c


def _config(c: MemoryClient, ns: str) -> tuple[bool, bytes]:
    """A namespace's stored settings: protection, and its policy overrides (serialized)."""
    cfg = c.get_namespace_config(ns).config
    return cfg.protected, cfg.policy.SerializeToString(deterministic=True)


def _kinds(chunks: list[pb.ExportMemoriesResponse]) -> list[str]:
    return [str(ch.WhichOneof("chunk")) for ch in chunks]


def _set_up_source(c: MemoryClient) -> None:
    c.create("p", "a note about the deploy", kind="observation")
    c.create("p", "prefers short answers", kind="preference")
    c.create("p/c", "a child's note")
    c.create("pa", "a sibling whose name starts alike")
    c.update_namespace_config(
        "p", protected=True, max_items=50, retention="fifo", tiers={"fast": {"ttl_seconds": 90}}
    )
    c.update_namespace_config("p/c", promote_access_count=7)
    c.update_namespace_config("p/empty", protected=True)  # settings, no memories
    c.update_namespace_config("pa", protected=True)


def test_an_export_carries_each_namespace_settings_and_an_import_sets_them_last(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "a")
    with _client(source) as c:
        _set_up_source(c)
        want = {ns: _config(c, ns) for ns in ("p", "p/c", "p/empty")}
        chunks = list(c.export_memories("p", include_children=True))
        alone = list(c.export_memories("p"))
    kinds = _kinds(chunks)
    # After the header, before the memories: an import checks them before storing anything.
    assert kinds[:4] == ["header", "settings", "settings", "settings"]
    assert "settings" not in kinds[4:]
    assert [ch.settings.namespace for ch in chunks[1:4]] == ["p", "p/c", "p/empty"]  # not "pa"
    assert [ch.settings.namespace for ch in alone if ch.WhichOneof("chunk") == "settings"] == ["p"]

    target = server_factory(data_dir=tmp_path / "b")
    with _client(target) as c:
        # The preference lands in a namespace the import protects, without confirm: the settings
        # are set once the memories are stored.
        done = c.import_memories(chunks, target_namespace="q")
        assert (done.imported, done.settings) == (3, 3)
        for ns in ("p", "p/c", "p/empty"):
            assert _config(c, "q" + ns[1:]) == want[ns]
        assert c.get_namespace_config("q").effective.max_items == 50
        assert _config(c, "pa") == (False, b"")
        with pytest.raises(FailedPreconditionError) as err:
            c.delete_namespace("q")
        assert err.value.reason == "NAMESPACE_PROTECTED"
        assert sorted(m.kind for m in c.list_memories("q")) == ["observation", "preference"]


def test_an_import_never_unprotects_and_changes_a_protected_policy_only_with_confirm(
    server_factory: Callable[..., RunningServer],
) -> None:
    running = server_factory()
    with _client(running) as c:
        c.create("src", "a memory")
        c.update_namespace_config("src", max_items=10)  # exported: unprotected, a policy
        chunks = list(c.export_memories("src"))
        c.update_namespace_config("dst", protected=True, max_items=99)
        before = _config(c, "dst")
        with pytest.raises(FailedPreconditionError) as err:
            c.import_memories(chunks, target_namespace="dst")
        assert err.value.reason == "NAMESPACE_PROTECTED"
        assert "dst" in str(err.value) and "policy" in str(err.value)
        # Refused on arrival of the settings, before the memories after them: nothing stored.
        assert _config(c, "dst") == before and c.stats("dst").memory_count == 0
        done = c.import_memories(chunks, target_namespace="dst", confirm=True)
        assert (done.imported, done.settings) == (1, 1)
        protected, _ = _config(c, "dst")
        assert protected and c.get_namespace_config("dst").effective.max_items == 10

        # Protection only: an unprotected target becomes protected, its own policy stays.
        c.update_namespace_config("guarded", protected=True)
        only = list(c.export_memories("guarded"))
        c.update_namespace_config("mine", promote_access_count=4)
        c.import_memories(only, target_namespace="mine")
        cfg = c.get_namespace_config("mine").config
        assert cfg.protected and cfg.policy.promote_access_count == 4


def test_an_import_refuses_a_bad_settings_chunk_naming_its_field(client: MemoryClient) -> None:
    header = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1, namespace="x"))
    bad_policy = pb.ExportMemoriesResponse(
        settings=pb.NamespaceConfig(
            namespace="x",
            policy=pb.LifecyclePolicy(tiers=[pb.TierPolicy(tier=pb.TIER_FAST, importance_threshold=2.0)]),
        )
    )
    memory = pb.ExportMemoriesResponse(memory=pb.Memory(namespace="x", id="m1", content="kept?"))
    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([header, bad_policy, memory])
    assert err.value.fields == ["chunks[1].settings.policy.tiers[0].importance_threshold"]
    no_tier = pb.ExportMemoriesResponse(
        settings=pb.NamespaceConfig(namespace="x", policy=pb.LifecyclePolicy(tiers=[pb.TierPolicy()]))
    )
    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([header, no_tier])
    assert err.value.fields == ["chunks[1].settings.policy.tiers[0].tier"]
    protect = pb.ExportMemoriesResponse(settings=pb.NamespaceConfig(namespace="x", protected=True))
    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([header, protect, memory, protect])
    assert err.value.fields == ["chunks[3].settings.namespace"]
    bad_name = pb.ExportMemoriesResponse(settings=pb.NamespaceConfig(namespace="", protected=True))
    with pytest.raises(InvalidArgumentError) as err:
        client.import_memories([header, bad_name])
    assert err.value.fields == ["chunks[1].settings.namespace"]
    # Nothing of the refused imports was set; the memory after the refused chunk was not stored.
    assert _config(client, "x") == (False, b"") and client.stats("x").memory_count == 0


def test_a_backup_file_restores_the_settings(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    source = server_factory(data_dir=tmp_path / "a")
    with _client(source) as c:
        _set_up_source(c)
        want = {ns: _config(c, ns) for ns in ("p", "p/c", "p/empty", "pa")}
        summary = backup(c, tmp_path / "all.tmb")
    assert summary.settings == 4 and verify(tmp_path / "all.tmb").settings == 4
    target = server_factory(data_dir=tmp_path / "b")
    with _client(target) as c:
        assert restore(c, tmp_path / "all.tmb").settings == 4
        assert {ns: _config(c, ns) for ns in want} == want


def test_settings_in_an_import_need_admin_on_their_namespace(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    keys_file = tmp_path / "keys.json"
    root = add_key(keys_file, [""], "admin")
    ana_admin = add_key(keys_file, ["user:ana"], "admin")
    running = server_factory(api_keys=str(keys_file))
    with _client(running, root) as g:
        g.update_namespace_config("user:bob", max_items=3)
        dump = list(g.export_memories("user:bob"))
    assert _kinds(dump) == ["header", "settings"]
    with _client(running, ana_admin) as c:
        with pytest.raises(PermissionDeniedError):
            c.import_memories(iter(dump))  # into user:bob
        # A settings chunk is checked for its own namespace, not the header's.
        header = pb.ExportMemoriesResponse(header=pb.ExportHeader(format_version=1, namespace="user:ana"))
        planted = pb.ExportMemoriesResponse(settings=pb.NamespaceConfig(namespace="user:bob", protected=True))
        with pytest.raises(PermissionDeniedError):
            c.import_memories([header, planted])
        assert c.import_memories(iter(dump), target_namespace="user:ana/copy").settings == 1
        assert c.get_namespace_config("user:ana/copy").config.policy.max_items == 3
    with _client(running, root) as g:
        assert g.get_namespace_config("user:bob").config.policy.max_items == 3
        assert not g.get_namespace_config("user:bob").config.protected
