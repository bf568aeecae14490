"""The stdio transport, answering malformed lines: the SDK's ``stdio_server()`` hands a line that is
not a JSON-RPC message to the server as a pydantic ``ValidationError``, which the SDK only logs, so
the client would wait for its own timeout. Here such a line gets the JSON-RPC 2.0 error it calls
for: -32700 (parse error, id null) for invalid JSON, -32600 (invalid request) otherwise, with the
line's id when it has a usable one."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import TYPE_CHECKING

import anyio
from mcp.server.lowlevel import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import INVALID_REQUEST, PARSE_ERROR, ErrorData, JSONRPCError
from pydantic import ValidationError

if TYPE_CHECKING:  # (typing.Self is Python 3.11+; the package supports 3.10)
    import contextvars
    from typing import Self

    from mcp.shared._stream_protocols import ReadStream, WriteStream

_DETAIL_CHARS = 200  # of pydantic's description: never the line itself, which may be megabytes


def error_for(exc: ValidationError) -> JSONRPCError | None:
    """The JSON-RPC error answering the line ``exc`` rejected; None for a blank (empty or
    whitespace-only) line, which holds no message to answer."""
    errors = exc.errors(include_url=False, include_context=False, include_input=True)
    first = errors[0] if errors else None
    if first is not None and first["type"] == "json_invalid":
        if isinstance(first["input"], str) and not first["input"].strip():
            return None
        return _error(None, PARSE_ERROR, "Parse error", first["msg"])
    request_id: str | int | None = None
    for error in errors:
        found = error["input"].get("id") if isinstance(error["input"], dict) else None
        if isinstance(found, str) or (isinstance(found, int) and not isinstance(found, bool)):
            request_id = found
            break
    detail = f"{'.'.join(map(str, first['loc']))}: {first['msg']}" if first is not None else None
    return _error(request_id, INVALID_REQUEST, "Invalid Request", detail)


def _error(request_id: str | int | None, code: int, message: str, detail: str | None) -> JSONRPCError:
    if detail:
        message = f"{message}: {detail[:_DETAIL_CHARS]}"
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


class AnsweringReadStream:
    """The SDK's read stream (its ``ReadStream`` protocol) that answers each ``ValidationError`` item
    on ``write`` and reads on; other items, exceptions included, pass through."""

    def __init__(
        self, inner: ReadStream[SessionMessage | Exception], write: WriteStream[SessionMessage]
    ) -> None:
        self._inner = inner
        self._write = write

    @property
    def last_context(self) -> contextvars.Context | None:
        # The sender's context of the last item, which the SDK's dispatcher runs handlers in.
        context: contextvars.Context | None = getattr(self._inner, "last_context", None)
        return context

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item = await self._inner.receive()
            if not isinstance(item, ValidationError):
                return item
            reply = error_for(item)
            if reply is None:
                continue
            # A closed write stream means the server is closing: nobody is left to answer.
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await self._write.send(SessionMessage(reply))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> bool | None:
        await self.aclose()
        return None


def run_stdio(server: MCPServer) -> None:
    """Serve ``server`` over stdin/stdout (as ``server.run("stdio")``), answering malformed lines."""
    # MCPServer.run_stdio_async takes no streams, so serve its low-level server the way it does,
    # through our read stream; an SDK without that private attribute gets the plain transport.
    low = getattr(server, "_lowlevel_server", None)
    if not isinstance(low, Server):
        server.run("stdio")
        return

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await low.run(AnsweringReadStream(read, write), write, low.create_initialization_options())

    anyio.run(serve)
