"""Connections, shared by ``MemoryClient`` and ``AsyncMemoryClient``: channel options (the retry
policy, quick reconnection), TLS credentials, the bearer token interceptors, the spreading of calls
over several connections, and the rules for making a call again and for waiting until the server
is ready."""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
import ssl
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from .errors import TLS_HINT, TiermemError, UnavailableError

CallMetadata = Sequence[tuple[str, str]]

_METADATA_KEY = re.compile(r"[0-9a-z_.-]+")


def checked_metadata(call_metadata: CallMetadata | None) -> list[tuple[str, Any]] | None:
    """``call_metadata`` as gRPC takes it: keys lower-cased (header names are case-insensitive;
    gRPC refused "X-Trace" as INTERNAL), and a key or value it would refuse a ValueError (a
    TypeError for the wrong type) naming it, before any call."""
    if call_metadata is None:
        return None
    if isinstance(call_metadata, str | bytes | Mapping):
        raise TypeError(
            f"call_metadata must be a list of (key, value) pairs, not {type(call_metadata).__name__}"
        )
    out = []
    for pair in call_metadata:
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"call_metadata holds {pair!r}: each entry is a (key, value) pair, the key a str")
        key, value = pair[0].lower(), pair[1]
        if not _METADATA_KEY.fullmatch(key) or key.startswith("grpc-"):
            raise ValueError(f"call_metadata key {pair[0]!r}: letters, digits, '-', '_' and '.', not grpc-")
        if key.endswith("-bin"):
            if not isinstance(value, bytes):
                raise TypeError(f"call_metadata {key!r}: a -bin key's value is bytes")
        elif not isinstance(value, str):
            raise TypeError(f"call_metadata {key!r}: the value is a str (bytes under a key ending -bin)")
        elif not (value.isascii() and value.isprintable()):
            raise ValueError(
                f"call_metadata {key!r}: the value is printable ASCII (encode others under -bin)"
            )
        out.append((key, value))
    return out


_RETRY_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [
                    {"service": "tiermem.v1.MemoryService", "method": m}
                    for m in (
                        "CreateMemory",
                        "BatchCreateMemories",
                        "GetMemory",
                        "UpdateMemory",
                        "ListMemories",
                        "SearchMemories",
                        "BatchSearchMemories",
                        "GetStats",
                        "ListNamespaces",
                        "GetNamespaceConfig",
                        "GetGraphNeighbors",
                    )  # not deletes or feedback: a retry after a lost reply would not repeat their result
                ],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "2s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


# Reconnect within 100 ms to 1 s of a server coming back (gRPC's default backoff grows to 2 min).
# ``min_reconnect_backoff_ms`` is the least time one connection attempt gets, not a backoff.
RECONNECT_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.min_reconnect_backoff_ms", 5000),
]

# Reasons of UNAVAILABLE errors for calls the server did not run (it was starting or stopping, or
# the scope is fenced or has moved during a shard move, docs/scaling.md, which lasts about a
# second): making them again is safe for every method.
_NOT_RUN = frozenset({"STARTING", "SHUTTING_DOWN", "SCOPE_FENCED", "SCOPE_MOVED"})

HEALTH_REQUEST = health_pb2.HealthCheckRequest(service="tiermem.v1.MemoryService")


# A connection that stops answering (a partition: no reset) fails its calls within about 30 s,
# streams included, which have no deadline; the server accepts pings this often (transport).
KEEPALIVE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    # (every ping's time to answer: in this gRPC the keepalive ping's too; a minute if not set)
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),  # (while only the server sends, as in an export)
    # A fixed 1 MiB receive window, no bandwidth probing (the two together: probing off alone
    # leaves 64 KiB). Probing opens 4 MiB or more at once and pings with the data; on a slow link
    # a probe's answer waited behind that window past the 10 s above, so an export, an import or
    # a replica's copy over 2 Mbit/s was cut after 10-20 s. A connection then moves about 1 MiB
    # a round trip, shared by its streams (up to 2 MiB while a large message arrives): about 20
    # MB/s at 50 ms, 7 at 150 ms. (An older grpcio fell back to 64 KiB here, grpc/grpc#39585;
    # the pinned 1.85.1 keeps 1 MiB.)
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", 1 << 20),
]


def channel_options(max_message_bytes: int, connections: int) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.service_config", _RETRY_CONFIG),
        ("grpc.enable_retries", 1),
        *RECONNECT_OPTIONS,
        *KEEPALIVE_OPTIONS,
    ]
    if connections > 1:  # channels with equal options would otherwise share one connection
        options.append(("grpc.use_local_subchannel_pool", 1))
    return options


