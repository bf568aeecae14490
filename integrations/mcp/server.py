"""tiermem's agent calls as MCP tools: ``build_server(client, namespace=...)`` returns an
``MCPServer`` (the official SDK's high-level server) whose tools call a ``MemoryClient``.

Tools: ``remember``, ``recall``, ``build_context``, ``forget``, ``reflect`` and ``namespaces``. Each
acts on the namespace it is given, else on the server's default (``--namespace``). A call tiermem
refuses becomes an MCP tool error (``is_error``) naming the reason (``MEMORY_NOT_FOUND``,
``API_KEY_INVALID``, ...) and, for bad input, the fields; the server keeps serving.

Tools are plain (blocking) methods: the SDK runs each call on a worker thread, and the client is
thread-safe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool as MCPTool
from mcp.types import ToolAnnotations
from pydantic import BaseModel, BeforeValidator, Field

from tiermem.client import MemoryClient, TiermemError, to_python

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]

INSTRUCTIONS = """\
tiermem is this agent's long-term memory. `remember` what is worth keeping (facts, decisions,
preferences, observations), `recall` it by meaning before answering, `build_context` for a
token-budgeted digest of a scope, `forget` what is wrong or stale, and `reflect` when `remember`
says a reflection is due. Every tool acts on a namespace (e.g. "user:ana/project:x"): the one
given as `namespace`, else the server's default; `namespaces` lists them and names the default."""

# -- argument types (their descriptions become the tools' JSON schemas) ----------------------------

Namespace = Annotated[
    str | None,
    Field(
        description="The namespace to act on, e.g. 'user:ana/project:x' (a '/' nests scopes). "
        "Default: the server's default namespace (see the namespaces tool)."
    ),
]
Tags = Annotated[list[str] | None, Field(description="Labels to file the memory under, e.g. ['billing'].")]


def _no_bool(v: Any) -> Any:
    if isinstance(v, bool):  # (pydantic's lax mode would read true as 1)
        raise ValueError("is a number, not true or false")
    return v


def _only_bool(v: Any) -> Any:
    if not isinstance(v, bool):  # (pydantic's lax mode would read "yes" or 1 as true)
        raise ValueError("is true or false")
    return v


# Numbers keep the lax reading models need ("5" and 5.0 for 5); a flag given for a number, or
# anything but a flag for a flag, is an error naming the argument.
_NO_BOOL = BeforeValidator(_no_bool)
_ONLY_BOOL = BeforeValidator(_only_bool)
Scalar = str | int | float | bool


# -- results ---------------------------------------------------------------------------------------


class Remembered(BaseModel):
    id: str = Field(description="The memory's id (for forget, and as a reflection's source).")
    namespace: str
    kind: str
    importance: float | None = Field(description="The importance stored (estimated when not given).")
    reflection_due: bool = Field(description="Enough has been observed: call reflect.")
    summary_due: bool = Field(description="Enough new text since the last summary to write one.")


class Recalled(BaseModel):
    namespaces: list[str] = Field(description="The namespaces searched.")
    results: list[dict[str, Any]] = Field(
        description="Best first; each has memory (id, content, kind, tags, metadata, importance, "
        "create_time in epoch seconds, ...; empty fields left out) and its score, relevance, "
        "recency and importance."
    )


class ContextPackage(BaseModel):
    text: str = Field(description="The assembled context, one item per line, ready for a prompt.")
    tokens_used: int = Field(description="Estimated tokens of text, never above token_budget.")
    token_budget: int
    sections: list[dict[str, Any]] = Field(
        description="In order, per scope: summary, recent, semantic, graph, important, overflow "
        "(each when it holds something); each has namespace, kind, tokens and items "
        "(memory_id, empty for graph facts and the overflow summary; text; tokens)."
    )
    warnings: list[str] = Field(description="Steps that failed without stopping the build.")


class Forgotten(BaseModel):
    id: str
    namespace: str
    deleted: bool = True


