"""The import rules of docs/architecture.md, read from the source with ``ast``: every import counts,
function-level and ``if TYPE_CHECKING:`` ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"server": "tiermem.server", "client": "tiermem.client", "kernels": "tiermem.kernels"}

# Which layers of tiermem.server each layer may import (itself included). config and model are the
# floor; cores (the cores the process may use) stands beside config, importing nothing of ours.
LAYERS: dict[str, set[str]] = {
    "config_rules": set(),
    "cores": set(),
    "config": {"config_rules"},
    "model": {"config"},
    "storage": {"model", "config"},
    "index": {"model", "config", "cores"},
    "embedding": {"model", "config"},
    "search": {"index", "storage", "embedding", "model", "config", "cores"},
    "core": {"search", "index", "storage", "embedding", "model", "config", "cores"},
    "agent": {"core", "search", "index", "storage", "embedding", "model", "config"},
    "security": {"model", "config"},
    "transport": {
        "agent",
        "core",
        "security",
        "search",
        "index",
        "storage",
        "embedding",
        "model",
        "config",
        "cores",
    },
    "__main__": {"transport", "config"},
    "cli": {"security", "config"},
    "__init__": set(),
}
# Modules only one server layer may import (the client speaks gRPC itself).
OWNED = {
    "lmdb": "storage",
    "faiss": "index",
    "grpc": "transport",
    "grpc_status": "transport",
    "grpc_health": "transport",
    "grpc_reflection": "transport",
    "google.rpc": "transport",
    "tiermem.v1": "transport",
    "tiermem._values": "transport",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for folder, pkg in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            mods[".".join([pkg, *parts])] = path
    return mods


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every module name ``name`` imports, resolved to absolute names."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _project_module(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _layer(module: str) -> str:
    rest = module.removeprefix("tiermem.server").lstrip(".")
    return rest.split(".", 1)[0] if rest else "__init__"


GRAPH = {
    name: {t for t in map(_project_module, _imports(name, path)) if t and t != name}
    for name, path in MODULES.items()
}


def test_every_module_is_found() -> None:
    assert "tiermem.server.core.engine" in MODULES
    assert "tiermem.server.transport.servicer" in MODULES
    assert GRAPH["tiermem.server.transport.servicer"]  # imports are read


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("tiermem.server")))
def test_server_layers_import_only_downward(name: str) -> None:
    layer = _layer(name)
    assert layer in LAYERS, f"{name}: a new layer must be added to docs/architecture.md and LAYERS"
    allowed = LAYERS[layer] | {layer}
    wrong = sorted(t for t in GRAPH[name] if t.startswith("tiermem.server") and _layer(t) not in allowed)
    assert not wrong, f"{name} (layer {layer}) imports {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("tiermem.server")))
def test_third_party_owners(name: str) -> None:
    imported = _imports(name, MODULES[name])
    for module, owner in OWNED.items():
        uses = any(i == module or i.startswith(module + ".") for i in imported)
        if uses:
            assert name.startswith(f"tiermem.server.{owner}"), f"{name} imports {module}: only {owner}/ may"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.startswith("tiermem.server")))
def test_client_and_kernels_know_nothing_of_the_server(name: str) -> None:
    assert not [t for t in GRAPH[name] if t.startswith("tiermem.server")]


def test_no_import_cycle() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_rules_catch_a_violation(tmp_path: Path) -> None:
    """The reader resolves relative, function-level and TYPE_CHECKING imports (else every rule passes)."""
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from ..core.engine import Engine\n"
        "def f():\n    import lmdb\n"
    )
    found = _imports("tiermem.server.search.m", src)
    assert "tiermem.server.core.engine" in found and "lmdb" in found
    assert _layer("tiermem.server.core.engine") not in LAYERS["search"]
