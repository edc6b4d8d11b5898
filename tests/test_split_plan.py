"""Mode ED in the round model: golden values, downward closure, incremental == exact, brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from split_rounds import PROFILE, G, decode, round_of, user_args

from envs.config import EnvConfig

try:
    from envs.cost_model import CostModel
    from envs.plan_builder import ScalarPlan
except ImportError:  # until the feasibility split (envs.cost_model / envs.plan_builder) is committed
    from envs.feasibility import CostModel, ScalarPlan
from envs.plan import AD, ED, REJECT, SD, Plan
from envs.profile import load_profile
from envs.split_builder import SplitPlanBuilder, SplitScalarPlan
from envs.split_cost import DraftTree, SplitCostModel
from envs.split_outcome import evaluate_split_plan
from envs.split_plan import check_plan_split, ed_users
from envs.workload import sample_round


@pytest.fixture(scope="module")
def models():
    p = load_profile(PROFILE)
    return CostModel(p), SplitCostModel(p)


def test_golden_one_ed_user(models):
    cost, split = models
    rnd = round_of(1, 0, edge_fraction=1.0)
    rnd.input_tokens[:] = 100
    rnd.output_tokens[:] = 60
    rnd.alpha[:] = 0.8
    rnd.deadline_s[:] = 5.0
    rnd.rtt_s[:] = 0.02
    users = ed_users(split, rnd, G)
    g = 3
    tree = DraftTree.chain(g)
    c_k = 100 + 30.0
    # hand: E, J, X from the closed form's scalar methods
    e = (1 - 0.8**4) / 0.2
    j = math.ceil(60 / e - 1e-9)
    x = split.edge_iteration_s(0.8, tree, c_k, 0.02, reused=False)
    assert users.iterations[0, g - 1] == j
    assert users.edge_s[0, g - 1] == pytest.approx(x, rel=1e-12)
    tau = cost.tau_l.tau1
    c = 100 + 60 / 2.0
    c_e = tau(1, 100, 100) + j * tau(1, 4, c + 4)
    prefill = split.tau_e.tau1(1, 100, 100)
    budget = 5.0 - rnd.uplink_s[0] - prefill - j * x
    rep = check_plan_split(cost, users, rnd, [ED], gamma=1, ed_depth=[g])
    assert rep.feasible
    assert rep.ed_time_s == pytest.approx(c_e, rel=1e-12)
    assert rep.ed_share_min == pytest.approx(c_e / budget, rel=1e-12)
    assert rep.ed_memory_bytes == pytest.approx((100 + 4 + 60) * load_profile(PROFILE).kv_llm_bytes)
    assert rep.ad_share_min == 0 and rep.sd_share_min == 0 and rep.ed_share == 1.0
    # the server holds no draft weights for ED: the budget is the AD-only one
    assert rep.memory_budget_bytes == pytest.approx(cost.memory_budget1(False))


def test_golden_one_ed_batch_with_own_depths(models):
    cost, split = models
    rnd = round_of(3, 1, edge_fraction=1.0)
    rnd.input_tokens[:] = [50, 120, 80]
    rnd.output_tokens[:] = [100, 40, 70]
    rnd.alpha[:] = [0.9, 0.6, 0.75]
    rnd.deadline_s[:] = [6.0, 7.0, 9.0]
    users = ed_users(split, rnd, G)
    depth = np.array([4, 1, 2])
    rep = check_plan_split(cost, users, rnd, [ED, ED, ED], gamma=1, ed_depth=depth)
    j = max(users.iterations[k, depth[k] - 1] for k in range(3))
    x = max(users.edge_s[k, depth[k] - 1] for k in range(3))
    c = 120 + 100 / 2.0
    q = 5  # the deepest user's 4 drafts + root, padded for everyone
    c_e = cost.tau_l.tau1(3, 120, 120) + j * cost.tau_l.tau1(3, q, c + q)
    budget = 6.0 - rnd.uplink_s.max() - users.prefill_s.max() - j * x
    assert rep.ed_time_s == pytest.approx(c_e, rel=1e-12)
    assert rep.ed_share_min == pytest.approx(c_e / budget, rel=1e-12)
    assert rep.ed_memory_bytes == pytest.approx((3 * (120 + q) + 210) * cost.kv_l)


def test_users_without_an_edge_cannot_be_ed(models):
    cost, split = models
    rnd = round_of(4, 2, edge_fraction=0.0)
    users = ed_users(split, rnd, G)
    assert not users.allowed.any()
    assert not check_plan_split(cost, users, rnd, [ED, REJECT, REJECT, REJECT], 1, [1, 0, 0, 0]).feasible


def random_plan(rng, rnd, users):
    k = rnd.num_users
    modes = rng.choice([REJECT, AD, SD, ED], size=k, p=[0.2, 0.3, 0.2, 0.3])
    modes = np.where((modes == ED) & ~users.allowed.any(axis=1), REJECT, modes)
    depth = np.where(modes == ED, rng.integers(1, G + 1, size=k), 0)
    depth = np.where(modes == ED, np.where(users.allowed[np.arange(k), np.maximum(depth, 1) - 1], depth, 1), 0)
    modes = np.where((modes == ED) & ~users.allowed[np.arange(k), np.maximum(depth, 1) - 1], REJECT, modes)
    return modes, depth, int(rng.integers(1, G + 1))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 14))
def test_downward_closed(seed, k):
    cost, split = CostModel(load_profile(PROFILE)), SplitCostModel(load_profile(PROFILE))
    rng = np.random.default_rng(seed)
    rnd = round_of(k, seed)
    users = ed_users(split, rnd, G)
    for _ in range(5):
        modes, depth, gamma = random_plan(rng, rnd, users)
        if not check_plan_split(cost, users, rnd, modes, gamma, depth).feasible:
            continue
        for i in np.flatnonzero(modes != REJECT):
            m = modes.copy()
            m[i] = REJECT
            assert check_plan_split(cost, users, rnd, m, gamma, depth).feasible


@pytest.mark.parametrize("seed", range(12))
def test_incremental_equals_exact_and_vector_equals_scalar(models, seed):
    cost, split = models
    rng = np.random.default_rng(seed)
    k = 12
    rnd = round_of(k, 100 + seed)
    users = ed_users(split, rnd, G)
    plan = SplitScalarPlan(cost, G)
    vec = SplitPlanBuilder(cost, 1, G)
    modes, depth = np.zeros(k, dtype=np.int8), np.zeros(k, dtype=np.int64)
    gamma = 0
    for t in range(k):
        masks = plan.prepare(*user_args(rnd, users, t))
        vm = vec.prepare(rnd.input_tokens[t:t + 1], rnd.output_tokens[t:t + 1], rnd.alpha[t:t + 1], rnd.uplink_s[t:t + 1], rnd.slack_s[t:t + 1],
                         rnd.deadline_s[t:t + 1], users.iterations[t:t + 1], users.edge_s[t:t + 1], users.allowed[t:t + 1], users.prefill_s[t:t + 1])
        assert vm[0].tolist() == masks
        for a in range(2 + 2 * G):
            mode, g_sd, g_ed = decode(a)
            if mode == SD and gamma and g_sd != gamma:
                assert not masks[a]
                continue
            m, d = modes.copy(), depth.copy()
            m[t], d[t] = mode, g_ed
            exact = check_plan_split(cost, users, rnd, m, (gamma or g_sd or 1), d).feasible
            assert masks[a] == exact, (t, a)
        allowed = np.flatnonzero(masks)
        a = int(rng.choice(allowed))
        assert plan.apply(a) and vec.apply([a])[0]
        mode, g_sd, g_ed = decode(a)
        modes[t], depth[t] = mode, g_ed
        gamma = gamma or g_sd
    rep = check_plan_split(cost, users, rnd, modes, max(gamma, 1), depth)
    assert rep.feasible
    assert plan.share == pytest.approx([rep.ad_share_min, rep.sd_share_min, rep.ed_share_min], rel=0, abs=0)


@pytest.mark.parametrize("seed", range(3))
def test_brute_force_small_rounds(models, seed):
    """Every assignment of 3 users: the builder accepts it in order iff the exact check passes the final plan."""
    cost, split = models
    rnd = round_of(3, 500 + seed, edge_fraction=1.0)
    rnd.deadline_s[:] = np.array([1.5, 2.5, 4.0])  # tight enough that some plans fail
    users = ed_users(split, rnd, G)
    feasible_count = 0
    for actions in itertools.product(range(2 + 2 * G), repeat=3):
        sd_depths = {decode(a)[1] for a in actions if decode(a)[0] == SD}
        if len(sd_depths) > 1:
            continue  # one SD depth per round
        plan = SplitScalarPlan(cost, G)
        ok = True
        for t, a in enumerate(actions):
            plan.prepare(*user_args(rnd, users, t))
            ok &= plan.apply(a)
        modes = np.array([decode(a)[0] for a in actions])
        depth = np.array([decode(a)[2] for a in actions])
        exact = check_plan_split(cost, users, rnd, modes, next(iter(sd_depths), 1), depth).feasible
        assert ok == exact, actions
        feasible_count += exact
    assert 0 < feasible_count


@pytest.mark.parametrize("seed", range(10))
def test_without_edges_the_v1_builder_is_v0s(models, seed):
    cost, split = models
    rng = np.random.default_rng(seed)
    rnd = round_of(20, 900 + seed, edge_fraction=0.0)
    users = ed_users(split, rnd, G)
    v0, v1 = ScalarPlan(cost, G), SplitScalarPlan(cost, G)
    for t in range(20):
        args = user_args(rnd, users, t)
        m0 = v0.prepare(*args[:5])
        m1 = v1.prepare(*args)
        assert m1[: 2 + G] == m0 and not any(m1[2 + G:])
        a = int(rng.choice(np.flatnonzero(m0)))
        assert v0.apply(a) == v1.apply(a)


def test_outcome_with_ed_meets_deadlines_when_realised_equals_predicted(models):
    cost, split = models
    for seed in range(20):
        rnd = round_of(10, 40 + seed)
        users = ed_users(split, rnd, G)
        plan = SplitScalarPlan(cost, G)
        modes, depth = np.zeros(10, dtype=np.int8), np.zeros(10, dtype=np.int64)
        for t in range(10):
            masks = plan.prepare(*user_args(rnd, users, t))
            a = max(np.flatnonzero(masks), key=lambda i: (decode(i)[0] == ED, i))  # prefer ED, then the deepest
            plan.apply(int(a))
            modes[t], depth[t] = decode(int(a))[0], decode(int(a))[2]
        rep = check_plan_split(cost, users, rnd, modes, max(plan.gamma, 1), depth)
        out = evaluate_split_plan(cost, split, rnd, Plan(modes, gamma=max(plan.gamma, 1), z=rep.z, lam=rep.lam, ed_depth=depth, ed_share=rep.ed_share))
        assert np.all(out.served[modes != REJECT])


@pytest.mark.parametrize("options", [{}, {"proactive": False}, {"interrupt": "immediate"}, {"bonus_match": 0.3}])
def test_ed_user_table_matches_the_closed_form_per_user(options):
    from envs.split_cost import SplitOptions

    split = SplitCostModel(load_profile(PROFILE), SplitOptions(**options))
    rnd = round_of(8, 77, edge_fraction=1.0)
    users = ed_users(split, rnd, G)
    for k in range(8):
        c_k = rnd.input_tokens[k] + rnd.output_tokens[k] / 2.0
        for g in range(1, G + 1):
            x = split.edge_iteration_s(float(rnd.alpha[k]), DraftTree.chain(g), c_k, float(rnd.rtt_s[k]), reused=False)
            assert users.edge_s[k, g - 1] == pytest.approx(x, rel=1e-12)


def test_scalar_and_array_batch_forms_agree(models):
    from envs.split_plan import ed_memory, ed_memory1, ed_time, ed_time1

    cost, _ = models
    for b, s, n, j, q, so in [(1, 10, 20, 5, 2, 20), (7, 300, 150, 40, 9, 600), (3, 1, 1, 1, 2, 3)]:
        assert ed_time1(cost, b, s, n, j, q) == float(ed_time(cost, b, s, n, j, q))
        assert ed_memory1(cost, b, s, n, so, q) == float(ed_memory(cost, b, s, n, so, q))
    assert ed_time1(cost, 0, 5, 5, 5, 2) == 0.0 == float(ed_time(cost, 0, 5, 5, 5, 2))


def constant_profile():
    """A split profile whose passes cost constants: target/draft 10 ms on the server, draft 2 ms on the edge."""
    from envs.profile import Profile
    from envs.split_profile import cpu_split_profile

    d = cpu_split_profile("cpu_specsched-pair")
    d.pop("engine", None)
    d.pop("calibration", None)
    flat = {"intercept_s": 0.01, "per_flop_s": 0.0, "per_byte_s": 0.0}
    d["latency"] = {"source": "linear", "llm": flat, "slm": flat}
    d["edge"]["latency"] = {"source": "table", "slm": {"b": [1], "q": [1], "c": [1], "tau_s": [[[0.002]]]}}
    d["network"] = {"rtt_ms": 20.0, "bandwidth_bytes_per_s": 1e6, "bytes_per_draft_token": 10, "bytes_per_reply_token": 5, "request_overhead_bytes": 0}
    return Profile.from_dict(d, name="constant")


def test_golden_literal_numbers_for_one_ed_user():
    p = constant_profile()
    cost, split = CostModel(p), SplitCostModel(p)
    rnd = round_of(1, 3, edge_fraction=1.0)
    rnd.input_tokens[:], rnd.output_tokens[:], rnd.alpha[:] = 100, 60, 0.5
    rnd.deadline_s[:], rnd.uplink_s[:], rnd.rtt_s[:] = 5.0, 0.1, 0.02
    users = ed_users(split, rnd, G)
    # E = (1 - 0.5^3) / 0.5 = 1.75, J = ceil(60 / 1.75) = 35; X = 2 x 2 ms + 20 ms + 3 x 15 B / 1 MB/s
    assert users.iterations[0, 1] == 35
    assert users.edge_s[0, 1] == pytest.approx(0.024045, rel=1e-12)
    assert users.prefill_s[0] == pytest.approx(0.002)
    rep = check_plan_split(cost, users, rnd, [ED], gamma=1, ed_depth=[2])
    assert rep.ed_time_s == pytest.approx(0.36, rel=1e-12)  # prefill 10 ms + 35 verify passes of 10 ms
    assert rep.ed_share_min == pytest.approx(0.36 / (5.0 - 0.1 - 0.002 - 35 * 0.024045), rel=1e-12)
    assert rep.ed_memory_bytes == pytest.approx((100 + 3 + 60) * p.kv_llm_bytes)
    # a second identical user at depth 4: q = 5 for both, J = ceil(60 / 1.9375) = 31 < 35, X = 8 ms + 20 ms + 5 x 15 B / 1 MB/s
    rnd2 = round_of(2, 3, edge_fraction=1.0)
    rnd2.input_tokens[:], rnd2.output_tokens[:], rnd2.alpha[:] = 100, 60, 0.5
    rnd2.deadline_s[:], rnd2.uplink_s[:], rnd2.rtt_s[:] = 5.0, 0.1, 0.02
    users2 = ed_users(split, rnd2, G)
    rep2 = check_plan_split(cost, users2, rnd2, [ED, ED], gamma=1, ed_depth=[2, 4])
    x = max(0.024045, 0.008 + 0.02 + 75e-6)
    assert rep2.ed_time_s == pytest.approx(0.36, rel=1e-12)  # J = max(35, 31) = 35
    assert rep2.ed_share_min == pytest.approx(0.36 / (5.0 - 0.1 - 0.002 - 35 * x), rel=1e-12)
    assert rep2.ed_memory_bytes == pytest.approx((2 * (100 + 5) + 120) * p.kv_llm_bytes)


def test_bad_depths_are_named(models):
    cost, split = models
    rnd = round_of(2, 5, edge_fraction=1.0)
    with pytest.raises(ValueError, match="max_gamma"):
        ed_users(split, rnd, 0)
    users = ed_users(split, rnd, G)
    with pytest.raises(ValueError, match="ed_depth"):
        check_plan_split(cost, users, rnd, [ED, REJECT], 1, [G + 1, 0])


def _two_plan_reference(cost, rnd, plan, rng, simulate_acceptance, completion="batch"):
    """AD and SD latencies of a plan with ED users as evaluate_split_plan first computed them: an
    AD-only plan at share z and an SD-only plan at 1 - z - ed_share through envs.outcome.evaluate_plan
    (fixed sharing, the given completion)."""
    from envs.outcome import evaluate_plan

    modes = plan.modes
    a = evaluate_plan(cost, rnd, Plan(np.where(modes == AD, AD, REJECT), gamma=plan.gamma, z=plan.z), rng=rng, simulate_acceptance=simulate_acceptance,
                      completion=completion)
    s = evaluate_plan(cost, rnd, Plan(np.where(modes == SD, SD, REJECT), gamma=plan.gamma, z=plan.z + plan.ed_share), rng=rng,
                      simulate_acceptance=simulate_acceptance, completion=completion)
    return np.where(modes == AD, a.latency_s, np.where(modes == SD, s.latency_s, np.inf)), a.ad_batch_s, s.sd_batch_s


@pytest.mark.parametrize("completion", ["batch", "own"])
@pytest.mark.parametrize("simulate_acceptance", [False, True])
def test_ed_outcome_ad_and_sd_batches_equal_two_evaluate_plan_calls(models, simulate_acceptance, completion):
    """The fixed-share AD/SD latencies of plans with ED users equal evaluate_plan's on AD-only and
    SD-only plans bit for bit (prediction error on, empty batches and zero shares included), with
    every user ending at its batch's end and at its own last token; ED users follow ed_completion alone."""
    cost, split = models
    cfg = EnvConfig(num_users=14, profile=PROFILE, edge_fraction=0.7, max_gamma=G, output_cv=0.4, alpha_cv=0.2, deadline_s=[0.5, 8.0])
    rng = np.random.default_rng(0)
    checked = 0
    for seed in range(60):
        rnd = sample_round(np.random.default_rng(seed), cfg)
        modes = rng.choice([REJECT, AD, SD, ED], size=14, p=[0.1, 0.3 * (seed % 3 != 0), 0.6 - 0.3 * (seed % 3 != 0), 0.3]).astype(np.int8)
        modes[rng.integers(14)] = ED
        depth = np.where(modes == ED, rng.integers(1, G + 1, size=14), 0)
        z, ed_share = [(0.0, 0.5), (0.4, 0.0), (0.3, 0.7)][seed % 3] if seed % 4 == 0 else tuple(rng.dirichlet([1.0, 1.0, 1.0])[:2])
        plan = Plan(modes, gamma=int(rng.integers(1, G + 1)), z=float(z), lam=0.5, ed_depth=depth, ed_share=float(ed_share))
        got = evaluate_split_plan(cost, split, rnd, plan, rng=np.random.default_rng(seed), simulate_acceptance=simulate_acceptance, completion=completion)
        want, ad_s, sd_s = _two_plan_reference(cost, rnd, plan, np.random.default_rng(seed), simulate_acceptance, completion)
        non_ed = modes != ED
        assert got.latency_s[non_ed].tobytes() == want[non_ed].tobytes(), seed
        assert (got.ad_batch_s, got.sd_batch_s) == (ad_s, sd_s), seed
        batch = evaluate_split_plan(cost, split, rnd, plan, rng=np.random.default_rng(seed), simulate_acceptance=simulate_acceptance)
        assert got.latency_s[~non_ed].tobytes() == batch.latency_s[~non_ed].tobytes(), seed  # completion leaves ED users alone
        if completion == "own":  # nobody ends later than its batch
            assert np.all(got.latency_s[non_ed] <= batch.latency_s[non_ed]), seed
        checked += 1
    assert checked == 60


