"""The per-mode solver and BALANCE against brute-force oracles, on random and adversarial rounds.

Every oracle here enumerates subsets or plans with the exact feasibility formulas of
``envs.feasibility`` (see ``tests/adversarial_rounds.py``), so a wrong price in the solver's table
(an extra SD iteration, a missing ``+gamma``, a longest output the batch does not hold) or an
off-by-one in its pruning fails them, at exact memory limits and with both KV models.
"""

from __future__ import annotations

import numpy as np
import pytest
from adversarial_rounds import (
    adversarial_round,
    best_single_mode,
    brute_force_optimum,
    issue_counterexample,
    mixed_round,
    mode_cost_and_memory,
    subset_masks,
)
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agents.balance import Balance, grid, split_search
from agents.mode_solver import build_table, solve_mode, upper_bound_grid
from agents.optimal import Exhaustive, split_upper_bound
from agents.registry import make_scheduler
from envs import CostModel, EnvConfig, sample_round
from envs.feasibility import check_plan
from envs.plan import AD, SD
from envs.workload import Round

GAMMA = 4
CFG = EnvConfig(num_users=8)
COSTS = {kv: CostModel(CostModel.from_config(CFG).profile, kv) for kv in ("per_user", "padded")}
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
kv_models = st.sampled_from(["per_user", "padded"])
kinds = st.sampled_from([False, True, "mixed"])  #: random, adversarial, mixed-plan rounds


def _case(seed: int, k: int, kv: str, adversarial: bool | str, tight: bool):
    """(round, cost model) -- random paper-setting rounds, adversarial ones (True) or ones whose
    best plan mixes both modes ("mixed"); memory tight at one subset's exact need or not."""
    rng = np.random.default_rng(seed)
    if adversarial is True:
        case = adversarial_round(rng, CFG, COSTS[kv], k, GAMMA, tight_memory=tight)
        return case.rnd, case.cost
    rnd = mixed_round(rng, CFG, COSTS[kv], k, GAMMA) if adversarial == "mixed" else sample_round(rng, CFG, num_users=k)
    cost = COSTS[kv]
    if tight:
        # the KV budget (draft loaded) equals one subset's exact need in one mode
        masks = subset_masks(k)[1:]
        mode = AD if rng.random() < 0.5 else SD
        need = mode_cost_and_memory(cost, rnd, masks, mode, GAMMA)[2][rng.integers(len(masks))]
        p = cost.profile
        cost = CostModel(p.with_memory(need + p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes), kv)
    return rnd, cost


def _n(name: str, cost: CostModel, rnd) -> int:
    plan = make_scheduler(name, cost, CFG.max_gamma, draft_depth=GAMMA).plan(rnd)
    assert check_plan(cost, rnd, plan).feasible, name
    return plan.admitted


# ------------------------------------------------------------------ the issue's counterexample
@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_issue_counterexample_is_served(kv):
    cost = COSTS[kv]
    rnd = issue_counterexample(CFG, cost, GAMMA)
    assert brute_force_optimum(cost, rnd, GAMMA) == 1
    # the short user's deadline sits between its own SD cost and the long user's: only SD serves it
    assert _n("sd_only", cost, rnd) == 1
    assert _n("balance", cost, rnd) == 1


def test_issue_second_round_all_sd_plan_of_three():
    """Issue 10's second kind of round (found by the adversarial generator against the pre-fix
    solver, which served 2): the exact check accepts an all-SD plan of 3, and BALANCE finds it."""
    cost = COSTS["per_user"]
    rnd = Round.from_arrays(
        CFG,
        input_tokens=[48, 48, 133, 48],
        output_tokens=[18, 133, 86, 107],
        deadline_s=[1.790494516272177, 0.022691204652496518, 1.791572621846526, 1.7908659398794107],
        alpha=[0.9306465752398776, 0.870815098040508, 0.8649217004128311, 0.6421299239466433],
        distance_m=[199.79937132344224, 211.83632632916255, 213.07357304201182, 47.621808964932015],
    )
    assert check_plan(cost, rnd, np.array([SD, 0, SD, SD]), GAMMA).feasible
    assert brute_force_optimum(cost, rnd, GAMMA) == 3
    assert _n("sd_only", cost, rnd) == 3
    assert _n("balance", cost, rnd) == 3


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_issue_counterexample_at_the_memory_limit(kv):
    """The short user's row holds the long user, so it is solved per output threshold; with KV
    budget exactly the short user's SD need it is served, a hair under it it is not."""
    cost = COSTS[kv]
    rnd = issue_counterexample(CFG, cost, GAMMA)
    short = np.array([[True, False]])
    need = float(mode_cost_and_memory(cost, rnd, short, SD, GAMMA)[2][0])
    tab = build_table(cost, rnd, SD, GAMMA)
    both = np.ones(2, dtype=bool)
    assert solve_mode(tab, both, 1.0, need).tolist() == [0]
    assert len(solve_mode(tab, both, 1.0, need * (1 - 1e-6))) == 0
    p = cost.profile
    at_limit = CostModel(p.with_memory(need + p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes), kv)
    assert _n("sd_only", at_limit, rnd) == 1 == brute_force_optimum(at_limit, rnd, GAMMA)


