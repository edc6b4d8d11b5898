"""Invariants across schedulers, against a brute-force optimum over all 3^K plans.

The per-mode solves (``ad_only``, ``sd_only``, each split baseline's AD and SD sets) are held to
brute force in ``test_mode_solver.py``; here every scheduler's plan must be feasible with its own
shares, the searches that claim the optimum (``exhaustive``, ``optimal``) must equal the best of all
3^K plans, and every upper bound must be at least that. Small K keeps the default run fast; the
larger-K agreement runs under ``-m slow``.
"""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.balance import Balance, BalanceGammaSearch, grid
from agents.optimal import Exhaustive, Optimal, split_upper_bound
from agents.registry import SCHEDULERS, make_scheduler
from envs import AD, SD, CostModel, EnvConfig, check_plan, check_plans, sample_round
from envs.feasibility import shares_respected

GAMMA = 4
CFGS = {k: EnvConfig(num_users=k) for k in (5, 6, 8, 12)}
COSTS = {k: CostModel.from_config(c) for k, c in CFGS.items()}


def _tight_cfg(k: int) -> EnvConfig:
    """Long prompts and a KV budget (SLM loaded) of 1,000 LLM tokens: memory binds in most rounds.

    (The old "tight" config used <= 47 % of the budget with every user admitted: it never bound.)
    """
    base = CostModel.from_config(EnvConfig(num_users=k))
    p = base.profile
    mem = p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + 1000 * base.kv_l
    return EnvConfig(num_users=k, input_tokens=[600, 1000], output_tokens=[20, 200], deadline_s=[2.0, 13.0], memory_bytes=mem)


TIGHT = {k: _tight_cfg(k) for k in (5, 6, 8)}
TIGHT_COSTS = {k: CostModel.from_config(c) for k, c in TIGHT.items()}
HEAVY = ("exhaustive", "optimal")  # exact searches: run at small K only
SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _round(k, seed, tight=False):
    cfg, cost = (TIGHT[k], TIGHT_COSTS[k]) if tight else (CFGS[k], COSTS[k])
    return cfg, cost, sample_round(np.random.default_rng(seed), cfg)


def brute_force(cost, rnd, gamma=GAMMA, modes=(0, AD, SD)) -> int:
    """The most users any plan with modes from ``modes`` serves: all |modes|^K plans, one exact check."""
    plans = np.array(list(itertools.product(modes, repeat=rnd.num_users)), dtype=np.int8)
    ok = check_plans(cost, rnd, plans, gamma).feasible
    return int(np.count_nonzero(plans[ok], axis=1).max())


def test_tight_config_binds_on_memory():
    """Relaxing only the memory of TIGHT serves strictly more users in most rounds."""
    cfg = TIGHT[6]
    roomy = CostModel(TIGHT_COSTS[6].profile.with_memory(TIGHT_COSTS[6].memory_bytes * 20))
    gains = 0
    for seed in range(8):
        rnd = sample_round(np.random.default_rng(seed), cfg)
        for mode in (AD, SD):  # admitting everyone cannot fit in either mode, even with the whole GPU
            rep = check_plans(TIGHT_COSTS[6], rnd, np.full(6, mode, dtype=np.int8), GAMMA)
            assert float(rep.ad_memory_bytes + rep.sd_memory_bytes) > float(rep.memory_budget_bytes)
        gains += brute_force(roomy, rnd) > brute_force(TIGHT_COSTS[6], rnd)
    assert gains >= 5


@SETTINGS
@given(seed=st.integers(0, 10**6), k=st.sampled_from([5, 6, 8]), tight=st.booleans())
def test_every_plan_is_feasible_and_shares_valid(seed, k, tight):
    cfg, cost, rnd = _round(k, seed, tight)
    for name in SCHEDULERS:
        if name in HEAVY and k > 6:
            continue
        plan = make_scheduler(name, cost, cfg.max_gamma, draft_depth=GAMMA, seed=seed).plan(rnd)
        assert plan.modes.shape == (k,) and set(np.unique(plan.modes)) <= {0, AD, SD}, name
        assert 1 <= plan.gamma <= cfg.max_gamma, name
        assert 0.0 <= plan.z <= 1.0 and 0.0 <= plan.lam <= 1.0, name
        assert check_plan(cost, rnd, plan).feasible, name
        assert shares_respected(cost, rnd, plan), name
        assert plan.decision_s > 0, name


@SETTINGS
@given(seed=st.integers(0, 10**6), k=st.sampled_from([5, 6]), tight=st.booleans())
def test_exact_searches_equal_brute_force_and_bounds_dominate(seed, k, tight):
    cfg, cost, rnd = _round(k, seed, tight)
    opt = brute_force(cost, rnd)
    n = {name: make_scheduler(name, cost, cfg.max_gamma, draft_depth=GAMMA, seed=seed).plan(rnd) for name in ("balance", "ad_only", "sd_only", "ecra", "ema", "ecrma", "greedy", "random", "exhaustive", "optimal")}
    count = {name: p.admitted for name, p in n.items()}
    assert count["exhaustive"] == opt
    assert count["optimal"] == opt and n["optimal"].extra["optimal"] and n["optimal"].extra["upper_bound"] == opt
    assert n["optimal"].extra["gap"] == 0
    assert split_upper_bound(cost, rnd, GAMMA, step=0.05) >= opt  # any grid gives a valid bound
    for name, c in count.items():
        assert c <= opt, name
    assert count["balance"] >= max(count["ad_only"], count["sd_only"], count["ecra"], count["ema"], count["ecrma"])
    assert 2 * count["balance"] >= opt
    # the single-mode baselines are exact single-mode optima (every plan with modes {reject, m})
    assert count["ad_only"] == brute_force(cost, rnd, modes=(0, AD))
    assert count["sd_only"] == brute_force(cost, rnd, modes=(0, SD))


