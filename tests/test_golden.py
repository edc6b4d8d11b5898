"""Golden values: the cost model, the check, the outcome and a small optimum against hand arithmetic.

The profile and round are in ``golden_round.py`` (pass times multilinear, so the table profile is
exact). Every expected number below is derived in the comments from DESIGN.md §1 and the formulas
of ``envs/cost_model.py``'s module docstring -- not by calling the code -- so a wrong formula fails
here even when two implementations of it agree with each other.
"""

import math

import numpy as np
import pytest
from golden_round import KV_L, KV_SD, golden_cost, make_round, tau_l, tau_s, three_users

from agents.balance import Balance
from agents.baselines import ADOnly, SDOnly
from agents.optimal import Exhaustive, Optimal, split_upper_bound
from envs import AD, REJECT, SD, EnvConfig, Plan, check_plan, check_plans, evaluate_plan
from envs.cost_model import expected_tokens_per_iteration, sd_iterations, sd_iterations1
from envs.feasibility import shares_respected
from envs.outcome import simulate_sd_iterations
from envs.plan_builder import PlanBuilder, ScalarPlan

R = 1e-12  # relative tolerance: only floating-point rounding, never a modelling difference
COST = golden_cost()
CFG = EnvConfig(num_users=3, max_gamma=4)


def approx(x):
    return pytest.approx(x, rel=R, abs=1e-15)


# ------------------------------------------------------------------ the hand-made profile itself
def test_profile_reproduces_the_linear_pass_times():
    """The table profile must reproduce tau exactly, also outside its 2x2x2 grid (extrapolation)."""
    for b, q, c in [(1, 1, 1), (2, 10, 10), (3, 1, 17), (1, 3, 17), (2, 3, 14)]:
        assert COST.tau_l.tau1(b, q, c) == approx(tau_l(b, q, c))
        assert COST.tau_s.tau1(b, q, c) == approx(tau_s(b, q, c))
    assert tau_l(2, 10, 10) == approx(0.032)  # 0.010 + 0.001*2*10 + 0.0001*2*10


# ------------------------------------------------------------------ SD iterations
@pytest.mark.parametrize(
    ("alpha", "gamma", "e", "out", "j"),
    [
        (0.9, 2, 2.71, 10, 4),  # E = (1 - 0.729) / 0.1 = 2.71; 10 / 2.71 = 3.69 -> 4
        (0.5, 2, 1.75, 4, 3),  # E = (1 - 0.125) / 0.5 = 1.75; 4 / 1.75 = 2.29 -> 3
        (0.5, 2, 1.75, 2, 2),  # 2 / 1.75 = 1.14 -> 2
        (0.5, 1, 1.5, 3, 2),  # E = (1 - 0.25) / 0.5 = 1.5; 3 / 1.5 = 2 exactly -> 2, not 3
        (0.8, 4, 3.3616, 10, 3),  # E = (1 - 0.32768) / 0.2 = 3.3616; 10 / 3.3616 = 2.97 -> 3
        (0.0, 3, 1.0, 7, 7),  # nothing accepted: one (target) token per iteration
        (1.0, 3, 4.0, 8, 2),  # all accepted: gamma + 1 tokens per iteration; 8 / 4 = 2 exactly
        (1.0, 3, 4.0, 9, 3),
    ],
)
def test_sd_iterations_golden(alpha, gamma, e, out, j):
    assert float(expected_tokens_per_iteration(alpha, gamma)) == pytest.approx(e, rel=1e-12)
    assert int(sd_iterations(out, alpha, gamma)) == j
    assert sd_iterations1(out, alpha, gamma) == j


@pytest.mark.parametrize("alpha", [1.0 - 1e-9, np.nextafter(1.0 - 1e-9, 1.0), np.nextafter(1.0 - 1e-9, 0.0), 1.0])
def test_scalar_and_array_iterations_agree_at_the_alpha_one_switch(alpha):
    """Both paths switch to E = gamma + 1 at the same alpha (strictly above 1 - 1e-9)."""
    for out in (4, 8, 9):
        assert sd_iterations1(out, float(alpha), 3) == int(sd_iterations(out, alpha, 3)), (alpha, out)
    assert float(expected_tokens_per_iteration(alpha, 3)) == pytest.approx(4.0, rel=1e-7)


