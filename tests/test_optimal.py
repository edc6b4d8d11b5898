"""The certified optimum: MILP relaxation, cuts, envelopes, repair and the anytime driver."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.cost_envelope import CostEnvelope
from agents.optimal import Exhaustive, Optimal, certify
from agents.plan_repair import repair
from agents.registry import make_scheduler
from agents.round_milp import RoundMILP
from envs import CostModel, EnvConfig, sample_round
from envs.feasibility import BatchStats, check_plans
from envs.plan import AD, SD, Plan

SETTINGS = {
    "paper": {},
    "padded": {"kv_memory": "padded"},
    "cpu": {"profile": "cpu_specsched-pair"},  # a measured table: costs are not monotone
    "a100": {"profile": "a100-40gb_llama2-13b_llama2-7b"},
    "noisy": {"alpha_cv": 0.3, "output_cv": 0.5},
    # every non-default cost-model choice at once (draft KV, verify compute, SD workspace and overhead)
    "choices": {"draft_kv": "target", "verify_flops_efficiency": 0.5, "sd_user_workspace_bytes": 2e7, "sd_overhead_bytes": 5e8},
}
_COSTS: dict = {}


def _setup(name: str, k: int, seed: int, tight: bool = False):
    cfg = EnvConfig(num_users=k, **SETTINGS[name])
    if tight:  # long outputs and short deadlines: few users fit, compute binds
        cfg = cfg.replace(output_tokens=[100, 400], deadline_s=[0.5, 6.0])
    key = (name, cfg.kv_memory, cfg.profile, cfg.model_choices)
    if key not in _COSTS:
        _COSTS[key] = CostModel.from_config(cfg)
    return cfg, _COSTS[key], sample_round(np.random.default_rng(seed), cfg)


def _brute_force(cost: CostModel, rnd, gamma: int = 4) -> int:
    """The optimum by checking all 3^K plans with the exact check (no pruning, no search code)."""
    k = rnd.num_users
    plans = np.array(list(itertools.product((0, AD, SD), repeat=k)), dtype=np.int8)
    ok = check_plans(cost, rnd, plans, gamma).feasible
    return int(np.count_nonzero(plans[ok], axis=1).max(initial=0))


def _random_modes(rng: np.random.Generator, k: int, fill: float) -> np.ndarray:
    return np.where(rng.random(k) < fill, rng.integers(1, 3, size=k), 0).astype(np.int8)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), k=st.integers(1, 12))
def test_envelope_bounds_every_batch_cost(seed, name, k):
    cfg, cost, rnd = _setup(name, k, seed)
    env = CostEnvelope(cost, rnd, 4)
    rng = np.random.default_rng(seed)
    for _ in range(10):
        modes = _random_modes(rng, k, rng.random())
        rep = check_plans(cost, rnd, modes, 4)
        for m, c_true in ((AD, rep.ad_time_s), (SD, rep.sd_time_s)):
            members = np.flatnonzero(modes == m)
            if len(members):
                lv = env.plan_levels(m, members)
                assert env.cost_lb(m, len(members), lv) <= float(c_true) * (1 + 1e-12) + 1e-15
                stats = BatchStats.of(rnd, modes == m, 4)
                assert env.budget(lv["slack"], lv["uplink"]) == pytest.approx(float(stats.slack_min - stats.u_max))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), tight=st.booleans())
def test_cuts_never_remove_a_feasible_plan(seed, name, tight):
    """Cuts from many infeasible plans; every feasible plan still satisfies every row."""
    cfg, cost, rnd = _setup(name, 10, seed, tight)
    milp = RoundMILP(cost, rnd, 4)
    rng = np.random.default_rng(seed)
    plans = [_random_modes(rng, 10, f) for f in np.linspace(0.2, 1.0, 30)]
    feasible = check_plans(cost, rnd, np.array(plans), 4).feasible
    for modes, ok in zip(plans, feasible, strict=True):
        if not ok:
            milp.cuts_for(modes)
    for modes, ok in zip(plans, feasible, strict=True):
        if ok:
            assert len(milp.violated_rows(milp.encode(modes))) == 0
        else:  # the cuts (or a no-good) exclude the infeasible plan itself
            assert len(milp.violated_rows(milp.encode(modes))) > 0


def test_cut_check_can_fail():
    """The validity check above is not vacuous: a plan above the memory budget violates a row."""
    cfg, cost, rnd = _setup("paper", 10, 0)
    milp = RoundMILP(cost, rnd, 4)
    tiny = CostModel(cost.profile.with_memory(cost.w_l + cost.reserve_bytes + cost.kv_l * 5), "per_user")
    small = RoundMILP(tiny, rnd, 4)
    everyone = np.full(10, AD, dtype=np.int8)
    assert len(small.violated_rows(small.encode(everyone))) > 0
    assert milp.encode(everyone).shape == small.encode(everyone).shape


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), k=st.integers(2, 8), tight=st.booleans())
def test_milp_alone_equals_brute_force(seed, name, k, tight):
    """No warm start, no exhaustive stage: the MILP path alone must reach the exact optimum."""
    cfg, cost, rnd = _setup(name, k, seed, tight)
    brute = _brute_force(cost, rnd)
    plan = certify(cost, rnd, 4, 60.0, warm=(), exhaustive_share=0.0)
    assert plan.extra["certified"], plan.extra["trace"]
    assert plan.admitted == brute == plan.extra["upper_bound"]
    assert check_plans(cost, rnd, plan.modes, 4).feasible


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), k=st.integers(1, 8), tight=st.booleans())
def test_optimal_and_exhaustive_equal_brute_force(seed, name, k, tight):
    """The pruned searches (node bounds, target descent) against plain enumeration of 3^K plans."""
    cfg, cost, rnd = _setup(name, k, seed, tight)
    brute = _brute_force(cost, rnd)
    plan = Optimal(cost, cfg.max_gamma, time_limit_s=60).plan(rnd)
    assert plan.extra["certified"] and plan.extra["optimal"] and plan.extra["gap"] == 0
    assert plan.admitted == brute
    assert Exhaustive(cost, cfg.max_gamma, warm_start=False).plan(rnd).admitted == brute


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), tight=st.booleans())
def test_exhaustive_agrees_with_plain_search_at_k12(seed, name, tight):
    """At K = 12 (too many plans to enumerate) the target descent agrees with the plain DFS."""
    cfg, cost, rnd = _setup(name, 12, seed, tight)
    plain = Exhaustive(cost, cfg.max_gamma, warm_start=False).plan(rnd).admitted
    assert Optimal(cost, cfg.max_gamma, time_limit_s=60).plan(rnd).admitted == plain


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_bound_covers_every_scheduler(name):
    """A short limit leaves gaps at K = 30; the bound must still cover every scheduler's plan."""
    for seed in range(2):
        cfg, cost, rnd = _setup(name, 30, seed)
        plan = Optimal(cost, cfg.max_gamma, time_limit_s=1.5, bound_step=0.05).plan(rnd)
        ub = plan.extra["upper_bound"]
        assert plan.extra["gap"] == ub - plan.admitted >= 0
        assert check_plans(cost, rnd, plan.modes, plan.gamma).feasible
        for other in ("balance", "greedy", "sd_only", "ad_only"):
            assert make_scheduler(other, cost, cfg.max_gamma, seed=0).plan(rnd).admitted <= ub


