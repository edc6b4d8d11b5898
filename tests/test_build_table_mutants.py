"""The per-mode solver's tables (``agents.mode_solver.build_table``) on rounds built to sit on their edges.

The mutation run of ``agents/mode_solver.py`` left parts of the table unobserved: a round with no
users, users with no input or no output tokens (thresholds of 0), the order of users by slack minus
uplink, the per-SD-user workspace in rows solved without output thresholds and in optimistic
tables, the optimistic table's own cost (context growth ignored), an uplink limit met exactly,
and which of several optimal sets the best-bound-first search returns. Every expected count is
the brute-force optimum over all subsets (``test_agents_core``'s ``best_subset``, the exact
formulas of ``envs.feasibility``), every returned set is checked to fit, and the hand-made rounds'
numbers are in the docstrings. The optimistic table is a relaxation, so its expectations are
derived by hand from its definition (SD cost at ``N = 0``, per-user KV unchanged).
"""

from __future__ import annotations

import numpy as np
import pytest
from adversarial_rounds import issue_counterexample, mode_cost_and_memory
from test_agents_core import best_subset, golden, make_round
from test_mode_solver_mutants import _solve

from agents.mode_solver import EPS, build_table, solve_mode, upper_bound_grid
from envs import AD, SD, CostModel, EnvConfig
from envs.cost_model import sd_iterations
from envs.model_choices import ModelChoices

GAMMA = 4
CFG = EnvConfig(num_users=8)
PAPER = {kv: CostModel(CostModel.from_config(CFG).profile, kv) for kv in ("per_user", "padded")}
KVS = ["per_user", "padded"]


def _alone(cost, rnd, user, mode, gamma=GAMMA):
    """(batch time, KV bytes) of ``user`` served alone in ``mode``."""
    mask = np.zeros((1, rnd.num_users), dtype=bool)
    mask[0, user] = True
    c, _, m = mode_cost_and_memory(cost, rnd, mask, mode, gamma)
    return float(c[0]), float(m[0])


# ------------------------------------------------------------------ a round with no users
@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode,optimistic", [(AD, False), (SD, False), (SD, True)])
def test_a_round_with_no_users_has_no_rows(kv, mode, optimistic):
    """Zero users: the table has no rows (its maxima reductions see no member and must not
    fail), the solver serves no one and every bound is 0."""
    cost = golden(kv)
    rnd = make_round([], [], [], [], [], [])
    tab = build_table(cost, rnd, mode, GAMMA, optimistic)
    assert tab.num_tuples == 0 and tab.cost.shape == (0, 1)
    assert solve_mode(tab, np.zeros(0, dtype=bool), 1.0, 1e9).tolist() == []
    assert upper_bound_grid(tab, [0.5, 1.0], [1e5, 1e9]).tolist() == [[0, 0], [0, 0]]


# ------------------------------------------------------------------ thresholds of 0 tokens
@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode", [AD, SD])
def test_a_user_with_no_input_is_priced_at_zero_input_tokens(kv, mode):
    """User 0: I=0, O=5; user 1: I=10, O=5 (same output and alpha: one output threshold), both
    with 10 s. The KV budget is user 0's exact need alone (0 input tokens + its output [+ gamma for
    SD]), which user 1 (10 more tokens) exceeds: the optimum is {0}. A table that prices user 0's
    row at 1 input token (a maximum starting at 1) asks one token too many and serves no one."""
    cost = golden(kv)
    rnd = make_round([0, 10], [5, 5], [10.0, 10.0], [0.8, 0.8], [0.01, 0.01], [0.01, 0.01])
    _, mem = _alone(cost, rnd, 0, mode)
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 1
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem, np.array([False, True])) == 0
    assert _solve(cost, rnd, mode, 1.0, mem) == [0]
    tab = build_table(cost, rnd, mode, GAMMA)
    assert upper_bound_grid(tab, [1.0], [mem, mem * (1 - 1e-6)]).tolist() == [[1, 0]]


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode", [AD, SD])
def test_a_user_with_no_output_is_priced_at_zero_output_tokens(kv, mode):
    """User 0: I=5, O=0 (0 SD iterations), no link time, deadline = its own batch time to the
    bit; user 1: I=5, O=5, 10 s. The KV budget is user 0's exact need alone, which user 1 (5 more
    tokens) exceeds: the optimum is {0}. Pricing user 0's row at 1 output token (padded KV) or 1
    SD iteration (a maximum starting at 1) makes it too big or too slow to serve."""
    cost = golden(kv)
    probe = make_round([5], [0], [10.0], [0.8], [0.0], [0.0])
    assert sd_iterations(probe.output_tokens, probe.alpha, GAMMA).tolist() == [0]
    c, _ = _alone(cost, probe, 0, mode)
    rnd = make_round([5, 5], [0, 5], [c, 10.0], [0.8, 0.8], [0.0, 0.01], [0.0, 0.01])
    _, mem = _alone(cost, rnd, 0, mode)
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 1
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem, np.array([False, True])) == 0
    assert _solve(cost, rnd, mode, 1.0, mem) == [0]
    tab = build_table(cost, rnd, mode, GAMMA)
    assert upper_bound_grid(tab, [1.0], [mem]).tolist() == [[1]]


