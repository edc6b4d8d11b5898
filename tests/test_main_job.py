"""experiments.main (the README's main job): several training seeds, paired comparisons on the same test rounds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments import main as main_job

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "env.num_users=5", "total_timesteps=256", "n_envs=2", "agent.hyperparams.n_steps=64", "agent.hyperparams.batch_size=64",
    "agent.hyperparams.n_epochs=1", "logger=disabled", "eval.rounds=4", "eval.freq=128", "progress_bar=false", "export_onnx=false",
]


def test_main_job_two_seeds_end_to_end(tmp_path, capsys):
    published = (ROOT / "results" / "main_job.md").read_bytes()
    out = main_job.main(["--seeds", "3,1", "--rounds", "4", "--out", str(tmp_path / "m"), *TINY])
    stdout = capsys.readouterr().out
    assert "seed 3 (1/2)" in stdout and "seed 1 (2/2)" in stdout  # progress names the seed
    assert "[train] step " in stdout and "| rollout/" not in stdout  # one line per dump, not SB3's tables
    for seed in (3, 1):
        assert json.loads((out / f"seed{seed}" / "policy.json").read_text())["seed"] == seed
        assert (out / f"seed{seed}" / "model.zip").is_file()
    assert (ROOT / "results" / "main_job.md").read_bytes() == published  # only --publish writes the README's copy
    # the Reproduce line is this run's command: no --publish that would overwrite the README's copy
    assert f"Reproduce: `bash scripts/main.sh --seeds 3,1 --rounds 4 {' '.join(TINY)}`." in (out / "main_job.md").read_text()

    comp = pd.read_csv(out / "comparison.csv")
    assert sorted(comp[comp.scheduler == "policy"].groupby("seed").size().items()) == [(1, 4), (3, 4)]
    assert set(comp.scheduler) == set(main_job.SCHEDULERS) and (comp.groupby("scheduler").size().drop("policy") == 4).all()

    seeds = pd.read_csv(out / "seeds.csv")
    assert list(seeds.seed) == ["3", "1", "mean"]
    per_seed = seeds.iloc[:2].astype({"seed": int}).set_index("seed")
    frac = comp.assign(f=comp.served / comp.num_users)
    bal = frac[frac.scheduler == "balance"].set_index("round").f
    for seed, row in per_seed.iterrows():
        pol = frac[(frac.scheduler == "policy") & (frac.seed == seed)].set_index("round").f
        d = (pol - bal.loc[pol.index]).to_numpy()
        assert row.diff_vs_balance == pytest.approx(d.mean())  # paired on the same rounds
        assert row.diff_ci95_low - 1e-12 <= row.diff_vs_balance <= row.diff_ci95_high + 1e-12
        assert row.served_frac == pytest.approx(pol.mean()) and row.balance_served_frac == pytest.approx(bal.mean())
        assert np.sign(row.diff_vs_balance) == np.sign(round(row.served_frac - row.balance_served_frac, 12))
    mean = seeds.iloc[2]
    assert float(mean.served_frac) == pytest.approx(per_seed.served_frac.mean())
    assert float(mean.diff_vs_balance) == pytest.approx(per_seed.diff_vs_balance.mean())
    # the mean row's paired CI is over rounds for the seed-averaged policy: it contains the mean difference
    assert float(mean.diff_ci95_low) - 1e-12 <= float(mean.diff_vs_balance) <= float(mean.diff_ci95_high) + 1e-12
    assert 0 <= float(mean.p_wilcoxon) <= 1 and np.isfinite(float(mean.diff_vs_balance_t_ci95))

    md = (out / "main_job.md").read_text()
    assert "**test** rounds" in md and "mean of 2" in md and "--seeds 3,1" in md and "Seed-averaged policy − BALANCE per round" in md
    for name in main_job.OTHERS:
        assert f"| {name} " in md
    assert (out / "served_fraction.png").stat().st_size > 0 and (out / "learning_curve.png").stat().st_size > 0
    for seed in (3, 1):  # every seed has a learning curve to plot
        assert len(main_job.learning_curve(out / f"seed{seed}" / "progress.csv")) >= 1
    assert not list(out.glob(".*"))  # no temporary files left


@pytest.mark.parametrize("argv", [["--seeds", "0,0"], ["--seeds", "a,b"], ["--seeds", ""], ["--seeds", "-1"], ["seed=3"], ["output_dir=x"], ["--rounds", "0"]])
def test_bad_arguments_are_refused_before_training(argv, tmp_path):
    with pytest.raises(SystemExit):
        main_job.main([*argv, "--out", str(tmp_path / "never")])
    assert not (tmp_path / "never").exists()


def test_parse_seeds():
    assert main_job.parse_seeds("0,1,2,3,4") == [0, 1, 2, 3, 4]
    assert main_job.parse_seeds(main_job.DEFAULT_SEEDS) == [0, 1, 2, 3, 4]  # >= 5 seeds by default
