"""Interop: a Node.js client, with stubs loaded from proto/ alone, talks to a real server."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tiermem.server.transport.app import RunningServer

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "tests" / "node"
SCRIPT = NODE_DIR / "client_test.js"


def _node_or_skip() -> str:
    node = shutil.which("node")
    missing = None
    if node is None:
        missing = "`node` is not on PATH"
    elif not all((NODE_DIR / "node_modules" / "@grpc" / pkg).is_dir() for pkg in ("grpc-js", "proto-loader")):
        missing = f"{NODE_DIR / 'node_modules'} is missing (run `cd tests/node && npm ci`)"
    if missing is not None:
        if os.environ.get("TIERMEM_REQUIRE_NODE") == "1":
            pytest.fail(f"TIERMEM_REQUIRE_NODE=1 but the Node.js client cannot run: {missing}")
        pytest.skip(f"Node.js interop test needs node and tests/node/node_modules: {missing}")
    assert node is not None
    return node


@pytest.mark.slow
def test_node_client(server: RunningServer) -> None:
    node = _node_or_skip()
    proc = subprocess.run(
        [node, str(SCRIPT), f"127.0.0.1:{server.port}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    print(output, end="")
    assert proc.returncode == 0, f"node client failed (exit {proc.returncode}):\n{output}"
    assert "node client: OK" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "loopback"])
def test_node_client_with_an_api_key(
    server_factory: Callable[..., RunningServer], tmp_path: Path, tls: bool
) -> None:
    """The same checks with a token, through TLS or over plain loopback: one argument each."""
    from test_security import _cert, _pem

    from tiermem.server.security.keys import add_key

    node = _node_or_skip()
    ca = _cert("tiermem test CA", None, ca=True)
    ca_crt, _ = _pem(*ca, tmp_path, "ca")
    crt, key = _pem(*_cert("localhost", ca, ca=False), tmp_path, "server")
    keys = tmp_path / "keys.jsonl"
    token = add_key(keys, [""], "write")
    tls_files = {"tls_cert": str(crt), "tls_key": str(key)} if tls else {}
    running = server_factory(api_keys=str(keys), **tls_files)
    proc = subprocess.run(
        [
            node,
            str(SCRIPT),
            f"127.0.0.1:{running.port}",
            *(["--ca", str(ca_crt)] if tls else []),
            "--token",
            token,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"node client failed (exit {proc.returncode}):\n{output}"
    assert "node client: OK" in proc.stdout and token not in output
