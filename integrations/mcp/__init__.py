"""tiermem for MCP clients: ``python -m tiermem.mcp --target ADDR``."""
