"""rl-zoo3 trains and evaluates EdgeSchedule-v0 unmodified, with the shipped conf/rl_zoo3/ppo.yml (slow).

The documented commands, run as subprocesses on a tiny budget: ``rl_zoo3.train`` (with its own
periodic evaluation), ``rl_zoo3.enjoy`` (deterministic evaluation of the saved model), then
``agents.import_sb3`` on its best model and ``agents.evaluate policy_path=...``.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("rl_zoo3")

ROOT = Path(__file__).resolve().parents[1]
ENV = "EdgeSchedule-v0"


def _run(args, cwd=ROOT):
    run = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{args[0]} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout


@pytest.mark.slow
def test_rl_zoo3_train_enjoy_import_evaluate(tmp_path):
    logs = tmp_path / "logs"
    _run(["rl_zoo3.train", "--algo", "ppo", "--env", ENV, "--gym-packages", "envs", "-conf", "conf/rl_zoo3/ppo.yml", "-f", str(logs), "--seed", "0",
          "--device", "cpu", "-n", "1024", "--eval-freq", "512", "--eval-episodes", "2", "--n-eval-envs", "1",
          "--env-kwargs", "num_users:8", "max_users:8", "user_order:'slack_desc'", "-params", "n_envs:2", "n_steps:256", "batch_size:256", "n_epochs:1"])
    run = logs / "ppo" / f"{ENV}_1"
    assert (run / f"{ENV}.zip").is_file() and (run / "best_model.zip").is_file() and (run / "evaluations.npz").is_file()
    out = _run(["rl_zoo3.enjoy", "--algo", "ppo", "--env", ENV, "--gym-packages", "envs", "-f", str(logs), "--exp-id", "1", "--no-render",
                "-n", "40", "--deterministic", "--device", "cpu"])
    assert "Mean reward" in out and "Episode Length 8" in out

    policy = tmp_path / "policy"
    _run(["agents.import_sb3", str(run / "best_model.zip"), "--out", str(policy)])  # algo and env kwargs from rl-zoo3's folder
    meta = json.loads((policy / "policy.json").read_text())
    assert meta["algo"] == "ppo" and meta["env"]["num_users"] == 8 and meta["env"]["user_order"] == "slack_desc"
    assert (policy / "policy.onnx").is_file()
    csv = tmp_path / "eval.csv"
    _run(["agents.evaluate", "schedulers=[balance,policy]", f"policy_path={policy}", "env.num_users=8", "rounds=5", "progress=false", f"output={csv}",
          f"hydra.run.dir={tmp_path / 'hydra'}"])
    import pandas as pd

    df = pd.read_csv(csv)
    assert len(df[df.scheduler == "policy"]) == 5 and (df.served <= 8).all()
