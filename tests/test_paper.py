"""experiments.paper: a tiny study end to end, and BALANCE's paired differences in its tables."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from experiments import paper
from experiments.paper import Study

#: the per-round CSV columns experiments/readme.py and older results rely on
CSV_COLUMNS = {"scheduler", "round", "num_users", "served", "admitted_ad", "admitted_sd", "gamma", "z", "lam", "decision_s", "upper_bound", "gap", "value"}
CELL = re.compile(r"^([+-]\d+\.\d) % \(([+-]\d+\.\d) pp \[(-?\d+\.\d), (-?\d+\.\d)\]\)$")


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """The K study shrunk to K = 4, 6 and 8 rounds per point, run through the CLI into tmp_path."""
    study = Study("tiny_k", "tiny K sweep", "K", [4, 6], lambda v: {"num_users": v}, paper="none")
    monkeypatch.setitem(paper.STUDIES, study.name, study)
    paper.main(["--only", study.name, "--rounds", "8", "--out", str(tmp_path)])
    return study, pd.read_csv(tmp_path / f"{study.name}.csv"), (tmp_path / f"{study.name}.md").read_text(), tmp_path


def test_tiny_study_end_to_end_has_consistent_paired_columns(tiny):
    study, df, md, out = tiny
    assert set(df.columns) == CSV_COLUMNS  # backward compatible: still one row per point, scheduler and round
    assert (out / f"{study.name}.png").stat().st_size > 0 and not list(out.glob(".*"))
    assert len(df) == 2 * 3 * 8 and set(df.scheduler) == set(paper.MAIN)
    assert "test stream" in md and "balance - ad_only" in md and "balance - sd_only" in md and "sweep mean" in md

    served = (df.served / df.num_users).groupby([df.value, df.scheduler]).mean().unstack()
    sweep = paper.paired_sweep(df, ["ad_only", "sd_only"]).set_index("baseline")
    per_point = paper.paired_by_point(df, ["ad_only", "sd_only"])
    for base in ("ad_only", "sd_only"):
        r = sweep.loc[base]
        assert r.rounds == 8
        assert r.ci95_low_pp - 1e-9 <= r.diff_pp <= r.ci95_high_pp + 1e-9
        # the paired mean is the difference of the served means (same rounds at every point)
        gap_pp = (served["balance"] - served[base]).mean() * 100
        assert r.diff_pp == pytest.approx(gap_pp, abs=1e-9)
        assert np.sign(r.diff_pp) == np.sign(gap_pp)
        assert 0.0 <= r.p_wilcoxon <= 1.0
        for _, row in per_point[per_point.baseline == base].iterrows():
            point_gap = (served.loc[row.value, "balance"] - served.loc[row.value, base]) * 100
            assert row.diff_pp == pytest.approx(point_gap, abs=1e-9)
            assert row.ci95_low_pp - 1e-9 <= row.diff_pp <= row.ci95_high_pp + 1e-9
        # the markdown shows the same numbers
        assert paper.fmt_diff(r.diff_pp, r.ci95_low_pp, r.ci95_high_pp) in md

    # the README's cells: relative gain, then the paired pp with its CI, from the same CSV
    cells = paper.gain_cells(df, study)
    assert set(cells) == {"ad_only", "sd_only"}
    for base, cell in cells.items():
        m = CELL.match(cell)
        assert m, cell
        rel, mean, lo, hi = map(float, m.groups())
        assert lo <= mean <= hi
        assert mean == pytest.approx(round(sweep.loc[base].diff_pp, 1), abs=0.051)
        assert rel == pytest.approx(paper.gains(served, [base]).iloc[0]["relative gain (%)"], abs=0.051)


def test_tiny_study_uses_the_test_stream(tiny):
    from agents.evaluate import evaluate_schedulers
    from envs.config import EnvConfig
    from envs.workload import make_rounds

    study, df, _, _ = tiny
    cfg = EnvConfig.from_kwargs(**{**EnvConfig().to_dict(), "num_users": 4})
    ref = evaluate_schedulers(cfg, ["balance", "sd_only"], rounds=make_rounds(cfg, 8, 0, split="test"), seed=0)
    got = df[(df.value == 4) & df.scheduler.isin(["balance", "sd_only"])]
    key = ["scheduler", "round"]
    cols = ["served", "admitted_ad", "admitted_sd", "z", "lam"]
    pd.testing.assert_frame_equal(ref.sort_values(key)[key + cols].reset_index(drop=True), got.sort_values(key)[key + cols].reset_index(drop=True), check_dtype=False)


def test_report_only_rewrites_the_tables_from_the_csv(tiny, monkeypatch):
    study, _, md, out = tiny
    (out / f"{study.name}.md").unlink()
    paper.main(["--only", study.name, "--report-only", "--out", str(out)])
    again = (out / f"{study.name}.md").read_text()
    assert again.split("Reproduce")[0] == md.split("Reproduce")[0]  # identical tables (seeded bootstrap)


def _synthetic(diffs_by_point: dict[int, list[int]], k: int = 10) -> pd.DataFrame:
    """BALANCE serves 5 + d users where the baseline serves 5, per round."""
    rows = []
    for value, diffs in diffs_by_point.items():
        for r, d in enumerate(diffs):
            rows.append({"scheduler": "balance", "round": r, "num_users": k, "served": 5 + d, "value": value})
            rows.append({"scheduler": "ad_only", "round": r, "num_users": k, "served": 5, "value": value})
    return pd.DataFrame(rows)


def test_paired_sweep_pairs_by_round_index():
    # every round one user more: +10 pp with no spread, certain
    r = paper.paired_sweep(_synthetic({1: [1] * 6, 2: [1] * 6}), ["ad_only"]).iloc[0]
    assert (r.diff_pp, r.ci95_low_pp, r.ci95_high_pp, r.rounds) == (pytest.approx(10.0), pytest.approx(10.0), pytest.approx(10.0), 6)
    # point 1 gains on the rounds where point 2 loses: per round index the sweep mean difference is 0
    r = paper.paired_sweep(_synthetic({1: [2, -2, 2, -2, 2, -2], 2: [-2, 2, -2, 2, -2, 2]}), ["ad_only"]).iloc[0]
    assert r.diff_pp == pytest.approx(0.0) and r.ci95_low_pp == pytest.approx(0.0) and r.ci95_high_pp == pytest.approx(0.0) and r.p_wilcoxon == 1.0
    # a clear loss: CI below zero
    r = paper.paired_sweep(_synthetic({1: [-1, -2, -1, -3, -1, -2, -1, -2]}), ["ad_only"]).iloc[0]
    assert r.ci95_high_pp < 0 < 1 and r.diff_pp == pytest.approx(-16.25)
    per_point = paper.paired_by_point(_synthetic({1: [1, 1, 2], 2: [0, 0, 0]}), ["ad_only"]).set_index("value")
    assert per_point.loc[1, "diff_pp"] == pytest.approx(40 / 3) and per_point.loc[2, "diff_pp"] == 0.0 and per_point.loc[2, "p_wilcoxon"] == 1.0


def test_fmt_diff():
    assert paper.fmt_diff(7.41, 6.87, 7.96) == "+7.4 pp [6.9, 8.0]"
    assert paper.fmt_diff(-0.04, -1.2, 0.3) == "-0.0 pp [-1.2, 0.3]"
