"""Pins ``envs.plan_builder`` (the v0 builders ``ScalarPlan`` and ``PlanBuilder``) where the other builder
tests do not reach: after every admission the scalar builder's masks equal ``check_plans`` of the plan with
the candidate, its shares, memories, J and depth equal the exact check's bit for bit, and the vector
builder's masks and candidate shares / memories equal them too -- for the padded KV model, a per-SD-user
workspace, live-calibrated models (``sd_time1`` overridden: priced per depth through it), a model that
overrides ``sd_parts1`` alone, one that overrides ``sd_memory1`` (the inlined memory formula is the base
class's only) and a non-overlapped verify; users certain to accept (alpha = 1: J = O / (g + 1) exactly) and
at the alpha = 1 - 1e-9 switch at deep drafts; users whose uplink uses up their slack. Plans exactly at the
share limit and at the memory limit times (1 + EPS) are feasible in both. The memos follow a calibration
that moves between rounds and are emptied past their bound; an all-depths price of the wrong length is an
error. The API contract: the candidate accessors before ``prepare`` name the call; ``PlanBuilder`` keeps one
row per mode.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from builder_cases import TwiceSdParts, add_special_users
from golden_round import golden_cost, make_round

from envs.config import EnvConfig
from envs.cost_model import CostModel, sd_iterations, sd_iterations1
from envs.feasibility import EPS, BatchStats, check_plans
from envs.model_choices import ModelChoices
from envs.plan import AD, REJECT, SD
from envs.plan_builder import PlanBuilder, ScalarPlan
from envs.profile import load_profile
from envs.workload import sample_round
from runtime.calibration import CalibratedCostModel, StepCalibration

PROFILE = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
G = 4
K = 10


def tight(p, n_users: float):
    """The profile with room for both models' weights and about ``n_users`` SD users' KV."""
    kv_user = 300 * CostModel(p).kv_sd
    return p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + n_users * kv_user)


class TwiceSdMemory(CostModel):
    """SD memory doubled through its own ``sd_memory1`` (and the exact check's ``sd_memory``)."""

    def sd_memory1(self, b, s_max, n_max, sum_out, gamma):
        return 2.0 * super().sd_memory1(b, s_max, n_max, sum_out, gamma)

    def sd_memory(self, b, s_max, n_max, sum_out, gamma):
        return 2.0 * super().sd_memory(b, s_max, n_max, sum_out, gamma)


def calibrated(p, kv_memory="per_user"):
    cal = StepCalibration()
    cal.factor["ad"], cal.factor["sd"] = 1.5, 2.25
    return CalibratedCostModel(CostModel(p, kv_memory), cal)


COSTS = {
    "per_user": lambda: CostModel(tight(PROFILE, 4.0)),
    "padded": lambda: CostModel(tight(PROFILE, 4.0), "padded"),
    "workspace": lambda: CostModel(tight(PROFILE, 5.0), "per_user", ModelChoices(sd_user_workspace_bytes=150 * CostModel(PROFILE).kv_l)),
    "calibrated": lambda: calibrated(tight(PROFILE, 4.0)),
    "calibrated_padded": lambda: calibrated(tight(PROFILE, 4.0), "padded"),
    "sd_parts1": lambda: TwiceSdParts(tight(PROFILE, 4.0)),
    "sd_memory1": lambda: TwiceSdMemory(tight(PROFILE, 8.0)),
    "sd_memory1_padded": lambda: TwiceSdMemory(tight(PROFILE, 8.0), "padded"),
    "verify_flops": lambda: CostModel(tight(PROFILE, 4.0), "per_user", ModelChoices(verify_flops_efficiency=0.5)),
}


def special_round(seed: int):
    """A sampled round with users certain to accept (alpha = 1, O = 60: a multiple of every g + 1) and
    users whose uplink uses their whole slack (budget exactly 0) or more."""
    rnd = sample_round(np.random.default_rng(9000 + seed), EnvConfig(num_users=K, max_gamma=G))
    return add_special_users(rnd, np.random.default_rng(seed))


def user_of(rnd, k: int):
    return int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k])