# ------------------------------------------------------------------ users ordered by slack minus uplink
@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode", [AD, SD])
def test_the_time_bound_orders_users_by_slack_minus_uplink(kv, mode):
    """Users alike in I, O, alpha (one row); C1 = the batch time of one. User 0: uplink 1 s,
    slack 1 s + 0.1 C1 (a budget of 0.1 C1: it fits no batch), the larger slack plus uplink;
    user 1: no uplink, slack C1 exactly (it fits alone). The optimum is {1}. The row's bound must
    rank user 1 first (budget C1: share 1 for a batch of one); ranking by slack plus uplink puts
    user 0 first (share 10) and user 1 second (C2 / C1 > 1), a bound of 0 that drops the row."""
    cost = golden(kv)
    c1, _ = _alone(cost, make_round([6], [9], [10.0], [0.8], [0.0], [0.0]), 0, mode)
    rnd = make_round([6, 6], [9, 9], [1.0 + 0.1 * c1, c1], [0.8, 0.8], [1.0, 0.0], [0.0, 0.0])
    assert rnd.slack_s[0] + rnd.uplink_s[0] > rnd.slack_s[1] + rnd.uplink_s[1]
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, rnd, mode, GAMMA, 1.0, mem) == 1
    assert _solve(cost, rnd, mode, 1.0, mem) == [1]
    assert upper_bound_grid(build_table(cost, rnd, mode, GAMMA), [1.0], [mem]).tolist() == [[1]]


# ------------------------------------------------------------------ per-SD-user workspace
def _workspace_cost(kv):
    cost = CostModel(PAPER[kv].profile, kv, choices=ModelChoices(sd_user_workspace_bytes=0.32e9))
    assert cost.sd_user_extra_tokens > 0
    return cost


@pytest.mark.parametrize("kv", KVS)
def test_sd_user_workspace_is_priced_in_a_row_without_output_thresholds(kv):
    """One SD user (issue 10's short user, 10 s): its row's maxima are its own, so the row is
    solved at its own output directly (no per-output sub-problems) from the table's per-user KV
    base. With 0.32 GB of workspace per SD user, it is served with exactly its SD need and not a
    hair under it (a base that subtracts the workspace would still fit it)."""
    cost = _workspace_cost(kv)
    two = issue_counterexample(CFG, cost, GAMMA)
    rnd = make_round(two.input_tokens[:1], two.output_tokens[:1], [10.0], two.alpha[:1], [0.0], [0.0])
    _, need = _alone(cost, rnd, 0, SD)
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need) == 1
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need * (1 - 1e-6)) == 0
    assert _solve(cost, rnd, SD, 1.0, need) == [0]
    assert _solve(cost, rnd, SD, 1.0, need * (1 - 1e-6)) == []
    tab = build_table(cost, rnd, SD, GAMMA)
    assert upper_bound_grid(tab, [1.0], [need, need * (1 - 1e-6)]).tolist() == [[1, 0]]


def test_sd_user_workspace_is_priced_in_optimistic_tables():
    """The optimistic SD table relaxes only the cost (context growth ignored); with per-user KV
    its memory is exact, workspace included: one user with 10 s is bounded 1 at its exact SD need
    and 0 a hair under it."""
    cost = _workspace_cost("per_user")
    two = issue_counterexample(CFG, cost, GAMMA)
    rnd = make_round(two.input_tokens[:1], two.output_tokens[:1], [10.0], two.alpha[:1], [0.0], [0.0])
    _, need = _alone(cost, rnd, 0, SD)
    tab = build_table(cost, rnd, SD, GAMMA, optimistic=True)
    assert upper_bound_grid(tab, [1.0], [need, need * (1 - 1e-6)]).tolist() == [[1, 0]]
    assert _solve(cost, rnd, SD, 1.0, need, optimistic=True) == [0]
    assert _solve(cost, rnd, SD, 1.0, need * (1 - 1e-6), optimistic=True) == []


