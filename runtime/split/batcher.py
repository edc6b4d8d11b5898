"""Server side: the verification loop -- one thread owns the :class:`BatchVerifier` and forms
batches from the requests its clients submit.

**Pipeline-aware cohorts.** Each client joins one of ``cohorts`` cohorts (the least populated).
A batch holds requests of one cohort only; once a cohort's first request is queued the batch
waits at most ``window_s`` for the rest of that cohort's active clients, then runs. Cohorts take
turns (the next one after the last served that has a request queued), so with two cohorts one is
verified while the other drafts and travels (SpecEdge's pipeline; ``cohorts=1`` batches
everyone together and the server idles while they all draft).

Every submitted request ends with exactly one outcome: its future gets a :class:`Reply`, an
:class:`InvalidRequest` (its own row was bad) or the batch's exception (a fault in one batch does
not stop the next); on :meth:`stop` every queued future fails with ``RuntimeError``. A caller may
cancel its future while the request is still queued (``Future.cancel``, or an asyncio task awaiting
it through ``asyncio.wrap_future`` being cancelled): the request is then dropped, never verified
(its session does not advance); once its batch has started it can no longer be cancelled.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from runtime.split.messages import Reply
from runtime.split.verifier import BatchVerifier, InvalidRequest, VerifyRequest

if TYPE_CHECKING:
    from runtime.device_turns import DeviceTurns


@dataclass
class _Queued:
    req: VerifyRequest
    future: Future
    arrived: float  #: perf_counter
    arrived_wall: float


@dataclass
class BatcherStats:
    batches: int = 0
    rows: int = 0
    busy_s: float = 0.0  #: time inside target forwards
    verify_cpu_s: float = 0.0  #: the batcher thread's CPU time inside verification (the rest of the process: gRPC, threads)
    first_at: float | None = None  #: perf_counter of the first batch start
    last_at: float | None = None  #: perf_counter of the last batch end
    tokens: int = 0  #: tokens committed (accepted + bonus)
    #: batch size -> how many batches had it. Why a count, not a list of every batch's size: the
    #: list grew by one entry per batch for as long as the server ran (a leak on a long-lived server)
    batch_sizes: dict[int, int] = field(default_factory=dict)

    @property
    def utilisation(self) -> float:
        span = (self.last_at or 0.0) - (self.first_at or 0.0)
        return self.busy_s / span if span > 0 else float("nan")


def _fail(fut: Future, exc: BaseException) -> None:
    """Fail a queued request's future -- unless its caller has cancelled it (then it has its outcome)."""
    if fut.set_running_or_notify_cancel():
        fut.set_exception(exc)


