"""Search followers: more processes serving one port, so searches are not bound by one GIL.

One Python process ranks searches on about one core's worth of Python (the GIL). With ``search_processes`` N > 1 the server (the *leader*, the one process that holds
the data directory and writes) starts N - 1 followers. Each follower

- opens LMDB read-only and loads the same snapshots as a start-up does (``Engine(follower=True)``),
- serves SearchMemories and BatchSearchMemories itself, first applying every commit the leader
  made since its last look (the commit log, ``Engine.catch_up``): a search sees every write
  acknowledged before it began, whichever process acknowledged it,
- forwards every other call to the leader over a private socket (``forward.Forwarder``), so
  clients see one service,
- hands the accesses its searches record (and its hit counts) to the leader once a second
  (``REPORT_METHOD``), which commits them as its own.

All processes bind the same host:port with SO_REUSEPORT: the kernel spreads new connections over
them, and every call of one connection goes to the process that accepted it. A follower exits
when the leader does (PR_SET_PDEATHSIG); the leader restarts a follower that exits early (one
that fell behind the commit log exits on purpose and loads again).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import IO, Any

import grpc
import msgpack
from google.protobuf.message import DecodeError

from tiermem.server.config import ServerConfig
from tiermem.server.core.engine import Engine
from tiermem.server.cores import usable_cores
from tiermem.server.model.errors import TiermemError
from tiermem.server.model.reports import FollowerReport
from tiermem.server.security.shared_rates import FD_ENV as RATES_FD_ENV
from tiermem.server.security.shared_rates import SharedRates
from tiermem.server.transport import logs
from tiermem.server.transport.auth import PRIVATE_SECRET_HEADER, authorize, from_private_socket
from tiermem.server.transport.decoding import checked_raw
from tiermem.server.transport.forward import Forwarder, methods_of
from tiermem.server.transport.process import (
    HANDLERS_LEAVE_SECONDS,
    HandlerPool,
    StopSignals,
    add_health_and_reflection,
    bind,
    freeze_startup_objects,
    grpc_server,
    tune_malloc,
)
from tiermem.server.transport.servicer import MemoryServicer
from tiermem.server.transport.status import to_status
from tiermem.v1 import memory_pb2 as pb

logger = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["MemoryService"]
REPORT_METHOD = "/tiermem.internal.Followers/Report"  # on the leader's private socket only
SEARCHES = ("SearchMemories", "BatchSearchMemories")  # what a follower serves itself
READY = "tiermem follower ready"


def private_address() -> str:
    """A leader's socket for its followers: an abstract Unix socket (no file, gone with the process)."""
    return f"unix-abstract:tiermem-{os.getpid()}-{uuid.uuid4().hex[:12]}"


# The leader's per-run secret its followers present on every call to it (an abstract socket has no
# file permissions: any local user could reach it); passed to them in the environment.
SECRET_ENV = "TIERMEM_FOLLOWER_SECRET"
SECRET_HEADER = PRIVATE_SECRET_HEADER  # on every call a follower makes to its leader


def new_secret() -> str:
    return secrets.token_hex(16)


def report_handler(engine: Callable[[], Engine | None], secret: str) -> grpc.GenericRpcHandler:
    """The leader's end of ``REPORT_METHOD``: a follower's accesses and hit counts (msgpack), from
    the private socket and with the run's secret only."""

    def report(request: bytes, context: grpc.ServicerContext) -> bytes:
        if not from_private_socket(context, secret):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "followers report over the private socket only")
        eng = engine()
        if eng is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the leader is starting")
        assert eng is not None
        eng.merge_follower_report(FollowerReport.from_wire(msgpack.unpackb(request, strict_map_key=False)))
        return b""

    service, _, method = REPORT_METHOD[1:].partition("/")
    return grpc.method_handlers_generic_handler(
        service, {method: grpc.unary_unary_rpc_method_handler(report)}
    )


# A follower's first lines, before any heavy import: from here on it gets SIGTERM when the thread
# that started it ends (the leader's ``Followers`` thread, which lives as long as the leader), and
# it leaves at once if the leader is already gone (its parent is then another process).
_LAUNCH = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass  # not Linux: the follower's own loop watches its parent
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
from tiermem.server.transport.follower import main
main(sys.argv[1:])
"""


AUTO_PROCESSES_MOST = 4  # search_processes 0: one per core up to this (each holds its own columns)


def processes(config: ServerConfig) -> ServerConfig:
    """``config`` with ``search_processes`` 0 resolved, as the server starts: one process per core
    it may use (``usable_cores``), at most ``AUTO_PROCESSES_MOST``, on Linux (the kernel spreads
    connections over the processes there); one elsewhere, and for a replica (it serves in one)."""
    if config.search_processes:
        return config
    auto = sys.platform == "linux" and not config.replica_of
    return replace(config, search_processes=min(usable_cores(), AUTO_PROCESSES_MOST) if auto else 1)


def _status(proc: subprocess.Popen[str]) -> int | None:
    """A follower's exit status once its output ended (it may not be reaped yet); None if alive."""
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None


