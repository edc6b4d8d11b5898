"""Properties of the exact feasibility check, the incremental builder and the outcome."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import AD, SD, CostModel, EnvConfig, Plan, check_plans, evaluate_plan, sample_round
from envs.cost_model import expected_tokens_per_iteration, sd_iterations
from envs.feasibility import shares_respected
from envs.outcome import simulate_sd_iterations
from envs.plan_builder import PlanBuilder

CFG = EnvConfig(num_users=10)
COST = CostModel.from_config(CFG)


def random_feasible_plan(rng, rnd, cost=COST, gamma=None):
    """Greedy random: users in random order, each to a random feasible mode."""
    gamma = gamma or int(rng.integers(1, 9))
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    for k in rng.permutation(rnd.num_users):
        for m in rng.permutation([AD, SD, 0]):
            if m == 0:
                break
            trial = modes.copy()
            trial[k] = m
            if check_plans(cost, rnd, trial, gamma).feasible:
                modes = trial
                break
    return modes, gamma


def test_expected_tokens_table():
    # specdecode.md: alpha 0.8, k 4 -> 3.36; alpha 0.9, k 8 -> 6.13
    assert np.isclose(expected_tokens_per_iteration(0.8, 4), 3.3616, atol=1e-3)
    assert np.isclose(expected_tokens_per_iteration(0.9, 8), 6.126, atol=1e-2)
    assert expected_tokens_per_iteration(1.0, 4) == 5
    assert sd_iterations(10, 0.8, 4) == 3


def test_empty_plan_feasible_and_memory_budget():
    rnd = sample_round(np.random.default_rng(0), CFG)
    rep = check_plans(COST, rnd, np.zeros(10), 4)
    assert rep.feasible
    assert float(rep.ad_time_s) == float(rep.sd_time_s) == 0.0 and float(rep.ad_memory_bytes) == float(rep.sd_memory_bytes) == 0.0
    assert (float(rep.z), float(rep.lam)) == (1.0, 1.0)  # nothing admitted: AD keeps everything
    assert sd_iterations(np.array([10, 3]), 0.8, 4).dtype == np.int64
    with pytest.raises(ValueError, match="kv_memory must be 'per_user' or 'padded', got 'paged'"):
        CostModel(COST.profile, "paged")
    # a budget of exactly 0 bytes still holds the empty plan
    p0 = COST.profile
    zero = CostModel(p0.with_memory(p0.device.reserve_bytes + p0.llm.weight_bytes))
    assert float(zero.memory_budget(False)) == 0.0 and bool(check_plans(zero, rnd, np.zeros(10), 4).feasible)
    # the SLM's weights are the whole difference (budgets: Q - reserve - W_L [- W_S])
    p = COST.profile
    assert float(COST.memory_budget(False)) == p.device.memory_bytes - p.device.reserve_bytes - p.llm.weight_bytes
    assert float(COST.memory_budget(False) - COST.memory_budget(True)) == p.slm.weight_bytes


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_removing_a_user_keeps_feasibility(seed):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    modes, gamma = random_feasible_plan(rng, rnd)
    assert check_plans(COST, rnd, modes, gamma).feasible
    for k in np.flatnonzero(modes):
        fewer = modes.copy()
        fewer[k] = 0
        assert check_plans(COST, rnd, fewer, gamma).feasible


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), more_mem=st.floats(1.0, 3.0), later=st.floats(0.0, 5.0))
def test_more_memory_or_later_deadlines_never_shrink_feasible_set(seed, more_mem, later):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    modes, gamma = random_feasible_plan(rng, rnd)
    bigger = CostModel(COST.profile.with_memory(COST.memory_bytes * more_mem))
    assert check_plans(bigger, rnd, modes, gamma).feasible
    rnd.deadline_s = rnd.deadline_s + later
    assert check_plans(COST, rnd, modes, gamma).feasible


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_many_plans_equal_one_at_a_time(seed):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    plans = rng.integers(0, 3, size=(20, 10))
    many = check_plans(COST, rnd, plans, 3)
    fields = ("feasible", "ad_time_s", "sd_time_s", "ad_share_min", "sd_share_min", "ad_memory_bytes", "sd_memory_bytes", "memory_budget_bytes", "z", "lam")
    for p in range(20):
        one = check_plans(COST, rnd, plans[p], 3)
        for f in fields:  # the same operations on the same numbers: equal, inf included
            assert np.array_equal(np.asarray(getattr(one, f)), np.asarray(getattr(many, f))[p]), (p, f)


def test_many_plans_with_their_own_depths():
    rnd = sample_round(np.random.default_rng(8), CFG)
    plans = np.random.default_rng(1).integers(0, 3, size=(3, 10))
    gammas = np.array([1, 4, 8])
    many = check_plans(COST, rnd, plans, gammas)
    for p in range(3):
        one = check_plans(COST, rnd, plans[p], int(gammas[p]))
        assert float(one.sd_time_s) == float(many.sd_time_s[p]) and bool(one.feasible) == bool(many.feasible[p])
    assert len(set(np.asarray(many.sd_time_s).tolist())) == 3  # the depths really differ


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_builder_masks_are_exact(seed):
    """An action is unmasked iff the extended plan passes the full check."""
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    g_max = 8
    b = PlanBuilder(COST, 1, g_max)
    modes = np.zeros(10, dtype=np.int8)
    gamma = 0
    for k in range(10):
        masks = b.prepare(rnd.input_tokens[k : k + 1], rnd.output_tokens[k : k + 1], rnd.alpha[k : k + 1], rnd.uplink_s[k : k + 1], rnd.slack_s[k : k + 1])[0]
        assert masks[0]
        for a in range(1, 2 + g_max):
            trial = modes.copy()
            trial[k] = AD if a == 1 else SD
            g = a - 1 if a >= 2 else (gamma or 4)
            expect = bool(check_plans(COST, rnd, trial, g).feasible)
            if a >= 2 and gamma and g != gamma:
                expect = False
            assert masks[a] == expect, (k, a, gamma)
        choice = int(rng.choice(np.flatnonzero(masks)))
        valid = b.apply(np.array([choice]))
        assert valid[0]
        if choice == 1:
            modes[k] = AD
        elif choice >= 2:
            modes[k] = SD
            gamma = gamma or choice - 1
        z, lam = b.shares()
        plan = Plan(modes, gamma=gamma or 1, z=float(z[0]), lam=float(lam[0]))
        assert shares_respected(COST, rnd, plan)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_feasible_plan_serves_everyone_when_predictions_exact(seed):
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, CFG)
    modes, gamma = random_feasible_plan(rng, rnd)
    rep = check_plans(COST, rnd, modes, gamma)
    plan = Plan(modes, gamma=gamma, z=float(rep.z), lam=float(rep.lam))
    assert shares_respected(COST, rnd, plan)
    out = evaluate_plan(COST, rnd, plan)
    assert out.served_count == plan.admitted
    assert np.all(np.isinf(out.latency_s[modes == 0]))


def test_prediction_error_can_make_users_late():
    cfg = EnvConfig(num_users=30, output_cv=0.3, alpha_cv=0.3)
    cost = CostModel.from_config(cfg)
    late = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        rnd = sample_round(rng, cfg)
        assert not np.array_equal(rnd.realized_output_tokens, rnd.output_tokens)
        modes, gamma = random_feasible_plan(rng, rnd, cost)
        rep = check_plans(cost, rnd, modes, gamma)
        out = evaluate_plan(cost, rnd, Plan(modes, gamma, float(rep.z), float(rep.lam)))
        late += int(np.count_nonzero(modes)) - out.served_count
    assert late > 0


def test_simulated_acceptance_matches_expectation():
    rng = np.random.default_rng(0)
    alpha, gamma, out = 0.8, 4, 400
    j = simulate_sd_iterations(rng, np.full(2000, out), np.full(2000, alpha), gamma)
    tokens_per_iter = out / j.mean()
    # 2000 users x ~119 iterations: the mean is within 1 % (the last iteration's ceil biases it ~0.4 %)
    assert abs(tokens_per_iter / expected_tokens_per_iteration(alpha, gamma) - 1) < 0.01
    assert j.min() >= np.ceil(out / (gamma + 1))  # never more than gamma + 1 tokens per iteration


def test_same_seed_same_round():
    a = sample_round(np.random.default_rng(5), EnvConfig(num_users=7, output_cv=0.2))
    b = sample_round(np.random.default_rng(5), EnvConfig(num_users=7, output_cv=0.2))
    c = sample_round(np.random.default_rng(5), EnvConfig(num_users=7))
    assert np.array_equal(a.realized_output_tokens, b.realized_output_tokens)
    # common random numbers: the users are the same whatever the error setting
    assert np.array_equal(a.input_tokens, c.input_tokens) and np.array_equal(a.deadline_s, c.deadline_s)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_outcome_switches_only_make_users_finish_earlier(seed):
    """'own' completion and work-conserving sharing never delay a user, and work is conserved."""
    cfg = EnvConfig(num_users=10, output_cv=0.3, alpha_cv=0.2)
    cost = CostModel.from_config(cfg)
    rng = np.random.default_rng(seed)
    rnd = sample_round(rng, cfg)
    modes, gamma = random_feasible_plan(rng, rnd, cost)
    rep = check_plans(cost, rnd, modes, gamma)
    plan = Plan(modes, gamma, float(rep.z), float(rep.lam))
    paper = evaluate_plan(cost, rnd, plan)
    admitted = modes != 0
    for completion in ("batch", "own"):
        for sharing in ("fixed", "work_conserving"):
            out = evaluate_plan(cost, rnd, plan, completion=completion, sharing=sharing)
            assert np.all(out.latency_s[admitted] <= paper.latency_s[admitted] * (1 + 1e-12))
            assert np.all(np.isinf(out.latency_s[~admitted]))
            assert out.served_count >= paper.served_count
    both = evaluate_plan(cost, rnd, plan, sharing="work_conserving")
    if (modes == AD).any() and (modes == SD).any():
        # the batch that ends last has had the device for all the work of both
        c_a, c_s = paper.ad_batch_s * plan.z, paper.sd_batch_s * (1 - plan.z)
        assert np.isclose(max(both.ad_batch_s, both.sd_batch_s), c_a + c_s)
        assert np.isclose(min(both.ad_batch_s, both.sd_batch_s), min(paper.ad_batch_s, paper.sd_batch_s))


def test_own_completion_finishes_short_outputs_first():
    rnd = sample_round(np.random.default_rng(3), CFG)
    plan = Plan(np.full(10, AD, dtype=np.int8), gamma=4, z=1.0, lam=1.0)
    out = evaluate_plan(COST, rnd, plan, completion="own")
    finish = out.latency_s - rnd.uplink_s.max() - rnd.realized_downlink_s
    order = np.argsort(rnd.output_tokens, kind="stable")
    assert np.all(np.diff(finish[order]) >= -1e-12)
    longest = np.argmax(rnd.output_tokens)
    assert np.isclose(finish[longest], out.ad_batch_s)
    with pytest.raises(ValueError, match="completion"):
        evaluate_plan(COST, rnd, plan, completion="first")


# ------------------------------------------------------------------ outcome edge cases (found by mutation testing)
def _one_each_round():
    rnd = sample_round(np.random.default_rng(4), CFG)
    modes = np.zeros(10, dtype=np.int8)
    modes[:2] = AD
    modes[2:4] = SD
    return rnd, modes


@pytest.mark.parametrize("sharing", ["fixed", "work_conserving"])
@pytest.mark.parametrize("z", [0.0, 1.0])
def test_zero_share_means_never_served_without_numpy_warnings(sharing, z):
    """A mode given no compute never finishes (inf latency), quietly: no division by zero."""
    import warnings

    rnd, modes = _one_each_round()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = evaluate_plan(COST, rnd, Plan(modes, gamma=4, z=z, lam=0.5), sharing=sharing)
    starved = AD if z == 0.0 else SD
    assert np.isinf(out.latency_s[modes == starved]).all() and not out.served[modes == starved].any()
    assert np.isfinite(out.latency_s[(modes != starved) & (modes != 0)]).all()


def test_empty_mode_has_zero_batch_time():
    rnd, _ = _one_each_round()
    ad_only = evaluate_plan(COST, rnd, Plan(np.array([AD] + [0] * 9, dtype=np.int8), gamma=4, z=1.0, lam=1.0))
    sd_only = evaluate_plan(COST, rnd, Plan(np.array([SD] + [0] * 9, dtype=np.int8), gamma=4, z=0.0, lam=0.0))
    assert ad_only.sd_batch_s == 0.0 and ad_only.ad_batch_s > 0
    assert sd_only.ad_batch_s == 0.0 and sd_only.sd_batch_s > 0


def test_batch_completion_makes_every_sd_user_wait_for_the_batch():
    """completion='batch': users with fewer SD iterations still finish at the batch's end."""
    rnd = sample_round(np.random.default_rng(6), CFG)
    plan = Plan(np.full(10, SD, dtype=np.int8), gamma=4, z=0.0, lam=0.0)
    out = evaluate_plan(COST, rnd, plan)
    finish = out.latency_s - rnd.uplink_s.max() - rnd.realized_downlink_s
    assert np.allclose(finish, out.sd_batch_s, rtol=1e-12)
    own = evaluate_plan(COST, rnd, plan, completion="own")
    assert (own.latency_s < out.latency_s - 1e-12).any()  # some users need fewer iterations