def check_connections(connections: int, channel: object) -> None:
    if connections < 1 or (channel is not None and connections != 1):
        raise ValueError("connections must be >= 1, and 1 with a channel of your own")


_PEM = {
    "certificate": re.compile(rb"-----BEGIN CERTIFICATE-----"),
    "private key": re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----"),
}


def check_pem(what: str, data: bytes, kind: str = "certificate") -> bytes:
    """``data`` if it holds a PEM ``kind`` ("certificate" or "private key"), else ValueError naming
    ``what``: gRPC would only log its refusal and fail every call as if the server were down."""
    if not _PEM[kind].search(data):
        raise ValueError(f"{what}: holds no PEM {kind} (-----BEGIN ...-----)")
    return data


def check_target(target: str) -> str:
    if not target.strip():
        raise ValueError("target is empty: give the server's host:port")
    return target


def credentials(tls: bool | str | bytes | grpc.ChannelCredentials | None) -> grpc.ChannelCredentials | None:
    """The channel credentials ``tls`` means (None: no TLS): True trusts the system's certificate
    authorities, a path or PEM bytes that CA certificate, credentials are taken as they are."""
    if tls is False or tls is None:
        return None
    if isinstance(tls, grpc.ChannelCredentials):
        return tls
    if tls is True:
        return grpc.ssl_channel_credentials()
    pem = tls if isinstance(tls, bytes) else Path(tls).read_bytes()
    return grpc.ssl_channel_credentials(root_certificates=check_pem(f"tls {tls!r:.60}", pem))


def client_certificate(root: bytes | None, key: bytes, chain: bytes) -> grpc.ChannelCredentials:
    """TLS credentials presenting a client certificate (mutual TLS), trusting ``root`` (None: the
    system's certificate authorities): what ``tls=`` takes."""
    if root is not None:
        check_pem("root", root)
    return grpc.ssl_channel_credentials(
        root_certificates=root,
        private_key=check_pem("key", key, "private key"),
        certificate_chain=check_pem("chain", chain),
    )


def open_channel(target: str, options: list[tuple[str, Any]], tls: Any) -> grpc.Channel:
    check_target(target)
    creds = credentials(tls)
    if creds is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, creds, options=options)


def with_token(channel: grpc.Channel, api_key: str | None) -> grpc.Channel:
    """``channel`` adding ``api_key`` to every call, if there is one."""
    return grpc.intercept_channel(channel, _BearerToken(api_key)) if api_key else channel


