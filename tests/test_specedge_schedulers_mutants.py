"""Pins the SpecEdge scheduler pieces exactly: ``agents.ed_batch`` (which profiles have a split model,
the no-edge ``EdUsers``, ``ed_options`` equal to the brute-force Pareto front of every depth
assignment, ``fixed_depth_option`` and ``cheapest_option`` at their boundaries), ``agents.balance_ed``
(``spaced``, ``split_search_within`` and ``modes_for_rest`` edge cases, ``nested_ed_sets`` growth,
order, feasibility and maximality, ``plan_with_ed`` shares, and ``BalanceED`` picking the best of
the documented candidate ED sets, ties keeping BALANCE's own plan) and ``agents.edge_first``
(``calibrated_depths`` by the docstring's rule, and ``EdgeFirst`` putting a feasible, maximal,
calibrated ED batch first with BALANCE on the rest), also on profiles edited so that the server's
KV (AD-only budget, SLM not loaded) or the edge's draft room binds."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.balance import Balance, grid, split_search
from agents.balance_ed import (
    BalanceED,
    modes_for_rest,
    nested_ed_sets,
    plan_with_ed,
    spaced,
    split_search_within,
)
from agents.ed_batch import (
    EdOption,
    cheapest_option,
    ed_options,
    fixed_depth_option,
    round_ed_users,
    split_model,
)
from agents.edge_first import EdgeFirst, calibrated_depths
from envs import CostModel
from envs.config import EnvConfig
from envs.plan import ED, REJECT
from envs.profile import PROFILE_DIR
from envs.split_cost import SplitCostModel
from envs.split_plan import check_plan_split, ed_users
from envs.workload import make_rounds

PROFILE = "split_a100-40gb_llama2-7b_tinyllama-1.1b"


def setting(k: int, edge_fraction: float = 0.5, max_gamma: int = 8, **kw):
    base = {"deadline_s": [0.3, 3.0], "output_tokens": [20, 400], "rtt_ms": [5.0, 65.0]} | kw
    cfg = EnvConfig(num_users=k, profile=PROFILE, edge_fraction=edge_fraction, max_gamma=max_gamma, **base)
    return cfg, CostModel.from_config(cfg)


def ed_fits(cost, users, rnd, idx, share_total=1.0):
    """Some depth assignment of ED set ``idx`` fits ``share_total`` and the AD-only KV budget."""
    mem = float(cost.memory_budget(False))
    return any(o.share <= share_total + 1e-9 and o.memory_bytes <= mem * (1 + 1e-9) for o in ed_options(cost, users, rnd, idx))


# ---------------------------------------------------------------- agents.ed_batch


def test_split_model_needs_both_an_edge_and_a_network_section():
    _, cost = setting(3)
    prof = cost.profile
    assert prof.edge is not None and prof.network is not None
    assert isinstance(split_model(prof), SplitCostModel)
    assert split_model(replace(prof, edge=None)) is None
    assert split_model(replace(prof, network=None)) is None
    assert split_model(replace(prof, edge=None, network=None)) is None


def test_round_ed_users_without_a_split_model_allows_nobody_and_keeps_ed_users_layout():
    cfg, cost = setting(5, edge_fraction=1.0, max_gamma=4)
    rnd = make_rounds(cfg, 1, 0)[0]
    real = ed_users(SplitCostModel(cost.profile), rnd, 4)
    none = round_ed_users(None, rnd, 4)
    assert not none.allowed.any() and none.allowed.dtype == bool
    for name in ("tokens", "iterations", "edge_s", "allowed", "prefill_s"):
        a, b = getattr(real, name), getattr(none, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
    same = round_ed_users(SplitCostModel(cost.profile), rnd, 4)
    assert np.array_equal(same.allowed, real.allowed) and np.array_equal(same.iterations, real.iterations)


def brute_front(cost, users, rnd, idx, g_max):
    """Non-dominated (share, memory) over every depth assignment, by the exact per-assignment price."""
    pts = []
    for d in itertools.product(range(1, g_max + 1), repeat=len(idx)):
        o = fixed_depth_option(cost, users, rnd, idx, np.array(d))
        if np.isfinite(o.share):
            pts.append((o.share, o.memory_bytes))
    front = [p for p in pts if not any(q[0] <= p[0] * (1 + 1e-12) and q[1] <= p[1] * (1 + 1e-12) and q != p and (q[0] < p[0] * (1 - 1e-12) or q[1] < p[1] * (1 - 1e-12)) for q in pts)]
    return sorted(set(front))


@pytest.mark.parametrize("seed, kv, g_max, rtt", [(11, "per_user", 3, 5.0), (12, "per_user", 3, 5.0), (13, "padded", 3, 5.0), (14, "padded", 4, 5.0),
                                                  (15, "per_user", 4, 15.0), (17, "per_user", 4, 15.0), (16, "per_user", 1, 5.0)])
def test_ed_options_is_exactly_the_brute_force_pareto_front(seed, kv, g_max, rtt):
    # rtt 15: every user has the same round trip, so the slowest edge iteration follows the depths
    cfg, cost = setting(4, edge_fraction=1.0, max_gamma=g_max, deadline_s=[0.3, 6.0], kv_memory=kv, rtt_ms=[rtt, rtt if rtt == 15.0 else 65.0])
    split = SplitCostModel(cost.profile)
    n_fronts = 0
    for rnd in make_rounds(cfg, 3, seed):
        users = ed_users(split, rnd, g_max)
        cap = np.flatnonzero(users.allowed.any(axis=1))
        for size in (1, 2, 3):
            idx = cap[:size]
            if len(idx) < size:
                continue
            options = ed_options(cost, users, rnd, idx)
            front = brute_front(cost, users, rnd, idx, g_max)
            got = [(o.share, o.memory_bytes) for o in options]
            assert len(got) == len(front)
            for (s, m), (s2, m2) in zip(got, front, strict=True):
                assert s == pytest.approx(s2, rel=1e-12) and m == pytest.approx(m2, rel=1e-12)
            # sorted by share ascending, memory strictly descending; each achieved by its own depths
            assert all(a.share <= b.share and a.memory_bytes > b.memory_bytes for a, b in itertools.pairwise(options))
            for o in options:
                assert o.depth.dtype.kind == "i" and o.depth.shape == (len(idx),)
                assert ((o.depth >= 1) & (o.depth <= g_max)).all() and users.allowed[idx, o.depth - 1].all()
                again = fixed_depth_option(cost, users, rnd, idx, o.depth)
                assert again.share == pytest.approx(o.share, rel=1e-12) and again.memory_bytes == pytest.approx(o.memory_bytes, rel=1e-12)
            n_fronts += len(front) > 1
    assert n_fronts > 0 or g_max == 1  # some set has a real trade-off between share and memory


@pytest.mark.parametrize("idx", [(1, 4), (3, 5), (3, 4)])
def test_ed_options_front_where_the_slowest_edge_iteration_depends_on_the_iteration_cap(idx):
    """Pairs (found by search over 1,404 sets) whose front holds options at different iteration
    caps J* with different slowest fastest-edge iterations: each cap must budget with its own
    slowest edge iteration, not the slowest over all caps (which prices the shallower options too
    dear, or drops them)."""
    cfg, cost = setting(6, edge_fraction=1.0, max_gamma=8, deadline_s=[0.5, 6.0])
    rnd = make_rounds(cfg, 3, 5 if idx != (1, 4) else 3)[1]
    users = ed_users(SplitCostModel(cost.profile), rnd, 8)
    idx = np.array(idx)
    got = [(o.share, o.memory_bytes) for o in ed_options(cost, users, rnd, idx)]
    front = brute_front(cost, users, rnd, idx, 8)
    assert len(got) == len(front) >= 4
    for (s, m), (s2, m2) in zip(got, front, strict=True):
        assert s == pytest.approx(s2, rel=1e-12) and m == pytest.approx(m2, rel=1e-12)


def test_ed_options_of_the_empty_set_and_of_a_set_with_a_user_without_edge():
    cfg, cost = setting(6, edge_fraction=0.5, max_gamma=3, deadline_s=[2.0, 6.0], output_tokens=[20, 100])
    split = SplitCostModel(cost.profile)
    rnd = next(r for r in make_rounds(cfg, 10, 2) if 0 < r.has_edge.sum() < 6)
    users = ed_users(split, rnd, 3)
    (empty,) = ed_options(cost, users, rnd, np.zeros(0, dtype=np.int64))
    assert empty.share == 0.0 and empty.memory_bytes == 0.0 and empty.depth.shape == (0,) and empty.depth.dtype.kind == "i"
    (empty_list,) = ed_options(cost, users, rnd, [])
    assert empty_list.depth.shape == (0,) and empty_list.memory_bytes == 0.0
    cap, nocap = np.flatnonzero(users.allowed.any(axis=1)), np.flatnonzero(~users.allowed.any(axis=1))
    assert ed_options(cost, users, rnd, np.array([cap[0], nocap[0]])) == []
    assert ed_options(cost, users, rnd, nocap[:1]) == []
    assert any(ed_options(cost, users, rnd, [k]) for k in cap)  # some edge user alone has a way to run


def test_ed_options_uses_only_allowed_depths():
    # a user allowed only at its deepest depth must be priced there, never at a forbidden shallower one
    cfg, cost = setting(3, edge_fraction=1.0, max_gamma=3, deadline_s=[5.0, 6.0], output_tokens=[20, 40])
    split = SplitCostModel(cost.profile)
    rnd = make_rounds(cfg, 1, 1)[0]
    users = ed_users(split, rnd, 3)
    assert users.allowed.all()
    for only in range(3):
        allowed = np.zeros_like(users.allowed)
        allowed[:, only] = True
        u2 = replace(users, allowed=allowed)
        opts = ed_options(cost, u2, rnd, np.arange(3))
        assert len(opts) == 1 and np.array_equal(opts[0].depth, np.full(3, only + 1))
        fixed = fixed_depth_option(cost, users, rnd, np.arange(3), np.full(3, only + 1))
        assert opts[0].share == pytest.approx(fixed.share) and opts[0].memory_bytes == pytest.approx(fixed.memory_bytes)


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_fixed_depth_option_prices_like_the_exact_check(kv):
    cfg, cost = setting(6, edge_fraction=1.0, max_gamma=4, deadline_s=[1.0, 6.0], kv_memory=kv)
    split = SplitCostModel(cost.profile)
    rng = np.random.default_rng(0)
    for rnd in make_rounds(cfg, 3, 7):
        users = ed_users(split, rnd, 4)
        for _ in range(4):
            idx = np.sort(rng.choice(6, size=rng.integers(1, 5), replace=False))
            depth = rng.integers(1, 5, size=len(idx))
            opt = fixed_depth_option(cost, users, rnd, idx, depth)
            assert np.array_equal(opt.depth, depth)
            modes = np.zeros(6, dtype=np.int8)
            modes[idx] = ED
            full = np.zeros(6, dtype=np.int64)
            full[idx] = depth
            rep = check_plan_split(cost, users, rnd, modes, 4, full)
            if users.allowed[idx, depth - 1].all():
                assert opt.share == pytest.approx(rep.ed_share_min, rel=1e-12)
                assert opt.memory_bytes == pytest.approx(rep.ed_memory_bytes, rel=1e-12)
            else:
                assert opt.share == float("inf") and opt.memory_bytes == float("inf")


def test_fixed_depth_option_edge_cases():
    cfg, cost = setting(4, edge_fraction=1.0, max_gamma=3, deadline_s=[5.0, 6.0], output_tokens=[20, 40])
    split = SplitCostModel(cost.profile)
    rnd = make_rounds(cfg, 1, 1)[0]
    users = ed_users(split, rnd, 3)
    empty = fixed_depth_option(cost, users, rnd, [], [])
    assert empty.share == 0.0 and empty.memory_bytes == 0.0 and empty.depth.shape == (0,) and empty.depth.dtype.kind == "i"
    # forbid depth 2 only: depth 2 is not allowed, depths 1 and 3 are
    allowed = users.allowed.copy()
    allowed[:, 1] = False
    u2 = replace(users, allowed=allowed)
    bad = fixed_depth_option(cost, u2, rnd, [0, 1], [2, 2])
    assert bad.share == float("inf") and bad.memory_bytes == float("inf") and np.array_equal(bad.depth, [2, 2])
    for d in (1, 3):
        good = fixed_depth_option(cost, u2, rnd, [0, 1], [d, d])
        same = fixed_depth_option(cost, users, rnd, [0, 1], [d, d])
        assert (good.share, good.memory_bytes) == (same.share, same.memory_bytes) and np.array_equal(good.depth, [d, d])
        assert 0 < good.share < float("inf") and 0 < good.memory_bytes < float("inf")
    # depth 3 needs more memory than depth 1 (the padded query is wider)
    assert fixed_depth_option(cost, u2, rnd, [0, 1], [3, 3]).memory_bytes > fixed_depth_option(cost, u2, rnd, [0, 1], [1, 1]).memory_bytes


def opt(share, mem):
    return EdOption(np.ones(1, dtype=np.int64), share, mem)


def test_cheapest_option_boundaries():
    eps = 1e-9
    options = [opt(0.2, 100.0), opt(0.5, 50.0), opt(0.9, 10.0)]
    assert cheapest_option(options, 1.0, 1000.0) is options[0]
    assert cheapest_option(options, 0.6, 60.0) is options[1]
    assert cheapest_option(options, 0.6, 40.0) is None  # the one that fits the share lacks memory, and vice versa
    assert cheapest_option(options, 0.1, 1000.0) is None
    assert cheapest_option(options, 1.0, 9.0) is None
    assert cheapest_option([], 1.0, 1.0) is None
    # exactly on the budgets, and within the tolerance above them, still fits
    assert cheapest_option([opt(0.5, 80.0)], 0.5, 80.0) is not None
    assert cheapest_option([opt(0.5 + eps, 80.0)], 0.5, 80.0) is not None
    assert cheapest_option([opt(0.5 + 0.5 * eps, 80.0)], 0.5, 80.0) is not None
    assert cheapest_option([opt(0.5, 80.0 * (1 + eps))], 0.5, 80.0) is not None
    assert cheapest_option([opt(0.5, 80.0 * (1 + 0.5 * eps))], 0.5, 80.0) is not None
    # clearly over either budget does not
    assert cheapest_option([opt(0.5 + 1e-6, 80.0)], 0.5, 80.0) is None
    assert cheapest_option([opt(1.5, 80.0)], 1.0, 80.0) is None
    assert cheapest_option([opt(0.5, 80.0 * (1 + 1e-6))], 0.5, 80.0) is None
    assert cheapest_option([opt(0.5, 150.0)], 0.5, 80.0) is None
    assert cheapest_option([opt(0.5, 81.0)], 0.5, 80.0, eps=0.02) is not None


# ---------------------------------------------------------------- agents.balance_ed


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), most=st.integers(2, 10))
def test_spaced_keeps_first_and_last_and_spreads_evenly(n, most):
    items = [f"s{i}" for i in range(n)]
    out = spaced(items, most)
    if n <= most:
        assert out == items
        return
    assert len(out) == most and out[0] == items[0] and out[-1] == items[-1]
    pos = [items.index(x) for x in out]
    assert pos == sorted(set(pos))
    step = (n - 1) / (most - 1)
    assert all(abs(p - i * step) <= 0.5 for i, p in enumerate(pos))  # each the nearest item to its even spot


def test_spaced_exact():
    assert spaced(list(range(10)), 6) == [0, 2, 4, 5, 7, 9]
    assert spaced(list(range(7)), 6) == [0, 1, 2, 4, 5, 6]
    assert spaced(list(range(6)), 6) == list(range(6))
    assert spaced(list(range(3)), 2) == [0, 2]


def test_split_search_within_edge_cases():
    cfg, cost = setting(6, edge_fraction=0.0)
    g = grid(0.1)
    rnd = make_rounds(cfg, 1, 3)[0]
    plan = split_search(cost, rnd, 4, g, g)
    assert plan.admitted > 0
    for share in (0.0, -0.5):
        modes, z, lam = split_search_within(cost, rnd, 4, g, g, share, 0.0)
        assert modes.shape == (6,) and modes.dtype.kind == "i" and not modes.any() and (z, lam) == (1.0, 1.0)
    modes, z, lam = split_search_within(cost, rnd.subset(np.zeros(0, dtype=np.int64)), 4, g, g, 1.0, 0.0)
    assert modes.shape == (0,) and (z, lam) == (1.0, 1.0)
    # nothing fits: no memory left -> nobody
    modes, z, lam = split_search_within(cost, rnd, 4, g, g, 1.0, 1e15)
    assert modes.dtype.kind == "i" and not modes.any()
    # one servable user alone is served, like BALANCE serves it
    one = next(rnd.subset([u]) for u in range(6) if split_search(cost, rnd.subset([u]), 4, g, g).admitted == 1)
    modes, z, lam = split_search_within(cost, one, 4, g, g, 1.0, 0.0)
    p1 = split_search(cost, one, 4, g, g)
    assert np.array_equal(modes, p1.modes) and modes.any() and (z, lam) == (p1.z, p1.lam)


def test_modes_for_rest_leaves_ed_users_out_and_serves_the_rest_within_what_ed_leaves():
    cfg, cost = setting(8, edge_fraction=0.0)
    g = grid(0.1)
    for rnd in make_rounds(cfg, 2, 4):
        ed_idx = np.array([1, 4])
        option = EdOption(np.array([2, 2]), 0.3, 1e9)
        modes = modes_for_rest(cost, rnd, 4, g, g, ed_idx, option)
        rest = np.array([0, 2, 3, 5, 6, 7])
        sub, _, _ = split_search_within(cost, rnd.subset(rest), 4, g, g, 0.7, 1e9)
        assert modes.shape == (8,) and modes.dtype.kind == "i"
        assert not modes[ed_idx].any() and np.array_equal(modes[rest], sub)
        none_ed = modes_for_rest(cost, rnd, 4, g, g, np.zeros(0, dtype=np.int64), EdOption(np.zeros(0, dtype=np.int64), 0.0, 0.0))
        assert np.array_equal(none_ed, split_search(cost, rnd, 4, g, g).modes)
        everyone = modes_for_rest(cost, rnd, 4, g, g, np.arange(8), EdOption(np.ones(8, dtype=np.int64), 0.5, 0.0))
        assert not everyone.any() and everyone.dtype.kind == "i"


def check_family(cost, users, rnd, sets, share_total=1.0):
    assert sets[0].shape == (0,) and sets[0].dtype.kind == "i"
    for a, b in itertools.pairwise(sets):
        assert b.dtype.kind == "i" and np.array_equal(b, np.sort(b)) and len(b) == len(a) + 1 and set(a) < set(b)
        assert ed_fits(cost, users, rnd, b, share_total)
    alone = {int(k): min((o.share for o in ed_options(cost, users, rnd, [k])), default=np.inf) for k in np.flatnonzero(users.allowed.any(axis=1))}
    added = [int(next(iter(set(b) - set(a)))) for a, b in itertools.pairwise(sets)]
    assert [alone[k] for k in added] == sorted(alone[k] for k in added)  # joined by least share alone, ascending
    last = sets[-1]
    for k in alone:  # maximal: every edge-capable user left out does not fit with the final set
        if k not in set(last.tolist()):
            assert not ed_fits(cost, users, rnd, np.sort(np.append(last, k)), share_total)
    return added


def test_nested_ed_sets_grow_by_least_share_stay_feasible_and_are_maximal():
    cfg, cost = setting(12, edge_fraction=0.6, max_gamma=4, deadline_s=[0.5, 4.0], output_tokens=[20, 200])
    split = SplitCostModel(cost.profile)
    grew, left_out = 0, 0
    for rnd in make_rounds(cfg, 4, 21):
        users = ed_users(split, rnd, 4)
        sets = nested_ed_sets(cost, users, rnd)
        added = check_family(cost, users, rnd, sets)
        grew += len(added) >= 2
        left_out += len(added) < int(users.allowed.any(axis=1).sum())
        half = nested_ed_sets(cost, users, rnd, share_total=0.3)
        check_family(cost, users, rnd, half, 0.3)
        assert len(half) <= len(sets)
    assert grew and left_out  # the family grows, and the share binds somewhere


def test_nested_ed_sets_without_edge_users_is_only_the_empty_set():
    cfg, cost = setting(5, edge_fraction=0.0)
    rnd = make_rounds(cfg, 1, 0)[0]
    users = ed_users(SplitCostModel(cost.profile), rnd, 4)
    (only,) = nested_ed_sets(cost, users, rnd)
    assert only.shape == (0,) and only.dtype.kind == "i"


def test_nested_ed_sets_with_a_single_edge_user():
    cfg, cost = setting(6, edge_fraction=1.0, max_gamma=4, deadline_s=[2.0, 3.0], output_tokens=[20, 60])
    rnd = make_rounds(cfg, 1, 0)[0]
    users = ed_users(SplitCostModel(cost.profile), rnd, 4)
    allowed = np.zeros_like(users.allowed)
    allowed[3] = users.allowed[3]
    one = replace(users, allowed=allowed)
    assert allowed[3].any()
    sets = nested_ed_sets(cost, one, rnd)
    assert len(sets) == 2 and sets[0].shape == (0,) and np.array_equal(sets[1], [3])


def test_plan_with_ed_takes_the_exact_check_shares():
    cfg, cost = setting(8, edge_fraction=0.7, max_gamma=4)
    split = SplitCostModel(cost.profile)
    g = grid(0.1)
    done = 0
    for rnd in make_rounds(cfg, 4, 5):
        users = ed_users(split, rnd, 4)
        sets = nested_ed_sets(cost, users, rnd)
        ed_idx = sets[-1]
        if len(ed_idx) == 0:
            continue
        option = cheapest_option(ed_options(cost, users, rnd, ed_idx), 1.0, float(cost.memory_budget(False)))
        modes = modes_for_rest(cost, rnd, 4, g, g, ed_idx, option)
        plan = plan_with_ed(cost, users, rnd, 4, ed_idx, option, modes)
        depth = np.zeros(8, dtype=np.int64)
        depth[ed_idx] = option.depth
        full = modes.copy()
        full[ed_idx] = ED
        rep = check_plan_split(cost, users, rnd, full, 4, depth)
        assert rep.feasible
        assert np.array_equal(plan.modes, full) and np.array_equal(plan.ed_depth, depth) and plan.gamma == 4
        assert (plan.z, plan.lam, plan.ed_share) == (rep.z, rep.lam, rep.ed_share) and plan.ed_share > 0
        assert not modes[ed_idx].any()  # the input is not changed
        done += 1
    assert done
    # no ED user: a plain plan, no depths and no ED share
    rnd = make_rounds(cfg, 1, 5)[0]
    users = ed_users(split, rnd, 4)
    modes = split_search(cost, rnd, 4, g, g).modes
    plan = plan_with_ed(cost, users, rnd, 4, np.zeros(0, dtype=np.int64), EdOption(np.zeros(0, dtype=np.int64), 0.0, 0.0), modes)
    rep = check_plan_split(cost, users, rnd, modes, 4, np.zeros(8, dtype=np.int64))
    assert plan.ed_depth is None and plan.ed_share == 0.0 and (plan.z, plan.lam) == (rep.z, rep.lam)


def expected_balance_ed_admitted(cost, users, rnd, sched):
    """The docstring's rule: best over the empty set and the spaced sets of both nested families."""
    base = split_search(cost, rnd, sched.gamma, sched._z, sched._lam)
    rejected = replace(users, allowed=users.allowed & (base.modes == REJECT)[:, None])
    best = base.admitted
    for fam in (nested_ed_sets(cost, users, rnd), nested_ed_sets(cost, rejected, rnd)):
        for s in spaced(fam, sched.max_ed_sets)[1:]:
            o = cheapest_option(ed_options(cost, users, rnd, s), 1.0, float(cost.memory_budget(False)))
            if o is not None:
                best = max(best, len(s) + int(np.count_nonzero(modes_for_rest(cost, rnd, sched.gamma, sched._z, sched._lam, s, o))))
    return base, best


