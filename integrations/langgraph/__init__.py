"""tiermem as a LangGraph store: ``TiermemStore(target, namespace_prefix=...)``, a ``BaseStore``
whose items are memories of a tiermem server, for ``graph.compile(store=...)``.

Namespaces become namespace paths and keys client ids (``keys``), values a memory's content and
metadata (``values``), filters tiermem ``where`` filters checked again in the client (``filters``);
``store`` maps the operations onto ``MemoryClient`` calls. docs/langgraph.md has the mapping and
its limits."""

from .store import TiermemStore

__all__ = ["TiermemStore"]