def open_aio_channel(
    target: str,
    options: list[tuple[str, Any]],
    tls: Any,
    api_key: str | None,
    more: list[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel (of the running event loop) adding ``api_key`` to every call, if there is
    one, and with the ``more`` interceptors."""
    check_target(target)
    creds = credentials(tls)
    interceptors: list[grpc.aio.ClientInterceptor] = (
        [cls(api_key) for cls in (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)]
        if api_key
        else []
    ) + (more or [])
    if creds is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)


class _BearerToken(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds ``authorization: Bearer <token>`` to every call (health checks included)."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), self._header]
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(
        self,
        method: str,
        timeout: Any,
        metadata: Any,
        credentials: Any,
        wait_for_ready: Any,
        compression: Any,
    ) -> None:
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


class _AioBearerToken:
    """``_BearerToken`` for grpc.aio, which takes one interceptor object per kind of call."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), self._header)
        return details._replace(metadata=metadata)


class _AioUnaryUnary(_AioBearerToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioUnaryStream(_AioBearerToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _AioStreamUnary(_AioBearerToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _AioStreamStream(_AioBearerToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class Spread:
    """Stubs over several connections: each call (each method looked up) takes the next one."""

    def __init__(self, stubs: list[Any]) -> None:
        self._stubs = stubs
        self._turn = itertools.count()  # next() is atomic: threads may share the client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stubs[next(self._turn) % len(self._stubs)], name)


def one_stub(stubs: list[Any]) -> Any:
    return stubs[0] if len(stubs) == 1 else Spread(stubs)


MAX_TIMEOUT = 1e9  # seconds (about 31 years): gRPC fails a call at once past about 1e10


def check_timeout(timeout: float | None) -> None:
    """ValueError unless ``timeout`` is None (no deadline) or a positive number of seconds, at most
    ``MAX_TIMEOUT`` (a larger one, infinity included, would make every call fail at once and
    ``wait_ready`` wait for ever)."""
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT:  # (NaN too)
        raise ValueError(
            f"timeout must be a positive number of seconds up to {MAX_TIMEOUT:g} (None: no deadline),"
            f" not {timeout!r}"
        )


class Attempts:
    """The deadline of one call, and whether a failed attempt is made again: only a call the server
    did not run because it was starting or stopping, and only if it can be sent again (``again``:
    not a streamed upload, whose requests are consumed), after a pause of 50 ms doubling to 1 s,
    as long as the pause ends before the deadline."""

    def __init__(self, timeout: float | None, again: bool) -> None:
        check_timeout(timeout)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.again = again
        self._pause = 0.05

    def left(self) -> float | None:
        """Seconds left for the next attempt (None: no deadline)."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def pause_after(self, error: TiermemError) -> float:
        """How long to wait before the next attempt; raises ``error`` if there is none."""
        if not self.again or error.reason not in _NOT_RUN:
            raise error
        pause = self._pause
        if self.deadline is not None and time.monotonic() + pause >= self.deadline:
            raise error
        self._pause = min(2 * pause, 1.0)
        return pause


def _code(err: grpc.RpcError) -> grpc.StatusCode:
    return err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN


def with_tls_hint(why: str, plain_target: str | None) -> str:
    """``why`` a plaintext connection to ``plain_target`` failed, and TLS_HINT after it if the server
    there answers a TLS handshake (a TLS port reached without TLS only ever says the socket closed)."""
    if not why or plain_target is None or not _answers_tls(plain_target):
        return why
    return f"{why}; {TLS_HINT}"


def _answers_tls(target: str, timeout: float = 0.5) -> bool:
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:  # (not host:port: a unix socket, a dns:/// name)
        return False
    host = host.strip("[]")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # (any certificate: only asking)
    ctx.set_alpn_protocols(["h2"])
    try:
        addresses = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(timeout)
                sock.connect(address)
                with ctx.wrap_socket(sock, server_hostname=host or None):
                    return True
        except ssl.SSLError as e:
            # a TLS alert: it speaks TLS (and wants a client certificate, say)
            if "ALERT" in (e.reason or ""):
                return True
        except OSError:
            continue
    return False


def last_error(err: grpc.RpcError) -> str:
    return f"last error {_code(err).name}: {err.details() if hasattr(err, 'details') else err}"


def client_closed() -> TiermemError:
    """The error of a call made on a closed client (as of one under way when it closed)."""
    return TiermemError(grpc.StatusCode.CANCELLED, "the client is closed")


CHECK_SECONDS = 30.0  # the longest one health check waits: a wait without a deadline asks again


def ready_deadline(timeout: float | None) -> float:
    """When ``wait_ready(timeout)`` gives up (``timeout`` checked as a client's; None: never)."""
    check_timeout(timeout)
    return math.inf if timeout is None else time.monotonic() + timeout


class Readiness:
    """What ``wait_ready`` saw of one connection's health: ``Check`` answers and failures, the
    pause before asking again, and the error to raise once ``timeout`` (seconds) has passed."""

    def __init__(self, deadline: float, timeout: float | None) -> None:
        self.deadline, self.timeout = deadline, timeout
        self.last = ""
        self.answered = False
        self._pause = 0.02

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def check_timeout(self) -> float:
        """The deadline of the next health check: what is left, at most ``CHECK_SECONDS``."""
        return min(self.left(), CHECK_SECONDS)

    def failed(self, err: grpc.RpcError) -> None:
        if _code(err) != grpc.StatusCode.DEADLINE_EXCEEDED or not self.last:  # time ran out: keep the cause
            self.last = last_error(err)

    def serving(self, status: int) -> bool:
        """Whether ``status``, an answer, is SERVING."""
        self.answered = True
        if status == health_pb2.HealthCheckResponse.SERVING:
            return True
        self.last = f"last status {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}"  # type: ignore[arg-type,unused-ignore]
        return False

    def pause(self) -> float:
        pause = max(0.0, min(self._pause, self.left()))
        self._pause = min(2 * self._pause, 0.5)
        return pause

    def not_ready(self, unreachable: str = "") -> UnavailableError:
        """The error once time ran out; ``unreachable``: why a call that did not wait for the
        connection failed (a call waiting for the connection only learns that time ran out)."""
        last = unreachable or self.last
        return UnavailableError(
            grpc.StatusCode.UNAVAILABLE,
            f"server not ready after {self.timeout or 0:g} s: {last or 'no answer'}",
        )