def test_latency_exactly_at_the_deadline_is_served():
    rnd = sample_round(np.random.default_rng(2), CFG)
    plan = Plan(np.array([AD] + [0] * 9, dtype=np.int8), gamma=4, z=1.0, lam=1.0)
    latency = evaluate_plan(COST, rnd, plan).latency_s[0]
    # the largest deadline whose tolerant bound deadline * (1 + 1e-9) equals the latency bit for bit
    d = latency / (1 + 1e-9)
    for _ in range(8):
        if d * (1 + 1e-9) == latency:
            break
        d = np.nextafter(d, np.inf if d * (1 + 1e-9) < latency else -np.inf)
    assert d * (1 + 1e-9) == latency
    rnd.deadline_s = rnd.deadline_s.copy()
    rnd.deadline_s[0] = d
    assert evaluate_plan(COST, rnd, plan).served[0]
    rnd.deadline_s[0] = np.nextafter(d, -np.inf) / (1 + 1e-8)
    assert not evaluate_plan(COST, rnd, plan).served[0]


def test_simulated_acceptance_reaches_evaluate_plan():
    """simulate_acceptance draws the SD iterations: acceptance 0 means one token per iteration."""
    rnd = sample_round(np.random.default_rng(3), CFG)
    rnd.realized_alpha = np.zeros(10)
    plan = Plan(np.array([SD, SD] + [0] * 8, dtype=np.int8), gamma=4, z=0.0, lam=0.0)
    drawn = evaluate_plan(COST, rnd, plan, rng=np.random.default_rng(0), simulate_acceptance=True)
    n = int(rnd.output_tokens[:2].max())
    want = float(COST.sd_time(2, int(rnd.input_tokens[:2].max()), n, n, 4))  # J = O at alpha 0
    assert drawn.sd_batch_s == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match=r"^simulate_acceptance needs an rng$"):
        evaluate_plan(COST, rnd, plan, simulate_acceptance=True)


