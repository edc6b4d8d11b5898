"""The incremental exact check: build plans one user at a time, O(1) per user.

:class:`PlanBuilder` holds ``N`` rounds' plans as arrays (the vector environment, the baselines and
the exact optimum's search); :class:`ScalarPlan` is the same for one round in plain Python floats
(the scalar environment's hot path). Both answer, for the next user, which actions (reject, AD,
SD@1..G) keep the plan feasible under the exact check of :mod:`envs.feasibility` -- the same
formulas, evaluated on the batches' running aggregates -- and commit one. The first SD admission
fixes the round's draft depth.
"""

from __future__ import annotations

import math

import numpy as np

from envs.actions import action_indices
from envs.cost_model import CostModel, sd_iterations
from envs.feasibility import EPS, share_needed, share_needed1, shares_for


class ScalarPlan:
    """:class:`PlanBuilder` for one round, in plain Python floats (the scalar env's hot path).

    Same state, same answers as ``PlanBuilder(cost, 1, G)`` (the vector-vs-scalar env test holds
    them to bit equality), an order of magnitude less overhead per user.

    Speed: the closed-form times are memoised by their exact arguments, as in
    ``envs.split_builder.SplitScalarPlan`` (``ad_time1``; SD's ``sd_parts1`` / ``sd_parts_all1``,
    which do not depend on the user's ``J``): once a batch is full, most users leave its aggregates
    unchanged (a large round's tail of rejects), and the same call with the same arguments gives the
    same float, so no decision changes. The memos live as long as the plan (its cost model is fixed)
    and are emptied past ``MEMO_MAX`` entries, and at a reset when the model's
    :meth:`~envs.cost_model.CostModel.times_version` moved (a live calibration's factors).
    """

    MEMO_MAX = 1 << 14  #: entries per plan's memos before they are emptied (bounds memory on long runs)

    def __init__(self, cost: CostModel, max_gamma: int):
        self.cost = cost
        self.g_max = max_gamma
        self._ad_memo: dict[tuple[int, int, int], float] = {}  # (b, S, N) -> AD seconds
        self._sd_memo: dict[tuple[int, int, int, int], tuple] = {}  # (b, S, N, g) -> sd_parts1; g = 0: sd_parts_all1
        self._times_version = cost.times_version()
        self._own_sd_memory = type(cost).sd_memory1 is CostModel.sd_memory1  # prepare inlines the base formula only
        self.reset()

    def reset(self) -> None:
        # index 0 = AD, 1 = SD
        self.b = [0, 0]
        self.s_max = [0, 0]
        self.n_max = [0, 0]
        self.u_max = [0.0, 0.0]
        self.slack_min = [math.inf, math.inf]
        self.sum_out = [0, 0]
        self.share = [0.0, 0.0]
        self.mem = [0.0, 0.0]
        self.j_max = 0
        self.gamma = 0
        self._prepared = None
        version = self.cost.times_version()  # a calibrated model's times move between rounds: its memos go with them
        if len(self._ad_memo) + len(self._sd_memo) > self.MEMO_MAX or version != self._times_version:
            self._ad_memo.clear()
            self._sd_memo.clear()
        self._times_version = version

    def prepare(self, inp: int, out: int, alpha: float, up: float, slack: float) -> list[bool]:
        c = self.cost
        b_a = self.b[0] + 1
        s_a = max(self.s_max[0], inp)
        n_a = max(self.n_max[0], out)
        u_a = max(self.u_max[0], up)
        sl_a = min(self.slack_min[0], slack)
        key = (b_a, s_a, n_a)
        t_a = self._ad_memo.get(key)
        if t_a is None:
            t_a = self._ad_memo[key] = c.ad_time1(b_a, s_a, n_a)
        share_a = share_needed1(t_a, b_a, u_a, sl_a)
        mem_a = c.ad_memory1(b_a, s_a, n_a, self.sum_out[0] + out)
        ok_a = share_a + self.share[1] <= 1 + EPS and mem_a + self.mem[1] <= c.memory_budget1(self.b[1] > 0) * (1 + EPS)
        masks = [True, ok_a] + [False] * self.g_max
        b_s = self.b[1] + 1
        s_s = max(self.s_max[1], inp)
        n_s = max(self.n_max[1], out)
        u_s = max(self.u_max[1], up)
        sl_s = min(self.slack_min[1], slack)
        budget_sd = c.memory_budget1(True) * (1 + EPS)
        sd = {}
        # sd_time1 = prefill + float(j) * iteration: before the round's depth is fixed every depth is
        # priced in one call (the depth-free passes once; the same floats as sd_time1's)
        if type(c).sd_time1 is not CostModel.sd_time1 or type(c).sd_parts1 is not CostModel.sd_parts1:
            # a cost model with its own SD time (e.g. runtime.calibration's): priced through it, per depth
            depths = [self.gamma] if self.gamma > 0 else range(1, self.g_max + 1)
            prefill, iterations = None, {}
        elif self.gamma > 0:
            depths = [self.gamma]
            key = (b_s, s_s, n_s, self.gamma)
            parts = self._sd_memo.get(key)
            if parts is None:
                parts = self._sd_memo[key] = c.sd_parts1(b_s, s_s, n_s, self.gamma)
            prefill, iteration = parts
            iterations = {self.gamma: iteration}
        else:
            depths = range(1, self.g_max + 1)
            key = (b_s, s_s, n_s, 0)
            parts = self._sd_memo.get(key)
            if parts is None:
                parts = self._sd_memo[key] = c.sd_parts_all1(b_s, s_s, n_s, self.g_max)
            prefill, *per_depth = parts
            iterations = dict(zip(depths, per_depth, strict=True))
        # sd_iterations1, share_needed1 (b_s >= 1) and the base sd_memory1 inlined, their operations in
        # their order: a large round's all-AD plans never fix a depth, so every user prices all G
        j_max, sum_s, share_ad, mem_ad, lim = self.j_max, self.sum_out[1] + out, self.share[0], self.mem[0], 1 + EPS
        budget_s = sl_s - u_s
        per_user, fb, fs, kv_sd, sd_user = c.kv_memory == "per_user", float(b_s), float(s_s), c.kv_sd, c.sd_user_bytes
        own_memory = self._own_sd_memory
        sure = alpha > 1.0 - 1e-9
        for g in depths:
            gf = float(g)
            e = gf + 1.0 if sure else (1.0 - alpha ** (gf + 1.0)) / (1.0 - alpha)
            j_s = math.ceil(float(out) / e - 1e-9)
            j_s = j_s if j_s > j_max else j_max
            t_s = c.sd_time1(b_s, s_s, n_s, j_s, g) if prefill is None else prefill + float(j_s) * iterations[g]
            share_s = t_s / budget_s if budget_s > 0 else math.inf
            if own_memory:
                kv = (fb * (fs + g) + sum_s) * kv_sd if per_user else fb * (fs + n_s + g) * kv_sd
                mem_s = kv + fb * sd_user if sd_user else kv
            else:
                mem_s = c.sd_memory1(b_s, s_s, n_s, sum_s, g)
            sd[g] = (j_s, share_s, mem_s)
            masks[1 + g] = share_ad + share_s <= lim and mem_ad + mem_s <= budget_sd
        self._prepared = ((inp, out), (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, u_s, sl_s), sd, masks)
        return masks

    def apply(self, action: int) -> bool:
        if self._prepared is None:
            raise RuntimeError("ScalarPlan.apply called before prepare() for this user")
        (inp, out), cand_a, cand_s, sd, masks = self._prepared
        self._prepared = None
        if not (0 <= action < 2 + self.g_max) or not masks[action]:
            return False
        if action == 1:
            self.b[0], self.s_max[0], self.n_max[0], self.u_max[0], self.slack_min[0], self.share[0], self.mem[0] = cand_a
            self.sum_out[0] += out
        elif action >= 2:
            g = action - 1
            self.b[1], self.s_max[1], self.n_max[1], self.u_max[1], self.slack_min[1] = cand_s
            self.j_max, self.share[1], self.mem[1] = sd[g]
            self.sum_out[1] += out
            self.gamma = self.gamma or g
        return True

    @property
    def is_prepared(self) -> bool:
        """Whether a user is prepared (and not yet applied)."""
        return self._prepared is not None

    def candidate_ad_share(self) -> float:
        """The AD batch's minimal compute share if the last prepared user joined AD."""
        if self._prepared is None:
            raise RuntimeError("ScalarPlan.candidate_ad_share called before prepare() for this user")
        return self._prepared[1][5]

    def shares(self) -> tuple[float, float]:
        z, lam = shares_for(self.share[0], self.share[1], self.mem[0], self.mem[1], self.b[0], self.b[1])
        return float(z), float(lam)


