"""The store's operations written once for ``MemoryClient`` and ``AsyncMemoryClient``: each is a
generator of *steps* that yields the calls it needs and is sent each one's result back (or has its
exception thrown in, where ``try``/``except`` around the ``yield`` catches it).

- ``Call(method, *args, **kwargs)``: one call of that client method; its result comes back.
  ``Call.listing(...)``: a method that returns an iterator (``list_namespaces``, ``list_memories``):
  its items come back as a list.
- ``All(parts)``: several steps that do not depend on each other; the list of their results comes
  back, or the first failure (in the parts' order) is thrown in.

``run`` drives steps with a ``MemoryClient``, in order. ``arun`` drives them on an event loop, each
call through ``perform`` (``perform_async``: an ``AsyncMemoryClient``'s method), the parts of an
``All`` concurrently (``CONCURRENCY`` at a time)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tiermem.client import AsyncMemoryClient, MemoryClient

T = TypeVar("T")
CONCURRENCY = 64  # parts of an All under way at once on an event loop


@dataclass(frozen=True)
class Call:
    """One call of a client method (the same name and arguments on both clients)."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    items: bool = False  # the method returns an iterator: its items, as a list, are the result

    @classmethod
    def to(cls, method: str, *args: Any, **kwargs: Any) -> Call:
        return cls(method, args, kwargs)

    @classmethod
    def listing(cls, method: str, *args: Any, **kwargs: Any) -> Call:
        return cls(method, args, kwargs, items=True)


@dataclass(frozen=True)
class All:
    """Steps independent of each other, run together."""

    parts: Sequence[Steps[Any]]


Steps = Generator[Call | All, Any, T]


def one(call: Call) -> Steps[Any]:
    """Steps of a single call: its result."""
    return (yield call)


def perform(client: MemoryClient, call: Call) -> Any:
    result = getattr(client, call.method)(*call.args, **call.kwargs)
    return list(result) if call.items else result


async def perform_async(client: AsyncMemoryClient, call: Call) -> Any:
    method = getattr(client, call.method)
    if call.items:
        return [item async for item in method(*call.args, **call.kwargs)]
    return await method(*call.args, **call.kwargs)


def run(steps: Steps[T], client: MemoryClient) -> T:
    """The result of ``steps``, their calls made one after another with ``client``."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Call):
                    result = perform(client, request)
                else:
                    result = [run(part, client) for part in request.parts]
            except Exception as e:
                request = steps.throw(e)
            else:
                request = steps.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()


async def arun(steps: Steps[T], perform: Callable[[Call], Awaitable[Any]]) -> T:
    """The result of ``steps`` on the running event loop, each call made by ``perform``."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Call):
                    result = await perform(request)
                else:
                    result = await _together(request.parts, perform)
            except Exception as e:
                request = steps.throw(e)
            else:
                request = steps.send(result)
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()


async def _together(parts: Sequence[Steps[Any]], perform: Callable[[Call], Awaitable[Any]]) -> list[Any]:
    results: list[Any] = []
    for i in range(0, len(parts), CONCURRENCY):
        done = await asyncio.gather(
            *(arun(part, perform) for part in parts[i : i + CONCURRENCY]), return_exceptions=True
        )
        for outcome in done:
            if isinstance(outcome, BaseException):
                raise outcome  # the first failure in order (the others ran to their end)
        results.extend(done)
    return results