# ------------------------------------------------------------------ the optimistic table's cost
@pytest.mark.parametrize("kv", KVS)
def test_optimistic_tables_price_sd_at_the_prompt_alone(kv):
    """One SD user, I=6, O=20, alpha 0.8 (J iterations), no link time, its deadline = the SD time
    of a batch of one at N = 0 (context = the prompt alone: the optimistic cost), to the bit. The
    optimistic table must bound it 1 and its solver serve it (the relaxation's optimum); its real
    batch (context growing with the output) is slower, so the exact table and brute force serve
    no one. Pricing the optimistic table at N = 1, or solving its row per output threshold with
    the real cost, refuses it."""
    cost = golden(kv)
    j = int(sd_iterations(np.array([20]), np.array([0.8]), GAMMA)[0])
    c_opt = float(cost.sd_time(1, 6, 0, j, GAMMA))
    rnd = make_round([6], [20], [c_opt], [0.8], [0.0], [0.0])
    c_real, _ = _alone(cost, rnd, 0, SD)
    assert c_real > c_opt * (1 + 1e-6)
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, mem) == 0
    assert _solve(cost, rnd, SD, 1.0, mem) == []
    opt = build_table(cost, rnd, SD, GAMMA, optimistic=True)
    assert upper_bound_grid(opt, [1.0, 1.0 - 1e-6], [mem]).tolist() == [[1], [0]]
    assert _solve(cost, rnd, SD, 1.0, mem, optimistic=True) == [0]
    assert _solve(cost, rnd, SD, 1.0 - 1e-6, mem, optimistic=True) == []


# ------------------------------------------------------------------ an uplink limit met exactly
@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode", [AD, SD])
def test_an_uplink_limit_met_exactly_admits_the_user(kv, mode):
    """One user with no uplink and slack s = C / (share (1 + EPS)) in floating point, for a
    share where the exact check accepts it (C / s <= share (1 + EPS)). The uplink limit its own
    slack leaves, s - C / (share (1 + EPS)), is exactly 0.0 = its uplink: the threshold must be
    kept (>=) and the user counted (<=)."""
    cost = golden(kv)
    c, _ = _alone(cost, make_round([6], [9], [10.0], [0.8], [0.0], [0.0]), 0, mode)
    mem = float(cost.memory_budget(True))
    found = 0
    for share in np.linspace(0.3, 1.0, 71):
        share = float(share)
        s = c / (share * (1 + EPS))
        if s - c / (share * (1 + EPS)) != 0.0 or not c / s <= share * (1 + EPS):
            continue
        rnd = make_round([6], [9], [s], [0.8], [0.0], [0.0])
        assert rnd.slack_s[0] == s
        assert best_subset(cost, rnd, mode, GAMMA, share, mem) == 1
        assert _solve(cost, rnd, mode, share, mem) == [0]
        found += 1
    assert found >= 5


# ------------------------------------------------------------------ which optimal set: best bound first
# Golden AD times (s): C(b; S=3, N=9) = 0.1073, 0.1246, 0.1419; C(b; 6, 5) = 0.064, 0.078, 0.092;
# C(b; 6, 9) = 0.113, 0.136, 0.159. Users 0-2 ("A": I=3, O=9) and 3-5 ("B": I=6, O=5) make three
# rows, in row order: A (3, 9), B (6, 5), and everyone (6, 9).
_A_B_INPUTS = [3, 3, 3, 6, 6, 6]
_A_B_OUTPUTS = [9, 9, 9, 5, 5, 5]


def _a_b_round(a_slack: float, a3_slack: float):
    """B as in the two-pairs test (3 and 4: slack 0.117 = 1.5 C(2; 6, 5), no uplink; 5: uplink
    0.156, slack 0.273, so it pairs with neither); A: 0 and 1 with slack ``a_slack`` (no uplink), 2 with ``a3_slack``."""
    return make_round(_A_B_INPUTS, _A_B_OUTPUTS, [a_slack, a_slack, a3_slack, 0.117, 0.117, 0.273], [0.8] * 6,
                      [0.0, 0.0, 0.0, 0.0, 0.0, 0.156], [0.0] * 6)


