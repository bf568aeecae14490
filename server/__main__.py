"""``python -m tiermem.server``: run a tiermem server."""

from __future__ import annotations

import argparse
import os
import signal
import sys

# Until ``serve`` installs the server's own handlers, half a second of imports later, a stop ends
# the process at once, with status 0 and no traceback from an import: nothing is open yet.
signal.signal(signal.SIGTERM, lambda _signum, _frame: os._exit(0))
signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(0))

# Before anything loads FAISS's OpenMP runtime (libgomp reads this once): its worker threads sleep
# between parallel regions instead of spinning, so the indexer's bulk adds leave CPU to the writer
# and the gRPC threads beside them (faster batch ingest: docs/perf-log.md). An explicit setting in
# the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# gRPC's own log lines (one a failed TLS handshake, at INFO) are not in the server's format and can
# flood it: only its errors, unless the environment asks for more.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

# (imported after the handlers and the environment above: E402 is meant)
from tiermem.server.config import ServerConfig, UnusableSetting  # noqa: E402
from tiermem.server.transport import logs  # noqa: E402
from tiermem.server.transport.app import serve  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiermem-server", description="Run the tiermem gRPC memory server.")
    p.add_argument("--host", help="address to bind (default 127.0.0.1, env TIERMEM_HOST)")
    p.add_argument("--port", type=int, help="port (default 50051; 0 picks a free one; env TIERMEM_PORT)")
    p.add_argument("--data-dir", help="data directory (default ./data, env TIERMEM_DATA_DIR)")
    p.add_argument(
        "--no-sync", action="store_true", help="do not fsync commits (survives kill -9, not power loss)"
    )
    p.add_argument(
        "--tracing", action="store_true", help="OpenTelemetry spans for every call (env TIERMEM_TRACING)"
    )
    p.add_argument(
        "--metrics-port", type=int, help="serve Prometheus metrics on this port (env TIERMEM_METRICS_PORT)"
    )
    p.add_argument("--config", help="a TOML settings file (env TIERMEM_CONFIG): flags > environment > file")
    p.add_argument("--log-level", help="DEBUG (with an access line a call), INFO, WARNING (default INFO)")
    p.add_argument("--log-format", help="text or json (default text, env TIERMEM_LOG_FORMAT)")
    p.add_argument(
        "--search-processes",
        type=int,
        help="processes serving the port: N > 1 adds N - 1 search followers, 0 one process per core, "
        "at most 4 (default 0, env TIERMEM_SEARCH_PROCESSES; see README, Configuration)",
    )
    p.add_argument(
        "--api-keys", help="keys file (`tiermem keys add`): every call needs a key (env TIERMEM_API_KEYS)"
    )
    p.add_argument("--tls-cert", help="server certificate chain, PEM (env TIERMEM_TLS_CERT)")
    p.add_argument("--tls-key", help="server private key, PEM (env TIERMEM_TLS_KEY)")
    p.add_argument(
        "--tls-client-ca", help="CA of client certificates: mutual TLS (env TIERMEM_TLS_CLIENT_CA)"
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        help="allow an address other than loopback without TLS or without API keys",
    )
    p.add_argument(
        "--sharded",
        action="store_true",
        help="this server is one shard behind a proxy: requests must carry their tiermem-route "
        "metadata (env TIERMEM_SHARDED; docs/scaling.md)",
    )
    p.add_argument(
        "--replication",
        action="store_true",
        help="keep a commit log and feed replicas on other hosts (env TIERMEM_REPLICATION; docs/scaling.md)",
    )
    p.add_argument(
        "--replica-of", metavar="ADDR", help="be a replica of the server at ADDR (env TIERMEM_REPLICA_OF)"
    )
    p.add_argument(
        "--replica-ack",
        choices=("async", "sync"),
        help="sync: answer a write once a replica stored it too (env TIERMEM_REPLICA_ACK; default async)",
    )
    return p


# Refusals only a change of settings mends (exit status 2, which the systemd unit does not restart
# after): a promoted replica's directory started as a replica again.
_SETTING_REASONS = frozenset({"REPLICA_PROMOTED"})


def main(argv: list[str] | None = None) -> None:
    p = _parser()
    args = p.parse_args(argv)
    overrides = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "metrics_port": args.metrics_port,
        "search_processes": args.search_processes,
        "api_keys": args.api_keys,
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_client_ca": args.tls_client_ca,
    }
    if args.no_sync:
        overrides["sync"] = False
    if args.tracing:
        overrides["tracing"] = True
    if args.insecure:
        overrides["insecure"] = True
    if args.sharded:
        overrides["sharded"] = True
    if args.replication:
        overrides["replication"] = True
    overrides["replica_of"] = args.replica_of
    overrides["replica_ack"] = args.replica_ack
    try:
        config = ServerConfig.from_env(config_file=args.config, **overrides)
    except ValueError as e:
        p.exit(2, f"{p.prog}: error: {e}\n")  # the setting named, in one line (no usage: not a flag's syntax)
    logs.configure(config.log_level, config.log_format)
    try:
        serve(config)
    except UnusableSetting as e:  # (a model missing, an extra not installed: a setting's fault)
        p.exit(2, f"{p.prog}: error: {e}\n")
    except Exception as e:
        # An error the server raises on purpose (a TiermemError: the data directory in use, not
        # writable, damaged, of another schema version) names its cause: one line, no traceback.
        # Anything else is a bug, and its traceback is wanted.
        reason = getattr(e, "reason", None)
        if not isinstance(reason, str) or not hasattr(e, "status"):
            raise
        print(f"tiermem-server: cannot start: {e} [{reason}]", file=sys.stderr, flush=True)
        sys.exit(2 if reason in _SETTING_REASONS else 1)


if __name__ == "__main__":
    main()