def test_simulated_iterations_at_the_extremes():
    rng = np.random.default_rng(0)
    # alpha 0: every draft rejected, one token per iteration; alpha 1: gamma + 1 per iteration
    assert simulate_sd_iterations(rng, [10, 3], [0.0, 0.0], 2).tolist() == [10, 3]
    assert simulate_sd_iterations(rng, [10, 9, 1], [1.0, 1.0, 1.0], 2).tolist() == [4, 3, 1]  # ceil(10/3), 9/3, 1
    assert simulate_sd_iterations(rng, [], [], 2).tolist() == []
    # users with different acceptance are drawn independently (per-user cumulative sums)
    assert simulate_sd_iterations(rng, [6, 6], [0.0, 1.0], 2).tolist() == [6, 2]


# ------------------------------------------------------------------ batch times
def test_ad_batch_time_golden():
    # C_A(b=2, S=10, N=4) = tau_L(2,10,10) + sum_{i=1..3} tau_L(2,1,10+i)
    #   = 0.032 + (0.0142 + 0.0144 + 0.0146) = 0.0752
    assert float(COST.ad_time(2, 10, 4)) == approx(0.0752)
    assert COST.ad_time1(2, 10, 4) == approx(0.0752)
    # N = 1: the prefill alone yields the only token: tau_L(1,10,10) = 0.010 + 0.010 + 0.001 = 0.021
    assert float(COST.ad_time(1, 10, 1)) == approx(0.021)
    # C_A(1, 10, 10) = 0.021 + 9 * 0.011 + 0.0001 * (11 + ... + 19 = 135) = 0.1335
    assert float(COST.ad_time(1, 10, 10)) == approx(0.1335)
    # C_A(2, 10, 10) = 0.032 + 9 * 0.012 + 0.0002 * 135 = 0.167
    assert float(COST.ad_time(2, 10, 10)) == approx(0.167)
    assert float(COST.ad_time(0, 10, 10)) == 0.0 and COST.ad_time1(0, 10, 10) == 0.0
    assert COST.ad_time1(1, 10, 1) == approx(0.021)
    # a one-token prompt: C_A(1, S=1, N=2) = tau_L(1,1,1) + tau_L(1,1,2) = 0.0111 + 0.0112 = 0.0223
    assert float(COST.ad_time(1, 1, 2)) == approx(0.0223) and COST.ad_time1(1, 1, 2) == approx(0.0223)


def test_sd_batch_time_golden():
    # C_S(b=2, S=10, N=4, J=3, gamma=2): prefill tau_L(2,10,10) + tau_S(2,10,10) = 0.032 + 0.0064;
    # context c = S + N/2 = 12; iteration = 2 * tau_S(2,1,12) + tau_L(2,3,14) = 2*0.00288 + 0.0188
    # = 0.02456; C_S = 0.0384 + 3 * 0.02456 = 0.11208
    assert float(COST.sd_time(2, 10, 4, 3, 2)) == approx(0.11208)
    assert COST.sd_time1(2, 10, 4, 3, 2) == approx(0.11208)
    # C_S(1, 10, 10, J=4, gamma=2): 0.021 + 0.0042 + 4 * (2 * tau_S(1,1,15) + tau_L(1,3,17))
    #   = 0.0252 + 4 * (2 * 0.0025 + 0.0147) = 0.0252 + 0.0788 = 0.104
    assert float(COST.sd_time(1, 10, 10, 4, 2)) == approx(0.104)
    # C_S(2, 10, 10, 4, 2) = 0.0384 + 4 * (2 * 0.003 + 0.0194) = 0.0384 + 0.1016 = 0.14
    assert float(COST.sd_time(2, 10, 10, 4, 2)) == approx(0.14)
    assert float(COST.sd_time(0, 10, 10, 4, 2)) == 0.0 and COST.sd_time1(0, 10, 10, 4, 2) == 0.0
    # a one-token prompt: C_S(1, S=1, N=2, J=1, gamma=1) = tau_L(1,1,1) + tau_S(1,1,1)
    #   + (tau_S(1,1,c=2) + tau_L(1,2,3)) = 0.0111 + 0.00222 + 0.00224 + 0.0123 = 0.02786
    assert float(COST.sd_time(1, 1, 2, 1, 1)) == approx(0.02786) and COST.sd_time1(1, 1, 2, 1, 1) == approx(0.02786)


