"""``python -m tiermem.mcp --target ADDR``: an MCP server (stdio or streamable HTTP) in front of a
tiermem server (docs/integrations.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from tiermem.client import MemoryClient

from .server import build_server
from .stdio import run_stdio

API_KEY_ENV = "TIERMEM_API_KEY"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tiermem.mcp",
        description="An MCP server whose tools (remember, recall, build_context, forget, reflect, "
        "namespaces) act on a tiermem server.",
    )
    p.add_argument("--target", required=True, help="the tiermem server, host:port (e.g. 127.0.0.1:50051)")
    p.add_argument(
        "--api-key",
        default=None,
        help=f"the API key every call carries (default: ${API_KEY_ENV}; prefer the variable: "
        "arguments show in process listings)",
    )
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--tls", action="store_true", help="connect with TLS, trusting the system's CAs")
    tls.add_argument("--tls-ca", metavar="FILE", help="connect with TLS, trusting this CA certificate (PEM)")
    p.add_argument(
        "--namespace",
        default="",
        help="the namespace tools act on when a call names none (e.g. user:ana/project:x)",
    )
    p.add_argument("--transport", choices=("stdio", "streamable-http"), default="stdio")
    p.add_argument("--host", default="127.0.0.1", help="streamable-http: the address to listen on")
    p.add_argument("--port", type=int, default=8000, help="streamable-http: the port (endpoint /mcp)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="streamable-http: allow a --host other than loopback (the endpoint has no authentication "
        "of its own: whoever reaches it acts with the API key)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds each tiermem call may take")
    p.add_argument(
        "--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), default="WARNING"
    )
    args = p.parse_args(argv)
    if args.transport == "streamable-http" and not args.insecure and not _loopback(args.host):
        p.error(f"--host {args.host} is reachable from other machines: say --insecure to serve it anyway")
    if not 0 <= args.port <= 65535:
        p.error("--port must be in 0..65535")
    if args.timeout <= 0:
        p.error("--timeout must be > 0")
    return args


def _loopback(host: str) -> bool:
    # Exactly the names the SDK guards against DNS rebinding (a web page reaching the endpoint).
    return host in ("127.0.0.1", "localhost", "::1")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    tls: bool | str = args.tls_ca or args.tls
    client = MemoryClient(args.target, timeout=args.timeout, api_key=api_key, tls=tls)
    server = build_server(client, namespace=args.namespace or None, log_level=args.log_level)
    try:
        if args.transport == "stdio":
            run_stdio(server)
        else:
            server.run("streamable-http", host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
