"""The per-mode solver (``agents.mode_solver.solve_mode``) on rounds built to sit on its edges.

The mutation run of ``agents/mode_solver.py`` left the search's edges untested: a deadline met
exactly, a batch whose tightest slack and largest uplink belong to different users, an SD row
solved per output threshold whose first sub-problem (or the whole row) fails, the per-SD-user
workspace in that path, memory pruning across rows, a user with no time at all, and ties between
interchangeable users. Every expected count is the brute-force optimum over all subsets
(``test_agents_core``'s ``best_subset``, the exact formulas of ``envs.feasibility``), every
returned set is checked to fit, and the hand-made rounds' numbers are in the docstrings.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversarial_rounds import issue_counterexample, mode_cost_and_memory
from test_agents_core import best_subset, golden, make_round, mode_need

from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from envs import AD, SD, CostModel, EnvConfig, Round
from envs.model_choices import ModelChoices

GAMMA = 4
CFG = EnvConfig(num_users=8)
PAPER = {kv: CostModel(CostModel.from_config(CFG).profile, kv) for kv in ("per_user", "padded")}


def _solve(cost, rnd, mode, share, mem, avail=None, gamma=GAMMA, optimistic=False):
    """solve_mode's users for ``rnd`` (all available by default); the set is checked to fit
    ``share`` and ``mem`` exactly unless the table is optimistic (a relaxation)."""
    avail = np.ones(rnd.num_users, dtype=bool) if avail is None else avail
    got = solve_mode(build_table(cost, rnd, mode, gamma, optimistic), avail, share, mem)
    mask = np.zeros(rnd.num_users, dtype=bool)
    mask[got] = True
    assert len(set(got.tolist())) == len(got) and not (mask & ~avail).any()
    if len(got) and not optimistic:
        need, kv = mode_need(cost, rnd, mask[None, :], mode, gamma)
        assert need[0] <= share * (1 + 1e-9) and kv[0] <= mem * (1 + 1e-9)
    return sorted(got.tolist())


# ------------------------------------------------------------------ a deadline met exactly
@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_a_deadline_met_exactly_is_met(kv):
    """P: I=5, O=10, no link time, deadline = its AD batch time alone, to the bit: served (the
    check's ``<=``). Q: I=20, O=60, deadline 10 s, but its AD KV (80 tokens, 160_000 B) exceeds the
    100_000 B given: it cannot be served, yet (per-user KV, where the row's bound prices P's short
    output) its threshold row is a second candidate with bound 1, so the solver also prunes rows by
    its necessary condition before solving P's."""
    cost = golden(kv)
    c = float(mode_cost_and_memory(cost, make_round([5], [10], [1.0], [0.9], [0.0], [0.0]), np.ones((1, 1), dtype=bool), AD, GAMMA)[0][0])
    rnd = make_round([5, 20], [10, 60], [c, 10.0], [0.9, 0.9], [0.0, 0.01], [0.0, 0.01])
    assert rnd.slack_s[0] - rnd.uplink_s[0] == c
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, 100_000.0) == 1
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, 100_000.0, np.array([False, True])) == 0
    assert _solve(cost, rnd, AD, 1.0, 100_000.0) == [0]
    # a hair less time than the batch takes: not served
    late = make_round([5, 20], [10, 60], [c * (1 - 1e-6), 10.0], [0.9, 0.9], [0.0, 0.01], [0.0, 0.01])
    assert best_subset(cost, late, AD, GAMMA, 1.0, 100_000.0) == 0
    assert _solve(cost, late, AD, 1.0, 100_000.0) == []


# ------------------------------------------------------------------ slack and uplink of different users
@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_two_pairs_that_do_not_mix(kv, mode):
    """Four users alike in I, O and alpha (one threshold row), each with time budget
    slack - uplink = 1.5 C2 (C2: the batch time of two): users 0, 1 with no uplink, users 2, 3
    with uplink 2 C2 and slack 3.5 C2. A batch is feasible iff its tightest slack less its largest
    uplink covers its time: {0, 1} and {2, 3} are (1.5 C2), any mix is not (1.5 C2 - 2 C2 < 0).
    The per-user bound says 4 (every budget covers C4 <= 1.5 C2); the optimum is 2."""
    cost = golden(kv)
    one = make_round([6] * 4, [9] * 4, [1.0] * 4, [0.9] * 4, [0.0] * 4, [0.0] * 4)
    c2 = float(mode_cost_and_memory(cost, one, np.array([[True, True, False, False]]), mode, GAMMA)[0][0])
    c4 = float(mode_cost_and_memory(cost, one, np.ones((1, 4), dtype=bool), mode, GAMMA)[0][0])
    assert c4 <= 1.5 * c2
    rnd = make_round([6] * 4, [9] * 4, [1.5 * c2, 1.5 * c2, 3.5 * c2, 3.5 * c2], [0.9] * 4, [0.0, 0.0, 2 * c2, 2 * c2], [0.0] * 4)
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 2
    assert _solve(cost, rnd, mode, 1.0, mem) in ([0, 1], [2, 3])
    # with one user of a pair taken elsewhere, the other pair remains
    assert _solve(cost, rnd, mode, 1.0, mem, np.array([False, True, True, True])) == [2, 3]


