"""Properties of the exact feasibility check, the incremental builder and the outcome."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import AD, SD, CostModel, EnvConfig, Plan, check_plans, evaluate_plan, sample_round
from envs.feasibility import (
    PlanBuilder,
    expected_tokens_per_iteration,
    sd_iterations,
    shares_respected,
)
from envs.outcome import simulate_sd_iterations

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
    assert COST.memory_budget(True) < COST.memory_budget(False)


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
    for p in range(20):
        one = check_plans(COST, rnd, plans[p], 3)
        assert bool(one.feasible) == bool(many.feasible[p])
        assert np.isclose(float(one.ad_share_min), float(many.ad_share_min[p])) or np.isinf(float(one.ad_share_min))


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
    assert abs(tokens_per_iter - expected_tokens_per_iteration(alpha, gamma)) < 0.1


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
