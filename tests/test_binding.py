"""Configurations where exactly one constraint binds: it must be the one that rejects.

Each case sits on a constraint's edge (memory per user, padded memory, the draft's weights,
compute, a deadline, an uplink): at the edge the plan is feasible, one step past it (one byte, a
few milliseconds) it is not, while every other constraint keeps slack -- and every path that
decides feasibility (the full check, the incremental builders, the exact optimum and the per-mode
solves) agrees. Numbers come from the hand-made system of ``golden_round.py``:

* three-user round, plan AD {0, 1} + SD {2} at gamma = 2: shares C_A(2)/beta_A = 0.167/1.0 and
  C_S(1)/beta_S = 0.104/0.13 = 0.8; KV 80_000 (AD) + 66_000 (SD) bytes;
* budget = Q - 100_000 (reserve) - 2_000_000 (W_L) [- 20_000 (W_S) if SD is used].
"""

import numpy as np
import pytest
from golden_round import golden_cost, make_round, three_users

from agents.baselines import ADOnly, SDOnly
from agents.optimal import Exhaustive
from envs import AD, REJECT, SD, EnvConfig, check_plans
from envs.feasibility import EPS
from envs.plan_builder import PlanBuilder, ScalarPlan

CFG = EnvConfig(num_users=3, max_gamma=4)
BASE = 2_100_000.0  # reserve + W_L: Q = BASE + budget without SD


def decide_everywhere(cost, rnd, modes, gamma):
    """Feasibility of ``modes`` by the full check and by both incremental builders (users in order)."""
    full = bool(check_plans(cost, rnd, modes, gamma).feasible)
    scalar, vec = ScalarPlan(cost, 4), PlanBuilder(cost, 1, 4)
    ok_s = ok_v = True
    for k, m in enumerate(modes):
        user = (int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k]))
        scalar.prepare(*user)
        vec.prepare(*(np.array([v]) for v in user))
        action = 0 if m == REJECT else (1 if m == AD else 1 + gamma)
        ok_s &= scalar.apply(action)
        ok_v &= bool(vec.apply(np.array([action]))[0])
    assert full == ok_s == ok_v, (full, ok_s, ok_v)
    return full


def _why(cost, rnd, modes, gamma):
    rep = check_plans(cost, rnd, modes, gamma)
    compute_ok = float(rep.ad_share_min) + float(rep.sd_share_min) <= 1 + EPS
    memory_ok = float(rep.ad_memory_bytes) + float(rep.sd_memory_bytes) <= float(rep.memory_budget_bytes) * (1 + EPS)
    return compute_ok, memory_ok


def _opt(cost, rnd, gamma=2):
    return Exhaustive(cost, CFG.max_gamma, draft_depth=gamma, warm_start=False).plan(rnd).admitted


MIXED = [AD, AD, SD]


# ------------------------------------------------------------------ memory, per user
SD_FIRST = [2, 0, 1]  # the same users with the SD user presented first: AD joins a plan holding SD


def test_memory_binds_at_the_exact_byte():
    rnd = three_users()
    edge = golden_cost(BASE + 20_000 + 146_000)  # SD budget = 146_000 = exactly the plan's KV
    past = golden_cost(BASE + 20_000 + 146_000 - 1)
    assert decide_everywhere(edge, rnd, MIXED, 2)
    assert not decide_everywhere(past, rnd, MIXED, 2)
    # in the other order the AD admissions are the ones checked against the SD-loaded budget
    assert decide_everywhere(edge, rnd.subset(SD_FIRST), [SD, AD, AD], 2)
    assert not decide_everywhere(past, rnd.subset(SD_FIRST), [SD, AD, AD], 2)
    assert _why(past, rnd, MIXED, 2) == (True, False)  # compute fits: memory is what rejects
    assert _opt(edge, rnd) == 3 and _opt(past, rnd) == 2


def test_draft_weights_count_only_when_sd_is_used():
    rnd = three_users()
    # without SD the budget would be 165_999 >= 146_000: only the SLM's 20_000 bytes make it fail
    cost = golden_cost(BASE + 165_999)
    assert float(cost.memory_budget(False)) == 165_999.0 and float(cost.memory_budget(True)) == 145_999.0
    assert not decide_everywhere(cost, rnd, MIXED, 2)
    # AD alone never loads the SLM: {0, 1} AD needs 80_000 = the whole no-SD budget, and fits
    tight = golden_cost(BASE + 80_000)
    assert decide_everywhere(tight, rnd, [AD, AD, REJECT], 2)
    assert not decide_everywhere(golden_cost(BASE + 79_999), rnd, [AD, AD, REJECT], 2)
    assert ADOnly(tight, CFG.max_gamma, draft_depth=2).plan(rnd).modes.tolist() == [AD, AD, REJECT]
    assert ADOnly(golden_cost(BASE + 79_999), CFG.max_gamma, draft_depth=2).plan(rnd).admitted == 1
    # ...and with SD budget 60_000 nothing mixed fits, so the optimum is the AD pair
    assert _opt(tight, rnd) == 2


def test_sd_only_memory_edge():
    rnd = three_users()
    # SD {0, 1}: 2 * (10 + 10 + 2) * 3000 = 132_000 bytes plus W_S
    edge = golden_cost(BASE + 20_000 + 132_000)
    assert SDOnly(edge, CFG.max_gamma, draft_depth=2).plan(rnd).modes.tolist() == [SD, SD, REJECT]
    assert SDOnly(golden_cost(BASE + 20_000 + 131_999), CFG.max_gamma, draft_depth=2).plan(rnd).admitted == 1


