"""End-to-end test of ``python -m experiments.specedge`` on its tiny setting."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments import specedge, specedge_throughput


def test_quick_run_writes_every_artefact(tmp_path):
    tp, summary = specedge.main(["--out", str(tmp_path), "--quick"])
    df = pd.read_csv(tmp_path / "specedge.csv")
    assert {"draft", "rtt_ms", "throughput_ratio", "itl_change", "variant", "num_clients", "headline"} <= set(df.columns)
    assert set(df["draft"]) == {"chain", "tree"} and set(df["variant"]) == set(specedge_throughput.VARIANTS)
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
    assert len(sens) == len(specedge_throughput.TREE_PROFILES) * 2
    mine = sens[(sens["tree_timing"] == "timed") & (sens["proactive_gain"] == "tokens")].iloc[0]
    assert mine["throughput_ratio"] == pytest.approx(df[df["headline"]].iloc[0]["throughput_ratio"])
    # the engine switches: four settings x ENGINE_CLIENTS; neither acts at server batch 1 (padding moves the context a few slots)
    eng = pd.read_csv(tmp_path / "specedge_engines.csv")
    assert len(eng) == len(specedge_throughput.ENGINE_SETTINGS) * len(specedge_throughput.ENGINE_CLIENTS)
    n2 = eng[eng["num_clients"] == 2]["throughput_ratio"]
    assert n2.max() / n2.min() - 1 < 1e-3
    assert set(df["server_only_widths"]) == {"padded"} and df["dense_attention"].all() and df["kv_staging"].all()  # SpecEdge's code is the default
    md = (tmp_path / "specedge.md").read_text()
    assert "published 2.22x" in md and "Hybrid" in md and "What SpecEdge's code does" in md and "Scorecard at N = 16" in md
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
    tp = specedge_throughput.throughput_rows([15.0], [2, 8], ["tree"])
    full = tp[tp["variant"] == "full"]
    assert (full["server_batch"] == full["num_clients"] // 2).all() and (full["baseline_batch"] == full["server_batch"]).all()
    # throughput x ITL = clients on both sides, so the ratio and the ITL change are tied: ratio x (1 + change) = N / B = 2
    assert (full["throughput_ratio"] * (1 + full["itl_change"])).to_numpy() == pytest.approx(2.0, rel=1e-9)
    assert full["baseline_depth"].between(2, 8).all()
    # SpecEdge's pipelining ablation keeps the server batch and halves the clients
    nopipe = tp[tp["variant"] == "no_pipeline"]
    assert (nopipe["edge_clients"] == nopipe["num_clients"] // 2).all()
    old = specedge_throughput.throughput_rows([15.0], [8], ["tree"], baseline="equal_itl", tree_timing="roofline", proactive_gain="time")
    assert set(old["profile"]) == {specedge_throughput.TREE_PROFILES["roofline"]} and (old["edge_clients"] == 8).all()
    assert (old["baseline_itl_ms"] <= old["specedge_itl_ms"] * (1 + 1e-9)).all()  # equal ITL: the baseline is no slower per token
    with pytest.raises(ValueError, match="baseline"):
        specedge_throughput.throughput_rows([15.0], [2], ["tree"], baseline="same_itl")


def test_engine_switches_raise_the_baselines_cost_at_batch_beyond_one():
    on = specedge_throughput.throughput_rows([15.0], [16], ["tree"])
    off = specedge_throughput.throughput_rows([15.0], [16], ["tree"], server_only_widths="tree", dense_attention=False, kv_staging=False)
    f_on, f_off = on[on["variant"] == "full"].iloc[0], off[off["variant"] == "full"].iloc[0]
    # SpecEdge's padded server-only levels and dense attention make each server-only level dearer at batch 8 ...
    assert f_on["baseline_draft_ms"] / f_on["baseline_depth"] > f_off["baseline_draft_ms"] / f_off["baseline_depth"]
    # ... and both systems' verify pass too; the net effect favours SpecEdge (it drafts off the server)
    assert f_on["specedge_verify_ms"] > f_off["specedge_verify_ms"] and f_on["throughput_ratio"] > f_off["throughput_ratio"]
    assert (on["throughput_ratio"] * (1 + on["itl_change"]))[on["variant"] == "full"].to_numpy() == pytest.approx(2.0, rel=1e-9)
    # KV staging alone works against SpecEdge: it copies whole rows in and out where server-only SD only compacts
    staged = specedge_throughput.throughput_rows([15.0], [16], ["tree"], server_only_widths="tree", dense_attention=False, kv_staging=True)
    assert staged[staged["variant"] == "full"].iloc[0]["throughput_ratio"] < f_off["throughput_ratio"]
    with pytest.raises(ValueError, match="server_only_widths"):
        specedge_throughput.throughput_rows([15.0], [2], ["tree"], server_only_widths="wide")