@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_the_tightest_slack_threshold_skips_a_user_with_a_long_uplink(kv, mode):
    """Users alike in I, O, alpha (one row); in units of C2 (the batch time of two): A slack 3,
    no uplink; B slack 2.8, uplink 2 (budget 0.8 < C2); C slack 2.5, no uplink. For two users the
    search tries the tightest slack 2.8 first (A and B; B's uplink is too long: only A), then 2.5
    (A and C: 2.5 >= C2). The optimum is {A, C}; B fits no batch of two."""
    cost = golden(kv)
    one = make_round([6] * 3, [9] * 3, [1.0] * 3, [0.9] * 3, [0.0] * 3, [0.0] * 3)
    c2 = float(mode_cost_and_memory(cost, one, np.array([[True, True, False]]), mode, GAMMA)[0][0])
    rnd = make_round([6] * 3, [9] * 3, [3.0 * c2, 2.8 * c2, 2.5 * c2], [0.9] * 3, [0.0, 2.0 * c2, 0.0], [0.0] * 3)
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 2
    assert _solve(cost, rnd, mode, 1.0, mem) == [0, 2]


# ------------------------------------------------------------------ SD rows solved per output threshold
def _issue_round(kv: str, short_deadline: str, long_deadline: str):
    """Issue 10's round (equal inputs, the same SD iteration count; user 0 short, user 1 long) with
    chosen deadlines: "own" = between user 0's SD time alone and its time priced at user 1's
    output; "hopeless" = a tenth of user 0's time; "loose" = 10 s."""
    cost = PAPER[kv]
    rnd = issue_counterexample(CFG, cost, GAMMA)
    budget = rnd.deadline_s - rnd.uplink_s - rnd.downlink_s  # issue_counterexample: [own, hopeless]
    pick = {"own": budget[0], "hopeless": budget[1], "loose": 10.0}
    rnd.deadline_s = rnd.uplink_s + rnd.downlink_s + np.array([pick[short_deadline], pick[long_deadline]])
    return cost, rnd


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_a_failing_first_output_threshold_does_not_hide_a_later_one(kv):
    """User 1 (the long output) has time to spare but its SD KV exceeds the budget, set to user 0's
    exact SD need. Sub-problem n = user 1's output bounds 1 (user 1's time, user 0's memory) yet
    serves no one; sub-problem n = user 0's output serves user 0. The optimum is 1."""
    cost, rnd = _issue_round(kv, "own", "loose")
    need = float(mode_cost_and_memory(cost, rnd, np.array([[True, False]]), SD, GAMMA)[2][0])
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need) == 1
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need, np.array([False, True])) == 0
    assert _solve(cost, rnd, SD, 1.0, need) == [0]
    assert _solve(cost, rnd, SD, 1.0, need * (1 - 1e-6)) == []


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_a_failing_output_threshold_row_does_not_hide_a_later_row(kv):
    """Users 0 and 1 as in issue 10 but user 0 hopeless and user 1 given a budget between the SD
    time priced at user 0's output and its own: their row passes the solver's necessary check
    (priced at the shorter output) and serves no one. User 2 (I=150, O=20, alpha 0.95: fewer SD
    iterations, so a row of its own, after theirs) has 10 s: the optimum is 1, user 2."""
    cost, rnd = _issue_round(kv, "hopeless", "own")
    j0 = float(mode_cost_and_memory(cost, rnd, np.array([[True, False]]), SD, GAMMA)[0][0])  # user 0 alone
    j1 = float(mode_cost_and_memory(cost, rnd, np.array([[False, True]]), SD, GAMMA)[0][0])  # user 1 alone
    assert j0 < j1
    rnd.deadline_s[1] = rnd.uplink_s[1] + rnd.downlink_s[1] + (j0 + j1) / 2
    three = Round.from_arrays(CFG, [100, 100, 150], [*rnd.output_tokens.tolist(), 20], [1.0, 1.0, 1.0],
                              [*rnd.alpha.tolist(), 0.95], [100.0, 100.0, 100.0])
    three.deadline_s = np.array([*rnd.deadline_s.tolist(), 10.0 + three.uplink_s[2] + three.downlink_s[2]])
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, three, SD, GAMMA, 1.0, mem) == 1
    assert best_subset(cost, three, SD, GAMMA, 1.0, mem, np.array([True, True, False])) == 0
    assert _solve(cost, three, SD, 1.0, mem) == [2]


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_sd_user_workspace_is_priced_per_output_threshold(kv):
    """With 0.32 GB of workspace per SD user (envs.model_choices), issue 10's short user is served
    with exactly its SD need (workspace included) and not a hair under it."""
    base = PAPER[kv]
    cost = CostModel(base.profile, kv, choices=ModelChoices(sd_user_workspace_bytes=0.32e9))
    assert cost.sd_user_extra_tokens > 0
    rnd = issue_counterexample(CFG, cost, GAMMA)
    rnd.deadline_s[1] = rnd.uplink_s[1] + rnd.downlink_s[1] + 10.0  # user 1 has time, not memory
    need = float(mode_cost_and_memory(cost, rnd, np.array([[True, False]]), SD, GAMMA)[2][0])
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need) == 1
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need * (1 - 1e-6)) == 0
    assert _solve(cost, rnd, SD, 1.0, need) == [0]
    assert _solve(cost, rnd, SD, 1.0, need * (1 - 1e-6)) == []


