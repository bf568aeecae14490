"""Server assembly: ``create_server(config)`` for tests and embedding, ``serve()`` for the command line.
Builds the engine, the agent services over it (context assembly, graph memory) and the servicer
that exposes them, and starts the search followers when configured."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
from grpc_health.v1 import health

from tiermem.server.agent.context import Assembler
from tiermem.server.agent.graph import GraphMemory
from tiermem.server.config import ServerConfig, is_loopback
from tiermem.server.core.engine import Engine
from tiermem.server.model.errors import FailedPrecondition
from tiermem.server.security.shared_rates import SharedRates
from tiermem.server.transport import follower
from tiermem.server.transport.decoding import add_memory_service
from tiermem.server.transport.follower import Followers
from tiermem.server.transport.metrics import Metrics
from tiermem.server.transport.process import (
    HANDLERS_LEAVE_SECONDS,
    HandlerPool,
    StopSignals,
    add_health_and_reflection,
    bind,
    freeze_startup_objects,
    grpc_server,
    set_serving,
    tune_malloc,
)
from tiermem.server.transport.replication import ReplicaAcks, ReplicaFollower
from tiermem.server.transport.replication import confirm_write as confirm_write_on_replica
from tiermem.server.transport.routing import WriteGate
from tiermem.server.transport.sdnotify import notify
from tiermem.server.transport.servicer import MemoryServicer

logger = logging.getLogger(__name__)


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    engine: Engine
    health: health.HealthServicer
    followers: Followers | None = None  # search followers (config.search_processes > 1)
    metrics_server: Any = None  # the Prometheus endpoint (config.metrics_port >= 0)
    servicer: MemoryServicer | None = None
    pool: HandlerPool | None = None  # the gRPC server's handler threads

    @property
    def replica_follower(self) -> ReplicaFollower | None:
        return None if self.servicer is None else self.servicer.replica_follower

    @property
    def metrics_port(self) -> int:
        return int(self.metrics_server.server_port) if self.metrics_server is not None else 0

    def stop(self, grace: float | None = None) -> None:
        """Stop taking calls (followers first: they forward writes here), let running ones
        finish, drain writes, snapshot indexes, close LMDB."""
        self.health.enter_graceful_shutdown()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        if self.followers is not None:
            self.followers.stop(grace or 0.0)
        if self.servicer is not None:
            self.servicer.stopping = True  # (the calls still running when grace ends are cancelled)
        stopped = self.server.stop(grace)  # (new calls refused from here: none is left uncounted)
        pool, acks = self.pool, self.servicer.acks if self.servicer is not None else None
        if acks is not None and pool is not None:
            acks.end_when_idle(lambda: pool.busy)
        stopped.wait()
        if self.servicer is not None and self.servicer.acks is not None:
            self.servicer.acks.close()  # (writes waiting for a replica's ack: none can come now)
        if self.pool is not None:
            self.pool.drain(HANDLERS_LEAVE_SECONDS)
        if self.replica_follower is not None:
            self.replica_follower.stop()
        self.engine.close()


def _calls_in(pool: HandlerPool, servicer: MemoryServicer) -> Callable[[], int]:
    """The calls in the handlers but the replicas' streams (each holds a handler while it is
    connected, without a core's work): what a search asks before it lends a core to a helper."""

    def calls() -> int:
        acks = servicer.acks
        return max(0, pool.busy - (acks.figures()[0] if acks is not None else 0))

    return calls


def _attach(servicer: MemoryServicer, engine: Engine, config: ServerConfig) -> None:
    """The engine behind the servicer, with the agent services; a replica starts following."""
    graph = GraphMemory(engine.store, engine.writer, engine.config, engine.clock)
    servicer.attach(engine, Assembler(engine, graph), graph)
    if engine.is_replica:
        servicer.replica_follower = ReplicaFollower(engine, config)
        servicer.replica_follower.start()
        logger.info("replica of %s, from commit %d", config.replica_of, servicer.replica_follower.applied)


