"""The edge process's clients as a worker pool for its local HTTP endpoint (:mod:`runtime.edge_http`).

Each of the ``N`` edge clients is one thread holding its own :class:`~runtime.split.edge_client.EdgeClient`
(its own gRPC stream to the verification server, its own depth controller). An HTTP request becomes
one :class:`EdgeJob` in one bounded queue; the first free client takes it, drafts for it, has it
verified and ends it with exactly one outcome: ``length``, ``eos``, ``stop`` (a stop sequence),
``cancelled`` (its HTTP client went away: the client is freed at the next iteration), ``timeout``
(no verdict within the reply timeout), ``error`` (the server is gone or unreachable) or
``shutdown`` (still queued when the edge process stopped: 503). After an error or a timeout the
client opens a new stream for its next job (a late reply must not answer another request), as the
prompt-list mode does; so does a client whose idle stream has ended (the server restarted
meanwhile), before it takes the job. A job whose stream fails before its first verdict has
produced nothing, so it is tried once more on a new stream; a server that refuses the new
connection fails it at once (``GrpcLink(fail_fast=True)`` for every reconnection), not after the
connect timeout. A full queue refuses at once (429), a closing pool too (503): nothing waits
without bound.

Threads, not asyncio: drafting and the gRPC link are blocking; the HTTP side only waits for a
job's ``done`` event and reads its stream pieces, which the worker hands over with
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.split.edge_client import EdgeClient, RequestOutcome
from runtime.textstream import TextStream

#: outcomes that are answered with text (200): the request ran to its end
FINISHED = {"length": "length", "eos": "stop", "stop": "stop"}


class Refused(Exception):
    """The pool cannot take a job now (``status``: 429 queue full, 503 closing)."""

    def __init__(self, status: int, message: str, code: str):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class EdgeJob:
    """One HTTP request's generation; fields after ``stream`` are filled as it runs."""

    id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    seed: int
    text: TextStream  #: fed on the worker thread only; read by the HTTP side once ``done`` is set
    loop: asyncio.AbstractEventLoop  #: the HTTP side's loop (done and pieces are set on it)
    stream: bool = False
    pieces: asyncio.Queue | None = None  #: stream: text pieces, then None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  #: monotonic s, when a client took it
    client: int | None = None
    outcome: RequestOutcome | None = None

    def _to_loop(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the HTTP loop is gone (process shutting down): nobody is waiting
            pass

    def on_tokens(self, new: list[int]) -> str | None:
        """Worker thread, after every iteration: feed the text, hand out the settled piece, end
        the request at a stop sequence or once its HTTP client has gone."""
        if self.cancelled.is_set():
            return "cancelled"
        self.text.feed(new)
        if self.pieces is not None and (piece := self.text.take()):
            self._to_loop(self.pieces.put_nowait, piece)
        return "stop" if self.text.stopped else None

    def finish(self, out: RequestOutcome) -> None:
        """Worker thread: the job's one outcome."""
        self.outcome = out
        if self.pieces is not None:
            if piece := self.text.take(final=True):
                self._to_loop(self.pieces.put_nowait, piece)
            self._to_loop(self.pieces.put_nowait, None)
        self._to_loop(self.done.set)

    @property
    def finish_reason(self) -> str:
        """OpenAI's ``finish_reason`` for a finished job; the outcome itself otherwise."""
        assert self.outcome is not None
        return FINISHED.get(self.outcome.outcome, self.outcome.outcome)

    def summary(self) -> dict:
        """SpecSched's extension of every answer: outcome, reason, which client, timings."""
        out = self.outcome
        if out is None:
            return {"outcome": None, "queued_s": time.monotonic() - self.queued_at}
        return {"outcome": out.outcome, "reason": out.error or None, "client": self.client, "tokens": len(out.tokens),
                "iterations": len(out.iterations), "mean_depth": (sum(log.depth for log in out.iterations) / len(out.iterations)) if out.iterations else None,
                "accepted": sum(log.accepted for log in out.iterations), "queue_wait_s": (self.started_at or self.queued_at) - self.queued_at,
                "latency_s": out.ended_at - out.started_at}


class EdgePool:
    """``clients`` worker threads over one job queue of at most ``queue_size`` waiting jobs.

    ``make_edge(i)`` opens client ``i``'s stream (an :class:`EdgeClient`; it may raise
    ``ConnectionError``, which ends that job with ``error`` and is retried on the next job)."""

    def __init__(self, clients: int, make_edge: Callable[[int], EdgeClient], queue_size: int):
        if clients < 1 or queue_size < 0:
            raise ValueError(f"clients must be >= 1 (got {clients}) and queue_size >= 0 (got {queue_size})")
        self.clients, self.queue_size, self.make_edge = clients, queue_size, make_edge
        # queue.Queue(0) is unbounded: the bound is checked in submit instead (0 = no waiting at all)
        self._jobs: queue.Queue[EdgeJob | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0  #: jobs submitted and not yet taken by a client
        self.busy = 0  #: clients running a job now
        self.closing = False
        #: the verification server refused or did not answer the last (re)connection; cleared by the
        #: next connection that succeeds (``health`` reports it: the edge itself is up either way)
        self.server_unreachable = False
        self.finished: list[tuple[EdgeJob, RequestOutcome]] = []  #: every job's outcome, in the order they ended
        self.counts: dict[str, int] = {}
        self._threads = [threading.Thread(target=self._work, args=(i,), name=f"edge-http-client-{i}", daemon=True) for i in range(clients)]
        for t in self._threads:
            t.start()

    def health(self) -> dict:
        with self._lock:
            status = "closing" if self.closing else ("server_unreachable" if self.server_unreachable else "ok")
            return {"status": status, "clients": self.clients, "busy": self.busy, "queued": self._waiting,
                    "queue_limit": self.queue_size, "outcomes": dict(self.counts)}

    def submit(self, job: EdgeJob) -> None:
        """Hand ``job`` to a free client, or queue it; :class:`Refused` when closing or full."""
        with self._lock:
            if self.closing:
                raise Refused(503, "the edge process is shutting down", "shutting_down")
            if self.busy + self._waiting >= self.clients + self.queue_size:
                raise Refused(429, f"all {self.clients} edge clients are busy and {self._waiting} requests wait already "
                                   f"(the queue holds at most {self.queue_size}: --http-queue)", "overloaded")
            self._waiting += 1
        self._jobs.put(job)

    def _end(self, job: EdgeJob, out: RequestOutcome) -> None:
        with self._lock:
            self.finished.append((job, out))
            self.counts[out.outcome] = self.counts.get(out.outcome, 0) + 1
        job.finish(out)

    @staticmethod
    def _failed(job: EdgeJob, outcome: str, reason: str) -> RequestOutcome:
        """A job that ends without a generation; its latency runs from when a client took it (e.g.
        a connection attempt), or from its arrival if none did."""
        now = time.time()
        since = now - (time.monotonic() - (job.started_at if job.started_at is not None else job.queued_at))
        return RequestOutcome(job.id, len(job.prompt_ids), [], outcome, since, now, error=reason)

    def _work(self, i: int) -> None:
        edge: EdgeClient | None = None
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self.busy += 1
            job.started_at, job.client = time.monotonic(), i
            try:
                if job.cancelled.is_set():  # its HTTP client left while it waited
                    self._end(job, self._failed(job, "cancelled", "the HTTP client went away before a client was free"))
                    continue
                # an idle client's stream may have died with a server that has since come back: a
                # new stream now, not a failed request first (the link knows once its stream ended)
                if edge is not None and getattr(edge.link, "dead", False):
                    edge.link.close()
                    edge = None
                for attempt in (0, 1):
                    if edge is None:
                        try:
                            edge = self.make_edge(i)
                        except ConnectionError as exc:
                            self.server_unreachable = True
                            out = self._failed(job, "error", str(exc))
                            break
                        self.server_unreachable = False
                    try:
                        out = edge.generate(job.prompt_ids, job.max_tokens, job.temperature, seed=job.seed, request_id=job.id, on_tokens=job.on_tokens)
                    except Exception as exc:  # noqa: BLE001 - a bug in one request must not kill the client thread
                        out = self._failed(job, "error", f"{type(exc).__name__}: {exc}")
                        edge.broken = True
                    if edge.broken:  # a late reply could answer the next request: a new stream first
                        edge.link.close()
                        edge = None
                    # a stream that failed before its first verdict produced nothing: the request is
                    # tried once more on a new stream (the server may have restarted since the last job)
                    if not (attempt == 0 and out.outcome == "error" and not out.iterations and not job.cancelled.is_set()):
                        break
                self._end(job, out)
            except Exception as exc:  # noqa: BLE001 - e.g. make_edge failing otherwise than ConnectionError ("can't start new thread")
                # this killed the client thread: the job never got its outcome (its HTTP request
                # hung) and the pool served on with one client fewer; now the job ends with error
                # and the client starts over with a new stream
                if edge is not None:
                    edge.broken = True
                    with contextlib.suppress(Exception):
                        edge.link.close()
                    edge = None
                if job.outcome is None:
                    self._end(job, self._failed(job, "error", f"{type(exc).__name__}: {exc}"))
            finally:
                with self._lock:
                    self.busy -= 1
        if edge is not None:
            edge.link.close()

    def refuse(self) -> None:
        """Refuse new jobs (503) and end the waiting ones with ``shutdown`` (503); running jobs go on."""
        with self._lock:
            self.closing = True
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                with self._lock:
                    self._waiting -= 1
                self._end(job, self._failed(job, "shutdown", "the edge process shut down before a client was free"))

    def close(self, timeout_s: float = 10.0) -> None:
        """:meth:`refuse`, then let the running jobs finish (each bounded by its client's reply
        timeout) and stop the threads (waiting at most ``timeout_s`` for each)."""
        self.refuse()
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout_s)