# ----------------------------------------------------------------- the scalar builder's speed paths
@pytest.mark.parametrize("profile,verify_eff", [(PROFILE, None), (PROFILE, 0.4), ("split_cpu_specsched-pair", None),
                                                ("split_a100-40gb_qwen3-14b_qwen3-1.7b_timed", 0.7)])
def test_sd_parts_all1_equals_sd_parts1_at_every_depth(profile, verify_eff):
    """sd_parts_all1 (every depth at once, shared passes priced once) gives sd_parts1's floats bit for
    bit -- with a table/roofline latency, a measured engine overhead and a non-overlapped verify."""
    from envs.model_choices import ModelChoices

    cost = CostModel(load_profile(profile), "per_user", ModelChoices(verify_flops_efficiency=verify_eff))
    rng = np.random.default_rng(7)
    points = [(1, 0, 0), (1, 1, 1), (64, 1000, 1000)] + [tuple(int(x) for x in rng.integers([1, 0, 0], [65, 2001, 2001])) for _ in range(60)]
    for b, s, n in points:
        parts = cost.sd_parts_all1(b, s, n, 9)
        assert len(parts) == 10
        for g in range(1, 10):
            pre, it = cost.sd_parts1(b, s, n, g)
            assert (parts[0], parts[g]) == (pre, it), (b, s, n, g)


