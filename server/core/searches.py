"""The engine's search entry points: a follower catches up first; a batch's searches run side by
side on the batch threads and their side effects (accesses, hit counts) happen only if all
succeed."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from tiermem.server.core import access
from tiermem.server.core.follow import catch_up
from tiermem.server.core.state import EngineState
from tiermem.server.model.errors import InvalidArgument, TiermemError
from tiermem.server.search.query import SearchHit, SearchQuery
from tiermem.server.search.searcher import Searcher

Wanted = Callable[[], bool] | None


def search(
    st: EngineState, searcher: Searcher, q: SearchQuery, include_embedding: bool, wanted: Wanted, record: bool
) -> list[SearchHit]:
    """``record``: the hits count as accessed now; else the caller records them (``record_hits``)
    once its answer is sure to be sent."""
    if st.following:
        catch_up(st)
    hits = searcher.search(q, include_embedding, wanted)
    return access.record_hits(st, q, hits) if record else hits


def search_many(
    st: EngineState,
    searcher: Searcher,
    pool: ThreadPoolExecutor,
    queries: list[tuple[SearchQuery, bool]],
    wanted: Wanted,
    record: bool,
) -> list[list[SearchHit]]:
    """Several searches, side by side on ``pool``. A failure fails the call: the first by position
    (the searches after it that have not started are cancelled). ``record`` as in ``search``."""
    if st.following:
        catch_up(st)
    outcomes = _run_all(searcher, pool, queries, wanted)
    results: list[list[SearchHit]] = []
    for i, out in enumerate(outcomes):
        if isinstance(out, InvalidArgument):
            raise out.within(f"searches[{i}].") from None
        if isinstance(out, TiermemError):  # (NOT_FOUND of a space, say: which search)
            out.message = f"searches[{i}]: {out.message}"
            raise out
        if isinstance(out, BaseException):
            raise out
        results.append(out)
    if record:
        for (q, _), hits in zip(queries, results, strict=True):
            access.record_hits(st, q, hits)
    return results


def _run_all(
    searcher: Searcher, pool: ThreadPoolExecutor, queries: list[tuple[SearchQuery, bool]], wanted: Wanted
) -> list[list[SearchHit] | BaseException]:
    """Each search's hits or error, up to the first error."""
    outcomes: list[list[SearchHit] | BaseException] = []
    if len(queries) == 1:
        try:
            outcomes.append(searcher.search(queries[0][0], queries[0][1], wanted))
        except Exception as e:
            outcomes.append(e)
        return outcomes
    futures = [pool.submit(searcher.search, q, inc, wanted) for q, inc in queries]
    for i, f in enumerate(futures):
        err = f.exception()
        outcomes.append(err if err is not None else f.result())
        if err is not None:  # the call fails: the searches not started yet need not run
            for later in futures[i + 1 :]:
                later.cancel()
            break
    return outcomes
