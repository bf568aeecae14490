"""HAProxy in front of tenant shards (docs/scaling.md): its configuration, and the switch of one
scope's route during a move.

Calls are routed by their ``tiermem-route`` metadata (routing.py): a map file pins the scopes that
were moved (scope -> the backend of their shard), every other scope is placed by consistent
hashing over all shards (``balance hdr(tiermem-route)``, ``hash-type consistent``), and calls
without a key (ListNamespaces, server-wide stats) go to any shard. Shards have no health checks
on purpose: while one is down its tenants get UNAVAILABLE and retry, rather than being served by
another shard that does not hold their memories.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .routing import ROUTE_HEADER


def backend_of(shard: str) -> str:
    """The HAProxy backend that reaches one shard alone."""
    return f"shard-{shard}"


def config(shards: Mapping[str, str], listen: str, map_file: str | Path, admin_socket: str | Path) -> str:
    """An haproxy.cfg routing gRPC on ``listen`` ("127.0.0.1:50051") to ``shards`` (name ->
    "host:port", plain HTTP/2), with the moved scopes of ``map_file`` and the runtime API on
    ``admin_socket`` (what ``set_route`` talks to). HAProxy starts only once ``map_file`` exists
    (empty at first)."""
    hashed = "\n".join(f"    server {name} {address} proto h2" for name, address in shards.items())
    pinned = "\n".join(
        f"backend {backend_of(name)}\n    server {name} {address} proto h2\n"
        for name, address in shards.items()
    )
    return f"""global
    stats socket {admin_socket} mode 600 level admin
    log stderr format short local0 notice

defaults
    mode http
    log global
    timeout connect 5s
    # Long enough for a large export or import stream.
    timeout client 10m
    timeout server 10m

frontend tiermem
    bind {listen} proto h2
    use_backend %[req.hdr({ROUTE_HEADER}),map({map_file},shards)]
    default_backend shards

backend shards
    balance hdr({ROUTE_HEADER})
    hash-type consistent
{hashed}

{pinned}"""


def _runtime(admin_socket: str | Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5.0)
        s.connect(str(admin_socket))
        s.sendall(command.encode() + b"\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out.decode()


def set_route(admin_socket: str | Path, map_file: str | Path, scope: str, shard: str) -> None:
    """Route ``scope`` to ``shard`` from now on: in the map file, for HAProxy's next start, then in
    the running HAProxy (its runtime API, one command: there is no moment without a route). The
    file first: a running HAProxy never routes a scope where a restart would not."""
    backend = backend_of(shard)
    shown = _shown_map(admin_socket, map_file)
    path = Path(map_file)
    lines = [ln for ln in path.read_text().splitlines() if ln.split()[:1] != [scope]] if path.exists() else []
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{ln}\n" for ln in [*lines, f"{scope} {backend}"]))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    verb = "set" if scope in shown else "add"
    answer = _runtime(admin_socket, f"{verb} map {map_file} {scope} {backend}").strip()
    if answer:
        raise RuntimeError(f"HAProxy refused '{verb} map {map_file} {scope} {backend}': {answer}")


def filed_shard(map_file: str | Path, scope: str) -> str | None:
    """The shard the map file pins ``scope`` to, for HAProxy's next start (None: not pinned)."""
    path = Path(map_file)
    for line in path.read_text().splitlines() if path.exists() else []:
        fields = line.split()
        if fields[:1] == [scope] and len(fields) > 1:
            return fields[1].removeprefix(backend_of(""))
    return None


def pinned_shard(admin_socket: str | Path, map_file: str | Path, scope: str) -> str | None:
    """The shard the running HAProxy's map pins ``scope`` to (None: not pinned, so placed by
    consistent hashing)."""
    backend = _shown_map(admin_socket, map_file).get(scope)
    return None if backend is None else backend.removeprefix(backend_of(""))


def check_map(admin_socket: str | Path, map_file: str | Path) -> None:
    """RuntimeError unless the running HAProxy has the map ``map_file`` (by the path its
    configuration names) and the file's directory can take the new version written beside it."""
    _shown_map(admin_socket, map_file)
    if not os.access(Path(map_file).parent, os.W_OK):
        raise RuntimeError(f"cannot write beside the map {map_file}: its directory is not writable")


def _shown_map(admin_socket: str | Path, map_file: str | Path) -> dict[str, str]:
    """The running HAProxy's map: key -> value (``show map`` lines are "<entry> <key> <value>")."""
    shown = _runtime(admin_socket, f"show map {map_file}")
    if shown.startswith("Unknown map"):
        raise RuntimeError(f"HAProxy has no map {map_file}: {shown.strip()}")
    return {f[1]: f[2] for f in (line.split() for line in shown.splitlines()) if len(f) > 2}


def shard_address(admin_socket: str | Path, shard: str) -> tuple[str, int]:
    """(host, port) the running HAProxy sends ``shard``'s pinned calls to."""
    shown = _runtime(admin_socket, f"show servers state {backend_of(shard)}")
    lines = [ln for ln in shown.splitlines() if ln.strip()]
    header = next((ln[2:].split() for ln in lines if ln.startswith("# ")), None)
    rows = [ln.split() for ln in lines if not ln.startswith("#") and len(ln.split()) > 2]
    if header is None or not rows or "srv_addr" not in header or "srv_port" not in header:
        raise RuntimeError(f"HAProxy has no shard {shard!r} (backend {backend_of(shard)}): {shown.strip()}")
    row = dict(zip(header, rows[0], strict=False))
    return row["srv_addr"], int(row["srv_port"])


def check_shard_address(admin_socket: str | Path, shard: str, address: str) -> None:
    """ValueError unless ``address`` ("host:port") is where HAProxy sends ``shard``'s calls."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address: {address!r} is not host:port")
    known_host, known_port = shard_address(admin_socket, shard)
    if int(port) != known_port or not _resolved(host) & _resolved(known_host):
        raise ValueError(
            f"HAProxy sends shard {shard!r} to {known_host}:{known_port}, not to {address}: "
            "give that shard's address"
        )


def _resolved(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host.strip("[]"), None)}
    except OSError:
        return {host}


def set_shard_address(admin_socket: str | Path, shard: str, address: str) -> None:
    """Send ``shard``'s calls to ``address`` ("host:port") from now on, e.g. to its promoted
    replica: in the hashed backend and in the shard's own one (the running HAProxy only: change
    the configuration file too, for its next start)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address: {address!r} is not host:port")
    for backend in ("shards", backend_of(shard)):
        answer = _runtime(admin_socket, f"set server {backend}/{shard} addr {host} port {port}").strip()
        if answer and "changed from" not in answer and "no need to change" not in answer:
            raise RuntimeError(f"HAProxy refused to move {backend}/{shard} to {address}: {answer}")
