"""One round on the model pair: plan it, run its AD / SD batches, learn from the measured times.

:class:`RoundRunner` holds the device side of the live server: the planning profile, the model
pair (with a second copy of the target for AD when two devices are given), the online calibration
(:mod:`runtime.calibration`) and the scheduler that plans on the calibrated profile. It plans a
round of requests, answers the ones the plan rejects, runs the AD / SD batches on the engines
(:mod:`runtime.executor`) and feeds the measured device times back into the calibration and the
acceptance estimate; a short fixed probe does the same between rounds.

It is separate from the queue (:class:`runtime.rounds.RoundServer`: arrivals, deadline sweeps,
the round loop, faults, shutdown), which builds on it: this module knows nothing of waiting
requests, only of the round it is given.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from agents.registry import make_scheduler
from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations1
from envs.plan import AD, SD
from envs.workload import Round
from runtime.calibration import CalibratedCostModel, StepCalibration
from runtime.engines import ad_steps, sd_steps
from runtime.executor import (
    BatchRun,
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

if TYPE_CHECKING:
    from agents.scheduler import Scheduler
    from envs.plan import Plan
    from runtime.device_turns import DeviceTurns

log = logging.getLogger("specsched.serve")
PROBE_PROMPT = "def probe(values):\n    total = 0\n    for v in values:\n"
PROBE_TOKENS = 8
#: the calibration's assumed relative spread until a mode has a few samples: the first one is a probe
#: of one row (a round's batch under a CPU hog was measured ~15 % slower than its probe said)
FIRST_REL_SD = 0.2


def batch_shares(plan: Plan) -> dict[str, float]:
    """The AD and SD batches' compute shares in ``plan`` (floored at 1e-6): AD ``z``, SD
    ``1 - z - ed_share`` -- ED's share, if any, is the split verifier's (:mod:`runtime.split_rounds`)."""
    return {"ad": max(float(plan.z), 1e-6), "sd": max(1.0 - float(plan.z) - float(plan.ed_share), 1e-6)}


class RoundRunner:
    """Plans rounds of live requests with a scheduler and runs them on a model pair."""

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
        # (stacklevel 4: the warning points at whoever built the server, through its __init__ and this one)
        warn_if_measured_elsewhere(profile, machine_fingerprint(cfg.device, cfg.dtype, pair=pair), stacklevel=4)
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
        self.busy_until = 0.0  #: monotonic time the running round is expected to end
        self.calibrated_at = -float("inf")  #: monotonic time of the last calibration sample
        self.probe_s = 0.0  #: wall time of the last speed probe (the warm-up's at first: an upper estimate)
        self.cancel = threading.Event()
        #: turns on the one device with another thread (placement=split: the verifier); None: the engines alone
        self.device_turns: DeviceTurns | None = None

    def make_scheduler(self) -> Scheduler:
        """The round planner (a hook: runtime.split_rounds plans with a v1 scheduler)."""
        cfg = self.cfg
        return make_scheduler(cfg.scheduler, self.cost, EnvConfig.max_gamma, draft_depth=cfg.draft_depth, seed=0, policy_path=cfg.policy_path)

    def share_device(self, plan: Plan, round_start: float) -> None:
        """A new round's plan (the round began at monotonic ``round_start``), before any of its users
        is placed (a hook: runtime.split_rounds sets the verifier's and the engines' shares of the
        device from it)."""

    def place_other(self, req: LiveRequest, index: int, plan: Plan, loop: asyncio.AbstractEventLoop) -> bool:
        """A plan's mode other than AD / SD for ``req`` (row ``index``): True if taken care of, else it is
        rejected. A hook: runtime.split_rounds hands ED users to their edges."""
        return False

    def on_planned(self) -> None:
        """Event loop, after a round is planned and ``busy_until`` says when it ends (a hook: the queue
        of :class:`runtime.rounds.RoundServer` answers the requests that cannot wait that long)."""

    # ----------------------------------------------------------------------------- outcomes
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

    # ----------------------------------------------------------------------------- planning and running
    def as_round(self, batch: list[LiveRequest], now: float) -> Round:
        """The round the scheduler plans for ``batch`` at monotonic time ``now`` (deadlines left from now)."""
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
            if mode == "ad":
                steps = ad_steps(self.ad_target, [prompt], PROBE_TOKENS, pad_id=tok.pad_id)
            else:
                steps = sd_steps(self.pair.target, self.pair.draft, [prompt], g, PROBE_TOKENS, pad_id=tok.pad_id)
            # its steps as the engines' turns when the verifier shares the device: timed as a round's batch is
            run = run_shared({mode: (steps, 1.0)}, turns=self.device_turns)[mode]
            res, real = run.result, run.device_s
            if mode == "ad":
                predicted = self.base_cost.ad_time1(1, len(prompt), PROBE_TOKENS)
            else:
                predicted = self.base_cost.sd_time1(1, len(prompt), PROBE_TOKENS, max(res.iterations), g)
            if learn and (factor := self.calibration.update(mode, real, predicted)) is not None:
                self.metrics.calibration.labels(mode).set(factor)
        self.probe_s = time.perf_counter() - began
        if learn:
            self.calibrated_at = time.monotonic()

    def probe_or_warn(self) -> None:
        """:meth:`probe`, a failure logged and otherwise ignored (the calibration stays as it was; the round decides for itself)."""
        try:
            self.probe()
        except Exception:  # noqa: BLE001 - a failed probe leaves the calibration as it was; the round decides for itself
            log.warning("calibration probe failed", exc_info=True)

    def run_round(self, batch: list[LiveRequest], loop: asyncio.AbstractEventLoop) -> None:
        """Plan and run one round (a worker thread; exceptions propagate to the caller)."""
        began = time.monotonic()
        plan = self.scheduler.plan(self.as_round(batch, began))
        decided = time.monotonic()
        self.metrics.round_done()
        alpha_planned = self.alpha
        self.share_device(plan, began)
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
        loop.call_soon_threadsafe(self.on_planned)
        tok = self.pair.tokenizer
        outbox = Outbox(loop, self.deliver, self.cfg.stream_interval_s, self.metrics)
        jobs, shares = {}, batch_shares(plan)
        for mode, members in groups.items():
            common = dict(max_new_tokens=[r.max_tokens for r in members], eos_id=tok.eos_id, pad_id=tok.pad_id, **batch_callbacks(members, outbox),
                          **row_sampling(members))
            prompts = [r.prompt_ids for r in members]
            if mode == "ad":
                jobs[mode] = (ad_steps(self.ad_target, prompts, **common), shares["ad"])
            else:
                jobs[mode] = (sd_steps(self.pair.target, self.pair.draft, prompts, plan.gamma, **common), shares["sd"])
        try:
            if self.cfg.devices and len(jobs) > 1:
                runs = run_parallel({name: gen for name, (gen, _) in jobs.items()}, outbox.flush, self.cancel)
            else:
                runs = run_shared(jobs, outbox.flush, self.cancel, turns=self.device_turns)
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
