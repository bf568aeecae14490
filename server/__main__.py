"""``python -m tiermem.server``: run a tiermem server."""

from __future__ import annotations

import argparse
import logging
import os

# Before anything loads FAISS's OpenMP runtime (libgomp reads this once): its worker threads sleep
# between parallel regions instead of spinning, so the indexer's bulk adds leave CPU to the writer
# and the gRPC threads beside them (faster batch ingest: docs/perf-log.md). An explicit setting in
# the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tiermem.server.config import ServerConfig
from tiermem.server.transport.app import serve


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="tiermem-server", description="Run the tiermem gRPC memory server.")
    p.add_argument("--host", help="address to bind (default 127.0.0.1, env TIERMEM_HOST)")
    p.add_argument("--port", type=int, help="port (default 50051; 0 picks a free one; env TIERMEM_PORT)")
    p.add_argument("--data-dir", help="data directory (default ./data, env TIERMEM_DATA_DIR)")
    p.add_argument(
        "--no-sync", action="store_true", help="do not fsync commits (survives kill -9, not power loss)"
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING (default INFO)")
    p.add_argument(
        "--search-processes",
        type=int,
        help="processes serving the port: N > 1 adds N - 1 search followers (default 1, "
        "env TIERMEM_SEARCH_PROCESSES; see README, Configuration)",
    )
    args = p.parse_args(argv)
    overrides = {
        "host": args.host,
        "port": args.port,
        "data_dir": args.data_dir,
        "log_level": args.log_level,
        "search_processes": args.search_processes,
    }
    if args.no_sync:
        overrides["sync"] = False
    try:
        config = ServerConfig.from_env(**overrides)
    except ValueError as e:
        p.error(str(e))  # exit status 2 with the setting named
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    serve(config)


if __name__ == "__main__":
    main()
