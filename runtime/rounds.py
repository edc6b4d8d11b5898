"""Rounds: the queue, deadline-aware admission, planning, and running each plan on the model pair.

Requests wait in a FIFO queue; a round takes up to ``max_round`` of them (the rest carry over to
the next round) once the oldest has waited ``window_s``. The scheduler plans the round on the
profile scaled by the online calibration (:mod:`runtime.calibration`); rejected requests are
answered at once and the AD / SD batches run on the engines (:mod:`runtime.executor`). Planning
and running one round, and learning from it, is :class:`runtime.round_runner.RoundRunner`, which
:class:`RoundServer` builds on; this module is the queue around it.

**Deadlines under a burst.** On arrival and then every ``min(window_s / 2, 0.1)`` s the queue is
swept: a request that can no longer make its deadline is rejected at once with that reason,
instead of being rejected (or served late) after its deadline when its round is finally planned.
"Can no longer" is: its earliest start -- not before its round's window closes, the running round
(or a due speed probe: it runs while a round's window collects requests) is expected to end (its
calibrated plan; the last probe's time) and the full rounds queued ahead of it have run (each as
long as recent rounds took) -- plus its minimal service time (alone on the device, in its faster
mode, calibrated), plus the time to get the answer out (one sweep interval and the learnt answer
margin of :mod:`runtime.admission`: the observed delay from a rejection's decision to its answer
written, upper estimate, never below the event loop's lag), exceeds its deadline. The deadline
counts from the client's send stamp where it sent one (:mod:`runtime.api`).

**Faults.** An exception in a round (planning or an engine) ends every request of that round that
has no outcome yet with outcome ``error`` and the reason; the failure is logged once with its
traceback, counted and shown by ``/health``; the loop carries on with the next round.

**Shutdown.** :meth:`RoundServer.shutdown` stops admitting (503), rejects every queued request
(reason ``shutdown``), gives the running round ``shutdown_timeout_s``, then cancels it and ends its
remaining requests with outcome ``error``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.admission import AnswerMargin, price_alone
from runtime.executor import Cancelled
from runtime.live_request import LiveRequest
from runtime.metrics import ServeMetrics
from runtime.pair import ModelPair
from runtime.round_runner import RoundRunner
from runtime.serve_config import ServeConfig

log = logging.getLogger("specsched.serve")


class Refused(Exception):
    """A request the server does not take (HTTP status and message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RoundServer(RoundRunner):
    """Rounds of requests, planned by a scheduler and run on a model pair."""

    def __init__(self, cfg: ServeConfig, pair: ModelPair, metrics: ServeMetrics | None = None):
        super().__init__(cfg, pair, metrics)
        self.pending: list[LiveRequest] = []
        self.fresh: list[LiveRequest] = []  #: queued since the last arrival check (one check per turn of the event loop)
        self.running: list[LiveRequest] = []
        self.round_s = 0.0  #: EMA of recent rounds' wall time (planning included), for the queue's start estimate
        self.round_began = 0.0  #: monotonic time the running round began
        self.answer_margin = AnswerMargin()  #: learnt delay from a rejection's decision to its answer written, and the loop's lag
        self.sweep_s = min(self.cfg.window_s / 2, 0.1)
        self.warmed_up = False
        self.closing = False
        self.last_fault: dict[str, Any] | None = None
        self.wakeup: asyncio.Event | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specsched-round")  # one round on the device at a time

    # ----------------------------------------------------------------------------- requests
    def submit(self, req: LiveRequest) -> None:
        """Queue a request (event loop); raises :class:`Refused` (503) when closing or full."""
        if self.closing:
            raise Refused(503, "server is shutting down")
        if len(self.pending) >= self.cfg.max_queue:
            raise Refused(503, f"too many queued requests (max_queue={self.cfg.max_queue})")
        self.pending.append(req)
        self.metrics.queue.set(len(self.pending))
        # hopeless from the start: answered at once -- checked with every request that arrives in the
        # same turn of the event loop (a burst), priced in one vectorised call instead of one each
        self.fresh.append(req)
        if len(self.fresh) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._check_fresh)
            except RuntimeError:  # no event loop (a direct call): check now
                self._check_fresh()
        if self.wakeup is not None:
            self.wakeup.set()

    def _check_fresh(self) -> None:
        fresh, self.fresh = self.fresh, []
        self._expire(time.monotonic(), fresh)

    # ----------------------------------------------------------------------------- admission
    def price(self, reqs: list[LiveRequest]) -> None:
        """Each request's profile time alone on the device, where not set yet (:func:`runtime.admission.price_alone`)."""
        price_alone(self.base_cost, reqs, self.alpha, self.cfg.draft_depth)

    def min_service_s(self, req: LiveRequest) -> float:
        """The fastest ``req`` could be served: alone on the device, in its faster mode (calibrated)."""
        self.price([req])
        f = self.calibration.factor
        return min(req.alone_s[0] * f["ad"], req.alone_s[1] * f["sd"])

    def _expire(self, now: float, which: list[LiveRequest] | None = None) -> None:
        """Reject queued requests (or just the newly queued ``which``) that can no longer meet their
        deadline (see the module docstring)."""
        if not self.pending:
            return
        # the next round starts when the running one ends and its window (from its oldest request) has closed
        first_start = max(now, self.busy_until, self.pending[0].arrival + self.cfg.window_s)
        margin = self.sweep_s + self.answer_margin.value
        self.metrics.answer_margin.set(margin)
        # before any round has ended (the start of a burst) the running round's plan is the best guess of a round's length
        round_s = max(self.round_s, self.busy_until - self.round_began if self.running else 0.0)
        position = {id(r): i for i, r in enumerate(self.pending)}
        # new requests a round has taken already (or that have an outcome) are not the queue's any more
        check = self.pending if which is None else [r for r in which if id(r) in position]
        self.price(check)
        hopeless = []
        for r in check:
            ahead = position[id(r)] // self.cfg.max_round  # full rounds queued before this one's
            start = first_start + ahead * round_s
            need = self.min_service_s(r)
            if (start - r.arrival) + need + margin > r.deadline_s:
                hopeless.append((r, start - r.arrival, need))
        if not hopeless:
            return
        gone = {id(r) for r, _, _ in hopeless}
        self.pending = [r for r in self.pending if id(r) not in gone]
        self.metrics.queue.set(len(self.pending))
        for r, wait, need in hopeless:
            self.finish(r, "rejected", f"deadline: earliest start {wait:.2f} s after arrival + minimal service {need:.2f} s + answer margin {margin:.2f} s > deadline {r.deadline_s:.2f} s")

    def on_planned(self) -> None:
        """A round was just planned: sweep the queue now that its end is known (see :meth:`RoundRunner.on_planned`)."""
        if self.pending and not self.closing:
            self._expire(time.monotonic())

    async def _sweep(self) -> None:
        while not self.closing:
            asleep = time.monotonic()
            await asyncio.sleep(self.sweep_s)
            self.answer_margin.observe_lag(time.monotonic() - asleep - self.sweep_s)
            if self.pending:
                self._expire(time.monotonic())


    # ----------------------------------------------------------------------------- rounds
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.wakeup = asyncio.Event()
        if self.pending:
            self.wakeup.set()
        sweeper = asyncio.create_task(self._sweep())
        try:
            await loop.run_in_executor(self.pool, self.probe, False)  # warm-up: the first calls of a model are slow
        except Exception:  # noqa: BLE001 - a broken pair shows in the rounds' outcomes, not here
            log.warning("warm-up failed", exc_info=True)
        self.warmed_up = True
        try:
            while not self.closing:
                await self.wakeup.wait()
                self.wakeup.clear()
                if not self.pending:
                    continue
                if self.cfg.calibration_probe_s and time.monotonic() - self.calibrated_at > self.cfg.calibration_probe_s:
                    # probed while the round's window collects requests (its time mostly hidden in the
                    # window) and they are still queued: the sweep keeps answering the ones that cannot
                    # wait for it (a probe on a loaded host takes a while)
                    self.busy_until = max(self.busy_until, time.monotonic() + self.probe_s)
                    await loop.run_in_executor(self.pool, self.probe_or_warn)
                    if self.closing:
                        break
                    if not self.pending:  # every one was answered meanwhile
                        continue
                # a round collects requests for window_s from its oldest one (a backlog has waited already)
                await asyncio.sleep(max(0.0, self.cfg.window_s - (time.monotonic() - self.pending[0].arrival)))
                if self.closing:
                    break
                self._expire(time.monotonic())
                batch, self.pending = self.pending[: self.cfg.max_round], self.pending[self.cfg.max_round :]
                self.metrics.queue.set(len(self.pending))
                if self.pending:
                    self.wakeup.set()
                if not batch:
                    continue
                self.running = batch
                began = self.round_began = time.monotonic()
                try:
                    await loop.run_in_executor(self.pool, self.run_round, batch, loop)
                except Exception as err:  # noqa: BLE001 - any failure of a round ends its requests, not the server
                    self._fault(batch, err)
                finally:
                    self.running = []
                    self.busy_until = time.monotonic()
                    took = self.busy_until - began
                    self.round_s = took if self.round_s == 0 else 0.7 * self.round_s + 0.3 * took
        finally:
            sweeper.cancel()

    def _fault(self, batch: list[LiveRequest], err: BaseException) -> None:
        if isinstance(err, Cancelled):  # shutdown ended these requests already
            return
        log.error("round of %d request(s) failed; its unfinished requests end with outcome 'error'", len(batch), exc_info=err)
        self.metrics.fault()
        self.last_fault = {"at_unix_s": time.time(), "error": f"{type(err).__name__}: {err}", "requests": len(batch)}
        for r in batch:
            self.finish(r, "error", f"engine fault: {type(err).__name__}: {err}")


    # ----------------------------------------------------------------------------- shutdown, health
    async def shutdown(self) -> None:
        """Stop admitting, reject the queue, give the running round ``shutdown_timeout_s``, then end it."""
        if self.closing:
            return
        self.closing = True
        if self.wakeup is not None:
            self.wakeup.set()
        queued, self.pending = self.pending, []
        self.metrics.queue.set(0)
        for r in queued:
            self.finish(r, "rejected", "shutdown: the server is shutting down")
        deadline = time.monotonic() + self.cfg.shutdown_timeout_s
        while self.running and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.running:
            self.cancel.set()  # the engine stops at its next step
            for r in list(self.running):
                self.finish(r, "error", f"shutdown: the round did not finish within shutdown_timeout_s={self.cfg.shutdown_timeout_s}")
        self.pool.shutdown(wait=False)

    def health(self) -> dict[str, Any]:
        recent = self.last_fault is not None and time.time() - self.last_fault["at_unix_s"] < 60
        return {
            "status": "closing" if self.closing else ("degraded" if recent else "ok"),
            "warmed_up": self.warmed_up, "queued": len(self.pending), "running": len(self.running), "faults": self.metrics.counts["faults"], "last_fault": self.last_fault,
            "calibration": dict(self.calibration.factor), "answer_margin_s": self.sweep_s + self.answer_margin.value, "alpha_estimate": self.alpha, "scheduler": self.cfg.scheduler,
        }
