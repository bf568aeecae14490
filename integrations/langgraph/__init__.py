"""tiermem as a LangGraph store: ``TiermemStore(target, namespace_prefix=...)``, a ``BaseStore``
whose items are memories of a tiermem server, for ``graph.compile(store=...)``.

Namespaces become namespace paths and keys client ids (``keys``), values a memory's content and
metadata (``values``), filters tiermem ``where`` filters checked again in the client (``filters``);
``store`` maps the operations onto ``MemoryClient`` calls. docs/langgraph.md has the mapping and
its limits."""

try:
    from .store import ForeignMemoryError, TiermemStore
except ModuleNotFoundError as e:  # (LangGraph is an extra: say which)
    if (e.name or "").split(".")[0] != "langgraph":
        raise
    raise ModuleNotFoundError(
        "tiermem.langgraph needs LangGraph: pip install 'tiermem[langgraph]'", name=e.name
    ) from e

__all__ = ["ForeignMemoryError", "TiermemStore"]