def test_batch_times_with_engine_overhead_golden():
    engine = {"b": [1, 2], "ad_step_s": [0.001, 0.002], "sd_iteration_s": [0.003, 0.004], "sd_draft_step_s": [0.0005, 0.001]}
    cost = golden_cost(engine=engine)
    # AD adds (N - 1) * o_A(b): 0.1335 + 9 * 0.001 = 0.1425; 0.167 + 9 * 0.002 = 0.185
    assert float(cost.ad_time(1, 10, 10)) == approx(0.1425) and cost.ad_time1(1, 10, 10) == approx(0.1425)
    assert float(cost.ad_time(2, 10, 10)) == approx(0.185)
    # one output token: no decode step, no per-step overhead
    assert float(cost.ad_time(1, 10, 1)) == approx(0.021) and cost.ad_time1(1, 10, 1) == approx(0.021)
    # SD adds J * (o_it(b) + gamma * o_draft(b)): 0.104 + 4 * (0.003 + 2 * 0.0005) = 0.120
    assert float(cost.sd_time(1, 10, 10, 4, 2)) == approx(0.120) and cost.sd_time1(1, 10, 10, 4, 2) == approx(0.120)
    # 0.14 + 4 * (0.004 + 2 * 0.001) = 0.164
    assert float(cost.sd_time(2, 10, 10, 4, 2)) == approx(0.164)


# ------------------------------------------------------------------ memory
TWO = make_round([10, 6], [4, 2], [1.0, 1.0], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0])


def test_memory_budget_with_and_without_draft_model():
    # Q - reserve - W_L = 2_300_000 - 100_000 - 2_000_000 = 200_000; with SD also - W_S (20_000)
    assert float(COST.memory_budget(False)) == 200_000.0 and COST.memory_budget1(False) == 200_000.0
    assert float(COST.memory_budget(True)) == 180_000.0 and COST.memory_budget1(True) == 180_000.0
    rep_ad = check_plans(COST, TWO, [AD, AD], 2)
    rep_sd = check_plans(COST, TWO, [AD, SD], 2)
    assert float(rep_ad.memory_budget_bytes) == 200_000.0  # no SD user: the SLM is not loaded
    assert float(rep_sd.memory_budget_bytes) == 180_000.0


@pytest.mark.parametrize(
    ("kv_memory", "ad_bytes", "sd_bytes"),
    [
        # per user, padded input S = 10: AD (10+4) + (10+2) = 26 tokens * 2000;
        # SD (10+4+2) + (10+2+2) = 30 tokens * 3000 (each user also holds gamma = 2 draft tokens)
        ("per_user", 26 * KV_L, 30 * KV_SD),
        # padded to the batch's longest output too: AD 2 * (10+4) = 28; SD 2 * (10+4+2) = 32
        ("padded", 28 * KV_L, 32 * KV_SD),
    ],
)
def test_memory_per_mode_golden(kv_memory, ad_bytes, sd_bytes):
    cost = golden_cost(kv_memory=kv_memory)
    rep_ad = check_plans(cost, TWO, [AD, AD], 2)
    rep_sd = check_plans(cost, TWO, [SD, SD], 2)
    assert float(rep_ad.ad_memory_bytes) == ad_bytes and float(rep_ad.sd_memory_bytes) == 0.0
    assert float(rep_sd.sd_memory_bytes) == sd_bytes and float(rep_sd.ad_memory_bytes) == 0.0
    assert cost.ad_memory1(2, 10, 4, 6) == ad_bytes and float(cost.ad_memory(2, 10, 4, 6)) == ad_bytes
    assert cost.sd_memory1(2, 10, 4, 6, 2) == sd_bytes and float(cost.sd_memory(2, 10, 4, 6, 2)) == sd_bytes