class Reflection(BaseModel):
    namespace: str
    reflection_due: bool = Field(description="accumulated_importance has reached threshold.")
    accumulated_importance: float = Field(description="Importance observed since the last reflection.")
    threshold: float
    observations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The most recent observations, newest first: the material for a reflection "
        "(left out when a reflection was stored).",
    )
    stored: dict[str, Any] | None = Field(
        default=None, description="The reflection stored by this call, if insight was given."
    )


class Namespaces(BaseModel):
    default: str | None = Field(description="The namespace tools act on when given none.")
    namespaces: list[dict[str, Any]] = Field(description="name and memory_count of each, in name order.")
    truncated: bool = Field(description="More namespaces exist than limit.")


# -- errors and conversions ------------------------------------------------------------------------


def describe(error: TiermemError) -> str:
    """A refused call in one line: reason, status code, message, the invalid fields and when to
    try again (what a model needs to correct itself)."""
    text = f"{error.reason or error.code.name} ({error.code.name}): {error.message}"
    for v in error.field_violations:
        violation = f"{v.field}: {v.description}"
        if violation not in text:
            text += f"; {violation}"
    if error.retry_after is not None:
        text += f"; retry after {error.retry_after:.1f} s"
    return text


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """Turn what tiermem (or the client, for a value it cannot send) refuses into a ToolError,
    which the SDK returns as an error result carrying this text; anything else stays a crash."""
    try:
        yield
    except TiermemError as e:
        raise ToolError(describe(e)) from e
    except ValueError as e:
        raise ToolError(str(e)) from e


# Fields the contract holds as 32-bit floats: rounded, so 0.3 does not read 0.30000001192092896.
_FLOAT32 = frozenset({"importance", "surprise_score"})


def _plain_memory(memory: Any) -> dict[str, Any]:
    """A Memory as plain values (``to_python``) without the vector and without fields left empty."""
    plain = {}
    for k, v in to_python(memory).items():
        if k == "embedding" or v is None or v == "" or v == [] or v == {}:
            continue
        plain[k] = round(v, 6) if k in _FLOAT32 else v
    if isinstance(plain.get("tier"), str):  # (as remember takes it: "slow", not "TIER_SLOW")
        plain["tier"] = plain["tier"].removeprefix("TIER_").lower()
    return plain


def _plain_result(result: Any) -> dict[str, Any]:
    return {
        "memory": _plain_memory(result.memory),
        "score": round(result.score, 6),
        "relevance": round(result.relevance, 6),
        "recency": round(result.recency, 6),
        "importance": round(result.importance, 6),
    }


# -- the tools -------------------------------------------------------------------------------------


