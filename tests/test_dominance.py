"""Symmetry breaking by user dominance (agents.dominance) and the exact search that uses it."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_optimal import SETTINGS, _brute_force, _random_modes, _setup

from agents.cost_envelope import CostEnvelope
from agents.dominance import dominance, forced
from agents.optimal import exhaustive_search
from agents.plan_repair import repair
from envs.feasibility import check_plans
from envs.plan import AD, SD

MONOTONE = sorted(n for n in SETTINGS if n != "cpu")


def _order(rnd) -> np.ndarray:
    return np.argsort(rnd.slack_s - rnd.uplink_s, kind="stable")


def _attrs(env: CostEnvelope, rnd, mode: int) -> list[np.ndarray]:
    v = env.user_values
    out = [v["input"], v["output"], -rnd.slack_s, rnd.uplink_s]
    return out + [v["iterations"]] if mode == SD else out


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(MONOTONE), k=st.integers(2, 25))
def test_matrices_follow_the_definition(seed, name, k):
    cfg, cost, rnd = _setup(name, k, seed)
    env = CostEnvelope(cost, rnd, 4)
    assert env.monotone
    order = _order(rnd)
    dom = dominance(env, rnd, order)
    for m in (AD, SD):
        attrs = _attrs(env, rnd, m)
        for p in range(k):
            for q in range(k):
                want = p < q and all(a[order[p]] >= a[order[q]] for a in attrs)
                assert dom[m][p, q] == want


def test_no_dominance_without_monotone_costs():
    """The measured CPU table is not monotone: the swap argument does not hold, nothing is pruned."""
    cfg, cost, rnd = _setup("cpu", 30, 0)
    env = CostEnvelope(cost, rnd, 4)
    assert not env.monotone
    dom = dominance(env, rnd, _order(rnd))
    assert not dom[AD].any() and not dom[SD].any()


def test_dominance_is_not_vacuous():
    """Paper rounds do hold dominated pairs (else the pruning would test nothing)."""
    cfg, cost, rnd = _setup("paper", 30, 1)
    dom = dominance(CostEnvelope(cost, rnd, 4), rnd, _order(rnd))
    assert dom[AD].sum() > 0 and dom[SD].sum() > 0 and (dom[SD] <= dom[AD]).all()


def _swaps(name: str, seed: int, tight: bool, reverse: bool = False) -> tuple[int, int]:
    """Swap dominator/dominated pairs in near-maximal feasible plans; (feasible, infeasible) counts.

    ``reverse=False``: the served dominator out, the rejected dominated user in (the module's swap);
    ``reverse=True``: the served dominated user out, its rejected dominator in (no such guarantee).
    """
    k = 14
    cfg, cost, rnd = _setup(name, k, seed, tight)
    env = CostEnvelope(cost, rnd, 4)
    order = _order(rnd)
    dom = dominance(env, rnd, order)
    rng = np.random.default_rng(seed)
    ok = bad = 0
    for _ in range(15):
        modes = repair(cost, rnd, _random_modes(rng, k, rng.random()), 4)  # feasible, extended greedily
        for m in (AD, SD):
            for p, q in zip(*np.nonzero(dom[m]), strict=True):
                out, into = (order[q], order[p]) if reverse else (order[p], order[q])
                if modes[out] == m and modes[into] == 0:
                    swapped = modes.copy()
                    swapped[out], swapped[into] = 0, m
                    if check_plans(cost, rnd, swapped, 4).feasible:
                        ok += 1
                    else:
                        bad += 1
    return ok, bad


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(MONOTONE), tight=st.booleans())
def test_swap_keeps_every_plan_feasible(seed, name, tight):
    """The module's argument, checked directly with the exact check: in a feasible plan serving a
    dominator in mode m and rejecting a user it dominates, the swap is feasible."""
    assert _swaps(name, seed, tight)[1] == 0


def test_swap_check_is_not_vacuous():
    """Over a few rounds the swap is exercised, and the reverse swap (dominator in) does break
    plans: the test above could fail."""
    fwd = [_swaps("paper", s, tight) for s in range(6) for tight in (False, True)]
    rev = [_swaps("paper", s, tight, reverse=True) for s in range(6) for tight in (False, True)]
    assert sum(ok for ok, _ in fwd) > 0
    assert sum(bad for _, bad in rev) > 0


def test_forced_marks_the_dominated_users_of_served_dominators():
    dom = {AD: np.zeros((4, 4), dtype=bool), SD: np.zeros((4, 4), dtype=bool)}
    dom[AD][0, 2] = True  # position 0 dominates 2 in AD
    dom[SD][1, 3] = True  # position 1 dominates 3 in SD
    paths = np.array([[AD, 0], [SD, SD], [0, AD], [SD, 0]], dtype=np.int8)
    f = forced(paths, dom, 2)
    assert f.tolist() == [[True, False], [False, True], [False, False], [False, False]]
    assert forced(paths[:, :0], dom, 0).shape == (4, 4) and not forced(paths[:, :0], dom, 0).any()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), k=st.integers(1, 9), tight=st.booleans())
def test_search_with_symmetry_breaking_equals_brute_force(seed, name, k, tight):
    cfg, cost, rnd = _setup(name, k, seed, tight)
    brute = _brute_force(cost, rnd)
    for symmetry in (True, False):
        modes, complete, ub = exhaustive_search(cost, rnd, 4, symmetry=symmetry)
        got = 0 if modes is None else int(np.count_nonzero(modes))
        assert complete and got == brute == ub
        if modes is not None:
            assert check_plans(cost, rnd, modes, 4).feasible
