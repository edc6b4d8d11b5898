"""End-to-end test of ``python -m experiments.specedge`` on its tiny setting."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import specedge


def test_quick_run_writes_every_artefact(tmp_path):
    tp, summary = specedge.main(["--out", str(tmp_path), "--quick"])
    df = pd.read_csv(tmp_path / "specedge.csv")
    assert {"draft", "rtt_ms", "throughput_ratio", "itl_change", "variant", "num_clients", "headline"} <= set(df.columns)
    assert set(df["draft"]) == {"chain", "tree"} and set(df["variant"]) == set(specedge.VARIANTS)
    assert df["headline"].sum() == 1 and df["rtt_ms"].min() == 5 and df["rtt_ms"].max() == 65
    # SpecEdge's gain falls as the RTT grows (full system, tree drafts, the headline client count)
    tree = df[(df["variant"] == "full") & (df["draft"] == "tree") & (df["num_clients"] == specedge.HEADLINE_CLIENTS)].sort_values("rtt_ms")
    assert tree["throughput_ratio"].is_monotonic_decreasing
    hybrid = pd.read_csv(tmp_path / "hybrid.csv")
    assert set(hybrid["scheduler"]) == {"balance", "balance_ed", "edge_first"}
    # BALANCE with ED never serves fewer than BALANCE on the same round
    base = hybrid[hybrid["scheduler"] == "balance"].set_index(["num_users", "round"])["served"]
    ed = hybrid[hybrid["scheduler"] == "balance_ed"].set_index(["num_users", "round"])["served"]
    assert (ed - base.loc[ed.index]).min() >= 0
    assert (tmp_path / "hybrid_summary.csv").is_file() and (tmp_path / "specedge.png").stat().st_size > 10_000
    # the headline under every tree timing and proactive gain; the run's own setting is one of its rows
    sens = pd.read_csv(tmp_path / "specedge_sensitivity.csv")
    assert len(sens) == len(specedge.TREE_PROFILES) * 2
    mine = sens[(sens["tree_timing"] == "timed") & (sens["proactive_gain"] == "tokens")].iloc[0]
    assert mine["throughput_ratio"] == pytest.approx(df[df["headline"]].iloc[0]["throughput_ratio"])
    md = (tmp_path / "specedge.md").read_text()
    assert "published 2.22x" in md and "Hybrid" in md
    # the report can be rewritten from the CSVs alone
    (tmp_path / "specedge.md").unlink()
    specedge.main(["--out", str(tmp_path), "--report-only"])
    assert (tmp_path / "specedge.md").read_text() == md.replace(" --quick", "")


@pytest.mark.parametrize("argv, field", [(["--rtts", "-5"], "rtts"), (["--edge-fractions", "0,1.5"], "edge-fractions"), (["--rounds", "1"], "rounds"),
                                         (["--clients", "a"], "clients")])
def test_bad_arguments_are_refused_before_any_work(tmp_path, argv, field):
    with pytest.raises(SystemExit, match=field):
        specedge.main(["--out", str(tmp_path), *argv])
    assert not list(tmp_path.iterdir())


def test_same_batch_baseline_is_specedge_comparison_and_the_old_method_stays_reachable():
    tp = specedge.throughput_rows([15.0], [2, 8], ["tree"])
    full = tp[tp["variant"] == "full"]
    assert (full["server_batch"] == full["num_clients"] // 2).all() and (full["baseline_batch"] == full["server_batch"]).all()
    # throughput x ITL = clients on both sides, so the ratio and the ITL change are tied: ratio x (1 + change) = N / B = 2
    assert (full["throughput_ratio"] * (1 + full["itl_change"])).to_numpy() == pytest.approx(2.0, rel=1e-9)
    assert full["baseline_depth"].between(2, 8).all()
    # SpecEdge's pipelining ablation keeps the server batch and halves the clients
    nopipe = tp[tp["variant"] == "no_pipeline"]
    assert (nopipe["edge_clients"] == nopipe["num_clients"] // 2).all()
    old = specedge.throughput_rows([15.0], [8], ["tree"], baseline="equal_itl", tree_timing="roofline", proactive_gain="time")
    assert set(old["profile"]) == {specedge.TREE_PROFILES["roofline"]} and (old["edge_clients"] == 8).all()
    assert (old["baseline_itl_ms"] <= old["specedge_itl_ms"] * (1 + 1e-9)).all()  # equal ITL: the baseline is no slower per token
    with pytest.raises(ValueError, match="baseline"):
        specedge.throughput_rows([15.0], [2], ["tree"], baseline="same_itl")
