"""agents.ad_prefix_search: the AD-only re-pack over every (input cap, slack floor) pair, pruned by bounds.

Held to a brute force that prices every pair's every prefix with the exact check (no shared code with
the pruning), to ``experiments.improve_tuning.every_pair_ad`` (the vectorised all-pairs scan), on random,
adversarial (slow uplinks, ties, no memory) and memory-model variants; and the post-step that uses it
never serves fewer than the one that searches the AD-only re-pack on a grid.
"""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.ad_prefix_search import best_ad_prefix
from agents.plan_repair import improve, improve_plan
from envs import CostModel, EnvConfig, check_plan, sample_round
from envs.feasibility import check_plans
from envs.plan import AD, SD, Plan
from experiments.improve_tuning import every_pair_ad


def _round(k: int, seed: int, **cfg_kwargs):
    cfg = EnvConfig(num_users=k, max_users=max(k, 20), **cfg_kwargs)
    return CostModel.from_config(cfg), sample_round(np.random.default_rng(seed), cfg)


def _brute_force(cost, rnd) -> int:
    """The largest m such that some (cap, floor) pair's first m eligible users (ascending output, ties:
    input) pass the exact check: every pair, every prefix, one check_plans call per prefix length."""
    k = rnd.num_users
    order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    best = 0
    for cap in np.unique(rnd.input_tokens):
        for floor in np.unique(rnd.slack_s):
            users = order[(rnd.input_tokens[order] <= cap) & (rnd.slack_s[order] >= floor)]
            if len(users) <= best:
                continue
            plans = np.zeros((len(users), k), dtype=np.int8)
            for m in range(1, len(users) + 1):
                plans[m - 1, users[:m]] = AD
            ok = np.flatnonzero(check_plans(cost, rnd, plans, 1).feasible)
            if len(ok):
                best = max(best, int(ok.max()) + 1)
    return best


def _served(modes) -> int:
    return int((np.asarray(modes) != 0).sum())


def _check(cost, rnd, want: int, at_least: int) -> None:
    got = best_ad_prefix(cost, rnd, at_least)
    if want <= max(at_least, 0):
        assert got is None
        return
    assert got is not None and _served(got) == want
    assert set(np.unique(got)) <= {0, AD}
    assert check_plans(cost, rnd, got[None], 1).feasible[0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kv_memory", ["per_user", "padded"])
def test_matches_a_brute_force_over_every_pair_and_prefix(seed, kv_memory):
    cost, rnd = _round(14, seed, kv_memory=kv_memory)
    want = _brute_force(cost, rnd)
    for at_least in (0, want - 2, want - 1, want):
        _check(cost, rnd, want, at_least)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 70), seed=st.integers(0, 10_000), slack_scale=st.sampled_from([0.3, 1.0, 3.0]))
def test_matches_the_vectorised_all_pairs_scan(k, seed, slack_scale):
    """Random rounds, deadlines scaled from hopeless to loose: the same count as every_pair_ad."""
    cost, rnd = _round(k, seed)
    rnd = replace(rnd, deadline_s=rnd.downlink_s + slack_scale * (rnd.deadline_s - rnd.downlink_s))
    want = every_pair_ad(cost, rnd, 1)
    for at_least in (0, want - 1, want):
        _check(cost, rnd, want, at_least)


def test_adversarial_rounds():
    cost, rnd = _round(40, 7)
    k = rnd.num_users
    # slow uplinks that bind: the exact check prices each prefix's slowest one
    slow = replace(rnd, uplink_s=np.random.default_rng(1).uniform(0, 0.8, k) * rnd.slack_s)
    _check(cost, slow, _brute_force(cost, slow), 0)
    # every user alike: one cap, one floor
    same = replace(rnd, input_tokens=np.full(k, 100), output_tokens=np.full(k, 80), deadline_s=rnd.downlink_s + 5.0)
    _check(cost, same, every_pair_ad(cost, same, 1), 0)
    # nothing can be served: a zero slack budget everywhere
    hopeless = replace(rnd, deadline_s=rnd.downlink_s.copy())
    assert best_ad_prefix(cost, hopeless, 0) is None
    # more than every user asked for; a negative floor on the count is 0
    assert best_ad_prefix(cost, rnd, k) is None
    assert _served(best_ad_prefix(cost, rnd, -5)) == every_pair_ad(cost, rnd, 1)


def test_no_memory_for_any_kv():
    cost, rnd = _round(20, 2)
    cost.memory_bytes = cost.reserve_bytes + cost.w_l  # the LLM's weights take every byte
    assert best_ad_prefix(cost, rnd, 0) is None


@pytest.mark.parametrize("seed", range(5))
def test_the_all_pairs_post_step_never_serves_fewer_than_the_grid(seed):
    """improve(..., all_pairs_ad=True) replaces the AD-only re-pack's grid by every pair: never fewer
    users than the grid version with the same square and mixed re-pack, and feasible."""
    cost, rnd = _round(90, seed)
    rng = np.random.default_rng(seed)
    modes = np.zeros(90, dtype=np.int8)
    for i in rng.permutation(90):  # a feasible mixed plan, users in random order
        modes[i] = SD if rng.random() < 0.4 else AD
        if not check_plans(cost, rnd, modes[None], 2).feasible[0]:
            modes[i] = 0
    grid = improve(cost, rnd, modes, 2, 8, cross=4, mixed_depth=2)
    every = improve(cost, rnd, modes, 2, 8, cross=4, mixed_depth=2, all_pairs_ad=True)
    assert _served(every) >= _served(grid) >= _served(modes)
    plan = improve_plan(cost, rnd, Plan(modes, gamma=2), 8, mixed=True, all_pairs_ad=True)
    assert check_plan(cost, rnd, plan).feasible and _served(plan.modes) == _served(every)
    with pytest.raises(ValueError, match="mixed"):
        improve_plan(cost, rnd, Plan(modes, gamma=2), 8, all_pairs_ad=True)


def test_the_post_step_keeps_the_grid_above_its_size_limit(monkeypatch):
    """improve_mixed_all_pairs on a round larger than ALL_PAIRS_MAX_USERS is improve_mixed, plan for plan."""
    import agents.plan_repair as pr

    cost, rnd = _round(60, 3)
    start = Plan(np.zeros(60, dtype=np.int8), gamma=2)
    monkeypatch.setattr(pr, "ALL_PAIRS_MAX_USERS", 59)
    called = []
    monkeypatch.setattr(pr, "best_ad_prefix", lambda *a: called.append(a))
    big = improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True)
    plain = improve_plan(cost, rnd, start, 8, mixed=True)
    assert not called and np.array_equal(big.modes, plain.modes) and big.gamma == plain.gamma
    monkeypatch.setattr(pr, "ALL_PAIRS_MAX_USERS", 60)
    improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True)
    assert called  # at the limit the search runs