# ------------------------------------------------------------------ single-mode schedulers
@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 8), kv=kv_models, adversarial=kinds, tight=st.booleans())
# found by long runs against planted bugs: the per-output-threshold rows' KV base without
# ``+gamma`` (padded KV, memory at one subset's exact need) ...
@example(seed=425, k=8, kv="padded", adversarial=False, tight=True)
# ... and against memory pruning that counts one user's output too many (per-user KV)
@example(seed=201166, k=6, kv="per_user", adversarial="mixed", tight=True)
def test_ad_only_and_sd_only_equal_brute_force(seed, k, kv, adversarial, tight):
    rnd, cost = _case(seed, k, kv, adversarial, tight)
    want_ad, _ = best_single_mode(cost, rnd, AD, GAMMA, 1.0, float(cost.memory_budget(False)))
    want_sd, _ = best_single_mode(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True)))
    assert _n("ad_only", cost, rnd) == want_ad
    assert _n("sd_only", cost, rnd) == want_sd


# ------------------------------------------------------------------ solve_mode itself
@SETTINGS
@given(
    seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 8),
    kv=kv_models,
    adversarial=kinds,
    mode=st.sampled_from([AD, SD]),
    limit=st.sampled_from(["loose", "exact", "just_below"]),
)
def test_solve_mode_equals_brute_force(seed, k, kv, adversarial, mode, limit):
    rnd, cost = _case(seed, k, kv, adversarial, tight=False)
    rng = np.random.default_rng(seed + 1)
    avail = rng.random(k) < 0.8
    share = float(rng.choice([1.0, 0.5, rng.uniform(0.05, 1.0)]))
    masks = subset_masks(k)[1:]
    footprint = mode_cost_and_memory(cost, rnd, masks, mode, GAMMA)[2]
    mem = {
        "loose": float(cost.memory_budget(True)),
        # memory binds: exactly one subset's need, or a hair under it
        "exact": float(footprint[rng.integers(len(masks))]),
        "just_below": float(footprint[rng.integers(len(masks))]) * (1 - 1e-6),
    }[limit]
    tab = build_table(cost, rnd, mode, GAMMA)
    got = solve_mode(tab, avail, share, mem)
    want, _ = best_single_mode(cost, rnd, mode, GAMMA, share, mem, avail)
    assert len(got) == want
    assert avail[got].all()
    # the returned set itself is feasible in that mode with that share and memory
    chosen = np.zeros(k, dtype=bool)
    chosen[got] = True
    _, need, used = mode_cost_and_memory(cost, rnd, chosen[None, :], mode, GAMMA)
    assert need[0] <= share * (1 + 1e-9) and used[0] <= mem * (1 + 1e-9)
    # asking for more than the optimum gives nothing; asking for less finds the optimum
    assert len(solve_mode(tab, avail, share, mem, at_least=want)) == 0
    assert len(solve_mode(tab, avail, share, mem, at_least=max(want - 1, 0))) == want
    # the bounds BALANCE prunes with never undercut the solver (every user available)
    everyone = np.ones(k, dtype=bool)
    assert upper_bound_grid(tab, [share], [mem])[0, 0] >= len(solve_mode(tab, everyone, share, mem))


@pytest.mark.parametrize("kv", ["per_user", "padded"])
@pytest.mark.parametrize("mode", [AD, SD])
def test_memory_limit_admits_exactly_n(kv, mode):
    """Loose deadlines, KV budget exactly the n smallest users' need: n are served, n-1 just below."""
    cost = COSTS[kv]
    k, n = 6, 4
    rnd = sample_round(np.random.default_rng(5), CFG.replace(deadline_s=[1e3, 1e3]), num_users=k)
    small = np.zeros(k, dtype=bool)
    small[np.argsort(rnd.output_tokens, kind="stable")[:n]] = True
    # give every user the largest input so that the padded input is the same for every subset
    rnd.input_tokens[:] = rnd.input_tokens.max()
    need = float(mode_cost_and_memory(cost, rnd, small[None, :], mode, GAMMA)[2][0])
    tab = build_table(cost, rnd, mode, GAMMA)
    everyone = np.ones(k, dtype=bool)
    assert len(solve_mode(tab, everyone, 1.0, need)) == n
    # any n users hold at least the n smallest outputs (and, padded, at least the n-th smallest)
    assert len(solve_mode(tab, everyone, 1.0, need * (1 - 1e-6))) == n - 1