class Followers:
    """The leader's follower processes: started, watched (restarted when one exits early, with a
    growing delay if they keep failing), stopped. One thread does all of it, started by ``start``
    and ending at ``stop``: a follower's death signal is tied to the thread that started it."""

    MIN_DELAY, MAX_DELAY = 1.0, 60.0  # between a follower's exit and its replacement

    def __init__(
        self,
        config: ServerConfig,
        port: int,
        leader: str,
        on_exit: Callable[[], Any] = lambda: None,
        secret: str = "",
        rates: SharedRates | None = None,
    ) -> None:
        self.secret = secret
        self.rates = rates  # (each follower inherits the table, so a key's rate is counted once)
        self.config = config
        self.port = port
        self.leader = leader
        self.count = config.search_processes - 1
        self.restarts = 0
        self.on_exit = on_exit  # after a follower exits (the leader frees its LMDB reader slot)
        self._procs: list[subprocess.Popen[str] | None] = [None] * self.count
        self._started: list[float] = [0.0] * self.count
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def _spawn(self, i: int) -> subprocess.Popen[str] | None:
        with self._lock:
            if self._stopping.is_set():
                return None
            cmd = [
                sys.executable,
                "-c",
                _LAUNCH,
                str(os.getpid()),
                "--leader",
                self.leader,
                "--port",
                str(self.port),
            ]
            env = dict(os.environ, TIERMEM_FOLLOWER_CONFIG=self.config.to_json(), **{SECRET_ENV: self.secret})
            env.pop(RATES_FD_ENV, None)  # (none but the one this leader hands over)
            fds: tuple[int, ...] = ()
            if self.rates is not None:
                env[RATES_FD_ENV], fds = str(self.rates.fd), (self.rates.fd,)
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env, pass_fds=fds)
            self._procs[i], self._started[i] = proc, time.monotonic()
            return proc

    def start(self) -> None:
        """Start every follower and wait until each serves (loaded, bound to the port); raises if
        one exits first."""
        self._thread = threading.Thread(target=self._run, name="tiermem-followers", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"search followers did not start: {self._error}")

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p is not None]

    def _run(self) -> None:
        try:
            procs = [self._spawn(i) for i in range(self.count)]
            for proc in procs:
                if proc is not None and not self._wait_ready(proc):
                    raise RuntimeError(f"follower {proc.pid} exited with {_status(proc)} before serving")
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        delay = [self.MIN_DELAY] * self.count
        while not self._stopping.wait(0.2):
            for i, proc in enumerate(list(self._procs)):
                if proc is None or proc.poll() is None:
                    continue
                try:
                    self._replace(i, proc, delay)
                except Exception:  # keep watching the others
                    logger.exception("restarting search follower %d failed", proc.pid)

    def _replace(self, i: int, proc: subprocess.Popen[str], delay: list[float]) -> None:
        try:
            self.on_exit()
        except Exception:  # upkeep only: the follower is replaced all the same
            logger.exception("after search follower %d exited", proc.pid)
        if time.monotonic() - self._started[i] >= self.config.tuning.follower_steady_seconds:
            delay[i] = self.MIN_DELAY
        logger.warning(
            "search follower %d exited with %s: another in %.0f s", proc.pid, proc.returncode, delay[i]
        )
        if self._stopping.wait(delay[i]):
            return
        delay[i] = min(2 * delay[i], self.MAX_DELAY)
        new = self._spawn(i)
        if new is None:
            return
        self.restarts += 1
        if not self._wait_ready(new) and not self._stopping.is_set():
            logger.error("search follower %d exited with %s before serving", new.pid, _status(new))

    def _wait_ready(self, proc: subprocess.Popen[str]) -> bool:
        """Read the follower's output up to its ready line (then drain the rest in the background);
        False if it exits first or the leader stops meanwhile."""
        out: IO[str] | None = proc.stdout
        assert out is not None
        got = threading.Event()
        ready = [False]

        def read() -> None:
            with out:
                for line in out:
                    if line.strip() == READY:
                        ready[0] = True
                        got.set()
            got.set()  # EOF: the follower exited

        threading.Thread(target=read, name="tiermem-follower-out", daemon=True).start()
        timeout = self.config.tuning.follower_start_timeout_seconds
        deadline = time.monotonic() + timeout
        while not got.wait(0.2):
            if self._stopping.is_set():
                return False
            if time.monotonic() > deadline:  # hung while loading: killed, then replaced as any exit
                logger.error("search follower %d not serving after %.0f s: killed", proc.pid, timeout)
                proc.kill()
                return False
        return ready[0]

    def stop(self, grace: float) -> None:
        """SIGTERM every follower (each finishes its calls within ``grace``), then wait for them."""
        with self._lock:
            self._stopping.set()
            procs = [p for p in self._procs if p is not None]
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        if self._thread is not None:
            self._thread.join()
        for p in procs:
            try:
                p.wait(grace + HANDLERS_LEAVE_SECONDS + 30.0)  # (its calls' grace, their handlers, its close)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# -- the follower process -----------------------------------------------------------------------------