def walk(cost, rnd, prefer, rng):
    """Admit the round's users in order, both builders side by side: every mask against the exact check,
    the candidates' shares and memories against its numbers, and after each admission the scalar plan's
    aggregates against the exact check's. Returns (modes seen, infeasible candidates seen, fixed depth)."""
    plan, vec = ScalarPlan(cost, G), PlanBuilder(cost, 1, G)
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    gamma, blocked, seen = 0, 0, set()
    for t in range(rnd.num_users):
        user = user_of(rnd, t)
        masks = plan.prepare(*user)
        vmasks = vec.prepare(*(np.array([v]) for v in user))
        assert vmasks.shape == (1, 2 + G) and vmasks[0].tolist() == masks, t
        assert len(masks) == 2 + G and masks[0]
        share_a, share_s = vec.candidate_shares()
        mem_a, mem_s = vec.candidate_memory()
        assert share_a.shape == mem_a.shape == (1,) and share_s.shape == mem_s.shape == (1, G)
        for a in range(1, 2 + G):
            g = a - 1
            if a >= 2 and gamma and g != gamma:
                assert not masks[a], (t, a)  # the round's depth is fixed by its first SD user
                continue
            trial = modes.copy()
            trial[t] = AD if a == 1 else SD
            rep = check_plans(cost, rnd, trial, g if a >= 2 else (gamma or 1))
            assert masks[a] == bool(rep.feasible), (t, a)
            blocked += not rep.feasible
            if a == 1:
                assert plan.candidate_ad_share() == share_a[0] == rep.ad_share_min, t
                assert mem_a[0] == rep.ad_memory_bytes, t
            else:
                assert share_s[0, g - 1] == rep.sd_share_min, (t, a)
                assert mem_s[0, g - 1] == rep.sd_memory_bytes, (t, a)
        allowed = [a for a, ok in enumerate(masks) if ok]
        a = prefer(t, allowed) if prefer else int(rng.choice(allowed))
        assert plan.apply(a) is True
        assert vec.apply(np.array([a])).tolist() == [True]
        modes[t] = REJECT if a == 0 else (AD if a == 1 else SD)
        gamma = gamma or (a - 1 if a >= 2 else 0)
        seen.add(int(modes[t]))
        depth = gamma or 1
        rep = check_plans(cost, rnd, modes, depth)
        assert rep.feasible
        assert plan.gamma == gamma == int(vec.gamma[0])
        assert plan.b == [int((modes == AD).sum()), int((modes == SD).sum())]
        assert plan.share == [rep.ad_share_min, rep.sd_share_min], t
        assert plan.mem == [rep.ad_memory_bytes, rep.sd_memory_bytes], t
        assert plan.j_max == int(BatchStats.of(rnd, modes == SD, depth).j_max) == int(vec.j_max[0]), t
        assert [vec.share[0][0], vec.share[1][0]] == plan.share and [vec.mem[0][0], vec.mem[1][0]] == plan.mem
    return seen, blocked, gamma


def _sd_shallow_first(t, allowed):
    """SD at the shallowest allowed depth for the first users that can take it, then AD or SD alternately."""
    sd = [a for a in allowed if a >= 2]
    if t < 3 and sd:
        return sd[0]
    pick = [a for a in allowed if (a == 1) == (t % 2 == 0)] or allowed
    return pick[-1]


def _sd_deep_first(t, allowed):
    """SD at the deepest allowed depth for the first users that can take it, then AD where possible."""
    sd = [a for a in allowed if a >= 2]
    if t < 3 and sd:
        return sd[-1]
    return 1 if 1 in allowed else allowed[-1]


def _ad_first(t, allowed):
    """AD for the first users (SD still empty: its draft weights not yet counted), then SD whenever allowed."""
    if t < 5:
        return 1 if 1 in allowed else 0
    sd = [a for a in allowed if a >= 2]
    return sd[t % len(sd)] if sd else allowed[-1]