@pytest.mark.slow
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), tight=st.booleans())
def test_exhaustive_and_optimal_agree_at_k12(seed, tight):
    cfg, cost, rnd = _round(12, seed) if not tight else (TIGHT[8], TIGHT_COSTS[8], sample_round(np.random.default_rng(seed), TIGHT[8]))
    ex = Exhaustive(cost, cfg.max_gamma, draft_depth=GAMMA, warm_start=False).plan(rnd)
    bb = Optimal(cost, cfg.max_gamma, draft_depth=GAMMA, time_limit_s=30).plan(rnd)
    assert bb.extra["optimal"]
    assert ex.admitted == bb.admitted == bb.extra["upper_bound"]


def test_gamma_search_is_the_best_fixed_gamma():
    cfg, cost, rnd = _round(6, 3, tight=True)
    per_gamma = [Balance(cost, cfg.max_gamma, draft_depth=g).plan(rnd).admitted for g in range(1, cfg.max_gamma + 1)]
    best = BalanceGammaSearch(cost, cfg.max_gamma).plan(rnd)
    assert best.admitted == max(per_gamma)
    assert per_gamma[best.gamma - 1] == best.admitted  # the plan's own depth achieves it


def test_same_seed_same_plan():
    cfg, cost, rnd = _round(8, 7)
    for name in ("balance", "random", "greedy", "optimal"):
        a = make_scheduler(name, cost, cfg.max_gamma, seed=1).plan(rnd)
        b = make_scheduler(name, cost, cfg.max_gamma, seed=1).plan(rnd)
        assert np.array_equal(a.modes, b.modes) and a.z == b.z and a.lam == b.lam and a.gamma == b.gamma


def test_random_scheduler_depends_on_its_seed():
    cfg, cost = CFGS[12], COSTS[12]
    rounds = [sample_round(np.random.default_rng(s), cfg) for s in range(4)]
    plans = [[make_scheduler("random", cost, cfg.max_gamma, seed=seed).plan(r).modes.tolist() for r in rounds] for seed in (1, 2)]
    assert plans[0] != plans[1]


def test_bad_arguments_are_named():
    cfg, cost = CFGS[5], COSTS[5]
    with pytest.raises(ValueError, match="num_users <= 10, got 12"):
        Exhaustive(COSTS[12], CFGS[12].max_gamma, max_users=10).plan(sample_round(np.random.default_rng(0), CFGS[12]))
    with pytest.raises(ValueError, match=r"draft_depth must be an integer in \[1, max_gamma=8\], got 9"):
        Balance(cost, cfg.max_gamma, draft_depth=9)
    with pytest.raises(ValueError, match=r"draft_depth must be an integer in \[1, max_gamma=8\], got 0"):
        Balance(cost, cfg.max_gamma, draft_depth=0)
    with pytest.raises(ValueError, match="grid_step must be in"):
        grid(0.0)
    with pytest.raises(ValueError, match="grid_step must be in"):
        grid(1.5)
    with pytest.raises(ValueError, match="unknown scheduler 'nope'"):
        make_scheduler("nope", cost, cfg.max_gamma)
    with pytest.raises(ValueError, match="policy_path"):
        make_scheduler("policy", cost, cfg.max_gamma)


def test_grid_includes_both_ends_and_the_step():
    assert grid(0.25).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert grid(1.0).tolist() == [0.0, 1.0]
    g = grid(0.05)
    assert len(g) == 21 and g[0] == 0.0 and g[-1] == 1.0


def test_optimal_reports_gap_under_time_limit():
    cfg = EnvConfig(num_users=40)
    cost = CostModel.from_config(cfg)
    rnd = sample_round(np.random.default_rng(2), cfg)
    plan = Optimal(cost, cfg.max_gamma, time_limit_s=0.5).plan(rnd)
    assert check_plan(cost, rnd, plan).feasible
    assert plan.extra["upper_bound"] >= plan.admitted >= Balance(cost, cfg.max_gamma).plan(rnd).admitted
    assert plan.extra["gap"] == plan.extra["upper_bound"] - plan.admitted
    assert plan.extra["optimal"] == (plan.extra["gap"] == 0)
    assert plan.extra["upper_bound"] <= cfg.num_users


@pytest.mark.parametrize("kv_memory", ["per_user", "padded"])
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_a_round_with_no_users_gets_the_empty_plan(name, kv_memory):
    """K = 0 (a round that lost every user, or a server window with nobody in it): every scheduler
    returns an empty, feasible plan (BALANCE's per-mode tables and the exact searches' envelope
    used to raise on it)."""
    cfg = EnvConfig(num_users=5, kv_memory=kv_memory)
    cost = CostModel.from_config(cfg)
    empty = sample_round(np.random.default_rng(0), cfg).subset(np.array([], dtype=int))
    plan = make_scheduler(name, cost, 8, seed=0).plan(empty)
    assert plan.modes.shape == (0,) and plan.admitted == 0 and check_plan(cost, empty, plan).feasible
    if name in ("exhaustive", "optimal"):
        assert plan.extra["upper_bound"] == 0 and plan.extra["gap"] == 0
