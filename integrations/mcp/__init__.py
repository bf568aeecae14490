"""tiermem for MCP clients: ``python -m tiermem.mcp --target ADDR``.

An MCP server (the official ``mcp`` SDK, stdio or streamable HTTP) whose tools (``remember``,
``recall``, ``build_context``, ``forget``, ``reflect``, ``namespaces``) act on a tiermem server
through ``tiermem.client.MemoryClient``; ``build_server(client, namespace=...)`` builds one in
code. docs/integrations.md shows how to run it and wire it into an MCP client."""

from .server import MemoryTools, build_server

__all__ = ["MemoryTools", "build_server"]
