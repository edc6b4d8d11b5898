"""The Optuna search (agents/tune.py): config checks, the search space, pruning, and a tiny study end to end."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from omegaconf import OmegaConf

from agents.train import TrainConfig
from agents.tune import (
    ReportingValidation,
    TuneConfigError,
    apply_params,
    best_trial,
    compose_train,
    default_params,
    in_space,
    load_search_config,
    main,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_shipped_search_config_loads_and_contains_the_default_configuration():
    cfg = load_search_config([])
    assert set(cfg["space"]) >= {"learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "clip_range", "net_width"}
    defaults = default_params(cfg["space"])
    assert defaults["net_width"] == 256 and defaults["gamma"] == 1.0
    assert in_space(defaults, cfg["space"])  # trial 0 (the default) is a point of the space
    # every trial's training config is a valid agents.train config
    raw = apply_params(compose_train(list(cfg["trial_overrides"])), defaults)
    TrainConfig.from_dict({**raw, **cfg["setting"], "env": {**raw["env"], **cfg["setting"]["env"]}})


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["trials=0"], "trials"),
        (["bogus=1"], "bogus"),
        (["space.momentum={type: float, low: 0.1, high: 0.9}"], "space.momentum"),
        (["space.gamma.type=beta"], "space.gamma.type"),
        (["space.gamma.low=1.5"], "space.gamma.low/high"),
        (["space.ent_coef.low=0"], "space.ent_coef.low/high"),  # log-uniform needs low > 0
        (["space.batch_size.choices=[4096]"], "space.batch_size"),  # larger than the smallest rollout 64 * 16
        (["pruner.interval_steps=0"], "pruner.interval_steps"),
    ],
)
def test_bad_search_configs_name_the_field(overrides, field):
    with pytest.raises(TuneConfigError, match=re.escape(f"'{field}'")):
        load_search_config(overrides)


def test_in_space():
    space = {"a": {"type": "float", "low": 0.0, "high": 1.0}, "b": {"type": "categorical", "choices": [1, 2]}, "c": {"type": "int", "low": 1, "high": 3}}
    assert in_space({"a": 1.0, "b": 2, "c": 3}, space)
    assert not in_space({"a": 1.5, "b": 2, "c": 3}, space)
    assert not in_space({"a": 0.5, "b": 3, "c": 3}, space)
    assert not in_space({"a": 0.5, "b": 2, "c": 2.5}, space)


def test_apply_params_sets_net_arch_and_hyperparams_without_touching_the_rest():
    raw = {"agent": {"algo": "maskable_ppo", "net_arch": [256, 256], "hyperparams": {"vf_coef": 0.5, "gamma": 1.0}}, "seed": 3}
    out = apply_params(raw, {"net_width": 64, "gamma": 0.97})
    assert out["agent"] == {"algo": "maskable_ppo", "net_arch": [64, 64], "hyperparams": {"vf_coef": 0.5, "gamma": 0.97}}
    assert raw["agent"]["net_arch"] == [256, 256]  # the input is not modified


class _Model:
    def __init__(self):
        self.num_timesteps = 0


def test_reporting_validation_reports_best_so_far_and_prunes_a_bad_trial():
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0))
    model = _Model()

    def run(values):
        trial = study.ask()
        it = iter(values)
        wrapped = ReportingValidation(lambda _m: (next(it), 1.0), trial, "[test]")
        try:
            for step, _ in enumerate(values, start=1):
                model.num_timesteps = step * 100
                wrapped(model)
        except optuna.TrialPruned:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return trial.number, wrapped
        study.tell(trial, wrapped.best)
        return trial.number, wrapped

    _, good = run([0.8, 0.7, 0.9])
    assert good.reported == {100: 0.8, 200: 0.8, 300: 0.9}  # the best so far, not the last value
    good.evaluation = lambda _m: (0.95, 1.0)
    model.num_timesteps = 300
    good(model)  # a repeated timestep (the final validation) updates the best but is not reported twice
    assert good.best == 0.95 and good.reported[300] == 0.9
    n, bad = run([0.5, 0.6, 0.7])
    assert study.trials[n].state == optuna.trial.TrialState.PRUNED
    assert bad.reported == {100: 0.5}  # stopped at its first report, below the median 0.8


def test_ties_at_the_best_value_go_to_the_trial_that_reached_it_first():
    study = optuna.create_study(direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for value, iv in [(0.8, {100: 0.7, 200: 0.8}), (0.9, {100: 0.8, 200: 0.9}), (0.9, {100: 0.9, 200: 0.9}), (0.9, {100: 0.9})]:
        study.add_trial(optuna.trial.create_trial(value=value, params={"x": 0.5}, distributions=dist, intermediate_values=iv))
    best, tied = best_trial(study)
    assert tied == [1, 2, 3]
    assert best.number == 2  # reached 0.9 at timestep 100 like trial 3, and has the lower number
    assert study.best_trial.number == 1  # optuna's own rule would have taken the first


class _PruneSecond(optuna.pruners.BasePruner):
    """Prunes every trial after the first: the pruning path end to end, whatever the trials score."""

    def prune(self, study, trial) -> bool:
        return trial.number >= 1


def test_tiny_study_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setattr(optuna.pruners, "MedianPruner", lambda **_kw: _PruneSecond())
    overrides = [
        "trials=2",
        f"output={tmp_path / 'results'}",
        f"work_dir={tmp_path / 'runs'}",
        f"experiment_dir={tmp_path / 'conf'}",
        "experiment_name=tuned_tiny",
        "setting.env.num_users=5",
        "setting.n_envs=2",
        "setting.total_timesteps=96",
        "setting.eval.rounds=4",
        "setting.eval.freq=32",
        "enqueue_default=false",
        "space.n_steps.choices=[16]",
        "space.batch_size.choices=[16,32]",
        "space.n_epochs.high=4",
        "space.net_width.choices=[8,16]",
    ]
    info = main(overrides)
    out = tmp_path / "results"
    trials = pd.read_csv(out / "trials.csv")
    assert list(trials.state) == ["COMPLETE", "PRUNED"]
    assert trials.last_step.iloc[1] == 32  # pruned at its first validation
    assert trials.last_step.iloc[0] >= 96 and 0 <= trials.value.iloc[0] <= 1
    assert {"param_learning_rate", "param_net_width", "intermediate", "duration_s"} <= set(trials.columns)
    assert info["best_number"] == 0 and info["counts"] == {"COMPLETE": 1, "PRUNED": 1}
    for name in ("summary.md", "importances.csv", "history.png", "search_config.yaml"):
        assert (out / name).is_file(), name
    assert "Best value" in (out / "summary.md").read_text()
    # the best configuration is an experiment file agents.train accepts (@package _global_: merged at the top)
    written = tmp_path / "conf" / "tuned_tiny.yaml"
    assert written.read_text().startswith("# @package _global_")
    exp = yaml.safe_load(written.read_text())
    assert exp["agent"]["net_arch"] == [trials.param_net_width.iloc[0]] * 2
    assert exp["agent"]["hyperparams"]["learning_rate"] == pytest.approx(trials.param_learning_rate.iloc[0])
    raw = OmegaConf.to_container(OmegaConf.merge(OmegaConf.create(compose_train([])), OmegaConf.create(exp)), resolve=True)
    tc = TrainConfig.from_dict(raw)
    assert tc.env.num_users == 5 and tc.agent.hyperparams["vf_coef"] == 0.5  # unsearched defaults kept
    assert Path(tmp_path / "runs" / "study.journal").is_file()
    # experiments/tune.py: default vs that tuned file on the test stream, paired per round
    from experiments.tune import main as compare_main

    setting = [o for o in overrides if o.startswith(("setting.", "space."))]
    table = compare_main(["--seeds", "1", "--rounds", "3", "--experiment", str(written), "--runs", str(tmp_path / "cmp"), "--out", str(tmp_path / "results"), "--search-set", *setting])
    assert list(table.row[:2]) == ["seed 1", "pooled (1 seeds, per-round mean)"]
    assert table.diff_tuned_minus_default.iloc[0] == pytest.approx(table.tuned_served_frac.iloc[0] - table.default_served_frac.iloc[0])
    rows = pd.read_csv(tmp_path / "results" / "compare_rows.csv")
    assert sorted(rows.scheduler.unique()) == ["balance", "default", "tuned"] and len(rows) == 9
    assert (tmp_path / "results" / "compare.md").is_file()
    assert yaml.safe_load((tmp_path / "cmp" / "tuned_s1" / "config.yaml").read_text())["agent"]["net_arch"] == exp["agent"]["net_arch"]
    assert yaml.safe_load((tmp_path / "cmp" / "default_s1" / "config.yaml").read_text())["agent"]["net_arch"] == [256, 256]
    # --timesteps: both configs at another budget, into their own folders and files
    compare_main(["--seeds", "1", "--rounds", "2", "--timesteps", "32", "--experiment", str(written), "--runs", str(tmp_path / "cmp"), "--out", str(tmp_path / "results"), "--search-set", *setting])
    assert (tmp_path / "results" / "compare_t32.md").is_file() and (tmp_path / "results" / "compare.md").is_file()
    for name in ("default", "tuned"):
        assert yaml.safe_load((tmp_path / "cmp_t32" / f"{name}_s1" / "config.yaml").read_text())["total_timesteps"] == 32
