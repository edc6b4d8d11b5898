"""Exchange moves on feasible plans (agents.local_search)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_optimal import SETTINGS, _random_modes, _setup

from agents.balance import grid, split_search
from agents.local_search import _flip_moves, _moves, improve
from agents.plan_repair import repair
from envs import CostModel, EnvConfig
from envs.feasibility import check_plans
from envs.plan import AD, SD
from envs.workload import make_rounds


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), tight=st.booleans())
def test_improve_returns_a_feasible_plan_at_least_as_large(seed, name, tight):
    cfg, cost, rnd = _setup(name, 16, seed, tight)
    start = repair(cost, rnd, _random_modes(np.random.default_rng(seed), 16, 0.5), 4)
    out = improve(cost, rnd, start, 4, time_limit_s=5.0)
    assert check_plans(cost, rnd, out, 4).feasible
    assert np.count_nonzero(out) >= np.count_nonzero(start)


def test_moves_add_at_least_one_user_each():
    modes = np.array([AD, 0, SD, 0, 0], dtype=np.int8)
    cands = _moves(modes, 10_000)
    # drop nobody or one of 2 served, 3 rejected pairs, 4 mode pairs
    assert cands.shape == (3 * 3 * 4, 5)
    served = np.count_nonzero(cands, axis=1)
    assert (served == 3).sum() == 2 * 3 * 4 and (served == 4).sum() == 3 * 4  # one more, or two
    assert len({c.tobytes() for c in cands}) == len(cands)
    assert len(_moves(modes, 7)) == 7
    assert _moves(np.array([AD, 0], dtype=np.int8), 10).shape == (0, 2)


def test_improve_finds_a_better_plan_than_balance():
    """K = 70 test round 11: BALANCE serves 48, one exchange move gives 49 (measured)."""
    cfg = EnvConfig(num_users=70)
    cost = CostModel.from_config(cfg)
    rnd = list(make_rounds(cfg, 12, 1000003, split="test"))[11]
    g = grid(0.05)
    start = split_search(cost, rnd, 4, g, g).modes
    out = improve(cost, rnd, start, 4, time_limit_s=30.0)
    assert np.count_nonzero(out) > np.count_nonzero(start)
    assert check_plans(cost, rnd, out, 4).feasible


def test_improve_rejects_an_infeasible_start():
    cfg, cost, rnd = _setup("paper", 12, 0, tight=True)
    with pytest.raises(ValueError, match="feasible"):
        improve(cost, rnd, np.full(12, SD, dtype=np.int8), 4, time_limit_s=1.0)


def test_flip_moves_change_modes_and_add_one_user():
    modes = np.array([AD, 0, SD, 0, SD], dtype=np.int8)
    cands = _flip_moves(modes, 10_000)
    # (3 single + 3 pair flips) x 2 rejected x 2 modes
    assert cands.shape == (6 * 2 * 2, 5)
    assert (np.count_nonzero(cands, axis=1) == 4).all()
    changed = (cands[:, [0, 2, 4]] != modes[[0, 2, 4]]).sum(axis=1)
    assert sorted(set(changed.tolist())) == [1, 2] and (changed == 1).sum() == 3 * 4
    assert (cands[:, [0, 2, 4]] != 0).all()  # a flip never rejects a served user
    assert len({c.tobytes() for c in cands}) == len(cands)
    assert len(_flip_moves(modes, 5)) == 5
    assert _flip_moves(np.zeros(3, dtype=np.int8), 10).shape == (0, 3)
