"""The certified optimum (``agents/optimal.py``): the certificate's claims, stage by stage.

Written against the mutants ``bash scripts/mutation.sh agents`` left alive in that module. Every
expected value comes from outside the code under test: brute force over all ``3^K`` plans with
the exact check, a hand-walked trace, the split bound's definition evaluated cell by cell (no
pruning, no cache), or a scripted stand-in for a stage (``test_agents_core``'s fakes) whose
arguments and effects the trace must show.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from test_agents_core import (
    CASES,
    DESCENT_COST,
    DESCENT_ROUND,
    STEP_ROUND,
    _events,
    _FakeMILP,
    _feasible_plan,
    _patch,
    brute_optimum,
    golden,
    make_round,
)

import agents.optimal as optimal
from agents.balance import grid
from agents.cost_envelope import CostEnvelope
from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from agents.optimal import Exhaustive, Optimal, certify, split_upper_bound
from envs import AD, SD, Plan, check_plans
from envs.cost_model import sd_iterations

NOBODY = make_round([], [], [], [], [], [])
ONE = make_round([5], [10], [0.3], [0.9], [0.01], [0.005])
# A on AD, S on SD (test_agents_core's mixed-round hand walk): the optimum serves both, in two modes
MIXED = make_round([7, 2], [50, 10], [10.0, 0.21], [0.9, 0.95], [0.01, 0.01], [0.01, 0.01])


# --------------------------------------------------------------------- degenerate rounds
def test_certify_without_users_is_certified_at_once(monkeypatch):
    """K = 0: one trace entry, the empty plan, every flag of a certificate; the time since
    ``start`` in seconds to 0.1 ms (a frozen clock makes it exact)."""
    monkeypatch.setattr(optimal, "time", types.SimpleNamespace(perf_counter=lambda: 7.123456))
    plan = certify(golden(), NOBODY, 2, 5.0, start=1.0)
    trace = [{"t_s": 6.1235, "lower": 0, "upper": 0, "event": "no users"}]
    assert plan.extra == {"upper_bound": 0, "gap": 0, "optimal": True, "certified": True, "trace": trace, "milp_solves": 0, "cuts": 0}
    assert isinstance(plan.extra["trace"][0]["t_s"], float)
    assert plan.modes.shape == (0,) and plan.gamma == 2 and plan.admitted == 0


def test_certify_with_one_user_serves_it():
    assert brute_optimum(golden(), ONE, 2) == 1
    plan = certify(golden(), ONE, 2, 10.0)
    assert plan.admitted == 1 and plan.extra["certified"] and plan.extra["upper_bound"] == 1
    assert check_plans(golden(), ONE, plan.modes, 2).feasible


def test_plans_carry_the_exact_checks_shares():
    """``z`` and ``lam`` of the returned plan are the exact check's shares of its own modes."""
    cost = golden()
    assert brute_optimum(cost, MIXED, 4) == 2
    for plan in (certify(cost, MIXED, 4, 1e4), Exhaustive(cost, 4, 4, warm_start=False).plan(MIXED)):
        assert plan.admitted == 2 and sorted(plan.modes.tolist()) == [AD, SD]
        rep = check_plans(cost, MIXED, plan.modes, 4)
        assert (plan.z, plan.lam) == (float(rep.z), float(rep.lam)) and 0.0 < plan.z < 1.0 and 0.0 < plan.lam < 1.0


# ------------------------------------------------------------------------- local search
LS_COST, LS_ROUND = CASES[13]  # optimum 3 of 5 (monotone); exchange moves lift one served user to two
LS_ONE = np.array([0, 0, 0, AD, 0], dtype=np.int8)


class _Spy:
    """Records each call's time budget, then runs the real function."""

    def __init__(self, real, key, pos):
        self.real, self.key, self.pos, self.limits = real, key, pos, []

    def __call__(self, *args, **kwargs):
        self.limits.append(kwargs[self.key] if self.key in kwargs else args[self.pos])
        return self.real(*args, **kwargs)


