"""Request building blocks shared by ``MemoryClient`` and ``AsyncMemoryClient``: enum values by
name, ``Memory`` and ``MemoryFilter`` messages from Python values, timestamps, and the check that
turns a misspelled keyword argument into Python's own TypeError."""

from __future__ import annotations

import datetime as dt
import difflib
import inspect
import json
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from tiermem._values import set_metadata, set_timestamp, timestamp_seconds
from tiermem.v1 import memory_pb2 as pb

TimeLike = dt.datetime | float | int | Timestamp  # (a Timestamp as the server's answers hold them)


def tier_value(tier: int | str | None) -> int:
    """Tier from an enum value or a name: 'fast', 'FAST' or 'TIER_FAST'; None means unspecified."""
    if tier is None:
        return pb.TIER_UNSPECIFIED
    if isinstance(tier, str):
        name = tier.upper()
        try:
            return int(pb.Tier.Value(name if name.startswith("TIER_") else f"TIER_{name}"))
        except ValueError:
            raise ValueError(f"unknown tier {tier!r}") from None
    return _enum_number(tier, "tier")


def _enum_number(value: Any, what: str) -> int:
    """An enum's number as given: an int (a NumPy integer too), never a float or a bool, which
    ``int()`` would round or take (tier=1.7 was FAST)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be a name or an int, not {type(value).__name__} {value!r}")
    return operator.index(value)


def strategy_value(strategy: int | str | None) -> int:
    """Search strategy from an enum value or a name: 'weighted', 'WEIGHTED' or
    'SEARCH_STRATEGY_WEIGHTED'; None means unspecified (fused, the default)."""
    if strategy is None:
        return pb.SEARCH_STRATEGY_UNSPECIFIED
    if isinstance(strategy, str):
        name = strategy.upper()
        full = name if name.startswith("SEARCH_STRATEGY_") else f"SEARCH_STRATEGY_{name}"
        try:
            return int(pb.SearchStrategy.Value(full))
        except ValueError:
            raise ValueError(f"unknown search strategy {strategy!r}") from None
    return _enum_number(strategy, "strategy")


def timestamp(value: TimeLike) -> Timestamp:
    ts = Timestamp()
    if isinstance(value, Timestamp):
        ts.CopyFrom(value)
    elif isinstance(value, dt.datetime):
        ts.FromDatetime(value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc))
    else:
        set_timestamp(ts, float(value))
    return ts


def seconds(value: TimeLike) -> float:
    """Epoch seconds; a naive datetime is UTC, as everywhere in the client (not local time)."""
    if isinstance(value, Timestamp):
        return timestamp_seconds(value)
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)).timestamp()
    return float(value)


def _set_query(
    req: pb.SearchMemoriesRequest, query: str | Sequence[float] | Any, keywords: str | None
) -> None:
    """The query of a search: text, or a vector (with ``keywords`` as its text: the default strategy
    and hybrid search match them)."""
    if isinstance(query, str):
        if keywords is not None and keywords != query:
            raise ValueError("keywords are the query text when the query is text; pass one")
        req.query_text = query
    elif query is not None:
        req.query_embedding.extend([float(x) for x in query])
        if keywords is not None:
            req.query_text = keywords


def _set_hybrid(
    req: pb.SearchMemoriesRequest,
    hybrid: bool,
    *,
    keywords: str | None,
    rrf_k: float | None,
    vector_weight: float | None,
    keyword_weight: float | None,
) -> None:
    """Hybrid search and its settings; ValueError for hybrid settings without ``hybrid``."""
    if not hybrid:
        extra = [
            name
            for name, value in (
                ("rrf_k", rrf_k),
                ("vector_weight", vector_weight),
                ("keyword_weight", keyword_weight),
            )
            if value is not None
        ]
        if extra:
            raise ValueError(f"{', '.join(extra)} only apply with hybrid=True")
        return
    req.hybrid.enabled = True
    _set_given(req.hybrid, rrf_k=rrf_k, vector_weight=vector_weight, keyword_weight=keyword_weight)


def _set_given(message: Any, **values: float | None) -> None:
    """Set the optional fields of ``message`` whose value was given (not None)."""
    for name, value in values.items():
        if value is not None:
            setattr(message, name, value)


def strings(name: str, values: Iterable[str]) -> list[str]:
    """A list argument of strings as a list; a str or a mapping is refused, not taken apart into
    its characters or keys (``tags="deploy"`` would be five tags)."""
    if isinstance(values, str | bytes | Mapping):
        raise TypeError(f"{name} must be a list of strings, not {type(values).__name__}")
    return list(values)


def dicts(name: str, values: Iterable[Any], *allowed: type) -> list[Any]:
    """A list argument of dicts (or of the ``allowed`` messages) as a list; a single dict, or an
    entry of another type, is a TypeError naming it (a dict was taken apart into its keys)."""
    if isinstance(values, str | bytes | Mapping):
        raise TypeError(f"{name} must be a list of dicts, not {type(values).__name__}")
    out = list(values)
    for i, v in enumerate(out):
        if not isinstance(v, (Mapping, *allowed)):
            raise TypeError(f"{name}[{i}] must be a dict, not {type(v).__name__}")
    return out


def build_memory(
    namespace: str,
    content: str,
    *,
    id: str = "",
    kind: str = "",
    tier: int | str | None = None,
    importance: float | None = None,
    source: str = "",
    topic: str = "",
    tags: Iterable[str] = (),
    metadata: Mapping[str, Any] | None = None,
    embedding: Sequence[float] | Any = None,
    embedding_model: str = "",
    create_time: TimeLike | None = None,
    expire_time: TimeLike | None = None,
    token_cost: int = 0,
    source_memory_ids: Iterable[str] = (),
) -> pb.Memory:
    """A ``Memory`` message from Python values (numpy arrays are fine for ``embedding``)."""
    for name, value in (("namespace", namespace), ("content", content)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, not {type(value).__name__}")
    m = pb.Memory(
        namespace=namespace,
        content=content,
        id=id,
        kind=kind,
        tier=tier_value(tier),  # type: ignore[arg-type,unused-ignore]
        source=source,
        topic=topic,
        tags=strings("tags", tags),
        embedding_model=embedding_model,
        token_cost=token_cost,
        source_memory_ids=strings("source_memory_ids", source_memory_ids),
    )
    if importance is not None:
        m.importance = importance
    if metadata:
        set_metadata(m.metadata, metadata)
    if embedding is not None:
        m.embedding.extend([float(x) for x in embedding])
    if create_time is not None:
        m.create_time.CopyFrom(timestamp(create_time))
    if expire_time is not None:
        m.expire_time.CopyFrom(timestamp(expire_time))
    return m


def build_filter(
    *,
    tiers: Iterable[int | str] = (),
    kinds: Iterable[str] = (),
    tags_any: Iterable[str] = (),
    tags_all: Iterable[str] = (),
    source: str = "",
    topic: str = "",
    created_after: TimeLike | None = None,
    created_before: TimeLike | None = None,
    where: str | Mapping[str, Any] | None = None,
) -> pb.MemoryFilter:
    f = pb.MemoryFilter(
        tiers=[tier_value(t) for t in strings("tiers", tiers)],  # type: ignore[misc,arg-type,unused-ignore]
        kinds=strings("kinds", kinds),
        tags_any=strings("tags_any", tags_any),
        tags_all=strings("tags_all", tags_all),
        source=source,
        topic=topic,
    )
    if created_after is not None:
        f.created_after.CopyFrom(timestamp(created_after))
    if created_before is not None:
        f.created_before.CopyFrom(timestamp(created_before))
    if where is not None:
        f.where = where if isinstance(where, str) else json.dumps(where)
    return f


FILTER_FIELDS = frozenset(inspect.signature(build_filter).parameters)
MEMORY_FIELDS = frozenset(inspect.signature(build_memory).parameters) - {"namespace", "content"}


def check_names(method: str, given: Iterable[str], accepted: Collection[str], where: str = "") -> None:
    """A TypeError for a keyword ``method`` does not take, worded as Python's own: forwarded
    ``**fields`` would otherwise fail inside a helper, naming it instead of the caller's method."""
    for name in given:
        if name not in accepted:
            close = difflib.get_close_matches(name, sorted(accepted), n=1)
            raise TypeError(
                f"{method}() got an unexpected keyword argument {name!r}{where}"
                + (f". Did you mean {close[0]!r}?" if close else "")
            )


