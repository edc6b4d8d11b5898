"""What actually happens to a round under a plan: each user's latency and whether it is served.

Schedulers decide on predictions; the outcome uses the realised output lengths and acceptance
rates of the round (equal to the predictions unless the config adds error). Latency of user k in
mode m: ``U_m + F_k + t_d,k(realised)``; the user is **served** iff it was admitted and that
latency is at most its deadline. ``F_k``, the compute finish time, has two switches:

* ``completion``: ``"batch"`` (the paper; default) -- every user finishes at its batch's end
  (padded batches); ``"own"`` -- user k finishes after its own last token: the work of its batch
  up to then (AD: the prefill and ``O_k - 1`` decode passes of the batch; SD: the prefills and its
  own ``J_k`` iterations), at the batch's size and padded prompt.
* ``sharing``: ``"fixed"`` (the paper; default) -- each batch runs at its share for its whole
  life, so work ``w`` is done at ``w / share``; ``"work_conserving"`` -- weighted time-slicing as
  ``runtime.serve`` does it: once the first batch ends at ``T_1``, the other has the device alone,
  so its work ``w > share * T_1`` is done at ``T_1 + (w - share * T_1)``; ``"steps"`` (opt-in) --
  the executor's actual rule, whole engine steps (it cannot split a forward pass, so a batch's
  first step, e.g. AD's whole prefill, makes the other batch wait instead of sharing):
  :mod:`envs.step_sharing`. Both fluid models stay the default.

Memory is fixed at admission from the predictions; a realised output longer than predicted is
not modelled as an out-of-memory event (a paged KV allocator would absorb or preempt it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD, SD, Plan
from envs.step_sharing import step_finish_times
from envs.workload import Round

if TYPE_CHECKING:
    from numpy.typing import ArrayLike


@dataclass
class Outcome:
    latency_s: np.ndarray  #: end-to-end latency per user (inf if rejected)
    served: np.ndarray  #: bool per user
    ad_batch_s: float  #: when the AD batch's compute ends, seconds from the round's start (0 if empty)
    sd_batch_s: float

    @property
    def served_count(self) -> int:
        return int(self.served.sum())


def simulate_sd_iterations(rng: np.random.Generator, output_tokens: ArrayLike, alpha: ArrayLike, gamma: int) -> np.ndarray:
    """Draw the SD iterations each user needs, token by token.

    Each iteration the draft's tokens are accepted one after another with probability ``alpha``
    until the first rejection or ``gamma`` acceptances; the target always adds one token (bonus or
    correction). Returns the iterations needed to reach ``output_tokens``.
    """
    out = np.asarray(output_tokens, dtype=np.int64)
    a = np.clip(np.asarray(alpha, dtype=float), 0.0, 1.0 - 1e-9)
    if out.size == 0:
        return np.zeros(0, dtype=np.int64)
    j_cap = int(out.max())  # at least one token per iteration
    accepted = np.minimum(rng.geometric(1.0 - a[:, None], size=(len(out), j_cap)) - 1, gamma)
    produced = np.cumsum(accepted + 1, axis=1)
    return (produced < out[:, None]).sum(axis=1) + 1


def _finish_times(share: dict[int, float], total: dict[int, float], work: dict[int, np.ndarray], sharing: str) -> dict[int, np.ndarray]:
    """When each amount of ``work`` (full-device seconds) of each batch is done, from the round's start."""
    finish = {m: w / share[m] if share[m] > 0 else np.full(w.shape, np.inf) for m, w in work.items()}
    if sharing == "work_conserving" and len(total) == 2 and all(share[m] > 0 for m in total):
        first = min(total, key=lambda m: total[m] / share[m])
        last = SD if first == AD else AD
        t1, z = total[first] / share[first], share[last]
        if last in work:  # once the first batch ends, the other has the device alone
            finish[last] = np.where(work[last] > z * t1, t1 + (work[last] - z * t1), finish[last])
    return finish


def evaluate_plan(cost: CostModel, rnd: Round, plan: Plan, rng: np.random.Generator | None = None, simulate_acceptance: bool = False,
                  completion: str = "batch", sharing: str = "fixed") -> Outcome:
    """Realised latency and served flags of ``plan`` on ``rnd``.

    ``simulate_acceptance`` draws SD acceptance token by token from ``rng``; otherwise each user
    needs ``ceil(O / E(alpha, gamma))`` iterations at its realised ``O`` and ``alpha``.
    ``completion`` and ``sharing``: see the module docstring.
    """
    if completion not in ("batch", "own"):
        raise ValueError(f"completion must be 'batch' or 'own', got {completion!r}")
    if sharing not in ("fixed", "work_conserving", "steps"):
        raise ValueError(f"sharing must be 'fixed', 'work_conserving' or 'steps', got {sharing!r}")
    k = rnd.num_users
    latency = np.full(k, np.inf)
    gamma = int(plan.gamma)
    share = {AD: float(plan.z), SD: 1.0 - float(plan.z)}
    members, total, work = {}, {}, {}
    sd_iters = None  #: per SD member, its realised iterations (the whole-step model needs them)
    for mode in (AD, SD):
        idx = np.flatnonzero(plan.modes == mode)
        if idx.size == 0:
            continue
        b = idx.size
        s_max = int(rnd.input_tokens[idx].max())
        out = rnd.realized_output_tokens[idx]
        n_max = int(out.max())
        if mode == AD:
            total[mode] = float(cost.ad_time(b, s_max, n_max))
            own = cost.ad_time(np.full(b, b), s_max, out) if completion == "own" else None
        else:
            if simulate_acceptance:
                if rng is None:
                    raise ValueError("simulate_acceptance needs an rng")
                j = simulate_sd_iterations(rng, out, rnd.realized_alpha[idx], gamma)
            else:
                j = sd_iterations(out, rnd.realized_alpha[idx], gamma)
            sd_iters = j
            total[mode] = float(cost.sd_time(b, s_max, n_max, int(j.max()), gamma))
            own = cost.sd_time(np.full(b, b), s_max, n_max, j, gamma) if completion == "own" else None
        members[mode] = idx
        work[mode] = np.full(b, total[mode]) if own is None else np.asarray(own, dtype=float)
    if sharing == "steps":
        finish, batch_end_s = step_finish_times(cost, rnd, plan, sd_iters, completion)
        ends = {m: np.array([t]) for m, t in batch_end_s.items()}
    else:
        finish = _finish_times(share, total, work, sharing)
        ends = _finish_times(share, total, {m: np.array([t]) for m, t in total.items()}, sharing)
    batch_s = {AD: 0.0, SD: 0.0}
    for mode, idx in members.items():
        batch_s[mode] = float(ends[mode][0])
        latency[idx] = rnd.uplink_s[idx].max() + finish[mode] + rnd.realized_downlink_s[idx]
    served = np.isfinite(latency) & (latency <= rnd.deadline_s * (1 + 1e-9))
    return Outcome(latency, served, batch_s[AD], batch_s[SD])
