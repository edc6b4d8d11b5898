"""experiments.general: ships the validation-best seed and writes the table, CSVs, plot and timing."""

from pathlib import Path

import pandas as pd

from agents.imitation import ImitationConfig, collect, train_bc


def test_general_experiment_end_to_end(tmp_path: Path):
    from experiments import general

    cfg = ImitationConfig(max_users=24, embed_dim=8, heads=2, net_arch=[16], epochs=1, val_ks=[6], val_rounds=2)
    collect(cfg, [6, 12], [4, 2], tmp_path / "data")
    for seed in (0, 1):
        train_bc(cfg, tmp_path / "data", tmp_path / "runs" / f"seed{seed}", seed=seed)
    res, pol = tmp_path / "results", tmp_path / "policies" / "general"
    general.main(["--runs", str(tmp_path / "runs"), "--ks", "6,12", "--rounds", "3,3", "--noisy-ks", "12", "--noisy-rounds", "3",
                  "--timing-ks", "12,20", "--timing-rounds", "2", "--balance-timing-rounds", "12:1,20:0", "--policies", str(pol), "--results", str(res)])
    for name in ("general.md", "general.csv", "general_seeds.csv", "general_timing.csv", "general.png"):
        assert (res / name).is_file(), name
    assert (pol / "model.zip").is_file() and (pol / "policy.onnx").is_file()
    scores = {s: pd.read_csv(tmp_path / "runs" / f"seed{s}" / "progress.csv").val_served_frac.max() for s in (0, 1)}
    assert f"shipped: seed {max(scores, key=scores.get)}" in (res / "general.md").read_text()
    seeds = pd.read_csv(res / "general_seeds.csv")
    assert set(zip(seeds.setting, seeds.K, strict=True)) == {("paper", 6), ("paper", 12), ("noisy", 12)}
    assert (seeds.seeds == 2).all() and seeds.ratio_to_balance.between(0, 2).all()
    times = pd.read_csv(res / "general_timing.csv")
    assert list(times.K) == [12, 20] and times.balance_rounds.tolist() == [1, 0] and (times.policy_s_median > 0).all()
