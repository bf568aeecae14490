"""Process plumbing shared by the server (app.py) and its search followers (follower.py): the gRPC
server with its health and reflection services, stop signals, and the memory settings of a
long-running process."""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tiermem.client.connection import KEEPALIVE_OPTIONS
from tiermem.server.config import ServerConfig, UnusableSetting
from tiermem.server.embedding import providers
from tiermem.server.security.keys import KeyRing
from tiermem.server.security.limits import Admission, KeyLimits
from tiermem.server.security.models import ModelRule
from tiermem.server.security.shared_rates import SharedRates
from tiermem.server.transport.auth import AuthInterceptor
from tiermem.server.transport.metrics import Metrics
from tiermem.server.transport.routing import RoutingOf, WriteGate
from tiermem.v1 import memory_pb2

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name
logger = logging.getLogger(__name__)
_T = TypeVar("_T")
# How long a stopping server waits for cancelled calls to leave their handlers (a part of an
# export's spool, a search, a write waiting on its commit: well under a second each).
HANDLERS_LEAVE_SECONDS = 30.0


class HandlerPool(futures.ThreadPoolExecutor):
    """gRPC's handler threads, counted. A stopped gRPC server reports itself stopped once it has
    cancelled its calls, while their handlers may still be running in these threads: the engine
    closes only after they have left (an export spooling or a search reading LMDB would otherwise
    meet a closed environment)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="tiermem-rpc")
        self._busy = 0
        self._idle = threading.Condition()

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> futures.Future[_T]:
        with self._idle:
            self._busy += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._left()
            raise
        future.add_done_callback(self._left)  # (also when a queued call is dropped by drain)
        return future

    @property
    def busy(self) -> int:
        """Calls in (or queued for) a handler."""
        return self._busy

    def _left(self, _future: object = None) -> None:
        with self._idle:
            self._busy -= 1
            if self._busy == 0:
                self._idle.notify_all()

    def drain(self, timeout: float) -> bool:
        """Once the server has stopped: drop the calls still queued, wait up to ``timeout`` s for
        those running to leave their handlers; False if some are still there."""
        self.shutdown(wait=False, cancel_futures=True)
        with self._idle:
            if self._idle.wait_for(lambda: self._busy == 0, timeout):
                return True
            logger.warning(
                "%d calls still in their handlers %.0f s after the server stopped; closing all the same",
                self._busy,
                timeout,
            )
            return False


def _model_rule(config: ServerConfig, stored_space: Callable[[str], bool] | None) -> ModelRule:
    """Which embedding models keys for part of the namespaces may name (security/models.py)."""
    return ModelRule(
        frozenset(config.declared_spaces),
        providers.space_of(config.embedder, config.embedder_model, config.builtin_model),
        config.embedder == "builtin",
        stored_space or (lambda model: False),
    )


def grpc_server(
    config: ServerConfig,
    pool: HandlerPool,
    reuseport: bool,
    exempt: tuple[str, ...] = (),
    metrics: Metrics | None = None,
    routing_of: RoutingOf | None = None,
    gate: WriteGate | None = None,
    is_replica: Callable[[], bool] | None = None,
    after_write: Callable[[], None] | None = None,
    replica_copying: Callable[[], bool] | None = None,
    private_secret: str = "",
    stored_space: Callable[[str], bool] | None = None,
    stopping: Callable[[], bool] = lambda: False,
    rates: SharedRates | None = None,
) -> grpc.Server:
    """A gRPC server with the configured handler threads, message sizes and the interceptor that
    admits, authenticates and authorizes every call but the ``exempt`` methods (auth.py); ``rates``:
    the keys' rates shared with the other processes serving the port (search followers)."""
    keys = KeyRing(Path(config.api_keys)) if config.api_keys else None
    interceptor = AuthInterceptor(
        keys,
        # A call cancelled while queued never runs its handler: its share comes back after 30 s.
        Admission(config.max_concurrent_rpcs, config.monitoring_reserved_rpcs, lease_seconds=30.0),
        # By default one key may keep at most half the handler threads busy.
        KeyLimits(
            config.key_max_concurrent_rpcs or max(1, config.max_workers // 2),
            config.key_rate_per_second,
            config.key_burst,
            rates,
        ),
        exempt,
        metrics,
        sharded=config.sharded,
        routing_of=routing_of,
        gate=gate,
        is_replica=is_replica,
        after_write=after_write,
        replica_copying=replica_copying,
        private_secret=private_secret,
        models=_model_rule(config, stored_space) if keys is not None else None,
        stopping=stopping,
    )
    interceptors: list[grpc.ServerInterceptor] = [interceptor]
    tracing = _tracing_interceptor() if config.tracing else None
    if tracing is not None:
        interceptors.insert(0, tracing)
    return grpc.server(
        pool,
        interceptors=interceptors,
        # The interceptor sheds past max_concurrent_rpcs, keeping a share for health and stats;
        # gRPC's own cap (which refuses every method alike) only past twice that.
        maximum_concurrent_rpcs=2 * config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", int(reuseport)),
            # Clients' keepalive pings (every 20 s, client/connection.py) are welcome even while
            # the server sends nothing, as in a long import: gRPC's default (5 min) would count
            # them as strikes and close the connection.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
            # A peer that stops answering (a partition, not a reset) while a stream waits on it, a
            # replica's feed say, is found in about 30 s instead of TCP's 15 minutes: its call
            # ends and frees its handler thread and the commit log it held.
            *KEEPALIVE_OPTIONS,  # (the clients' own: every 20 s, 10 s to answer; a 1 MiB window)
        ],
    )


