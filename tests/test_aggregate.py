"""experiments.aggregate: a multirun of seeds becomes one table (per seed + mean) and one plot."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from experiments.aggregate import aggregate, find_runs, group_labels, main


def _fake_run(folder: Path, seed: int, algo: str, gain: float, rounds: int = 40) -> Path:
    """A run folder as agents.train leaves it: policy.json, eval.csv (test rounds), progress.csv, overrides."""
    folder.mkdir(parents=True)
    (folder / "model.zip").write_bytes(b"PK")
    (folder / "policy.json").write_text(json.dumps({"algo": algo, "env": {}, "seed": seed}))
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}", f"agent={algo}", "total_timesteps=1000"]))
    rng = np.random.default_rng(seed)
    base = rng.integers(10, 40, size=rounds)
    rows = [{"scheduler": "balance", "round": r, "num_users": 50, "served": int(b), "decision_s": 0.01} for r, b in enumerate(base)]
    rows += [{"scheduler": "policy", "round": r, "num_users": 50, "served": int(b + (rng.random() < gain)), "decision_s": 0.001} for r, b in enumerate(base)]
    pd.DataFrame(rows).to_csv(folder / "eval.csv", index=False)
    prog = pd.DataFrame({"time/total_timesteps": [256, 256, 512, 512], "time/fps": [1.0, np.nan, 1.0, np.nan], "eval/ratio_to_balance": [np.nan, 0.9, np.nan, 0.95 + seed / 100]})
    prog.to_csv(folder / "progress.csv", index=False)
    return folder


def test_aggregate_seeds_and_groups(tmp_path):
    for i, (seed, algo, gain) in enumerate([(0, "ppo", 0.0), (1, "ppo", 0.1), (0, "mppo", 0.5), (1, "mppo", 0.6), (2, "mppo", 0.4)]):
        _fake_run(tmp_path / f"{i}_{algo}_seed{seed}", seed, algo, gain)
    rows, means = aggregate(tmp_path)
    assert len(rows) == 5 and set(rows.group) == {"agent=ppo", "agent=mppo"}
    m = means.set_index("group")
    assert m.loc["agent=mppo", "seeds"] == 3 and m.loc["agent=ppo", "seeds"] == 2
    assert m.loc["agent=mppo", "ratio_to_balance"] > 1.0 and np.isfinite(m.loc["agent=mppo", "ratio_to_balance_ci95"])
    assert m.loc["agent=mppo", "seeds_above_balance"] == 3  # each seed's paired CI is above zero
    assert (rows.loc[rows.group == "agent=ppo", "seed"] == [0, 1]).all()
    table = pd.read_csv(tmp_path / "aggregate.csv")
    assert (table.run == "mean").sum() == 2 and {"diff_vs_balance", "diff_ci95_low", "p_wilcoxon"} <= set(table.columns)
    assert (tmp_path / "aggregate.png").stat().st_size > 0 and "total_timesteps=1000" in (tmp_path / "aggregate.md").read_text()
    assert rows.best_validation_ratio.notna().all() and (rows.timesteps == 512).all()


def test_group_labels_only_name_what_varies(tmp_path):
    runs = [_fake_run(tmp_path / f"r{s}", s, "ppo", 0.1) for s in range(3)]
    labels, common = group_labels(runs)
    assert labels == ["all"] * 3 and common == {"agent": "ppo", "total_timesteps": "1000"}


def test_missing_folder_is_clear(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_runs(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="no training runs"):
        find_runs(tmp_path)


@pytest.mark.parametrize(("name", "content", "words"), [("eval.csv", "scheduler,round\nx,1\nx,1,2,3\n", "eval.csv: not a readable CSV"),
                                                      ("eval.csv", "", "eval.csv: not a readable CSV"),
                                                      ("eval.csv", "a,b\n1,2\n", "eval.csv: needs the columns"),
                                                      ("progress.csv", "a,b\n1,2\n1,2,3,4\n", "progress.csv: not a readable CSV"),
                                                      ("policy.json", "{seed: 0", "policy.json: not a readable JSON"),
                                                      (".hydra/overrides.yaml", "[seed=0", "overrides.yaml: not a readable YAML")])
def test_a_corrupt_run_file_is_named_and_nothing_is_written(tmp_path, name, content, words):
    # pandas' / json's own errors named no file; the aggregate used to be half-written by then
    runs = tmp_path / "multirun"
    for seed in range(2):
        _fake_run(runs / f"s{seed}", seed, "ppo", 0.1)
    (runs / "s1" / name).write_text(content)
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=words):
        main([str(runs), "--out", str(out)])
    assert not out.exists()


def test_a_policy_json_without_an_env_is_named_when_evaluating(tmp_path):
    runs = tmp_path / "multirun"
    _fake_run(runs / "s0", 0, "ppo", 0.1)
    (runs / "s0" / "policy.json").write_text(json.dumps({"algo": "ppo", "seed": 0}))  # no "env"
    with pytest.raises(SystemExit, match="policy.json: no usable 'env' section"):
        main([str(runs), "--out", str(tmp_path / "out"), "--test-rounds", "2"])


def test_aggregate_evaluates_runs_without_eval_csv(tmp_path):
    """Runs trained with eval.final_rounds=0: --test-rounds evaluates each policy against BALANCE on test rounds."""
    from agents.policy import algo_class
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from envs import EnvConfig

    cfg = EnvConfig(num_users=5)
    for seed in (0, 1):
        run = tmp_path / f"{seed}_seed{seed}"
        run.mkdir()
        env = EdgeScheduleSB3VecEnv(2, cfg.to_dict())
        model = algo_class("maskable_ppo")("MlpPolicy", env, seed=seed, device="cpu", policy_kwargs={"net_arch": [8]})
        model.save(run / "model.zip")
        (run / "policy.json").write_text(json.dumps({"algo": "maskable_ppo", "env": cfg.to_dict(), "seed": seed, "streams": {"test": {"seed": 7}}}))
    out = tmp_path / "agg"
    rows, means = aggregate(tmp_path, out, test_rounds=4)
    assert (rows.test_rounds == 4).all() and rows.ratio_to_balance.notna().all() and means.seeds.iloc[0] == 2
    ev = pd.read_csv(out / "aggregate_eval.csv")
    assert set(ev.scheduler) == {"balance", "policy"} and set(ev.run) == {"0_seed0", "1_seed1"}
    assert sorted(p.name for p in (tmp_path / "0_seed0").iterdir()) == ["model.zip", "policy.json"]  # runs untouched