# ------------------------------------------------------------------ the exact check on the three-user round
def test_check_golden_three_users():
    rnd = three_users()
    rep = check_plans(COST, rnd, [AD, AD, SD], 2)
    assert bool(rep.feasible)
    # beta_A = min slack 1.02 - max uplink 0.02 = 1.0; share C_A(2)/1.0 = 0.167
    # beta_S = 0.135 - 0.005 = 0.13; share C_S(1)/0.13 = 0.104/0.13 = 0.8; 0.167 + 0.8 <= 1
    assert float(rep.ad_time_s) == approx(0.167) and float(rep.sd_time_s) == approx(0.104)
    assert float(rep.ad_share_min) == approx(0.167) and float(rep.sd_share_min) == approx(0.8)
    # memory: AD 2 * (10+10) * 2000 = 80_000; SD (10+10+2) * 3000 = 66_000; budget 180_000
    assert float(rep.ad_memory_bytes) == 80_000.0 and float(rep.sd_memory_bytes) == 66_000.0
    # proportional shares: z = 0.167 / 0.967, lam = 80_000 / 146_000
    assert float(rep.z) == approx(0.167 / 0.967) and float(rep.lam) == approx(80_000 / 146_000)
    # one user alone: AD gets the whole GPU, z = lam = 1; SD alone: z = lam = 0
    solo_ad = check_plans(COST, rnd, [AD, REJECT, REJECT], 2)
    solo_sd = check_plans(COST, rnd, [REJECT, REJECT, SD], 2)
    assert (float(solo_ad.z), float(solo_ad.lam)) == (1.0, 1.0) and (float(solo_sd.z), float(solo_sd.lam)) == (0.0, 0.0)
    # user 2 in AD: C_A(1) = 0.1335 > beta 0.13 even on the whole GPU
    assert float(check_plans(COST, rnd, [REJECT, REJECT, AD], 2).ad_share_min) == approx(0.1335 / 0.13)
    assert not bool(check_plans(COST, rnd, [REJECT, REJECT, AD], 2).feasible)


def test_builders_shares_of_empty_and_single_mode_plans():
    """Nothing admitted, or one mode only: that mode gets everything (z = lam = 1 for AD-or-nothing)."""
    rnd = three_users()
    user0 = (10, 10, 0.9, 0.01, 1.02)
    for first, want in ((0, (1.0, 1.0)), (1, (1.0, 1.0)), (3, (0.0, 0.0))):
        scalar, vec = ScalarPlan(COST, 4), PlanBuilder(COST, 1, 4)
        scalar.prepare(*user0)
        vec.prepare(*(np.array([v]) for v in user0))
        scalar.apply(first)
        vec.apply(np.array([first]))
        z, lam = vec.shares()
        assert scalar.shares() == want and (float(z[0]), float(lam[0])) == want, first
    assert rnd.num_users == 3


def test_check_plan_takes_a_plan_or_modes():
    rnd = three_users()
    by_plan = check_plan(COST, rnd, Plan(np.array([AD, AD, SD], dtype=np.int8), gamma=2, z=0.2, lam=0.5))
    by_modes = check_plan(COST, rnd, [AD, AD, SD], 2)
    assert bool(by_plan.feasible) and bool(by_modes.feasible)
    assert float(by_plan.sd_time_s) == float(by_modes.sd_time_s) == approx(0.104)
    # modes without a depth are checked at gamma = 4: C_S(1, 10, 10, J=3, 4) = 0.1059 (see below)
    assert float(check_plan(COST, rnd, [REJECT, REJECT, SD]).sd_time_s) == approx(0.1059)
    assert float(check_plan(COST, rnd, [REJECT, REJECT, SD], 3).sd_time_s) == approx(0.0951)


