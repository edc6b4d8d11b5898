"""Lower envelopes of a round's batch costs over *up-sets* of batch aggregates, for proven cuts.

A batch of mode m is summarised by its size ``b`` and its aggregates: longest input ``S``, longest
output ``N``, most SD iterations ``J`` (SD), tightest slack ``sigma = min (T_k - t_d,k)`` and slowest
uplink ``u``. Each aggregate takes one of the round's own values, so it is an index into a sorted
list of *levels*, ordered from least to most demanding (inputs, outputs, iterations, uplinks
ascending; slacks descending).

The cut generator of :mod:`agents.round_milp` needs, for thresholds ``(b, levels)``, a number
that no batch with size ``>= b`` and every aggregate at least as demanding can beat:

* AD: ``C_A`` is tabulated over ``(b, S, N)`` and replaced by its *suffix minimum* along every
  axis, ``env[b, i, j] = min_{b' >= b, i' >= i, j' >= j} C_A(b', S_i', N_j')``;
* SD: ``C_S = P(b, S) + J * I(b, c)`` with ``P`` the two prefills and ``I`` one iteration at the
  context ``c = S + N / 2`` (``envs.cost_model.CostModel.sd_time``); ``P`` and ``I`` are replaced
  by their suffix minima over ``(b, S)`` and ``(b, c)``, and ``J >= J_thr``, ``I >= 0``.

So the envelope is a valid lower bound on the batch cost of every batch in the up-set **whatever
the latency source** (measured tables need not be monotone: the CPU profile is not), and equals
the cost itself when the cost is monotone (roofline profiles). The budget ``beta = sigma - u``
only shrinks in the up-set, so ``envelope / beta`` bounds the compute share from below.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from envs.cost_model import CostModel, sd_iterations
from envs.plan import AD
from envs.workload import Round

ATTRS = {AD: ("input", "output", "slack", "uplink"), 2: ("input", "output", "iterations", "slack", "uplink")}


def _suffix_min(a: np.ndarray) -> np.ndarray:
    """Minimum over every index at least as large, along every axis."""
    out = a
    for axis in range(a.ndim):
        out = np.flip(np.minimum.accumulate(np.flip(out, axis), axis=axis), axis)
    return out


class CostEnvelope:
    """Levels of one round's aggregates and lower bounds on each mode's batch cost (seconds).

    ``levels[mode][attr]`` are the sorted level values; ``user_level[mode][attr][k]`` user k's
    index into them. Sizes ``b`` run 0..K (an empty batch costs 0).
    """

    def __init__(self, cost: CostModel, rnd: Round, gamma: int):
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        self.k = k = rnd.num_users
        self.gamma = gamma
        iters = sd_iterations(rnd.output_tokens, rnd.alpha, gamma)
        values = {
            "input": rnd.input_tokens.astype(np.int64),
            "output": rnd.output_tokens.astype(np.int64),
            "iterations": iters.astype(np.int64),
            "slack": rnd.slack_s.astype(float),
            "uplink": rnd.uplink_s.astype(float),
        }
        self.user_values = values  #: each user's aggregate values (iterations at this gamma)
        self.levels: dict[str, np.ndarray] = {}
        self.user_level: dict[str, np.ndarray] = {}
        for name, v in values.items():
            lv = np.unique(v)
            if name == "slack":
                lv = lv[::-1]  # demanding = small slack
            self.levels[name] = lv
            self.user_level[name] = np.searchsorted(-lv if name == "slack" else lv, -v if name == "slack" else v)
        b = np.arange(k + 1)
        s_lv, n_lv = self.levels["input"], self.levels["output"]
        with np.errstate(invalid="ignore"):
            ad = np.asarray(cost.ad_time(b[:, None, None], s_lv[None, :, None], n_lv[None, None, :]), dtype=float)
        self.ad_env = _suffix_min(ad)
        monotone = bool(np.array_equal(self.ad_env, ad))
        # SD: prefills over (b, S), one iteration over (b, c) on the half-token grid of c = S + N / 2
        s = np.maximum(s_lv.astype(float), 1.0)
        bb = np.maximum(b, 1)
        pre = cost.tau_l.tau(bb[:, None], s[None, :], s[None, :]) + cost.tau_s.tau(bb[:, None], s[None, :], s[None, :])
        pre = np.where(b[:, None] > 0, pre, 0.0)
        self.sd_pre_env = _suffix_min(np.asarray(pre, dtype=float))
        monotone &= bool(np.array_equal(self.sd_pre_env, pre))
        c_max = float(s.max() + n_lv.max() / 2.0)
        self.c_grid = np.arange(1.0, c_max + 0.5, 0.5)
        c = self.c_grid[None, :]
        # the cost model's own iteration price (engine overhead, verify choice included)
        it = cost.sd_iteration_time(bb[:, None], c, float(gamma))
        it = np.where(b[:, None] > 0, np.maximum(it, 0.0), 0.0)
        self.sd_iter_env = _suffix_min(np.asarray(it, dtype=float))
        #: whether the costs are monotone on this round's levels (the envelopes are the costs);
        #: bounds that assume monotone costs (``agents.mode_solver``) are only used when it holds
        self.monotone = monotone and bool(np.array_equal(self.sd_iter_env, it))

    def attrs(self, mode: int) -> tuple[str, ...]:
        return ATTRS[mode]

    def budget(self, slack_level: int, uplink_level: int) -> float:
        """``beta = sigma - u`` (seconds) at the given levels."""
        return float(self.levels["slack"][slack_level] - self.levels["uplink"][uplink_level])

    def cost_lb(self, mode: int, b: int, lv: dict[str, int]) -> float:
        """A lower bound on ``C_m`` over every batch of size >= b with aggregates at levels >= lv."""
        if b <= 0:
            return 0.0
        i = lv["input"]
        if mode == AD:
            return float(self.ad_env[b, i, lv["output"]])
        c = max(float(self.levels["input"][i]), 1.0) + float(self.levels["output"][lv["output"]]) / 2.0
        ci = min(int(np.searchsorted(self.c_grid, c - 1e-9)), len(self.c_grid) - 1)
        return float(self.sd_pre_env[b, i] + float(self.levels["iterations"][lv["iterations"]]) * self.sd_iter_env[b, ci])

    def share_lb(self, mode: int, b: int, lv: dict[str, int]) -> float:
        """A lower bound on ``C_m / beta_m`` over the same up-set (inf where ``beta <= 0``)."""
        if b <= 0:
            return 0.0
        beta = self.budget(lv["slack"], lv["uplink"])
        if beta <= 0:
            return float("inf")
        return self.cost_lb(mode, b, lv) / beta

    def level_of(self, attr: str, values: ArrayLike) -> np.ndarray:
        """Level indices of aggregate values (values not in the round map to the next level up)."""
        lv = self.levels[attr]
        if attr == "slack":
            idx = np.searchsorted(-lv, -np.asarray(values, dtype=float), side="left")
        else:
            idx = np.searchsorted(lv, np.asarray(values), side="left")
        return np.clip(idx, 0, len(lv) - 1)

    def cost_lb_arrays(self, mode: int, size: ArrayLike, i_in: ArrayLike, i_out: ArrayLike, i_iter: ArrayLike | None = None) -> np.ndarray:
        """:meth:`cost_lb` for broadcasting arrays of sizes (1..K) and level indices."""
        size = np.clip(size, 0, self.k)
        if mode == AD:
            return self.ad_env[size, i_in, i_out]
        s = np.maximum(self.levels["input"][i_in].astype(float), 1.0)
        ctx = s + self.levels["output"][i_out] / 2.0
        ci = np.minimum(np.searchsorted(self.c_grid, ctx - 1e-9), len(self.c_grid) - 1)
        return self.sd_pre_env[size, i_in] + self.levels["iterations"][i_iter] * self.sd_iter_env[size, ci]

    def plan_levels(self, mode: int, members: np.ndarray) -> dict[str, int]:
        """The level indices of a non-empty batch's aggregates."""
        return {a: int(self.user_level[a][members].max()) for a in self.attrs(mode)}
