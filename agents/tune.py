"""Hyperparameter search for MaskablePPO with Optuna, on the validation stream (issue 15 §2).

    python -m agents.tune                                  # conf/tune/search.yaml: 20 trials of 40k timesteps at K = 20
    python -m agents.tune trials=40 fresh=false            # continued to 40 trials: the shipped study (results/tune)
    python -m agents.tune trials=2 setting.total_timesteps=2048 experiment_name=null output=/tmp/t work_dir=/tmp/t/runs

Every trial trains with the project's training function (:func:`agents.train.train`, the same
code as ``python -m agents.train``) on ``setting`` -- by default the paper setting at K = 20,
40k timesteps, seed ``train_seed`` -- with hyperparameters drawn from ``space``. Each periodic
validation (``eval.freq`` timesteps, ``eval.rounds`` rounds of the **validation** stream) reports
the best validation served fraction so far to Optuna at its timestep, and the trial stops there
if the pruner says so. The objective is that best validation served fraction at the end of the
run: exactly what ``agents.train`` keeps as ``model.zip``. The test stream is never touched here
(``experiments/tune.py`` compares the tuned and the default config on it).

Search space (``conf/tune/search.yaml``; the YAML is the source of truth)

==============  ==================================  =========================================
learning_rate   1e-5 .. 3e-3, log-uniform           Adam step size
n_steps         {64, 128, 256, 512}                 rollout length per env (x n_envs = 16)
batch_size      {256, 512, 1024}                    minibatch (<= the smallest rollout, 1024)
n_epochs        3 .. 15 (integer)                   passes over each rollout
gamma           0.9 .. 1.0                          the RL discount (the SD draft depth is ``draft_depth``)
gae_lambda      0.8 .. 1.0                          GAE bias/variance trade-off
ent_coef        1e-4 .. 0.05, log-uniform           entropy bonus
clip_range      {0.1, 0.2, 0.3}                     PPO ratio clip
net_width       {64, 128, 256}                      ``agent.net_arch = [w, w]`` (policy and value)
==============  ==================================  =========================================

Choices, and why:

* **Sampler**: ``TPESampler(seed=sampler_seed, n_startup_trials=startup_trials)`` -- seeded, so the
  same study draws the same parameters; random until ``startup_trials`` trials have finished.
  Trial 0 is the default configuration (``conf/agent/maskable_ppo.yaml``, ``enqueue_default``), so
  the study measures the baseline on the same footing as every candidate.
* **Pruner**: ``MedianPruner(n_startup_trials=5, n_warmup_steps=15000)``: a trial stops when its
  best-so-far validation at a timestep is below the median of earlier trials at that timestep.
  Not Hyperband: with ~20 trials of one fixed budget its brackets would hold a handful of trials
  each (too few to rank), while the median rule needs only the few finished trials it compares
  with. The warm-up skips the first evaluations, where PPO's score is mostly noise.
* **Storage**: ``JournalStorage`` (an append-only file in ``work_dir``), so a killed study
  continues with ``fresh=false``; no database needed (optuna's RDB storage would pull SQLAlchemy).
* **Importance**: ``optuna.importance.PedAnovaImportanceEvaluator`` (PED-ANOVA, Watanabe et al.
  2023: how much each parameter's distribution differs between the top 10 % trials and all
  trials). optuna's default, fANOVA, fits a scikit-learn random forest, and scikit-learn is not a
  dependency of this project; PED-ANOVA is optuna's own code. Computed on the complete trials only.

Outputs (all written atomically): ``OUTPUT/trials.csv`` (number, state, value, duration_s,
last_step, every parameter, the reported intermediate values), ``importances.csv``,
``summary.md`` (best value, best parameters, importances, counts), ``history.png`` and
``importance.png``; ``EXPERIMENT_DIR/EXPERIMENT_NAME.yaml`` (default ``conf/experiment/tuned_k20.yaml``) -- the best configuration, loadable
with ``python -m agents.train experiment=EXPERIMENT_NAME``.

Why not ``hydra-optuna-sweeper`` (checked 2026-11-30 with pip 26 against requirements.lock):
the newest, 1.3.0, requires ``optuna>=2.10.0,<3.0.0``: pip resolves it only by installing
optuna 2.10.1 (2021) plus cliff/cmd2/stevedore; with ``optuna==5.0.0`` in the constraints pip
backtracks past 1.3.0 and 1.2.0 to 1.1.2 (written for Hydra 1.1), which requires ``alembic<1.7.0`` (the lock has 1.20.1) and builds
its space from distribution classes optuna deprecated in 3.0. And no version has a pruner: each
trial is an opaque Hydra job that returns one number, so intermediate values cannot be reported.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml

from agents.artefacts import save_figure_atomic, write_csv_atomic, write_text_atomic
from agents.threads import limit_threads
from agents.train import TrainConfigError, train
from agents.tune_space import (
    CONF,
    HYPERPARAMS,
    KEYS,
    ROOT,
    SEARCH_YAML,
    SPACE_TYPES,
    TuneConfigError,
    apply_params,
    check_search_config,
    compose_train,
    default_params,
    in_space,
    load_search_config,
    merge_nested,
    space_values,
    suggest,
    train_config,
)


# ------------------------------------------------------------------------------------------ trials
class ReportingValidation:
    """Wraps agents.train's validation: reports the best-so-far served fraction to the trial at
    each timestep and raises ``optuna.TrialPruned`` when the pruner says so."""

    def __init__(self, evaluation, trial: optuna.Trial, log_prefix: str):
        self.evaluation = evaluation
        self.trial = trial
        self.best = -math.inf
        self.reported: dict[int, float] = {}
        self.log_prefix = log_prefix

    def __call__(self, model) -> tuple[float, float]:
        frac, ratio = self.evaluation(model)
        self.best = max(self.best, frac)
        step = int(model.num_timesteps)
        if step not in self.reported:  # the final validation may repeat the last periodic one's timestep
            self.reported[step] = self.best
            self.trial.report(self.best, step)
            print(f"{self.log_prefix} step {step:>7,}: validation {frac:.4f} (best {self.best:.4f}, {ratio:.3f}x BALANCE)", flush=True)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"pruned at timestep {step} (best validation {self.best:.4f})")
        return frac, ratio


def objective_for(cfg: dict[str, Any], base_raw: dict) -> Any:
    work = Path(cfg["work_dir"])

    def objective(trial: optuna.Trial) -> float:
        params = suggest(trial, cfg["space"])
        raw = apply_params(base_raw, params)
        prefix = f"[tune] trial {trial.number:>3}"
        print(f"{prefix} params {json.dumps(params)}", flush=True)
        holder: dict[str, ReportingValidation] = {}

        def wrap(evaluation):
            holder["v"] = ReportingValidation(evaluation, trial, prefix)
            return holder["v"]

        train(raw, work / f"trial_{trial.number:03d}", wrap_validation=wrap)
        best = holder["v"].best
        if not math.isfinite(best):
            raise TrainConfigError("the trial's run made no validation (eval.rounds must be >= 1)")
        return best

    return objective


def run_study(cfg: dict[str, Any]) -> optuna.Study:
    """Run (or continue) the study until ``cfg['trials']`` trials have finished; returns it."""
    limit_threads(1)
    work = Path(cfg["work_dir"])
    work.mkdir(parents=True, exist_ok=True)
    journal = work / "study.journal"
    if cfg["fresh"]:
        journal.unlink(missing_ok=True)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.create_study(
        study_name=cfg["study_name"],
        storage=JournalStorage(JournalFileBackend(str(journal))),
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=cfg["sampler_seed"], n_startup_trials=cfg["startup_trials"]),
        pruner=optuna.pruners.MedianPruner(**cfg["pruner"]),
        load_if_exists=True,
    )
    if cfg["enqueue_default"] and not study.trials:
        defaults = default_params(cfg["space"])
        if in_space(defaults, cfg["space"]):
            study.enqueue_trial(defaults)
        else:
            print(f"[tune] the default configuration {defaults} is outside the space: not enqueued", flush=True)
    base_raw = train_config(cfg, cfg["train_seed"])
    left = cfg["trials"] - sum(t.state.is_finished() for t in study.trials)
    if left > 0:
        # ValueError: a trial whose run diverged (e.g. NaN logits at a large learning rate) is FAILED, the study goes on
        study.optimize(objective_for(cfg, base_raw), n_trials=left, catch=(ValueError,), gc_after_trial=True)
    return study


# ----------------------------------------------------------------------------------------- results
def first_step_at(trial: optuna.trial.FrozenTrial, value: float) -> int:
    """The first reported timestep at which ``trial``'s best-so-far reached ``value`` (its last step if never)."""
    steps = sorted(trial.intermediate_values)
    return next((s for s in steps if trial.intermediate_values[s] >= value - 1e-12), steps[-1] if steps else 0)


