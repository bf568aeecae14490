"""tiermem for MCP clients: ``python -m tiermem.mcp --target ADDR``.

An MCP server (the official ``mcp`` SDK, stdio or streamable HTTP) whose tools (``remember``,
``recall``, ``build_context``, ``forget``, ``reflect``, ``namespaces``) act on a tiermem server
through ``tiermem.client.MemoryClient``; ``build_server(client, namespace=...)`` builds one in
code. docs/integrations.md shows how to run it and wire it into an MCP client."""

try:
    from .server import MemoryTools, build_server
except ModuleNotFoundError as e:  # (the SDK is an extra: say which)
    if (e.name or "").split(".")[0] != "mcp":
        raise
    raise ModuleNotFoundError("tiermem.mcp needs the MCP SDK: pip install 'tiermem[mcp]'", name=e.name) from e

__all__ = ["MemoryTools", "build_server"]
