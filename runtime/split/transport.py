"""Links from one edge client to the verification server, all behind one interface
(:class:`VerifierLink`): ``submit`` a request and get a future that resolves to a
:class:`~runtime.split.messages.Reply` (or fails), ``release`` the server state of a finished user
request, ``close`` the link (the server frees everything of this client).

- :class:`LocalLink`: in-process, straight into a :class:`VerificationBatcher` (unit tests).
- :class:`GrpcLink`: one bidirectional gRPC stream; replies are matched to requests in order
  (one request in flight per client). A dead server fails every pending and later future with
  the ``grpc.RpcError``; a server that goes silent is the caller's timeout.
- :class:`DelayedLink`: wraps either and emulates a WAN in-process (half the RTT plus jitter each
  way, plus serialisation time at the given bandwidth, FIFO per direction) -- on real loopback
  sockets when it wraps a :class:`GrpcLink`.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import random
import threading
import time
import uuid
from concurrent.futures import Future
from typing import Protocol

import grpc

from runtime.split.messages import METHOD, VerdictMsg, VerifyMsg, msg_to_reply, request_to_msg
from runtime.split.verifier import VerifyRequest


class VerifierLink(Protocol):
    def submit(self, req: VerifyRequest) -> Future: ...

    def release(self) -> None: ...

    def close(self) -> None: ...

    @property
    def dead(self) -> bool:
        """Whether the link is known to be unusable (its stream ended): a new one is needed."""
        ...


def _failed(exc: BaseException) -> Future:
    fut: Future = Future()
    fut.set_exception(exc)
    return fut


class LocalLink:
    """In-process link to a batcher (the request's ``client`` is this link's id)."""

    def __init__(self, batcher, client: str | None = None):
        self.batcher = batcher
        self.client = client or uuid.uuid4().hex
        batcher.join(self.client)

    def submit(self, req: VerifyRequest) -> Future:
        try:
            return self.batcher.submit(VerifyRequest(self.client, *_fields(req)))
        except Exception as exc:  # noqa: BLE001 - every failure reaches the caller through the future
            return _failed(exc)

    def release(self) -> None:
        self.batcher.release(self.client)

    def close(self) -> None:
        self.batcher.leave(self.client)

    @property
    def dead(self) -> bool:
        return False


def _fields(req: VerifyRequest) -> tuple:
    return req.drafts, req.prompt, req.committed, req.temperature, req.seed


class GrpcLink:
    """One bidirectional stream to ``address`` (``host:port``).

    The connection is waited for up to ``connect_timeout_s`` (a server that is still starting);
    with ``fail_fast`` a refused connection fails at once instead (a server that was there and is
    gone: waiting out the timeout held an edge client, and every request queued behind it, for
    the whole timeout per request)."""

    def __init__(self, address: str, connect_timeout_s: float = 10.0, fail_fast: bool = False):
        self.channel = grpc.insecure_channel(address)
        settled, last = threading.Event(), []

        def watch(state: grpc.ChannelConnectivity) -> None:
            last.append(state)
            if state is grpc.ChannelConnectivity.READY or (fail_fast and state is grpc.ChannelConnectivity.TRANSIENT_FAILURE):
                settled.set()

        self.channel.subscribe(watch, try_to_connect=True)
        settled.wait(connect_timeout_s)
        self.channel.unsubscribe(watch)
        if not last or last[-1] is not grpc.ChannelConnectivity.READY:
            self.channel.close()
            if last and last[-1] is grpc.ChannelConnectivity.TRANSIENT_FAILURE and fail_fast:
                raise ConnectionError(f"the verification server at {address} refused the connection")
            raise ConnectionError(f"no verification server at {address} within {connect_timeout_s} s")
        self._outbox: queue.Queue = queue.Queue()
        self._pending: list[Future] = []
        self._lock = threading.Lock()
        self._broken: BaseException | None = None
        self._seq = itertools.count(1)
        stream = self.channel.stream_stream(METHOD, request_serializer=VerifyMsg.SerializeToString, response_deserializer=VerdictMsg.FromString)
        self._call = stream(iter(self._outbox.get, None))
        self._reader = threading.Thread(target=self._read, name="grpc-link-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for msg in self._call:
                with self._lock:
                    fut = self._pending.pop(0) if self._pending else None
                if fut is not None:
                    fut.set_result(msg_to_reply(msg))
            exc: BaseException = ConnectionError("the verification stream ended")
        except grpc.RpcError as err:
            exc = err
        with self._lock:
            self._broken = exc
            pending, self._pending = self._pending, []
        for fut in pending:
            fut.set_exception(exc)

    def submit(self, req: VerifyRequest) -> Future:
        with self._lock:
            if self._broken is not None:
                return _failed(self._broken)
            fut: Future = Future()
            self._pending.append(fut)
            self._outbox.put(request_to_msg(req, next(self._seq), time.time()))
        return fut

    def release(self) -> None:
        self._outbox.put(VerifyMsg(release=True, sent_at=time.time()))

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self.channel.close()

    @property
    def dead(self) -> bool:
        """The stream has ended (the server went away, even while this link was idle)."""
        with self._lock:
            return self._broken is not None


class _DelayLine:
    """One thread running callbacks at given ``perf_counter`` times."""

    def __init__(self):
        self._heap: list = []
        self._cond = threading.Condition()
        self._ids = itertools.count()
        self._stopping = False
        threading.Thread(target=self._run, name="wan-shim", daemon=True).start()

    def at(self, when: float, fn) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._ids), fn))
            self._cond.notify()

    def stop_when_empty(self) -> None:
        """End the thread once every scheduled callback has run."""
        with self._cond:
            self._stopping = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.perf_counter():
                    if not self._heap and self._stopping:
                        return
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.perf_counter())
                _, _, fn = heapq.heappop(self._heap)
            fn()


class DelayedLink:
    """WAN emulation around another link: each direction waits ``rtt_ms / 2`` plus uniform
    ``[0, jitter_ms]`` plus ``bytes * 8 / bandwidth``; messages keep their order."""

    REPLY_BYTES = 48  #: a verdict's size on the wire (a few varints and doubles)

    def __init__(self, inner: VerifierLink, rtt_ms: float, jitter_ms: float = 0.0, bandwidth_mbps: float = float("inf"), seed: int = 0):
        if rtt_ms < 0 or jitter_ms < 0 or bandwidth_mbps <= 0:
            raise ValueError(f"rtt_ms and jitter_ms must be >= 0 (got {rtt_ms}, {jitter_ms}), bandwidth_mbps > 0 (got {bandwidth_mbps})")
        self.inner, self.rtt_s, self.jitter_s, self.bytes_per_s = inner, rtt_ms / 1e3, jitter_ms / 1e3, bandwidth_mbps * 1e6 / 8
        self._rng = random.Random(seed)
        self._line = _DelayLine()
        self._up_free = self._up_last = self._down_free = self._down_last = 0.0
        self._lock = threading.Lock()

    def _arrival(self, n_bytes: int, up: bool) -> float:
        with self._lock:
            now = time.perf_counter()
            free, last = (self._up_free, self._up_last) if up else (self._down_free, self._down_last)
            done = max(now, free) + n_bytes / self.bytes_per_s
            arrive = max(done + self.rtt_s / 2 + self._rng.uniform(0, self.jitter_s), last)
            if up:
                self._up_free, self._up_last = done, arrive
            else:
                self._down_free, self._down_last = done, arrive
            return arrive

    def submit(self, req: VerifyRequest) -> Future:
        outer: Future = Future()
        n_bytes = len(request_to_msg(req, 0, 0.0).SerializeToString())

        def deliver(inner_fut: Future) -> None:
            self._line.at(self._arrival(self.REPLY_BYTES, up=False), lambda: _copy(inner_fut, outer))

        def send() -> None:
            self.inner.submit(req).add_done_callback(deliver)

        self._line.at(self._arrival(n_bytes, up=True), send)
        return outer

    def release(self) -> None:
        self._line.at(self._arrival(4, up=True), self.inner.release)

    def close(self) -> None:
        self._line.at(self._arrival(4, up=True), self.inner.close)
        self._line.stop_when_empty()

    @property
    def dead(self) -> bool:
        return bool(getattr(self.inner, "dead", False))


def _copy(src: Future, dst: Future) -> None:
    exc = src.exception()
    if exc is not None:
        dst.set_exception(exc)
    else:
        dst.set_result(src.result())