@pytest.mark.parametrize("name", list(COSTS))
@pytest.mark.parametrize("seed", range(2))
def test_builders_equal_the_exact_check_after_every_admission(name, seed):
    """Masks == check_plans per action; candidate and committed shares, memories, J and depth == the exact
    check's, for each cost model; the walks see both modes, depth 1 and a deeper one fixed, and rejections."""
    cost = COSTS[name]()
    rng = np.random.default_rng(seed)
    seen, blocked, depths = set(), 0, set()
    for prefer in (None, _sd_shallow_first, _sd_deep_first, _ad_first):
        s, b, g = walk(cost, special_round(seed), prefer, rng)
        seen |= s
        blocked += b
        depths.add(g)
    assert {AD, SD} <= seen and blocked > 0
    assert 1 in depths and max(depths) > 1


@pytest.mark.parametrize("name", ["per_user", "calibrated", "sd_parts1"])
def test_later_users_see_only_the_fixed_depth(name):
    """Once the first SD user fixed the depth (1 or G), every later user's other SD depths are masked out,
    even where they would fit, and the fixed one equals the exact check."""
    cost = COSTS[name]()
    rnd = make_loose_round()
    for depth in (1, G):
        plan = ScalarPlan(cost, G)
        plan.prepare(*user_of(rnd, 0))
        assert plan.apply(1 + depth)
        modes = np.array([SD] + [REJECT] * (rnd.num_users - 1), dtype=np.int8)
        for t in range(1, rnd.num_users):
            masks = plan.prepare(*user_of(rnd, t))
            trial = modes.copy()
            trial[t] = SD
            assert masks[2:] == [g == depth for g in range(1, G + 1)], (depth, t)
            assert masks[1 + depth] == bool(check_plans(cost, rnd, trial, depth).feasible)
            assert all(check_plans(cost, rnd, trial, g).feasible for g in range(1, G + 1))  # the others would fit
            plan.apply(0)


def make_loose_round():
    """Four small users with loose deadlines: any of them fits at any depth in any mode."""
    return make_round([40, 60, 30, 50], [30, 20, 40, 25], [60.0] * 4, [0.8, 0.7, 0.9, 0.75], [0.01] * 4, [0.01] * 4)


def test_a_plan_that_starts_with_ad_prices_sd_at_every_depth():
    """AD users first (SD empty), then a first SD candidate: every depth 1..G is priced (and allowed where
    it fits); the AD mask is AD's own, not an SD price."""
    for name in ("calibrated", "per_user"):
        cost = COSTS[name]()
        rnd = make_loose_round()
        plan = ScalarPlan(cost, G)
        plan.prepare(*user_of(rnd, 0))
        assert plan.apply(1)
        masks = plan.prepare(*user_of(rnd, 1))
        assert masks == [True] * (2 + G), name
        for a in range(2, 2 + G):
            plan.prepare(*user_of(rnd, 1))
            assert plan.apply(a)
            rep = check_plans(cost, rnd, np.array([AD, SD, REJECT, REJECT]), a - 1)
            assert plan.share == [rep.ad_share_min, rep.sd_share_min] and plan.mem == [rep.ad_memory_bytes, rep.sd_memory_bytes]
            plan.reset()
            plan.prepare(*user_of(rnd, 0))
            plan.apply(1)


def test_ad_mask_is_ads_own_when_sd_would_not_fit():
    """The AD candidate is checked as AD: a heavily calibrated SD (x 50) makes SD infeasible at every depth
    for a user AD still fits, before any depth is fixed."""
    cal = StepCalibration()
    cal.factor["ad"], cal.factor["sd"] = 1.0, 50.0
    cost = CalibratedCostModel(CostModel(PROFILE), cal)
    rnd = make_round([100], [100], [8.0], [0.8], [0.01], [0.01])
    plan = ScalarPlan(cost, G)
    masks = plan.prepare(*user_of(rnd, 0))
    assert masks == [True, True] + [False] * G
    assert check_plans(cost, rnd, np.array([AD]), 1).feasible
    assert not any(check_plans(cost, rnd, np.array([SD]), g).feasible for g in range(1, G + 1))


