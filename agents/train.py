"""Train an RL scheduler on EdgeSchedule-v0 and compare it with BALANCE.

    python -m agents.train agent=maskable_ppo env.num_users=12 total_timesteps=20000 logger=disabled output_dir=DIR
    python -m agents.train experiment=paper_k50            # the shipped policy's recipe
    python -m agents.train -m hydra/launcher=joblib seed=0,1,2 agent=maskable_ppo,ppo

Writes to ``DIR`` (Hydra's run folder unless ``output_dir`` is set):

* ``model.zip`` -- the best policy on the held-out rounds (``last_model.zip``: the last one),
  ``policy.json`` (algorithm + env config), ``policy.onnx`` (mask-aware export);
* ``config.yaml`` -- the resolved config; ``progress.csv`` / ``tb/`` / ``wandb/`` -- learning curves;
* ``checkpoints/`` -- periodic checkpoints (``resume=...`` continues from one);
* ``eval.csv`` + ``eval_summary.{csv,md}`` -- the policy against BALANCE and the baselines on
  ``eval.final_rounds`` held-out rounds (``agents.evaluate``).

One entry point in the manner of CleanRL's ``ppo.py``: typed, validated config; explicit seeding;
steps/s logged (``time/fps``); periodic evaluation on a fixed held-out set of rounds, logged as
served fraction and ratio to BALANCE.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agents.evaluate import evaluate_schedulers, format_summary, make_rounds, summarize
from agents.policy import algo_class
from envs.config import EnvConfig

WANDB_MODES = ("offline", "online", "disabled")


class TrainConfigError(ValueError):
    """A training config value is out of range; the message names the key and the allowed values."""


@dataclass
class AgentConfig:
    algo: str
    policy: str = "MlpPolicy"
    net_arch: list = field(default_factory=lambda: [256, 256])
    hyperparams: dict = field(default_factory=dict)


@dataclass
class EvalConfig:
    rounds: int = 100
    freq: int = 20000
    seed: int = 1000003
    final_rounds: int = 500
    final_schedulers: list = field(default_factory=lambda: ["balance", "ad_only", "sd_only", "greedy"])


@dataclass
class TrainConfig:
    env: EnvConfig
    agent: AgentConfig
    eval: EvalConfig
    logger: dict
    seed: int = 0
    total_timesteps: int = 100000
    n_envs: int = 16
    resume: str | None = None
    checkpoint_freq: int = 50000
    progress_bar: bool = True
    export_onnx: bool = True
    gamma: int = 4
    curriculum: list = field(default_factory=list)  #: K of earlier stages, e.g. [12, 30]; the last stage is env.num_users

    @classmethod
    def from_dict(cls, cfg: dict) -> TrainConfig:
        cfg = dict(cfg)
        cfg.pop("profile", None)  # the profile group's data; env.profile names it
        cfg.pop("output_dir", None)
        top = {"env", "agent", "eval", "logger", "seed", "total_timesteps", "n_envs", "resume", "checkpoint_freq", "progress_bar", "export_onnx", "gamma", "curriculum"}
        unknown = sorted(set(cfg) - top)
        if unknown:
            raise TrainConfigError(f"unknown train config key(s) {unknown}; known: {sorted(top)}")
        try:
            env = EnvConfig.from_kwargs(**cfg.get("env", {}))
        except ValueError as err:
            raise TrainConfigError(str(err)) from None
        agent = _dataclass(AgentConfig, cfg.get("agent", {}), "agent")
        if agent.algo not in ("maskable_ppo", "ppo", "dqn"):
            raise TrainConfigError(f"agent.algo must be one of ['dqn', 'maskable_ppo', 'ppo'], got {agent.algo!r}")
        if not all(isinstance(n, int) and n > 0 for n in agent.net_arch):
            raise TrainConfigError(f"agent.net_arch must be a list of positive layer widths, got {agent.net_arch!r}")
        ev = _dataclass(EvalConfig, cfg.get("eval", {}), "eval")
        rest = {k: cfg[k] for k in top - {"env", "agent", "eval"} if k in cfg}
        out = cls(env=env, agent=agent, eval=ev, **{"logger": {}, **rest})
        out._check()
        return out

    def _check(self) -> None:
        def need(name: str, ok: bool, allowed: str, got: Any) -> None:
            if not ok:
                raise TrainConfigError(f"train config '{name}' must be {allowed}, got {got!r}")

        need("seed", isinstance(self.seed, int) and self.seed >= 0, "an integer >= 0", self.seed)
        need("total_timesteps", isinstance(self.total_timesteps, int) and self.total_timesteps >= 1, "an integer >= 1", self.total_timesteps)
        need("n_envs", isinstance(self.n_envs, int) and 1 <= self.n_envs <= 4096, "an integer in [1, 4096]", self.n_envs)
        need("checkpoint_freq", isinstance(self.checkpoint_freq, int) and self.checkpoint_freq >= 0, "an integer >= 0 (0 = none)", self.checkpoint_freq)
        need("gamma", isinstance(self.gamma, int) and 1 <= self.gamma <= self.env.max_gamma, f"an integer in [1, env.max_gamma={self.env.max_gamma}]", self.gamma)
        need("eval.rounds", isinstance(self.eval.rounds, int) and self.eval.rounds >= 1, "an integer >= 1", self.eval.rounds)
        need("eval.freq", isinstance(self.eval.freq, int) and self.eval.freq >= 0, "an integer >= 0 (0 = only at the end)", self.eval.freq)
        need("eval.final_rounds", isinstance(self.eval.final_rounds, int) and self.eval.final_rounds >= 0, "an integer >= 0", self.eval.final_rounds)
        need("curriculum", isinstance(self.curriculum, list) and all(isinstance(k, int) and 1 <= k <= self.env.num_users for k in self.curriculum), f"a list of round sizes in [1, env.num_users={self.env.num_users}]", self.curriculum)
        if self.curriculum and self.env.max_users is None:
            raise TrainConfigError("curriculum needs env.max_users set (a fixed look-ahead keeps the observation size the same across stages)")
        if self.resume is not None:
            need("resume", Path(self.resume).is_file(), "null or an existing checkpoint .zip", self.resume)
        wb = (self.logger or {}).get("wandb")
        if wb is not None:
            need("logger.wandb.mode", wb.get("mode") in WANDB_MODES, f"one of {list(WANDB_MODES)}", wb.get("mode"))


def _dataclass(cls, values: dict, where: str):
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(values or {}) - known)
    if unknown:
        raise TrainConfigError(f"unknown {where} config key(s) {unknown}; known: {sorted(known)}")
    return cls(**(values or {}))


# ------------------------------------------------------------------------------------------ logging
def _wandb_run(logger_cfg: dict, out: Path, config: dict, name: str):
    wb = logger_cfg.get("wandb")
    if wb is None:
        return None
    mode = os.environ.get("WANDB_MODE") or wb.get("mode", "offline")  # the variable wins
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    return wandb.init(project=wb.get("project", "specsched"), entity=wb.get("entity"), tags=list(wb.get("tags") or []), name=name, mode=mode, dir=str(out), config=config)


def _writers(model, out: Path, logger_cfg: dict, run) -> None:
    from stable_baselines3.common.logger import (
        CSVOutputFormat,
        HumanOutputFormat,
        KVWriter,
        Logger,
        TensorBoardOutputFormat,
    )

    # progress.csv at the top of the run folder, TensorBoard events in tb/
    formats = [HumanOutputFormat(sys.stdout), CSVOutputFormat(str(out / "progress.csv"))]
    if logger_cfg.get("tensorboard"):
        formats.append(TensorBoardOutputFormat(str(out / "tb")))
    logger = Logger(str(out), formats)
    if run is not None:

        class WandbWriter(KVWriter):
            """SB3 scalars to W&B, stepped by environment timesteps (not W&B's own counter)."""

            def write(self, key_values, key_excluded, step=0):
                run.log({k: v for k, v in key_values.items() if isinstance(v, int | float | np.floating | np.integer)}, step=int(step))

            def close(self):
                pass

        logger.output_formats.append(WandbWriter())
    model.set_logger(logger)


# ------------------------------------------------------------------------------------------ eval
class HeldOutEvaluation:
    """The policy (deterministic, masked) on a fixed set of held-out rounds, in one vector env."""

    def __init__(self, cfg: TrainConfig):
        from envs.edge_schedule import EdgeScheduleVectorEnv

        self.rounds = make_rounds(cfg.env, cfg.eval.rounds, cfg.eval.seed)
        self.venv = EdgeScheduleVectorEnv(num_envs=len(self.rounds), **cfg.env.to_dict())
        # BALANCE's users served on the realised values (not just admitted: they differ under noise)
        balance = evaluate_schedulers(cfg.env, ["balance"], rounds=self.rounds, seed=cfg.eval.seed, gamma=cfg.gamma)
        self.balance_served = float(balance.served.mean())
        self.masked = cfg.agent.algo == "maskable_ppo"

    def __call__(self, model) -> tuple[float, float]:
        """(served fraction, ratio to BALANCE) of ``model`` on the held-out rounds."""
        obs, _ = self.venv.reset(seed=0, options={"rounds": self.rounds})
        served = None
        for _ in range(self.venv.cfg.num_users):
            if self.masked:
                actions, _ = model.predict(obs, action_masks=self.venv.action_masks(), deterministic=True)
            else:
                actions, _ = model.predict(obs, deterministic=True)
            obs, _, term, _, info = self.venv.step(actions)
            if term.all():
                served = info["served"]
        mean = float(np.mean(served))
        return mean / self.venv.cfg.num_users, mean / max(self.balance_served, 1e-9)


def _callback(cfg: TrainConfig, out: Path, evaluation: HeldOutEvaluation | None):
    from stable_baselines3.common.callbacks import BaseCallback, CallbackList, CheckpointCallback

    class EvalAgainstBalance(BaseCallback):
        def __init__(self):
            super().__init__()
            self.best = -1.0
            self.next_at = cfg.eval.freq

        def _on_step(self) -> bool:
            if evaluation is not None and cfg.eval.freq > 0 and self.num_timesteps >= self.next_at:
                self.next_at += cfg.eval.freq
                self.evaluate()
            return True

        def evaluate(self) -> None:
            frac, ratio = evaluation(self.model)
            self.logger.record("eval/served_frac", frac)
            self.logger.record("eval/ratio_to_balance", ratio)
            if frac > self.best:
                self.best = frac
                self.model.save(out / "model.zip")
            self.logger.dump(self.num_timesteps)

    callbacks = [EvalAgainstBalance()]
    if cfg.checkpoint_freq > 0:
        callbacks.append(CheckpointCallback(save_freq=max(cfg.checkpoint_freq // cfg.n_envs, 1), save_path=str(out / "checkpoints"), name_prefix="model"))
    return CallbackList(callbacks), callbacks[0]


# ------------------------------------------------------------------------------------------ train
def train(raw: dict, out: str | Path) -> dict[str, Any]:
    """Train per ``raw`` (a plain dict as Hydra resolves it) into folder ``out``; returns a summary."""
    cfg = TrainConfig.from_dict(raw)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    import torch
    from stable_baselines3.common.utils import set_random_seed

    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv

    set_random_seed(cfg.seed)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), 2)))
    (out / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    meta = {"algo": cfg.agent.algo, "env": cfg.env.to_dict(), "seed": cfg.seed}
    (out / "policy.json").write_text(json.dumps(meta, indent=2))

    env = EdgeScheduleSB3VecEnv(cfg.n_envs, cfg.env.to_dict())
    env.seed(cfg.seed)
    algo = algo_class(cfg.agent.algo)
    if cfg.resume:
        model = algo.load(cfg.resume, env=env, device="cpu")
    else:
        try:
            model = algo(cfg.agent.policy, env, seed=cfg.seed, device="cpu", verbose=0, policy_kwargs={"net_arch": list(cfg.agent.net_arch)}, **cfg.agent.hyperparams)
        except TypeError as err:
            raise TrainConfigError(f"agent.hyperparams not accepted by {cfg.agent.algo}: {err}") from None
    run = _wandb_run(cfg.logger, out, raw, name=f"{cfg.agent.algo}-k{cfg.env.num_users}-s{cfg.seed}")
    _writers(model, out, cfg.logger, run)

    evaluation = HeldOutEvaluation(cfg) if cfg.eval.rounds > 0 else None
    callback, evaluator = _callback(cfg, out, evaluation)
    start = time.perf_counter()
    remaining = cfg.total_timesteps - (model.num_timesteps if cfg.resume else 0)
    # curriculum over K: equal shares of the budget on growing rounds, the configured K last
    stages = [*cfg.curriculum, cfg.env.num_users] if not cfg.resume else [cfg.env.num_users]
    for i, k in enumerate(stages):
        steps = remaining // len(stages) if i < len(stages) - 1 else remaining - (remaining // len(stages)) * (len(stages) - 1)
        if steps <= 0:
            continue
        if len(stages) > 1:
            stage_env = EdgeScheduleSB3VecEnv(cfg.n_envs, cfg.env.replace(num_users=k).to_dict())
            stage_env.seed(cfg.seed + i)
            model.set_env(stage_env)
            model.logger.record("curriculum/num_users", k)
        model.learn(total_timesteps=steps, callback=callback, progress_bar=cfg.progress_bar, reset_num_timesteps=bool(i == 0 and not cfg.resume))
    train_s = time.perf_counter() - start
    model.save(out / "last_model.zip")
    if evaluation is not None:
        evaluator.evaluate()  # the final policy competes for model.zip too
    if not (out / "model.zip").exists():
        model.save(out / "model.zip")

    summary: dict[str, Any] = {"train_s": train_s, "timesteps": int(model.num_timesteps), "steps_per_s": model.num_timesteps / max(train_s, 1e-9) if not cfg.resume else None}
    if cfg.export_onnx:
        from agents.export import export_onnx

        summary["onnx"] = str(export_onnx(out))
    if cfg.eval.final_rounds > 0:
        names = list(dict.fromkeys([*cfg.eval.final_schedulers, "policy"]))
        df = evaluate_schedulers(cfg.env, names, rounds=make_rounds(cfg.env, cfg.eval.final_rounds, cfg.eval.seed), seed=cfg.eval.seed, gamma=cfg.gamma, progress=cfg.progress_bar, policy_path=str(out))
        df.to_csv(out / "eval.csv", index=False)
        table = summarize(df)
        table.to_csv(out / "eval_summary.csv", index=False)
        (out / "eval_summary.md").write_text(format_summary(table) + "\n")
        summary["table"] = table
        if run is not None:
            import wandb

            run.log({"final/eval_summary": wandb.Table(dataframe=table)})
    if run is not None:
        run.finish()
    return summary


def _main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    @hydra.main(version_base="1.3", config_path="../conf", config_name="train")
    def app(cfg) -> None:
        raw = OmegaConf.to_container(cfg, resolve=True)
        out = raw.get("output_dir") or HydraConfig.get().runtime.output_dir
        summary = train(raw, out)
        print(f"trained {summary['timesteps']} steps in {summary['train_s']:.0f} s -> {out}")
        if "table" in summary:
            print(format_summary(summary["table"]))

    app()


if __name__ == "__main__":
    _main()