def test_local_search_lifts_the_warm_plan_within_its_budget(monkeypatch):
    """A warm plan of 1: the exchange moves find 2 (traced as "local search"), with at most
    ``local_search_s`` and 5 % of the time left (2 s limit: ~0.1 s)."""
    assert brute_optimum(LS_COST, LS_ROUND, 2) == 3 and check_plans(LS_COST, LS_ROUND, LS_ONE, 2).feasible
    spy = _Spy(optimal.improve, "time_limit_s", 4)
    monkeypatch.setattr(optimal, "improve", spy)
    plan = certify(LS_COST, LS_ROUND, 2, 2.0, [Plan(LS_ONE, gamma=2)], local_search_s=1.0)
    assert _events(plan)[:2] == [("warm start", 1, 5), ("local search", 2, 5)]
    assert len(spy.limits) == 1 and 0.09 < spy.limits[0] <= 0.1
    assert plan.admitted == 3 and plan.extra["certified"]
    spy.limits.clear()
    plan = certify(LS_COST, LS_ROUND, 2, 1e4, [Plan(LS_ONE, gamma=2)], local_search_s=0.25)
    assert _events(plan)[1] == ("local search", 2, 5) and spy.limits == [0.25]


@pytest.mark.parametrize("warm,seconds", [((), 1.0), ("one", 0.0)])
def test_local_search_needs_a_warm_plan_and_time(monkeypatch, warm, seconds):
    """No warm plan (nothing to exchange) or ``local_search_s = 0`` (the default): no stage."""
    spy = _Spy(optimal.improve, "time_limit_s", 4)
    monkeypatch.setattr(optimal, "improve", spy)
    plans = [Plan(LS_ONE, gamma=2)] if warm else []
    plan = certify(LS_COST, LS_ROUND, 2, 1e4, plans, local_search_s=seconds)
    assert spy.limits == [] and "local search" not in [e[0] for e in _events(plan)]
    assert plan.admitted == 3 and plan.extra["certified"]


def test_optimal_local_search_option():
    cost = golden()
    assert Optimal(cost, 4, 2).local_search_s == 2.0
    for ok in (0.0, 0.5):
        assert Optimal(cost, 4, 2, local_search_s=ok).local_search_s == ok
    with pytest.raises(ValueError, match=r"^local_search_s must be >= 0, got -1.0$"):
        Optimal(cost, 4, 2, local_search_s=-1.0)


def test_optimal_solve_passes_its_options_to_certify(monkeypatch):
    calls = []

    def fake(*args):
        calls.append(args)
        return Plan(np.zeros(LS_ROUND.num_users, dtype=np.int8), gamma=2)

    monkeypatch.setattr(optimal, "certify", fake)
    Optimal(LS_COST, 4, 2, time_limit_s=3.0, bound_step=0.1, exhaustive_share=0.25, local_search_s=0.75).plan(LS_ROUND)
    (cost, rnd, gamma, limit, plans, start, step, share, ls), = calls
    assert (cost, rnd, gamma, limit, step, share, ls) == (LS_COST, LS_ROUND, 2, 3.0, 0.1, 0.25, 0.75)


# --------------------------------------------------------------------------- the joint bound
def test_joint_bound_stage_arguments_and_trace(monkeypatch):
    """The joint bound gets the proven bound (the split bound), the incumbent and ``joint_share``
    of the time left; its value is traced as "joint bound". A stand-in returns the optimum (a
    valid bound) so its effect is visible."""
    cost, rnd = golden(), STEP_ROUND
    opt = brute_optimum(cost, rnd, 2)
    sb = split_upper_bound(cost, rnd, 2, 0.1)
    assert (opt, sb) == (4, 6)
    calls = []

    def fake(cost_, rnd_, gamma, upper=None, incumbent=0, time_limit_s=float("inf")):
        calls.append((upper, incumbent, time_limit_s))
        return opt

    monkeypatch.setattr(optimal, "joint_upper_bound", fake)
    two = Plan(_feasible_plan(cost, rnd, 2, 2), gamma=2)
    for share, warm in ((1.0, []), (0.5, [two])):
        calls.clear()
        kw = {} if share == 1.0 else {"joint_share": share}
        lower = 2 if warm else 0
        plan = certify(cost, rnd, 2, 100.0, warm, bound_step=0.1, **kw)
        assert _events(plan)[:3] == [("warm start", lower, 6), ("split bound", lower, 6), ("joint bound", lower, opt)]
        (upper, incumbent, limit), = calls
        assert (upper, incumbent) == (sb, lower) and 0.9 * share * 100.0 < limit <= share * 100.0
        assert plan.admitted == opt and plan.extra["certified"]
    calls.clear()
    plan = certify(cost, rnd, 2, 100.0, [], bound_step=0.1, joint_share=0.0)
    assert calls == [] and "joint bound" not in [e[0] for e in _events(plan)] and plan.admitted == opt


