"""BALANCE's split search (``agents.balance.search_splits``) against its definition, on hand-made rounds.

The mutation run of ``agents/balance.py`` left the pruning bounds, the AD-only memory budget, the
scaled budgets BALANCE with ED passes (``share_total``, ``memory_taken``) and the work counter
untested. Every expected value here comes from outside the search:

* hand-walked rounds on the golden system of ``test_agents_core`` (numbers in the docstrings),
  with their preconditions checked by brute force over every subset;
* the unpruned scan (:func:`_scan`): every grid point in the documented order (the SD-only corner,
  the AD-only corner, then ``z`` descending, ``lam`` ascending), AD solved first and SD among the
  rest -- BALANCE's definition, which the pruned search must equal (count, ``z`` and ``lam``);
* on rounds of identical users (only their slacks differ) each mode's bound is the single-mode
  optimum itself (``test_upper_bounds_are_valid_and_exact_on_one_row_rounds``), so the documented
  walk with brute-force bounds also predicts ``grid_points_solved``: a bound that is too loose
  solves points that cannot win, one that is too tight skips the optimum.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_agents_core import (
    BUDGET_AD,
    BUDGET_SD,
    best_subset,
    brute_optimum,
    golden,
    make_round,
    mode_need,
)

from agents.balance import Balance, SplitChoice, grid, search_splits, split_search
from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from envs import AD, SD, check_plan
from envs.feasibility import shares_respected

GAMMA = 4


def _budgets(cost, z: float, lam: float, share_total: float, memory_taken: float):
    """((AD share, AD bytes), (SD share, SD bytes)) of grid point (z, lam), as the docstring defines them."""
    m_rem = float(cost.memory_budget(z < 1.0)) - memory_taken  # z = 1: the SLM is not loaded
    ad = (z * share_total, lam * m_rem)
    sd = (0.0, 0.0) if z >= 1.0 else ((1.0 - z) * share_total, (1.0 - lam) * m_rem)
    return ad, sd


def _order(zs, lams):
    zs, lams = sorted(map(float, zs), reverse=True), sorted(map(float, lams))
    corners = [(z, lam) for z, lam in ((0.0, 0.0), (1.0, 1.0)) if z in zs and lam in lams]
    return corners, [(z, lam) for z in zs for lam in lams]


def _scan(cost, rnd, zs, lams, share_total=1.0, memory_taken=0.0, exact_bounds=False):
    """BALANCE by its definition: (served, z, lam, modes[, points solved]) of the first best point.

    ``exact_bounds``: skip points as the docstring's two shortcuts do, with each mode's bound the
    brute-force single-mode optimum over all users (the search's own bound on one-row rounds).
    """
    k = rnd.num_users
    ad_tab, sd_tab = build_table(cost, rnd, AD, GAMMA), build_table(cost, rnd, SD, GAMMA)
    everyone = np.ones(k, dtype=bool)
    corners, points = _order(zs, lams)
    best, solved = (-1, None, None, None), 0
    for i, (z, lam) in enumerate(corners + points):
        (za, ma), (zs_, ms) = _budgets(cost, z, lam, share_total, memory_taken)
        corner = i < len(corners)
        if not corner and (i == len(corners) or z != points[i - len(corners) - 1][0]):
            prev = None  # a new z: no AD set to compare with
        if exact_bounds and not corner:
            ad_b = best_subset(cost, rnd, AD, GAMMA, za, ma)
            sd_b = best_subset(cost, rnd, SD, GAMMA, zs_, ms)
            if prev is not None and ad_b <= prev:
                continue
            if ad_b + sd_b <= best[0]:
                continue
        solved += 1
        ad = solve_mode(ad_tab, everyone, za, ma)
        if exact_bounds and not corner:
            if prev is not None and len(ad) <= prev:
                continue
            prev = len(ad)
        rest = everyone.copy()
        rest[ad] = False
        sd = solve_mode(sd_tab, rest, zs_, ms)
        if len(ad) + len(sd) > best[0]:
            modes = np.zeros(k, dtype=np.int8)
            modes[ad], modes[sd] = AD, SD
            best = (len(ad) + len(sd), z, lam, modes)
    return (*best, solved) if exact_bounds else best


def _fits(cost, rnd, choice: SplitChoice, share_total: float, memory_taken: float):
    """Each mode's users fit that mode's share and KV at the chosen point (brute-force formulas)."""
    (za, ma), (zs_, ms) = _budgets(cost, choice.z, choice.lam, share_total, memory_taken)
    for mode, share, mem in ((AD, za, ma), (SD, zs_, ms)):
        mask = choice.modes == mode
        if mask.any():
            need, kv = mode_need(cost, rnd, mask[None, :], mode, GAMMA)
            assert need[0] <= share * (1 + 1e-9) and kv[0] <= mem * (1 + 1e-9), (mode, share, mem)


def _one_row(kv: str, memory: float, inp: int, out: int, alpha: float, slack):
    """Users alike in I, O, alpha and links (one threshold row per mode): only their slacks differ."""
    k = len(slack)
    return golden(kv, memory), make_round([inp] * k, [out] * k, np.asarray(slack) + 0.02, [alpha] * k, [0.01] * k, [0.01] * k)


G4 = grid(0.25).tolist()

# (kv, memory, I, O, alpha, slacks, grid, share_total, memory_taken, served, solved): rounds found
# to separate the tight bounds from looser or tighter ones (AD bound with z / share_total, SD bound
# with (1 + z), (2 - z), (1 + lam), (2 - lam) or z / share_total; the dominance rule with < or off)
ONE_ROW = [
    ("padded", 2_300_000.0, 3, 7, 0.8, [0.491, 0.482, 0.371, 0.284, 0.16], G4, 0.5, 0.0, 4, 2),
    ("per_user", 2_300_000.0, 2, 6, 0.95, [0.355, 0.114, 0.216], G4, 1.0, 20_000.0, 3, 3),
    ("per_user", 2_240_000.0, 9, 2, 0.8, [0.126, 0.153], [0.0, 0.3, 0.6, 1.0], 1.0, 0.0, 2, 3),
    ("padded", 2_240_000.0, 4, 10, 0.8, [0.043, 0.384, 0.283, 0.185, 0.401], [0.0, 0.5, 1.0], 1.0, 0.0, 3, 2),
    ("padded", 2_240_000.0, 1, 2, 0.8, [0.205, 0.254, 0.09, 0.135, 0.294], G4, 1.0, 0.0, 5, 5),
    ("per_user", 2_300_000.0, 6, 3, 0.95, [0.289, 0.292, 0.265], G4, 1.0, 0.0, 3, 8),
]


@pytest.mark.parametrize(("kv", "memory", "inp", "out", "alpha", "slack", "g", "share_total", "memory_taken", "served", "solved"), ONE_ROW)
def test_one_row_rounds_follow_the_documented_walk(kv, memory, inp, out, alpha, slack, g, share_total, memory_taken, served, solved):
    cost, rnd = _one_row(kv, memory, inp, out, alpha, slack)
    # precondition: on these rounds each mode's bound is its brute-force optimum (every user available)
    shares, mems = np.array([0.0, 0.15, 0.5, 0.85, 1.0]), np.array([0.0, 40_000.0, 120_000.0, BUDGET_AD])
    for mode in (AD, SD):
        ub = upper_bound_grid(build_table(cost, rnd, mode, GAMMA), shares, mems)
        assert ub.tolist() == [[best_subset(cost, rnd, mode, GAMMA, s, m) for m in mems] for s in shares]
    choice = search_splits(cost, rnd, GAMMA, g, g, share_total, memory_taken)
    n, z, lam, modes, walked = _scan(cost, rnd, g, g, share_total, memory_taken, exact_bounds=True)
    assert (int(np.count_nonzero(choice.modes)), choice.z, choice.lam) == (n, z, lam) == _scan(cost, rnd, g, g, share_total, memory_taken)[:3]
    assert choice.modes.tolist() == modes.tolist()
    assert (n, choice.grid_points_solved, walked) == (served, solved, solved)
    _fits(cost, rnd, choice, share_total, memory_taken)


@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize(("share_total", "taken"), [(1.0, 0.3), (0.6, 0.0), (0.5, 0.45), (0.8, 0.15)])
def test_scaled_budgets_equal_the_unpruned_scan_and_fit(kv, share_total, taken):
    """BALANCE with ED's call: ``share_total`` of the compute and ``memory_taken`` bytes of KV used
    elsewhere. The pruned search serves what the unpruned scan serves, at the same first-best
    point, and each mode's users fit the scaled share and the reduced KV budget."""
    rng = np.random.default_rng(11)
    g = grid(0.25)
    for i in range(6):
        k = 3 + i % 3
        memory = 2_300_000.0 + (0.0, -60_000.0, 150_000.0)[i % 3]
        cost = golden(kv, memory)
        rnd = make_round(rng.integers(1, 16, k), rng.integers(1, 18, k), rng.uniform(0.04, 0.6, k),
                         rng.choice([0.5, 0.8, 0.95], k), rng.uniform(0.0, 0.04, k), rng.uniform(0.0, 0.02, k))
        memory_taken = taken * float(cost.memory_budget(True))
        choice = search_splits(cost, rnd, GAMMA, g, g, share_total, memory_taken)
        n, z, lam, _ = _scan(cost, rnd, g, g, share_total, memory_taken)
        assert (int(np.count_nonzero(choice.modes)), choice.z, choice.lam) == (n, z, lam), i
        assert choice.modes.dtype == np.int8
        _fits(cost, rnd, choice, share_total, memory_taken)


# ------------------------------------------------------------------ hand-walked rounds
def _big_ad_user():
    """User U: I=44, O=50, deadline 10 s. Its AD KV, 94 tokens * 2000 B = 188_000 B, fits the
    budget without the SLM (200_000 B) and 0.95 of it (190_000 B), but not the budget with the SLM
    loaded (180_000 B, 0.95 of it 171_000 B); its SD KV (98 * 3000 B) fits nothing. So U is served
    only at z = 1 with lam >= 0.94: by AD-only points, with the AD-only KV budget."""
    return make_round([44], [50], [10.0], [0.9], [0.01], [0.01])


def test_ad_only_corner_uses_the_kv_budget_without_the_draft_model():
    cost, rnd = golden(), _big_ad_user()
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, BUDGET_AD) == 1
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, BUDGET_SD) == 0
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, BUDGET_AD) == 0
    assert brute_optimum(cost, rnd, GAMMA) == 1
    # the SD-only corner serves no one (solved 1), the AD-only corner (1, 1) serves U (solved 2);
    # every other point's bound is at most 1: a tie goes to the corner, visited before (1, 0.95)
    choice = search_splits(cost, rnd, GAMMA, [0.0, 0.5, 1.0], [0.0, 0.95, 1.0])
    assert (choice.modes.tolist(), choice.z, choice.lam, choice.grid_points_solved) == ([AD], 1.0, 1.0, 2)
    assert choice.modes.dtype == np.int8  # SplitChoice.modes: (K,) int8
    plan = split_search(cost, rnd, GAMMA, [0.0, 0.5, 1.0], [0.0, 0.95, 1.0])
    assert check_plan(cost, rnd, plan).feasible and shares_respected(cost, rnd, plan)
    assert (plan.modes.tolist(), plan.z, plan.lam, plan.extra["grid_points_solved"]) == ([AD], 1.0, 1.0, 2)


