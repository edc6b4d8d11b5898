"""Incremental exact check with AD, SD and ED: add users one at a time, O(1) (x G depths) each.

:class:`SplitScalarPlan` (one round, Python floats: the scalar env's hot path; :func:`ed_rows` its
users' ED arguments) and :class:`~envs.split_builder_vector.SplitPlanBuilder` (``N`` rounds in
numpy: the vector env; importable from here too) hold each mode's aggregates and
answer, for one candidate user, which of the ``2 + 2G`` actions keep the plan feasible:
reject, AD, SD@1..G (the first SD admission fixes the round's depth, as in v0), ED@1..G (each ED
user its own depth). The formulas are ``envs.split_plan``'s; sums are taken ``(A + S) + E`` as
there, so both builders equal :func:`envs.split_plan.check_plan_split` bit for bit, and with no ED
user they take exactly v0's decisions (``envs.plan_builder``; AD/SD arithmetic in the same order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import compress

import numpy as np

from envs.cost_model import CostModel
from envs.feasibility import EPS
from envs.scalar_times import ad_time_of, sd_parts_all_of, sd_parts_of
from envs.split_builder_vector import SplitPlanBuilder  # noqa: F401 -- the numpy twin, importable from here as before
from envs.split_cost import SplitCostModel
from envs.split_plan import EdUsers, ed_users_arrays
from envs.workload import Round

_LIM = 1 + EPS  #: the compute-share limit of the exact check


class SplitScalarPlan:
    """One round's plan with three batches, in Python floats. ED rows come from ``split_plan.EdUsers`` (:func:`ed_rows`).

    Speed (the scalar env's hot path, issue #13): the closed-form times are memoised by their exact
    arguments (``CostModel.ad_time1``, ``sd_parts1`` -- SD's prefill and per-iteration time, which
    do not depend on the user's ``J``) and the ED batch's passes ``tau_L.tau1`` by what they depend
    on (the prefill pass by ``(b, S)``, the verify passes by ``(b, c)``, ``c`` the mean context), so
    a user that leaves a batch's aggregates unchanged re-prices nothing; the same calls with the same
    arguments give the same floats, so every decision is unchanged. The memos live as long as the
    plan (its cost model is fixed) and are emptied past ``MEMO_MAX`` entries a group. Under random
    play the AD memo misses about three calls in four (its key holds the batch maxima with the
    user's own) and the SD memo three in five, so a miss's price matters: for
    :class:`~envs.cost_model.CostModel`'s own methods a miss is priced by ``envs.scalar_times`` (the
    latency model's passes called directly, the parts that depend on fewer arguments remembered: the
    same operations, the same floats). Until a round's first SD admission fixes its depth, all G
    depths are priced in one go (the depth-free passes once, :meth:`_sd_every_depth`); after it, SD
    is one straight-line check. ED depths run over the allowed ones only (each with its action and
    query length precomputed), budget first, and stop at the first depth whose KV does not fit (the
    KV never falls with the depth); candidates are kept only for allowed actions. The cost model's
    constants are read once per round (:meth:`reset`). ``tests/test_split_plan.py`` compares all of
    this with the exact check, on random and binding rounds.
    """

    MEMO_MAX = 1 << 14  #: entries in a group of memos (times, passes) before they are emptied (bounds memory on long runs)

    def __init__(self, cost: CostModel, max_gamma: int):
        self.cost = cost
        self.g_max = max_gamma
        self._ad_memo: dict[tuple[int, int, int], float] = {}
        self._sd_memo: dict[tuple, object] = {}  # (b, S, N, g) -> (prefill, iteration) seconds; (b, S, N, J, g) -> seconds for an overridden sd_time1
        self._sd_parts = type(cost).sd_time1 is CostModel.sd_time1 and hasattr(cost, "sd_parts1")
        # CostModel.sd_parts_all1 matches sd_parts1 only for a cost model that keeps the base sd_parts1
        self._sd_all = self._sd_parts and type(cost).sd_parts1 is CostModel.sd_parts1
        self._sd_all_memo: dict[tuple[int, int, int], tuple[float, ...]] = {}  # (b, S, N) -> (prefill, iteration at depth 1, ..., G) seconds
        # passes, keyed by what they depend on (few keys, reused across rounds): the ED batch's verify passes,
        # (b, mean context c) -> {q: seconds}, and its prefill pass, (b, S) -> seconds; for the misses above
        # (envs.scalar_times): AD's and SD's prefill passes (b, S), the decode sums' table (b, c), SD's iteration (b, c, g)
        self._ed_memo: dict[tuple[int, float], dict[int, float]] = {}
        self._ed_prefill_memo: dict[tuple[int, int], float] = {}
        self._pass_memos: tuple[dict, dict, dict, dict] = ({}, {}, {}, {})
        self._ed_slots = [(1 + max_gamma + g, g + 1) for g in range(1, max_gamma + 1)]  # per ED depth g: its action, its query length
        self._rejects = [False] * (2 * max_gamma)  # the SD and ED masks before any is found feasible
        # the memo misses' pricing (the cost model is fixed for the plan's life, as the memos assume)
        ad_prefills, sd_prefills, decode_sums, sd_iterations = self._pass_memos
        self._ad_time1 = ad_time_of(cost, ad_prefills, decode_sums)
        self._sd_parts1, self._sd_parts_all1 = sd_parts_of(cost, sd_prefills, sd_iterations), sd_parts_all_of(cost, sd_prefills)
        self._tau_l1 = cost.tau_l.tau1
        self._times_version = cost.times_version()
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
        # what prepare reads of the cost model, once per round (attribute chains showed in the profile)
        self._kv = (c.kv_memory == "per_user", c.kv_l, c.kv_sd, c.sd_user_bytes)
        # the times' memos and the passes' are emptied apart (the passes', with their few keys, seldom are)
        # and all of them when the model's times moved (a live calibration's factors: CostModel.times_version)
        version = c.times_version()
        moved, self._times_version = version != self._times_version, version
        for memos in ((self._ad_memo, self._sd_memo, self._sd_all_memo), (self._ed_memo, self._ed_prefill_memo, *self._pass_memos)):
            if moved or sum(map(len, memos)) > self.MEMO_MAX:
                for memo in memos:
                    memo.clear()

    def prepare(self, inp: int, out: int, alpha: float, up: float, slack: float, deadline: float = math.inf,
                ed: tuple[Sequence[int], Sequence[float], Sequence[bool], float] | None = None) -> list[bool]:
        """Masks for one user; ``ed`` = (J row, X row, allowed row, prefill) over depths 1..G, or None."""
        b, s_max, n_max, u_max, slack_min, sum_out, sh, mm = self.b, self.s_max, self.n_max, self.u_max, self.slack_min, self.sum_out, self.share, self.mem
        per_user, kv_l, kv_sd, sd_user = self._kv
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
            t_a = self._ad_memo[key] = self._ad_time1(b_a, s_a, n_a)
        # share_needed1 and CostModel.ad_memory1 / sd_memory1 inlined (their operations in their order; b_a, b_s >= 1)
        budget_a = sl_a - u_a
        share_a = t_a / budget_a if budget_a > 0 else math.inf
        mem_a = (float(b_a) * s_a + (sum_out[0] + out)) * kv_l if per_user else float(b_a) * (float(s_a) + n_a) * kv_l
        ok_a = share_a + sh[1] + sh[2] <= _LIM and mem_a + mm[1] + mm[2] <= mem_lim
        masks = [True, ok_a, *self._rejects]
        b_s = b[1] + 1
        s_s = s_max[1]
        s_s = inp if inp > s_s else s_s
        n_s = n_max[1]
        n_s = out if out > n_s else n_s
        u_s = u_max[1]
        u_s = up if up > u_s else u_s
        sl_s = slack_min[1]
        sl_s = slack if slack < sl_s else sl_s
        sum_s = sum_out[1] + out
        budget_s = sl_s - u_s
        gamma = self.gamma
        if gamma > 0 and self._sd_parts:  # the common case, straight-line: the round's depth is fixed, CostModel's own parts
            # sd_iterations1 inlined (its operations in their order)
            gf = float(gamma)
            e = gf + 1.0 if alpha > 1.0 - 1e-9 else (1.0 - alpha ** (gf + 1.0)) / (1.0 - alpha)
            j_s = math.ceil(float(out) / e - 1e-9)
            j_max = self.j_max
            j_s = j_s if j_s > j_max else j_max
            key = (b_s, s_s, n_s, gamma)
            parts = self._sd_memo.get(key)
            if parts is None:
                parts = self._sd_memo[key] = self._sd_parts1(b_s, s_s, n_s, gamma)
            share_s = (parts[0] + float(j_s) * parts[1]) / budget_s if budget_s > 0 else math.inf
            fb_s = float(b_s)
            kv = (fb_s * (float(s_s) + gamma) + sum_s) * kv_sd if per_user else fb_s * (float(s_s) + n_s + gamma) * kv_sd
            mem_s = kv + fb_s * sd_user if sd_user else kv
            sd = {gamma: (j_s, share_s, mem_s)}
            masks[1 + gamma] = sh[0] + share_s + sh[2] <= _LIM and mm[0] + mem_s + mm[2] <= self._mem_lim[1]
        else:
            sd = self._sd_every_depth(masks, out, alpha, b_s, s_s, n_s, sum_s, budget_s)
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
            j_b, q_b, p_e, x_b = self.ed
            p_e = prefill if prefill > p_e else p_e
            sum_e = sum_out[2] + out
            s_f = float(s_e)
            s_f = s_f if s_f > 1.0 else 1.0
            cc = s_f + float(n_e) / 2.0
            # the hot loop inlines ed_time1 / ed_budget / ed_memory1 with their operations in their order
            base = t_e - u_e - p_e
            fb, fs = float(b_e), float(s_e)
            fsn = fs + n_e
            sh01, mm01 = sh[0] + sh[1], mm[0] + mm[1]
            tau1 = self._tau_l1
            # this batch's verify passes by query length q (they depend on S and N through the mean context alone), and its prefill pass
            passes = self._ed_memo.get((b_e, cc))
            if passes is None:
                passes = self._ed_memo[(b_e, cc)] = {}
            prefill_pass = self._ed_prefill_memo.get((b_e, s_e))
            if prefill_pass is None:
                prefill_pass = self._ed_prefill_memo[(b_e, s_e)] = tau1(b_e, s_f, s_f)
            q_v, v, lim = -1, 0.0, _LIM  # the last q seen, its verify pass (depths up to the batch's q share one); the share limit
            for (action, q_e), j_e, x_e in compress(zip(self._ed_slots, j_row, x_row, strict=True), allowed):
                if j_b > j_e:
                    j_e = j_b
                if x_b > x_e:
                    x_e = x_b
                budget = base - j_e * x_e
                if budget <= 0:
                    continue  # infeasible whatever the verify pass costs: skip pricing it
                if q_b > q_e:
                    q_e = q_b
                if q_e != q_v:  # the KV and the verify pass depend on the depth only through q
                    mem_e = (fb * (fs + q_e) + sum_e) * kv_l if per_user else fb * (fsn + q_e) * kv_l
                    if not mm01 + mem_e <= mem_lim:
                        break  # q, hence the KV, never falls with the depth: no deeper depth fits either
                    q_v = q_e
                    v = passes.get(q_e)
                    if v is None:
                        v = passes[q_e] = tau1(b_e, float(q_e), cc + float(q_e))
                share_e = (prefill_pass + j_e * v) / budget  # int * float is float(int) * float, as ed_time1 writes it
                if sh01 + share_e <= lim:  # only an allowed depth can be applied: only its candidate is kept (by action)
                    masks[action] = True
                    eds[action] = (j_e, q_e, x_e, share_e, mem_e)
            eds["agg"] = (b_e, s_e, n_e, u_e, t_e, p_e)
        self._prepared = ((inp, out), (b_a, s_a, n_a, u_a, sl_a, share_a, mem_a), (b_s, s_s, n_s, u_s, sl_s), sd, eds, masks)
        return masks

    def _sd_every_depth(self, masks: list[bool], out: int, alpha: float, b_s: int, s_s: int, n_s: int, sum_s: int, budget_s: float) -> dict:
        """:meth:`prepare`'s SD candidates (and masks) when its straight line does not apply: no depth
        fixed yet (every depth priced), or a cost model that overrides ``sd_time1``."""
        c, g_max, gamma, j_max, sd_memo = self.cost, self.g_max, self.gamma, self.j_max, self._sd_memo
        per_user, _, kv_sd, sd_user = self._kv
        sh, mm, budget_sd = self.share, self.mem, self._mem_lim[1]
        fb_s, fs_s = float(b_s), float(s_s)
        sd = {}
        all_depths = None  # no depth fixed yet and CostModel's own parts: every depth priced in one go (shared passes once)
        if gamma == 0 and self._sd_all:
            key = (b_s, s_s, n_s)
            all_depths = self._sd_all_memo.get(key)
            if all_depths is None:
                all_depths = self._sd_all_memo[key] = self._sd_parts_all1(b_s, s_s, n_s, g_max)
        sure, f_out = alpha > 1.0 - 1e-9, float(out)
        for g in (gamma,) if gamma > 0 else range(1, g_max + 1):
            gf = float(g)  # sd_iterations1 inlined (its operations in their order)
            e = gf + 1.0 if sure else (1.0 - alpha ** (gf + 1.0)) / (1.0 - alpha)
            j_s = math.ceil(f_out / e - 1e-9)
            j_s = j_s if j_s > j_max else j_max
            if all_depths is not None:
                t_s = all_depths[0] + float(j_s) * all_depths[g]
            elif self._sd_parts:  # sd_time1 = prefill + J * iteration: the parts do not depend on the user's J, so they are memoised without it
                key = (b_s, s_s, n_s, g)
                parts = sd_memo.get(key)
                if parts is None:
                    parts = sd_memo[key] = self._sd_parts1(b_s, s_s, n_s, g)
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
            masks[1 + g] = sh[0] + share_s + sh[2] <= _LIM and mm[0] + mem_s + mm[2] <= budget_sd
        return sd

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
            j_e, q_e, x_e, self.share[2], self.mem[2] = eds[action]
            self.b[2], self.s_max[2], self.n_max[2], self.u_max[2], self.slack_min[2], p_e = eds["agg"]
            self.ed = [j_e, q_e, p_e, x_e]
            self.sum_out[2] += out
        return True

    def candidate_ad_share(self) -> float:
        """The AD batch's least share if the prepared user joined it (1.0 when none is prepared)."""
        return self._prepared[1][5] if self._prepared is not None else 1.0


def ed_rows(split: SplitCostModel, rnd: Round, g_max: int, users: EdUsers | None = None) -> list[tuple | None]:
    """Per user of ``rnd`` (its order), :meth:`SplitScalarPlan.prepare`'s ``ed`` argument: (J row, X
    row, allowed row, prefill) over depths 1..G as Python scalars, or None for a user ED cannot take.
    ``users``: the round's ``envs.split_plan.ed_users`` if the caller has them; else only the edge
    users' constants are computed (``ed_users_arrays`` on their arrays, gathered first: each row is its
    user's alone, so the same numbers; a reset's hot spot, about a sixth cheaper at edge_fraction 0.5)."""
    if users is None:
        idx = np.flatnonzero(np.zeros(rnd.num_users, dtype=bool) if rnd.has_edge is None else np.asarray(rnd.has_edge, dtype=bool))
        pick = slice(None) if len(idx) == rnd.num_users else idx  # everyone has an edge: nothing to gather
        rtt = np.full(len(idx), split.net.rtt_s) if rnd.rtt_s is None else np.asarray(rnd.rtt_s, dtype=float)[pick]  # as ed_users takes them
        users = ed_users_arrays(split, rnd.input_tokens[pick], rnd.output_tokens[pick], rnd.alpha[pick], np.ones(len(idx), dtype=bool), rtt, g_max)
    else:
        idx = np.arange(rnd.num_users)
    ok = users.allowed.any(axis=1)
    j, x, allowed, prefill = users.iterations, users.edge_s, users.allowed, users.prefill_s
    if not ok.all():  # gathered: users without an edge, or whose edge fits no depth
        idx, j, x, allowed, prefill = idx[ok], j[ok], x[ok], allowed[ok], prefill[ok]
    rows: list[tuple | None] = [None] * rnd.num_users
    per_user = zip(j.tolist(), x.tolist(), allowed.tolist(), prefill.tolist(), strict=True)  # whole arrays to lists, zipped in C
    for i, row in zip(idx.tolist(), per_user, strict=True):
        rows[i] = row
    return rows
