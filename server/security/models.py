"""Which embedding models an API key may name. Embedding spaces are server-wide, named by their
model and fixed to the dimension of their first vector, so a key for part of the namespaces (a
tenant's) may not make one up for everybody: it may name the spaces the operator shares
(``embedding_spaces``, whose dimensions are fixed from the start), the server's own embedder's
(once that has a dimension: the built-in one's from the start, a remote one's once the server has
stored a vector of it), and spaces named under a namespace it covers (``user:ana/minilm`` for a
key of ``user:ana``), which no other tenant may name. A key for every namespace may name any
model. Apart from the server's own embedder's, the rule looks at names alone, so a refusal tells
nothing of other tenants' spaces."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tiermem.server.model.errors import PermissionDenied
from tiermem.server.security.keys import ApiKey


@dataclass(frozen=True)
class ModelRule:
    shared: frozenset[str]  # declared spaces: their dimensions are fixed from the start
    embedder_model: str  # the space the server's embedder writes
    embedder_fixed: bool  # its dimension is known from the start (the built-in embedder)
    stored: Callable[[str], bool]  # whether a space holds a vector yet

    def may_name(self, key: ApiKey, model: str) -> bool:
        if key.everything or model in self.shared:
            return True
        if model == self.embedder_model:  # (never a tenant's, even under its namespace)
            return self.embedder_fixed or self.stored(model)
        return key.covers(model)

    def check(self, key: ApiKey, models: Iterable[str], reembedded: str = "") -> None:
        """PERMISSION_DENIED unless ``key`` may name each of ``models`` (an empty name is left to
        validation). ``reembedded``: an import's exporting embedder, whose vectors this server
        replaces with its own embedder's when that differs (they claim no space)."""
        for model in models:
            if not model or (model == reembedded and model != self.embedder_model):
                continue
            if not self.may_name(key, model):
                raise PermissionDenied(
                    f"embedding model {model!r} is not shared by this server (embedding_spaces) and not "
                    "named under a namespace this key covers (for a key of user:ana, user:ana/<model>)",
                    reason="EMBEDDING_MODEL_NOT_ALLOWED",
                    metadata={"embedding_model": model, "key_id": key.id},
                )