def check_balance_ed(cost, cfg, rnds):
    """BalanceED's plan on each round against its docstring; returns how many plans run ED."""
    split = SplitCostModel(cost.profile)
    sched = BalanceED(cost, cfg.max_gamma, 4, grid_step=0.1)
    assert isinstance(sched.split, SplitCostModel) and sched.grid_step == 0.1
    k, better = cfg.num_users, 0
    for rnd in rnds:
        users = ed_users(split, rnd, cfg.max_gamma)
        plan = sched.plan(rnd)
        base, best = expected_balance_ed_admitted(cost, users, rnd, sched)
        rep = check_plan_split(cost, users, rnd, plan.modes, plan.gamma, plan.ed_depth if plan.ed_depth is not None else np.zeros(k, dtype=np.int64))
        assert rep.feasible and plan.admitted == best
        if plan.admitted_ed:
            better += 1
            assert plan.admitted > base.admitted
            assert (plan.z, plan.lam, plan.ed_share) == (rep.z, rep.lam, rep.ed_share) and plan.ed_share > 0
            ed = plan.modes == ED
            assert (plan.ed_depth[ed] >= 1).all() and not plan.ed_depth[~ed].any() and users.allowed[ed, plan.ed_depth[ed] - 1].all()
        else:  # ties keep BALANCE's own plan
            assert np.array_equal(plan.modes, base.modes) and (plan.z, plan.lam, plan.gamma) == (base.z, base.lam, base.gamma)
            assert plan.ed_depth is None and plan.ed_share == 0.0
    return better


