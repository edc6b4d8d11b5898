"""End-to-end: the evaluation entry point through Hydra's command line."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from agents.evaluate import run

ROOT = Path(__file__).resolve().parent.parent


def test_evaluate_cli(tmp_path):
    out = tmp_path / "out.csv"
    cmd = [sys.executable, "-m", "agents.evaluate", "schedulers=[balance,ad_only,sd_only,optimal]", "env.num_users=8", "rounds=4", "seed=0", f"output={out}", f"hydra.run.dir={tmp_path}/hydra", "progress=false"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    df = pd.read_csv(out)
    for col in ("scheduler", "round", "num_users", "served", "admitted_ad", "admitted_sd", "gamma", "z", "lam", "decision_s"):
        assert col in df.columns
    assert len(df) == 16
    # the same rounds for every scheduler, and nobody beats the optimum
    per = df.pivot(index="round", columns="scheduler", values="served")
    assert (per["optimal"] >= per["balance"]).all() and (per["balance"] >= per[["ad_only", "sd_only"]].max(axis=1)).all()
    summary = pd.read_csv(tmp_path / "out_summary.csv")
    assert {"served_frac", "ci95", "ratio_to_balance", "ratio_to_optimum", "decision_ms_median", "diff_vs_balance", "diff_ci95_low", "diff_ci95_high", "p_wilcoxon"} <= set(summary.columns)
    assert "ratio_to_balance" in res.stdout


def test_evaluate_bad_config_is_clear():
    base = {"env": {"num_users": 0}, "schedulers": ["balance"], "rounds": 1, "seed": 0, "split": "test", "threads": 1, "draft_depth": None, "grid_step": 0.05, "time_limit_s": 1.0, "policy_path": None, "output": None, "progress": False}
    with pytest.raises(ValueError, match="num_users"):
        run(base)
    with pytest.raises(ValueError, match="unknown evaluate config key"):
        run({**base, "env": {"num_users": 4}, "roundz": 3})
    with pytest.raises(ValueError, match="split"):
        run({**base, "env": {"num_users": 4}, "split": "train"})
    with pytest.raises(ValueError, match="seed"):
        run({**base, "env": {"num_users": 4}, "seed": -3})


# ---------------------------------------------------------------------------------- paired statistics
import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from agents.evaluate import summarize  # noqa: E402
from agents.paired_stats import EXACT_MAX, paired_difference, signed_rank_p, t_interval  # noqa: E402

fracs = st.lists(st.integers(0, 20), min_size=2, max_size=40).map(lambda v: np.array(v) / 20)


@settings(max_examples=25, deadline=None)
@given(fracs)
def test_paired_difference_of_a_scheduler_with_itself_is_zero(a):
    d = paired_difference(a, a)
    assert (d.mean, d.ci_low, d.ci_high, d.p_value) == (0.0, 0.0, 0.0, 1.0)


@settings(max_examples=25, deadline=None)
@given(fracs, st.integers(-5, 5))
def test_paired_difference_of_a_constant_shift_is_exact(b, shift):
    a = b + shift / 20
    d = paired_difference(a, b)
    assert d.ci_low == pytest.approx(shift / 20) and d.ci_high == pytest.approx(shift / 20) and d.mean == pytest.approx(shift / 20)


@settings(max_examples=15, deadline=None)
@given(st.integers(3, 40).flatmap(lambda n: st.tuples(st.lists(st.integers(0, 20), min_size=n, max_size=n), st.lists(st.integers(0, 20), min_size=n, max_size=n))))
def test_paired_difference_is_antisymmetric(ab):
    a, b = (np.array(x) / 20 for x in ab)
    d, r = paired_difference(a, b), paired_difference(b, a)
    assert d.mean == pytest.approx(-r.mean) and d.p_value == pytest.approx(r.p_value)
    if np.ptp(a - b) > 0:
        assert d.ci_low <= d.mean <= d.ci_high or np.isclose(d.ci_low, d.mean) or np.isclose(d.ci_high, d.mean)


def test_pairing_finds_what_overlapping_cis_hide():
    """Adversarial: rounds vary far more than the schedulers differ; one serves one user more on 30 % of rounds."""
    rng = np.random.default_rng(0)
    difficulty = rng.integers(5, 45, size=300)
    b = difficulty / 50
    a = (difficulty + (rng.random(300) < 0.3)) / 50
    rows = [{"scheduler": name, "round": r, "num_users": 50, "served": int(v * 50), "decision_s": 0.0} for name, x in (("balance", b), ("policy", a)) for r, v in enumerate(x)]
    s = summarize(pd.DataFrame(rows)).set_index("scheduler")
    # per-scheduler CIs overlap ...
    assert s.loc["policy", "served_frac"] - s.loc["policy", "ci95"] < s.loc["balance", "served_frac"] + s.loc["balance", "ci95"]
    # ... the paired difference is certain
    assert s.loc["policy", "diff_ci95_low"] > 0 and s.loc["policy", "p_wilcoxon"] < 1e-6
    assert s.loc["policy", "diff_vs_balance"] == pytest.approx((a - b).mean())
    assert np.isnan(s.loc["balance", "diff_vs_balance"])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=60), st.integers(1, 500))
def test_signed_rank_p_does_not_depend_on_the_scale_of_served_counts(diffs, k):
    # served fractions a/K - b/K of equal integer differences differ in the last bit: they must tie
    a = np.array(diffs) + 10
    b = np.full(len(diffs), 10)
    assert signed_rank_p(a / k - b / k) == pytest.approx(signed_rank_p((a - b).astype(float)), rel=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=12))
def test_signed_rank_p_is_the_exact_sign_flip_p_value(diffs):
    # brute force: every sign pattern of the non-zero differences, mid-ranks with ties, zeros dropped
    import itertools

    from scipy import stats

    d = np.array(diffs, dtype=float)
    x = d[d != 0]
    if len(x) == 0:
        assert signed_rank_p(d) == 1.0
        return
    r = stats.rankdata(np.abs(x))
    t = r[x > 0].sum()
    ts = np.array([np.dot(r, s) for s in itertools.product((0, 1), repeat=len(x))])
    exact = min(1.0, 2 * min(np.mean(ts <= t + 1e-9), np.mean(ts >= t - 1e-9)))
    assert signed_rank_p(d) == pytest.approx(exact, rel=1e-9)


def test_signed_rank_p_adversarial_cases():
    from scipy import stats

    few = np.zeros(50)
    few[:5] = 1 / 70  # 5 of 50 rounds one user apart: the normal approximation said 0.025
    assert signed_rank_p(few) == pytest.approx(2 / 2**5)
    assert signed_rank_p(np.array([0.0, 0.0, 0.2])) == 1.0  # one round differs: no evidence
    assert signed_rank_p(np.zeros(7)) == 1.0 and np.isnan(signed_rank_p(np.array([1.0, np.nan])))
    x = np.random.default_rng(0).normal(0.3, 1.0, size=30)  # no ties, no zeros: scipy's exact test
    assert signed_rank_p(x) == pytest.approx(stats.wilcoxon(x, method="exact").pvalue, rel=1e-9)
    big = np.random.default_rng(1).integers(-3, 4, size=3 * EXACT_MAX).astype(float)  # past EXACT_MAX: the normal approximation
    assert signed_rank_p(big) == pytest.approx(stats.wilcoxon(big[big != 0], method="approx").pvalue)
    inf = paired_difference(np.array([1.0, np.inf]), np.zeros(2))
    assert np.isnan(inf.ci_low) and np.isnan(inf.p_value)


def test_paired_difference_rejects_unpaired_samples():
    with pytest.raises(ValueError, match="equal length"):
        paired_difference(np.zeros(3), np.zeros(4))


def test_t_interval():
    m, h = t_interval(np.array([1.0, 2.0, 3.0]))
    assert m == 2.0 and h == pytest.approx(4.303 * 1 / np.sqrt(3), rel=1e-3)
    assert np.isnan(t_interval(np.array([1.0]))[1])
