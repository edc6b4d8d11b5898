"""Rounds: the queue, deadline-aware admission, planning, and running each plan on the model pair.

Requests wait in a FIFO queue; a round takes up to ``max_round`` of them (the rest carry over to
the next round) once the oldest has waited ``window_s``. The scheduler plans the round on the
profile scaled by the online calibration (:mod:`runtime.calibration`); rejected requests are
answered at once and the AD / SD batches run on the engines (:mod:`runtime.executor`).

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
import copy
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations1
from envs.plan import AD, SD
from envs.workload import Round
from runtime.admission import AnswerMargin, price_alone
from runtime.calibration import CalibratedCostModel, StepCalibration
from runtime.engines import ad_steps, drain, sd_steps
from runtime.executor import (
    BatchRun,
    Cancelled,
    Outbox,
    batch_callbacks,
    row_sampling,
    run_parallel,
    run_shared,
)
from runtime.fingerprint import machine_fingerprint, warn_if_measured_elsewhere
from runtime.live_request import LiveRequest
from runtime.machine_profile import resolve_profile
from runtime.metrics import ServeMetrics
from runtime.pair import ModelPair
from runtime.serve_config import ServeConfig, check_profile_matches_pair, policy_profile_warning

log = logging.getLogger("specsched.serve")
PROBE_PROMPT = "def probe(values):\n    total = 0\n    for v in values:\n"
PROBE_TOKENS = 8
#: the calibration's assumed relative spread until a mode has a few samples: the first one is a probe
#: of one row (a round's batch under a CPU hog was measured ~15 % slower than its probe said)
FIRST_REL_SD = 0.2


class Refused(Exception):
    """A request the server does not take (HTTP status and message)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class RoundServer:
    """Rounds of requests, planned by a scheduler and run on a model pair."""

    def __init__(self, cfg: ServeConfig, pair: ModelPair, metrics: ServeMetrics | None = None):
        self.cfg = cfg.validate()
        self.pair = pair
        # profile=auto: measured on this machine (cached per machine fingerprint); a name or path: as it is
        self.planning = resolve_profile(cfg.profile, pair=pair, device=cfg.devices[0] if cfg.devices else cfg.device, dtype=cfg.dtype, auto=cfg.auto_profile)
        log.info(self.planning.describe())
        profile = self.planning.profile
        check_profile_matches_pair(profile, getattr(pair.target, "config", None), getattr(pair.draft, "config", None))
        warning = policy_profile_warning(cfg.policy_path if cfg.scheduler == "policy" else None, profile)
        if warning:
            log.warning(warning)
        # a measured table from another machine or pair plans with times this host does not have
        warn_if_measured_elsewhere(profile, machine_fingerprint(cfg.device, cfg.dtype, pair=pair), stacklevel=3)
        # with two devices the SD pair lives on the second and AD gets its own target on the first
        self.ad_target = pair.target
        if cfg.devices:
            self.ad_target = copy.deepcopy(pair.target).to(cfg.devices[0])
            pair.target.to(cfg.devices[1])
            pair.draft.to(cfg.devices[1])
        self.calibration = StepCalibration(cfg.calibration_weight, tuple(cfg.calibration_bounds), cfg.calibration_margin_sd, FIRST_REL_SD)
        self.base_cost = CostModel(profile)
        self.cost = CalibratedCostModel(self.base_cost, self.calibration)
        # lengths and deadlines of live requests are not bounded by a workload config: wide ranges
        # plans may use draft depths up to the environment's default largest one (as ServeConfig's draft_depth)
        self.scheduler = self.make_scheduler()
        self.alpha = cfg.alpha_init
        self.metrics = metrics or ServeMetrics()
        self.metrics.alpha.set(self.alpha)
        self.pending: list[LiveRequest] = []
        self.fresh: list[LiveRequest] = []  #: queued since the last arrival check (one check per turn of the event loop)
        self.running: list[LiveRequest] = []
        self.busy_until = 0.0  #: monotonic time the running round is expected to end
        self.round_s = 0.0  #: EMA of recent rounds' wall time (planning included), for the queue's start estimate
        self.round_began = 0.0  #: monotonic time the running round began
        self.answer_margin = AnswerMargin()  #: learnt delay from a rejection's decision to its answer written, and the loop's lag
        self.sweep_s = min(cfg.window_s / 2, 0.1)
        self.calibrated_at = -float("inf")  #: monotonic time of the last calibration sample
        self.probe_s = 0.0  #: wall time of the last speed probe (the warm-up's at first: an upper estimate)
        self.warmed_up = False
        self.closing = False
        self.cancel = threading.Event()
        self.last_fault: dict[str, Any] | None = None
        self.wakeup: asyncio.Event | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specsched-round")  # one round on the device at a time

    def make_scheduler(self):
        """The round planner (a hook: runtime.split_rounds plans with a v1 scheduler)."""
        cfg = self.cfg
        return make_scheduler(cfg.scheduler, self.cost, EnvConfig.max_gamma, draft_depth=cfg.draft_depth, seed=0, policy_path=cfg.policy_path)

    def place_other(self, req: LiveRequest, index: int, plan, loop) -> bool:
        """A plan's mode other than AD / SD for ``req`` (row ``index``): True if taken care of, else it is
        rejected. A hook: runtime.split_rounds hands ED users to their edges."""
        return False

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

    def finish(self, req: LiveRequest, outcome: str, reason: str = "") -> None:
        """End a request with its one outcome (event loop; later calls are ignored)."""
        if req.outcome is not None:
            return
        req.outcome, req.reason = outcome, reason
        if req.completed_at is None:
            req.completed_at = time.monotonic()
        latency = req.completed_at - req.arrival
        self.metrics.outcome(outcome, reason, latency)
        if req.queue is not None:
            req.queue.put_nowait(None)
        req.done.set()

    def deliver(self, texts: list[tuple[LiveRequest, str]], ends: list[LiveRequest]) -> None:
        """Event loop: hand streamed text to the waiting responses, then end finished requests."""
        for r, piece in texts:
            if r.queue is not None and r.outcome is None:
                r.queue.put_nowait(piece)
        for r in ends:
            on_time = r.completed_at - r.arrival <= r.deadline_s
            self.finish(r, "served" if on_time else "late", "" if on_time else "deadline missed")

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

    def _sweep_now(self) -> None:
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
                    await loop.run_in_executor(self.pool, self._probe_before_round)
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

    def _round(self, batch: list[LiveRequest], now: float) -> Round:
        n = len(batch)
        return Round.from_requests(
            input_tokens=[len(r.prompt_ids) for r in batch],
            output_tokens=[r.max_tokens for r in batch],
            deadline_s=[max(r.deadline_s - (now - r.arrival), 1e-6) for r in batch],
            alpha=np.full(n, self.alpha),
            # the prompts are here already and the text goes back over loopback: no link time left
            uplink_s=0.0,
            downlink_s=0.0,
        )

    def _predicted_s(self, cost: CostModel, mode: str, members: list[LiveRequest], gamma: int, outputs: list[int] | None = None,
                     iterations: list[int] | None = None) -> float:
        """A batch's time in the cost model (predicted outputs, or the realised ones when given)."""
        s = max(len(r.prompt_ids) for r in members)
        out = outputs or [r.max_tokens for r in members]
        if mode == "ad":
            return cost.ad_time1(len(members), s, max(out))
        j = max(iterations) if iterations else max(sd_iterations1(n, self.alpha, gamma) for n in out)
        return cost.sd_time1(len(members), s, max(out), j, gamma)

    def probe(self, learn: bool = True) -> None:
        """A short AD and an SD run of one fixed prompt, timed against the profile: the calibration's
        sample when the last one is older than ``calibration_probe_s`` (the host may have changed
        while the server was idle), taken while the next round's window collects requests. ``learn=False``: a warm-up (first calls of a model are slow)."""
        tok = self.pair.tokenizer
        prompt = tok.encode(PROBE_PROMPT) or [0]
        g = self.cfg.draft_depth
        began = time.perf_counter()
        for mode in ("ad", "sd"):
            start = time.perf_counter()
            if mode == "ad":
                res = drain(ad_steps(self.ad_target, [prompt], PROBE_TOKENS, pad_id=tok.pad_id))
                predicted = self.base_cost.ad_time1(1, len(prompt), PROBE_TOKENS)
            else:
                res = drain(sd_steps(self.pair.target, self.pair.draft, [prompt], g, PROBE_TOKENS, pad_id=tok.pad_id))
                predicted = self.base_cost.sd_time1(1, len(prompt), PROBE_TOKENS, max(res.iterations), g)
            real = time.perf_counter() - start
            if learn and (factor := self.calibration.update(mode, real, predicted)) is not None:
                self.metrics.calibration.labels(mode).set(factor)
        self.probe_s = time.perf_counter() - began
        if learn:
            self.calibrated_at = time.monotonic()

    def _probe_before_round(self) -> None:
        try:
            self.probe()
        except Exception:  # noqa: BLE001 - a failed probe leaves the calibration as it was; the round decides for itself
            log.warning("calibration probe failed", exc_info=True)

    def run_round(self, batch: list[LiveRequest], loop) -> None:
        """Plan and run one round (a worker thread; exceptions propagate to :meth:`run`)."""
        began = time.monotonic()
        plan = self.scheduler.plan(self._round(batch, began))
        decided = time.monotonic()
        self.metrics.round_done()
        alpha_planned = self.alpha
        groups: dict[str, list[LiveRequest]] = {}
        for i, (r, m) in enumerate(zip(batch, plan.modes, strict=True)):
            r.alpha_planned, r.round_start, r.planned_at = alpha_planned, began, decided
            if m in (AD, SD):
                r.mode = "ad" if m == AD else "sd"
                groups.setdefault(r.mode, []).append(r)
            elif not self.place_other(r, i, plan, loop):
                r.completed_at = decided
                loop.call_soon_threadsafe(self.finish, r, "rejected", "admission: the plan cannot meet this deadline")
        if not groups:
            return
        predicted = {m: self._predicted_s(self.cost, m, g, plan.gamma) for m, g in groups.items()}
        self.busy_until = decided + (max(predicted.values()) if self.cfg.devices else sum(predicted.values()))
        # the queue now knows when this round ends: the requests that cannot wait for it are answered
        # at once, not at the next sweep (at the start of a burst, most of the queue)
        loop.call_soon_threadsafe(self._sweep_now)
        tok = self.pair.tokenizer
        outbox = Outbox(loop, self.deliver, self.cfg.stream_interval_s, self.metrics)
        jobs = {}
        for mode, members in groups.items():
            common = dict(max_new_tokens=[r.max_tokens for r in members], eos_id=tok.eos_id, pad_id=tok.pad_id, **batch_callbacks(members, outbox),
                          **row_sampling(members))
            prompts = [r.prompt_ids for r in members]
            if mode == "ad":
                jobs[mode] = (ad_steps(self.ad_target, prompts, **common), max(plan.z, 1e-6))
            else:
                jobs[mode] = (sd_steps(self.pair.target, self.pair.draft, prompts, plan.gamma, **common), max(1.0 - plan.z, 1e-6))
        try:
            if self.cfg.devices and len(jobs) > 1:
                runs = run_parallel({name: gen for name, (gen, _) in jobs.items()}, outbox.flush, self.cancel)
            else:
                runs = run_shared(jobs, outbox.flush, self.cancel)
        finally:
            outbox.flush(force=True)  # what finished before a fault is answered as served / late
        self._learn(groups, runs, plan.gamma)
        for members in groups.values():
            for r in members:
                outbox.finish_row(r, None)  # a row that ended without its engine reporting it (none expected)
        outbox.flush(force=True)

    def _learn(self, groups: dict[str, list[LiveRequest]], runs: dict[str, BatchRun], gamma: int) -> None:
        """Calibration (real / predicted device time per batch) and the acceptance EMA, from the engines' results."""
        for mode, run in runs.items():
            res = run.result
            outputs = [max(len(t), 1) for t in res.tokens]
            predicted = self._predicted_s(self.base_cost, mode, groups[mode], gamma, outputs, res.iterations or None)
            factor = self.calibration.update(mode, run.device_s, predicted)
            if factor is not None:
                self.metrics.calibration.labels(mode).set(factor)
        self.calibrated_at = time.monotonic()
        if "sd" in runs and np.isfinite(runs["sd"].result.alpha_hat):
            self.alpha = float(np.clip(0.7 * self.alpha + 0.3 * runs["sd"].result.alpha_hat, 0.05, 0.99))
            self.metrics.alpha.set(self.alpha)

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