def create_server(config: ServerConfig, clock: Callable[[], float] | None = None) -> RunningServer:
    """Bind, start serving health (NOT_SERVING), open the engine (load, warm up), start the search
    followers if any and wait for them, then report SERVING."""
    # (followers keep the real clock: a server on another clock is one process)
    config = follower.processes(
        config if clock is None else replace(config, search_processes=config.search_processes or 1)
    )
    leading = config.search_processes > 1
    if leading and config.port:
        _check_port_free(config.host, config.port)
    # Alone, a port in use is an error; with followers, they bind it too.
    metrics = Metrics() if config.metrics_port >= 0 else None
    servicer = MemoryServicer()
    servicer.gate = WriteGate()
    servicer.acks = ReplicaAcks() if config.replication else None

    def is_replica() -> bool:
        engine = servicer.engine
        return engine is not None and engine.is_replica

    def replica_copying() -> bool:
        engine = servicer.engine
        return engine is not None and engine.replica_copying

    def confirm_write() -> None:
        engine, acks = servicer.engine, servicer.acks
        if engine is not None and acks is not None:
            confirm_write_on_replica(engine, acks, config.replica_ack_timeout_seconds)

    def routing_of(scope: str) -> tuple[int, str] | None:
        engine = servicer.engine
        return None if engine is None else engine.scope_routing(scope)

    secret = follower.new_secret() if leading else ""
    # (with followers a key's rate is counted once, in a table they inherit)
    rates = SharedRates.create() if leading and config.api_keys and config.key_rate_per_second > 0 else None
    pool = HandlerPool(config.max_workers)
    server = grpc_server(
        config,
        pool,
        reuseport=leading,
        exempt=(follower.REPORT_METHOD,),
        metrics=metrics,
        routing_of=routing_of,
        gate=servicer.gate,
        is_replica=is_replica if config.replica_of else None,
        replica_copying=replica_copying if config.replica_of else None,
        after_write=confirm_write if config.replica_ack == "sync" else None,
        private_secret=secret,
        stored_space=_stored_space(servicer),
        stopping=lambda: servicer.stopping,
        rates=rates,
    )
    add_memory_service(servicer, server)
    health_servicer = add_health_and_reflection(server, serving=False)
    port = bind(server, f"{config.host}:{config.port}", config)
    if port == 0:
        raise _cannot_bind(config.host, config.port, "the port is in use, or the host is not this machine's")
    private = ""
    if leading:
        private = follower.private_address()
        server.add_generic_rpc_handlers((follower.report_handler(lambda: servicer.engine, secret),))
        if server.add_insecure_port(private) == 0:
            raise RuntimeError(f"cannot bind {private}")
    server.start()
    followers = None
    engine: Engine | None = None
    metrics_server = None
    try:
        if metrics is not None:  # (before the engine opens: a port in use fails the start at once)
            metrics.attach(lambda: servicer.engine, lambda: (servicer.acks, servicer.replica_follower))
            metrics_server = _serve_metrics(metrics, config)
        engine = Engine(config) if clock is None else Engine(config, clock=clock)
        # (a search's helper only while no other call is in)
        engine.searcher.calls = _calls_in(pool, servicer)
        _attach(servicer, engine, config)
        if leading:
            followers = follower.Followers(
                config, port, private, on_exit=engine.store.clear_stale_readers, secret=secret, rates=rates
            )
            followers.start()
    except BaseException:
        if engine is None:
            _stop_unloaded(server, metrics_server)
        else:  # (the port was served meanwhile: stopped as a running server stops, its engine last)
            _stop_loaded(
                RunningServer(
                    server, port, engine, health_servicer, followers, metrics_server, servicer, pool
                )
            )
        raise
    set_serving(health_servicer, True)
    return RunningServer(server, port, engine, health_servicer, followers, metrics_server, servicer, pool)


def _check_port_free(host: str, port: int) -> None:
    """With followers the port is bound with SO_REUSEPORT, which another server of the same user
    could share unnoticed (the kernel would then split clients between two databases): refuse a
    port that anything listens on, as a bind without it would."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise _cannot_bind(host, port, f"cannot resolve the host: {e}") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
            except OSError as e:
                raise _cannot_bind(host, port, e.strerror or str(e)) from None


def _stored_space(servicer: MemoryServicer) -> Callable[[str], bool]:
    """Whether the servicer's engine (once open) has a space of a model."""

    def stored(model: str) -> bool:
        engine = servicer.engine
        return engine is not None and model in engine.spaces

    return stored


def _stop_unloaded(server: grpc.Server, metrics_server: Any) -> None:
    if metrics_server is not None:
        metrics_server.shutdown()
        metrics_server.server_close()
    server.stop(None)


def _stop_loaded(running: RunningServer) -> None:
    try:
        running.stop(None)
    except Exception:
        logger.exception("stopping after a failed start")


def _serve_metrics(metrics: Metrics, config: ServerConfig) -> Any:
    try:
        served = metrics.serve(config.metrics_host, config.metrics_port)
    except OSError as e:
        raise _cannot_bind(config.metrics_host, config.metrics_port, f"metrics: {e.strerror or e}") from None
    logger.info("metrics on http://%s:%d/metrics", config.metrics_host, served.server_port)
    return served


def _cannot_bind(host: str, port: int, why: str) -> FailedPrecondition:
    return FailedPrecondition(f"cannot listen on {host}:{port}: {why}", "CANNOT_LISTEN")


def serve(config: ServerConfig) -> None:
    if tune_malloc(config.malloc_mmap_threshold):
        logger.info(
            "malloc: blocks of %d bytes and more are mapped on their own", config.malloc_mmap_threshold
        )
    # From here a stop signal is noted: one during start-up (health may already say SERVING) stops
    # the server cleanly once it is up, instead of killing it halfway.
    stops = StopSignals()
    config = follower.processes(config)
    logger.info("settings: %s", config.summary())
    if not is_loopback(config.host) and not (config.tls_cert and config.api_keys):
        logger.warning(
            "serving %s without %s (--insecure): anyone who reaches the port can read and change "
            "every namespace's memories",
            config.host,
            " and ".join(w for w, ok in (("TLS", config.tls_cert), ("API keys", config.api_keys)) if not ok),
        )
    notify("STATUS=loading the data and the kernels")
    running = create_server(config)
    logger.info("gc: %d objects alive after start-up frozen", freeze_startup_objects())
    logger.info("tiermem serving on %s:%d, data in %s", config.host, running.port, config.data_dir.resolve())
    print(f"tiermem listening on {config.host}:{running.port}", flush=True)
    if not stops.got:  # (a stop asked for during the start-up: never ready, stopping at once)
        notify(f"READY=1\nSTATUS=serving on {config.host}:{running.port}")
    signum = stops.wait()
    logger.info("signal %d: shutting down", signum)
    notify("STOPPING=1")
    running.stop(config.shutdown_grace_seconds)
    logger.info("stopped")
    sys.stdout.flush()
