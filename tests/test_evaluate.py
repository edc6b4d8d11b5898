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
    assert {"served_frac", "ci95", "ratio_to_balance", "ratio_to_optimum", "decision_ms_median"} <= set(summary.columns)
    assert "ratio_to_balance" in res.stdout


def test_evaluate_bad_config_is_clear():
    base = {"env": {"num_users": 0}, "schedulers": ["balance"], "rounds": 1, "seed": 0, "gamma": 4, "grid_step": 0.05, "time_limit_s": 1.0, "policy_path": None, "output": None, "progress": False}
    with pytest.raises(ValueError, match="num_users"):
        run(base)
    with pytest.raises(ValueError, match="unknown evaluate config key"):
        run({**base, "env": {"num_users": 4}, "roundz": 3})
