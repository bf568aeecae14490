"""Replicas on other hosts over gRPC (docs/scaling.md; the batches themselves: core/replication.py).

- The leader answers ``ReplicateChanges``: it streams batches as its commits happen and reads the
  replica's acknowledgements beside them (``ReplicaAcks``). With ``replica_ack`` "sync" a write's
  answer waits until a replica has stored it (``confirm_write``).
- A replica runs ``ReplicaFollower``: one call to its leader, kept open, each batch stored before
  it is acknowledged; reconnecting (with backoff) whenever the call ends, from its last commit.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc

from tiermem.client.connection import KEEPALIVE_OPTIONS, RECONNECT_OPTIONS
from tiermem.server.config import ServerConfig
from tiermem.server.core.engine import Engine
from tiermem.server.model.errors import TiermemError, Unavailable
from tiermem.v1 import memory_pb2 as pb
from tiermem.v1 import memory_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class ReplicaAcks:
    """The last commit each connected replica has stored, and waiting for one to reach a commit."""

    def __init__(self) -> None:
        self._applied: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._changed = threading.Condition()
        self._closed = False
        self._stopping: Callable[[], int] | None = None  # (the calls in handlers, once stopping)

    def end_when_idle(self, calls_in_handlers: Callable[[], int]) -> None:
        """The server is stopping: a feed caught up ends once only the feeds are left in handlers
        (the writes before it acknowledged; an idle replica does not hold the stop to its grace)."""
        self._stopping = calls_in_handlers

    def ending(self) -> bool:
        return self._stopping is not None and self._stopping() <= len(self._applied)

    def close(self) -> None:
        """The server stopped (its replicas' feeds too): no ack can come, writes waiting end now."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def join(self) -> int:
        with self._changed:
            rid = next(self._ids)
            self._applied[rid] = 0
            return rid

    def leave(self, replica: int) -> None:
        with self._changed:
            self._applied.pop(replica, None)
            self._changed.notify_all()

    def stored(self, replica: int, seq: int) -> None:
        with self._changed:
            if replica in self._applied:
                self._applied[replica] = max(self._applied[replica], seq)
                self._changed.notify_all()

    def figures(self) -> tuple[int, int]:
        """The replicas connected, and the last commit the furthest of them stored (-1: none)."""
        with self._changed:
            return len(self._applied), max(self._applied.values(), default=-1)

    def wait(self, seq: int, timeout: float) -> bool:
        """Whether a replica stored commit ``seq`` (or a later one) within ``timeout`` seconds."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._closed or any(a >= seq for a in self._applied.values()), timeout
            )
            return any(a >= seq for a in self._applied.values())


def serve_changes(
    engine: Engine,
    first: pb.ReplicateChangesRequest,
    requests: Iterator[pb.ReplicateChangesRequest],
    wanted: Callable[[], bool],
    acks: ReplicaAcks,
) -> Iterator[pb.ReplicateChangesResponse]:
    """The leader's side of one replica's call (``first``: where it is; ``requests``: its acks)."""
    replica = acks.join()
    # A position past this server's last commit is another history's: it confirms nothing here.
    acks.stored(replica, _known(engine, first.applied_seq) if first.instance_id == engine.instance_id else 0)

    def read_acks() -> None:
        try:
            for r in requests:
                acks.stored(replica, _known(engine, r.applied_seq))
        except Exception:  # (the call ended: its end is seen by the stream below)
            pass

    threading.Thread(target=read_acks, name="tiermem-replica-acks", daemon=True).start()
    try:
        feed = engine.replication_feed(first.instance_id, first.applied_seq, wanted, acks.ending)
        for seq, start, payload in feed:
            yield pb.ReplicateChangesResponse(
                instance_id=engine.instance_id, seq=seq, full_copy_start=start, changes=payload
            )
    finally:
        acks.leave(replica)


def _known(engine: Engine, seq: int) -> int:
    return seq if seq <= engine.committed_seq else 0


def confirm_write(engine: Engine, acks: ReplicaAcks, timeout: float) -> None:
    """With synchronous replication: return once a replica has stored the last commit, else
    Unavailable (the write is stored here; a retry with the same request id is safe)."""
    seq = engine.committed_seq
    if not acks.wait(seq, timeout):
        raise Unavailable(
            f"stored here, but no replica confirmed it within {timeout:g} s: retry with the same request id",
            "REPLICA_NOT_CONFIRMED",
        )


REFUSED_BATCH_PAUSE = 30.0  # seconds before a replica asks again for a batch it could not store
UNREACHED_WARNING_SECONDS = (10.0, 60.0)  # a leader out of reach is logged after 10 s, then each minute


class ReplicaFollower:
    """A replica's call to its leader (``config.replica_of``), on a thread of its own."""

    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine, self.config = engine, config
        self._stop = threading.Event()
        self._call: grpc.Future | None = None
        self._lock = threading.Lock()
        self.connected = threading.Event()
        self.applied = engine.replica_position()[1]
        self.full_copies = 0  # full copies received (a replica too far behind for the log gets one)
        self._thread = threading.Thread(target=self._run, name="tiermem-replica", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()
        self._thread.join(timeout=30)

    def _channel(self) -> grpc.Channel:
        # (the client's reconnect options: a leader back after an outage is reached within a second,
        # where gRPC's own backoff grows to 2 min and a waiting call never ends to let the loop retry)
        options = [
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
            *RECONNECT_OPTIONS,
            *KEEPALIVE_OPTIONS,  # (a leader cut off without a reset is noticed, and asked again)
        ]
        if self.config.replica_tls_ca:
            creds = grpc.ssl_channel_credentials(Path(self.config.replica_tls_ca).read_bytes())
            return grpc.secure_channel(self.config.replica_of, creds, options=options)
        return grpc.insecure_channel(self.config.replica_of, options=options)

    def _run(self) -> None:
        pause = 0.1
        metadata = (
            [("authorization", f"Bearer {self.config.replica_api_key}")]
            if self.config.replica_api_key
            else []
        )
        while not self._stop.is_set():
            wait = pause
            try:
                with self._channel() as channel:
                    if self._reach(channel):
                        self._follow(pb_grpc.MemoryServiceStub(channel), metadata)
                pause = 0.1
            except grpc.RpcError as e:
                if not self._stop.is_set():
                    logger.warning("replica: the call to %s ended: %s", self.config.replica_of, _why(e))
            except TiermemError as e:  # (refused here: its settings, which a restart mends; a full disk)
                logger.error(
                    "replica: a batch from %s could not be stored (%s): %s",
                    self.config.replica_of,
                    e.reason,
                    e,
                )
                wait = REFUSED_BATCH_PAUSE
            except Exception:
                logger.exception("replica: following %s failed", self.config.replica_of)
            self.connected.clear()
            self._stop.wait(wait)
            pause = min(2 * pause, 2.0)

    def _reach(self, channel: grpc.Channel) -> bool:
        """Wait until the leader takes a connection (False: stopped first), logging while it does not:
        the call itself waits for it in silence, and reads answer REPLICA_COPYING meanwhile."""
        began = time.monotonic()
        first, every = UNREACHED_WARNING_SECONDS
        warned = 0.0
        ready = grpc.channel_ready_future(channel)
        try:
            while not self._stop.is_set():
                try:
                    ready.result(timeout=0.5)
                except grpc.FutureTimeoutError:
                    waited = time.monotonic() - began
                    if waited >= first and (not warned or waited - warned >= every):
                        warned = waited
                        logger.warning(
                            "replica: cannot reach its leader %s for %.0f s", self.config.replica_of, waited
                        )
                    continue
                if warned:
                    logger.info("replica: reached its leader %s again", self.config.replica_of)
                return True
            return False
        finally:
            ready.cancel()

    def _follow(self, stub: pb_grpc.MemoryServiceStub, metadata: list[tuple[str, str]]) -> None:
        instance, applied = self.engine.replica_position()
        outbox: queue.Queue[pb.ReplicateChangesRequest | None] = queue.Queue()
        outbox.put(pb.ReplicateChangesRequest(instance_id=instance, applied_seq=applied))

        def requests() -> Iterator[pb.ReplicateChangesRequest]:
            while (r := outbox.get()) is not None:
                yield r

        call = stub.ReplicateChanges(requests(), metadata=metadata, wait_for_ready=True)
        with self._lock:
            if self._stop.is_set():
                call.cancel()
            self._call = call
        call.initial_metadata()  # (sent once the leader feeds this call: connected, if it still runs)
        if not call.done():
            self.connected.set()
        parts = self.engine.replica_parts()  # of a split backlog, stored with its last part at once
        copying = False  # (a full copy's parts are stored as they come: reads wait for its end)
        try:
            for batch in call:
                self.full_copies += batch.full_copy_start
                copying = (copying or batch.full_copy_start) and not batch.seq
                parts.add(batch.changes)
                if not batch.seq and not copying:
                    continue
                try:
                    self.engine.store_replica_batch(
                        batch.instance_id, batch.seq, batch.full_copy_start, parts
                    )
                finally:
                    parts.close()
                    parts = self.engine.replica_parts()
                if batch.seq:
                    self.applied = batch.seq
                    outbox.put(
                        pb.ReplicateChangesRequest(instance_id=batch.instance_id, applied_seq=batch.seq)
                    )
        finally:
            parts.close()
            outbox.put(None)
            with self._lock:
                self._call = None


def _why(e: grpc.RpcError) -> str:
    code = e.code() if hasattr(e, "code") else None
    return f"{code.name if code else 'UNKNOWN'}: {e.details() if hasattr(e, 'details') else e}"
