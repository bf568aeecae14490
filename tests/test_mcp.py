"""The MCP server (``python -m tiermem.mcp``) end to end: a real tiermem server, the MCP server as a
subprocess, and the official SDK's own clients over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from tiermem.client import MemoryClient
from tiermem.mcp import build_server
from tiermem.mcp.__main__ import parse_args
from tiermem.server.security.keys import add_key
from tiermem.server.transport.app import RunningServer

NAMESPACE = "agent:test"
HTTP = ("--timeout", "10", "--transport", "streamable-http", "--port")
TOOLS = {"remember", "recall", "build_context", "forget", "reflect", "namespaces"}


def _run(make: Callable[[], Awaitable[None]], timeout: float = 30.0) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(make(), timeout)

    asyncio.run(bounded())


@contextlib.asynccontextmanager
async def _stdio(
    target: str, errlog: Path, *extra: str, env: dict[str, str] | None = None
) -> AsyncIterator[ClientSession]:
    """An SDK client session with ``python -m tiermem.mcp`` spawned over stdio (its stderr in ``errlog``)."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tiermem.mcp", "--target", target, "--namespace", NAMESPACE, "--timeout", "10", *extra],
        env=env,
    )
    with errlog.open("a") as err:
        async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def _call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test, quoting the text, if the call is an error."""
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert not result.is_error, f"{tool}: {_text(result)}"
    assert result.structured_content is not None
    return result.structured_content


async def _error(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of a tool call that must fail as an MCP tool error (not a protocol error or a crash)."""
    result = await session.call_tool(tool, arguments)
    assert isinstance(result, CallToolResult)
    assert result.is_error, f"{tool} succeeded: {result.structured_content}"
    return _text(result)


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _ids(recalled: dict[str, Any]) -> list[str]:
    return [r["memory"]["id"] for r in recalled["results"]]