def best_trial(study: optuna.Study) -> tuple[optuna.trial.FrozenTrial, list[int]]:
    """The best complete trial and the numbers of all trials tied at its value.

    Validation served fractions are multiples of 1 / (rounds * K), and PPO runs often converge to the
    same plans, so exact ties are common; they are broken by sample efficiency -- the earliest
    timestep at which the best value was reached -- then by trial number (optuna's own rule takes
    the first trial)."""
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    top = max(t.value for t in complete)
    tied = [t for t in complete if t.value >= top - 1e-12]
    tied.sort(key=lambda t: (first_step_at(t, top), t.number))
    return tied[0], [t.number for t in sorted(tied, key=lambda t: t.number)]


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    rows = []
    for t in study.trials:
        steps = sorted(t.intermediate_values)
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else float("nan")
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value if t.value is not None else float("nan"),
                "duration_s": round(duration, 1),
                "last_step": steps[-1] if steps else 0,
                **{f"param_{k}": v for k, v in t.params.items()},
                "intermediate": ";".join(f"{s}:{t.intermediate_values[s]:.4f}" for s in steps),
            }
        )
    return pd.DataFrame(rows)


def importances(study: optuna.Study) -> pd.DataFrame:
    """PED-ANOVA importances over the complete trials (empty when fewer than two)."""
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2:
        return pd.DataFrame(columns=["param", "importance"])
    imp = optuna.importance.get_param_importances(study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    return pd.DataFrame({"param": list(imp), "importance": list(imp.values())})


def _plots(df: pd.DataFrame, imp: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    done = df[df.state == "COMPLETE"]
    pruned = df[df.state == "PRUNED"]
    ax.scatter(done.number, done.value, label="complete (best validation served fraction)", color="C0")
    last = [float(s.split(";")[-1].split(":")[1]) if s else float("nan") for s in pruned.intermediate]
    ax.scatter(pruned.number, last, marker="x", color="C3", label="pruned (best value when stopped)")
    best = df.value.where(df.state == "COMPLETE").cummax().ffill()
    ax.step(df.number, best, where="post", color="C2", label="best so far")
    ax.set(xlabel="trial", ylabel="validation served fraction", title="Optuna optimisation history")
    ax.legend(fontsize=8)
    save_figure_atomic(fig, out / "history.png")
    if len(imp):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.barh(imp.param[::-1], imp.importance[::-1], color="C0")
        ax.set(xlabel="importance (PED-ANOVA, complete trials)", title="Hyperparameter importance")
        fig.tight_layout()
        save_figure_atomic(fig, out / "importance.png")


def experiment_yaml(cfg: dict[str, Any], best: optuna.trial.FrozenTrial, n_finished: int) -> str:
    """conf/experiment/<name>.yaml: the setting the search ran on plus the best trial's parameters."""
    params = dict(best.params)
    body = merge_nested(cfg["setting"], {"agent": {"algo": "maskable_ppo"}})
    body = apply_params(body, params)
    head = (
        "# @package _global_\n"
        f"# Written by `python -m agents.tune` (agents/tune.py, conf/tune/search.yaml): the best of {n_finished} Optuna trials\n"
        f"# (trial {best.number}, best validation served fraction {best.value:.4f} on {cfg['setting'].get('eval', {}).get('rounds', '?')} validation rounds,\n"
        f"# training seed {cfg['train_seed']}); results/tune/summary.md reports the search, results/tune/compare.md tuned vs default on the test stream.\n"
        f"#   python -m agents.train experiment={cfg['experiment_name']}\n"
    )
    return head + yaml.safe_dump(body, sort_keys=False)


def study_wall_s(study: optuna.Study) -> float:
    """Seconds from the first trial's start to the last trial's end (over every invocation of a continued study)."""
    starts = [t.datetime_start for t in study.trials if t.datetime_start]
    ends = [t.datetime_complete for t in study.trials if t.datetime_complete]
    return (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0


def write_results(study: optuna.Study, cfg: dict[str, Any], argv: list[str] | None = None) -> dict[str, Any]:
    out = Path(cfg["output"])
    df = trials_frame(study)
    write_csv_atomic(df, out / "trials.csv")
    imp = importances(study)
    write_csv_atomic(imp.assign(evaluator="PedAnovaImportanceEvaluator"), out / "importances.csv")
    _plots(df, imp, out)
    counts = df.state.value_counts().to_dict()
    finished = int(sum(counts.get(s, 0) for s in ("COMPLETE", "PRUNED", "FAIL")))
    lines = [
        f"# Hyperparameter search: {cfg['study_name']}",
        "",
        f"Written by `{' '.join(['python -m agents.tune', *(argv or [])])}` (agents/tune.py; space and settings: conf/tune/search.yaml, resolved in search_config.yaml; with fresh=false earlier invocations' trials count too).",
        f"Setting: `{json.dumps(cfg['setting'])}`, training seed {cfg['train_seed']}; objective: best validation served fraction (validation stream).",
        f"Sampler: TPESampler(seed={cfg['sampler_seed']}, n_startup_trials={cfg['startup_trials']}); pruner: MedianPruner({', '.join(f'{k}={v}' for k, v in cfg['pruner'].items())}).",
        f"Trials: {len(df)} ({', '.join(f'{v} {k.lower()}' for k, v in counts.items())}); trials' wall time {study_wall_s(study) / 60:.1f} min (first start to last end; one torch thread, shared 2-core host), trial durations sum {df.duration_s.sum() / 60:.1f} min.",
        "",
    ]
    info: dict[str, Any] = {"trials": len(df), "counts": counts}
    complete = df[df.state == "COMPLETE"]
    if len(complete):
        best, tied = best_trial(study)
        info.update(best_value=best.value, best_number=best.number, best_params=best.params, tied=tied)
        tie = f" Tied at this value: trials {tied}; chosen: the one that reached it at the earliest timestep ({first_step_at(best, best.value):,})." if len(tied) > 1 else ""
        lines += [f"**Best value {best.value:.4f}** (trial {best.number}).{tie}", "", "| parameter | best | default (conf/agent/maskable_ppo.yaml) |", "|---|---|---|"]
        defaults = default_params(cfg["space"])
        lines += [f"| {k} | {v:.4g} | {defaults[k]} |" if isinstance(v, float) else f"| {k} | {v} | {defaults[k]} |" for k, v in best.params.items()]
        if cfg["enqueue_default"] and in_space(defaults, cfg["space"]):
            row0 = df.iloc[0]
            lines += ["", f"Trial 0 (the default configuration): {row0.state.lower()}, value {row0.value:.4f}, last reported timestep {row0.last_step}."]
        if cfg["experiment_name"]:
            path = Path(cfg["experiment_dir"]) / f"{cfg['experiment_name']}.yaml"
            write_text_atomic(path, experiment_yaml(cfg, best, finished))
            lines += ["", f"Best configuration: `{path}` (`python -m agents.train experiment={cfg['experiment_name']}`)."]
    if len(imp):
        lines += ["", f"Parameter importance (optuna PedAnovaImportanceEvaluator over {len(complete)} complete trials; fANOVA would need scikit-learn):", "", "| parameter | importance |", "|---|---|"]
        lines += [f"| {p} | {v:.3f} |" for p, v in zip(imp.param, imp.importance, strict=True)]
    lines += ["", "Plots: history.png (optimisation history), importance.png. Per-trial rows: trials.csv."]
    write_text_atomic(out / "summary.md", "\n".join(lines) + "\n")
    write_text_atomic(out / "search_config.yaml", yaml.safe_dump(cfg, sort_keys=False))
    return info


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):  # key=value overrides, not flags: --help prints the usage and runs nothing
        print(__doc__)
        print(f"Keys (conf/tune/search.yaml): {', '.join(KEYS)}")
        return None
    cfg = load_search_config(args)
    study = run_study(cfg)
    info = write_results(study, cfg, sys.argv[1:] if argv is None else argv)
    print(f"[tune] {info['trials']} trials {info['counts']}; best {info.get('best_value')} (trial {info.get('best_number')}) -> {cfg['output']}", flush=True)
    return info


#: re-exported: the search's config API, so callers need one module
__all__ = ["CONF", "HYPERPARAMS", "KEYS", "ROOT", "SEARCH_YAML", "SPACE_TYPES", "ReportingValidation", "TuneConfigError", "apply_params", "best_trial",
           "check_search_config", "compose_train", "default_params", "in_space", "load_search_config", "main", "merge_nested", "run_study", "space_values",
           "suggest", "train_config", "write_results"]


if __name__ == "__main__":
    main()
