"""Train an RL scheduler on EdgeSchedule-v0 and compare it with BALANCE.

    python -m agents.train agent=maskable_ppo env.num_users=12 total_timesteps=20000 logger=disabled output_dir=DIR
    python -m agents.train experiment=paper_k50            # the shipped policy's recipe
    python -m agents.train -m hydra/launcher=joblib seed=0,1,2 agent=maskable_ppo,ppo

Three disjoint round streams (``envs.workload``): the policy trains on the **train** stream
(seed ``seed``), ``model.zip`` is chosen on ``eval.rounds`` **validation** rounds, and the final
table is on ``eval.final_rounds`` **test** rounds -- the stream every published table uses.

Writes to ``DIR`` (``output_dir``, else Hydra's run folder), everything atomically:

* ``model.zip`` -- the best policy on the validation rounds (``last_model.zip``: the last one),
  ``policy.json`` (algorithm, env config, the round streams used), ``policy.onnx`` (mask-aware export);
* ``config.yaml`` -- the resolved config, ``.hydra/`` -- Hydra's record (config, overrides), ``train.log``;
* ``progress.csv`` / ``tb/`` / ``wandb/`` -- learning curves; every evaluation row carries its timestep;
* ``checkpoints/`` -- a checkpoint every ``checkpoint_freq`` timesteps (default: every 10 % of the
  run); ``resume=CKPT`` continues from one and appends to ``progress.csv``; ``resume=auto`` continues
  from the latest checkpoint in ``DIR`` if there is one (what a requeued Slurm job does: under the
  submitit launcher ``resume`` defaults to ``auto``), else starts afresh. A resumed run finishes the
  curriculum stage it was in and goes on with the later ones;
* ``eval.csv`` + ``eval_summary.{csv,md}`` -- the policy against BALANCE and the baselines on the
  test rounds, with paired differences to BALANCE (``agents.evaluate``).

The config (:class:`TrainConfig`, :class:`TrainConfigError`) lives in ``agents/train_config.py``
and is importable from here too. Tracking (``agents/train_log.py``): TensorBoard gets the scalars
and the hyperparameters (HParams); W&B runs of one ``-m`` sweep share a ``group`` (the sweep folder unless ``logger.wandb.group`` is
set), carry ``logger.wandb.job_type``, and the best policy folder is logged as a ``model`` artifact.

One entry point in the manner of CleanRL's ``ppo.py``: typed, validated config; explicit seeding;
steps/s logged (``time/fps``); ``threads`` torch threads (default 1: see ``agents/threads.py``).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from omegaconf import OmegaConf

from agents.artefacts import save_model_atomic, write_csv_atomic, write_text_atomic
from agents.evaluate import evaluate_schedulers, format_summary, summarize
from agents.policy import algo_class
from agents.threads import limit_threads
from agents.train_callbacks import (
    ValidateAndCheckpoint,
    ValidationEvaluation,
    ValidationEvaluationV1,
)
from agents.train_config import TrainConfig, TrainConfigError
from agents.train_log import attach_writers, hparams_of, log_policy_artifact, wandb_run
from envs.config import refuse_renamed_overrides
from envs.workload import make_rounds

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

# conf/train.yaml: ``hydra.run.dir: ${specsched_or:${output_dir},outputs/train/...}`` -- the run's
# whole record (.hydra/, log, artefacts) goes to output_dir when it is set
if not OmegaConf.has_resolver("specsched_or"):
    OmegaConf.register_new_resolver("specsched_or", lambda value, default: default if value is None else value)



# ------------------------------------------------------------------------------------------ train
def rollout_timesteps(model: BaseAlgorithm, n_envs: int) -> int:
    """Timesteps ``model.learn`` adds per collection: it stops only at whole collections."""
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    if isinstance(model, OnPolicyAlgorithm):  # whole rollouts (DQN's n_steps is its n-step return, not a rollout)
        return int(model.n_steps) * n_envs
    freq = getattr(model, "train_freq", None)
    if freq is not None and getattr(freq.unit, "value", "") == "step":  # off-policy, trained every `frequency` steps
        return int(freq.frequency) * n_envs
    return n_envs


def _round_up(steps: int, chunk: int) -> int:
    return -(-steps // chunk) * chunk


def latest_checkpoint(out: Path) -> Path | None:
    """The checkpoint with the most timesteps in ``out/checkpoints`` (complete files only), or None."""
    best, best_steps = None, -1
    for path in (out / "checkpoints").glob("model_*_steps.zip"):
        try:
            steps = int(path.stem.split("_")[1])
        except ValueError:
            continue
        if steps > best_steps:
            best, best_steps = path, steps
    return best


def stage_plan(stages: list[int], total: int, start: int, chunk: int) -> list[tuple[int, int, int]]:
    """``(stage, K, timesteps)`` still to train: ``total`` split equally over ``stages`` (the last
    takes the remainder), minus the ``start`` timesteps already trained, each rounded up to whole
    collections of ``chunk``."""
    n = len(stages)
    bounds = [0]
    for i in range(n):
        bounds.append(bounds[-1] + (total // n if i < n - 1 else total - (total // n) * (n - 1)))
    plan = []
    for i, k in enumerate(stages):
        if start >= bounds[i + 1] and i < n - 1:
            continue
        steps = bounds[i + 1] - max(start, bounds[i])
        plan.append((i, k, _round_up(steps, chunk) if steps > 0 else 0))
    return plan


def _best_validation(progress_csv: Path) -> float:
    """The best validation served fraction logged so far (-1 when none)."""
    import pandas as pd

    if not progress_csv.is_file() or progress_csv.stat().st_size == 0:
        return -1.0
    col = pd.read_csv(progress_csv).get("eval/served_frac")
    return float(col.max()) if col is not None and col.notna().any() else -1.0


def _metadata(cfg: TrainConfig, stages: list[int], start_step: int) -> dict[str, Any]:
    """``policy.json``: what the scheduler needs to load, and which round streams the run used."""
    return {
        "algo": cfg.agent.algo,
        "env_id": cfg.env_id,
        "env": cfg.env.to_dict(),
        "seed": cfg.seed,
        "threads": cfg.threads,
        "streams": {
            "scheme": "envs.workload.stream_seed_sequence (numpy SeedSequence; spawn key: train 2, validation 1, test none)",
            "train": {"seed": cfg.seed, "sub_envs": cfg.n_envs, "stages": list(range(len(stages))), "num_users": stages, "start_step": start_step},
            "validation": {"seed": cfg.eval.seed, "rounds": cfg.eval.rounds, "used_for": "checkpoint selection (model.zip)"},
            "test": {"seed": cfg.eval.seed, "rounds": cfg.eval.final_rounds, "used_for": "eval.csv / eval_summary (reported)"},
        },
    }


def train(raw: dict, out: str | Path, wrap_validation: Callable[[Callable], Callable] | None = None) -> dict[str, Any]:
    """Train per ``raw`` (a plain dict as Hydra resolves it) into folder ``out``; returns a summary.

    ``wrap_validation`` (agents/tune.py) wraps the validation ``model -> (served fraction, ratio)``:
    a search sees every validation and may stop the run by raising from it (pruning)."""
    cfg = TrainConfig.from_dict(raw)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    limit_threads(cfg.threads)  # before any torch work (see agents/threads.py)
    from stable_baselines3.common.utils import set_random_seed

    if cfg.env_id == "EdgeSchedule-v1":
        Validation = ValidationEvaluationV1
        from agents.sb3_vec_env_v1 import EdgeScheduleV1SB3VecEnv as EdgeScheduleSB3VecEnv
    else:
        from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
        Validation = ValidationEvaluation

    set_random_seed(cfg.seed)
    write_text_atomic(out / "config.yaml", yaml.safe_dump(raw, sort_keys=False))

    algo = algo_class(cfg.agent.algo)
    resume = latest_checkpoint(out) if cfg.resume == "auto" else (Path(cfg.resume) if cfg.resume else None)
    if cfg.resume == "auto":
        print(f"[train] resume=auto: {'resuming from ' + str(resume) if resume else 'no checkpoint in ' + str(out / 'checkpoints') + ', starting afresh'}", flush=True)
    # curriculum over K: equal shares of the budget on growing rounds, the configured K last
    stages = [*cfg.curriculum, cfg.env.num_users]
    if resume is not None:
        from stable_baselines3.common.save_util import load_from_zip_file

        start_step = int(load_from_zip_file(resume, device="cpu", load_data=True)[0]["num_timesteps"])
    else:
        start_step = 0
    first_stage = stage_plan(stages, cfg.total_timesteps, start_step, 1)[0]
    env = EdgeScheduleSB3VecEnv(cfg.n_envs, cfg.env.replace(num_users=first_stage[1]).to_dict(), stage=first_stage[0], start_step=start_step)
    if resume is not None:
        model = algo.load(resume, env=env, device="cpu")
    else:
        try:
            from agents.set_policy import set_policy_kwargs

            policy_kwargs = {"net_arch": list(cfg.agent.net_arch), **set_policy_kwargs(cfg.agent.features, cfg.env.max_gamma)}
            model = algo(cfg.agent.policy, env, seed=cfg.seed, device="cpu", verbose=0, policy_kwargs=policy_kwargs, **cfg.agent.hyperparams)
        except TypeError as err:
            raise TrainConfigError(f"agent.hyperparams not accepted by {cfg.agent.algo}: {err}") from None
    # training rounds: the train stream, fresh for a resumed run (it never replays its first rounds)
    env.seed(cfg.seed)
    write_text_atomic(out / "policy.json", json.dumps(_metadata(cfg, stages, start_step), indent=2))

    run = wandb_run(cfg.logger, out, raw, name=f"{cfg.agent.algo}-k{cfg.env.num_users}-s{cfg.seed}")
    attach_writers(model, out, cfg.logger, run, append=resume is not None, hparams=hparams_of(cfg), step=start_step)

    evaluation = Validation(cfg.env, cfg.eval.rounds, cfg.eval.seed, cfg.draft_depth, masked=cfg.agent.algo == "maskable_ppo") if cfg.eval.rounds > 0 else None
    if evaluation is not None and wrap_validation is not None:
        evaluation = wrap_validation(evaluation)
    checkpoint_freq = cfg.checkpoint_freq if cfg.checkpoint_freq is not None else max(cfg.total_timesteps // 10, 1)
    callback = ValidateAndCheckpoint(out, evaluation, cfg.eval.freq, checkpoint_freq, start=start_step)
    callback.init_callback(model)  # the final evaluation needs it even when a resumed run has nothing left to train
    if resume is not None and (out / "model.zip").exists():
        callback.best = _best_validation(out / "progress.csv")  # model.zip is replaced only by a better policy
    chunk = rollout_timesteps(model, cfg.n_envs)
    plan = stage_plan(stages, cfg.total_timesteps, start_step, chunk)
    total = start_step + sum(steps for _, _, steps in plan)
    print(f"[train] {cfg.agent.algo}, K={cfg.env.num_users}: timesteps {start_step:,} -> {total:,} (whole collections of {chunk:,}; asked {cfg.total_timesteps:,}), {cfg.threads} thread(s) -> {out}", flush=True)
    start = time.perf_counter()
    for n, (i, k, steps) in enumerate(plan):
        if steps <= 0:
            continue
        if n > 0:
            stage_env = EdgeScheduleSB3VecEnv(cfg.n_envs, cfg.env.replace(num_users=k).to_dict(), stage=i, start_step=start_step)
            stage_env.seed(cfg.seed)
            model.set_env(stage_env)
        if len(stages) > 1:
            model.logger.record("curriculum/num_users", k)
        # ``steps`` is whole collections, so the progress bar's total is the real one
        model.learn(total_timesteps=steps, callback=callback, progress_bar=cfg.progress_bar, reset_num_timesteps=bool(n == 0 and resume is None))
    train_s = time.perf_counter() - start
    save_model_atomic(model, out / "last_model.zip")
    if evaluation is not None:
        callback.evaluate()  # the final policy competes for model.zip too
    if not (out / "model.zip").exists():
        save_model_atomic(model, out / "model.zip")

    trained = int(model.num_timesteps) - start_step
    summary: dict[str, Any] = {"train_s": train_s, "timesteps": int(model.num_timesteps), "trained_timesteps": trained, "steps_per_s": trained / max(train_s, 1e-9)}
    if cfg.export_onnx:
        from agents.export import export_onnx

        summary["onnx"] = str(export_onnx(out))
    if run is not None:
        summary["artifact"] = log_policy_artifact(run, out, {"validation_served_frac": callback.best, "timesteps": int(model.num_timesteps), "algo": cfg.agent.algo, "num_users": cfg.env.num_users})
    if cfg.eval.final_rounds > 0:
        names = list(dict.fromkeys([*cfg.eval.final_schedulers, "policy"]))
        test_rounds = make_rounds(cfg.env, cfg.eval.final_rounds, cfg.eval.seed, split="test")
        evaluate_fn = evaluate_schedulers
        if cfg.env_id == "EdgeSchedule-v1":
            from agents.evaluate_v1 import evaluate_schedulers_v1 as evaluate_fn
        df = evaluate_fn(cfg.env, names, rounds=test_rounds, seed=cfg.eval.seed, draft_depth=cfg.draft_depth, progress=cfg.progress_bar, policy_path=str(out))
        write_csv_atomic(df, out / "eval.csv")
        table = summarize(df)
        write_csv_atomic(table, out / "eval_summary.csv")
        write_text_atomic(out / "eval_summary.md", format_summary(table) + "\n")
        summary["table"] = table
        if run is not None:
            import wandb

            run.log({"final/eval_summary": wandb.Table(dataframe=table)})
    if run is not None:
        run.finish()
    return summary


def discard_refused_run_folder(out: Path) -> None:
    """Remove what Hydra made in ``out`` for a run refused before it started: its ``.hydra/`` record
    and empty logs, then ``out`` itself if that leaves it empty. Anything else in ``out`` (a folder
    the user named, a resumed run's artefacts) is left as it is, and so is ``out``."""
    others = [p for p in out.iterdir() if not (p.name == ".hydra" or (p.suffix == ".log" and p.is_file() and p.stat().st_size == 0))] if out.is_dir() else [None]
    if others:
        return
    shutil.rmtree(out / ".hydra", ignore_errors=True)
    for log in out.glob("*.log"):
        log.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        out.rmdir()


def _main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="train")
    def app(cfg) -> None:
        raw = OmegaConf.to_container(cfg, resolve=True)
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN and raw.get("output_dir"):
            raise TrainConfigError("output_dir names one run's folder: with -m (multirun) set hydra.sweep.dir instead")
        wb = (raw.get("logger") or {}).get("wandb")
        if hc.mode == RunMode.MULTIRUN and wb is not None and not wb.get("group"):
            wb["group"] = str(hc.sweep.dir)  # the runs of one sweep are one W&B group
        if raw.get("resume") is None and "submitit" in str(hc.launcher.get("_target_", "")):
            raw["resume"] = "auto"  # a preempted or timed-out job is requeued into the same folder: continue it
        # conf/train.yaml makes Hydra's run folder output_dir, so .hydra/ and train.log land there too
        out = hc.runtime.output_dir
        if hc.mode == RunMode.RUN:
            try:
                TrainConfig.from_dict(raw)  # train() checks it again; here a refusal is one line, not a traceback
            except TrainConfigError as err:
                discard_refused_run_folder(Path(out))
                raise SystemExit(f"agents.train: error: {err}") from None
        summary = train(raw, out)
        print(f"trained {summary['timesteps']} steps in {summary['train_s']:.0f} s -> {out}")
        if "table" in summary:
            print(format_summary(summary["table"]))

    import sys

    refuse_renamed_overrides(sys.argv[1:], "train")
    app()


if __name__ == "__main__":
    _main()
