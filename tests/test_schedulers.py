"""Invariants across schedulers on random rounds."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.balance import Balance, BalanceGammaSearch
from agents.optimal import Exhaustive, Optimal, split_upper_bound
from agents.registry import SCHEDULERS, make_scheduler
from envs import CostModel, EnvConfig, check_plan, sample_round
from envs.feasibility import shares_respected

CFGS = {k: EnvConfig(num_users=k) for k in (6, 8, 10, 12)}
COSTS = {k: CostModel.from_config(c) for k, c in CFGS.items()}
# a memory-tight variant where the AD/SD trade-off binds
TIGHT = EnvConfig(num_users=10, input_tokens=[200, 600], output_tokens=[20, 200], deadline_s=[2.0, 13.0])
TIGHT_COST = CostModel.from_config(TIGHT)


def _round(k, seed, tight=False):
    cfg = TIGHT if tight else CFGS[k]
    return cfg, (TIGHT_COST if tight else COSTS[k]), sample_round(np.random.default_rng(seed), cfg)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), k=st.sampled_from([6, 8, 10]), tight=st.booleans())
def test_every_plan_is_feasible_and_shares_valid(seed, k, tight):
    cfg, cost, rnd = _round(k, seed, tight)
    for name in SCHEDULERS:
        plan = make_scheduler(name, cost, cfg, seed=seed).plan(rnd)
        assert check_plan(cost, rnd, plan).feasible, name
        assert shares_respected(cost, rnd, plan), name
        assert plan.decision_s >= 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), k=st.sampled_from([6, 8, 10]), tight=st.booleans())
def test_ordering_invariants(seed, k, tight):
    cfg, cost, rnd = _round(k, seed, tight)
    n = {name: make_scheduler(name, cost, cfg).plan(rnd).admitted for name in ("balance", "ad_only", "sd_only", "ecra", "ema", "ecrma", "exhaustive", "greedy", "random")}
    opt = n["exhaustive"]
    assert opt >= n["balance"] >= max(n["ad_only"], n["sd_only"])
    assert n["balance"] >= max(n["ecra"], n["ema"], n["ecrma"])
    assert 2 * n["balance"] >= opt
    for name in n:
        assert n[name] <= opt, name
    assert split_upper_bound(cost, rnd, 4) >= opt


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), tight=st.booleans())
def test_exhaustive_and_branch_and_bound_agree(seed, tight):
    cfg, cost, rnd = _round(12, seed, tight)
    if tight:
        cfg = cfg.replace(num_users=10)
    ex = Exhaustive(cost, cfg, warm_start=False).plan(rnd)
    bb = Optimal(cost, cfg, time_limit_s=30).plan(rnd)
    assert bb.extra["optimal"]
    assert ex.admitted == bb.admitted == bb.extra["upper_bound"]


def test_gamma_search_never_worse():
    cfg, cost, rnd = _round(10, 3, tight=True)
    assert BalanceGammaSearch(cost, cfg).plan(rnd).admitted >= Balance(cost, cfg).plan(rnd).admitted


def test_same_seed_same_plan():
    cfg, cost, rnd = _round(12, 7)
    for name in ("balance", "random", "greedy", "optimal"):
        a = make_scheduler(name, cost, cfg, seed=1).plan(rnd)
        b = make_scheduler(name, cost, cfg, seed=1).plan(rnd)
        assert np.array_equal(a.modes, b.modes) and a.z == b.z and a.lam == b.lam and a.gamma == b.gamma


def test_exhaustive_refuses_large_rounds():
    cfg = EnvConfig(num_users=20)
    cost = CostModel.from_config(cfg)
    with pytest.raises(ValueError, match="num_users <= 16"):
        Exhaustive(cost, cfg).plan(sample_round(np.random.default_rng(0), cfg))


def test_unknown_scheduler_named():
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        make_scheduler("nope", COSTS[6], CFGS[6])


def test_optimal_reports_gap_under_time_limit():
    cfg = EnvConfig(num_users=50)
    cost = CostModel.from_config(cfg)
    rnd = sample_round(np.random.default_rng(2), cfg)
    plan = Optimal(cost, cfg, time_limit_s=0.5).plan(rnd)
    assert plan.extra["upper_bound"] >= plan.admitted
    assert plan.extra["gap"] == plan.extra["upper_bound"] - plan.admitted