class MemoryTools:
    """The tools, bound to one client and a default namespace (None: every call must name one)."""

    def __init__(self, client: MemoryClient, namespace: str | None = None) -> None:
        self.client = client
        self.namespace = namespace or None

    def _namespace(self, given: str | None) -> str:
        namespace = given or self.namespace
        if not namespace:
            raise ToolError("no namespace: pass namespace, or start the server with --namespace")
        return namespace

    def remember(
        self,
        content: Annotated[str, Field(description="What to remember, in a sentence or a few.")],
        kind: Annotated[
            str,
            Field(
                description="What sort of memory: observation (an event), fact, decision, preference, "
                "tool_result, ... A summary replaces the namespace's previous summary."
            ),
        ] = "observation",
        importance: Annotated[
            float | None,
            Field(
                ge=0,
                le=1,
                description="0 to 1; estimated from the content and kind when not given.",
            ),
            _NO_BOOL,
        ] = None,
        tags: Tags = None,
        metadata: Annotated[
            dict[str, Scalar] | None,
            Field(description="Typed attributes to filter on later, e.g. {'ticket': 1432, 'urgent': true}."),
        ] = None,
        tier: Annotated[
            Literal["fast", "medium", "slow", "glacial"] | None,
            Field(
                description="Timescale: fast (minutes), medium (hours), slow (days), glacial (archive); "
                "default: the server's."
            ),
        ] = None,
        namespace: Namespace = None,
    ) -> Remembered:
        """Store a memory and return its id. The same content stored again in a namespace
        reinforces the memory already there instead of adding a copy. The answer says whether a
        reflection is due (then call reflect) or a summary is."""
        ns = self._namespace(namespace)
        fields: dict[str, Any] = {"tags": tags or (), "metadata": metadata, "tier": tier}
        if importance is not None:
            fields["importance"] = importance
        with _refusals():
            response = self.client.observe(ns, content, kind=kind, allow_duplicates=False, **fields)
        memory = response.memory
        return Remembered(
            id=memory.id,
            namespace=memory.namespace,
            kind=memory.kind,
            importance=round(memory.importance, 6) if memory.HasField("importance") else None,
            reflection_due=response.reflection_due,
            summary_due=response.summary_due,
        )

    def recall(
        self,
        query: Annotated[
            str, Field(description="What to look for, in words (matched by meaning and keywords).")
        ],
        limit: Annotated[int, Field(ge=1, le=100, description="At most this many memories."), _NO_BOOL] = 10,
        namespaces: Annotated[
            list[str] | None,
            Field(description="The namespaces to search; default: the server's default namespace."),
        ] = None,
        include_ancestors: Annotated[
            bool,
            Field(description="Also search the namespaces' parents ('a/b/c' -> 'a/b', 'a'), weighted less."),
            _ONLY_BOOL,
        ] = False,
        tags_any: Annotated[
            list[str] | None, Field(description="Only memories with one of these tags.")
        ] = None,
        tags_all: Annotated[
            list[str] | None, Field(description="Only memories with all of these tags.")
        ] = None,
        kinds: Annotated[list[str] | None, Field(description="Only memories of these kinds.")] = None,
    ) -> Recalled:
        """Search memories by meaning: the best matches first, each with its score and the
        memory (id, content, kind, tags, metadata, importance, times in epoch seconds)."""
        searched = list(namespaces) if namespaces else [self._namespace(None)]
        with _refusals():
            results = self.client.search(
                searched,
                query,
                limit=limit,
                include_ancestors=include_ancestors,
                tags_any=tags_any or (),
                tags_all=tags_all or (),
                kinds=kinds or (),
            )
        return Recalled(namespaces=searched, results=[_plain_result(r) for r in results])

    def build_context(
        self,
        token_budget: Annotated[
            int,
            Field(
                gt=0,
                le=2**31 - 1,
                description="The most tokens the context may use (estimated).",
            ),
            _NO_BOOL,
        ] = 1000,
        query: Annotated[
            str, Field(description="What the next turn is about: drives which memories are chosen.")
        ] = "",
        scopes: Annotated[
            list[str] | None,
            Field(
                description="Namespaces to draw from, narrowest first (e.g. session, project, user; "
                "1 to 8); default: the default namespace alone."
            ),
        ] = None,
    ) -> ContextPackage:
        """Assemble a token-budgeted context for the next turn from one or more scopes: each
        scope's summary, recent memories, matches for query, graph facts and its most important
        memories, within budget. Returns the text and its sections."""
        chosen = list(scopes) if scopes else [self._namespace(None)]
        with _refusals():
            package = self.client.build_context(chosen, token_budget=token_budget, query=query)
        return ContextPackage(
            text="\n".join(item.text for section in package.sections for item in section.items),
            tokens_used=package.tokens_used,
            token_budget=token_budget,
            sections=[to_python(section) for section in package.sections if section.items],
            warnings=list(package.warnings),
        )

    def forget(
        self,
        id: Annotated[str, Field(description="The id of the memory to delete (from remember or recall).")],
        namespace: Namespace = None,
    ) -> Forgotten:
        """Delete a memory for good (wrong, stale or asked to be forgotten)."""
        ns = self._namespace(namespace)
        with _refusals():
            self.client.delete(ns, id)
        return Forgotten(id=id, namespace=ns)

    def reflect(
        self,
        insight: Annotated[
            str | None,
            Field(
                description="Leave out to read the material; give the insight drawn from the "
                "observations to store it as a reflection."
            ),
        ] = None,
        source_memory_ids: Annotated[
            list[str] | None,
            Field(description="With insight: the ids of the observations it was drawn from."),
        ] = None,
        questions: Annotated[
            list[str] | None, Field(description="With insight: the questions it answers.")
        ] = None,
        limit: Annotated[
            int, Field(ge=1, le=1000, description="How many recent observations to return."), _NO_BOOL
        ] = 50,
        namespace: Namespace = None,
    ) -> Reflection:
        """Reflections: insights drawn from many observations, ranked above them. Without insight:
        the most recent observations and whether a reflection is due. With insight: store it (with
        the source_memory_ids it came from), which starts the count towards the next one."""
        ns = self._namespace(namespace)
        stored = None
        with _refusals():
            if insight is not None:
                memory = self.client.reflect(
                    ns, insight, source_memory_ids=source_memory_ids or (), questions=questions or ()
                )
                stored = _plain_memory(memory)
            candidates = self.client.reflection_candidates(ns, limit=1 if stored else limit)
        return Reflection(
            namespace=ns,
            reflection_due=candidates.reflection_due,
            accumulated_importance=candidates.accumulated_importance,
            threshold=candidates.threshold,
            observations=[] if stored else [_plain_memory(m) for m in candidates.observations],
            stored=stored,
        )

    def namespaces(
        self,
        prefix: Annotated[
            str, Field(description="Only namespaces starting with this, e.g. 'user:ana'.")
        ] = "",
        limit: Annotated[int, Field(ge=1, le=10000, description="At most this many."), _NO_BOOL] = 200,
    ) -> Namespaces:
        """The namespaces holding memories (those the API key covers) and the default namespace
        the other tools act on when given none."""
        listed: list[dict[str, Any]] = []
        truncated = False
        with _refusals():
            for info in self.client.list_namespaces(prefix, page_size=min(limit + 1, 1000)):
                if len(listed) == limit:
                    truncated = True
                    break
                listed.append({"name": info.name, "memory_count": info.memory_count})
        return Namespaces(default=self.namespace, namespaces=listed, truncated=truncated)