def test_trace_is_anytime_and_consistent():
    cfg, cost, rnd = _setup("paper", 40, 3)
    plan = Optimal(cost, cfg.max_gamma, time_limit_s=3.0, bound_step=0.05).plan(rnd)
    tr = plan.extra["trace"]
    assert tr and tr[0]["event"] == "warm start"
    assert all(a["t_s"] <= b["t_s"] and a["lower"] <= b["lower"] and a["upper"] >= b["upper"] for a, b in zip(tr, tr[1:], strict=False))
    assert tr[-1]["lower"] == plan.admitted and tr[-1]["upper"] == plan.extra["upper_bound"]
    assert plan.decision_s < 3.0 + 5.0  # a stage may overrun the limit only by one solve


def test_warm_plan_is_used():
    """A given plan better than BALANCE's is the starting incumbent (e.g. a learned policy's)."""
    cfg, cost, rnd = _setup("paper", 12, 5, tight=True)
    best = Exhaustive(cost, cfg.max_gamma).plan(rnd)
    plan = Optimal(cost, cfg.max_gamma, time_limit_s=0.01).solve(rnd, warm=[best])
    assert plan.extra["trace"][0]["lower"] >= best.admitted
    bad = Plan(np.full(12, SD, dtype=np.int8), gamma=4)  # infeasible: ignored, not trusted
    assert Optimal(cost, cfg.max_gamma, time_limit_s=0.01).solve(rnd, warm=[bad]).admitted <= best.admitted


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), fill=st.floats(0.0, 1.0))
def test_repair_always_feasible(seed, fill):
    cfg, cost, rnd = _setup("paper", 15, seed)
    modes = _random_modes(np.random.default_rng(seed), 15, fill)
    fixed = repair(cost, rnd, modes, 4)
    assert check_plans(cost, rnd, fixed, 4).feasible
    if check_plans(cost, rnd, modes, 4).feasible:  # a feasible plan is only extended
        assert np.all(fixed[modes != 0] == modes[modes != 0])