def test_balance_ed_serves_the_best_documented_candidate_and_keeps_balance_on_ties():
    cfg, cost = setting(10, edge_fraction=0.8, max_gamma=4, deadline_s=[0.5, 4.0], output_tokens=[20, 200])
    # round 2 of seed 1 and round 3 of seed 5 are ones where an ED batch beats BALANCE; the others tie
    assert check_balance_ed(cost, cfg, make_rounds(cfg, 4, 1) + make_rounds(cfg, 4, 5)) >= 2


def test_balance_ed_keeps_balance_when_ed_cannot_beat_it():
    # relaxed deadlines: BALANCE serves everyone, so no ED set serves more and the plan is BALANCE's own
    cfg = EnvConfig(num_users=4, profile=PROFILE, edge_fraction=1.0, max_gamma=4, deadline_s=[20.0, 30.0], output_tokens=[20, 40])
    cost = CostModel.from_config(cfg)
    for rnd in make_rounds(cfg, 2, 1):
        a, b = Balance(cost, 4, 4, grid_step=0.1).plan(rnd), BalanceED(cost, 4, 4, grid_step=0.1).plan(rnd)
        assert a.admitted == 4
        assert np.array_equal(a.modes, b.modes) and (a.z, a.lam, a.gamma) == (b.z, b.lam, b.gamma) and b.ed_depth is None


