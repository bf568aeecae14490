"""``tiermem`` (also ``python -m tiermem``): administration commands.

- ``tiermem keys add --file F --namespace PREFIX --role ROLE`` appends an API key to a keys file
  (hashes only) and prints the new token on its last line.
- ``tiermem backup --target ADDR FILE [--namespace NS] [--include-children]`` saves an export to a
  backup file (docs/backup.md); ``tiermem restore --target ADDR FILE [--target-namespace NS]``
  checks the file whole, then imports it. Both print a JSON summary.
- ``tiermem stats --target ADDR [--namespace NS]`` and ``tiermem namespaces --target ADDR
  [--prefix P]`` print the server's figures and its namespaces as JSON.
- ``tiermem health --target ADDR`` prints SERVING and exits 0, or prints NOT_SERVING and exits 1.
- ``tiermem shard move --scope S --from ADDR --to ADDR --to-shard NAME --haproxy-socket F
  --haproxy-map F`` moves a tenant between shards behind HAProxy (docs/scaling.md);
  ``tiermem shard end-move`` (the move's arguments) finishes or undoes a move that stopped midway;
  ``tiermem shard promote --replica ADDR --shard NAME --haproxy-socket F`` promotes a shard's
  replica and points HAProxy at it; ``tiermem shard namespaces|stats --shard NAME=ADDR ...`` ask
  every shard.

The commands that talk to a server take ``--api-key`` (or the TIERMEM_API_KEY environment
variable), ``--tls`` / ``--tls-ca FILE`` (with ``--tls-cert`` / ``--tls-key`` for mutual TLS) and
``--timeout``, and go through ``tiermem.client``.
A failure prints one line on stderr and exits 1; a usage error exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

# gRPC's own log lines (a failed TLS handshake at INFO, one a retry) would follow the command's one
# line of error on stderr: only its errors, unless the environment asks for more.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from tiermem.client import MemoryClient, TiermemError, haproxy, to_python
from tiermem.client.backup import backup, check_path, restore
from tiermem.client.connection import check_pem, check_timeout, client_certificate
from tiermem.client.shards import Shards, end_move, move_scope
from tiermem.server.security.keys import ROLES, KeysFileError, add_key

DEFAULT_TIMEOUT = 30.0


class ServerRefused(Exception):
    """A server's refusal, reported with what the command was working on."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except BrokenPipeError:  # (the reader went away, `| head`: nothing to report; as Python's docs do)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no second error at exit)
        return 1
    except (TiermemError, KeysFileError, ValueError, OSError, RuntimeError, ServerRefused) as e:
        print(f"tiermem {args.command}: {_one_line(e)}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


class UsageError(ValueError):
    """Options that do not go together: a usage error (exit status 2), as argparse's own."""


def _one_line(e: BaseException) -> str:
    text = " ".join([str(e), *getattr(e, "__notes__", [])])  # (notes: what a failed step left behind)
    return " ".join(text.split()) or type(e).__name__


# -- arguments ------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiermem", description="tiermem administration.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_keys(sub)
    conn = _connection_options()

    b = sub.add_parser(
        "backup",
        parents=[conn],
        help="save an export of the server to a backup file",
        description="Export memories (with their vectors), scope progress and the graph into FILE, "
        "written to a temporary file and renamed over FILE once complete (docs/backup.md). Prints a "
        "JSON summary.",
    )
    b.add_argument("file", type=Path, metavar="FILE", help="the backup file (replaced if it exists)")
    b.add_argument(
        "--namespace", default="", metavar="NS", help="the namespace to back up (default: every namespace)"
    )
    b.add_argument("--include-children", action="store_true", help="also the namespaces below it (NS/...)")
    b.set_defaults(run=_backup)

    r = sub.add_parser(
        "restore",
        parents=[conn],
        help="import a backup file into the server",
        description="Check FILE whole (format, version, checksum) and import it; a file that fails "
        "the check is refused before anything is sent. Prints the import's counts as JSON.",
    )
    r.add_argument("file", type=Path, metavar="FILE", help="a file written by `tiermem backup`")
    r.add_argument(
        "--target-namespace",
        default="",
        metavar="NS",
        help="restore under this namespace instead of the exported one (children follow)",
    )
    r.add_argument(
        "--confirm",
        action="store_true",
        help="restore preferences and summaries into protected namespaces, and policies over a "
        "protected namespace's own (refused without it)",
    )
    r.set_defaults(run=_restore)

    s = sub.add_parser("stats", parents=[conn], help="print the server's figures as JSON")
    s.add_argument(
        "--namespace", default="", metavar="NS", help="one namespace's figures (default: the server's)"
    )
    s.set_defaults(run=_stats)

    n = sub.add_parser("namespaces", parents=[conn], help="list the namespaces as JSON")
    n.add_argument("--prefix", default="", metavar="P", help="only namespaces starting with this")
    n.set_defaults(run=_namespaces)

    h = sub.add_parser(
        "health",
        parents=[conn],
        help="exit 0 if the server is SERVING, 1 otherwise",
        description="Print SERVING and exit 0 once the server reports SERVING within --timeout; "
        "otherwise print NOT_SERVING (and why on stderr) and exit 1. Needs no API key.",
    )
    h.set_defaults(run=_health)
    w = sub.add_parser(
        "warm-up",
        help="compile the Numba kernels into their cache now",
        description="Compile the kernels into Numba's cache (NUMBA_CACHE_DIR, else beside the package or "
        "in the user's cache), so the server's first start takes seconds, not the compilation's minute.",
    )
    w.set_defaults(run=_warm_up, command="warm-up")
    _add_shard(sub, _connection_options(target=False))
    return p


def _move_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scope", required=True, help="the top-level scope, e.g. user:ana")
    p.add_argument("--from", dest="source", required=True, metavar="ADDR", help="the shard holding it")
    p.add_argument("--to", dest="dest", required=True, metavar="ADDR", help="the shard to move it to")
    p.add_argument("--to-shard", required=True, metavar="NAME", help="--to's name in the HAProxy config")
    p.add_argument("--haproxy-socket", required=True, type=Path, help="HAProxy's admin stats socket")
    p.add_argument("--haproxy-map", required=True, type=Path, help="the map file of moved scopes")


def _add_shard(sub: Any, conn: argparse.ArgumentParser) -> None:
    shard = sub.add_parser("shard", help="tenant shards behind a proxy (docs/scaling.md)")
    actions = shard.add_subparsers(dest="action", required=True)
    move = actions.add_parser(
        "move",
        parents=[conn],
        help="move a tenant (a top-level scope) to another shard without losing a write",
        description="Copy the scope from --from to --to while it keeps writing, fence its writes at the "
        "source (clients retry them), catch up, compare, route it to --to-shard in HAProxy (runtime API "
        "and map file), then retire it at the source. Prints a JSON report. The clients need admin keys.",
    )
    _move_arguments(move)
    move.set_defaults(run=_shard_move, command="shard move")
    end = actions.add_parser(
        "end-move",
        parents=[conn],
        help="end a move that stopped midway: finish it if HAProxy routes the scope to --to, else undo it",
        description="For a move that was killed, or could not undo itself (docs/scaling.md: after a failed "
        "move), run with the move's arguments. If HAProxy routes the scope to --to-shard, the move is "
        "finished (the source retires and purges the scope); if not, it is undone (the source's fence is "
        "lifted, the target's copy deleted). Refuses, changing nothing, when the shards' states are not "
        "those of a move from --from to --to. Prints a JSON report.",
    )
    _move_arguments(end)
    end.set_defaults(run=_shard_end_move, command="shard end-move")
    promote = actions.add_parser(
        "promote",
        parents=[conn],
        help="promote a shard's replica and point HAProxy at it",
        description="Make the replica at --replica stop following its leader and take writes, then send "
        "the shard's calls to it through HAProxy's runtime API (change haproxy.cfg too, for its next start). "
        "Prints a JSON report.",
    )
    promote.add_argument("--replica", required=True, metavar="ADDR", help="the replica, host:port")
    promote.add_argument(
        "--shard", required=True, metavar="NAME", help="the shard's name in the HAProxy config"
    )
    promote.add_argument("--haproxy-socket", type=Path, help="HAProxy's admin stats socket (omit: no switch)")
    promote.set_defaults(run=_shard_promote, command="shard promote")
    for name, run, what in (
        ("namespaces", _shard_namespaces, "every shard's namespaces, as JSON"),
        ("stats", _shard_stats, "every shard's figures and their sum, as JSON"),
    ):
        a = actions.add_parser(name, parents=[conn], help=what)
        a.add_argument(
            "--shard",
            action="append",
            required=True,
            type=_shard_pair,
            metavar="NAME=ADDR",
            help="a shard; repeat for each",
        )
        if name == "namespaces":
            a.add_argument("--prefix", default="", metavar="P", help="only namespaces starting with this")
        a.set_defaults(run=run, command=f"shard {name}")


def _warm_up(args: argparse.Namespace) -> int:
    import time

    from tiermem.kernels import warm_up

    t0 = time.perf_counter()
    warm_up()
    print(f"kernels compiled (or loaded from the cache) in {time.perf_counter() - t0:.1f} s")
    return 0


def _add_keys(sub: Any) -> None:
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    add = keys.add_parser(
        "add",
        help="append a key to a keys file and print its token (last line)",
        description="Append an API key to a keys file (only its hash is stored) and print its token on "
        "the last line: it is shown once. A running server picks the key up within a second.",
    )
    add.add_argument("--file", required=True, type=Path, help="the keys file (created if missing)")
    add.add_argument(
        "--namespace",
        action="append",
        required=True,
        help="a namespace prefix the key covers (the namespace and those below it); repeatable; "
        "'' covers every namespace",
    )
    add.add_argument("--role", required=True, choices=sorted(ROLES), help="read, write or admin")
    add.set_defaults(run=_keys_add, command="keys add")


def _connection_options(target: bool = True) -> argparse.ArgumentParser:
    conn = argparse.ArgumentParser(add_help=False)
    if target:
        conn.add_argument("--target", required=True, metavar="ADDR", help="the server, host:port")
    conn.add_argument(
        "--api-key",
        default=os.environ.get("TIERMEM_API_KEY") or None,
        metavar="TOKEN",
        help="API key (default: the TIERMEM_API_KEY environment variable)",
    )
    conn.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CAs")
    conn.add_argument(
        "--tls-ca", type=Path, metavar="FILE", help="connect with TLS, trusting this CA certificate (PEM)"
    )
    conn.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="with --tls or --tls-ca: present this client certificate chain (PEM), for mutual TLS",
    )
    conn.add_argument("--tls-key", type=Path, metavar="FILE", help="the key of --tls-cert (PEM)")
    conn.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"how long to wait for the server, and each call's deadline (default {DEFAULT_TIMEOUT:g}); "
        "a backup's or restore's stream has none",
    )
    return conn


