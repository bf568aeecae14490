"""Interop: the Go example (examples/go), built on the checked-in stubs in gen/go, talks to a real server.

Built offline in GOPATH mode against Debian's Go packages (`make go-toolchain`); skipped without Go
unless TIERMEM_REQUIRE_GO=1 (CI), which makes a missing toolchain a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tiermem.server.transport.app import RunningServer

ROOT = Path(__file__).resolve().parent.parent
DEBIAN_GOPATH = Path("/usr/share/gocode")
IMPORT_PATH = "github.com/tiermem/tiermem"


def _go_or_skip() -> str:
    go = shutil.which("go")
    missing = None
    if go is None:
        missing = "`go` is not on PATH"
    elif not (DEBIAN_GOPATH / "src" / "google.golang.org" / "grpc").is_dir():
        missing = f"{DEBIAN_GOPATH} has no google.golang.org/grpc"
    if missing is not None:
        if os.environ.get("TIERMEM_REQUIRE_GO") == "1":
            pytest.fail(
                f"TIERMEM_REQUIRE_GO=1 but the Go example cannot be built: {missing} (make go-toolchain)"
            )
        pytest.skip(f"the Go example needs Debian's Go packages (make go-toolchain): {missing}")
    assert go is not None
    return go


@pytest.fixture(scope="module")
def go_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's binary: the checkout linked into a GOPATH beside Debian's, then `go build`."""
    go = _go_or_skip()
    gopath = tmp_path_factory.mktemp("gopath")
    link = gopath / "src" / IMPORT_PATH
    link.parent.mkdir(parents=True)
    link.symlink_to(ROOT, target_is_directory=True)
    binary = gopath / "tiermem-example"
    env = {
        **os.environ,
        "GO111MODULE": "off",
        "GOPATH": f"{gopath}{os.pathsep}{DEBIAN_GOPATH}",
        "GOFLAGS": "",
        "GOCACHE": os.environ.get("GOCACHE", str(gopath / "cache")),
    }
    proc = subprocess.run(
        [go, "build", "-o", str(binary), f"{IMPORT_PATH}/examples/go"],
        cwd=link,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"go build failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    return binary


def _run(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"go example failed (exit {proc.returncode}):\n{output}"
    assert "go client: OK" in proc.stdout
    return output


@pytest.mark.slow
def test_go_example(server: RunningServer, go_example: Path) -> None:
    output = _run(go_example, "-target", f"127.0.0.1:{server.port}")
    assert "refused: InvalidArgument INVALID_FIELD (memory.importance)" in output
    assert "get after delete: NOT_FOUND MEMORY_NOT_FOUND" in output


@pytest.mark.slow
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "loopback"])
def test_go_example_with_an_api_key(
    server_factory: Callable[..., RunningServer], go_example: Path, tmp_path: Path, tls: bool
) -> None:
    """The same checks with a token, over TLS or plain loopback; a call without it is refused."""
    from test_security import _cert, _pem

    from tiermem.server.security.keys import add_key

    ca = _cert("tiermem test CA", None, ca=True)
    ca_crt, _ = _pem(*ca, tmp_path, "ca")
    crt, key = _pem(*_cert("localhost", ca, ca=False), tmp_path, "server")
    keys = tmp_path / "keys.jsonl"
    token = add_key(keys, [""], "write")
    tls_files = {"tls_cert": str(crt), "tls_key": str(key)} if tls else {}
    running = server_factory(api_keys=str(keys), **tls_files)
    output = _run(
        go_example,
        "-target",
        f"127.0.0.1:{running.port}",
        *(["-ca", str(ca_crt)] if tls else []),
        "-token",
        token,
    )
    assert "without the key: UNAUTHENTICATED API_KEY_MISSING" in output and token not in output


def test_the_stubs_declare_the_package_the_proto_names() -> None:
    """gen/go holds the package at the path the proto's go_package names, in a module of that prefix."""
    proto = (ROOT / "proto" / "tiermem" / "v1" / "memory.proto").read_text()
    go_package = f"{IMPORT_PATH}/gen/go/tiermem/v1;tiermemv1"
    assert f'option go_package = "{go_package}";' in proto
    stubs = ROOT / "gen" / "go" / "tiermem" / "v1"
    for name in ("memory.pb.go", "memory_grpc.pb.go"):
        assert (stubs / name).read_text().count("\npackage tiermemv1\n") == 1
    assert (ROOT / "gen" / "go" / "go.mod").read_text().count(f"module {IMPORT_PATH}/gen/go\n") == 1