@pytest.mark.parametrize("seed", range(6))
def test_scalar_builder_equals_exact_when_memory_and_deadlines_bind(seed):
    """The scalar builder's shortcuts (ED depths checked budget-first, the depth loop ended at the first
    depth whose KV does not fit, every SD depth priced together before the round's depth is fixed)
    against the exact check, on rounds where the KV budget and the deadlines bind: every action's mask,
    along random admissions, and the shares of the final plan."""
    p = load_profile(PROFILE)
    k = 14
    rnd = round_of(k, 3000 + seed, edge_fraction=0.8)
    rng = np.random.default_rng(seed)
    # a KV budget of a few users' worth (memory binds for ED's deeper q and for SD), tight deadlines
    kv_user = (int(rnd.input_tokens.max()) + int(rnd.output_tokens.mean()) + G + 1) * CostModel(p).kv_l
    cost = CostModel(p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + (2.5 + seed) * kv_user))
    split = SplitCostModel(p)
    rnd.deadline_s[:] = rng.uniform(0.3, 3.0, size=k)  # slack_s follows (deadline - downlink)
    users = ed_users(split, rnd, G)
    plan = SplitScalarPlan(cost, G)
    modes, depth = np.zeros(k, dtype=np.int8), np.zeros(k, dtype=np.int64)
    gamma, blocked = 0, 0
    for t in range(k):
        masks = plan.prepare(*user_args(rnd, users, t))
        for a in range(1, 2 + 2 * G):
            mode, g_sd, g_ed = decode(a)
            if mode == SD and gamma and g_sd != gamma:
                assert not masks[a]
                continue
            m, d = modes.copy(), depth.copy()
            m[t], d[t] = mode, g_ed
            exact = check_plan_split(cost, users, rnd, m, (gamma or g_sd or 1), d).feasible
            assert masks[a] == exact, (t, a)
            blocked += not exact
        a = int(rng.choice(np.flatnonzero(masks)))
        assert plan.apply(a)
        mode, g_sd, g_ed = decode(a)
        modes[t], depth[t] = mode, g_ed
        gamma = gamma or g_sd
    assert blocked > 0  # the round did bind
    rep = check_plan_split(cost, users, rnd, modes, max(gamma, 1), depth)
    assert rep.feasible
    assert plan.share == [rep.ad_share_min, rep.sd_share_min, rep.ed_share_min]
    assert plan.mem == [rep.ad_memory_bytes, rep.sd_memory_bytes, rep.ed_memory_bytes]