# ------------------------------------------------------------------ BALANCE and the split baselines
def _point_budgets(cost: CostModel, z: float, lam: float):
    m_rem = float(cost.memory_budget(z < 1.0))
    return (z, lam * m_rem), (0.0, 0.0) if z >= 1.0 else (1.0 - z, (1.0 - lam) * m_rem)


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(2, 7), kv=kv_models, adversarial=kinds, tight=st.booleans())
def test_balance_and_split_baselines_solve_each_mode_exactly(seed, k, kv, adversarial, tight):
    rnd, cost = _case(seed, k, kv, adversarial, tight)
    opt = brute_force_optimum(cost, rnd, GAMMA)
    counts = {}
    for name in ("balance", "ecra", "ema", "ecrma"):
        plan = make_scheduler(name, cost, CFG.max_gamma, draft_depth=GAMMA).plan(rnd)
        assert check_plan(cost, rnd, plan).feasible, name
        counts[name] = plan.admitted
        if plan.admitted == 0:
            continue
        # at the split it chose, AD is a best AD set and SD a best SD set among the rest
        (za, ma), (zs, ms) = _point_budgets(cost, plan.z, plan.lam)
        ad_set = plan.modes == AD
        assert plan.admitted_ad == best_single_mode(cost, rnd, AD, GAMMA, za, ma)[0], name
        assert plan.admitted_sd == best_single_mode(cost, rnd, SD, GAMMA, zs, ms, ~ad_set)[0], name
    assert opt >= counts["balance"] >= max(counts["ecra"], counts["ema"], counts["ecrma"])
    assert 2 * counts["balance"] >= opt
    # BALANCE is never below either single-mode optimum (its corners)
    assert counts["balance"] >= best_single_mode(cost, rnd, AD, GAMMA, 1.0, float(cost.memory_budget(False)))[0]
    assert counts["balance"] >= best_single_mode(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True)))[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(2, 6), kv=kv_models, tight=st.booleans())
def test_adversarial_rounds_balance_half_and_exhaustive_exact(seed, k, kv, tight):
    rnd, cost = _case(seed, k, kv, adversarial=True, tight=tight)
    opt = brute_force_optimum(cost, rnd, GAMMA)
    ex = Exhaustive(cost, CFG.max_gamma, draft_depth=GAMMA, warm_start=False).plan(rnd)
    assert check_plan(cost, rnd, ex).feasible
    assert ex.admitted == opt
    assert opt >= _n("balance", cost, rnd) and 2 * _n("balance", cost, rnd) >= opt
    # the certified bound (optimistic SD tables over a split grid) never undercuts the optimum
    assert split_upper_bound(cost, rnd, GAMMA) >= opt


def _full_scan(cost: CostModel, rnd, zs, lams) -> int:
    """BALANCE without any pruning: both per-mode solves at every grid point."""
    ad_tab, sd_tab = build_table(cost, rnd, AD, GAMMA), build_table(cost, rnd, SD, GAMMA)
    everyone = np.ones(rnd.num_users, dtype=bool)
    best = 0
    for z in zs:
        for lam in lams:
            (za, ma), (zs_, ms) = _point_budgets(cost, float(z), float(lam))
            ad = solve_mode(ad_tab, everyone, za, ma)
            rest = everyone.copy()
            rest[ad] = False
            best = max(best, len(ad) + len(solve_mode(sd_tab, rest, zs_, ms)))
    return best


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(2, 8), kv=kv_models, adversarial=kinds, tight=st.booleans())
def test_grid_pruning_matches_full_scan(seed, k, kv, adversarial, tight):
    rnd, cost = _case(seed, k, kv, adversarial, tight)
    g = grid(0.1)
    plan = split_search(cost, rnd, GAMMA, g, g)
    assert plan.admitted == _full_scan(cost, rnd, g, g)
    assert Balance(cost, CFG.max_gamma, draft_depth=GAMMA, grid_step=0.1).plan(rnd).admitted == plan.admitted


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_grid_pruning_matches_full_scan_on_mixed_rounds(kv):
    """On rounds whose best split mixes both modes (memory binding or not) every skipped grid
    point matters."""
    g = grid(0.1)
    mixed = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        k = 4 + seed % 5
        rnd = mixed_round(rng, CFG, COSTS[kv], k, GAMMA)
        cost = COSTS[kv]
        if seed % 2:
            # memory binds at the exact KV need (SD loaded) of one large subset
            masks = subset_masks(k)
            masks = masks[masks.sum(axis=1) > k // 2]
            need = mode_cost_and_memory(cost, rnd, masks, SD, GAMMA)[2][rng.integers(len(masks))]
            p = cost.profile
            cost = CostModel(p.with_memory(need + p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes), kv)
        plan = split_search(cost, rnd, GAMMA, g, g)
        assert plan.admitted == _full_scan(cost, rnd, g, g), seed
        mixed += plan.admitted_ad > 0 and plan.admitted_sd > 0
    assert mixed >= 10  # the sweep does exercise mixed plans


@pytest.mark.parametrize("kv", ["per_user", "padded"])
def test_random_rounds_rarely_hit_the_windows_adversarial_ones_do(kv):
    """The generator is what makes the tests above bite: its rounds separate exact pricing from
    pricing at the box's longest output far more often than random rounds (the pre-fix solver)."""
    cost = COSTS[kv]

    def box_gap_hits(adversarial: bool) -> int:
        hits = 0
        for seed in range(40):
            rnd, _ = _case(seed, 5, kv, adversarial, tight=False)
            exact, _ = best_single_mode(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True)))
            tab = build_table(cost, rnd, SD, GAMMA, optimistic=False)
            # price every row at its longest output, as the pre-fix solver did
            tab.cost = np.asarray(cost.sd_time(np.arange(6)[None, :], tab.s_thr[:, None], tab.n_hi[:, None], tab.t_thr[:, None], GAMMA))
            tab.n_lo = tab.n_hi
            hits += len(solve_mode(tab, np.ones(5, dtype=bool), 1.0, float(cost.memory_budget(True)))) < exact
        return hits

    assert box_gap_hits(adversarial=True) > box_gap_hits(adversarial=False)


