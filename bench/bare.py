"""One process's bound through gRPC: a bare grpcio server around the engine.

``SearchMemories`` served by grpcio's own server (the same handler threads as tiermem's) around
``Engine.search``, with nothing of tiermem's transport: no interceptor (admission, keys, limits,
metrics), no servicer. A call's request is parsed and converted, ranked, and its hits converted
into the answer, as the server does. Beside the server's own rate on the same memories this says
what one Python process of this stack (grpcio and this engine) can serve at all, and what the
server's transport costs of it. The suite runs it on the copy of its memories the engine alone
uses; from the command line, on any data directory no server holds (prints its port, serves until
SIGTERM):

    python bench/bare.py --data DIR
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path
from typing import Any

SERVICE = "tiermem.v1.MemoryService"
START_TIMEOUT = 600.0  # (loading 1,000,000 memories takes seconds; a hung start must not hang the suite)


def serve(data_dir: Path, parent: int = 0) -> None:
    """Open the engine on ``data_dir``, print the bound port, serve until SIGTERM or SIGINT, or
    until process ``parent`` (when given) is gone."""
    import grpc
    from alone import open_engine

    from tiermem.server.transport import convert
    from tiermem.server.transport.process import freeze_startup_objects, tune_malloc
    from tiermem.v1 import memory_pb2 as pb

    engine = open_engine(data_dir)
    config = engine.config
    tune_malloc(config.malloc_mmap_threshold)

    def search(raw: bytes, context: Any) -> bytes:
        request = pb.SearchMemoriesRequest.FromString(raw)
        hits = engine.search(convert.search_from_pb(request), request.include_embedding, record=False)
        resp = pb.SearchMemoriesResponse()
        for hit in hits:
            convert.hit_to_pb(hit, resp.results.add(), request.explain)
        return resp.SerializeToString()

    handlers = [
        grpc.method_handlers_generic_handler(
            SERVICE, {"SearchMemories": grpc.unary_unary_rpc_method_handler(search)}
        )
    ]
    server = grpc.server(futures.ThreadPoolExecutor(config.max_workers), handlers=handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    freeze_startup_objects()
    server.start()
    stopped: list[int] = []  # (a handler that took a lock could deadlock the thread it interrupts)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: stopped.append(signum))
    print(port, flush=True)
    while not stopped and not (parent and os.getppid() != parent):  # (nor once the suite is gone)
        time.sleep(0.2)
    server.stop(0).wait()
    engine.close()


class BareServer:
    """``serve`` in a process of its own (``with BareServer(dir) as bare: ... bare.target``)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc: subprocess.Popen[str] | None = None
        self.target = ""

    def pids(self) -> list[int]:
        """Its process (as ``suite.Server.pids``, so the suite's loads time it alike)."""
        assert self.proc is not None
        return [self.proc.pid]

    def __enter__(self) -> BareServer:
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # (as the server's own start sets it)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--data", str(self.data_dir), "--parent", str(os.getpid())],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            self.target = f"127.0.0.1:{self._port()}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def _port(self, timeout: float = START_TIMEOUT) -> int:
        """The port the server prints once it serves; RuntimeError if it exits or takes too long."""
        assert self.proc is not None and self.proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise RuntimeError(f"bare server not serving after {timeout:.0f} s")
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise RuntimeError(f"bare server did not start (exit {self.proc.wait()})")
        return int(line)

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True, help="a data directory no server holds")
    p.add_argument("--parent", type=int, default=0, help="stop once this process is gone")
    args = p.parse_args()
    serve(args.data, args.parent)


if __name__ == "__main__":
    main()