def test_ad_only_grid_points_without_the_corner_use_the_kv_budget_without_the_draft_model():
    """lam = 1 is not on the grid: only the grid point (1, 0.95) -- 190_000 B for AD -- serves U.
    Its bound and its solve must both use the AD-only budget (with the SLM's, 171_000 B: nobody)."""
    cost, rnd = golden(), _big_ad_user()
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, 0.95 * BUDGET_AD) == 1
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, 0.95 * BUDGET_SD) == 0
    # (0, 0) is a corner (solved 1: nobody); then z = 1: (1, 0) and (1, 0.5) have no KV for U
    # (bound 0), (1, 0.95) bounds 1 > 0: solved (2), serves U; z = 0.5, 0 have bounds 0
    choice = search_splits(cost, rnd, GAMMA, [0.0, 0.5, 1.0], [0.0, 0.5, 0.95])
    assert (choice.modes.tolist(), choice.z, choice.lam, choice.grid_points_solved) == ([AD], 1.0, 0.95, 2)


def test_memory_taken_is_taken_from_both_kv_budgets():
    """``memory_taken`` bytes are gone from the AD-only budget: 10_000 B taken leave 190_000 B (U
    fits), 20_000 B leave 180_000 B (U does not). And from the budget with the SLM loaded: user V
    (I=2, O=40, alpha 0.95, deadline 10 s) needs (2 + 40 + 4) * 3000 = 138_000 B of SD KV."""
    cost, rnd = golden(), _big_ad_user()
    g = [0.0, 0.5, 1.0]
    assert np.count_nonzero(search_splits(cost, rnd, GAMMA, g, g, memory_taken=10_000.0).modes) == 1
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, BUDGET_AD - 20_000.0) == 0
    choice = search_splits(cost, rnd, GAMMA, g, g, memory_taken=20_000.0)
    assert choice.modes.tolist() == [0] and choice.grid_points_solved == 2
    # SD only: V alone, with 180_000 - 50_000 = 130_000 B of KV left for SD it no longer fits SD ...
    v = make_round([2], [40], [10.0], [0.95], [0.01], [0.01])
    assert best_subset(cost, v, SD, GAMMA, 1.0, BUDGET_SD - 40_000.0) == 1
    assert best_subset(cost, v, SD, GAMMA, 1.0, BUDGET_SD - 50_000.0) == 0
    assert search_splits(cost, v, GAMMA, [0.0], [0.0], memory_taken=40_000.0).modes.tolist() == [SD]
    assert search_splits(cost, v, GAMMA, [0.0], [0.0], memory_taken=50_000.0).modes.tolist() == [0]
    # ... and on a split point (z = 0.5, lam = 0.2): SD gets 0.8 * (180_000 - taken)
    assert search_splits(cost, v, GAMMA, [0.5], [0.2], memory_taken=5_000.0).modes.tolist() == [SD]  # 140_000 B
    assert search_splits(cost, v, GAMMA, [0.5], [0.2], memory_taken=10_000.0).modes.tolist() == [0]  # 136_000 B