class PlanBuilder:
    """Incremental exact check for ``N`` rounds at once: add users one at a time, O(1) each.

    Holds each mode's aggregates per round. :meth:`prepare` answers, for one candidate
    user per round, which of the ``2 + G`` actions (reject, AD, SD@1..G) keep the plan feasible;
    :meth:`apply` commits actions. The first SD admission fixes the round's draft depth.
    """

    def __init__(self, cost: CostModel, num_rounds: int, max_gamma: int):
        self.cost = cost
        self.n = num_rounds
        self.g_max = max_gamma
        self.gammas = np.arange(1, max_gamma + 1, dtype=np.int64)
        self.reset()

    def reset(self, which: np.ndarray | None = None) -> None:
        """Empty the plans (all rounds, or those where ``which`` is true)."""
        sel = slice(None) if which is None else np.asarray(which, dtype=bool)
        if which is None:
            n = self.n
            self.b = np.zeros((2, n), dtype=np.int64)  # row 0 = AD, row 1 = SD
            self.s_max = np.zeros((2, n), dtype=np.int64)
            self.n_max = np.zeros((2, n), dtype=np.int64)
            self.j_max = np.zeros(n, dtype=np.int64)
            self.u_max = np.zeros((2, n))
            self.slack_min = np.full((2, n), np.inf)
            self.sum_out = np.zeros((2, n), dtype=np.int64)
            self.share = np.zeros((2, n))  # C_m / beta_m
            self.mem = np.zeros((2, n))
            self.gamma = np.zeros(n, dtype=np.int64)  # 0 = not fixed yet
            self._prepared = None
            return
        for arr, val in ((self.b, 0), (self.s_max, 0), (self.n_max, 0), (self.u_max, 0.0), (self.slack_min, np.inf), (self.sum_out, 0), (self.share, 0.0), (self.mem, 0.0)):
            arr[:, sel] = val
        self.j_max[sel] = 0
        self.gamma[sel] = 0
        self._prepared = None

    def take(self, rows: np.ndarray) -> PlanBuilder:
        """A new builder holding copies of the given rounds' plans (rows may repeat): for search."""
        rows = np.asarray(rows, dtype=np.int64)
        new = PlanBuilder.__new__(PlanBuilder)
        new.cost, new.g_max, new.gammas, new.n = self.cost, self.g_max, self.gammas, len(rows)
        for name in ("b", "s_max", "n_max", "u_max", "slack_min", "sum_out", "share", "mem"):
            setattr(new, name, getattr(self, name)[:, rows])
        new.j_max = self.j_max[rows]
        new.gamma = self.gamma[rows]
        new._prepared = None
        return new

    def _candidates(self, inp, out, alpha, up, slack):
        """Aggregates, shares and memory if the user joined AD (N,) or SD@g (N, G)."""
        c = self.cost
        b_a = self.b[0] + 1
        s_a = np.maximum(self.s_max[0], inp)
        n_a = np.maximum(self.n_max[0], out)
        u_a = np.maximum(self.u_max[0], up)
        sl_a = np.minimum(self.slack_min[0], slack)
        share_a = share_needed(c.ad_time(b_a, s_a, n_a), b_a, u_a, sl_a)
        mem_a = c.ad_memory(b_a, s_a, n_a, self.sum_out[0] + out)

        g = self.gammas[None, :]
        fixed = self.gamma[:, None]
        depth = np.where(fixed > 0, fixed, g)
        j_user = sd_iterations(out[:, None], alpha[:, None], depth)
        b_s = (self.b[1] + 1)[:, None]
        s_s = np.maximum(self.s_max[1], inp)[:, None]
        n_s = np.maximum(self.n_max[1], out)[:, None]
        j_s = np.maximum(self.j_max[:, None], j_user)
        u_s = np.maximum(self.u_max[1], up)[:, None]
        sl_s = np.minimum(self.slack_min[1], slack)[:, None]
        share_s = share_needed(c.sd_time(b_s, s_s, n_s, j_s, depth), b_s, u_s, sl_s)
        mem_s = c.sd_memory(b_s, s_s, n_s, (self.sum_out[1] + out)[:, None], depth)
        allowed_depth = (fixed == 0) | (g == fixed)
        return (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s), allowed_depth

    def prepare(self, inp: np.ndarray, out: np.ndarray, alpha: np.ndarray, up: np.ndarray, slack: np.ndarray) -> np.ndarray:
        """Evaluate one candidate user per round; returns and caches the (N, 2 + G) bool masks.

        Columns: reject (always allowed), AD, SD@1..G. :meth:`apply` commits against the last
        prepared user, so each user's candidates are computed once.
        """
        user = tuple(np.asarray(v) for v in (inp, out, alpha, up, slack))
        cand_a, cand_s, allowed = self._candidates(*user)
        share_a, mem_a = cand_a[5], cand_a[6]
        share_s, mem_s = cand_s[6], cand_s[7]
        sd_used = self.b[1] > 0
        ok_a = (share_a + self.share[1] <= 1 + EPS) & (mem_a + self.mem[1] <= self.cost.memory_budget(sd_used) * (1 + EPS))
        budget_sd = self.cost.memory_budget(True)
        ok_s = (self.share[0][:, None] + share_s <= 1 + EPS) & (self.mem[0][:, None] + mem_s <= budget_sd * (1 + EPS)) & allowed
        masks = np.concatenate([np.ones((self.n, 1), dtype=bool), ok_a[:, None], ok_s], axis=1)
        self._prepared = (user, cand_a, cand_s, masks)
        return masks

    def apply(self, actions: np.ndarray) -> np.ndarray:
        """Commit one action per round for the last prepared user; invalid actions act as reject.

        Returns the (N,) bool array of actions that were valid.
        """
        if self._prepared is None:
            raise RuntimeError("PlanBuilder.apply called before prepare() for this user")
        (inp, out, alpha, up, slack), cand_a, cand_s, masks = self._prepared
        self._prepared = None
        # the env's action rule: out-of-range and non-integral actions name no action (never truncated)
        actions = action_indices(actions, self.n, 2 + self.g_max)
        valid = (actions >= 0) & masks[np.arange(self.n), np.maximum(actions, 0)]
        to_ad = valid & (actions == 1)
        if to_ad.any():
            b_a, s_a, n_a, u_a, sl_a, share_a, mem_a = cand_a
            self.b[0] = np.where(to_ad, b_a, self.b[0])
            self.s_max[0] = np.where(to_ad, s_a, self.s_max[0])
            self.n_max[0] = np.where(to_ad, n_a, self.n_max[0])
            self.u_max[0] = np.where(to_ad, u_a, self.u_max[0])
            self.slack_min[0] = np.where(to_ad, sl_a, self.slack_min[0])
            self.sum_out[0] = np.where(to_ad, self.sum_out[0] + out, self.sum_out[0])
            self.share[0] = np.where(to_ad, share_a, self.share[0])
            self.mem[0] = np.where(to_ad, mem_a, self.mem[0])
        to_sd = valid & (actions >= 2)
        if to_sd.any():
            col = np.clip(actions - 2, 0, self.g_max - 1)
            rows = np.arange(self.n)
            b_s, s_s, n_s, j_s, u_s, sl_s, share_s, mem_s = (np.broadcast_to(x, (self.n, self.g_max))[rows, col] for x in cand_s)
            self.b[1] = np.where(to_sd, b_s, self.b[1])
            self.s_max[1] = np.where(to_sd, s_s, self.s_max[1])
            self.n_max[1] = np.where(to_sd, n_s, self.n_max[1])
            self.j_max = np.where(to_sd, j_s, self.j_max)
            self.u_max[1] = np.where(to_sd, u_s, self.u_max[1])
            self.slack_min[1] = np.where(to_sd, sl_s, self.slack_min[1])
            self.sum_out[1] = np.where(to_sd, self.sum_out[1] + out, self.sum_out[1])
            self.share[1] = np.where(to_sd, share_s, self.share[1])
            self.mem[1] = np.where(to_sd, mem_s, self.mem[1])
            self.gamma = np.where(to_sd & (self.gamma == 0), actions - 1, self.gamma)
        return valid

    def candidate_shares(self) -> tuple[np.ndarray, np.ndarray]:
        """Minimal compute shares of each batch if the last prepared user joined it.

        ``(ad_share (N,), sd_share (N, G))``: the AD batch's share with the user in AD, and the SD
        batch's share with the user in SD at each depth 1..G (the round's depth where it is fixed).
        """
        if self._prepared is None:
            raise RuntimeError("PlanBuilder.candidate_shares called before prepare() for this user")
        _, cand_a, cand_s, _ = self._prepared
        return cand_a[5], cand_s[6]

    def candidate_memory(self) -> tuple[np.ndarray, np.ndarray]:
        """KV bytes of each batch if the last prepared user joined it: ``(ad (N,), sd (N, G))``."""
        if self._prepared is None:
            raise RuntimeError("PlanBuilder.candidate_memory called before prepare() for this user")
        _, cand_a, cand_s, _ = self._prepared
        return cand_a[6], cand_s[7]

    @property
    def is_prepared(self) -> bool:
        """Whether a user is prepared (and not yet applied)."""
        return self._prepared is not None

    def shares(self) -> tuple[np.ndarray, np.ndarray]:
        """A valid ``(z, lam)`` per round for the plans built so far."""
        return shares_for(self.share[0], self.share[1], self.mem[0], self.mem[1], self.b[0], self.b[1])