# ---------------------------------------------------------------- agents.edge_first


def expected_depths(split, rnd, users, max_depth, rtt=None):
    has = users.allowed.any(axis=1)
    cohort = max(1, -(-int(has.sum()) // 2))
    rtt = rnd.rtt_s if rtt is None else rtt
    out = np.zeros(rnd.num_users, dtype=np.int64)
    for u in np.flatnonzero(has):
        out[u] = split.calibrated_depth(float(rnd.alpha[u]), float(rnd.input_tokens[u]) + float(rnd.output_tokens[u]) / 2.0, float(rtt[u]),
                                        verify_clients=cohort, max_depth=max_depth)
    return out


@pytest.mark.parametrize("n_edge", [1, 2, 3, 5, 8])
def test_calibrated_depths_follow_the_documented_rule(n_edge):
    # long contexts and short round trips: depths above 1 that depend on the cohort size
    cfg, cost = setting(8, edge_fraction=1.0, max_gamma=8, rtt_ms=[0.2, 8.0], input_tokens=[1500, 4000], output_tokens=[20, 2000])
    split = SplitCostModel(cost.profile)
    for rnd in make_rounds(cfg, 2, 40 + n_edge):
        users = ed_users(split, rnd, 8)
        allowed = users.allowed.copy()
        allowed[n_edge:] = False
        u2 = replace(users, allowed=allowed)
        got = calibrated_depths(split, rnd, u2, 8)
        assert got.dtype.kind == "i" and not got[n_edge:].any() and (got[:n_edge] >= 1).all()
        assert np.array_equal(got, expected_depths(split, rnd, u2, 8))
        assert np.array_equal(calibrated_depths(split, rnd, u2, 3), expected_depths(split, rnd, u2, 3))
        assert calibrated_depths(split, rnd, u2, 3).max() <= 3
        # without per-user RTTs every user gets the profile's RTT
        no_rtt = rnd.subset(np.arange(8))
        no_rtt.rtt_s = None
        assert np.array_equal(calibrated_depths(split, no_rtt, u2, 8), expected_depths(split, no_rtt, u2, 8, np.full(8, split.net.rtt_s)))


def check_edge_first(cost, cfg, rnds):
    """EdgeFirst's plan on each round against its docstring; returns how many plans run ED."""
    split = SplitCostModel(cost.profile)
    sched = EdgeFirst(cost, cfg.max_gamma, 4, grid_step=0.1)
    assert isinstance(sched.split, SplitCostModel) and sched.grid_step == 0.1
    mem = float(cost.memory_budget(False))
    with_ed = 0
    for rnd in rnds:
        users = ed_users(split, rnd, cfg.max_gamma)
        depth = calibrated_depths(split, rnd, users, cfg.max_gamma)
        cand = [u for u in np.flatnonzero(depth > 0) if users.allowed[u, depth[u] - 1]]
        plan = sched.plan(rnd)
        ed = np.flatnonzero(plan.modes == ED)
        if len(ed) == 0:
            base = split_search(cost, rnd, sched.gamma, sched._z, sched._lam)
            assert np.array_equal(plan.modes, base.modes) and plan.ed_depth is None
            for u in cand:  # nobody fits alone
                o = fixed_depth_option(cost, users, rnd, [u], depth[[u]])
                assert not (o.share <= 1 + 1e-9 and o.memory_bytes <= mem * (1 + 1e-9))
            continue
        with_ed += 1
        assert set(ed.tolist()) <= set(int(u) for u in cand)
        assert np.array_equal(plan.ed_depth[ed], depth[ed]) and not plan.ed_depth[plan.modes != ED].any()
        option = fixed_depth_option(cost, users, rnd, ed, depth[ed])
        assert option.share <= 1 + 1e-9 and option.memory_bytes <= mem * (1 + 1e-9)
        for u in cand:  # maximal: any candidate left out overloads the batch
            if u not in ed:
                trial = np.sort(np.append(ed, u))
                o = fixed_depth_option(cost, users, rnd, trial, depth[trial])
                assert not (o.share <= 1 + 1e-9 and o.memory_bytes <= mem * (1 + 1e-9))
        rest = modes_for_rest(cost, rnd, sched.gamma, sched._z, sched._lam, ed, option)
        expected = plan_with_ed(cost, users, rnd, sched.gamma, ed, option, rest)
        assert np.array_equal(plan.modes, expected.modes) and (plan.z, plan.lam, plan.ed_share) == (expected.z, expected.lam, expected.ed_share)
        assert check_plan_split(cost, users, rnd, plan.modes, plan.gamma, plan.ed_depth).feasible
    return with_ed


def test_edge_first_puts_a_feasible_maximal_calibrated_batch_first():
    cfg, cost = setting(10, edge_fraction=0.6, max_gamma=6)
    assert check_edge_first(cost, cfg, make_rounds(cfg, 6, 17)) >= 2


def test_when_server_kv_binds_the_ed_batches_respect_the_ad_only_budget(tmp_path):
    # a server with KV room for only 1500 LLM tokens beside the LLM weights: less than the SLM's weights,
    # so the budget with the SLM loaded is negative; ED (no SLM on the server) must use the AD-only budget
    _, base = setting(2)
    with (PROFILE_DIR / f"{PROFILE}.yaml").open() as fh:
        d = yaml.safe_load(fh)
    d["device"]["memory_bytes"] = float(d["device"]["reserve_bytes"]) + float(base.w_l) + 1500 * float(base.kv_l)
    path = tmp_path / "tight_server.yaml"
    path.write_text(yaml.safe_dump(d))
    cfg = EnvConfig(num_users=10, profile=str(path), edge_fraction=1.0, max_gamma=4, deadline_s=[5.0, 10.0], output_tokens=[20, 60],
                    input_tokens=[100, 200], rtt_ms=[5.0, 65.0])
    cost = CostModel.from_config(cfg)
    assert float(cost.memory_budget(True)) < 0 < float(cost.memory_budget(False))
    split = SplitCostModel(cost.profile)
    rnds = make_rounds(cfg, 3, 8)
    mem_bound = 0
    for rnd in rnds:
        users = ed_users(split, rnd, 4)
        sets = nested_ed_sets(cost, users, rnd)
        check_family(cost, users, rnd, sets)
        last = sets[-1]
        assert len(last) >= 5
        # some user left out fits the share but not the memory
        mem_bound += any(min(o.share for o in ed_options(cost, users, rnd, np.sort(np.append(last, k)))) <= 1.0
                         for k in range(10) if k not in set(last.tolist()) and ed_options(cost, users, rnd, np.sort(np.append(last, k))))
    assert mem_bound
    assert check_edge_first(cost, cfg, rnds) >= 1
    assert check_balance_ed(cost, cfg, rnds) >= 1  # round 2: ED beats BALANCE


def test_edge_first_admits_an_ed_batch_that_exactly_fills_the_kv_budget(tmp_path):
    """The greedy's memory test is tolerant (``<= M (1 + 1e-9)``), never strict: on a server whose
    AD-only KV budget is exactly the memory of the ED batch EdgeFirst picks with room to spare,
    it picks the same batch (the last user added fills the budget to the byte)."""
    cfg, roomy = setting(10, edge_fraction=1.0, max_gamma=4, deadline_s=[5.0, 10.0], output_tokens=[20, 60], input_tokens=[100, 200])
    split = SplitCostModel(roomy.profile)
    checked = 0
    for rnd in make_rounds(cfg, 4, 8):
        plan = EdgeFirst(roomy, 4).decide(rnd)
        ed = np.flatnonzero(plan.ed_depth > 0) if plan.ed_depth is not None else np.zeros(0, dtype=np.int64)
        if len(ed) < 2:
            continue
        users = ed_users(split, rnd, 4)
        need = fixed_depth_option(roomy, users, rnd, ed, plan.ed_depth[ed]).memory_bytes
        assert need < float(roomy.memory_budget(False))  # with room to spare, memory did not bind
        with (PROFILE_DIR / f"{PROFILE}.yaml").open() as fh:
            d = yaml.safe_load(fh)
        d["device"]["memory_bytes"] = float(d["device"]["reserve_bytes"]) + float(roomy.w_l) + need
        path = tmp_path / f"exact_{checked}.yaml"
        path.write_text(yaml.safe_dump(d))
        exact = CostModel.from_config(replace(cfg, profile=str(path)))
        assert float(exact.memory_budget(False)) == pytest.approx(need, rel=1e-15)
        again = EdgeFirst(exact, 4).decide(rnd)
        assert again.ed_depth is not None and np.array_equal(np.flatnonzero(again.ed_depth > 0), ed)
        assert np.array_equal(again.ed_depth[ed], plan.ed_depth[ed])
        checked += 1
    assert checked >= 1


def test_edge_first_checks_each_user_at_its_own_calibrated_depth(tmp_path):
    # an edge with KV room for 200 draft tokens and requests of 185-205 tokens: many users are allowed at
    # shallow depths only, so the depth checked must be the user's calibrated one
    with (PROFILE_DIR / f"{PROFILE}.yaml").open() as fh:
        d = yaml.safe_load(fh)
    dev = d["edge"]["device"]
    kv_s = 2 * d["slm"]["layers"] * d["slm"]["kv_heads"] * d["slm"]["head_dim"] * d["slm"]["dtype_bytes"]
    dev["memory_bytes"] = float(dev["reserve_bytes"]) + float(d["slm"]["params"]) * d["slm"]["dtype_bytes"] + 200 * kv_s
    path = tmp_path / "small_edge.yaml"
    path.write_text(yaml.safe_dump(d))
    cfg = EnvConfig(num_users=8, profile=str(path), edge_fraction=1.0, max_gamma=8, deadline_s=[5.0, 10.0], input_tokens=[180, 195],
                    output_tokens=[5, 10], rtt_ms=[0.5, 30.0])
    cost = CostModel.from_config(cfg)
    split = SplitCostModel(cost.profile)
    rnds = make_rounds(cfg, 3, 2)
    straddle = 0
    for rnd in rnds:
        users = ed_users(split, rnd, 8)
        depth = calibrated_depths(split, rnd, users, 8)
        has = users.allowed.any(axis=1)
        ok = users.allowed[np.flatnonzero(has), depth[has] - 1]
        straddle += int((ok & ~users.allowed[has].all(axis=1)).sum())
    assert straddle  # users allowed at their calibrated depth but not at every depth
    assert check_edge_first(cost, cfg, rnds) >= 2


def test_edge_first_with_a_single_edge_user():
    cfg, cost = setting(6, edge_fraction=0.2, max_gamma=4, deadline_s=[5.0, 10.0], output_tokens=[20, 60])
    rnds = [r for r in make_rounds(cfg, 12, 3) if r.has_edge.sum() == 1]
    assert len(rnds) >= 2
    assert check_edge_first(cost, cfg, rnds) >= 1


def test_edge_first_without_candidates_is_balance():
    cfg, cost = setting(6, edge_fraction=0.0)
    for rnd in make_rounds(cfg, 2, 2):
        a, b = Balance(cost, 8, 4, grid_step=0.1).plan(rnd), EdgeFirst(cost, 8, 4, grid_step=0.1).plan(rnd)
        assert np.array_equal(a.modes, b.modes) and (a.z, a.lam) == (b.z, b.lam) and b.ed_depth is None
