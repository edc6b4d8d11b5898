"""Schedulers with the ED mode: exactness against brute force, invariants across schedulers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.balance import Balance, grid, split_search
from agents.balance_ed import BalanceED, split_search_within
from agents.ed_batch import ed_options, fixed_depth_option
from agents.edge_first import EdgeFirst
from agents.optimal_v1 import OptimalV1
from envs import CostModel
from envs.config import EnvConfig
from envs.plan import ED
from envs.profile import PROFILE_DIR
from envs.split_cost import SplitCostModel
from envs.split_plan import check_plan_split, ed_users
from envs.workload import make_rounds

PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"


def setting(k: int, edge_fraction: float = 0.5, max_gamma: int = 8, **kw):
    # tight deadlines and long outputs make every mode bind on a handful of users
    cfg = EnvConfig(num_users=k, profile=PROFILE, edge_fraction=edge_fraction, max_gamma=max_gamma, deadline_s=[0.3, 3.0],
                    output_tokens=[20, 400], rtt_ms=[5.0, 65.0], **kw)
    return cfg, CostModel.from_config(cfg)


def depths_of(plan, k):
    return plan.ed_depth if plan.ed_depth is not None else np.zeros(k, dtype=np.int64)


def brute_force_v1(cost, users, rnd, max_gamma):
    """Most users servable: every mode vector, SD depth and per-user ED depth, by the exact check."""
    k, best = rnd.num_users, 0
    for modes in itertools.product(range(4), repeat=k):
        modes = np.array(modes)
        n = int(np.count_nonzero(modes))
        if n <= best:
            continue
        ed = np.flatnonzero(modes == ED)
        for gamma in range(1, max_gamma + 1):
            if n <= best:
                break
            for d in itertools.product(range(1, max_gamma + 1), repeat=len(ed)):
                depth = np.zeros(k, dtype=np.int64)
                depth[ed] = d
                if check_plan_split(cost, users, rnd, modes, gamma, depth).feasible:
                    best = n
                    break
    return best


@pytest.mark.parametrize("k, seed", [(3, 0), (3, 1), (4, 2), (4, 3)])
def test_optimal_v1_equals_brute_force_over_every_depth(k, seed):
    cfg, cost = setting(k, edge_fraction=0.7, max_gamma=2)
    split = SplitCostModel(cost.profile)
    for rnd in make_rounds(cfg, 2, seed):
        plan = OptimalV1(cost, cfg.max_gamma, 2).plan(rnd)
        users = ed_users(split, rnd, 2)
        assert check_plan_split(cost, users, rnd, plan.modes, plan.gamma, depths_of(plan, k)).feasible
        assert plan.admitted == brute_force_v1(cost, users, rnd, 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_optimal_v1_equals_brute_force_k5(seed):
    cfg, cost = setting(5, edge_fraction=0.6, max_gamma=2)
    split = SplitCostModel(cost.profile)
    for rnd in make_rounds(cfg, 2, 100 + seed):
        plan = OptimalV1(cost, cfg.max_gamma, 2).plan(rnd)
        assert plan.admitted == brute_force_v1(cost, ed_users(split, rnd, 2), rnd, 2)


def test_ed_options_are_the_pareto_front_of_every_depth_assignment():
    cfg, cost = setting(5, edge_fraction=1.0, max_gamma=3)
    split = SplitCostModel(cost.profile)
    for rnd in make_rounds(cfg, 4, 11):
        users = ed_users(split, rnd, 3)
        idx = np.flatnonzero(users.allowed.any(axis=1))[:4]
        points = []
        for d in itertools.product(range(1, 4), repeat=len(idx)):
            o = fixed_depth_option(cost, users, rnd, idx, np.array(d))
            if np.isfinite(o.share):
                points.append((o.share, o.memory_bytes))
        options = ed_options(cost, users, rnd, idx)
        assert bool(points) == bool(options)
        for o in options:  # each option is achieved by its own depths, and nothing beats it on both
            again = fixed_depth_option(cost, users, rnd, idx, o.depth)
            assert again.share == pytest.approx(o.share) and again.memory_bytes == pytest.approx(o.memory_bytes)
        for s, m in points:  # every assignment is matched or beaten on both by some option
            assert any(o.share <= s * (1 + 1e-12) and o.memory_bytes <= m * (1 + 1e-12) for o in options)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), k=st.integers(3, 7), frac=st.sampled_from([0.3, 0.7, 1.0]))
def test_every_plan_is_feasible_and_the_optimum_beats_every_heuristic(seed, k, frac):
    cfg, cost = setting(k, edge_fraction=frac)
    split = SplitCostModel(cost.profile)
    rnd = make_rounds(cfg, 1, seed)[0]
    users = ed_users(split, rnd, cfg.max_gamma)
    plans = {cls.name: cls(cost, cfg.max_gamma, 4).plan(rnd) for cls in (Balance, BalanceED, EdgeFirst, OptimalV1)}
    for name, plan in plans.items():
        rep = check_plan_split(cost, users, rnd, plan.modes, plan.gamma, depths_of(plan, k))
        assert rep.feasible, name
        if plan.admitted_ed:  # only edge-capable users run ED
            assert rnd.has_edge[plan.modes == ED].all(), name
    best = plans["optimal_v1"].admitted
    assert all(p.admitted <= best for p in plans.values())
    assert plans["balance_ed"].admitted >= plans["balance"].admitted


@pytest.mark.parametrize("cls", [BalanceED, EdgeFirst])
def test_without_edge_users_the_ed_schedulers_are_balance(cls):
    cfg, cost = setting(30, edge_fraction=0.0)
    for rnd in make_rounds(cfg, 3, 5):
        a, b = Balance(cost, cfg.max_gamma, 4).plan(rnd), cls(cost, cfg.max_gamma, 4).plan(rnd)
        assert np.array_equal(a.modes, b.modes) and (a.z, a.lam, a.gamma) == (b.z, b.lam, b.gamma)
        assert b.admitted_ed == 0 and b.ed_depth is None


def test_split_search_within_on_the_whole_gpu_is_balance():
    cfg, cost = setting(25, edge_fraction=0.0)
    g = grid(0.05)
    for rnd in make_rounds(cfg, 4, 9):
        modes, z, lam = split_search_within(cost, rnd, 4, g, g, 1.0, 0.0)
        plan = split_search(cost, rnd, 4, g, g)
        assert np.count_nonzero(modes) == plan.admitted
        assert np.array_equal(modes, plan.modes) and (z, lam) == (plan.z, plan.lam)


def test_split_search_within_respects_a_reduced_share_and_memory():
    cfg, cost = setting(20, edge_fraction=0.0)
    g = grid(0.1)
    for rnd in make_rounds(cfg, 3, 4):
        full = np.count_nonzero(split_search_within(cost, rnd, 4, g, g, 1.0, 0.0)[0])
        half, _, _ = split_search_within(cost, rnd, 4, g, g, 0.5, 0.0)
        rep = check_plan_split(cost, ed_users(SplitCostModel(cost.profile), rnd, cfg.max_gamma), rnd, half, 4, np.zeros(20, dtype=np.int64))
        assert rep.ad_share_min + rep.sd_share_min <= 0.5 + 1e-9
        assert np.count_nonzero(half) <= full
        assert np.count_nonzero(split_search_within(cost, rnd, 4, g, g, 1.0, 1e15)[0]) == 0  # no memory left


def test_users_whose_edge_cannot_hold_the_draft_never_run_ed(tmp_path):
    # an edge with KV room for only 300 draft tokens: longer requests are edge-capable but not allowed
    with (PROFILE_DIR / f"{PROFILE}.yaml").open() as fh:
        d = yaml.safe_load(fh)
    dev = d["edge"]["device"]
    room_tokens = 300
    kv_s = 2 * d["slm"]["layers"] * d["slm"]["kv_heads"] * d["slm"]["head_dim"] * d["slm"]["dtype_bytes"]
    dev["memory_bytes"] = float(dev["reserve_bytes"]) + float(d["slm"]["params"]) * d["slm"]["dtype_bytes"] + room_tokens * kv_s
    path = tmp_path / "tiny_edge.yaml"
    path.write_text(yaml.safe_dump(d))
    cfg = EnvConfig(num_users=7, profile=str(path), edge_fraction=1.0, deadline_s=[0.3, 3.0], output_tokens=[20, 400])
    cost = CostModel.from_config(cfg)
    for rnd in make_rounds(cfg, 3, 3):
        users = ed_users(SplitCostModel(cost.profile), rnd, cfg.max_gamma)
        too_long = rnd.input_tokens + rnd.output_tokens + 2 > room_tokens
        assert too_long.any() and not users.allowed[too_long].any()
        for cls in (BalanceED, EdgeFirst, OptimalV1):
            plan = cls(cost, cfg.max_gamma, 4).plan(rnd)
            ed = np.flatnonzero(plan.modes == ED)
            assert users.allowed[ed, plan.ed_depth[ed] - 1].all() if len(ed) else True
            assert not too_long[ed].any()


def test_optimal_v1_refuses_large_rounds():
    cfg, cost = setting(9)
    with pytest.raises(ValueError, match="num_users <= 8"):
        OptimalV1(cost, cfg.max_gamma, 4).plan(make_rounds(cfg, 1, 0)[0])


def test_on_a_profile_without_an_edge_nobody_runs_ed():
    plain = EnvConfig(num_users=6, edge_fraction=1.0)  # every user has an edge, but the profile has none
    cost = CostModel.from_config(plain)
    for rnd in make_rounds(plain, 2, 1):
        base = Balance(cost, plain.max_gamma, 4).plan(rnd)
        for cls in (BalanceED, EdgeFirst):
            plan = cls(cost, plain.max_gamma, 4).plan(rnd)
            assert np.array_equal(plan.modes, base.modes) and plan.admitted_ed == 0
        best = OptimalV1(cost, plain.max_gamma, 4).plan(rnd)
        assert best.admitted_ed == 0 and best.admitted >= base.admitted


def test_the_ed_schedulers_are_registered_by_name():
    from agents.registry import SCHEDULERS

    assert SCHEDULERS["balance_ed"] is BalanceED and SCHEDULERS["edge_first"] is EdgeFirst and SCHEDULERS["optimal_v1"] is OptimalV1