# ------------------------------------------------------------------ the descent and the MILP
def test_descent_steps_back_to_one_after_a_slow_proof(monkeypatch):
    """Scripted searches (non-monotone round: no split bound), warm lower 2, upper 6, 40 s:

    1. step 2, target 5 (0.2 s limit): stopped -> single steps;
    2. step 1, target 6 = upper: proof in 0.5 s -> upper 5;
    3. 0.5 s is over 1 % of the ~39.5 s left: step 1 again, target 5: proof -> upper 4;
    4. a fast proof: step 2, target max(3, 4 - 2 + 1) = 3: a plan of 3 -> lower 3;
    5. step 4, target max(4, ...) = 4 = upper: proof -> upper 3 = lower."""
    cost, rnd = DESCENT_COST, DESCENT_ROUND
    two, three = _feasible_plan(cost, rnd, 2, 2), _feasible_plan(cost, rnd, 2, 3)
    fake = _patch(monkeypatch, [(0.0, (None, False, 6)), (0.5, (None, True, 5)), (0.0, (None, True, 4)), (0.0, (three, True, 3)), (0.0, (None, True, 3))])
    plan = certify(cost, rnd, 2, 40.0, [Plan(two, gamma=2)])
    assert [c["incumbent"] for c in fake.calls] == [4, 5, 4, 2, 3]
    assert _events(plan) == [("warm start", 2, 6), ("exhaustive search: none serves 6", 2, 5), ("exhaustive search: none serves 5", 2, 4),
                             ("exhaustive search found 3", 3, 4), ("exhaustive search: none serves 4", 3, 3)]
    assert plan.modes.tolist() == three.tolist() and plan.extra["certified"]


def test_milp_feasible_optimum_is_taken_without_cuts(monkeypatch):
    """The MILP's optimum passes the exact check: it becomes the incumbent as it is (no repair,
    no cut); a feasible plan with status "feasible" is taken too."""
    cost, rnd = DESCENT_COST, DESCENT_ROUND
    two, three, four = (_feasible_plan(cost, rnd, 2, n) for n in (2, 3, 4))
    _patch(monkeypatch, [], [("optimal", four, 4)])
    plan = certify(cost, rnd, 2, 40.0, [Plan(two, gamma=2)], exhaustive_share=0.0)
    assert _events(plan) == [("warm start", 2, 6), ("MILP optimal", 4, 4)]
    assert plan.modes.tolist() == four.tolist() and plan.extra["cuts"] == 0 and _FakeMILP.instances[0].cut_for == []
    _patch(monkeypatch, [], [("feasible", three, 5), ("infeasible", None, None)])
    plan = certify(cost, rnd, 2, 40.0, [Plan(two, gamma=2)], exhaustive_share=0.0)
    assert _events(plan) == [("warm start", 2, 6), ("MILP feasible", 3, 5), ("relaxation cannot beat the incumbent", 3, 3)]
    assert plan.modes.tolist() == three.tolist() and plan.extra["milp_solves"] == 2 and plan.extra["cuts"] == 0