def test_incremental_builders_reach_the_golden_state():
    rnd = three_users()
    scalar, vec = ScalarPlan(COST, 4), PlanBuilder(COST, 1, 4)
    users = [(int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k])) for k in range(3)]
    expected_masks = [
        # user 0 first: AD share 0.1335/1.01 (beta = 1.02 - 0.01); SD@g fine too -> all allowed
        [True] * 6,
        # user 1: AD (b=2) fine; SD for user 1 beside AD user 0 also fits -> all allowed
        [True] * 6,
        # user 2 after two AD users: AD never (C_A(3)/0.13 > 1); SD@2 fits (0.167 + 0.8);
        # SD@1 (J = ceil(10 / 1.9) = 6: C_S = 0.0252 + 6 * (0.0025 + tau_L(1,2,16) = 0.0136) = 0.1218,
        # 0.1218 / 0.13 = 0.937, + 0.167 > 1) no; SD@3 (E = 3.439, J = 3: C_S = 0.0252 + 3 *
        # (3 * 0.0025 + tau_L(1,4,18) = 0.0158) = 0.0951, 0.7315 + 0.167 <= 1) yes; SD@4 (E = 4.0951,
        # J = 3: C_S = 0.0252 + 3 * (4 * 0.0025 + tau_L(1,5,19) = 0.0169) = 0.1059, 0.8146 + 0.167 <= 1) yes
        [True, False, False, True, True, True],
    ]
    for k, (user, want, action) in enumerate(zip(users, expected_masks, [1, 1, 3], strict=True)):
        got_s = scalar.prepare(*user)
        got_v = vec.prepare(*(np.array([v]) for v in user))[0]
        assert got_s == want, k
        assert got_v.tolist() == want, k
        assert scalar.apply(action) and bool(vec.apply(np.array([action]))[0])
    # proportional shares: z = 0.167 / 0.967, lam = 80_000 / 146_000 (both builders)
    assert scalar.shares() == (approx(0.167 / 0.967), approx(80_000 / 146_000))
    z, lam = vec.shares()
    assert (float(z[0]), float(lam[0])) == (approx(0.167 / 0.967), approx(80_000 / 146_000))
    assert scalar.share[0] == approx(0.167) and scalar.share[1] == approx(0.8)
    assert scalar.mem == [80_000.0, 66_000.0] and vec.mem[:, 0].tolist() == [80_000.0, 66_000.0]
    assert scalar.gamma == 2 and scalar.j_max == 4 and int(vec.j_max[0]) == 4


# ------------------------------------------------------------------ the exact optimum of the three-user round
def test_small_round_optimum_golden():
    """Optimum 3 = {0, 1} AD + {2} SD, unique; AD-only and SD-only serve 2 each.

    * User 2 cannot be AD: any AD batch with it has beta_A <= 0.13 < C_A(1) = 0.1335.
    * User 2 cannot share an SD batch: C_S(2) = 0.14 > 0.13.
    * So all three need {2} SD alone and {0, 1} AD: 0.167 + 0.8 <= 1, 146_000 <= 180_000 bytes.
    * AD-only: {0, 1} (share 0.167) -> 2. SD-only: {0, 1} (C_S(2)/1.0 = 0.14) -> 2; with 2 no.
    """
    rnd = three_users()
    want = [AD, AD, SD]
    for sched in (Exhaustive(COST, CFG.max_gamma, draft_depth=2, warm_start=False), Optimal(COST, CFG.max_gamma, draft_depth=2), Balance(COST, CFG.max_gamma, draft_depth=2)):
        plan = sched.plan(rnd)
        assert plan.modes.tolist() == want, sched.name
        assert plan.gamma == 2
    assert Optimal(COST, CFG.max_gamma, draft_depth=2).plan(rnd).extra["upper_bound"] == 3
    assert split_upper_bound(COST, rnd, 2) == 3  # a valid bound cannot be below the optimum
    assert ADOnly(COST, CFG.max_gamma, draft_depth=2).plan(rnd).modes.tolist() == [AD, AD, REJECT]
    sd_only = SDOnly(COST, CFG.max_gamma, draft_depth=2).plan(rnd)
    assert sd_only.modes.tolist() == [SD, SD, REJECT]
    # gamma = 1: user 2 needs C_S = 0.1218 (see above) -> 0.937 + 0.167 > 1: only 2 served
    assert Exhaustive(COST, CFG.max_gamma, draft_depth=1, warm_start=False).plan(rnd).admitted == 2