def test_a_mixed_point_shares_the_kv_budget_with_the_draft_model_loaded():
    """A: I=20, O=50, deadline 10 s: AD KV 70 * 2000 = 140_000 B (SD KV 74 * 3000 B: never SD).
    S: I=2, O=10, alpha 0.95, deadline 0.21 s: SD only (AD takes 0.59 s at share 0.2; SD 0.091 s
    alone at share 1, within 0.8 * 0.19 s), SD KV 16 * 3000 = 48_000 B. Together 188_000 B: more
    than the 180_000 B left with the SLM loaded, so no plan serves both; with the AD-only
    budget (200_000 B) at (0.2, 0.72) they would seem to fit (144_000 + 56_000 B)."""
    cost = golden()
    rnd = make_round([20, 2], [50, 10], [10.0, 0.21], [0.9, 0.95], [0.01, 0.01], [0.01, 0.01])
    assert brute_optimum(cost, rnd, GAMMA) == 1
    assert best_subset(cost, rnd, AD, GAMMA, 0.2, 0.72 * BUDGET_AD, np.array([True, False])) == 1
    assert best_subset(cost, rnd, SD, GAMMA, 0.8, 0.28 * BUDGET_AD, np.array([False, True])) == 1
    g_z, g_lam = [0.0, 0.2, 1.0], [0.0, 0.72, 1.0]
    plan = split_search(cost, rnd, GAMMA, g_z, g_lam)
    assert check_plan(cost, rnd, plan).feasible and plan.admitted == 1
    assert (plan.admitted, plan.z, plan.lam) == _scan(cost, rnd, g_z, g_lam)[:3]