class _Serving:
    """The searches a follower is serving itself, counted: what each asks before it lends a core
    to a helper (``Searcher.calls``). Forwarded calls do not count: a stream (a replica's, an
    export) holds a handler here for as long as it lasts, without a core's work."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._n

    def enter(self) -> None:
        with self._lock:
            self._n += 1

    def leave(self) -> None:
        with self._lock:
            self._n -= 1


def _local_searches(
    servicer: MemoryServicer, engine: Engine, forwarder: Forwarder, serving: _Serving
) -> grpc.GenericRpcHandler:
    """The searches a follower ranks itself (counted in ``serving``); once it has stopped following
    (it is about to exit and be replaced), or while it has many commits to apply (``may_rank``),
    the leader answers them instead, so no search fails or waits meanwhile."""

    def handler(name: str) -> grpc.RpcMethodHandler:
        request_type = getattr(pb, f"{name}Request")
        local, forward = getattr(servicer, name), forwarder.behavior(name)

        def serve(raw: bytes, context: grpc.ServicerContext) -> bytes:
            if engine.follow_error is not None or not engine.may_rank():
                return bytes(forward(raw, context))
            serving.enter()
            try:
                return ranked(raw, context)
            finally:
                serving.leave()

        def ranked(raw: bytes, context: grpc.ServicerContext) -> bytes:
            try:
                request = request_type.FromString(raw)
            except DecodeError:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a {name}Request")
            try:
                engine.catch_up()  # (first: a scope fenced or moved since is refused, not read empty)
                authorize(name, request)  # (the interceptor saw bytes: the key's rights apply here)
            except TiermemError as e:  # (with its retry hint, as the leader's interceptor gives it)
                context.abort_with_status(to_status(e, getattr(e, "retry_after", None)))
            return bytes(local(request, context).SerializeToString())

        return grpc.unary_unary_rpc_method_handler(serve)  # bytes in and out: forwarded as they are

    return grpc.method_handlers_generic_handler(SERVICE.full_name, {name: handler(name) for name in SEARCHES})


def run(config: ServerConfig, leader: str, port: int, leader_pid: int) -> int:
    """Serve as a search follower of ``leader`` on config.host:``port`` until SIGTERM (0), or until
    it can no longer follow (3: the leader starts another)."""
    tune_malloc(config.malloc_mmap_threshold)
    channel = grpc.insecure_channel(
        leader,
        options=[
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
        ],
    )
    report = channel.unary_unary(REPORT_METHOD)

    secret = os.environ.get(SECRET_ENV, "")

    def sink(r: FollowerReport) -> None:
        report(msgpack.packb(r.to_wire()), timeout=10.0, metadata=[(SECRET_HEADER, secret)])

    engine = Engine(config, follower=True, access_sink=sink)
    servicer = MemoryServicer(engine)
    pool = HandlerPool(config.max_workers)
    serving = _Serving()
    engine.searcher.calls = serving  # (a search's helper only while no other search is in)
    server = grpc_server(
        config,
        pool,
        reuseport=True,
        routing_of=engine.scope_routing,
        stored_space=lambda m: m in engine.spaces,
        stopping=lambda: servicer.stopping,
        rates=SharedRates.inherited(),
    )
    forwarder = Forwarder(
        channel,
        SERVICE.full_name,
        methods_of(SERVICE),
        keep=set(SEARCHES),
        upstream="the leader",
        metadata=((SECRET_HEADER, secret),),
    )
    server.add_generic_rpc_handlers((forwarder,))
    # A follower's servicer answers searches only (everything else is forwarded): no agent services.
    server.add_generic_rpc_handlers((checked_raw(_local_searches(servicer, engine, forwarder, serving)),))
    health_servicer = add_health_and_reflection(server, serving=True)  # loaded before it binds
    if bind(server, f"{config.host}:{port}", config) != port:
        raise RuntimeError(f"cannot bind {config.host}:{port}")
    server.start()
    freeze_startup_objects()
    stops = StopSignals()
    print(READY, flush=True)

    def stop_early() -> bool:  # it can no longer follow, or the leader is gone (no death signal)
        return engine.follow_error is not None or os.getppid() != leader_pid

    status = 0
    if stops.wait(stop_early) == 0 and engine.follow_error is not None:
        logger.error("search follower stops: %r", engine.follow_error)
        status = 3
    health_servicer.enter_graceful_shutdown()
    servicer.stopping = True  # (the calls its stop cuts short are counted UNAVAILABLE)
    server.stop(config.shutdown_grace_seconds).wait()
    pool.drain(HANDLERS_LEAVE_SECONDS)
    engine.close()
    channel.close()
    return status


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="tiermem-follower", description="A tiermem search follower (started by the server)."
    )
    p.add_argument("leader_pid", type=int, help="the leader's process id")
    p.add_argument("--leader", required=True, help="the leader's private address")
    p.add_argument("--port", type=int, required=True, help="the port the leader serves")
    args = p.parse_args(argv)
    config = ServerConfig.from_json(os.environ["TIERMEM_FOLLOWER_CONFIG"])
    logs.configure(config.log_level, config.log_format, f"follower {os.getpid()}")  # (as the leader's)
    sys.exit(run(config, args.leader, args.port, args.leader_pid))


if __name__ == "__main__":
    main()
