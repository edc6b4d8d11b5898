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
from envs.feasibility import EPS, check_plans
from envs.plan import AD, SD, Plan
from experiments.improve_tuning import every_pair_ad


def _round(k: int, seed: int, **cfg_kwargs):
    cfg = EnvConfig(num_users=k, max_users=max(k, 20), **cfg_kwargs)
    return CostModel.from_config(cfg), sample_round(np.random.default_rng(seed), cfg)


def _fullness(cost, rnd, plans) -> tuple[np.ndarray, np.ndarray]:
    """(feasible, fullness) of AD-only plans (P, K) by the exact check: fullness = the larger of compute
    share and KV used / budget."""
    rep = check_plans(cost, rnd, plans, 1)
    return rep.feasible, np.maximum(rep.ad_share_min, rep.ad_memory_bytes / rep.memory_budget_bytes)


def _brute_force(cost, rnd, with_fullness: bool = False):
    """The largest m such that some (cap, floor) pair's first m eligible users (ascending output, ties:
    input) pass the exact check: every pair, every prefix, one check_plans call per prefix length
    (``with_fullness``: also the least fullness among the fitting prefixes of that size)."""
    k = rnd.num_users
    order = np.lexsort((rnd.input_tokens, rnd.output_tokens))
    best, least = 0, np.inf
    for cap in np.unique(rnd.input_tokens):
        for floor in np.unique(rnd.slack_s):
            users = order[(rnd.input_tokens[order] <= cap) & (rnd.slack_s[order] >= floor)]
            plans = np.zeros((len(users), k), dtype=np.int8)
            for m in range(1, len(users) + 1):
                plans[m - 1, users[:m]] = AD
            ok, full = _fullness(cost, rnd, plans)
            for m in np.flatnonzero(ok) + 1:
                if m > best:
                    best, least = int(m), float(full[m - 1])
                elif m == best:
                    least = min(least, float(full[m - 1]))
    return (best, least) if with_fullness else best


def _served(modes) -> int:
    return int((np.asarray(modes) != 0).sum())


def _check(cost, rnd, want: int, more_than: int) -> None:
    got = best_ad_prefix(cost, rnd, more_than)
    if want <= max(more_than, 0):
        assert got is None
        return
    assert got is not None and _served(got) == want
    assert set(np.unique(got)) <= {0, AD}
    assert check_plans(cost, rnd, got[None], 1).feasible[0]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kv_memory", ["per_user", "padded"])
def test_matches_a_brute_force_over_every_pair_and_prefix(seed, kv_memory):
    """The same count, and of the fitting prefixes of that size the emptiest."""
    cost, rnd = _round(14, seed, kv_memory=kv_memory)
    want, least = _brute_force(cost, rnd, with_fullness=True)
    for more_than in (0, want - 2, want - 1, want):
        _check(cost, rnd, want, more_than)
    if want:
        got = best_ad_prefix(cost, rnd, 0)
        assert _fullness(cost, rnd, got[None])[1][0] == pytest.approx(least, rel=1e-12)


@pytest.mark.parametrize("profile", ["cpu_specsched-pair", "cpu1_specsched-pair", "h100_llama2-13b_llama2-7b"])
@pytest.mark.parametrize("seed", range(3))
def test_measured_and_other_profiles_always_give_a_plan_that_fits(profile, seed):
    """On measured CPU profiles the pass time need not grow with the input or the batch: whatever the
    profile, a returned plan passes the exact check and serves at most the brute force's count."""
    cost, rnd = _round(12, seed, profile=profile)
    rnd = replace(rnd, deadline_s=rnd.downlink_s + 0.25 * (rnd.deadline_s - rnd.downlink_s))
    want = _brute_force(cost, rnd)
    got = best_ad_prefix(cost, rnd, 0)
    assert (got is None) == (want == 0)
    if got is not None:
        assert check_plans(cost, rnd, got[None], 1).feasible[0] and 1 <= _served(got) <= want