# -- commands -------------------------------------------------------------------------------------


def _keys_add(args: argparse.Namespace) -> int:
    token = add_key(args.file, list(args.namespace), args.role)
    scope = ", ".join(repr(n) for n in args.namespace)
    print(f"added a {args.role} key for {scope} to {args.file}; its token (shown once):")
    print(token)
    return 0


def _seconds(text: str) -> float:
    """A --timeout, by the clients' own rule (``check_timeout``): else a usage error."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    try:
        check_timeout(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def _options(args: argparse.Namespace) -> dict[str, Any]:
    ca = None if args.tls_ca is None else check_pem(f"--tls-ca {args.tls_ca}", args.tls_ca.read_bytes())
    tls: Any = ca if ca is not None else bool(args.tls)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_cert is not None:
        if not tls:
            raise UsageError("--tls-cert needs --tls or --tls-ca")
        tls = client_certificate(
            ca,
            check_pem(f"--tls-key {args.tls_key}", args.tls_key.read_bytes(), "private key"),
            check_pem(f"--tls-cert {args.tls_cert}", args.tls_cert.read_bytes()),
        )
    return {"timeout": args.timeout, "api_key": args.api_key, "tls": tls}


def _connect(args: argparse.Namespace, target: str | None = None) -> MemoryClient:
    return MemoryClient(target or args.target, **_options(args))


def _shard_move(args: argparse.Namespace) -> int:
    # Before anything moves: a switch that cannot be made would strand the scope behind its fence.
    if args.source == args.dest:
        raise ValueError("--from and --to are the same shard")
    haproxy.check_shard_address(args.haproxy_socket, args.to_shard, args.dest)
    haproxy.check_map(args.haproxy_socket, args.haproxy_map)
    with _connect(args, args.source) as source, _connect(args, args.dest) as dest:
        report = move_scope(
            args.scope,
            source,
            dest,
            lambda: haproxy.set_route(args.haproxy_socket, args.haproxy_map, args.scope, args.to_shard),
            moved_to=args.to_shard,
            on_step=lambda step: print(f"tiermem shard move: {step}", file=sys.stderr, flush=True),
        )
    _print_json(dataclasses.asdict(report))
    return 0


def _shard_end_move(args: argparse.Namespace) -> int:
    if args.source == args.dest:
        raise ValueError("--from and --to are the same shard")
    haproxy.check_shard_address(args.haproxy_socket, args.to_shard, args.dest)
    # Switched if HAProxy routes the scope to the target now or would after a restart (the map
    # file is written first): either way clients may have written there.
    pinned = haproxy.pinned_shard(args.haproxy_socket, args.haproxy_map, args.scope)
    switched = args.to_shard in (pinned, haproxy.filed_shard(args.haproxy_map, args.scope))
    with _connect(args, args.source) as source, _connect(args, args.dest) as dest:
        report = end_move(
            args.scope,
            source,
            dest,
            switched,
            switch=lambda: haproxy.set_route(
                args.haproxy_socket, args.haproxy_map, args.scope, args.to_shard
            ),
            moved_to=args.to_shard,
        )
    _print_json(dataclasses.asdict(report))
    return 0


def _shard_promote(args: argparse.Namespace) -> int:
    if args.haproxy_socket is not None:  # (before promoting: a shard HAProxy lacks could not switch)
        haproxy.shard_address(args.haproxy_socket, args.shard)
    with _connect(args, args.replica) as replica:
        promoted = replica.promote_replica()
    if args.haproxy_socket is not None:
        haproxy.set_shard_address(args.haproxy_socket, args.shard, args.replica)
    _print_json(
        {
            "replica": args.replica,
            "shard": args.shard,
            "applied_seq": promoted.applied_seq,
            "memory_count": promoted.memory_count,
            "switched": args.haproxy_socket is not None,
        }
    )
    return 0


def _shard_pair(text: str) -> tuple[str, str]:
    """A --shard NAME=HOST:PORT, else a usage error."""
    name, eq, addr = text.partition("=")
    if not (name and eq and addr):
        raise argparse.ArgumentTypeError(f"takes NAME=HOST:PORT, not {text!r}")
    return name, addr


def _shard_list(args: argparse.Namespace) -> dict[str, str]:
    pairs = args.shard
    names = [name for name, _ in pairs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--shard names {twice[0]!r} twice: each shard needs a name of its own")
    return dict(pairs)


def _shard_namespaces(args: argparse.Namespace) -> int:
    with Shards(_shard_list(args), **_options(args)) as shards:
        found = shards.list_namespaces(args.prefix)
    _print_json([{"shard": s, "name": ns.name, "memory_count": ns.memory_count} for s, ns in found])
    return 0


def _shard_stats(args: argparse.Namespace) -> int:
    with Shards(_shard_list(args), **_options(args)) as shards:
        figures = shards.stats()
    per_shard = {name: _plain(to_python(s)) for name, s in figures.pop("shards").items()}
    _print_json({**figures, "shards": per_shard})
    return 0


def _ready(args: argparse.Namespace) -> MemoryClient:
    """A client of a server that reported SERVING within --timeout (else UnavailableError)."""
    client = _connect(args)
    try:
        client.wait_ready(args.timeout)
    except BaseException:
        client.close()
        raise
    return client


def _print_json(value: Any) -> None:
    print(json.dumps(_plain(value), indent=2, default=str))


def _plain(value: Any) -> Any:
    """``to_python``'s output with every repeated field a list: under the upb protobuf runtime a
    repeated field's container has no ``__iter__`` attribute, and ``to_python`` leaves it as it is."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, bytes, int, float)):
        return value
    if isinstance(value, (list, tuple, Sequence)):
        return [_plain(to_python(v)) for v in value]
    return value