# ------------------------------------------------------------------ the outcome
PLAN = Plan(np.array([AD, AD, SD], dtype=np.int8), gamma=2, z=0.2, lam=0.5)


def test_outcome_fixed_shares_golden():
    out = evaluate_plan(COST, three_users(), PLAN)
    # AD: 0.167 / 0.2 = 0.835 s of compute; latency U_A 0.02 + 0.835 + t_d 0.01 = 0.865
    # SD: 0.104 / 0.8 = 0.13; latency 0.005 + 0.13 + 0.01 = 0.145 = its deadline: still served
    assert out.ad_batch_s == approx(0.835) and out.sd_batch_s == approx(0.13)
    assert out.latency_s.tolist() == [approx(0.865), approx(0.865), approx(0.145)]
    assert out.served.tolist() == [True, True, True]
    # z = 0.1: AD needs 0.167 / 0.1 = 1.67 s -> latency 1.7 > 1.03, late; SD 0.104 / 0.9 -> served
    late = evaluate_plan(COST, three_users(), Plan(PLAN.modes, gamma=2, z=0.1, lam=0.5))
    assert late.latency_s[0] == approx(1.7) and late.latency_s[2] == approx(0.015 + 0.104 / 0.9)
    assert late.served.tolist() == [False, False, True] and late.served_count == 1


def test_outcome_work_conserving_golden():
    out = evaluate_plan(COST, three_users(), PLAN, sharing="work_conserving")
    # SD ends first at T1 = 0.13; AD did 0.2 * 0.13 = 0.026 of its 0.167 by then, and then has
    # the device alone: ends at 0.13 + (0.167 - 0.026) = 0.271; latency 0.02 + 0.271 + 0.01 = 0.301
    assert out.sd_batch_s == approx(0.13) and out.ad_batch_s == approx(0.271)
    assert out.latency_s.tolist() == [approx(0.301), approx(0.301), approx(0.145)]


def test_outcome_own_completion_golden():
    ad = Plan(np.array([AD, AD], dtype=np.int8), gamma=2, z=1.0, lam=1.0)
    out = evaluate_plan(COST, TWO, ad, completion="own")
    # user 1 (O = 2): prefill + one decode at b = 2, padded prompt 10: 0.032 + tau_L(2,1,11) = 0.0462
    # user 0 (O = 4): the whole batch, 0.0752; no link times in TWO
    assert out.latency_s.tolist() == [approx(0.0752), approx(0.0462)]
    sd = Plan(np.array([SD, SD], dtype=np.int8), gamma=2, z=0.0, lam=0.0)
    out = evaluate_plan(COST, TWO, sd, completion="own")
    # J = (3, 2) at alpha 0.5; iteration at the batch context 12 costs 0.02456 (see above):
    # user 1 ends at 0.0384 + 2 * 0.02456 = 0.08752, user 0 at 0.11208
    assert out.latency_s.tolist() == [approx(0.11208), approx(0.08752)]
    assert out.sd_batch_s == approx(0.11208)


