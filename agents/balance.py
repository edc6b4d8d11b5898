"""BALANCE (arXiv 2608.05926): hybrid AD/SD scheduling by enumerating compute and memory splits.

For every candidate ``(z, lam)`` on a grid that includes 0 and 1 (``grid_step``, default 0.05):

1. ``M_rem = Q - reserve - W_L`` if ``z = 1`` (no SD, the SLM is not loaded), else ``... - W_S``;
2. AD users are chosen optimally with compute share ``z`` and KV budget ``lam * M_rem``
   (:func:`agents.mode_solver.solve_mode`);
3. SD users are chosen optimally among the rest with ``1 - z`` and ``(1 - lam) * M_rem``;
4. the pair serving the most users wins; a tie goes to the point visited first: the SD-only corner
   ``(0, 0)``, then the AD-only corner ``(1, 1)``, then the grid by ``z`` descending, ``lam`` ascending.

Grid points are visited best-first and skipped when a cheap upper bound on AD + SD cannot beat
the incumbent, so the number served equals a full grid scan's, only faster. The AD-only
point ``(1, 1)`` and SD-only point ``(0, 0)`` are on the grid, so BALANCE is never below AD-only
or SD-only. The per-mode solves are exact (``agents.mode_solver``; held to brute force on
random, adversarial and memory-tight rounds in ``tests/test_mode_solver.py``), so those corners
are the single-mode optima, and an optimal plan's AD users ``A*`` and SD users ``S*`` each run
alone at least as well: ``OPT = |A*| + |S*| <= AD-only + SD-only <= 2 BALANCE`` -- never below
half the optimum.

``BalanceGammaSearch`` also searches the draft depth per round (every ``gamma`` in ``gammas``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from agents.scheduler import Scheduler
from envs.cost_model import CostModel
from envs.plan import AD, DEFAULT_DRAFT_DEPTH, SD, Plan
from envs.workload import Round


def grid(step: float) -> np.ndarray:
    if not 0 < step <= 1:
        raise ValueError(f"grid_step must be in (0, 1], got {step}")
    n = int(round(1.0 / step))
    return np.unique(np.concatenate([np.linspace(0.0, 1.0, n + 1), [0.0, 1.0]]))


@dataclass(frozen=True)
class SplitChoice:
    """The best ``(z, lam)`` point of a grid search: ``modes`` (K,) int8 in {REJECT, AD, SD}."""

    modes: np.ndarray
    z: float
    lam: float
    grid_points_solved: int


def search_splits(cost: CostModel, rnd: Round, gamma: int, z_values: ArrayLike, lam_values: ArrayLike, share_total: float = 1.0,
                  memory_taken: float = 0.0) -> SplitChoice | None:
    """BALANCE's grid search over ``z`` x ``lam`` with ``share_total`` of the GPU's compute and
    ``memory_taken`` bytes of KV already used elsewhere (``None`` when no grid point was solved).

    AD gets compute share ``z * share_total`` and KV ``lam * M_rem``, SD ``(1 - z) * share_total``
    and ``(1 - lam) * M_rem``, where ``M_rem`` is the KV budget (with or without the SLM's weights)
    less ``memory_taken``. At ``share_total = 1`` and ``memory_taken = 0`` this is the paper's
    search, bit for bit; BALANCE with ED (``agents.balance_ed``) calls it on the users an ED batch
    leaves, with the share and memory that batch does not use.

    Two exact shortcuts keep this fast. (1) A grid point whose upper bound (AD bound + SD bound,
    each over all users) cannot beat the incumbent is skipped. (2) For a fixed ``z``, raising
    ``lam`` only gives AD more memory and SD less: if AD cannot serve more users than at the
    previous ``lam``, the previous AD set stays optimal and SD can only do worse, so the point is
    dominated and skipped.
    """
    k = rnd.num_users
    ad_tab, sd_tab = build_table(cost, rnd, AD, gamma), build_table(cost, rnd, SD, gamma)
    everyone = np.ones(k, dtype=bool)
    rem_sd = float(cost.memory_budget(True)) - memory_taken
    rem_ad_only = float(cost.memory_budget(False)) - memory_taken
    best_n, best, solved = -1, None, 0
    zs = sorted((float(v) for v in z_values), reverse=True)
    lams = sorted(float(v) for v in lam_values)
    if not zs or not lams:
        return None  # an empty grid solves no point
    # visit the single-mode corners first (cheap, and a strong incumbent prunes the rest)
    corners = [(z, lam) for z, lam in ((0.0, 0.0), (1.0, 1.0)) if z in zs and lam in lams]
    for z, lam in corners:
        m_rem = rem_ad_only if z >= 1.0 else rem_sd
        solved += 1
        if z >= 1.0:
            chosen = solve_mode(ad_tab, everyone, z * share_total, lam * m_rem)
        else:
            chosen = solve_mode(sd_tab, everyone, (1.0 - z) * share_total, (1.0 - lam) * m_rem)
        if len(chosen) > best_n:
            modes = np.zeros(k, dtype=np.int8)
            modes[chosen] = AD if z >= 1.0 else SD
            best_n, best = len(chosen), (modes, z, lam)
    # every grid point's bounds at once: AD by (z, lam * M_rem), SD by (1 - z, (1 - lam) * M_rem)
    z_arr, lam_arr = np.array(zs), np.array(lams)
    ad_ub = np.where(
        (z_arr >= 1.0)[:, None],
        upper_bound_grid(ad_tab, z_arr * share_total, lam_arr * rem_ad_only),
        upper_bound_grid(ad_tab, z_arr * share_total, lam_arr * rem_sd),
    )
    sd_ub = np.where((z_arr >= 1.0)[:, None], 0, upper_bound_grid(sd_tab, (1.0 - z_arr) * share_total, (1.0 - lam_arr) * rem_sd))
    for iz, z in enumerate(zs):
        prev_ad = None
        for il, lam in enumerate(lams):
            m_rem = rem_ad_only if z >= 1.0 else rem_sd
            ad_share, ad_mem = z * share_total, lam * m_rem
            sd_share, sd_mem = (0.0, 0.0) if z >= 1.0 else ((1.0 - z) * share_total, (1.0 - lam) * m_rem)
            if prev_ad is not None and ad_ub[iz, il] <= len(prev_ad):
                continue  # AD set unchanged, SD has less memory: dominated
            if ad_ub[iz, il] + sd_ub[iz, il] <= best_n:
                continue
            solved += 1
            # only a larger AD set than at the previous lam can make this point not dominated
            ad = solve_mode(ad_tab, everyone, ad_share, ad_mem, at_least=0 if prev_ad is None else len(prev_ad))
            if prev_ad is not None and len(ad) <= len(prev_ad):
                continue
            prev_ad = ad
            rest = everyone.copy()
            rest[ad] = False
            sd = solve_mode(sd_tab, rest, sd_share, sd_mem, at_least=max(best_n - len(ad), 0))
            if len(ad) + len(sd) > best_n:
                modes = np.zeros(k, dtype=np.int8)
                modes[ad] = AD
                modes[sd] = SD
                best_n, best = len(ad) + len(sd), (modes, z, lam)
    if best is None:
        return None
    return SplitChoice(best[0], best[1], best[2], solved)


def split_search(cost: CostModel, rnd: Round, gamma: int, z_values: ArrayLike, lam_values: ArrayLike) -> Plan:
    """Best plan over the given ``z`` x ``lam`` candidates on the whole GPU
    (:func:`search_splits`; ``plan.extra["grid_points_solved"]``)."""
    choice = search_splits(cost, rnd, gamma, z_values, lam_values)
    if choice is None:
        plan = Plan.reject_all(rnd.num_users, gamma)
        plan.extra["grid_points_solved"] = 0
        return plan
    plan = Plan(choice.modes, gamma=gamma, z=choice.z, lam=choice.lam)
    plan.extra["grid_points_solved"] = choice.grid_points_solved
    return plan


class Balance(Scheduler):
    """The paper's algorithm with a fixed draft depth ``gamma``."""

    name = "balance"
    z_grid: np.ndarray | None = None  #: None = the full grid
    lam_grid: np.ndarray | None = None

    def __init__(self, cost: CostModel, max_gamma: int, draft_depth: int = DEFAULT_DRAFT_DEPTH, seed: int | None = None, grid_step: float = 0.05):
        super().__init__(cost, max_gamma, draft_depth, seed)
        self.grid_step = grid_step
        g = grid(grid_step)
        self._z = g if self.z_grid is None else np.asarray(self.z_grid, dtype=float)
        self._lam = g if self.lam_grid is None else np.asarray(self.lam_grid, dtype=float)

    def decide(self, rnd: Round) -> Plan:
        return split_search(self.cost, rnd, self.gamma, self._z, self._lam)


class BalanceGammaSearch(Balance):
    """BALANCE that also picks the draft depth per round (every gamma in 1..max_gamma)."""

    name = "balance_gamma"

    def decide(self, rnd: Round) -> Plan:
        best = None
        for gamma in range(1, self.max_gamma + 1):
            plan = split_search(self.cost, rnd, gamma, self._z, self._lam)
            if best is None or plan.admitted > best.admitted:
                best = plan
        return best