def test_simulate_sd_iterations_tolerates_rounding_and_keeps_int_dtype():
    rng = np.random.default_rng(0)
    # an acceptance a hair below 0 (rounding) is 0; the result is integral even when empty
    assert simulate_sd_iterations(rng, [6, 2], [-1e-12, -1e-12], 3).tolist() == [6, 2]
    assert simulate_sd_iterations(rng, np.zeros(0, dtype=np.int64), np.zeros(0), 3).dtype == np.int64
    assert simulate_sd_iterations(rng, [6], [0.5], 3).dtype == np.int64


def test_candidate_shares_are_the_shares_apply_commits(cfg12, cost12):
    """PlanBuilder.candidate_shares(): the batch share a prepared user would bring, per mode and
    depth -- exactly what the builder's share becomes once the action is applied."""
    rnd = sample_round(np.random.default_rng(3), cfg12)
    b = PlanBuilder(cost12, 2, cfg12.max_gamma)
    with pytest.raises(RuntimeError, match="before prepare"):
        b.candidate_shares()
    user = [np.repeat(np.asarray(x[:1]), 2) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)]
    masks = b.prepare(*user)
    ad, sd = b.candidate_shares()
    assert ad.shape == (2,) and sd.shape == (2, cfg12.max_gamma) and masks[:, 1].all() and masks[1, 3]
    b.apply(np.array([1, 3]))  # round 0: AD; round 1: SD at depth 2
    assert b.share[0, 0] == ad[0] and b.share[1, 1] == sd[1, 1]