def test_a_pass_time_that_falls_with_the_input_does_not_make_an_infeasible_plan():
    """cpu1_specsched-pair prices a 26-token prompt faster than a 1-token one (a measured table). The
    prefix's own largest input is what the exact check prices, not the pair's cap: priced at the cap,
    the two short users looked as if they fitted beside nothing and the plan failed the check."""
    cost, rnd = _round(3, 0, profile="cpu1_specsched-pair")
    t1, t26 = float(cost.ad_time(2, 1, 100)), float(cost.ad_time(2, 26, 100))
    assert t26 < t1  # the profile's quirk this test is about
    odd = replace(rnd, input_tokens=np.array([1, 1, 26]), output_tokens=np.array([100, 100, 500]), uplink_s=np.zeros(3),
                  deadline_s=rnd.downlink_s + 0.5 * (t1 + t26))
    got = best_ad_prefix(cost, odd, 0)
    assert got is not None and check_plans(cost, odd, got[None], 1).feasible[0] and _served(got) == _brute_force(cost, odd) == 1


def test_a_slack_on_the_last_float_of_the_boundary_is_not_pruned():
    """One user whose time over its slack rounds to exactly 1 + EPS: the exact check accepts it, so the
    bounds must too (t <= (1 + EPS) * slack rounds the other way here; the bounds divide, as the check does)."""
    cost, rnd = _round(1, 0)
    t = float(cost.ad_time(1, 81, 97))
    slack = 1.9395324580604683
    assert t / slack <= 1 + EPS and not t <= (1 + EPS) * slack  # the float case this test pins
    one = replace(rnd, input_tokens=np.array([81]), output_tokens=np.array([97]), uplink_s=np.zeros(1),
                  downlink_s=np.zeros(1), realized_downlink_s=np.zeros(1), deadline_s=np.array([slack]))
    assert _brute_force(cost, one) == 1
    _check(cost, one, 1, 0)


def test_ties_in_output_are_broken_by_input():
    """Equal outputs: the prefix takes the shorter prompts first, so a cap between the inputs admits
    the short ones -- and the padding of the long ones is what makes them not fit together."""
    cost, rnd = _round(6, 1)
    inp, out = np.array([3000, 100, 3000, 100, 3000, 100]), np.full(6, 80)
    t_short = float(cost.ad_time(3, 100, 80))
    assert t_short < float(cost.ad_time(4, 3000, 80))
    tied = replace(rnd, input_tokens=inp, output_tokens=out, uplink_s=np.zeros(6), deadline_s=rnd.downlink_s + t_short)
    got = best_ad_prefix(cost, tied, 0)
    assert _served(got) == _brute_force(cost, tied) and set(np.flatnonzero(got)) == {1, 3, 5}


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 70), seed=st.integers(0, 10_000), slack_scale=st.sampled_from([0.3, 1.0, 3.0]))
def test_matches_the_vectorised_all_pairs_scan(k, seed, slack_scale):
    """Random rounds, deadlines scaled from hopeless to loose: the same count as every_pair_ad."""
    cost, rnd = _round(k, seed)
    rnd = replace(rnd, deadline_s=rnd.downlink_s + slack_scale * (rnd.deadline_s - rnd.downlink_s))
    want = every_pair_ad(cost, rnd, 1)
    for more_than in (0, want - 1, want):
        _check(cost, rnd, want, more_than)


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
    monkeypatch.setattr(pr, "best_ad_prefix", lambda *a, **kw: called.append(a))
    big = improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True)
    plain = improve_plan(cost, rnd, start, 8, mixed=True)
    assert not called and np.array_equal(big.modes, plain.modes) and big.gamma == plain.gamma
    monkeypatch.setattr(pr, "ALL_PAIRS_MAX_USERS", 60)
    improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True)
    assert called  # at the limit the search runs


