"""Server assembly: ``create_server(config)`` for tests and embedding, ``serve()`` for the command line."""

from __future__ import annotations

import ctypes
import gc
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tiermem.server.config import ServerConfig
from tiermem.server.core.engine import Engine
from tiermem.server.transport import follower
from tiermem.server.transport.follower import Followers
from tiermem.server.transport.servicer import MemoryServicer
from tiermem.v1 import memory_pb2, memory_pb2_grpc

logger = logging.getLogger(__name__)

SERVICE_NAME = memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    engine: Engine
    health: health.HealthServicer
    followers: Followers | None = None  # search followers (config.search_processes > 1)

    def stop(self, grace: float | None = None) -> None:
        """Stop taking calls (followers first: they forward writes here), let running ones
        finish, drain writes, snapshot indexes, close LMDB."""
        self.health.enter_graceful_shutdown()
        if self.followers is not None:
            self.followers.stop(grace or 0.0)
        self.server.stop(grace).wait()
        self.engine.close()


def grpc_server(config: ServerConfig, reuseport: bool) -> grpc.Server:
    """A gRPC server with the configured handler threads, call limit and message sizes."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="tiermem-rpc"),
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.so_reuseport", int(reuseport)),
        ],
    )


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


def create_server(config: ServerConfig, clock: Callable[[], float] | None = None) -> RunningServer:
    """Bind, start serving health (NOT_SERVING), open the engine (load, warm up), start the search
    followers if any and wait for them, then report SERVING."""
    leading = config.search_processes > 1
    if leading and config.port:
        _check_port_free(config.host, config.port)
    # Alone, a port in use is an error; with followers, they bind it too.
    server = grpc_server(config, reuseport=leading)
    servicer = MemoryServicer()
    memory_pb2_grpc.add_MemoryServiceServicer_to_server(servicer, server)
    health_servicer = add_health_and_reflection(server, serving=False)
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise RuntimeError(f"cannot bind {config.host}:{config.port}")
    private = ""
    if leading:
        private = follower.private_address()
        server.add_generic_rpc_handlers((follower.report_handler(lambda: servicer.engine),))
        if server.add_insecure_port(private) == 0:
            raise RuntimeError(f"cannot bind {private}")
    server.start()
    followers = None
    try:
        engine = Engine(config) if clock is None else Engine(config, clock=clock)
        servicer.engine = engine
        if leading:
            followers = follower.Followers(config, port, private, on_exit=engine.store.clear_stale_readers)
            try:
                followers.start()
            except BaseException:
                followers.stop(0.0)
                engine.close()
                raise
    except BaseException:
        server.stop(None)
        raise
    set_serving(health_servicer, True)
    return RunningServer(server, port, engine, health_servicer, followers)


def _check_port_free(host: str, port: int) -> None:
    """With followers the port is bound with SO_REUSEPORT, which another server of the same user
    could share unnoticed (the kernel would then split clients between two databases): refuse a
    port that anything listens on, as a bind without it would."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise RuntimeError(f"cannot resolve {host}:{port}: {e}") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
            except OSError as e:
                raise RuntimeError(f"cannot bind {host}:{port}: {e}") from None


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
    the garbage collector's reach; returns how many. A full collection otherwise scans them all:
    44-57 ms with 100,000 memories loaded (131,000 objects, nearly all from imports), paid by
    whichever call happens to allocate then; after the freeze it takes under 0.1 ms."""
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


def serve(config: ServerConfig) -> None:
    if tune_malloc(config.malloc_mmap_threshold):
        logger.info(
            "malloc: blocks of %d bytes and more are mapped on their own", config.malloc_mmap_threshold
        )
    # From here a stop signal is noted: one during start-up (health may already say SERVING) stops
    # the server cleanly once it is up, instead of killing it halfway.
    stops = StopSignals()
    running = create_server(config)
    logger.info("gc: %d objects alive after start-up frozen", freeze_startup_objects())
    logger.info("tiermem serving on %s:%d, data in %s", config.host, running.port, config.data_dir.resolve())
    print(f"tiermem listening on {config.host}:{running.port}", flush=True)
    signum = stops.wait()
    logger.info("signal %d: shutting down", signum)
    running.stop(config.shutdown_grace_seconds)
    logger.info("stopped")
    sys.stdout.flush()
