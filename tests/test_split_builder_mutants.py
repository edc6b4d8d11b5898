"""Pins ``envs.split_builder.SplitScalarPlan`` and ``envs.scalar_times`` where the other split tests do not
reach: after every admission the builder's masks equal ``check_plan_split`` of the plan with the candidate
and its shares and memories equal the exact check's bit for bit, for the padded KV model, a per-SD-user
workspace, live-calibrated models (``sd_time1`` overridden; factors that move between rounds must be
re-priced), a model that overrides ``sd_parts1``, users certain to accept (alpha = 1) and users whose
uplink uses up their slack; plans exactly at the memory and share limits are feasible in both, an ED
budget of exactly 0 in neither, and SLM weights count from the first SD user; the plan's API contract
(apply before prepare, out-of-range actions, ``candidate_ad_share`` with nothing prepared, rows of the
wrong length); ``ed_rows`` for a round without edges; and ``scalar_times``' one-call times (CostModel's
floats, their passes remembered in the caller's dicts, the method itself for any other model).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from builder_cases import TwiceSdParts, add_special_users
from split_rounds import PROFILE, G, decode, round_of, user_args

from envs.cost_model import CostModel
from envs.feasibility import EPS
from envs.latency import LatencyModel
from envs.model_choices import ModelChoices
from envs.plan import AD, ED, REJECT, SD
from envs.profile import load_profile
from envs.scalar_times import ad_time_of, sd_parts_all_of, sd_parts_of
from envs.split_builder import SplitScalarPlan, ed_rows
from envs.split_cost import SplitCostModel
from envs.split_plan import check_plan_split, ed_users
from runtime.calibration import CalibratedCostModel, StepCalibration

K = 10


def tight(p, n_users: float):
    """The profile with room for both models' weights and about ``n_users`` users' KV."""
    kv_user = 600 * CostModel(p).kv_l  # about a user's (S + O + G) tokens
    return p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + n_users * kv_user)


def special_round(seed: int):
    """A round with users certain to accept (alpha = 1, output a multiple of every g + 1), users whose
    uplink uses their whole slack (budget exactly 0) or more, spread over the round."""
    rnd = round_of(K, 7000 + seed, edge_fraction=0.7)
    return add_special_users(rnd, np.random.default_rng(seed))


def walk(cost, split, rnd, rng, prefer=None):
    """Admit the round's users in order, checking every mask against the exact check and, after each
    admission, the builder's shares and memories against the exact check's; returns (modes seen, blocked)."""
    users = ed_users(split, rnd, G)
    plan = SplitScalarPlan(cost, G)
    k = rnd.num_users
    modes, depth = np.zeros(k, dtype=np.int8), np.zeros(k, dtype=np.int64)
    gamma, blocked, seen = 0, 0, set()
    for t in range(k):
        masks = plan.prepare(*user_args(rnd, users, t))
        assert masks[0]
        for a in range(1, 2 + 2 * G):
            mode, g_sd, g_ed = decode(a)
            if mode == SD and gamma and g_sd != gamma:
                assert not masks[a], (t, a)
                continue
            m, d = modes.copy(), depth.copy()
            m[t], d[t] = mode, g_ed
            rep = check_plan_split(cost, users, rnd, m, (gamma or g_sd or 1), d)
            assert masks[a] == rep.feasible, (t, a)
            blocked += not rep.feasible
            if a == 1:
                assert plan.candidate_ad_share() == rep.ad_share_min
        allowed = [int(a) for a in np.flatnonzero(masks)]
        a = prefer(t, allowed) if prefer else int(rng.choice(allowed))
        assert plan.apply(a)
        mode, g_sd, g_ed = decode(a)
        modes[t], depth[t] = mode, g_ed
        gamma = gamma or g_sd
        seen.add(mode)
        rep = check_plan_split(cost, users, rnd, modes, max(gamma, 1), depth)
        assert rep.feasible
        assert plan.gamma == gamma
        assert plan.share == [rep.ad_share_min, rep.sd_share_min, rep.ed_share_min], t
        assert plan.mem == [rep.ad_memory_bytes, rep.sd_memory_bytes, rep.ed_memory_bytes], t
    return seen, blocked


def calibrated(p):
    cal = StepCalibration()
    cal.update("ad", 3.0, 1.0)
    cal.update("sd", 2.0, 1.0)
    assert cal.factor["ad"] != 1.0 and cal.factor["sd"] != 1.0
    return CalibratedCostModel(CostModel(p), cal)


def _costs():
    p = load_profile(PROFILE)
    return {
        "per_user": lambda: CostModel(tight(p, 4.0)),
        "padded": lambda: CostModel(tight(p, 4.0), "padded"),
        "workspace": lambda: CostModel(tight(p, 5.0), "per_user", ModelChoices(sd_user_workspace_bytes=150 * CostModel(p).kv_l)),
        "calibrated": lambda: calibrated(tight(p, 4.0)),
        "calibrated_padded": lambda: CalibratedCostModel(CostModel(tight(p, 4.0), "padded"), calibrated(p).calibration),
        "sd_parts1": lambda: TwiceSdParts(tight(p, 4.0)),
        "verify_flops": lambda: CostModel(tight(p, 4.0), "per_user", ModelChoices(verify_flops_efficiency=0.5)),
    }


def _sd_first(t, allowed):
    """SD at the deepest allowed depth for the first user that can take it, then AD or ED where possible."""
    sd = [a for a in allowed if decode(a)[0] == SD]
    if t < 3 and sd:
        return sd[-1]
    rest = [a for a in allowed if decode(a)[0] in (AD, ED)]
    return rest[t % len(rest)] if rest else allowed[-1]


def _ad_first(t, allowed):
    """AD and ED for the first users, then SD whenever allowed."""
    if t < 4:
        rest = [a for a in allowed if decode(a)[0] in (AD, ED)]
        return rest[-1 if t % 2 else 0] if rest else 0
    sd = [a for a in allowed if decode(a)[0] == SD]
    return sd[0] if sd else allowed[-1]


@pytest.mark.parametrize("name", list(_costs()))
@pytest.mark.parametrize("seed", range(3))
def test_builder_equals_exact_check_after_every_admission(name, seed):
    """Masks == check_plan_split per action and shares/memories == the exact check's after each admission."""
    cost = _costs()[name]()
    split = SplitCostModel(load_profile(PROFILE))
    rng = np.random.default_rng(seed)
    seen, blocked = set(), 0
    for prefer in (None, _sd_first, _ad_first):
        s, b = walk(cost, split, special_round(seed), rng, prefer)
        seen |= s
        blocked += b
    assert {AD, SD, ED} <= seen and blocked > 0


