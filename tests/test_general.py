"""experiments.general: ships the validation-best seed and writes the table, CSVs, plot and timing;
agents.plan_repair.improve, the post-step the general policy runs on its plans."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agents.imitation import ImitationConfig, collect, train_bc
from agents.plan_repair import MIXED_REFINE_CROSS, improve, improve_plan
from agents.prefix_fill import longest_prefixes
from envs import CostModel, EnvConfig, check_plan, sample_round
from envs.feasibility import check_plans
from envs.plan import AD, SD, Plan


def test_general_experiment_end_to_end(tmp_path: Path):
    from experiments import general

    cfg = ImitationConfig(max_users=24, embed_dim=8, heads=2, net_arch=[16], epochs=1, val_ks=[6], val_rounds=2)
    collect(cfg, [6, 12], [4, 2], tmp_path / "data")
    for seed in (0, 1):
        train_bc(cfg, tmp_path / "data", tmp_path / "runs" / f"seed{seed}", seed=seed)
    res, pol = tmp_path / "results", tmp_path / "policies" / "general"
    general.main(["--runs", str(tmp_path / "runs"), "--ks", "6,12", "--rounds", "3,3", "--noisy-ks", "12", "--noisy-rounds", "3",
                  "--timing-ks", "12,20", "--timing-rounds", "2", "--balance-timing-rounds", "12:1,20:0", "--policies", str(pol), "--results", str(res),
                  "--diagnose-k", "12", "--diagnose-rounds", "2"])
    for name in ("general.md", "general.csv", "general_seeds.csv", "general_timing.csv", "general.png", "general_diagnosis.csv"):
        assert (res / name).is_file(), name
    assert (pol / "model.zip").is_file() and (pol / "policy.onnx").is_file()
    scores = {s: pd.read_csv(tmp_path / "runs" / f"seed{s}" / "progress.csv").val_served_frac.max() for s in (0, 1)}
    assert f"shipped: seed {max(scores, key=scores.get)}" in (res / "general.md").read_text()
    seeds = pd.read_csv(res / "general_seeds.csv")
    assert set(zip(seeds.setting, seeds.K, strict=True)) == {("paper", 6), ("paper", 12), ("noisy", 12)}
    assert (seeds.seeds == 2).all() and seeds.ratio_to_balance.between(0, 2).all()
    # the seeds with the post-step are the headline; as trained they are reported beside ("raw")
    assert seeds.raw_ratio_to_balance.between(0, 2).all() and (seeds.ratio_to_balance >= seeds.raw_ratio_to_balance - 1e-12).all()
    per_seed = pd.read_csv(res / "general.csv")
    assert {"policy s0", "policy s1", "raw s0", "raw s1"} <= set(per_seed.scheduler)
    assert json.loads((pol / "policy.json").read_text())["post_step"] == "improve_mixed6_all_pairs"  # the default post-step
    diag = pd.read_csv(res / "general_diagnosis.csv")
    assert len(diag) == 2 * 7 and (diag.groupby("round").served.max() <= 12).all()
    served = diag.pivot(index="round", columns="plan", values="served")
    assert (served["policy + improve"] >= served["policy (raw)"]).all() and (served["policy + improve_mixed"] >= served["policy + improve"]).all()
    assert (served["policy + improve_mixed_all_pairs"] >= served["policy + improve_mixed"]).all()
    assert (served["policy + improve_mixed6_all_pairs"] >= served["policy (raw)"]).all()
    assert "post_step" not in json.loads((tmp_path / "runs" / "seed0" / "policy.json").read_text())
    times = pd.read_csv(res / "general_timing.csv")
    assert list(times.K) == [12, 20] and times.balance_rounds.tolist() == [1, 0] and (times.policy_s_median > 0).all()
    assert (times.policy_cpu_s_median > 0).all() and times.balance_cpu_s_median.notna().tolist() == [True, False]
    # paired per round: the median ratio lies within its own spread, and is absent without BALANCE rounds
    first = times.iloc[0]
    assert first.balance_over_policy_cpu_min <= first.balance_over_policy_cpu <= first.balance_over_policy_cpu_max
    assert times.balance_over_policy.notna().tolist() == [True, False]


# --- agents.plan_repair.improve: the policy's post-step -----------------------------------------


def _round(k: int, seed: int):
    cfg = EnvConfig(num_users=k, max_users=max(k, 20))
    return CostModel.from_config(cfg), sample_round(np.random.default_rng(seed), cfg)


def _greedy(cost, rnd, order, mode, gamma=2) -> np.ndarray:
    """A feasible plan: users of ``order`` added in ``mode`` while the exact check allows (a stand-in scheduler)."""
    modes = np.zeros(rnd.num_users, dtype=np.int8)
    for i in order:
        modes[i] = mode
        if not check_plans(cost, rnd, modes[None], gamma).feasible[0]:
            modes[i] = 0
    return modes


@pytest.mark.parametrize("mode", [SD, AD])
def test_longest_prefixes_match_the_exact_check_on_every_prefix(mode):
    """The vectorised prefix count equals the longest prefix check_plans accepts (it can fail on any
    slip in the running aggregates or the bisection)."""
    cost, rnd = _round(30, 3)
    rng = np.random.default_rng(0)
    order = rng.permutation(30)
    eligible = rng.random((6, 30)) < 0.7
    other = (0.0, 0.0)
    counts, used = longest_prefixes(cost, rnd, order, eligible, mode, 2, other, mode == SD)
    assert ((used >= 0) & (used <= 1 + 1e-9)).all()
    for row, got in zip(eligible, counts, strict=True):
        users = order[row]
        want = 0
        for m in range(1, len(users) + 1):
            modes = np.zeros(30, dtype=np.int8)
            modes[users[:m]] = mode
            if not check_plans(cost, rnd, modes[None], 2).feasible[0]:
                break
            want = m
        assert got == want


@pytest.mark.parametrize("seed", range(6))
def test_improve_is_feasible_and_never_serves_fewer(seed):
    cost, rnd = _round(60, seed)
    rng = np.random.default_rng(seed)
    for mode in (AD, SD):
        modes = _greedy(cost, rnd, rng.permutation(60), mode)
        mixed = modes.copy()
        mixed[rng.random(60) < 0.3] = 0  # a thinned plan (still feasible: downward closed)
        for start in (modes, mixed):
            out = improve(cost, rnd, start, 2, 8)
            assert check_plans(cost, rnd, out[None], 2).feasible[0]
            assert (out != 0).sum() >= (start != 0).sum()


def test_improve_repacks_a_plan_that_wastes_the_memory():
    """A plan of the users with the largest outputs (memory-hungry) is re-packed into one serving more."""
    cost, rnd = _round(120, 11)
    modes = _greedy(cost, rnd, np.argsort(-rnd.output_tokens), AD)
    out = improve(cost, rnd, modes, 2, 8)
    assert (out != 0).sum() > (modes != 0).sum()
    plan = improve_plan(cost, rnd, Plan(modes, gamma=2), 8)
    assert np.array_equal(plan.modes, out) and check_plan(cost, rnd, plan).feasible


def test_improve_plan_keeps_an_unimprovable_plan_as_it_is():
    cost, rnd = _round(10, 1)
    empty = Plan(np.zeros(10, dtype=np.int8), gamma=2, z=0.3, lam=0.4)
    assert improve_plan(cost, rnd, empty, 8) is empty


def test_policy_scheduler_runs_the_post_step_from_policy_json(tmp_path: Path, monkeypatch):
    import shutil

    from agents.policy import PolicyScheduler

    src = Path(__file__).resolve().parents[1] / "policies" / "general"
    if not (src / "model.zip").is_file():
        pytest.skip("no shipped policies/general")
    shutil.copy2(src / "model.zip", tmp_path / "model.zip")
    meta = json.loads((src / "policy.json").read_text())
    meta.pop("post_step", None)
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    cost, rnd = _round(80, 5)
    raw = PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "post_step": "improve"}))
    post = PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    assert check_plan(cost, rnd, post).feasible and (post.modes != 0).sum() >= (raw.modes != 0).sum()
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "post_step": "improve_mixed"}))
    both = PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    assert check_plan(cost, rnd, both).feasible and (both.modes != 0).sum() >= (post.modes != 0).sum()
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "post_step": "improve_mixed_all_pairs"}))
    every = PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    assert check_plan(cost, rnd, every).feasible and (every.modes != 0).sum() >= (both.modes != 0).sum()
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "post_step": "improve_mixed6_all_pairs"}))
    six = PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    base = improve(cost, rnd, raw.modes, raw.gamma, 8, cross=MIXED_REFINE_CROSS, all_pairs_ad=True)
    assert check_plan(cost, rnd, six).feasible and (six.modes != 0).sum() >= (base != 0).sum()
    # the name runs exactly these options (a wrong mapping serves as much on many rounds, this one included)
    import agents.policy

    seen = []
    monkeypatch.setattr(agents.policy, "improve_plan", lambda *a, **kw: seen.append(kw) or a[2])
    PolicyScheduler(cost, 8, path=tmp_path).plan(rnd)
    assert seen == [{"mixed": True, "all_pairs_ad": True, "mixed_six": True}]
    monkeypatch.undo()
    (tmp_path / "policy.json").write_text(json.dumps({**meta, "post_step": "polish"}))
    with pytest.raises(ValueError, match="post_step"):
        PolicyScheduler(cost, 8, path=tmp_path)


def test_improve_tuning_entry_point_writes_its_table(tmp_path):
    """experiments.improve_tuning end to end on a tiny validation set: CSV + markdown, every variant."""
    from experiments.improve_tuning import main

    main(["--ks", "20", "--rounds", "2", "--crosses", "0,4", "--mixed-depths", "2", "--all-pairs-crosses", "0", "--out", str(tmp_path)])
    import pandas as pd

    df = pd.read_csv(tmp_path / "improve_tuning.csv")
    assert len(df) == 2 and {"balance", "raw", "cross0", "cross4", "every_pair_ad", "cross4_ms", "mixed2", "mixed2_cross0_allpairs"} <= set(df.columns)
    # the all-pairs search covers every pair the exhaustive AD-only column prices
    assert (df.mixed2_cross0_allpairs >= df.every_pair_ad).all()
    # the post-step never serves fewer than the raw plan; the exhaustive AD-only re-pack is at least the raw plan too
    assert (df.cross0 >= df.raw).all() and (df.cross4 >= df.raw).all() and (df.every_pair_ad >= df.raw).all()
    md = (tmp_path / "improve_tuning.md").read_text()
    assert "validation" in md.lower() and "Reproduce" in md
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--out", str(tmp_path)])


def test_improve_tuning_counts_the_raw_plan_once_in_a_decision():
    """``raw`` has no post-step: its decision is the policy's plan alone (raw_ms once, not twice as
    when its own column ``raw_ms`` was read as a post-step's), and a post-step row's decision is
    raw_ms + its own ms."""
    from experiments.improve_tuning import summarise

    df = pd.DataFrame({"K": [200, 200], "round": [0, 1], "balance": [10, 10], "balance_decision_ms": [1000.0, 1000.0],
                       "raw": [9, 9], "raw_ms": [10.0, 10.0], "cross0": [10, 10], "cross0_ms": [5.0, 5.0], "every_pair_ad": [10, 10]})
    rows = summarise(df, [0]).set_index("plan")
    assert rows.loc["raw", "decision_cpu_ms_median"] == 10.0 and rows.loc["raw", "balance_over_decision"] == 100.0
    assert np.isnan(rows.loc["raw", "cpu_ms_median"])  # the post-step alone: raw has none
    assert rows.loc["cross0", "cpu_ms_median"] == 5.0 and rows.loc["cross0", "decision_cpu_ms_median"] == 15.0
    assert np.isnan(rows.loc["every_pair_ad", "decision_cpu_ms_median"])


# --- agents.mixed_repack: the post-step's AD + SD re-pack (post_step improve_mixed) --------------


@pytest.mark.parametrize("k,seed,tight", [(1, 0, False), (8, 1, False), (60, 2, False), (150, 3, False), (120, 4, True), (40, 5, True)])
def test_mixed_repack_plans_fit_and_serve_what_their_key_says(k, seed, tight):
    """Every plan the mixed re-pack returns passes the exact check, and its key is its own plan's
    (served users = ceil(key)); also with memory that binds hard (KV room for a few users)."""
    from agents.mixed_repack import mixed_repack

    cfg = EnvConfig(num_users=k, max_users=max(k, 20))
    if tight:
        full = CostModel.from_config(cfg)
        cfg = cfg.replace(memory_bytes=float(full.memory_bytes - 0.97 * full.memory_budget1(True)))
    cost, rnd = CostModel.from_config(cfg), sample_round(np.random.default_rng(seed), cfg)
    for gamma in (1, 2, 4):
        for cap in (False, True):  # five parameters, and six (the SD input cap)
            modes, key = mixed_repack(cost, rnd, gamma, sd_input_cap=cap)
            assert modes.shape == (k,) and check_plans(cost, rnd, modes[None], gamma).feasible[0]
            assert (modes != 0).sum() == int(np.ceil(key))


def test_mixed_repack_points_price_as_the_exact_check():
    """Random points of the family: a point's score counts exactly the users of its plan, and the
    plan passes the exact check (the AD prefixes and the SD fill priced beside them)."""
    from agents.mixed_repack import MixedFamily

    cost, rnd = _round(90, 7)
    fam = MixedFamily(cost, rnd, 2)
    rng = np.random.default_rng(0)
    points = np.column_stack([rng.choice(fam.values[0], 40), rng.choice(fam.values[1], 40), rng.integers(0, 91, 40),
                              rng.choice(fam.values[3], 40), rng.choice(fam.values[4], 40)]).astype(float)
    keys, counts = fam.score(points)
    for point, key, sd_count in zip(points, keys, counts, strict=True):
        modes = fam.modes(point, int(sd_count))
        assert (modes == SD).sum() == sd_count and (modes != 0).sum() == int(np.ceil(key))
        assert check_plans(cost, rnd, modes[None], 2).feasible[0]
    # six parameters: the SD input cap keeps every SD user's input at or under it
    fam6 = MixedFamily(cost, rnd, 2, sd_input_cap=True)
    points6 = np.column_stack([points, rng.choice(fam6.values[5], 40)])
    keys, counts = fam6.score(points6)
    for point, key, sd_count in zip(points6, keys, counts, strict=True):
        modes = fam6.modes(point, int(sd_count))
        assert (modes == SD).sum() == sd_count and (modes != 0).sum() == int(np.ceil(key))
        assert (rnd.input_tokens[modes == SD] <= point[5]).all()
        assert check_plans(cost, rnd, modes[None], 2).feasible[0]


def test_improve_mixed_finds_a_mixed_plan_the_single_batch_repack_cannot():
    """A validation-stream round at K = 200 where BALANCE mixes AD and SD (the rounds the post-step
    fell short on): with the mixed re-pack the post-step serves more than without, in a mixed plan
    at MIXED_DEPTH, and never fewer on the other rounds."""
    from agents.mixed_repack import MIXED_DEPTH
    from envs.workload import make_rounds

    cfg = EnvConfig(num_users=200, max_users=500, user_order="slack_desc")
    cost = CostModel.from_config(cfg)
    rnds = make_rounds(cfg, 18, ImitationConfig().val_seed, split="validation")
    for i in (16, 17):
        start = _greedy(cost, rnds[i], np.argsort(rnds[i].output_tokens), AD)
        single = improve(cost, rnds[i], start, 2, 8)
        plan = improve_plan(cost, rnds[i], Plan(start, gamma=2), 8, mixed=True)
        assert check_plan(cost, rnds[i], plan).feasible and (plan.modes != 0).sum() >= (single != 0).sum()
        if i == 17:
            assert (plan.modes != 0).sum() > (single != 0).sum()
            assert plan.gamma == MIXED_DEPTH and (plan.modes == AD).any() and (plan.modes == SD).any()
    empty = Plan(np.zeros(200, dtype=np.int8), gamma=2)
    assert (improve_plan(cost, rnds[17], empty, 8, mixed=True).modes != 0).sum() > 0


def test_mixed_repack_search_gate_skips_only_the_line_searches():
    """``search_from``: above the start grid's best the grid's best plan is returned (as with no
    passes); at or below it the search is the ungated one, pass for pass."""
    from agents.mixed_repack import MixedFamily, mixed_repack

    cost, rnd = _round(120, 11)
    fam = MixedFamily(cost, rnd, 2, sd_input_cap=True)
    grid_best = int(np.ceil(fam.score(fam.start_grid())[0].max()))
    free, free_key = mixed_repack(cost, rnd, 2, passes=6, sd_input_cap=True)
    assert int(np.ceil(free_key)) > grid_best  # on this round the line searches move (63 -> 70 users)
    for at in (0, grid_best):
        modes, key = mixed_repack(cost, rnd, 2, passes=6, sd_input_cap=True, search_from=at)
        assert key == free_key and np.array_equal(modes, free)
    grid_only, grid_key = mixed_repack(cost, rnd, 2, passes=0, sd_input_cap=True)
    modes, key = mixed_repack(cost, rnd, 2, passes=6, sd_input_cap=True, search_from=grid_best + 1)
    assert key == grid_key and np.array_equal(modes, grid_only)


def test_improve_mixed6_all_pairs_finds_the_mixed_plans_and_never_serves_below_its_base():
    """Validation rounds at K = 200: the six-parameter post-step serves at least what the re-pack
    and the every-pair AD search serve without it (its plan is taken only when it serves more), its
    plans pass the exact check, and on round 17 (BALANCE mixes AD and SD) it finds a mixed plan
    at MIXED_DEPTH serving more than every other post-step."""
    from agents.mixed_repack import MIXED_DEPTH
    from envs.workload import make_rounds

    cfg = EnvConfig(num_users=200, max_users=500, user_order="slack_desc")
    cost = CostModel.from_config(cfg)
    rnds = make_rounds(cfg, 18, ImitationConfig().val_seed, split="validation")
    for i in (3, 16, 17):
        start = Plan(_greedy(cost, rnds[i], np.argsort(rnds[i].output_tokens), AD), gamma=2)
        base = improve(cost, rnds[i], start.modes, 2, 8, cross=MIXED_REFINE_CROSS, all_pairs_ad=True)
        six = improve_plan(cost, rnds[i], start, 8, mixed=True, all_pairs_ad=True, mixed_six=True)
        assert check_plan(cost, rnds[i], six).feasible and (six.modes != 0).sum() >= (base != 0).sum()
        if i == 17:
            five = improve_plan(cost, rnds[i], start, 8, mixed=True, all_pairs_ad=True)
            assert (six.modes != 0).sum() > max((base != 0).sum(), (five.modes != 0).sum())
            assert six.gamma == MIXED_DEPTH and (six.modes == AD).any() and (six.modes == SD).any()
    with pytest.raises(ValueError, match="mixed=True"):
        improve_plan(cost, rnds[0], Plan(np.zeros(200, dtype=np.int8), gamma=2), 8, mixed_six=True)


def test_improve_mixed6_all_pairs_runs_the_every_pair_search_then_the_gated_six_parameter_search(monkeypatch):
    """The order and the arguments of the six-parameter post-step's two extra searches: the every-pair
    AD search first, then the six-parameter mixed re-pack with ``SIX_WINDOW`` / ``SIX_PASSES`` and a
    gate ``SIX_SEARCH_MARGIN`` below the best count so far; without all pairs on rounds over
    ``ALL_PAIRS_MAX_USERS`` users; ``mixed_six`` without a mixed re-pack is refused."""
    import agents.plan_repair as pr
    from agents.mixed_repack import SIX_PASSES, SIX_SEARCH_MARGIN, SIX_WINDOW

    calls = []
    real_prefix, real_mixed = pr.best_ad_prefix, pr.mixed_repack

    def prefix_spy(cost, rnd, more_than):
        out = real_prefix(cost, rnd, more_than=more_than)
        calls.append(("all_pairs", more_than, None if out is None else int((out != 0).sum())))
        return out

    def mixed_spy(cost, rnd, gamma, **kw):
        calls.append(("mixed", gamma, kw))
        return real_mixed(cost, rnd, gamma, **kw)

    monkeypatch.setattr(pr, "best_ad_prefix", prefix_spy)
    monkeypatch.setattr(pr, "mixed_repack", mixed_spy)
    cost, rnd = _round(80, 5)
    start = Plan(_greedy(cost, rnd, range(30), AD), gamma=2)
    plan = improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True, mixed_six=True)
    assert [c[0] for c in calls] == ["all_pairs", "mixed"]
    _, gamma, kw = calls[1]
    most = max(calls[0][1], calls[0][2] or 0)  # the best count before the mixed search
    assert gamma == pr.MIXED_DEPTH and kw == {"window": SIX_WINDOW, "passes": SIX_PASSES, "sd_input_cap": True,
                                              "search_from": most - SIX_SEARCH_MARGIN}
    assert (plan.modes != 0).sum() >= most
    calls.clear()  # the five-parameter post-step: the mixed re-pack first, one pass, no gate
    improve_plan(cost, rnd, start, 8, mixed=True, all_pairs_ad=True)
    assert [c[0] for c in calls] == ["mixed", "all_pairs"] and calls[0][2] == {}
    calls.clear()
    big = EnvConfig(num_users=pr.ALL_PAIRS_MAX_USERS + 1, max_users=pr.ALL_PAIRS_MAX_USERS + 1)
    big_cost, big_rnd = CostModel.from_config(big), sample_round(np.random.default_rng(0), big)
    improve_plan(big_cost, big_rnd, Plan(np.zeros(big.num_users, dtype=np.int8), gamma=2), 8, mixed=True, all_pairs_ad=True, mixed_six=True)
    assert [c[0] for c in calls] == ["mixed"]
    with pytest.raises(ValueError, match="mixed_depth"):
        improve(cost, rnd, start.modes, 2, 8, mixed_six=True)


def test_shipped_general_policy_names_the_default_post_step():
    """policies/general/policy.json runs the post-step experiments.general ships by default."""
    from agents.plan_repair import POST_STEP_OPTIONS

    path = Path(__file__).resolve().parents[1] / "policies" / "general" / "policy.json"
    if not path.is_file():
        pytest.skip("no shipped policies/general")
    post = json.loads(path.read_text())["post_step"]
    assert post == "improve_mixed6_all_pairs" and post in POST_STEP_OPTIONS


def test_improve_handles_a_one_user_round():
    """K = 1 (blocks of one column in the prefix search): the admitted user is kept, nothing breaks."""
    cost, rnd = _round(1, 0)
    for mode in (AD, SD):
        start = _greedy(cost, rnd, [0], mode)
        for mixed in (False, True):
            out = improve(cost, rnd, start, 2, 8, mixed_depth=2 if mixed else None)
            assert (out != 0).sum() >= (start != 0).sum() and check_plans(cost, rnd, out[None], 2).feasible[0]


def test_improve_plan_carries_the_depth_its_plan_was_checked_at():
    """A plan at a depth above max_gamma is re-packed at max_gamma: the result says so (it used to keep
    the plan's depth, at which the new modes need not fit)."""
    cost, rnd = _round(60, 3)
    start = _greedy(cost, rnd, np.argsort(rnd.output_tokens), SD, gamma=5)
    plan = improve_plan(cost, rnd, Plan(start, gamma=5), 3)
    assert check_plan(cost, rnd, plan).feasible and (plan.modes != 0).sum() >= (start != 0).sum()
    if (plan.modes != start).any():
        assert plan.gamma == 3


def test_mixed_post_step_with_no_kv_room_after_the_weights():
    """KV budget exactly 0 with the SLM loaded: the mixed re-pack finds nothing (no NaN key) and the
    post-step keeps the plan."""
    from agents.mixed_repack import mixed_repack

    cfg = EnvConfig(num_users=20, max_users=20)
    full = CostModel.from_config(cfg)
    cfg = cfg.replace(memory_bytes=float(full.memory_bytes - full.memory_budget1(True)))
    cost, rnd = CostModel.from_config(cfg), sample_round(np.random.default_rng(0), cfg)
    modes, key = mixed_repack(cost, rnd, 2)
    assert np.isfinite(key) and check_plans(cost, rnd, modes[None], 2).feasible[0]
    start = _greedy(cost, rnd, range(20), AD)
    out = improve(cost, rnd, start, 2, 8, mixed_depth=2)
    assert (out != 0).sum() >= (start != 0).sum() and check_plans(cost, rnd, out[None], 2).feasible[0]


def test_mixed_plan_study_entry_point(tmp_path):
    """experiments.mixed_plan_study end to end on a few validation rounds: BALANCE cached and reused,
    CSV + markdown; the family at BALANCE's own thresholds with the SD input cap rebuilds its plan."""
    from experiments.mixed_plan_study import main

    args = ["--k", "30", "--rounds", "6", "--depths", "2", "--windows", "6", "--passes", "1,6", "--margins", "0,3,none",
            "--cache", str(tmp_path / "cache"), "--out", str(tmp_path)]
    main(args)
    df = pd.read_csv(tmp_path / "mixed_plan_study.csv")
    variants = [f"six_g2_w6_p{p}_m{m}" for p in (1, 6) for m in (0, 3, "none")]
    assert len(df) == 6 and {"balance", "raw", "improve", "improve_mixed", "improve_mixed_all_pairs", "improve_mixed6_all_pairs",
                             "repack_all_pairs", *variants, *(f"{v}_ms" for v in variants), *(f"{v}_searched" for v in variants)} <= set(df.columns)
    # the shipped constants' variant is the shipped post-step, round by round (what the study chose is what ships)
    assert (df.six_g2_w6_p6_m3 == df.improve_mixed6_all_pairs).all()
    # more passes only move to better points; a gate only skips searches, and "none" always searches
    assert (df.six_g2_w6_p6_mnone >= df.six_g2_w6_p1_mnone).all() and (df.six_g2_w6_p6_mnone >= df.six_g2_w6_p6_m0).all()
    assert df.six_g2_w6_p6_mnone_searched.all() and (df.six_g2_w6_p6_m0_searched <= df.six_g2_w6_p6_m3_searched).all()
    assert "## Six-parameter variants" in (tmp_path / "mixed_plan_study.md").read_text()
    mixed = df[df.balance_mixed]
    assert len(mixed) >= 1  # rounds 0-5 at K = 30 hold two where BALANCE mixes
    assert (mixed.same6.astype(bool)).all() and (mixed.family6 == mixed.balance).all()
    cached = list((tmp_path / "cache").glob("balance_k30_n6_*.npy"))
    assert len(cached) == 1
    main(args)  # from the cache: the same table
    assert pd.read_csv(tmp_path / "mixed_plan_study.csv")[["round", "balance", "improve"]].equals(df[["round", "balance", "improve"]])
    assert "Reproduce" in (tmp_path / "mixed_plan_study.md").read_text()
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--margins"):
        main(["--margins", "x", "--out", str(tmp_path)])