def build_server(
    client: MemoryClient, *, namespace: str | None = None, log_level: LogLevel = "WARNING"
) -> MCPServer:
    """An MCP server whose tools act through ``client``, on ``namespace`` unless a call names
    another. Run it with ``.run("stdio")`` or ``.run("streamable-http", host=..., port=...)``."""
    tools = MemoryTools(client, namespace)
    server: MCPServer = _StrictServer("tiermem", instructions=INSTRUCTIONS, log_level=log_level)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server.add_tool(
        tools.remember, annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False)
    )
    server.add_tool(tools.recall, annotations=reads)
    server.add_tool(tools.build_context, annotations=reads)
    server.add_tool(
        tools.forget,
        annotations=ToolAnnotations(destructive_hint=True, idempotent_hint=False, open_world_hint=False),
    )
    server.add_tool(tools.reflect, annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    server.add_tool(tools.namespaces, annotations=reads)
    return server


class _StrictServer(MCPServer):
    """Tools refuse arguments they do not take (the SDK drops them): a misspelled ``namespace``
    would otherwise act on the default namespace. Their schemas say so (additionalProperties)."""

    async def list_tools(self) -> list[MCPTool]:
        listed = await super().list_tools()
        for tool in listed:
            tool.input_schema = {**tool.input_schema, "additionalProperties": False}
        return listed

    _takes: dict[str, set[str]] | None = None  # tool -> its arguments (tools are added before serving)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        if self._takes is None or name not in self._takes:
            self._takes = {
                t.name: set(t.input_schema.get("properties", {})) for t in await super().list_tools()
            }
        takes = self._takes.get(name)
        if takes is not None:
            unknown = sorted(set(arguments) - takes)
            if unknown:
                raise ToolError(
                    f"{name} does not take {', '.join(map(repr, unknown))}; it takes: {', '.join(sorted(takes))}"
                )
        return await super().call_tool(name, arguments, context)