def test_certain_acceptance_takes_o_over_g_plus_one_iterations():
    """alpha = 1: an SD user with O = 60 runs exactly 60 / (g + 1) iterations, before and after the depth is fixed."""
    p = load_profile(PROFILE)
    cost = CostModel(p)
    for g in range(1, G + 1):
        plan = SplitScalarPlan(cost, G)
        args = (100, 60, 1.0, 0.01, 30.0)
        plan.prepare(*args)
        assert plan.apply(1 + g)
        assert plan.j_max == 60 // (g + 1)
        prefill, iteration = cost.sd_parts1(1, 100, 60, g)
        assert plan.share[1] == (prefill + float(60 // (g + 1)) * iteration) / (30.0 - 0.01)
        plan.prepare(*args)  # the depth is fixed now: the straight-line check
        assert plan.apply(1 + g)
        prefill, iteration = cost.sd_parts1(2, 100, 60, g)
        assert plan.j_max == 60 // (g + 1)
        assert plan.share[1] == (prefill + float(60 // (g + 1)) * iteration) / (30.0 - 0.01)


def test_calibrated_times_are_repriced_when_the_factors_move():
    """A reset after the live calibration moved must price with the new factors (CostModel.times_version)."""
    p = load_profile(PROFILE)
    cal = StepCalibration()
    cost = CalibratedCostModel(CostModel(p), cal)
    plan = SplitScalarPlan(cost, G)
    args = (200, 80, 0.7, 0.01, 20.0)
    for _ in range(3):
        plan.reset()
        plan.prepare(*args)
        assert plan.candidate_ad_share() == cost.ad_time1(1, 200, 80) / (20.0 - 0.01)
        assert plan.apply(2)  # SD at depth 1: prices the SD times too
        assert plan.share[1] == cost.sd_time1(1, 200, 80, plan.j_max, 1) / (20.0 - 0.01)
        cal.update("ad", 4.0, 1.0)
        cal.update("sd", 3.0, 1.0)


def test_plan_api_contract():
    cost = CostModel(load_profile(PROFILE))
    plan = SplitScalarPlan(cost, G)
    assert plan.candidate_ad_share() == 1.0  # nothing prepared
    with pytest.raises(RuntimeError, match=r"^SplitScalarPlan\.apply called before prepare\(\) for this user$"):
        plan.apply(1)
    masks = plan.prepare(100, 50, 0.8, 0.01, 10.0)
    assert len(masks) == 2 + 2 * G and masks[1]
    assert plan.apply(1)
    assert plan.candidate_ad_share() == 1.0  # the prepared user was used up
    with pytest.raises(RuntimeError, match="before prepare"):
        plan.apply(1)
    before = (list(plan.b), list(plan.share), list(plan.mem))
    for bad in (-1, 2 + 2 * G, 3 + 2 * G, 2 + 3 * G, 99):
        plan.prepare(100, 50, 0.8, 0.01, 10.0)
        assert plan.apply(bad) is False
        assert (plan.b, plan.share, plan.mem) == before
    plan.reset()
    with pytest.raises(RuntimeError, match="before prepare"):
        plan.apply(0)


def test_ed_rows_of_the_wrong_length_are_an_error():
    """``ed`` rows run over depths 1..G: a shorter row is refused, not silently cut."""
    p = load_profile(PROFILE)
    rnd = round_of(4, 11, edge_fraction=1.0)
    users = ed_users(SplitCostModel(p), rnd, G)
    plan = SplitScalarPlan(CostModel(p), G)
    args = list(user_args(rnd, users, 0))
    j, x, allowed, prefill = args[-1]
    args[-1] = (j[:-1], x, [True] * G, prefill)
    with pytest.raises(ValueError):
        plan.prepare(*args)


def test_ed_rows_without_edges_are_all_none():
    p = load_profile(PROFILE)
    split = SplitCostModel(p)
    rnd = round_of(5, 3, edge_fraction=1.0)
    full = ed_rows(split, rnd, G)
    users = ed_users(split, rnd, G)
    assert full == [user_args(rnd, users, k)[-1] for k in range(5)]
    rnd.has_edge = None
    assert ed_rows(split, rnd, G) == [None] * 5


def with_own_decode_sums(tau_l: LatencyModel) -> LatencyModel:
    """``tau_l`` whose class has its own ``decode_sum1`` (the same numbers): scalar_times must call it, not its table."""
    base = type(tau_l)
    assert base.decode_sum1 is LatencyModel.decode_sum1

    def decode_sum1(self, b, s, n):
        return base.decode_sum1(self, b, s, n)

    other = copy.copy(tau_l)
    other.__class__ = type("OwnDecodeSums", (base,), {"decode_sum1": decode_sum1})
    return other


@pytest.mark.parametrize("b,s,n", [(1, 1, 1), (1, 0, 0), (3, 128, 1), (4, 17, 300), (8, 900, 2)])
def test_scalar_times_are_cost_models_floats_and_remember_their_passes(b, s, n):
    cost = CostModel(load_profile(PROFILE))
    prefills, sums, sd_prefills, iterations = {}, {}, {}, {}
    ad = ad_time_of(cost, prefills, sums)
    assert ad(b, s, n) == cost.ad_time1(b, s, n)
    s1 = max(s, 1)
    assert set(prefills) == {(b, s1)} and {(b, s1), (b, s1 + max(n - 1, 0))} == set(sums)
    parts, parts_all = sd_parts_of(cost, sd_prefills, iterations), sd_parts_all_of(cost, sd_prefills)
    for g in range(1, G + 1):
        assert parts(b, s, n, g) == cost.sd_parts1(b, s, n, g)
    assert parts_all(b, s, n, G) == cost.sd_parts_all1(b, s, n, G)
    assert set(sd_prefills) == {(b, s)} and len(iterations) == G
    sd_prefills.clear()
    assert parts_all(b, s, n, G) == cost.sd_parts_all1(b, s, n, G)
    assert set(sd_prefills) == {(b, s)}
    # a latency model with its own decode sums: the method's arithmetic, no table
    other = CostModel(load_profile(PROFILE))
    other.tau_l = with_own_decode_sums(other.tau_l)
    sums2 = {}
    assert ad_time_of(other, {}, sums2)(b, s, n) == other.ad_time1(b, s, n) == cost.ad_time1(b, s, n)
    assert sums2 == {}


def test_scalar_times_give_other_models_their_methods():
    p = load_profile(PROFILE)
    cal = calibrated(p)
    assert ad_time_of(cal, {}, {}) == cal.ad_time1
    flops = CostModel(p, "per_user", ModelChoices(verify_flops_efficiency=0.5))
    assert sd_parts_of(flops, {}, {}) == flops.sd_parts1 and sd_parts_all_of(flops, {}) == flops.sd_parts_all1
    # not a CostModel at all, without the methods: None
    assert sd_parts_of(object(), {}, {}) is None and sd_parts_all_of(object(), {}) is None


# ---------------------------------------------------------------- at the limits, exactly
LIM = 1.0 + EPS  # the share limit both checks use


class FixedBudget(CostModel):
    """A device whose KV budget (with and without SD's weights) is ``budget`` bytes."""

    def __init__(self, profile, budget: float):
        super().__init__(profile)
        self.budget = budget

    def memory_budget(self, sd_used):
        return np.full(np.shape(sd_used), self.budget)

    def memory_budget1(self, sd_used: bool) -> float:
        return self.budget


def _exact_budget(need: float) -> float:
    """A budget ``B`` with ``B * (1 + EPS) == need`` in floats (the memory sum exactly at the limit)."""
    b = need / (1 + EPS)
    for _ in range(64):
        if b * (1 + EPS) == need:
            return b
        b = math.nextafter(b, math.inf if b * (1 + EPS) < need else -math.inf)
    pytest.skip("no float budget lands exactly on this need")


def _two_user_round(seed: int):
    rnd = round_of(3, 9100 + seed, edge_fraction=1.0)
    rnd.deadline_s[:] = 60.0
    rnd.downlink_s[:] = 0.0  # slack = deadline
    return rnd


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("plan", [(AD, AD), (SD, SD), (ED, ED), (AD, SD), (SD, AD), (ED, SD), (SD, ED), (ED, AD), (ED, SD, SD), (AD, SD, SD), (SD, AD, ED)])
def test_memory_exactly_at_the_limit_is_feasible(seed, plan):
    """A plan whose memory sum is exactly ``budget * (1 + EPS)`` passes the exact check and the builder admits
    its last user (SD at depth 1, ED at depth 2), whichever mode it joins and whatever the other modes hold;
    one byte less budget and neither does."""
    p = load_profile(PROFILE)
    rnd = _two_user_round(seed)
    split = SplitCostModel(p)
    users = ed_users(split, rnd, G)
    modes = np.array([*plan, REJECT, REJECT][:3], dtype=np.int8)
    depth = np.where(modes == ED, 2, 0)
    rep = check_plan_split(CostModel(p), users, rnd, modes, 1, depth)
    need = rep.ad_memory_bytes + rep.sd_memory_bytes + rep.ed_memory_bytes
    action = {AD: 1, SD: 2, ED: 2 + G + 1}
    for budget, fits in ((_exact_budget(need), True), (need / (1 + EPS) - 1.0, False)):
        cost = FixedBudget(p, budget)
        assert check_plan_split(cost, users, rnd, modes, 1, depth).feasible == fits
        sp = SplitScalarPlan(cost, G)
        for t, mode in enumerate(plan[:-1]):
            sp.prepare(*user_args(rnd, users, t))
            assert sp.apply(action[mode])
        masks = sp.prepare(*user_args(rnd, users, len(plan) - 1))
        assert masks[action[plan[-1]]] == fits, budget


def _scan(value_of, x0: float, target: float, steps: int = 200):
    """The float ``x`` next to ``x0`` at which ``value_of(x) == target`` (``value_of`` falling in ``x``), or None."""
    x = x0
    for _ in range(steps):
        v = value_of(x)
        if v == target:
            return x
        x = math.nextafter(x, math.inf if v > target else -math.inf)
    return None


def _round_at_share_limit(cost, split, mode, n: int):
    """A round whose first ``n`` users, all in ``mode``, need exactly ``1 + EPS`` of the GPU (their
    deadline, hence slack, moved float by float until the exact check's share lands on it)."""
    modes = np.array([mode] * n + [REJECT] * (3 - n), dtype=np.int8)
    depth = np.where(modes == ED, 1, 0)
    for seed in range(60):
        rnd = _two_user_round(seed)
        rnd.uplink_s[:] = 0.0
        users = ed_users(split, rnd, G)
        if mode == ED and not users.allowed[:n, 0].all():
            continue

        def share(x, rnd=rnd, users=users):
            rnd.deadline_s[:n] = x
            rep = check_plan_split(cost, users, rnd, modes, 1, depth)
            return {AD: rep.ad_share_min, SD: rep.sd_share_min, ED: rep.ed_share_min}[mode]

        lo, hi = 0.0, 59.0
        for _ in range(70):  # bisect to the limit, then step float by float
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if share(mid) <= LIM else (mid, hi)
        if _scan(share, hi, LIM) is not None:
            return rnd, users, modes, depth
    raise AssertionError("no round lands exactly on the share limit")


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("mode", [AD, SD, ED])
def test_share_exactly_at_the_limit_is_feasible(mode, n):
    """``n`` users whose batch needs exactly ``1 + EPS`` of the GPU: the exact check passes it, and the
    builder admits the last of them in the same mode (SD: the second at the depth the first one fixed)."""
    p = load_profile(PROFILE)
    cost, split = CostModel(p), SplitCostModel(p)
    rnd, users, modes, depth = _round_at_share_limit(cost, split, mode, n)
    assert check_plan_split(cost, users, rnd, modes, 1, depth).feasible
    sp = SplitScalarPlan(cost, G)
    action = {AD: 1, SD: 2, ED: 2 + G}
    for t in range(n):
        masks = sp.prepare(*user_args(rnd, users, t))
        assert masks[action[mode]]
        assert sp.apply(action[mode])
    assert sum(sp.share) == LIM


@pytest.mark.parametrize("g", range(1, G + 1))
def test_ed_budget_exactly_zero_is_infeasible(g):
    """An ED user whose deadline leaves exactly nothing after its uplink, prefill and edge iterations
    (``T - U - P - J X == 0``): no share can serve it, in the builder as in the exact check."""
    p = load_profile(PROFILE)
    cost, split = CostModel(p), SplitCostModel(p)
    rnd = _two_user_round(0)
    rnd.uplink_s[:] = 0.0
    users = ed_users(split, rnd, G)
    assert users.allowed[0, g - 1]
    jx = users.iterations[0, g - 1] * float(users.edge_s[0, g - 1])
    pre = float(users.prefill_s[0])

    def left(d):
        return (d - 0.0 - pre) - jx

    d = jx + pre
    for _ in range(64):
        if left(d) == 0.0:
            break
        d = math.nextafter(d, math.inf if left(d) < 0.0 else -math.inf)
    assert left(d) == 0.0
    rnd.deadline_s[0] = d
    modes, depth = np.array([ED, REJECT, REJECT], dtype=np.int8), np.array([g, 0, 0])
    assert not check_plan_split(cost, users, rnd, modes, 1, depth).feasible
    masks = SplitScalarPlan(cost, G).prepare(*user_args(rnd, users, 0))
    assert not masks[1 + G + g]


@pytest.mark.parametrize("second", [AD, ED])
def test_sd_weights_are_held_from_the_first_sd_user(second):
    """Once one user is in SD the SLM's weights are resident: an AD or ED user fits only if the KV of the
    plan fits the budget left after both models' weights (just over it: admitted; just under: refused)."""
    p = load_profile(PROFILE)
    rnd = _two_user_round(1)
    users = ed_users(SplitCostModel(p), rnd, G)
    modes = np.array([SD, second, REJECT], dtype=np.int8)
    depth = np.where(modes == ED, 1, 0)
    rep = check_plan_split(CostModel(p), users, rnd, modes, 1, depth)
    need = rep.ad_memory_bytes + rep.sd_memory_bytes + rep.ed_memory_bytes
    weights = p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes
    for room, fits in ((1 + 1e-6, True), (1 - 1e-6, False)):
        cost = CostModel(p.with_memory(weights + need * room))
        assert check_plan_split(cost, users, rnd, modes, 1, depth).feasible == fits
        sp = SplitScalarPlan(cost, G)
        sp.prepare(*user_args(rnd, users, 0))
        assert sp.apply(2)
        assert sp.prepare(*user_args(rnd, users, 1))[1 if second == AD else 2 + G] == fits