@pytest.mark.parametrize("field,value", [("time_limit_s", 0.0), ("exhaustive_share", 1.5), ("local_search_s", -1.0)])
def test_bad_options_named(field, value):
    cfg = EnvConfig(num_users=5)
    with pytest.raises(ValueError, match=field):
        Optimal(CostModel.from_config(cfg), cfg.max_gamma, **{field: value})


def test_optimality_experiment_writes_consistent_results(tmp_path):
    import pandas as pd

    from experiments.optimality import main

    out = tmp_path / "opt"
    main(["--ks", "6,9", "--rounds", "2,2", "--time-limits", "5,5", "--bound-steps", "0.1,0.1", "--out", str(out)])
    df = pd.read_csv(out.with_suffix(".csv"))
    assert len(df) == 4 and (df["upper_bound"] >= df["best"]).all() and (df["best"] >= df["balance"]).all()
    assert df["certified"].all()  # K <= 9 always closes in seconds
    assert out.with_suffix(".png").stat().st_size > 0 and "certified" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("args,msg", [(["--ks", "6,7", "--rounds", "2"], "same length"), (["--ks", "0"], "integers >= 1"), (["--time-limits", "x"], "numbers")])
def test_optimality_experiment_rejects_bad_arguments(args, msg, tmp_path):
    from experiments.optimality import main

    with pytest.raises(SystemExit, match=msg):
        main([*args, "--out", str(tmp_path / "o")])


# ---------------------------------------------------------------- the joint bound (agents.joint_bound)
def _joint(cost: CostModel, rnd, **kw) -> int | None:
    """The joint bound where it applies (monotone costs), else None."""
    from agents.joint_bound import joint_upper_bound

    if not CostEnvelope(cost, rnd, 4).monotone:
        return None
    return joint_upper_bound(cost, rnd, 4, **kw)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(SETTINGS)), k=st.integers(1, 8), tight=st.booleans(), step=st.sampled_from([0.02, 0.1, 0.5]), buckets=st.integers(1, 6),
       rows=st.sampled_from([0, 1, 2, 16]))
def test_joint_bound_covers_brute_force(seed, name, k, tight, step, buckets, rows):
    """Random rounds, every setting, coarse and fine grids, with and without the per-row step:
    never below the optimum of 3^K plans."""
    cfg, cost, rnd = _setup(name, k, seed, tight)
    jb = _joint(cost, rnd, z_step=step, buckets=buckets, row_levels=rows)
    if jb is not None:
        assert jb >= _brute_force(cost, rnd)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), k=st.integers(2, 7), kind=st.sampled_from(["adversarial", "tight_memory", "mixed"]), buckets=st.integers(1, 8),
       rows=st.sampled_from([1, 3, 16]))
def test_joint_bound_covers_brute_force_on_adversarial_rounds(seed, k, kind, buckets, rows):
    """Deadlines between neighbouring batch costs, a KV budget equal to one subset's need, or
    plans that need both modes (``tests/adversarial_rounds.py``)."""
    from adversarial_rounds import adversarial_round, brute_force_optimum, mixed_round

    cfg = EnvConfig(num_users=k)
    cost = _setup("paper", k, 0)[1]
    rng = np.random.default_rng(seed)
    if kind == "mixed":
        rnd = mixed_round(rng, cfg, cost, k)
    else:
        case = adversarial_round(rng, cfg, cost, k, tight_memory=kind == "tight_memory")
        rnd, cost = case.rnd, case.cost
    jb = _joint(cost, rnd, buckets=buckets, row_levels=rows)
    if jb is not None:
        assert jb >= brute_force_optimum(cost, rnd, 4)