# ------------------------------------------------------------------ memory pruning and ties
# test_mode_solver's cases (seed, K, KV model, kind, memory tight): the first found against memory
# pruning that counts one user's output too many; the second (an adversarial round, KV budget at
# one subset's exact need) has a second threshold row whose users come earlier in KV order than
# the best-bound row's, so pruning all rows at the best row's memory position fails it
@pytest.mark.parametrize("case", [(201166, 6, "per_user", "mixed", True), (362723889, 4, "per_user", True, True)])
def test_memory_pruning_counts_only_the_users_each_row_takes(case):
    from test_mode_solver import _case

    rnd, cost = _case(*case)
    for mode, sd_loaded in ((AD, False), (SD, True)):
        mem = float(cost.memory_budget(sd_loaded))
        want = best_subset(cost, rnd, mode, GAMMA, 1.0, mem)
        assert len(_solve(cost, rnd, mode, 1.0, mem)) == want
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True))) == 1


@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_interchangeable_users_are_taken_in_index_order(kv, mode):
    """Eight users alike in every respect but user 4's shorter output (5 tokens, the others 9);
    the KV budget holds exactly users 4, 0 and 1. The solver takes user 4 and then, of the
    interchangeable rest, the first two in index order: ties in the KV order keep the users'
    order (a stable sort), so a plan is the same on every machine (numpy's default sort is not
    stable on AVX-512 CPUs)."""
    cost = golden(kv)
    out = [9, 9, 9, 9, 5, 9, 9, 9]
    rnd = make_round([6] * 8, out, [10.0] * 8, [0.9] * 8, [0.01] * 8, [0.01] * 8)
    take = np.zeros((1, 8), dtype=bool)
    take[0, [0, 1, 4]] = True
    mem = float(mode_cost_and_memory(cost, rnd, take, mode, GAMMA)[2][0])
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 3
    assert _solve(cost, rnd, mode, 1.0, mem) == [0, 1, 4]
    avail = np.array([False, True, True, True, True, True, True, True])
    assert _solve(cost, rnd, mode, 1.0, mem, avail) == [1, 2, 4]


@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_a_user_whose_uplink_uses_its_whole_slack_is_never_counted(kv, mode):
    """Users alike in I, O, alpha and links (one threshold row, where the size bound is exact --
    test_agents_core's one-row test), one of them with deadline = uplink + downlink: a time budget
    of exactly 0, so no batch holds it (as builder_cases.add_special_users makes them). The bound
    must not count it at any share, and the solver must not take it."""
    cost = golden(kv)
    rnd = make_round([6] * 5, [9] * 5, [0.32, 0.27, 0.02, 0.22, 0.17], [0.9] * 5, [0.01] * 5, [0.01] * 5)
    assert rnd.slack_s[2] - rnd.uplink_s[2] == 0.0
    shares = np.array([0.0, 0.2, 0.45, 0.7, 1.0])
    mems = np.array([0.0, 40_000.0, 120_000.0, float(cost.memory_budget(True))])
    tab = build_table(cost, rnd, mode, GAMMA)
    ub = upper_bound_grid(tab, shares, mems)
    exact = [[best_subset(cost, rnd, mode, GAMMA, s, m) for m in mems] for s in shares]
    assert ub.tolist() == exact
    assert max(map(max, exact)) >= 3
    assert 2 not in _solve(cost, rnd, mode, 1.0, mems[-1])


# ------------------------------------------------------------------ the exact check's tolerance
@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_a_user_the_exact_check_accepts_within_its_tolerance_is_served(kv, mode):
    """A user whose time budget falls short of its batch time by half the check's tolerance
    (``C / beta = 1 + 0.5e-9 <= 1 + EPS``), with an uplink short beside the batch time: the exact
    check accepts it, so the solver must too. The solver once applied the tolerance relative to
    the uplink (1e-3 s * 1e-9) instead of the batch time (~0.1 s * 1e-9) and refused it."""
    cost = golden(kv)
    c = float(mode_cost_and_memory(cost, make_round([5], [10], [1.0], [0.9], [0.0], [0.0]), np.ones((1, 1), dtype=bool), mode, GAMMA)[0][0])
    up = 1e-3
    rnd = make_round([5], [10], [c + up - 0.5e-9 * c], [0.9], [up], [0.0])
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, 1e9) == 1
    assert _solve(cost, rnd, mode, 1.0, 1e9) == [0]
    beyond = make_round([5], [10], [c + up - 2e-9 * c], [0.9], [up], [0.0])  # twice the tolerance short: refused by both
    assert best_subset(cost, beyond, mode, GAMMA, 1.0, 1e9) == 0
    assert _solve(cost, beyond, mode, 1.0, 1e9) == []