def test_adversarial_sweep():
    """A fixed sweep of 240 adversarial rounds (both KV models, memory tight every other round):
    single-mode schedulers equal brute force, BALANCE lies in [optimum / 2, optimum]."""
    for seed in range(240):
        kv = ("per_user", "padded")[seed % 2]
        k = 2 + seed % 6
        rnd, cost = _case(seed, k, kv, adversarial=True, tight=seed % 4 >= 2)
        want_ad, _ = best_single_mode(cost, rnd, AD, GAMMA, 1.0, float(cost.memory_budget(False)))
        want_sd, _ = best_single_mode(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True)))
        assert (_n("ad_only", cost, rnd), _n("sd_only", cost, rnd)) == (want_ad, want_sd), seed
        opt = brute_force_optimum(cost, rnd, GAMMA)
        assert opt >= _n("balance", cost, rnd) >= max(want_ad, want_sd, (opt + 1) // 2), seed


# ------------------------------------------------------------------ non-default cost-model choices
CHOICES = {
    "draft_kv_target": {"draft_kv": "target"},
    "verify_compute": {"verify_flops_efficiency": 0.3},
    "sd_user_workspace": {"sd_user_workspace_bytes": 0.32e9},
    "sd_overhead": {"sd_overhead_bytes": 0.32e9},
}


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 7), kv=kv_models, choice=st.sampled_from(sorted(CHOICES)), tight=st.booleans())
def test_single_mode_optima_and_balance_under_model_choices(seed, k, kv, choice, tight):
    """Every cost-model switch of the fidelity study keeps the per-mode solves exact and BALANCE's
    plans feasible (the per-SD-user workspace enters the solver's KV base as tokens)."""
    from envs.model_choices import ModelChoices

    cost = CostModel(COSTS[kv].profile, kv, choices=ModelChoices(**CHOICES[choice]))
    rnd = sample_round(np.random.default_rng(seed), CFG, num_users=k)
    if tight:  # memory at one SD subset's exact need under this choice
        masks = subset_masks(k)[1:]
        need = mode_cost_and_memory(cost, rnd, masks, SD, GAMMA)[2][np.random.default_rng(seed + 7).integers(len(masks))]
        p = cost.profile
        cost = CostModel(p.with_memory(need + p.device.reserve_bytes + p.llm.weight_bytes + cost.w_s), kv, choices=cost.choices)
    want_ad, _ = best_single_mode(cost, rnd, AD, GAMMA, 1.0, float(cost.memory_budget(False)))
    want_sd, _ = best_single_mode(cost, rnd, SD, GAMMA, 1.0, float(cost.memory_budget(True)))
    assert _n("ad_only", cost, rnd) == want_ad
    assert _n("sd_only", cost, rnd) == want_sd
    plan = Balance(cost, CFG.max_gamma, draft_depth=GAMMA).plan(rnd)
    assert check_plan(cost, rnd, plan).feasible
    assert plan.admitted >= max(want_ad, want_sd)