def within(
    where: str | Mapping[str, Any] | None, since: TimeLike | None, until: TimeLike | None
) -> str | Mapping[str, Any] | None:
    """A ``where`` filter that also keeps create_time in [since, until) (``$and`` of both)."""
    bounds: dict[str, float] = {}
    if since is not None:
        bounds["$gte"] = seconds(since)
    if until is not None:
        bounds["$lt"] = seconds(until)
    if not bounds:
        return where
    in_range = {"create_time": bounds}
    if where is None or (isinstance(where, str) and not where.strip()):
        return in_range
    given: Any = where
    if isinstance(where, str):
        try:
            given = json.loads(where)
        except ValueError:
            return where  # the server rejects it, naming filter.where
    return {"$and": [given, in_range]}


def search_request(
    namespaces: str | Sequence[str],
    query: str | Sequence[float] | Any = None,
    *,
    embedding_model: str = "",
    limit: int = 10,
    min_similarity: float | None = None,
    alpha: float | None = None,
    beta: float | None = None,
    gamma: float | None = None,
    recency_tau_seconds: float | None = None,
    as_of: TimeLike | None = None,
    include_embedding: bool = False,
    strategy: int | str | None = None,
    tier_weights: Mapping[int | str, float] | None = None,
    include_ancestors: bool = False,
    scope_weights: Sequence[float] | None = None,
    read_only: bool = False,
    hybrid: bool = False,
    keywords: str | None = None,
    rrf_k: float | None = None,
    vector_weight: float | None = None,
    keyword_weight: float | None = None,
    explain: bool = False,
    **filter_fields: Any,
) -> pb.SearchMemoriesRequest:
    """The request of a search (``search``, each of ``search_many``'s, ``find_similar_debates``; the callers
    check the names of ``filter_fields``)."""
    req = pb.SearchMemoriesRequest(
        namespaces=[namespaces] if isinstance(namespaces, str) else list(namespaces),
        limit=limit,
        filter=build_filter(**filter_fields),
        include_embedding=include_embedding,
        embedding_model=embedding_model,
        strategy=strategy_value(strategy),  # type: ignore[arg-type,unused-ignore]
        include_ancestors=include_ancestors,
        scope_weights=[] if scope_weights is None else [float(w) for w in scope_weights],
        read_only=read_only,
        explain=explain,
    )
    _set_query(req, query, keywords)
    for tier, weight in (tier_weights or {}).items():
        req.tier_weights.add(tier=tier_value(tier), weight=weight)
    _set_hybrid(
        req,
        hybrid,
        keywords=keywords,
        rrf_k=rrf_k,
        vector_weight=vector_weight,
        keyword_weight=keyword_weight,
    )
    _set_given(
        req,
        min_similarity=min_similarity,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        recency_tau_seconds=recency_tau_seconds,
    )
    if as_of is not None:
        req.as_of.CopyFrom(timestamp(as_of))
    return req


# What a search takes besides timeout and call_metadata: search_request's arguments and the filters.
SEARCH_ARGS = (frozenset(inspect.signature(search_request).parameters) - {"filter_fields"}) | FILTER_FIELDS
