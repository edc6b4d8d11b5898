"""The exact optimum of a round with the ED mode (EdgeSchedule-v1's plans), for small K.

Exhaustive over plans: every SD depth ``gamma`` in ``1..G``, every set of ED users, and every
assignment of the others to reject / AD / SD -- ``G * 4^K`` plans, checked in numpy blocks. ED
users' depths are not enumerated one by one: for each ED set :func:`agents.ed_batch.ed_options`
gives every Pareto-optimal ``(compute share, KV memory)`` over all depth assignments (exact; the
proof is in that module), and an AD/SD assignment is feasible with the set iff one of them fits
beside it under the exact check's L1/L2 form (``envs.split_plan``):
``(r_A + r_S) + r_E <= 1`` and ``M_A + M_S + M_E <= Q - reserve - W_L - [SD used] W_S``.
The plan returned is re-checked by ``envs.split_plan.check_plan_split``.

``tests/test_specedge_schedulers.py`` holds it to a brute force that enumerates every per-user ED
depth on small rounds. Limited to ``max_users`` (default 8) users: 4^8 = 65,536 assignments per depth.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from agents.balance_ed import plan_with_ed
from agents.ed_batch import ed_options, round_ed_users, split_model
from agents.scheduler import Scheduler
from envs.feasibility import EPS, check_plans
from envs.plan import AD, REJECT, SD, Plan
from envs.split_plan import EdUsers
from envs.workload import Round

if TYPE_CHECKING:
    from envs.cost_model import CostModel


def _assignments(n: int) -> np.ndarray:
    """All 3^n assignments of reject / AD / SD to ``n`` users, shape (3^n, n)."""
    if n == 0:
        return np.zeros((1, 0), dtype=np.int8)
    return np.array(list(itertools.product((REJECT, AD, SD), repeat=n)), dtype=np.int8)


def exhaustive_v1(cost: CostModel, users: EdUsers, rnd: Round, gammas: Sequence[int]) -> tuple[np.ndarray, int, np.ndarray, object] | None:
    """The best plan over ``gammas``: ``(modes with ED users marked, gamma, ED indices, ED option)``.

    None only if the round is empty. Ties keep the first found (smallest gamma, ED sets in
    increasing bitmask order, assignments in product order).
    """
    k = rnd.num_users
    edge_ok = np.flatnonzero(users.allowed.any(axis=1))
    best = None
    best_n = -1
    for mask in range(1 << len(edge_ok)):
        ed_idx = edge_ok[[i for i in range(len(edge_ok)) if mask >> i & 1]]
        options = ed_options(cost, users, rnd, ed_idx)
        if not options:
            continue
        rest = np.setdiff1d(np.arange(k), ed_idx)
        if len(ed_idx) + len(rest) <= best_n:
            continue
        block = np.zeros((3 ** len(rest), k), dtype=np.int8)
        block[:, rest] = _assignments(len(rest))
        admitted = np.count_nonzero(block, axis=1) + len(ed_idx)
        for gamma in gammas:
            rep = check_plans(cost, rnd, block, gamma)
            r_as = rep.ad_share_min + rep.sd_share_min
            m_as = rep.ad_memory_bytes + rep.sd_memory_bytes
            budget = rep.memory_budget_bytes
            for opt in options:
                ok = (r_as + opt.share <= 1.0 + EPS) & (m_as + opt.memory_bytes <= budget * (1 + EPS)) & (budget >= 0)
                if not ok.any():
                    continue
                i = int(np.argmax(np.where(ok, admitted, -1)))
                if admitted[i] > best_n:
                    best_n = int(admitted[i])
                    best = (block[i].copy(), int(gamma), ed_idx, opt)
    return best


class OptimalV1(Scheduler):
    """The exact optimum over v1 plans (every SD depth, every ED set and depths); K <= ``max_users``.

    On a profile without ``edge`` / ``network`` sections no user may run ED: the optimum over AD and SD.
    """

    name = "optimal_v1"
    max_users = 8

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.split = split_model(self.cost.profile)  # None: the profile has no edge, so no user runs ED

    def decide(self, rnd: Round) -> Plan:
        if rnd.num_users > self.max_users:
            raise ValueError(f"optimal_v1 is exhaustive and limited to num_users <= {self.max_users}, got {rnd.num_users}")
        users = round_ed_users(self.split, rnd, self.max_gamma)
        found = exhaustive_v1(self.cost, users, rnd, range(1, self.max_gamma + 1))
        if found is None:
            return Plan.reject_all(rnd.num_users, self.gamma)
        modes, gamma, ed_idx, opt = found
        return plan_with_ed(self.cost, users, rnd, gamma, ed_idx, opt, modes)