def test_outcome_uses_realised_lengths_and_downlinks():
    rnd = make_round([10, 6], [4, 2], [0.1, 0.1], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0])
    rnd.realized_output_tokens = np.array([4, 8])
    rnd.realized_downlink_s = np.array([0.0, 0.001])
    out = evaluate_plan(COST, rnd, Plan(np.array([AD, AD], dtype=np.int8), gamma=2, z=1.0, lam=1.0))
    # realised N = 8: C_A(2, 10, 8) = 0.032 + 7 * 0.012 + 0.0002 * (11 + ... + 17 = 98) = 0.1356 > 0.1
    assert out.ad_batch_s == approx(0.1356)
    assert out.latency_s.tolist() == [approx(0.1356), approx(0.1366)]
    assert not out.served.any()
    assert np.isinf(evaluate_plan(COST, rnd, Plan.reject_all(2)).latency_s).all()


def test_outcome_rejects_bad_switches():
    with pytest.raises(ValueError, match="sharing"):
        evaluate_plan(COST, three_users(), PLAN, sharing="greedy")
    with pytest.raises(ValueError, match="rng"):
        evaluate_plan(COST, three_users(), PLAN, simulate_acceptance=True)
    assert math.isinf(evaluate_plan(COST, three_users(), Plan(PLAN.modes, gamma=2, z=1.0, lam=1.0)).latency_s[2])


@pytest.mark.parametrize(
    ("z", "lam", "ok"),
    [
        (0.2, 0.5, True),  # AD needs z >= 0.167, SD 1 - z >= 0.8; KV 80_000 <= 90_000, 66_000 <= 90_000
        (0.15, 0.5, False),  # AD short of compute (SD has plenty)
        (0.21, 0.5, False),  # SD short of compute: 0.79 < 0.8 (AD has plenty)
        (0.2, 0.4, False),  # AD short of memory: 80_000 > 0.4 * 180_000 (SD has plenty)
        (0.2, 0.7, False),  # SD short of memory: 66_000 > 0.3 * 180_000 (AD has plenty)
    ],
)
def test_shares_respected_golden(z, lam, ok):
    plan = Plan(np.array([AD, AD, SD], dtype=np.int8), gamma=2, z=z, lam=lam)
    assert shares_respected(COST, three_users(), plan) is ok


def test_shares_respected_at_the_exact_minimum_shares():
    """A share equal to what a batch needs is enough; half a byte of KV less is not."""
    rnd = three_users()
    modes = np.array([AD, AD, SD], dtype=np.int8)
    # z exactly C_A / beta_A = 0.167 (SD then has 0.833 >= 0.8); lam exactly 80_000 / 180_000
    assert shares_respected(COST, rnd, Plan(modes, gamma=2, z=0.167, lam=80_000 / 180_000))
    # 1 - z exactly the SD need 0.8; 1 - lam exactly 66_000 / 180_000
    assert shares_respected(COST, rnd, Plan(modes, gamma=2, z=1 - 0.8, lam=1 - 66_000 / 180_000))
    assert not shares_respected(COST, rnd, Plan(modes, gamma=2, z=0.2, lam=(80_000 - 0.5) / 180_000))
    assert not shares_respected(COST, rnd, Plan(modes, gamma=2, z=0.2, lam=1 - (66_000 - 0.5) / 180_000))
    # one AD user short of compute is caught too (AD alone: beta 1.01, share 0.1335 / 1.01)
    assert not shares_respected(COST, rnd, Plan(np.array([AD, REJECT, SD], dtype=np.int8), gamma=2, z=0.1, lam=0.5))


def test_shares_respected_with_no_memory_to_spare():
    # Q = reserve + W_L: the no-SD budget is exactly 0 bytes; an empty plan still fits
    cost = golden_cost(2_100_000)
    assert float(cost.memory_budget(False)) == 0.0
    assert shares_respected(cost, three_users(), Plan.reject_all(3, gamma=2))
    assert not shares_respected(cost, three_users(), Plan(np.array([AD, REJECT, REJECT], dtype=np.int8), gamma=2, z=1.0, lam=1.0))