@pytest.mark.parametrize("m", [1, 4, 7])
def test_one_more_user_missing_by_less_than_one_token_is_not_counted(m):
    """Three kinds of users: X (short outputs, no slack), Y (short outputs, huge prompts), Z (the only
    ones that can be served together). At Z's own pair the bounds see X's and Y's short outputs, so
    they let the pair through and its price decides. Z's slack is half a decode step short of what
    m + 1 of them need (then the KV budget half a token short): m fit, m + 1 do not -- a price that is
    off by one token shows here."""
    cost, rnd = _round(30, 4)
    kind = np.repeat([0, 1, 2], 10)  # X, Y, Z
    inp, out = np.where(kind == 1, 3000, 100), np.where(kind == 2, 90, 50)
    t_short = 0.5 * float(cost.ad_time(m + 1, 100, 90) + cost.ad_time(m + 1, 100, 89))
    assert float(cost.ad_time(m, 100, 90)) <= t_short < float(cost.ad_time(m + 1, 100, 90))
    tight = replace(rnd, input_tokens=inp, output_tokens=out, uplink_s=np.zeros(30), deadline_s=rnd.downlink_s + np.where(kind == 0, 1e-4, t_short))
    assert _brute_force(cost, tight) == m  # the reference agrees with the construction
    _check(cost, tight, m, 0)
    _check(cost, tight, m, m - 1)
    # memory binding instead: Y and Z have time to spare, the KV budget is half a token short of m + 1 Z users
    loose = replace(tight, deadline_s=rnd.downlink_s + np.where(kind == 0, 1e-4, 1e3))
    kv = 0.5 * float(cost.ad_memory(m + 1, 100, 90, 90 * (m + 1)) + cost.ad_memory(m + 1, 100, 90, 90 * (m + 1) - 1))
    cost.memory_bytes = cost.reserve_bytes + cost.w_l + kv
    assert _brute_force(cost, loose) == m
    _check(cost, loose, m, 0)


@pytest.mark.parametrize("profile", ["a100-40gb_llama2-13b_llama2-7b", "cpu1_specsched-pair"])
@pytest.mark.parametrize("kv_memory", ["per_user", "padded"])
def test_the_post_step_never_serves_fewer_than_improve_mixed(profile, kv_memory):
    """From an empty plan (where the mixed re-pack, not the one-batch re-pack, finds the users) and from
    a feasible random one: improve_mixed_all_pairs serves at least improve_mixed's count, every plan fits."""
    cost, rnd = _round(80, 5, profile=profile, kv_memory=kv_memory)
    rng = np.random.default_rng(1)
    half = np.zeros(80, dtype=np.int8)
    for i in rng.permutation(80):
        half[i] = SD if rng.random() < 0.5 else AD
        if not check_plans(cost, rnd, half[None], 2).feasible[0]:
            half[i] = 0
    for start in (np.zeros(80, dtype=np.int8), half):
        plan = Plan(start, gamma=2)
        mixed = improve_plan(cost, rnd, plan, 8, mixed=True)
        every = improve_plan(cost, rnd, plan, 8, mixed=True, all_pairs_ad=True)
        assert check_plan(cost, rnd, every).feasible and _served(every.modes) >= _served(mixed.modes)


def test_of_two_pairs_that_fit_as_many_the_emptier_wins():
    """Two users with short outputs and little slack, two with longer outputs and much slack; the KV
    budget holds two users and no more: the low floor admits the short pair, the high floor only the
    long one. Both serve 2; the short outputs hold less KV, so theirs is the plan returned."""
    cost, rnd = _round(4, 2)
    inp, out = np.full(4, 100), np.array([40, 40, 90, 90])
    slack = np.array([3.0, 3.0, 30.0, 30.0])
    two = replace(rnd, input_tokens=inp, output_tokens=out, uplink_s=np.zeros(4), deadline_s=rnd.downlink_s + slack)
    cost.memory_bytes = cost.reserve_bytes + cost.w_l + float(cost.ad_memory(2, 100, 90, 180)) * 1.01
    assert _brute_force(cost, two) == 2
    got = best_ad_prefix(cost, two, 0)
    assert set(np.flatnonzero(got)) == {0, 1}