@pytest.mark.parametrize("k,seed", [(30, 0), (60, 1), (100, 2)])
def test_joint_bound_covers_every_scheduler_and_beats_split(k, seed):
    """Larger rounds: at least every scheduler's plan at depth 4; tighter than the split bound at K >= 60
    (the split bound counts users both modes like twice)."""
    from agents.balance import grid, split_search
    from agents.optimal import split_upper_bound

    cfg, cost, rnd = _setup("paper", k, seed)
    jb = _joint(cost, rnd)
    assert jb is not None
    served = [split_search(cost, rnd, 4, grid(0.05), grid(0.05)).admitted]
    for other in ("greedy", "sd_only", "ad_only", "balance"):
        plan = make_scheduler(other, cost, cfg.max_gamma, seed=0).plan(rnd)
        if plan.gamma == 4 or not (plan.modes == SD).any():
            served.append(plan.admitted)
    assert jb >= max(served)
    if k >= 60:
        assert jb < split_upper_bound(cost, rnd, 4, 0.05)


def test_joint_bound_keeps_given_bound_and_incumbent():
    from agents.joint_bound import joint_upper_bound

    cfg, cost, rnd = _setup("paper", 20, 4)
    assert joint_upper_bound(cost, rnd, 4, upper=3, incumbent=3) == 3  # nothing to test
    assert joint_upper_bound(cost, rnd, 4, upper=15, time_limit_s=-1.0) == 15  # no time: the given bound
    padded = _setup("padded", 20, 4)[1]
    assert joint_upper_bound(padded, rnd, 4, upper=17) == 17  # padded KV memory: not handled
    with pytest.raises(ValueError, match="z_step"):
        joint_upper_bound(cost, rnd, 4, z_step=0.0)
    with pytest.raises(ValueError, match="buckets"):
        joint_upper_bound(cost, rnd, 4, buckets=0)
    with pytest.raises(ValueError, match="row_levels"):
        joint_upper_bound(cost, rnd, 4, row_levels=-1)


def test_joint_bound_per_row_step_tightens_and_never_loosens():
    """Step 4 (each batch in one relaxed row) only removes combinations: never a larger bound, and on
    a K = 120 round where the union of rows lets users share a batch they cannot, a smaller one --
    still at least every scheduler's plan. Past its deadline ``possible`` refutes nothing."""
    from agents.balance import grid, split_search
    from agents.joint_bound import JointBound, joint_upper_bound

    cfg, cost, rnd = _setup("paper", 120, 3)
    served = max(split_search(cost, rnd, 4, grid(0.05), grid(0.05)).admitted, make_scheduler("ad_only", cost, cfg.max_gamma, seed=0).plan(rnd).admitted)
    union_only = joint_upper_bound(cost, rnd, 4, incumbent=served, row_levels=0)
    per_row = joint_upper_bound(cost, rnd, 4, incumbent=served)
    assert served <= per_row < union_only
    coarse, union = (JointBound(cost, rnd, 4, buckets=8, levels=8, row_levels=r) for r in (4, 0))
    for n in range(served, union_only + 3):
        assert coarse.possible(n, deadline=0.0) == union.possible(n)  # out of time: the union test alone
        assert union.possible(n) or not coarse.possible(n)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), k=st.integers(2, 8), fill=st.floats(0.1, 0.9), tight=st.booleans())
def test_joint_bound_covers_brute_force_when_memory_binds(seed, k, fill, tight):
    """KV budgets a ``fill`` share of everyone's AD need (with the SLM loaded): the joint memory test decides."""
    cfg, cost, rnd = _setup("paper", k, seed, tight)
    p = cost.profile
    everyone = float(cost.ad_memory(k, rnd.input_tokens.max(), rnd.output_tokens.max(), rnd.output_tokens.sum()))
    small = CostModel(p.with_memory(p.device.reserve_bytes + p.llm.weight_bytes + p.slm.weight_bytes + fill * everyone), cost.kv_memory)
    jb = _joint(small, rnd, buckets=4)
    if jb is not None:
        assert jb >= _brute_force(small, rnd)
