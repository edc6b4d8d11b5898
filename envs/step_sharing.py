"""Whole-step sharing: two batches time-sliced on one device the way the live executor does it.

``envs.outcome.evaluate_plan(..., sharing="steps")`` uses this module; the default stays the fluid
model (``sharing="fixed"``, or ``"work_conserving"``), in which both batches progress at their
compute shares at once.

**The rule** (``runtime.executor.run_shared``): each batch is a sequence of engine steps; the batch
with the least ``used device seconds / share`` runs its next step, the whole step, alone on the
device; ties go to the batch that came first (the executor's job order: the order in which the
modes first appear in the round's plan). A batch is done after its last step.

**Why it exists.** The executor cannot split a forward pass: a batch's first step -- AD: the
target's whole prefill (which yields the first token); SD: both models' prefills and the first
draft-verify iteration -- runs to its end before the other batch gets the device back. In the
fluid model the other batch progresses at its share meanwhile, so the fluid model ends the other
batch's first users earlier than the server does. Over a long stretch the two rules give each
batch the same share, and both are work-conserving (the device idles only when both are done),
so the round's last step ends at the same time; they differ in *who* waits for a whole step.

**Steps** (seconds on the whole device, from the same profile as the batch times of
``envs.cost_model``): AD: ``tau_L(b, S, S)``, then ``tau_L(b, 1, S + i) + o_A(b)`` for
``i = 1 .. N - 1``; SD: ``tau_L(b, S, S) + tau_S(b, S, S)`` plus one iteration, then ``J - 1`` more
iterations at the batch's mean context (as ``CostModel.sd_time``). Their sum is the batch time of
the cost model up to float rounding (AD: its decode sum is a prefix-sum table). A cost model that
scales batch times (a subclass such as ``runtime.calibration.CalibratedCostModel``) scales every
step of that batch by the same ratio. With one batch the rule is the whole device for that batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

import numpy as np

from envs.cost_model import CostModel
from envs.plan import AD, SD, Plan
from envs.workload import Round

K = TypeVar("K", bound=Hashable)

MIN_SHARE = 1e-9  #: the executor's floor on a share (a batch at share 0 still runs, after the other)


def job_order(modes: np.ndarray) -> list[int]:
    """The executor's job order: AD / SD in the order they first appear among ``modes`` (its tie-break)."""
    return [m for m in dict.fromkeys(int(x) for x in np.asarray(modes)) if m in (AD, SD)]


def run_whole_steps(jobs: Mapping[K, tuple[Sequence[float], float]]) -> dict[K, np.ndarray]:
    """When each step of each job ends (seconds from the start) under the executor's rule.

    ``jobs`` maps a name to ``(step_s, share)``: the job's step times on the whole device, in order,
    and its compute share. The job with the least ``used_s / share`` runs its next step whole; ties
    go to the earlier job in ``jobs``' order. Returns, per job, the end time of each of its steps.
    """
    for name, (steps_s, share) in jobs.items():
        if not share >= 0:
            raise ValueError(f"share of job {name!r} must be >= 0, got {share!r}")
        if any(not d >= 0 for d in steps_s):
            raise ValueError(f"step_s of job {name!r} must all be >= 0 seconds, got {list(steps_s)!r}")
    used_s, pos, now_s = dict.fromkeys(jobs, 0.0), dict.fromkeys(jobs, 0), 0.0
    ends_s: dict[K, list[float]] = {name: [] for name in jobs}
    live = [name for name in jobs if len(jobs[name][0])]
    while live:
        name = min(live, key=lambda n: used_s[n] / max(jobs[n][1], MIN_SHARE))
        d = jobs[name][0][pos[name]]
        now_s, used_s[name], pos[name] = now_s + d, used_s[name] + d, pos[name] + 1
        ends_s[name].append(now_s)
        if pos[name] == len(jobs[name][0]):
            live.remove(name)
    return {name: np.asarray(v, dtype=float) for name, v in ends_s.items()}


def batch_steps_s(cost: CostModel, rnd: Round, plan: Plan, mode: int, sd_iters: np.ndarray | None = None) -> tuple[list[float], np.ndarray]:
    """One batch's engine steps (seconds each, whole device) and, per member, the index of its last step.

    Members are the users of ``mode`` in ``plan``, at the round's realised outputs; an AD user's
    last step is its ``O_k``-th token's, an SD user's its ``J_k``-th iteration (``sd_iters``, one per
    member, required for SD). Steps are scaled as ``cost`` scales the batch time (see the module docstring).
    """
    idx = np.flatnonzero(plan.modes == mode)
    if idx.size == 0:
        raise ValueError(f"plan has no user in mode {mode}")
    b, s = idx.size, int(rnd.input_tokens[idx].max())
    outs = rnd.realized_output_tokens[idx].astype(int)
    n_max = int(outs.max())
    prefill_s = float(cost.tau_l.tau1(b, s, s))
    if mode == AD:  # the prefill yields the first token; then one step per token
        engine_s = float(cost.engine.ad(b)) if cost.engine is not None else 0.0
        steps_s = [prefill_s] + [float(cost.tau_l.tau1(b, 1, s + i)) + engine_s for i in range(1, n_max)]
        scale = cost.ad_time1(b, s, n_max) / CostModel.ad_time1(cost, b, s, n_max)
        last = outs - 1
    elif mode == SD:
        if sd_iters is None or len(sd_iters) != b:
            raise ValueError(f"sd_iters must give one iteration count per SD member ({b}), got {None if sd_iters is None else len(sd_iters)}")
        j = np.asarray(sd_iters, dtype=np.int64)
        gamma = int(plan.gamma)
        iteration_s = float(cost.sd_iteration_time(b, s + n_max / 2.0, gamma))  # the mean context, as CostModel.sd_time
        steps_s = [prefill_s + float(cost.tau_s.tau1(b, s, s)) + iteration_s] + [iteration_s] * (int(j.max()) - 1)
        scale = cost.sd_time1(b, s, n_max, int(j.max()), gamma) / CostModel.sd_time1(cost, b, s, n_max, int(j.max()), gamma)
        last = j - 1
    else:
        raise ValueError(f"mode must be AD ({AD}) or SD ({SD}), got {mode}")
    if scale != 1.0:  # a plain CostModel gives exactly 1.0: its steps are left bit-for-bit as computed
        steps_s = [d * scale for d in steps_s]
    return steps_s, np.asarray(last, dtype=np.int64)


def step_finish_times(cost: CostModel, rnd: Round, plan: Plan, sd_iters: np.ndarray | None, completion: str) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    """Per mode present in ``plan``: each member's compute finish time and the batch's end (seconds from the round's start).

    ``completion`` ``"own"``: a member finishes with its own last step; ``"batch"``: with its batch's last step.
    """
    if completion not in ("batch", "own"):
        raise ValueError(f"completion must be 'batch' or 'own', got {completion!r}")
    share = {AD: float(plan.z), SD: 1.0 - float(plan.z)}
    batches = {m: batch_steps_s(cost, rnd, plan, m, sd_iters if m == SD else None) for m in job_order(plan.modes)}
    ends_s = run_whole_steps({m: (steps_s, share[m]) for m, (steps_s, _) in batches.items()})
    finish = {m: ends_s[m][last] if completion == "own" else np.full(last.size, ends_s[m][-1]) for m, (_, last) in batches.items()}
    return finish, {m: float(ends_s[m][-1]) for m in batches}