def _tracing_interceptor() -> grpc.ServerInterceptor | None:
    """OpenTelemetry's gRPC server interceptor over the global tracer provider (configured by the
    operator: ``opentelemetry-instrument``, or the SDK in an embedding process): a span a call,
    joined to the caller's trace when it sends one (``traceparent``). None when gRPC's servers are
    instrumented already (``opentelemetry-instrument`` does it): a second would trace each call twice."""
    try:
        from opentelemetry.instrumentation.grpc import GrpcInstrumentorServer, server_interceptor
    except ImportError:
        raise UnusableSetting(
            "setting tracing=True needs OpenTelemetry: pip install 'tiermem[tracing]'"
        ) from None
    if GrpcInstrumentorServer().is_instrumented_by_opentelemetry:
        logger.info("tracing: gRPC's servers are instrumented already; no second interceptor")
        return None
    return server_interceptor()


def bind(server: grpc.Server, address: str, config: ServerConfig) -> int:
    """Listen on ``address`` with TLS when a certificate is configured (mutual TLS with a client CA);
    returns the port (0: the bind failed)."""
    try:
        return _bind(server, address, config)
    except RuntimeError:  # (newer grpcio raises "Failed to bind" instead of returning 0)
        return 0


def _bind(server: grpc.Server, address: str, config: ServerConfig) -> int:
    if not config.tls_cert:
        return server.add_insecure_port(address)
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    creds = grpc.ssl_server_credentials(
        [(Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())],
        root_certificates=ca,
        require_client_auth=ca is not None,
    )
    return server.add_secure_port(address, creds)


def add_health_and_reflection(server: grpc.Server, serving: bool) -> health.HealthServicer:
    """grpc.health.v1 (overall and for the MemoryService) and server reflection on ``server``."""
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    set_serving(health_servicer, serving)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    return health_servicer


def set_serving(health_servicer: health.HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, status)


def tune_malloc(mmap_threshold: int) -> bool:
    """Fix glibc's mmap threshold for this process (see ``ServerConfig.malloc_mmap_threshold``):
    blocks of at least this size are mapped on their own and returned to the system when freed.
    Returns whether it was set (False: 0, or not glibc)."""
    if mmap_threshold <= 0:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # glibc malloc.h
    return bool(mallopt(ctypes.c_int(m_mmap_threshold), ctypes.c_int(mmap_threshold)))


def freeze_startup_objects() -> int:
    """Move every object alive now (modules, numba/FAISS/grpc wrappers, the opened engine) out of
    the garbage collector's reach; returns how many. Otherwise every full collection scans them
    all, a pause paid by whichever call happens to allocate then (see docs/perf-log.md)."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class StopSignals:
    """SIGTERM and SIGINT, noted from the moment this is made; ``wait`` blocks the main thread
    until one came. The handlers only note the signal: one that took a lock (an Event's,
    logging's) could deadlock when a second signal interrupts the main thread while it holds that
    lock (seen: a follower sent SIGTERM twice hung in Event.set)."""

    def __init__(self) -> None:
        self.got: list[int] = []
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)

    def _note(self, signum: int, _frame: object) -> None:
        self.got.append(signum)

    def wait(self, stop_early: Callable[[], bool] = lambda: False, interval: float = 0.2) -> int:
        """The signal's number, or 0 once ``stop_early()`` (asked every ``interval`` seconds)."""
        while not self.got:
            if stop_early():
                return 0
            time.sleep(interval)  # (a signal does not cut it short: at most ``interval`` late)
        return self.got[0]
