"""What actually happens to a round under a plan: each user's latency and whether it is served.

Schedulers decide on predictions; the outcome uses the realised output lengths and acceptance
rates of the round (equal to the predictions unless the config adds error). Latency of user k in
mode m: ``U_m + C_m(realised) / share_m + t_d,k(realised)``; the user is **served** iff it was
admitted and that latency is at most its deadline. Every user finishes at its batch's end (padded
batches), then its own downlink.

Memory is fixed at admission from the predictions; a realised output longer than predicted is
not modelled as an out-of-memory event (a paged KV allocator would absorb or preempt it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from envs.feasibility import CostModel, sd_iterations
from envs.plan import AD, SD, Plan
from envs.workload import Round


@dataclass
class Outcome:
    latency_s: np.ndarray  #: end-to-end latency per user (inf if rejected)
    served: np.ndarray  #: bool per user
    ad_batch_s: float  #: realised AD batch compute time at its share (0 if empty)
    sd_batch_s: float

    @property
    def served_count(self) -> int:
        return int(self.served.sum())


def simulate_sd_iterations(rng: np.random.Generator, output_tokens, alpha, gamma: int) -> np.ndarray:
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


def evaluate_plan(cost: CostModel, rnd: Round, plan: Plan, rng: np.random.Generator | None = None, simulate_acceptance: bool = False) -> Outcome:
    """Realised latency and served flags of ``plan`` on ``rnd``.

    ``simulate_acceptance`` draws SD acceptance token by token from ``rng``; otherwise each user
    needs ``ceil(O / E(alpha, gamma))`` iterations at its realised ``O`` and ``alpha``.
    """
    k = rnd.num_users
    latency = np.full(k, np.inf)
    gamma = int(plan.gamma)
    batch_s = {AD: 0.0, SD: 0.0}
    for mode, share in ((AD, plan.z), (SD, 1.0 - plan.z)):
        idx = np.flatnonzero(plan.modes == mode)
        if idx.size == 0:
            continue
        b = idx.size
        s_max = int(rnd.input_tokens[idx].max())
        out = rnd.realized_output_tokens[idx]
        n_max = int(out.max())
        if mode == AD:
            c = float(cost.ad_time(b, s_max, n_max))
        else:
            if simulate_acceptance:
                if rng is None:
                    raise ValueError("simulate_acceptance needs an rng")
                j = simulate_sd_iterations(rng, out, rnd.realized_alpha[idx], gamma)
            else:
                j = sd_iterations(out, rnd.realized_alpha[idx], gamma)
            c = float(cost.sd_time(b, s_max, n_max, int(j.max()), gamma))
        t = c / share if share > 0 else np.inf
        batch_s[mode] = t
        latency[idx] = rnd.uplink_s[idx].max() + t + rnd.realized_downlink_s[idx]
    served = np.isfinite(latency) & (latency <= rnd.deadline_s * (1 + 1e-9))
    return Outcome(latency, served, batch_s[AD], batch_s[SD])