# ---------------------------------------------------------------- acceptance certain, and its switch
@pytest.mark.parametrize("name", ["per_user", "calibrated"])
def test_certain_acceptance_takes_o_over_g_plus_one_iterations(name):
    """alpha = 1: an SD user with O = 60 runs exactly 60 / (g + 1) iterations (no division by 1 - alpha,
    no rounding up of an exact quotient), before and after the depth is fixed."""
    cost = COSTS[name]()
    args = (100, 60, 1.0, 0.01, 30.0)
    for g in range(1, G + 1):
        plan = ScalarPlan(cost, G)
        assert plan.prepare(*args)[1 + g]
        assert plan.apply(1 + g)
        assert plan.j_max == 60 // (g + 1) == int(sd_iterations(60, 1.0, g))
        assert plan.share[1] == cost.sd_time1(1, 100, 60, 60 // (g + 1), g) / (30.0 - 0.01)
        assert plan.prepare(*args)[1 + g]  # the depth is fixed now
        assert plan.apply(1 + g)
        assert plan.j_max == 60 // (g + 1)
        assert plan.share[1] == cost.sd_time1(2, 100, 60, 60 // (g + 1), g) / (30.0 - 0.01)


def test_acceptance_at_the_switch_uses_the_formula_at_deep_drafts():
    """alpha = 1 - 1e-9 is still priced by (1 - a^(g+1)) / (1 - a), as the exact check does: at g = 64 that
    is 65 - 2.1e-6 tokens per iteration, so O = 130 needs 3 iterations, not 130 / 65 = 2. The depth is deep
    so that the gap to 65 (2.1e-6) dwarfs the formula's rounding there (~1e-7: a^(g+1)'s last bit over
    1 - a), which differs between Python's and numpy's power and between hosts."""
    cost = CostModel(PROFILE)
    alpha, g, out = 1.0 - 1e-9, 64, 130
    assert sd_iterations1(out, alpha, g) == int(sd_iterations(out, alpha, g)) == 3
    plan = ScalarPlan(cost, g)
    vec = PlanBuilder(cost, 1, g)
    args = (100, out, alpha, 0.01, 100.0)
    assert plan.prepare(*args)[1 + g]
    vec.prepare(*(np.array([v]) for v in args))
    assert plan.apply(1 + g) and vec.apply(np.array([1 + g]))[0]
    assert plan.j_max == int(vec.j_max[0]) == 3
    assert plan.share[1] == cost.sd_time1(1, 100, out, 3, g) / (100.0 - 0.01)


# ---------------------------------------------------------------- plans exactly at the limits
def _nearby(x: float, n: int = 40):
    """x and its n float neighbours on each side, nearest first."""
    out, up, down = [x], x, x
    for _ in range(n):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        out += [up, down]
    return out


def _slack_for(time_s: float, share: float):
    """A slack whose share t / slack is ``share`` exactly in floats (None if none is near)."""
    return next((y for y in _nearby(time_s / share) if time_s / y == share), None)


def test_a_plan_exactly_at_the_share_limit_is_feasible():
    """A single user whose least share is 1 + EPS bit for bit (SD at depth 2, and AD) is admitted, as the
    exact check admits it."""
    cost = golden_cost()
    found = 0
    for out in range(10, 40):
        j = sd_iterations1(out, 0.5, 2)
        for action, t in ((3, cost.sd_time1(1, 10, out, j, 2)), (1, cost.ad_time1(1, 10, out))):
            y = _slack_for(t, 1 + EPS)
            if y is None:
                continue
            found += 1
            rnd = make_round([10], [out], [y], [0.5], [0.0], [0.0])
            rep = check_plans(cost, rnd, np.array([SD if action == 3 else AD]), 2)
            assert float(rep.sd_share_min + rep.ad_share_min) == 1 + EPS and rep.feasible
            plan, vec = ScalarPlan(cost, G), PlanBuilder(cost, 1, G)
            assert plan.prepare(10, out, 0.5, 0.0, y)[action]
            assert vec.prepare(*(np.array([v]) for v in (10, out, 0.5, 0.0, y)))[0, action]
            assert plan.apply(action)
            assert plan.share[action >= 2] == 1 + EPS
    assert found >= 4


def _memory_for(cost_of, kv_bytes: float, sd: bool):
    """A device memory Q whose budget (sd: with the draft's weights) times (1 + EPS) is ``kv_bytes`` exactly."""
    base = cost_of(1e9)
    w = base.reserve_bytes + base.w_l + (base.w_s if sd else 0.0)
    for q in _nearby(w + kv_bytes / (1 + EPS), 8):
        if (q - base.reserve_bytes - base.w_l - float(sd) * base.w_s) * (1 + EPS) == kv_bytes:
            cost = cost_of(q)
            assert cost.memory_budget1(sd) * (1 + EPS) == kv_bytes
            return cost
    return None


@pytest.mark.parametrize("mode", [AD, SD])
def test_a_plan_exactly_at_the_memory_limit_is_feasible(mode):
    """A single user whose KV is the memory budget times (1 + EPS) bit for bit is admitted (AD: the budget
    without the draft's weights; SD at depth 2: with them), as the exact check admits it."""
    found = 0
    for inp in range(600, 640):
        out = 600
        kv = (inp + out) * 2000.0 if mode == AD else (inp + 2 + out) * 3000.0  # golden kv_L, kv_SD (per user)
        cost = _memory_for(golden_cost, kv, mode == SD)
        if cost is None:
            continue
        found += 1
        rnd = make_round([inp], [out], [1e6], [0.5], [0.0], [0.0])
        rep = check_plans(cost, rnd, np.array([mode]), 2)
        assert float(rep.ad_memory_bytes + rep.sd_memory_bytes) == kv == float(rep.memory_budget_bytes) * (1 + EPS)
        assert rep.feasible
        action = 1 if mode == AD else 3
        plan, vec = ScalarPlan(cost, G), PlanBuilder(cost, 1, G)
        assert plan.prepare(inp, out, 0.5, 0.0, 1e6)[action]
        assert vec.prepare(*(np.array([v]) for v in (inp, out, 0.5, 0.0, 1e6)))[0, action]
        # one token more does not fit
        assert not plan.prepare(inp + 1, out, 0.5, 0.0, 1e6)[action]
    assert found >= 4


# ---------------------------------------------------------------- memos
def test_a_reset_after_the_calibration_moved_prices_with_the_new_factors():
    """One plan reused while the live calibration's factors change between rounds: each round's AD and SD
    shares are the current model's (no time memoised under other factors)."""
    cal = StepCalibration()
    cost = CalibratedCostModel(CostModel(PROFILE), cal)
    plan = ScalarPlan(cost, G)
    args = (200, 80, 0.7, 0.01, 20.0)
    seen = set()
    for ad, sd in ((1.0, 1.0), (2.5, 1.5), (0.75, 3.0), (2.5, 1.5)):
        cal.factor["ad"], cal.factor["sd"] = ad, sd
        plan.reset()
        for b in (1, 2):  # an AD user, then a second AD user (a batch of 2)
            plan.prepare(*args)
            assert plan.candidate_ad_share() == cost.ad_time1(b, 200, 80) / (20.0 - 0.01)
            assert plan.apply(1)
        plan.prepare(*args)
        assert plan.apply(2)  # SD at depth 1
        assert plan.share[1] == cost.sd_time1(1, 200, 80, plan.j_max, 1) / (20.0 - 0.01)
        seen.add(plan.share[0])
    assert len(seen) == 3


def test_memos_are_emptied_at_a_reset_once_past_their_bound():
    """The memos are bounded: a reset finding more than MEMO_MAX entries (AD and SD together) empties them."""
    plan = ScalarPlan(CostModel(PROFILE), G)
    plan.MEMO_MAX = 5
    for k in range(4):  # four users of distinct sizes: four AD times, four all-depth SD prices
        plan.prepare(100 + k, 50 + k, 0.8, 0.01, 10.0)
    assert len(plan._ad_memo) == len(plan._sd_memo) == 4
    plan.reset()
    assert len(plan._ad_memo) + len(plan._sd_memo) == 0


class ExtraDepth(CostModel):
    """A model whose all-depths SD price returns one depth more than asked."""

    def sd_parts_all1(self, b, s_max, n_max, g_max):
        return (*super().sd_parts_all1(b, s_max, n_max, g_max), 1.0)


def test_all_depth_prices_of_the_wrong_length_are_an_error():
    """Depths 1..G and the all-depths price are zipped strictly: a price row of another length is refused."""
    plan = ScalarPlan(ExtraDepth(PROFILE), G)
    with pytest.raises(ValueError):
        plan.prepare(100, 50, 0.8, 0.01, 10.0)


# ---------------------------------------------------------------- API contract
def test_candidate_accessors_before_prepare_name_the_call():
    with pytest.raises(RuntimeError, match=r"^ScalarPlan\.candidate_ad_share called before prepare\(\) for this user$"):
        ScalarPlan(CostModel(PROFILE), G).candidate_ad_share()
    builder = PlanBuilder(CostModel(PROFILE), 2, G)
    with pytest.raises(RuntimeError, match=r"^PlanBuilder\.candidate_shares called before prepare\(\) for this user$"):
        builder.candidate_shares()
    with pytest.raises(RuntimeError, match=r"^PlanBuilder\.candidate_memory called before prepare\(\) for this user$"):
        builder.candidate_memory()
    builder.prepare(np.array([100, 120]), np.array([50, 40]), np.array([0.8, 0.9]), np.array([0.01, 0.02]), np.array([10.0, 12.0]))
    builder.apply(np.array([1, 2]))
    with pytest.raises(RuntimeError, match=r"^PlanBuilder\.candidate_memory called before prepare\(\) for this user$"):
        builder.candidate_memory()  # the prepared user was used up


def test_candidate_memory_is_the_kv_of_each_batch_with_the_user():
    """``candidate_memory``: (AD (N,), SD (N, G)) bytes with the prepared user in the batch, per round."""
    cost = CostModel(PROFILE)
    builder = PlanBuilder(cost, 2, G)
    builder.prepare(np.array([100, 120]), np.array([50, 40]), np.array([0.8, 0.9]), np.array([0.01, 0.02]), np.array([10.0, 12.0]))
    ad, sd = builder.candidate_memory()
    assert ad.tolist() == [cost.ad_memory1(1, 100, 50, 50), cost.ad_memory1(1, 120, 40, 40)]
    assert sd.tolist() == [[cost.sd_memory1(1, s, o, o, g) for g in range(1, G + 1)] for s, o in ((100, 50), (120, 40))]
    assert ad.tolist() == [(100 + 50) * cost.kv_l, (120 + 40) * cost.kv_l]
    assert sd[0, 1] == (100 + 2 + 50) * cost.kv_sd


def test_plan_builder_keeps_one_row_per_mode():
    """Every per-mode aggregate holds two rows (AD, SD) of N rounds, empty after a reset of all or some rounds."""
    builder = PlanBuilder(CostModel(PROFILE), 3, G)
    for _ in range(2):
        for name, fill in (("b", 0), ("s_max", 0), ("n_max", 0), ("u_max", 0.0), ("slack_min", np.inf), ("sum_out", 0), ("share", 0.0), ("mem", 0.0)):
            assert np.array_equal(getattr(builder, name), np.full((2, 3), fill)), name
        assert np.array_equal(builder.j_max, np.zeros(3)) and np.array_equal(builder.gamma, np.zeros(3))
        builder.prepare(np.array([100, 120, 90]), np.array([50, 40, 30]), np.array([0.8, 0.9, 0.7]), np.array([0.01] * 3), np.array([10.0] * 3))
        builder.apply(np.array([1, 2, 3]))
        builder.reset(np.array([True, True, True]))