# ------------------------------------------------------------------ memory, padded and the +gamma drafts
# users I = (10, 6), O = (4, 2), loose deadlines: only memory can bind
LOOSE = make_round([10, 6], [4, 2], [1.0, 1.0], [0.5, 0.5], [0.0, 0.0], [0.0, 0.0])


@pytest.mark.parametrize(
    ("kv_memory", "modes", "need"),
    [
        ("per_user", [AD, AD], 52_000),  # (10+4 + 10+2) * 2000
        ("padded", [AD, AD], 56_000),  # 2 * (10+4) * 2000
        ("per_user", [SD, SD], 90_000),  # (10+4+2 + 10+2+2) * 3000: without +gamma it would be 78_000
        ("padded", [SD, SD], 96_000),  # 2 * (10+4+2) * 3000: without +gamma it would be 84_000
    ],
)
def test_kv_memory_binds_at_its_own_formula(kv_memory, modes, need):
    w_s = 20_000 if SD in modes else 0
    edge = golden_cost(BASE + w_s + need, kv_memory=kv_memory)
    past = golden_cost(BASE + w_s + need - 1, kv_memory=kv_memory)
    assert decide_everywhere(edge, LOOSE, modes, 2)
    assert not decide_everywhere(past, LOOSE, modes, 2)
    assert _why(past, LOOSE, modes, 2) == (True, False)


def test_padded_binds_where_per_user_does_not():
    # AD budget 54_000: per-user KV (52_000) fits, padded (56_000) does not
    assert decide_everywhere(golden_cost(BASE + 54_000), LOOSE, [AD, AD], 2)
    assert not decide_everywhere(golden_cost(BASE + 54_000, kv_memory="padded"), LOOSE, [AD, AD], 2)


# ------------------------------------------------------------------ compute (the shares' sum)
def _with_ad_deadline(deadline):
    rnd = three_users()
    rnd.deadline_s = np.array([deadline, deadline, 0.145])
    return rnd


def test_compute_binds_when_the_shares_sum_past_one():
    cost = golden_cost()
    # beta_A = T - t_d - U_A = T - 0.03; the sum 0.167/beta_A + 0.8 = 1 at beta_A = 0.835, T = 0.865
    edge, past = _with_ad_deadline(0.865), _with_ad_deadline(0.86)
    assert decide_everywhere(cost, edge, MIXED, 2)
    assert not decide_everywhere(cost, past, MIXED, 2)
    assert decide_everywhere(cost, edge.subset(SD_FIRST), [SD, AD, AD], 2)
    assert not decide_everywhere(cost, past.subset(SD_FIRST), [SD, AD, AD], 2)
    assert _why(cost, past, MIXED, 2) == (False, True)
    # each batch alone still fits: it is the split of one GPU that binds
    assert decide_everywhere(cost, past, [AD, AD, REJECT], 2) and decide_everywhere(cost, past, [REJECT, REJECT, SD], 2)
    assert _opt(cost, edge) == 3 and _opt(cost, past) == 2


# ------------------------------------------------------------------ a deadline (alone, whole GPU)
def test_deadline_binds_even_on_the_whole_gpu():
    cost = golden_cost()
    rnd = three_users()
    # user 2 in AD: C_A(1) = 0.1335 > beta = 0.13; 4 ms more deadline gives beta = 0.134
    assert not decide_everywhere(cost, rnd, [REJECT, REJECT, AD], 2)
    assert float(check_plans(cost, rnd, [REJECT, REJECT, AD], 2).ad_share_min) > 1
    later = three_users()
    later.deadline_s = np.array([1.03, 1.03, 0.149])
    assert decide_everywhere(cost, later, [REJECT, REJECT, AD], 2)
    # user 2 in an SD batch of two: beta = 0.139 - max(0.01, 0.005) = 0.129 < C_S(2) = 0.14
    assert not decide_everywhere(cost, later, [SD, REJECT, SD], 2)


# ------------------------------------------------------------------ uplink (the batch's slowest)
def _with_uplink_1(uplink):
    rnd = three_users()
    rnd.uplink_s = np.array([0.01, uplink, 0.005])
    return rnd


def test_slowest_uplink_binds_the_whole_batch():
    cost = golden_cost()
    # beta_A = 1.02 - max(0.01, u1): the sum is 1 at beta_A = 0.835, u1 = 0.185
    assert decide_everywhere(cost, _with_uplink_1(0.185), MIXED, 2)
    slow = _with_uplink_1(0.19)
    assert not decide_everywhere(cost, slow, MIXED, 2)
    assert _why(cost, slow, MIXED, 2) == (False, True)
    # without the slow user the batch is fast again
    assert decide_everywhere(cost, slow, [AD, REJECT, SD], 2)


def test_uplink_past_the_slack_leaves_no_budget():
    cost = golden_cost()
    rnd = _with_uplink_1(1.02)  # beta_A = 1.02 - 1.02 = 0: no time at all, whatever the share
    rep = check_plans(cost, rnd, [REJECT, AD, REJECT], 2)
    assert np.isinf(float(rep.ad_share_min)) and not bool(rep.feasible)
    assert not decide_everywhere(cost, rnd, [REJECT, AD, REJECT], 2)
    # uplink 0.88: beta = 0.14 >= C_A(1) = 0.1335 -> feasible on the whole GPU
    assert decide_everywhere(cost, _with_uplink_1(0.88), [REJECT, AD, REJECT], 2)