def test_the_row_with_the_larger_time_bound_is_solved_first():
    """Users 0, 1 have slack 0.13: a pair of A fits (C(2; 3, 9) = 0.1246), but no pair holding a B
    user or priced at (6, 9) (C(2; 6, 9) = 0.136). User 2 has slack 0.1 (C(3; 3, 9) / 0.1 = 1.42:
    no batch at share 1). Row bounds at share 1:
    A 2 (its third rank needs share 1.42), B 3 (C(3; 6, 5) = 0.092 <= 0.117), everyone 1. The
    optimum is 2, {0, 1} or {3, 4}; visiting rows best bound first solves B first and keeps its
    pair ({0, 1} never beats it). A time bound loosened by 2x (share 1.42 counted), or counted
    over all rows, ties A with B, and A, earlier in row order, would then give {0, 1}."""
    cost = golden("per_user")
    rnd = _a_b_round(0.13, 0.1)
    mem = float(cost.memory_budget(True))
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, mem) == 2
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, mem, np.array([True, True, True, False, False, False])) == 2
    assert upper_bound_grid(build_table(cost, rnd, AD, GAMMA), [1.0], [mem]).tolist() == [[3]]
    assert _solve(cost, rnd, AD, 1.0, mem) == [3, 4]


def test_the_row_with_the_larger_memory_bound_is_solved_first():
    """Users 0-2 have slack 0.142 (three A fit in time: C(3; 3, 9) = 0.1419; everyone's row, at
    (6, 9), bounds 2: C(3; 6, 9) / 0.142 = 1.12). The KV budget is 34 tokens (68_000 B): an A user
    takes 12 (3 + 9), a B user 11 (6 + 5), so A's memory bound is 2 and B's 3. The optimum is 2,
    {0, 1} or {3, 4} (a B user pairs with no A user: C(2; 6, 9) = 0.136 > 0.117); B (bound 3) is
    solved first and its pair kept. A memory bound loosened
    (twice the budget, or bytes times instead of over bytes per token, or counted over all rows)
    ties A with B, and A, earlier in row order, would then give {0, 1}."""
    cost = golden("per_user")
    rnd = _a_b_round(0.142, 0.142)
    mem = 34 * cost.kv_l
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, mem) == 2
    assert best_subset(cost, rnd, AD, GAMMA, 1.0, mem, np.array([True, True, True, False, False, False])) == 2
    assert _solve(cost, rnd, AD, 1.0, mem) == [3, 4]


@pytest.mark.parametrize("kv", KVS)
def test_sd_output_thresholds_are_tried_most_users_first(kv):
    """Issue 10's two users (equal inputs and SD iterations, outputs 83 and 160: one row), both
    with 10 s, user 1 with the larger slack, and a KV budget of user 1's exact SD need: either
    fits alone, never both (the optimum is 1). The row is solved per output threshold, the
    largest (most users) first: at n = 160 the tightest-slack threshold that fits is user 1's, so
    user 1 is served; trying n = 83 first would serve user 0 instead."""
    cost = PAPER[kv]
    rnd = issue_counterexample(CFG, cost, GAMMA)
    assert rnd.output_tokens.tolist() == [83, 160]
    rnd.deadline_s = rnd.uplink_s + rnd.downlink_s + np.array([9.0, 10.0])
    _, need1 = _alone(cost, rnd, 1, SD)
    _, need0 = _alone(cost, rnd, 0, SD)
    assert need0 <= need1
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, need1) == 1
    assert _solve(cost, rnd, SD, 1.0, need1) == [1]


# ------------------------------------------------------------------ an SD row's output lower bound
def _hopeless_but_first(cost, inp, out, alpha):
    """Users ``inp``/``out``/``alpha`` with no link time: user 0's deadline 0.99 times its own SD
    time alone (it just misses), the others 1 ms (hopeless)."""
    k = len(inp)
    probe = make_round(inp, out, [10.0] * k, alpha, [0.0] * k, [0.0] * k)
    c0, _ = _alone(cost, probe, 0, SD)
    return make_round(inp, out, [0.99 * c0] + [1e-3] * (k - 1), alpha, [0.0] * k, [0.0] * k), c0