@contextlib.contextmanager
def _naming(file: Path) -> Iterator[None]:
    """A server's refusal of a backup or restore, its line naming the file too."""
    try:
        yield
    except TiermemError as e:
        raise ServerRefused(f"{file}: {_one_line(e)}") from None


def _backup(args: argparse.Namespace) -> int:
    with _ready(args) as client, _naming(args.file):
        summary = backup(client, args.file, args.namespace, args.include_children)
    _print_json(dataclasses.asdict(summary))
    return 0


def _restore(args: argparse.Namespace) -> int:
    check_path(args.file)  # before connecting: a typo is not a server problem
    with _ready(args) as client, _naming(args.file):
        response = restore(client, args.file, args.target_namespace, confirm=args.confirm)
    _print_json(to_python(response))
    return 0


def _stats(args: argparse.Namespace) -> int:
    with _ready(args) as client:
        _print_json(to_python(client.stats(args.namespace)))
    return 0


def _namespaces(args: argparse.Namespace) -> int:
    with _ready(args) as client:
        _print_json([to_python(n) for n in client.list_namespaces(args.prefix)])
    return 0


def _health(args: argparse.Namespace) -> int:
    try:
        client = _connect(args)
    except UsageError:
        raise
    except (ValueError, OSError):  # (a TLS file that cannot be read: not serving, as documented)
        print("NOT_SERVING")
        raise
    with client:
        try:
            client.wait_ready(args.timeout)
        except TiermemError as e:
            print("NOT_SERVING")
            print(f"tiermem health: {_one_line(e)}", file=sys.stderr)
            return 1
    print("SERVING")
    return 0


if __name__ == "__main__":
    sys.exit(main())
