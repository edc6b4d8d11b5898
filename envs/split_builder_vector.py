"""The incremental exact check with AD, SD and ED for ``N`` rounds at once, in numpy (the v1 vector env's builder).

:class:`SplitPlanBuilder` is ``envs.split_builder.SplitScalarPlan`` (the scalar env's, in Python
floats) for many rounds: the same state and answers, one user per round at a time, by the array
forms of the same formulas (``envs.split_plan``); ``tests/test_split_plan.py`` holds the two to
equality with each other and with the exact check.
"""

from __future__ import annotations

import numpy as np

from envs.actions import action_indices
from envs.cost_model import CostModel, expected_tokens_per_iteration
from envs.feasibility import EPS, share_needed
from envs.split_plan import ed_budget, ed_memory, ed_share, ed_time


class SplitPlanBuilder:
    """:class:`SplitScalarPlan` for ``N`` rounds at once in numpy (the vector env's builder)."""

    MODES = 3

    def __init__(self, cost: CostModel, num_rounds: int, max_gamma: int):
        self.cost = cost
        self.n = num_rounds
        self.g_max = max_gamma
        self.gammas = np.arange(1, max_gamma + 1, dtype=np.int64)
        self.reset()

    def reset(self, which: np.ndarray | None = None) -> None:
        if which is None:
            n = self.n
            self.b = np.zeros((3, n), dtype=np.int64)
            self.s_max = np.zeros((3, n), dtype=np.int64)
            self.n_max = np.zeros((3, n), dtype=np.int64)
            self.u_max = np.zeros((3, n))
            self.slack_min = np.full((3, n), np.inf)
            self.sum_out = np.zeros((3, n), dtype=np.int64)
            self.share = np.zeros((3, n))
            self.mem = np.zeros((3, n))
            self.j_max = np.zeros(n, dtype=np.int64)
            self.gamma = np.zeros(n, dtype=np.int64)
            self.ed_j = np.zeros(n, dtype=np.int64)
            self.ed_q = np.zeros(n, dtype=np.int64)
            self.ed_p = np.zeros(n)
            self.ed_x = np.zeros(n)
            self._prepared = None
            return
        sel = np.asarray(which, dtype=bool)
        for arr, val in ((self.b, 0), (self.s_max, 0), (self.n_max, 0), (self.u_max, 0.0), (self.slack_min, np.inf), (self.sum_out, 0), (self.share, 0.0), (self.mem, 0.0)):
            arr[:, sel] = val
        for arr in (self.j_max, self.gamma, self.ed_j, self.ed_q, self.ed_p, self.ed_x):
            arr[sel] = 0
        self._prepared = None

    def prepare(self, inp: np.ndarray, out: np.ndarray, alpha: np.ndarray, up: np.ndarray, slack: np.ndarray, deadline: np.ndarray, ed_j: np.ndarray,
                ed_x: np.ndarray, ed_allowed: np.ndarray, ed_prefill: np.ndarray) -> np.ndarray:
        """Masks (N, 2 + 2G) for one candidate user per round; ED rows are (N, G), prefill (N,)."""
        c, g = self.cost, self.gammas[None, :]
        b_a = self.b[0] + 1
        s_a = np.maximum(self.s_max[0], inp)
        n_a = np.maximum(self.n_max[0], out)
        u_a = np.maximum(self.u_max[0], up)
        sl_a = np.minimum(self.slack_min[0], slack)
        share_a = share_needed(c.ad_time(b_a, s_a, n_a), b_a, u_a, sl_a)
        mem_a = c.ad_memory(b_a, s_a, n_a, self.sum_out[0] + out)
        sh, mm = self.share, self.mem
        ok_a = (share_a + sh[1] + sh[2] <= 1 + EPS) & (mem_a + mm[1] + mm[2] <= c.memory_budget(self.b[1] > 0) * (1 + EPS))
        # SD@g (the round's depth once fixed), exactly v0's PlanBuilder
        fixed = self.gamma[:, None]
        depth = np.where(fixed > 0, fixed, g)
        e = expected_tokens_per_iteration(alpha[:, None], depth)
        j_user = np.ceil(np.asarray(out, dtype=float)[:, None] / e - 1e-9).astype(np.int64)
        b_s = (self.b[1] + 1)[:, None]
        s_s = np.maximum(self.s_max[1], inp)[:, None]
        n_s = np.maximum(self.n_max[1], out)[:, None]
        j_s = np.maximum(self.j_max[:, None], j_user)
        u_s = np.maximum(self.u_max[1], up)[:, None]
        sl_s = np.minimum(self.slack_min[1], slack)[:, None]
        share_s = share_needed(c.sd_time(b_s, s_s, n_s, j_s, depth), b_s, u_s, sl_s)
        mem_s = c.sd_memory(b_s, s_s, n_s, (self.sum_out[1] + out)[:, None], depth)
        ok_s = (sh[0][:, None] + share_s + sh[2][:, None] <= 1 + EPS) & (mm[0][:, None] + mem_s + mm[2][:, None] <= c.memory_budget(True) * (1 + EPS))
        ok_s &= (fixed == 0) | (g == fixed)
        # ED@g
        b_e = (self.b[2] + 1)[:, None]
        s_e = np.maximum(self.s_max[2], inp)[:, None]
        n_e = np.maximum(self.n_max[2], out)[:, None]
        u_e = np.maximum(self.u_max[2], up)[:, None]
        t_e = np.minimum(self.slack_min[2], deadline)[:, None]
        p_e = np.maximum(self.ed_p, ed_prefill)[:, None]
        j_e = np.maximum(self.ed_j[:, None], ed_j)
        q_e = np.maximum(self.ed_q[:, None], g + 1)
        x_e = np.maximum(self.ed_x[:, None], ed_x)
        sum_e = (self.sum_out[2] + out)[:, None]
        share_e = ed_share(ed_time(c, b_e, s_e, n_e, j_e, q_e), b_e, ed_budget(t_e, u_e, p_e, j_e, x_e))
        mem_e = ed_memory(c, b_e, s_e, n_e, sum_e, q_e)
        ok_e = (sh[0][:, None] + sh[1][:, None] + share_e <= 1 + EPS) & (mm[0][:, None] + mm[1][:, None] + mem_e <= (c.memory_budget(self.b[1] > 0) * (1 + EPS))[..., None]) & ed_allowed
        masks = np.concatenate([np.ones((self.n, 1), dtype=bool), ok_a[:, None], ok_s, ok_e], axis=1)
        self._prepared = (np.asarray(out), (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s),
                          (b_e, s_e, n_e, u_e, t_e, p_e, j_e, q_e, x_e, share_e, mem_e), masks)
        return masks

    def apply(self, actions: np.ndarray) -> np.ndarray:
        """Commit one action per round for the last prepared user; invalid actions act as reject."""
        if self._prepared is None:
            raise RuntimeError("SplitPlanBuilder.apply called before prepare() for this user")
        out, cand_a, cand_s, cand_e, masks = self._prepared
        self._prepared = None
        g_max, rows = self.g_max, np.arange(self.n)
        actions = action_indices(actions, self.n, 2 + 2 * g_max)
        valid = (actions >= 0) & masks[rows, np.maximum(actions, 0)]
        to = valid & (actions == 1)
        if to.any():
            for arr, v in zip((self.b, self.s_max, self.n_max, self.u_max, self.slack_min, self.share, self.mem), (*cand_a[:5], cand_a[5], cand_a[6]), strict=True):
                arr[0] = np.where(to, v, arr[0])
            self.sum_out[0] = np.where(to, self.sum_out[0] + out, self.sum_out[0])
        to = valid & (actions >= 2) & (actions <= 1 + g_max)
        if to.any():
            col = np.clip(actions - 2, 0, g_max - 1)
            b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s = (np.broadcast_to(x, (self.n, g_max))[rows, col] for x in cand_s)
            for arr, v in zip((self.b, self.s_max, self.n_max, self.u_max, self.slack_min, self.share, self.mem), (b_s, s_s, n_s, u_s, sl_s, share_s, mem_s), strict=True):
                arr[1] = np.where(to, v, arr[1])
            self.j_max = np.where(to, j_s, self.j_max)
            self.sum_out[1] = np.where(to, self.sum_out[1] + out, self.sum_out[1])
            self.gamma = np.where(to & (self.gamma == 0), actions - 1, self.gamma)
        to = valid & (actions >= 2 + g_max)
        if to.any():
            col = np.clip(actions - 2 - g_max, 0, g_max - 1)
            b_e, s_e, n_e, u_e, t_e, p_e, j_e, q_e, x_e, share_e, mem_e = (np.broadcast_to(x, (self.n, g_max))[rows, col] for x in cand_e)
            for arr, v in zip((self.b, self.s_max, self.n_max, self.u_max, self.slack_min, self.share, self.mem), (b_e, s_e, n_e, u_e, t_e, share_e, mem_e), strict=True):
                arr[2] = np.where(to, v, arr[2])
            self.ed_j = np.where(to, j_e, self.ed_j)
            self.ed_q = np.where(to, q_e, self.ed_q)
            self.ed_p = np.where(to, p_e, self.ed_p)
            self.ed_x = np.where(to, x_e, self.ed_x)
            self.sum_out[2] = np.where(to, self.sum_out[2] + out, self.sum_out[2])
        return valid

    def candidate_ad_share(self) -> np.ndarray:
        """The AD batch's least share if the last prepared user joined it (N,): an observation feature."""
        if self._prepared is None:
            raise RuntimeError("SplitPlanBuilder.candidate_ad_share called before prepare()")
        return self._prepared[1][5]