def _assert_no_one_served(cost, rnd):
    """Brute force, the SD table's bound (share 1, ample KV) and the solver all serve no one."""
    assert best_subset(cost, rnd, SD, GAMMA, 1.0, 1e9) == 0
    assert upper_bound_grid(build_table(cost, rnd, SD, GAMMA), [1.0], [1e9]).tolist() == [[0]]
    assert _solve(cost, rnd, SD, 1.0, 1e9) == []


@pytest.mark.parametrize("kv", KVS)
def test_an_sd_row_is_priced_at_the_output_of_its_own_longest_iteration_user(kv):
    """A: I=10, O=120, alpha 0.5 (J = 62), deadline 0.99 x its SD time alone (2.3068 s); B: I=20,
    O=5 (J = 3) and C: I=200, O=62, alpha 0 (J = 62), both hopeless (1 ms). No one can be served.
    Row (S=20, J=62) holds A and B: a batch with these maxima holds A (the only member at J = 62),
    so its N is at least 120 and the row's bound (share 1, ample KV) is 0. Taking the output at
    J = 62 from another row's users (B's 5: C(1; 20, 5, 62) = 1.79 s) or from C, outside the row
    (62: C(1; 20, 62, 62) = 2.11 s), prices the row below A's own time and bounds it 1."""
    cost = golden(kv)
    rnd, c0 = _hopeless_but_first(cost, [10, 20, 200], [120, 5, 62], [0.5, 0.5, 0.0])
    assert sd_iterations(rnd.output_tokens, rnd.alpha, GAMMA).tolist() == [62, 3, 62]
    assert float(cost.sd_time(1, 20, 62, 62, GAMMA)) < 0.99 * c0
    _assert_no_one_served(cost, rnd)


@pytest.mark.parametrize("kv", KVS)
def test_an_sd_row_is_priced_at_the_output_of_its_own_longest_input_user(kv):
    """A: I=20, O=120, alpha 0.95 (J = 27), deadline 0.99 x its SD time alone (1.0806 s); B: I=10,
    O=30, alpha 0 (J = 30) and D: I=20, O=40, alpha 0 (J = 40), both hopeless. No one can be
    served. Row (S=20, J=30) holds A and B: a batch with these maxima holds A (the only member at
    S = 20), so its N is at least 120 and the row's bound is 0. Taking the output at S = 20 from
    another row (B's 30 in row (10, 30): C(1; 20, 30, 30) = 0.953 s) or from D, outside the row
    (40: C(1; 20, 40, 30) = 0.980 s), prices the row below A's own time and bounds it 1."""
    cost = golden(kv)
    rnd, c0 = _hopeless_but_first(cost, [20, 10, 20], [120, 30, 40], [0.95, 0.0, 0.0])
    assert sd_iterations(rnd.output_tokens, rnd.alpha, GAMMA).tolist() == [27, 30, 40]
    assert float(cost.sd_time(1, 20, 40, 30, GAMMA)) < 0.99 * c0
    _assert_no_one_served(cost, rnd)


@pytest.mark.parametrize("kv", KVS)
@pytest.mark.parametrize("mode", [AD, SD])
def test_a_user_exactly_at_the_checks_tolerance_survives_the_row_pruning(kv, mode):
    """User 0's slack is ``C / (share * (1 + EPS))``, the least time the exact check accepts; user 1
    has 10 s, and the memory is exactly user 0's need, so brute force serves one user. The rows'
    necessary condition (``_may_fit``) once compared the slack with ``C / share * (1 - EPS)``,
    within rounding of the check's bound, and refused user 0 for 40 of these 66 shares (AD, per-user
    KV); it is now looser than the check by about EPS. Where the check's own rounding refuses user 0
    (brute force serves no one), so must the solver."""
    cost = golden(kv)
    c, m = _alone(cost, make_round([6], [9], [1.0], [0.9], [0.0], [0.0]), 0, mode)
    served = 0
    for share in np.linspace(0.3, 1.0, 66):
        rnd = make_round([6, 4], [9, 12], [c / (share * (1 + EPS)), 10.0], [0.9, 0.9], [0.0, 0.0], [0.0, 0.0])
        want = best_subset(cost, rnd, mode, GAMMA, float(share), m)  # 0 where the check's own rounding refuses
        assert len(_solve(cost, rnd, mode, float(share), m)) == want, share
        served += want
    assert served >= 33  # the edge is exercised: most of these shares serve user 0