class VerificationBatcher:
    """The verification loop (see the module docstring).

    ``turns``: when the device is shared with another thread (``runtime.serve placement=split``: the
    round's AD / SD engines), each verification pass is one of party ``party``'s turns
    (:class:`runtime.device_turns.DeviceTurns`); its wait for the turn counts as queue wait, not compute.
    """

    def __init__(self, verifier: BatchVerifier, cohorts: int = 1, window_s: float = 0.005, max_batch: int = 64,
                 turns: DeviceTurns | None = None, party: str = "ed"):
        if cohorts < 1 or window_s < 0 or max_batch < 1:
            raise ValueError(f"cohorts must be >= 1 (got {cohorts}), window_s >= 0 (got {window_s}), max_batch >= 1 (got {max_batch})")
        self.verifier, self.cohorts, self.window_s, self.max_batch = verifier, cohorts, window_s, max_batch
        self.turns, self.party = turns, party
        self.stats = BatcherStats()
        self._cond = threading.Condition()
        self._queue: list[_Queued] = []
        self._members: dict[str, int] = {}  #: client -> cohort
        self._releases: list[str] = []
        self._last_cohort = -1
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="verification-batcher", daemon=True)
        self._thread.start()

    @property
    def members(self) -> int:
        """Clients connected now."""
        with self._cond:
            return len(self._members)

    # ------------------------------------------------------------------ client side (any thread)
    def join(self, client: str) -> int:
        with self._cond:
            sizes = [sum(1 for c in self._members.values() if c == k) for k in range(self.cohorts)]
            cohort = self._members.setdefault(client, sizes.index(min(sizes)))
            self._cond.notify_all()
            return cohort

    def leave(self, client: str) -> None:
        """The client is gone: drop its queued requests (failed) and free its state."""
        with self._cond:
            self._members.pop(client, None)
            for q in [q for q in self._queue if q.req.client == client]:
                self._queue.remove(q)
                _fail(q.future, ConnectionAbortedError(f"client {client} left"))
            self._releases.append(client)
            self._cond.notify_all()

    def release(self, client: str) -> None:
        """The client's user request ended: free its target state (it stays a member)."""
        with self._cond:
            self._releases.append(client)
            self._cond.notify_all()

    def submit(self, req: VerifyRequest) -> Future:
        """Queue a request (statically checked first: :class:`InvalidRequest` raises here)."""
        self.verifier.check(req)
        fut: Future = Future()
        with self._cond:
            if self._stopped:
                raise RuntimeError("the verification server is stopping")
            if req.client not in self._members:
                raise InvalidRequest(f"client {req.client!r} has not joined")
            if any(q.req.client == req.client and not q.future.cancelled() for q in self._queue):  # a cancelled one is dropped at batch time
                raise InvalidRequest(f"client {req.client!r} already has a request in flight")
            self._queue.append(_Queued(req, fut, time.perf_counter(), time.time()))
            self._cond.notify_all()
        return fut

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ------------------------------------------------------------------------- the batcher thread
    def _pick_cohort(self) -> int | None:
        queued = {self._members.get(q.req.client, 0) for q in self._queue}
        for step in range(1, self.cohorts + 1):
            c = (self._last_cohort + step) % self.cohorts
            if c in queued:
                return c
        return None

    def _apply_releases(self) -> None:
        for client in self._releases:
            self.verifier.release(client)
        self._releases.clear()

    def _take_batch(self) -> list[_Queued]:
        """Wait for a cohort's first request, then up to ``window_s`` for the rest of the cohort."""
        with self._cond:
            while not self._stopped:
                self._apply_releases()
                cohort = self._pick_cohort()
                if cohort is None:
                    self._cond.wait(0.1)
                    continue
                deadline = time.perf_counter() + self.window_s
                while not self._stopped:
                    mine = [q for q in self._queue if self._members.get(q.req.client, 0) == cohort]
                    members = sum(1 for c in self._members.values() if c == cohort)
                    left = deadline - time.perf_counter()
                    if len(mine) >= min(members, self.max_batch) or left <= 0:
                        break
                    self._cond.wait(left)
                mine = [q for q in self._queue if self._members.get(q.req.client, 0) == cohort][: self.max_batch]
                if not mine:
                    continue
                for q in mine:
                    self._queue.remove(q)
                # from here on a future cannot be cancelled; one cancelled while queued is dropped
                # (setting a result on it raised InvalidStateError, which killed this thread and
                # with it the server: every later request of every client hung)
                mine = [q for q in mine if q.future.set_running_or_notify_cancel()]
                self._apply_releases()  # every release was issued before these requests were queued
                if not mine:
                    continue
                self._last_cohort = cohort
                return mine
            for q in self._queue:
                _fail(q.future, RuntimeError("the verification server stopped"))
            self._queue.clear()
            self._apply_releases()
            return []

    def _loop(self) -> None:
        while True:
            batch = self._take_batch()
            if not batch:
                return
            with self.turns.turn(self.party) if self.turns is not None else nullcontext():
                if self._stopped:  # stopped while it waited for its turn: the batch fails, as every queued request
                    for q in batch:
                        q.future.set_exception(RuntimeError("the verification server stopped"))
                    continue
                start, cpu0 = time.perf_counter(), time.thread_time()
                try:
                    results = self.verifier.verify([q.req for q in batch])
                except Exception as exc:  # noqa: BLE001 - the batch's requests get the fault; the loop goes on
                    results = exc
                end = time.perf_counter()
            if isinstance(results, Exception):
                for q in batch:
                    q.future.set_exception(results)
                continue
            st = self.stats
            st.verify_cpu_s += time.thread_time() - cpu0
            st.first_at = start if st.first_at is None else st.first_at
            st.last_at, st.busy_s = end, st.busy_s + (end - start)
            st.batches, st.rows = st.batches + 1, st.rows + len(batch)
            st.batch_sizes[len(batch)] = st.batch_sizes.get(len(batch), 0) + 1
            cohort, prompts = self._last_cohort, sum(1 for q in batch if q.req.prompt)
            for q, res in zip(batch, results, strict=True):
                if isinstance(res, Exception):
                    q.future.set_exception(res)
                    continue
                st.tokens += res.accepted + 1
                q.future.set_result(Reply(res.accepted, res.bonus, res.committed, q.arrived_wall, 1e3 * (start - q.arrived),
                                          1e3 * (end - start), len(batch), cohort, prompts))
