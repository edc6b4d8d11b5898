"""The round problem as a MILP relaxation (HiGHS via ``scipy.optimize.milp``), tightened by cuts.

Variables, per mode m (AD, SD): ``x[m, k]`` (user k served in m); a size staircase
``n[m, b] = [|m| >= b]`` (b = 1..K); for every aggregate a of the batch (longest input, longest
output, most SD iterations, tightest slack, slowest uplink; levels of
:class:`agents.cost_envelope.CostEnvelope`) a staircase ``h[m, a, i]`` that is 1 whenever the
batch's aggregate is at level ``i`` or more demanding (``h[m, a, level(k)] >= x[m, k]``,
``h[i] >= h[i + 1]``). Objective: serve the most users, ``x[AD, k] + x[SD, k] <= 1``.

**Memory is exact.** KV tokens are linear in the staircases: ``b * S = S_0 b + sum_i (S_i -
S_{i-1}) (b h_i)`` and each product ``b h_i`` is a continuous ``w_i >= b - K (1 - h_i)``, ``w_i >= 0``
(the minimum is the product), so the constraint is the feasibility check's memory test, with the
SLM's weights charged iff ``n[SD, 1] = 1`` (budget relaxed by 1e-7, more than the check's own
tolerance, so the MILP stays a relaxation).

**Compute enters as cuts.** A cut names thresholds ``(b_m, levels_m)`` for one or both modes and
says: not every threshold is reached, i.e. ``sum(literals) <= #literals - 1`` over the literals
``n[m, b_m]`` and ``h[m, a, levels_m[a]]``. It is valid (no feasible plan violates it) when the
envelope's lower bounds on the compute shares of every batch pair in that up-set already sum to
more than ``1 + EPS`` -- then every plan there fails the check's compute test. A feasible plan,
with its staircases set tightly (:meth:`RoundMILP.encode`), satisfies every row, so the MILP's
optimum bounds the round's optimum **at any point**, and so does HiGHS's dual bound under a time
limit. (Staircases may also be 1 without need; that only makes rows bind harder.)

If the MILP's optimal plan passes ``envs.feasibility.check_plans`` it is optimal for the round.
Otherwise cuts that cut it off are added (:meth:`RoundMILP.cuts_for`; a plain no-good on its
assignments if the envelope cannot separate it) and the MILP is solved again.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from agents.cost_envelope import CostEnvelope
from envs.cost_model import CostModel
from envs.feasibility import EPS, check_plans
from envs.plan import AD, SD
from envs.workload import Round

MODES = (AD, SD)
MEMORY_SLACK = 1e-7  #: relative relaxation of the memory budget (the check allows 1e-9)


class RoundMILP:
    """The relaxation for one round and draft depth; add cuts, solve, read plans."""

    def __init__(self, cost: CostModel, rnd: Round, gamma: int):
        self.cost, self.rnd, self.gamma = cost, rnd, int(gamma)
        self.k = k = rnd.num_users
        self.env = CostEnvelope(cost, rnd, gamma)
        self._nvar = 0
        self.x, self.n, self.h = {}, {}, {}
        for m in MODES:
            self.x[m] = self._new(k)
            self.n[m] = self._new(k)  # n[m][b - 1] = [|m| >= b]
            self.h[m] = {a: self._new(len(self.env.levels[a])) for a in self.env.attrs(m)}
        self.integer_end = self._nvar
        self.w = {}
        mem_attrs = ("input", "output") if cost.kv_memory == "padded" else ("input",)
        for m in MODES:
            self.w[m] = {a: self._new(len(self.env.levels[a])) for a in mem_attrs}
        self.rows: list[tuple[np.ndarray, np.ndarray, float, float]] = []
        self.upper = np.ones(self._nvar)
        self.upper[self.integer_end :] = k
        self._base_rows()
        self.num_cuts = 0
        self._seen: set = set()

    # ------------------------------------------------------------------ building
    def _new(self, count: int) -> np.ndarray:
        idx = np.arange(self._nvar, self._nvar + count)
        self._nvar += count
        return idx

    def _row(self, idx, coef, lo: float, hi: float) -> None:
        self.rows.append((np.asarray(idx, dtype=np.int64), np.asarray(coef, dtype=float), lo, hi))

    def _base_rows(self) -> None:
        k, env, cost = self.k, self.env, self.cost
        for j in range(k):
            self._row([self.x[AD][j], self.x[SD][j]], [1, 1], -np.inf, 1)
        for m in MODES:
            x, n = self.x[m], self.n[m]
            self._row(np.concatenate([n, x]), np.concatenate([np.ones(k), -np.ones(k)]), 0, 0)
            for b in range(k - 1):
                self._row([n[b], n[b + 1]], [1, -1], 0, np.inf)
            for a, h in self.h[m].items():
                lv = env.user_level[a]
                for j in range(k):
                    # level 0 is reached by any non-empty batch: h[0] = n[1]
                    self._row([h[lv[j]], x[j]], [1, -1], 0, np.inf)
                self._row([h[0], n[0]], [1, -1], 0, 0)
                for i in range(len(h) - 1):
                    self._row([h[i], h[i + 1]], [1, -1], 0, np.inf)
        # single users that cannot run alone in a mode never run in it (the check is downward closed)
        for m in MODES:
            modes = np.zeros((k, k), dtype=np.int8)
            modes[np.arange(k), np.arange(k)] = m
            alone = check_plans(cost, self.rnd, modes, self.gamma).feasible
            self.upper[self.x[m][~alone]] = 0
        self._memory_row()

    def _memory_row(self) -> None:
        """KV tokens (in LLM-KV-token units) of both batches <= budget - [SD used] W_S."""
        cost, env, rnd = self.cost, self.env, self.rnd
        unit = cost.kv_l
        idx, coef = [], []
        for m, per_token in ((AD, 1.0), (SD, cost.kv_sd / unit)):
            x, n = self.x[m], self.n[m]
            base = float(env.levels["input"][0]) + (self.gamma if m == SD else 0)
            if cost.kv_memory == "per_user":
                idx += [x]
                coef += [per_token * rnd.output_tokens.astype(float)]
            else:
                base += float(env.levels["output"][0])
            idx += [n]
            # sum_b n[b] = |m|; each SD user also holds the cost model's per-user workspace
            per_user = per_token * base + (cost.sd_user_bytes / unit if m == SD else 0.0)
            coef += [np.full(self.k, per_user)]
            for a, w in self.w[m].items():
                lv = env.levels[a].astype(float)
                idx += [w[1:]]
                coef += [per_token * np.diff(lv)]
                h = self.h[m][a]
                for i in range(1, len(w)):
                    # w_i >= |m| - K (1 - h_i)
                    self._row(np.concatenate([[w[i]], x, [h[i]]]), np.concatenate([[1.0], -np.ones(self.k), [-self.k]]), -self.k, np.inf)
        idx += [[self.n[SD][0]]]
        coef += [[cost.w_s / unit]]
        budget = float(cost.memory_budget(False)) / unit
        self._row(np.concatenate(idx), np.concatenate(coef), -np.inf, budget + abs(budget) * MEMORY_SLACK)

    def add_no_good(self, modes: np.ndarray) -> None:
        """Exclude this assignment and every plan containing it (valid when it is infeasible)."""
        lits = [self.x[AD][j] for j in np.flatnonzero(modes == AD)] + [self.x[SD][j] for j in np.flatnonzero(modes == SD)]
        self._row(lits, np.ones(len(lits)), -np.inf, len(lits) - 1)
        self.num_cuts += 1

    def add_cut(self, parts: tuple) -> bool:
        """Add ``((mode, b, {attr: level}), ...)`` as a no-good on its literals; False if known."""
        key = tuple((m, b, tuple(sorted(lv.items()))) for m, b, lv in parts)
        if key in self._seen:
            return False
        self._seen.add(key)
        lits = []
        for m, b, lv in parts:
            lits.append(self.n[m][b - 1])
            lits += [self.h[m][a][i] for a, i in lv.items() if i > 0]
        self._row(lits, np.ones(len(lits)), -np.inf, len(lits) - 1)
        self.num_cuts += 1
        return True

    def _infeasible(self, parts) -> bool:
        return sum(self.env.share_lb(m, b, lv) for m, b, lv in parts) > 1.0 + EPS

    def _lift(self, parts: list) -> list:
        """Relax each threshold to the least demanding level that keeps the up-set infeasible."""
        parts = [(m, b, dict(lv)) for m, b, lv in parts]
        for m, _, lv in parts:
            for a in self.env.attrs(m):
                lo, hi = 0, lv[a]
                while lo < hi:  # the share bound is monotone in each level, so bisect
                    mid = (lo + hi) // 2
                    lv[a] = mid
                    if self._infeasible(parts):
                        hi = mid
                    else:
                        lo = mid + 1
                lv[a] = lo
        return parts

    def cuts_for(self, modes: np.ndarray) -> int:
        """Add cuts that separate an infeasible plan; returns how many were added.

        Lifted no-goods on each mode alone and on the staircase of size pairs ``(b_AD, b_SD)`` that
        together exceed the compute at the plan's aggregates. If none is new (the envelope cannot
        see why the plan fails, or it fails only within the solver's tolerance), a no-good on the
        plan's own assignments.
        """
        parts = {}
        for m in MODES:
            members = np.flatnonzero(modes == m)
            if len(members):
                parts[m] = (len(members), self.env.plan_levels(m, members))
        added = 0
        if parts and self._infeasible([(m, b, lv) for m, (b, lv) in parts.items()]):
            for m, (b, lv) in parts.items():
                lo = next((c for c in range(1, b + 1) if self._infeasible([(m, c, lv)])), None)
                if lo is not None:
                    added += self.add_cut(tuple(self._lift([(m, lo, lv)])))
            if len(parts) == 2:
                (ba, la), (bs, ls) = parts[AD], parts[SD]
                for c_a in range(1, ba + 1):
                    c_s = next((c for c in range(1, bs + 1) if self._infeasible([(AD, c_a, la), (SD, c, ls)])), None)
                    if c_s is not None:
                        added += self.add_cut(tuple(self._lift([(AD, c_a, la), (SD, c_s, ls)])))
        if added == 0:
            self.add_no_good(modes)
            added = 1
        return added

    # ------------------------------------------------------------------ checking
    def encode(self, modes: np.ndarray) -> np.ndarray:
        """The variable vector of a plan with every staircase set tightly (for validity checks)."""
        modes = np.asarray(modes)
        v = np.zeros(self._nvar)
        for m in MODES:
            members = np.flatnonzero(modes == m)
            v[self.x[m][members]] = 1
            b = len(members)
            v[self.n[m][:b]] = 1
            if b == 0:
                continue
            lv = self.env.plan_levels(m, members)
            for a, h in self.h[m].items():
                v[h[: lv[a] + 1]] = 1
            for a, w in self.w[m].items():
                v[w[1:]] = b * v[self.h[m][a][1:]]
        return v

    def violated_rows(self, v: np.ndarray, tol: float = 1e-9) -> np.ndarray:
        """Indices of rows (base rows and cuts) that the vector ``v`` violates."""
        bad = [i for i, (idx, coef, lo, hi) in enumerate(self.rows) if not lo - tol <= float(coef @ v[idx]) <= hi + tol * max(1.0, abs(hi))]
        return np.asarray(bad, dtype=np.int64)

    # ------------------------------------------------------------------ solving
    def solve(self, time_limit_s: float, at_least: int = 0, at_most: int | None = None) -> tuple[str, np.ndarray | None, int]:
        """Solve the relaxation serving ``>= at_least`` users. Returns ``(status, modes, bound)``.

        ``status``: 'optimal' (``modes`` is the relaxation's optimum, ``bound`` its value),
        'infeasible' (no plan with ``>= at_least`` users: the optimum is below it), or 'limit'
        (``bound`` is HiGHS's proven bound, ``modes`` its best plan or None).
        """
        nv = self._nvar
        c = np.zeros(nv)
        c[self.x[AD]] = -1.0
        c[self.x[SD]] = -1.0
        rows = list(self.rows)
        obj_idx = np.concatenate([self.x[AD], self.x[SD]])
        rows.append((obj_idx, np.ones(len(obj_idx)), float(at_least), np.inf if at_most is None else float(at_most)))
        data = np.concatenate([r[1] for r in rows])
        ri = np.concatenate([np.full(len(r[0]), i) for i, r in enumerate(rows)])
        ci = np.concatenate([r[0] for r in rows])
        a = sparse.csr_array((data, (ri, ci)), shape=(len(rows), nv))
        lo = np.array([r[2] for r in rows])
        hi = np.array([r[3] for r in rows])
        integrality = np.zeros(nv)
        integrality[: self.integer_end] = 1
        res = milp(c, constraints=LinearConstraint(a, lo, hi), integrality=integrality, bounds=Bounds(np.zeros(nv), self.upper), options={"time_limit": max(time_limit_s, 0.01), "disp": False})
        if res.status == 2:
            return "infeasible", None, at_least - 1
        modes = None
        if res.x is not None:
            xa = np.round(res.x[self.x[AD]]) > 0.5
            xs = np.round(res.x[self.x[SD]]) > 0.5
            modes = np.where(xa, AD, np.where(xs, SD, 0)).astype(np.int8)
        if res.status == 0:
            return "optimal", modes, int(np.count_nonzero(modes))
        dual = getattr(res, "mip_dual_bound", None)
        bound = self.k if dual is None or not np.isfinite(dual) else int(np.floor(-dual + 1e-6))
        return "limit", modes, bound
