"""experiments.learned over several seeds: per-seed rows, across-seed means, paired CIs, test stream."""

import json

import pandas as pd
import pytest

from experiments import learned


def _policy_runs(folder, seeds, env):
    from agents.policy import algo_class
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from envs import EnvConfig

    cfg = EnvConfig.from_kwargs(**env)
    for seed in seeds:
        run = folder / f"{seed}_maskable_ppo_seed{seed}"
        run.mkdir(parents=True)
        model = algo_class("maskable_ppo")("MlpPolicy", EdgeScheduleSB3VecEnv(2, cfg.to_dict()), seed=seed, device="cpu", policy_kwargs={"net_arch": [8]})
        model.save(run / "model.zip")
        (run / "policy.json").write_text(json.dumps({"algo": "maskable_ppo", "env": cfg.to_dict(), "seed": seed, "streams": {"test": {"seed": learned.SEED}}}))
    return folder


@pytest.mark.slow
def test_learned_reads_multiruns_and_reports_each_seed(tmp_path):
    env = {"num_users": 50, "max_users": 64, "user_order": "slack_desc"}
    runs = _policy_runs(tmp_path / "paper", [0, 1, 2], env)
    noisy = _policy_runs(tmp_path / "noisy", [0, 1], {**env, "alpha_cv": 0.3, "output_cv": 0.3})
    out = tmp_path / "out"
    learned.main(["--runs", str(runs), "--noisy-runs", str(noisy), "--rounds", "3", "--opt-rounds", "0", "--gen-rounds", "2", "--balance-max-k", "50", "--out", str(out)])
    df = pd.read_csv(out / "learned_paper.csv")
    assert {"policy s0", "policy s1", "policy s2", "balance"} <= set(df.scheduler) and df.groupby("scheduler").size().eq(3).all()
    text = (out / "learned.md").read_text()
    assert "3 training seed(s)" in text and "diff_vs_balance" in text and "Caveat" not in text
    # the policies pick gamma per round, so they are also compared with BALANCE that does
    assert "balance_gamma" in set(df.scheduler) and "diff_vs_balance_gamma" in text and "policy (mean of 3 seeds)" in text
    noisy_df = pd.read_csv(out / "learned_noisy.csv")
    assert {"noisy-trained s0", "noisy-trained s1", "paper policy s2"} <= set(noisy_df.scheduler)


def test_learned_rejects_bad_arguments(tmp_path):
    with pytest.raises(SystemExit):
        learned.main(["--rounds", "0", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        learned.main(["--train-seeds", "a,b", "--out", str(tmp_path)])