# ------------------------------------------------------------------------- the split bound
def _split_bound_by_definition(cost, rnd, gamma, step) -> int:
    """Every cell of the grid solved exactly (no cheap bounds, no pruning, no cache): the larger
    of the single-mode optima and, over the cells, AD on (g[i+1], g[j+1]) plus SD (optimistic
    table) on the rest (1 - g[i], 1 - g[j]), capped at K."""
    k = rnd.num_users
    everyone = np.ones(k, dtype=bool)
    ad, sd = build_table(cost, rnd, AD, gamma), build_table(cost, rnd, SD, gamma, optimistic=True)
    mem = float(cost.memory_budget(True))
    best = max(len(solve_mode(ad, everyone, 1.0, float(cost.memory_budget(False)))), len(solve_mode(sd, everyone, 1.0, mem)))
    g = grid(step)
    for i in range(len(g) - 1):
        for j in range(len(g) - 1):
            a = len(solve_mode(ad, everyone, float(g[i + 1]), float(g[j + 1]) * mem))
            s = len(solve_mode(sd, everyone, 1.0 - float(g[i]), (1.0 - float(g[j])) * mem))
            best = max(best, min(a + s, k))
    return best


@pytest.mark.parametrize("step", [0.25, 0.1])
def test_split_bound_equals_its_definition(step):
    rounds = CASES if step == 0.25 else CASES[:4]
    for i, (cost, rnd) in enumerate(rounds):
        gamma = 1 + i % 4
        ref = _split_bound_by_definition(cost, rnd, gamma, step)
        assert split_upper_bound(cost, rnd, gamma, step) == ref >= brute_optimum(cost, rnd, gamma), i


def _last_row_round():
    """Two AD users (acceptance 0.5) needing 80 % of the compute together and one SD user
    (30 tokens, acceptance 0.95) needing 15 %: the optimum 3 lies only in the grid's last row of
    cells (AD share 1, SD share one step)."""
    cost = golden()
    c2 = float(cost.ad_time(2, 5, 8))
    sd = float(cost.sd_time(1, 5, 30, int(sd_iterations(np.array([30]), np.array([0.95]), 4)[0]), 4))
    rnd = make_round([5, 5, 5], [8, 8, 30], [0.015 + c2 / 0.8, 0.015 + c2 / 0.8, 0.015 + sd / 0.15], [0.5, 0.5, 0.95], [0.01] * 3, [0.005] * 3)
    return cost, rnd


def _last_column_round():
    """Two AD users (acceptance 0.05: SD is useless to them) whose KV needs 160_000 B of a
    205_000 B budget (more than 3/4), and an SD user (1 + 8 tokens) whose deadline AD misses
    and whose KV needs 39_000 B (less than 1/4): the optimum 3 lies only in the last column."""
    cost = golden(memory_bytes=2_120_000.0 + 205_000.0)
    c2 = float(cost.ad_time(2, 15, 25))
    ad3 = float(cost.ad_time(1, 1, 8))
    rnd = make_round([15, 15, 1], [25, 25, 8], [0.015 + c2 / 0.2, 0.015 + c2 / 0.2, 0.015 + 0.98 * ad3], [0.05, 0.05, 0.95], [0.01] * 3, [0.005] * 3)
    return cost, rnd


# rounds on which the bound needs the grid's edges (found by search, then fixed)
EDGE_ROUNDS = [
    (golden("padded"), 1, 0.25, make_round([2, 2, 2, 9, 2], [3, 14, 14, 14, 3], [0.16, 0.3, 0.16, 0.05, 0.09], [0.95, 0.5, 0.95, 0.9, 0.7],
                                           [0.0244, 0.0181, 0.0197, 0.0274, 0.002], [0.0083, 0.0038, 0.0033, 0.0099, 0.0078])),
    (golden(memory_bytes=2_260_000.0), 1, 0.25, make_round([10, 10, 3, 9], [10, 4, 16, 6], [0.5383, 0.1875, 0.5972, 0.5623], [0.5, 0.7, 0.5, 0.7],
                                                           [0.0239, 0.0026, 0.0172, 0.0068], [0.0045, 0.0053, 0.0074, 0.0078])),
    (golden(), 2, 0.25, make_round([8, 1, 7, 9, 10], [1, 12, 3, 13, 13], [0.0568, 0.471, 0.4786, 0.4485, 0.285], [0.9, 0.7, 0.95, 0.9, 0.5],
                                   [0.0222, 0.0179, 0.021, 0.002, 0.029], [0.0003, 0.0018, 0.0052, 0.0057, 0.0018])),
    (golden(memory_bytes=2_260_000.0), 2, 0.1, make_round([8] * 7, [4] * 7, [0.0337, 0.0632, 0.0686, 0.0965, 0.108, 0.1134, 0.2216], [0.7, 0.5, 0.7, 0.9, 0.9, 0.7, 0.9],
                                                          [0.0121, 0.0158, 0.0122, 0.0087, 0.0003, 0.0085, 0.0223], [0.0034, 0.0077, 0.0004, 0.007, 0.0083, 0.0024, 0.0038])),
]