@pytest.mark.parametrize("seed", range(4))
def test_scalar_builder_ed_depths_at_the_exact_kv_limit(seed):
    """The KV budget is set to exactly what the plan needs with the candidate ED at depth ``g_cut``:
    the builder must allow ED at every depth up to ``g_cut`` and no deeper (where the exact check
    says so), i.e. its depth loop stops at the right depth -- an adversarial round for the shortcut."""
    p = load_profile(PROFILE)
    rnd = round_of(6, 4000 + seed, edge_fraction=1.0)
    rnd.deadline_s[:] = 60.0  # compute never binds: memory decides
    users = ed_users(SplitCostModel(p), rnd, G)
    assert users.allowed.all()
    before = [(1, 0), (1 + G + 1, 1), (1 + G + 2, 2)]  # (action, ED depth): AD, ED@1, ED@2 for users 0..2
    t = len(before)
    modes = np.array([AD, ED, ED, REJECT, REJECT, REJECT], dtype=np.int8)
    depth = np.array([0, 1, 2, 0, 0, 0])
    for g_cut in range(1, G):
        m, d = modes.copy(), depth.copy()
        m[t], d[t] = ED, g_cut
        rep = check_plan_split(CostModel(p), users, rnd, m, 1, d)
        need = rep.ad_memory_bytes + rep.sd_memory_bytes + rep.ed_memory_bytes
        cost = CostModel(p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + need))
        plan = SplitScalarPlan(cost, G)
        for u, (a, _) in enumerate(before):
            plan.prepare(*user_args(rnd, users, u))
            assert plan.apply(a)
        masks = plan.prepare(*user_args(rnd, users, t))
        for g in range(1, G + 1):
            m[t], d[t] = ED, g
            assert masks[1 + G + g] == check_plan_split(cost, users, rnd, m, 1, d).feasible == (g <= max(g_cut, 2)), (g_cut, g)
