"""Turn any assignment into a feasible plan nearby: drop users until it fits, then add greedily.

Used on the MILP relaxation's plans (which may overrun the compute budget) to find incumbents.
Every step is decided with the exact check (``envs.feasibility.check_plans``, many candidate
plans at once), so the result is always feasible.
"""

from __future__ import annotations

import numpy as np

from envs.cost_model import CostModel
from envs.feasibility import check_plans
from envs.plan import AD, SD
from envs.workload import Round


def _excess(rep) -> np.ndarray:
    """How far candidate plans are from fitting: compute share over 1 plus relative memory over."""
    share = np.nan_to_num(rep.ad_share_min + rep.sd_share_min, posinf=1e9)
    budget = np.maximum(rep.memory_budget_bytes, 1.0)
    mem = (rep.ad_memory_bytes + rep.sd_memory_bytes) / budget
    return np.maximum(share - 1.0, 0.0) + np.maximum(mem - 1.0, 0.0)


def repair(cost: CostModel, rnd: Round, modes: np.ndarray, gamma: int) -> np.ndarray:
    """A feasible plan obtained from ``modes`` by removals, then greedy additions (modes array)."""
    modes = np.asarray(modes, dtype=np.int8).copy()
    while modes.any() and not check_plans(cost, rnd, modes, gamma).feasible:
        members = np.flatnonzero(modes)
        cand = np.repeat(modes[None, :], len(members), axis=0)
        cand[np.arange(len(members)), members] = 0
        rep = check_plans(cost, rnd, cand, gamma)
        # drop the user whose removal brings the plan closest to fitting
        modes = cand[int(np.argmin(np.where(rep.feasible, -1.0, _excess(rep))))]
    while True:
        free = np.flatnonzero(modes == 0)
        if len(free) == 0:
            break
        cand = np.repeat(modes[None, :], 2 * len(free), axis=0)
        rows = np.arange(2 * len(free))
        cand[rows, np.tile(free, 2)] = np.repeat(np.array([AD, SD], dtype=np.int8), len(free))
        rep = check_plans(cost, rnd, cand, gamma)
        if not rep.feasible.any():
            break
        # add the user that leaves the most compute share free
        used = np.where(rep.feasible, rep.ad_share_min + rep.sd_share_min, np.inf)
        modes = cand[int(np.argmin(used))]
    return modes