@pytest.mark.parametrize("which", ["row", "column", 0, 1, 2, 3])
def test_split_bound_on_rounds_that_need_every_cell(which):
    """The bound covers the optimum where only the grid's last row (AD takes all the compute) or
    last column (all the KV memory) of cells holds it, and equals the definition on the rounds
    found by search."""
    if which in ("row", "column"):
        cost, rnd = _last_row_round() if which == "row" else _last_column_round()
        gamma, step = 4, 0.25
        assert brute_optimum(cost, rnd, gamma) == 3
    else:
        cost, gamma, step, rnd = EDGE_ROUNDS[which]
    ref = _split_bound_by_definition(cost, rnd, gamma, step)
    assert ref >= brute_optimum(cost, rnd, gamma)
    assert split_upper_bound(cost, rnd, gamma, step) == ref
    for incumbent in range(rnd.num_users + 1):  # pruned: equal wherever either exceeds the incumbent
        pruned = split_upper_bound(cost, rnd, gamma, step, incumbent=incumbent)
        assert (pruned <= incumbent) == (ref <= incumbent) and (pruned == ref or ref <= incumbent)


def test_pruned_split_bound_is_the_largest_cheap_bound_left():
    """With an incumbent no cell's cheap bound exceeds (each table bounds at most K users, so 2K),
    the documented stand-in for every cell: the larger of the single-mode
    optima and the largest cheap bound of a cell, the AD table's bound at the cell's upper corner
    (g[i+1], g[j+1]) plus the optimistic SD table's at its lower one (1 - g[i], 1 - g[j])."""
    for n, (cost, rnd) in enumerate(CASES + [(c, r) for c, _, _, r in EDGE_ROUNDS]):
        gamma, step, k = 1 + n % 4, 0.25, rnd.num_users
        everyone = np.ones(k, dtype=bool)
        ad, sd = build_table(cost, rnd, AD, gamma), build_table(cost, rnd, SD, gamma, optimistic=True)
        mem = float(cost.memory_budget(True))
        single = max(len(solve_mode(ad, everyone, 1.0, float(cost.memory_budget(False)))), len(solve_mode(sd, everyone, 1.0, mem)))
        g = grid(step)
        cheap = max(int(upper_bound_grid(ad, [g[i + 1]], [g[j + 1] * mem])[0, 0] + upper_bound_grid(sd, [1.0 - g[i]], [(1.0 - g[j]) * mem])[0, 0])
                    for i in range(len(g) - 1) for j in range(len(g) - 1))
        assert split_upper_bound(cost, rnd, gamma, step, incumbent=2 * k) == max(single, cheap), n


def test_split_bound_with_nothing_servable_is_zero():
    cost = golden()
    late = make_round([5, 5, 3], [10, 10, 4], [0.02, 0.03, 0.015], [0.9, 0.9, 0.5], [0.01, 0.01, 0.01], [0.005, 0.005, 0.012])
    # one user whose KV (115 tokens: 230_000 B) exceeds the budget, one past its deadline
    big = make_round([15, 3], [100, 2], [5.0, 0.02], [0.9, 0.9], [0.01, 0.01], [0.005, 0.005])
    for rnd, step in ((late, 0.1), (big, 0.25)):
        k = rnd.num_users
        assert brute_optimum(cost, rnd, 2) == 0 and CostEnvelope(cost, rnd, 2).monotone
        assert split_upper_bound(cost, rnd, 2, step) == 0 == _split_bound_by_definition(cost, rnd, 2, step)
        plan = certify(cost, rnd, 2, 1e4, [], bound_step=step)
        assert _events(plan) == [("warm start", 0, k), ("split bound", 0, 0)] and plan.admitted == 0 and plan.extra["certified"]