def test_mixed_winner_modes_are_int8():
    """The hand walk of test_agents_core (A on AD, S on SD at (0.2, 0.7)): the winner is a grid
    point, not a corner, and its modes array is the documented int8."""
    cost = golden()
    rnd = make_round([7, 2], [50, 10], [10.0, 0.21], [0.9, 0.95], [0.01, 0.01], [0.01, 0.01])
    choice = search_splits(cost, rnd, GAMMA, [0.0, 0.2, 1.0], [0.0, 0.7, 1.0])
    assert choice.modes.tolist() == [AD, SD] and choice.modes.dtype == np.int8
    assert (choice.z, choice.lam, choice.grid_points_solved) == (0.2, 0.7, 3)


def test_corners_only_when_both_coordinates_are_on_the_grid():
    """z = 0 is on the grid but lam = 0 is not: the SD-only corner (0, 0) is no candidate. User V
    (SD KV 138_000 B, AD KV 84_000 B) fits SD at (0, 0) (180_000 B) but neither mode with lam = 0.4
    (AD 72_000 B, SD 108_000 B)."""
    cost = golden()
    v = make_round([2], [40], [10.0], [0.95], [0.01], [0.01])
    assert best_subset(cost, v, SD, GAMMA, 1.0, BUDGET_SD) == 1
    assert best_subset(cost, v, SD, GAMMA, 1.0, 0.6 * BUDGET_SD) == 0
    assert best_subset(cost, v, AD, GAMMA, 1.0, 0.4 * BUDGET_SD) == 0
    choice = search_splits(cost, v, GAMMA, [0.0, 0.5], [0.4])
    assert (choice.modes.tolist(), choice.z, choice.lam) == ([0], 0.5, 0.4)
    assert choice.grid_points_solved == 1  # the first grid point, (0.5, 0.4); (0, 0.4) bounds 0
    # z = 1 on the grid, lam = 1 not: no AD-only corner either (U needs lam >= 0.94 at z = 1)
    cost, rnd = golden(), _big_ad_user()
    choice = search_splits(cost, rnd, GAMMA, [1.0], [0.5, 0.9])
    assert choice.modes.tolist() == [0] and choice.lam in (0.5, 0.9)


def test_balance_with_an_explicit_grid_searches_those_points():
    class Fixed(Balance):
        z_grid = [1, 0]  # ints: the search converts every point with float()
        lam_grid = [1]

    cost, rnd = golden(), _big_ad_user()
    plan = Fixed(cost, 4, GAMMA).plan(rnd)
    assert (plan.modes.tolist(), plan.z, plan.lam) == ([AD], 1.0, 1.0)


def test_an_empty_grid_solves_no_point_and_rejects_everyone():
    """``search_splits`` promises None when no grid point was solved: an empty z or lam grid
    (it once raised from ``np.stack``), and ``split_search`` then rejects every user."""
    from agents.balance import search_splits, split_search
    from envs import CostModel, EnvConfig
    from envs.workload import make_rounds

    cfg = EnvConfig(num_users=4)
    cost, rnd = CostModel.from_config(cfg), make_rounds(cfg, 1, seed=0)[0]
    for zs, lams in (([], [0.5]), ([0.5], []), ([], [])):
        assert search_splits(cost, rnd, 4, zs, lams) is None
        plan = split_search(cost, rnd, 4, zs, lams)
        assert (plan.modes == 0).all() and plan.extra["grid_points_solved"] == 0
