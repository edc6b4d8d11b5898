"""Incremental exact check with AD, SD and ED: add users one at a time, O(1) (x G depths) each.

:class:`SplitScalarPlan` (one round, Python floats: the scalar env's hot path) and
:class:`SplitPlanBuilder` (``N`` rounds in numpy: the vector env) hold each mode's aggregates and
answer, for one candidate user, which of the ``2 + 2G`` actions keep the plan feasible:
reject, AD, SD@1..G (the first SD admission fixes the round's depth, as in v0), ED@1..G (each ED
user its own depth). The formulas are ``envs.split_plan``'s; sums are taken ``(A + S) + E`` as
there, so both builders equal :func:`envs.split_plan.check_plan_split` bit for bit, and with no ED
user they take exactly v0's decisions (``envs.plan_builder``; AD/SD arithmetic in the same order).
"""

from __future__ import annotations

import math
from itertools import compress

import numpy as np

from envs.actions import action_indices
from envs.cost_model import CostModel, sd_iterations1
from envs.feasibility import EPS
from envs.split_plan import ed_budget, ed_memory, ed_share, ed_time


class SplitScalarPlan:
    """One round's plan with three batches, in Python floats. ED rows come from ``split_plan.EdUsers``.

    Speed (the scalar env's hot path, issue #13): the closed-form times are memoised by their exact
    arguments (``CostModel.ad_time1``, ``sd_parts1`` -- SD's prefill and per-iteration time, which
    do not depend on the user's ``J`` -- the ED batch's prefill and verify passes
    ``tau_L.tau1``), so a user that leaves a batch's aggregates unchanged re-prices nothing; the
    same calls with the same arguments give the same floats, so every decision is unchanged. The
    memos live as long as the plan (its cost model is fixed) and are emptied past ``MEMO_MAX`` entries.
    Under random play the AD memo hits about one call in five (its key holds the batch maxima with
    the user's own); the SD memo, keyed without ``J``, serves every user that leaves the SD batch's
    ``(b, S, N)`` unchanged, and so does the ED memo (one batch's verify passes serve all depths).
    Until a round's first SD admission fixes its depth, all G depths are priced by one
    :meth:`~envs.cost_model.CostModel.sd_parts_all1` (the depth-free passes once); after it, SD is one straight-line check. ED
    depths run over the allowed ones only, budget first, and stop at the first depth whose KV does not
    fit (the KV never falls with the depth); candidates are kept only for allowed actions.
    ``tests/test_split_plan.py`` compares all of this with the exact check, on random and binding rounds.
    """

    MEMO_MAX = 1 << 14  #: entries per memo before it is emptied (bounds memory on long runs)

    def __init__(self, cost: CostModel, max_gamma: int):
        self.cost = cost
        self.g_max = max_gamma
        self._ad_memo: dict[tuple[int, int, int], float] = {}
        self._sd_memo: dict[tuple, object] = {}  # (b, S, N, g) -> (prefill, iteration) seconds; (b, S, N, J, g) -> seconds for an overridden sd_time1
        self._sd_parts = type(cost).sd_time1 is CostModel.sd_time1 and hasattr(cost, "sd_parts1")
        # CostModel.sd_parts_all1 matches sd_parts1 only for a cost model that keeps the base sd_parts1
        self._sd_all = self._sd_parts and type(cost).sd_parts1 is CostModel.sd_parts1
        self._sd_all_memo: dict[tuple[int, int, int], tuple[float, ...]] = {}  # (b, S, N) -> (prefill, iteration at depth 1, ..., G) seconds
        self._ed_memo: dict[tuple[int, int, int], dict[int, float]] = {}  # (b, S, N) -> {q: tau_L verify pass; 0: the prefill pass}
        self._depths = range(1, max_gamma + 1)
        self.reset()

    def reset(self) -> None:
        # index 0 = AD, 1 = SD, 2 = ED (slack_min of ED is its min deadline: no downlink)
        self.b = [0, 0, 0]
        self.s_max = [0, 0, 0]
        self.n_max = [0, 0, 0]
        self.u_max = [0.0, 0.0, 0.0]
        self.slack_min = [math.inf, math.inf, math.inf]
        self.sum_out = [0, 0, 0]
        self.share = [0.0, 0.0, 0.0]
        self.mem = [0.0, 0.0, 0.0]
        self.j_max = 0
        self.gamma = 0
        self.ed = [0, 0, 0.0, 0.0]  # ED: j_max, q_max, p_max, x_max
        self._prepared = None
        # the memory limits with and without SD's weights, as the exact check computes them
        c = self.cost
        self._mem_lim = (c.memory_budget1(False) * (1 + EPS), c.memory_budget1(True) * (1 + EPS))
        if len(self._ad_memo) + len(self._sd_memo) + len(self._ed_memo) + len(self._sd_all_memo) > self.MEMO_MAX:
            for memo in (self._ad_memo, self._sd_memo, self._ed_memo, self._sd_all_memo):
                memo.clear()

    def prepare(self, inp: int, out: int, alpha: float, up: float, slack: float, deadline: float = math.inf, ed=None) -> list[bool]:
        """Masks for one user; ``ed`` = (J row, X row, allowed row, prefill) over depths 1..G, or None."""
        c, g_max = self.cost, self.g_max
        b, s_max, n_max, u_max, slack_min, sum_out, sh, mm = self.b, self.s_max, self.n_max, self.u_max, self.slack_min, self.sum_out, self.share, self.mem
        lim = 1 + EPS
        mem_lim = self._mem_lim[b[1] > 0]
        # max(x, y) is ``y if y > x else x`` and min(x, y) ``y if y < x else x`` (Python keeps the first of equals)
        b_a = b[0] + 1
        s_a = s_max[0]
        s_a = inp if inp > s_a else s_a
        n_a = n_max[0]
        n_a = out if out > n_a else n_a
        u_a = u_max[0]
        u_a = up if up > u_a else u_a
        sl_a = slack_min[0]
        sl_a = slack if slack < sl_a else sl_a
        key = (b_a, s_a, n_a)
        t_a = self._ad_memo.get(key)
        if t_a is None:
            t_a = self._ad_memo[key] = c.ad_time1(b_a, s_a, n_a)
        # share_needed1 and CostModel.ad_memory1 / sd_memory1 inlined (their operations in their order; b_a, b_s >= 1)
        budget_a = sl_a - u_a
        share_a = t_a / budget_a if budget_a > 0 else math.inf
        per_user = c.kv_memory == "per_user"
        mem_a = (float(b_a) * s_a + (sum_out[0] + out)) * c.kv_l if per_user else float(b_a) * (float(s_a) + n_a) * c.kv_l
        ok_a = share_a + sh[1] + sh[2] <= lim and mem_a + mm[1] + mm[2] <= mem_lim
        masks = [True, ok_a] + [False] * (2 * g_max)
        b_s = b[1] + 1
        s_s = s_max[1]
        s_s = inp if inp > s_s else s_s
        n_s = n_max[1]
        n_s = out if out > n_s else n_s
        u_s = u_max[1]
        u_s = up if up > u_s else u_s
        sl_s = slack_min[1]
        sl_s = slack if slack < sl_s else sl_s
        budget_sd = self._mem_lim[1]
        sum_s = sum_out[1] + out
        sd = {}
        sd_memo, j_max = self._sd_memo, self.j_max
        budget_s = sl_s - u_s
        fb_s, fs_s, kv_sd, sd_user = float(b_s), float(s_s), c.kv_sd, c.sd_user_bytes
        gamma = self.gamma
        if gamma > 0 and self._sd_parts:  # the common case, straight-line: the round's depth is fixed, CostModel's own parts
            # sd_iterations1 inlined (its operations in their order)
            gf = float(gamma)
            e = gf + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (gf + 1.0)) / (1.0 - alpha)
            j_s = math.ceil(float(out) / e - 1e-9)
            j_s = j_s if j_s > j_max else j_max
            key = (b_s, s_s, n_s, gamma)
            parts = sd_memo.get(key)
            if parts is None:
                parts = sd_memo[key] = c.sd_parts1(b_s, s_s, n_s, gamma)
            share_s = (parts[0] + float(j_s) * parts[1]) / budget_s if budget_s > 0 else math.inf
            kv = (fb_s * (fs_s + gamma) + sum_s) * kv_sd if per_user else fb_s * (fs_s + n_s + gamma) * kv_sd
            mem_s = kv + fb_s * sd_user if sd_user else kv
            sd[gamma] = (j_s, share_s, mem_s)
            masks[1 + gamma] = sh[0] + share_s + sh[2] <= lim and mm[0] + mem_s + mm[2] <= budget_sd
        all_depths = None  # no depth fixed yet and CostModel's own parts: every depth priced in one go (shared passes once)
        if gamma == 0 and self._sd_all:
            key = (b_s, s_s, n_s)
            all_depths = self._sd_all_memo.get(key)
            if all_depths is None:
                all_depths = self._sd_all_memo[key] = c.sd_parts_all1(b_s, s_s, n_s, g_max)
        for g in (() if gamma > 0 and self._sd_parts else (gamma,) if gamma > 0 else range(1, g_max + 1)):
            j_s = sd_iterations1(out, alpha, g)
            j_s = j_s if j_s > j_max else j_max
            if all_depths is not None:
                t_s = all_depths[0] + float(j_s) * all_depths[g]
            elif self._sd_parts:  # sd_time1 = prefill + J * iteration: the parts do not depend on the user's J, so they are memoised without it
                key = (b_s, s_s, n_s, g)
                parts = sd_memo.get(key)
                if parts is None:
                    parts = sd_memo[key] = c.sd_parts1(b_s, s_s, n_s, g)
                t_s = parts[0] + float(j_s) * parts[1]
            else:  # a cost model that overrides sd_time1 (e.g. runtime.calibration's): its own time, memoised with J
                key = (b_s, s_s, n_s, j_s, g)
                t_s = sd_memo.get(key)
                if t_s is None:
                    t_s = sd_memo[key] = c.sd_time1(b_s, s_s, n_s, j_s, g)
            share_s = t_s / budget_s if budget_s > 0 else math.inf
            kv = (fb_s * (fs_s + g) + sum_s) * kv_sd if per_user else fb_s * (fs_s + n_s + g) * kv_sd
            mem_s = kv + fb_s * sd_user if sd_user else kv
            sd[g] = (j_s, share_s, mem_s)
            masks[1 + g] = sh[0] + share_s + sh[2] <= lim and mm[0] + mem_s + mm[2] <= budget_sd
        eds = {}
        if ed is not None:
            j_row, x_row, allowed, prefill = ed
            b_e = b[2] + 1
            s_e = s_max[2]
            s_e = inp if inp > s_e else s_e
            n_e = n_max[2]
            n_e = out if out > n_e else n_e
            u_e = u_max[2]
            u_e = up if up > u_e else u_e
            t_e = slack_min[2]
            t_e = deadline if deadline < t_e else t_e
            p_e = self.ed[2]
            p_e = prefill if prefill > p_e else p_e
            sum_e = sum_out[2] + out
            s_f = float(s_e)
            s_f = s_f if s_f > 1.0 else 1.0
            cc = s_f + float(n_e) / 2.0
            # the hot loop inlines ed_time1 / ed_budget / ed_memory1 with their operations in their order
            base = t_e - u_e - p_e
            fb, fs, kv = float(b_e), float(s_e), c.kv_l
            fsn = fs + n_e
            sh01, mm01 = sh[0] + sh[1], mm[0] + mm[1]
            j_b, q_b, x_b = self.ed[0], self.ed[1], self.ed[3]
            tau1 = c.tau_l.tau1
            # this batch's passes by query length q (0: the prefill pass), found once per prepare
            passes = self._ed_memo.get((b_e, s_e, n_e))
            if passes is None:
                passes = self._ed_memo[(b_e, s_e, n_e)] = {}
            prefill_pass = passes.get(0)
            if prefill_pass is None:
                prefill_pass = passes[0] = tau1(b_e, s_f, s_f)
            q_v, v = -1, 0.0  # the last q seen, its verify pass; depths up to the batch's q share one
            mask_at = 1 + g_max
            for g, j_e, x_e in compress(zip(self._depths, j_row, x_row, strict=True), allowed):
                if j_b > j_e:
                    j_e = j_b
                if x_b > x_e:
                    x_e = x_b
                budget = base - j_e * x_e
                if budget <= 0:
                    continue  # infeasible whatever the verify pass costs: skip pricing it
                q_e = g + 1
                if q_b > q_e:
                    q_e = q_b
                if q_e != q_v:  # the KV and the verify pass depend on the depth only through q
                    mem_e = (fb * (fs + q_e) + sum_e) * kv if per_user else fb * (fsn + q_e) * kv
                    if not mm01 + mem_e <= mem_lim:
                        break  # q, hence the KV, never falls with the depth: no deeper depth fits either
                    q_v = q_e
                    v = passes.get(q_e)
                    if v is None:
                        v = passes[q_e] = tau1(b_e, float(q_e), cc + float(q_e))
                share_e = (prefill_pass + float(j_e) * v) / budget
                if sh01 + share_e <= lim:  # only an allowed depth can be applied: only its candidate is kept
                    masks[mask_at + g] = True
                    eds[g] = (j_e, q_e, x_e, share_e, mem_e)
            eds["agg"] = (b_e, s_e, n_e, u_e, t_e, p_e)
        self._prepared = ((inp, out), (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, u_s, sl_s), sd, eds, masks)
        return masks

    def apply(self, action: int) -> bool:
        """Commit ``action`` for the last prepared user; False (and nothing changes) if not allowed."""
        if self._prepared is None:
            raise RuntimeError("SplitScalarPlan.apply called before prepare() for this user")
        (inp, out), cand_a, cand_s, sd, eds, masks = self._prepared
        self._prepared = None
        g_max = self.g_max
        if not (0 <= action < 2 + 2 * g_max) or not masks[action]:
            return False
        if action == 0:
            return True
        if action == 1:
            self.b[0], self.s_max[0], self.n_max[0], self.u_max[0], self.slack_min[0], self.share[0], self.mem[0] = cand_a
            self.sum_out[0] += out
        elif action <= 1 + g_max:
            g = action - 1
            self.b[1], self.s_max[1], self.n_max[1], self.u_max[1], self.slack_min[1] = cand_s
            self.j_max, self.share[1], self.mem[1] = sd[g]
            self.sum_out[1] += out
            self.gamma = self.gamma or g
        else:
            g = action - 1 - g_max
            j_e, q_e, x_e, self.share[2], self.mem[2] = eds[g]
            self.b[2], self.s_max[2], self.n_max[2], self.u_max[2], self.slack_min[2], p_e = eds["agg"]
            self.ed = [j_e, q_e, p_e, x_e]
            self.sum_out[2] += out
        return True

    def candidate_ad_share(self) -> float:
        """The AD batch's least share if the prepared user joined it (1.0 when none is prepared)."""
        return self._prepared[1][5] if self._prepared is not None else 1.0


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

    def prepare(self, inp, out, alpha, up, slack, deadline, ed_j, ed_x, ed_allowed, ed_prefill) -> np.ndarray:
        """Masks (N, 2 + 2G) for one candidate user per round; ED rows are (N, G), prefill (N,)."""
        c, g = self.cost, self.gammas[None, :]
        b_a = self.b[0] + 1
        s_a = np.maximum(self.s_max[0], inp)
        n_a = np.maximum(self.n_max[0], out)
        u_a = np.maximum(self.u_max[0], up)
        sl_a = np.minimum(self.slack_min[0], slack)
        share_a = _share(c.ad_time(b_a, s_a, n_a), b_a, sl_a - u_a)
        mem_a = c.ad_memory(b_a, s_a, n_a, self.sum_out[0] + out)
        sh, mm = self.share, self.mem
        ok_a = (share_a + sh[1] + sh[2] <= 1 + EPS) & (mem_a + mm[1] + mm[2] <= c.memory_budget(self.b[1] > 0) * (1 + EPS))
        # SD@g (the round's depth once fixed), exactly v0's PlanBuilder
        fixed = self.gamma[:, None]
        depth = np.where(fixed > 0, fixed, g)
        e = _expected(alpha[:, None], depth)
        j_user = np.ceil(np.asarray(out, dtype=float)[:, None] / e - 1e-9).astype(np.int64)
        b_s = (self.b[1] + 1)[:, None]
        s_s = np.maximum(self.s_max[1], inp)[:, None]
        n_s = np.maximum(self.n_max[1], out)[:, None]
        j_s = np.maximum(self.j_max[:, None], j_user)
        u_s = np.maximum(self.u_max[1], up)[:, None]
        sl_s = np.minimum(self.slack_min[1], slack)[:, None]
        share_s = _share(c.sd_time(b_s, s_s, n_s, j_s, depth), b_s, sl_s - u_s)
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

    def apply(self, actions) -> np.ndarray:
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


def _share(time_s, b, budget):
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(budget > 0, time_s / np.where(budget > 0, budget, 1.0), np.inf)
    return np.where(b > 0, r, 0.0)


def _expected(alpha, gamma):
    a = np.asarray(alpha, dtype=float)
    g = np.asarray(gamma, dtype=float)
    near = a > 1.0 - 1e-9
    safe = np.where(near, 0.5, a)
    return np.where(near, g + 1.0, (1.0 - safe ** (g + 1.0)) / (1.0 - safe))