def test_stdio_tools_remember_recall_context_reflect_forget(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    running = server_factory()
    errlog = tmp_path / "mcp.stderr"

    async def scenario() -> None:
        async with _stdio(f"127.0.0.1:{running.port}", errlog) as s:
            listed = {t.name: t for t in (await s.list_tools()).tools}
            assert set(listed) == TOOLS
            for tool in listed.values():
                assert tool.description and tool.input_schema["type"] == "object"
            remember = listed["remember"].input_schema
            assert remember["required"] == ["content"]
            assert {"content", "kind", "importance", "tags", "metadata", "namespace"} <= set(
                remember["properties"]
            )
            assert remember["properties"]["content"]["type"] == "string"
            assert remember["properties"]["content"]["description"]
            assert {"query", "limit", "namespaces", "tags_any"} <= set(
                listed["recall"].input_schema["properties"]
            )
            assert listed["remember"].output_schema is not None

            pref = await _call(
                s,
                "remember",
                content="Ana prefers short answers about the billing report",
                kind="preference",
                tags=["billing"],
                metadata={"ticket": 1432, "urgent": True},
                tier="slow",
            )
            assert pref["namespace"] == NAMESPACE and pref["kind"] == "preference" and pref["id"]
            event = await _call(s, "remember", content="The nightly report job failed with a DB timeout")
            assert event["kind"] == "observation" and 0 <= event["importance"] <= 1

            found = await _call(s, "recall", query="how does Ana like her answers", limit=5)
            assert found["namespaces"] == [NAMESPACE]
            top = found["results"][0]
            assert top["memory"]["id"] == pref["id"]
            assert {"score", "relevance", "recency", "importance"} <= set(top)
            assert top["memory"]["tags"] == ["billing"]
            assert top["memory"]["tier"] == "slow"  # (spelled as remember takes it)
            assert top["memory"]["metadata"] == {"ticket": 1432, "urgent": True}
            assert isinstance(top["memory"]["create_time"], float)
            assert "embedding" not in top["memory"]
            assert _ids(await _call(s, "recall", query="answers", tags_any=["nothing-like-it"])) == []

            ctx = await _call(s, "build_context", query="Ana billing answers", token_budget=400)
            assert "Ana prefers short answers about the billing report" in ctx["text"]
            assert 0 < ctx["tokens_used"] <= 400
            assert pref["id"] in {i["memory_id"] for sec in ctx["sections"] for i in sec["items"]}
            assert all(sec["items"] for sec in ctx["sections"])

            material = await _call(s, "reflect")
            assert [m["id"] for m in material["observations"]] == [event["id"]]
            assert material["threshold"] > 0 and material["reflection_due"] is False
            stored = await _call(
                s, "reflect", insight="Report jobs time out by day", source_memory_ids=[event["id"]]
            )
            assert stored["stored"]["kind"] == "reflection"
            assert stored["stored"]["source_memory_ids"] == [event["id"]]
            assert stored["observations"] == [] and stored["accumulated_importance"] == 0

            other = await _call(
                s, "remember", content="Ben owns the deploy pipeline", namespace="agent:other"
            )
            assert other["namespace"] == "agent:other"
            assert _ids(await _call(s, "recall", query="deploy pipeline", namespaces=["agent:other"])) == [
                other["id"]
            ]
            spaces = await _call(s, "namespaces")
            assert spaces["default"] == NAMESPACE
            counts = {n["name"]: n["memory_count"] for n in spaces["namespaces"]}
            assert counts == {NAMESPACE: 3, "agent:other": 1}

            assert await _call(s, "forget", id=pref["id"]) == {
                "id": pref["id"],
                "namespace": NAMESPACE,
                "deleted": True,
            }
            assert pref["id"] not in _ids(await _call(s, "recall", query="how does Ana like her answers"))

            # Refusals come back as tool errors naming the reason, and the server keeps serving.
            missing = await _error(s, "forget", id=pref["id"])
            assert "MEMORY_NOT_FOUND" in missing and "NOT_FOUND" in missing
            empty = await _error(s, "remember", content="")
            assert (
                "INVALID_ARGUMENT" in empty and "memory.content" in empty and empty.count("is required") == 1
            )
            assert "importance" in await _error(s, "remember", content="x", importance=2)
            assert "Unknown tool" in await _error(s, "no_such_tool")
            assert (await _call(s, "namespaces"))["default"] == NAMESPACE

    try:
        _run(scenario)
    finally:
        print(errlog.read_text() if errlog.exists() else "", file=sys.stderr)


# A line that is not a JSON-RPC message, and the (code, id) of the JSON-RPC error answering it.
MALFORMED: list[tuple[str, int, object]] = [
    ("{not json", -32700, None),
    ('"\\ud800"', -32700, None),  # an escaped lone surrogate: no Unicode text
    ('{"jsonrpc":"2.0","id":7}', -32600, 7),  # no method
    ('{"jsonrpc":"1.0","id":"v1","method":"ping"}', -32600, "v1"),
    ('[{"jsonrpc":"2.0","id":8,"method":"ping"}]', -32600, None),  # a batch: not MCP
    ('"ping"', -32600, None),
    ('{"jsonrpc":"2.0","id":true}', -32600, None),  # a bool is no id
    ("{" + "x" * 1_000_000, -32700, None),  # a megabyte the error must not echo
]


class _Lines:
    """A subprocess's stdout, a line at a time, each read bounded by ``timeout`` seconds."""

    def __init__(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._timeout = timeout
        threading.Thread(target=self._read, args=(proc.stdout,), daemon=True).start()

    def _read(self, out: Any) -> None:
        with contextlib.suppress(ValueError, OSError):  # closed once the test is done
            for line in out:
                self._lines.put(line)

    def next(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=self._timeout)
        except queue.Empty:
            raise AssertionError(f"no reply within {self._timeout} s") from None
        reply: dict[str, Any] = json.loads(line)
        return reply


def test_stdio_answers_malformed_lines_with_json_rpc_errors_and_keeps_serving(
    server: RunningServer, tmp_path: Path
) -> None:
    errlog = tmp_path / "mcp.stderr"
    with errlog.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tiermem.mcp", "--target", f"127.0.0.1:{server.port}", "--timeout", "10"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    assert proc.stdin is not None
    stdin = proc.stdin

    def send(line: str | dict[str, Any]) -> None:
        text = line if isinstance(line, str) else json.dumps(line)
        stdin.write(text.encode() + b"\n")
        stdin.flush()

    try:
        replies = _Lines(proc)
        for line, code, request_id in MALFORMED:
            send("")  # a blank line is no message: nothing answers it
            send(line)
            reply = replies.next()
            assert reply["jsonrpc"] == "2.0" and "result" not in reply, (line[:60], reply)
            assert (reply["error"]["code"], reply["id"]) == (code, request_id), (line[:60], reply)
            assert 0 < len(reply["error"]["message"]) < 300, reply  # never the line echoed

        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": LATEST_HANDSHAKE_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "test", "version": "0"},
                },
            }
        )
        initialized = replies.next()
        assert initialized["id"] == 1, initialized
        assert initialized["result"]["protocolVersion"] == LATEST_HANDSHAKE_VERSION
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send("{oops")
        assert replies.next()["error"]["code"] == -32700
        send({"jsonrpc": "2.0", "id": "tools", "method": "tools/list"})
        listed = replies.next()
        assert listed["id"] == "tools", listed
        assert {t["name"] for t in listed["result"]["tools"]} == TOOLS
        assert proc.poll() is None
    finally:
        stdin.close()
        _reap(proc)
        assert proc.stdout is not None
        proc.stdout.close()
        print(errlog.read_text(), file=sys.stderr)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _http_server(target: str, port: int, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m tiermem.mcp --transport streamable-http`` on ``port``, once it accepts connections."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tiermem.mcp",
                "--target",
                target,
                "--namespace",
                NAMESPACE,
                *HTTP,
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"the MCP server exited:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"the MCP server did not listen:\n{log.read_text()}"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Wait up to 10 s for ``proc`` to exit, then kill it."""
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_streamable_http_serves_the_tools(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    running = server_factory()
    port = _free_port()

    async def scenario() -> None:
        url = f"http://127.0.0.1:{port}/mcp"
        async with streamable_http_client(url) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            assert {t.name for t in (await s.list_tools()).tools} == TOOLS
            kept = await _call(s, "remember", content="The staging database lives in eu-west-1", kind="fact")
            found = await _call(s, "recall", query="where is the staging database")
            assert _ids(found)[0] == kept["id"]
            assert "MEMORY_NOT_FOUND" in await _error(s, "forget", id="no-such-id")

    with _http_server(f"127.0.0.1:{running.port}", port, tmp_path / "mcp.log") as proc:
        _run(scenario)
        assert proc.poll() is None
    with MemoryClient(f"127.0.0.1:{running.port}") as c:
        assert [m.content for m in c.list_memories(NAMESPACE)] == ["The staging database lives in eu-west-1"]


def test_api_keys_from_the_flag_or_the_environment_and_a_wrong_key_is_a_tool_error(
    server_factory: Callable[..., RunningServer], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.jsonl"
    token = add_key(keys, [NAMESPACE], "write")
    running = server_factory(api_keys=str(keys))
    target = f"127.0.0.1:{running.port}"
    errlog = tmp_path / "mcp.stderr"

    async def scenario() -> None:
        async with _stdio(target, errlog, "--api-key", token) as s:
            kept = await _call(s, "remember", content="Keys are rotated every quarter")
            assert _ids(await _call(s, "recall", query="key rotation")) == [kept["id"]]
            outside = await _error(s, "remember", content="elsewhere", namespace="agent:elsewhere")
            assert "PERMISSION_DENIED" in outside
        async with _stdio(target, errlog, env={"TIERMEM_API_KEY": token}) as s:
            assert (await _call(s, "recall", query="key rotation"))["results"]
        async with _stdio(target, errlog, "--api-key", "tm_000000000000_wrong") as s:
            wrong = await _error(s, "remember", content="Keys are rotated every quarter")
            assert "API_KEY_INVALID" in wrong and "UNAUTHENTICATED" in wrong
            assert "UNAUTHENTICATED" in await _error(s, "recall", query="key rotation")
        async with _stdio(target, errlog) as s:
            assert "API_KEY_MISSING" in await _error(s, "namespaces")

    try:
        _run(scenario, timeout=60)
    finally:
        print(errlog.read_text() if errlog.exists() else "", file=sys.stderr)


def test_without_a_default_namespace_a_call_must_name_one(client: MemoryClient) -> None:
    async def scenario() -> None:
        async with Client(build_server(client)) as c:
            result = await c.call_tool("remember", {"content": "no scope"})
            assert result.is_error and "no namespace" in _text(result)
            named = await c.call_tool("remember", {"content": "a scope", "namespace": "agent:named"})
            assert not named.is_error and named.structured_content
            assert named.structured_content["namespace"] == "agent:named"
            spaces = await c.call_tool("namespaces", {})
            assert spaces.structured_content == {
                "default": None,
                "namespaces": [{"name": "agent:named", "memory_count": 1}],
                "truncated": False,
            }

    _run(scenario)


def test_an_unreachable_tiermem_is_a_tool_error() -> None:
    with MemoryClient(f"127.0.0.1:{_free_port()}", timeout=1) as unreachable:

        async def scenario() -> None:
            async with Client(build_server(unreachable, namespace=NAMESPACE)) as c:
                result = await c.call_tool("recall", {"query": "anything"})
                assert result.is_error and "DEADLINE_EXCEEDED" in _text(result)

        _run(scenario)


def test_the_http_endpoint_stays_on_loopback_unless_told_otherwise() -> None:
    assert parse_args(["--target", "t", "--transport", "streamable-http", "--host", "::1"]).host == "::1"
    with pytest.raises(SystemExit):
        parse_args(["--target", "t", "--transport", "streamable-http", "--host", "0.0.0.0"])
    assert parse_args(["--target", "t", "--transport", "streamable-http", "--host", "0.0.0.0", "--insecure"])


def test_out_of_range_arguments_are_tool_errors_naming_what_is_wrong(client: MemoryClient) -> None:
    async def scenario() -> None:
        async with Client(build_server(client, namespace="agent:x")) as c:
            result = await c.call_tool("build_context", {"token_budget": 2**31})
            assert result.is_error and "token_budget" in _text(result), _text(result)
            result = await c.call_tool("remember", {"content": "big", "metadata": {"n": 2**70}})
            assert result.is_error and "metadata['n']" in _text(result), _text(result)
            assert client.stats().memory_count == 0

    _run(scenario)


def test_numbers_and_flags_of_another_json_type_are_tool_errors(client: MemoryClient) -> None:
    """A flag given for a number (true for an importance or a count) or anything but a flag for a
    flag ("yes") is a tool error naming the argument, not read as 1 or true; a number as models
    send one (2, 2.0, "2") is read as the number."""

    async def scenario() -> None:
        async with Client(build_server(client, namespace="agent:x")) as c:
            (recall,) = [t for t in (await c.list_tools()).tools if t.name == "recall"]
            limit = recall.input_schema["properties"]["limit"]  # (the bounds stay in the schema)
            assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 100)
            for tool, args, name in (
                ("remember", {"content": "c", "importance": True}, "importance"),
                ("recall", {"query": "q", "include_ancestors": "yes"}, "include_ancestors"),
                ("recall", {"query": "q", "limit": True}, "limit"),
                ("build_context", {"token_budget": False}, "token_budget"),
            ):
                result = await c.call_tool(tool, args)
                assert result.is_error and name in _text(result), (tool, args, _text(result))
            assert client.stats().memory_count == 0
            ok = await c.call_tool("remember", {"content": "c", "importance": 1})
            assert not ok.is_error and ok.structured_content and ok.structured_content["importance"] == 1.0
            for limit in (2, 2.0, "2"):  # (a number as models send one)
                ok = await c.call_tool("recall", {"query": "c", "limit": limit, "include_ancestors": False})
                assert not ok.is_error, (limit, _text(ok))

    _run(scenario)


def test_an_argument_a_tool_does_not_take_is_a_tool_error_and_changes_nothing(client: MemoryClient) -> None:
    """A misspelled namespace must not land the memory in the default namespace."""

    async def scenario() -> None:
        async with Client(build_server(client, namespace="agent:default")) as c:
            listed = await c.list_tools()
            assert all(t.input_schema.get("additionalProperties") is False for t in listed.tools)
            result = await c.call_tool("remember", {"content": "for bob", "namepsace": "user:bob"})
            text = _text(result)
            assert result.is_error and "'namepsace'" in text and "namespace" in text.split("takes:")[1], text
            result = await c.call_tool("recall", {"query": "bob", "top_k": 3, "limit": 2})
            assert result.is_error and "'top_k'" in _text(result) and "'limit'" not in _text(result)
            assert client.stats().memory_count == 0
            ok = await c.call_tool("remember", {"content": "for bob", "namespace": "user:bob"})
            assert (
                not ok.is_error and ok.structured_content and ok.structured_content["namespace"] == "user:bob"
            )

    _run(scenario)


@pytest.mark.parametrize(
    "package,extra", [("mcp", "tiermem.mcp"), ("langgraph", "tiermem.langgraph")], ids=["mcp", "langgraph"]
)
def test_an_integration_without_its_framework_says_which_extra_to_install(package: str, extra: str) -> None:
    """Installed without the extra (simulated: the framework's import made to fail), the import
    names the pip extra instead of a bare ModuleNotFoundError deep inside."""
    code = f"import sys; sys.modules[{package!r}] = None; import {extra}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert f"pip install 'tiermem[{package}]'" in out.stderr.strip().splitlines()[-1]
