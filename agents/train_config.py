"""The training config of ``python -m agents.train``: typed, validated, with messages that name the key.

:class:`TrainConfig` is built from the plain dict Hydra resolves (``conf/train.yaml`` and its
groups); every value is checked before anything is built or trained, and a bad one raises
:class:`TrainConfigError` naming the key and what it may be. Kept apart from the training loop
(:mod:`agents.train`) so that tools which only read or check a config (the tuner, tests, the
experiments) do not reach into the loop's module for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.train_log import STDOUT_MODES, WANDB_MODES
from envs.config import ConfigError, EnvConfig, is_number, refuse_renamed_keys, resolve_draft_depth

#: environments ``env.id`` may name: v0 (reject/AD/SD) and v1 (adds the SpecEdge split ED@g; agents/sb3_vec_env_v1.py)
ENV_IDS = ("EdgeSchedule-v0", "EdgeSchedule-v1")


class TrainConfigError(ValueError):
    """A training config value is out of range; the message names the key and the allowed values."""


@dataclass
class AgentConfig:
    algo: str
    policy: str = "MlpPolicy"
    net_arch: list = field(default_factory=lambda: [256, 256])
    hyperparams: dict = field(default_factory=dict)
    features: dict = field(default_factory=dict)  #: agents.set_policy.SetPolicyConfig: {extractor: set, ...} for the permutation-aware set policy


@dataclass
class EvalConfig:
    rounds: int = 100
    freq: int = 20000
    seed: int = 1000003  #: seed of the validation stream (model.zip) and of the test stream (eval.csv): disjoint by construction
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
    checkpoint_freq: int | None = None  #: timesteps between checkpoints; None = every 10 % of total_timesteps; 0 = none
    progress_bar: bool = True
    export_onnx: bool = True
    draft_depth: int | None = None  #: SD draft depth of the fixed-depth baselines; None = DEFAULT_DRAFT_DEPTH (resolved by _check)
    threads: int = 1  #: torch / BLAS threads (agents/threads.py: more threads is slower on a shared machine)
    curriculum: list = field(default_factory=list)  #: K of earlier stages, e.g. [12, 30]; the last stage is env.num_users
    env_id: str = "EdgeSchedule-v0"  #: ``env.id`` in the config: the environment trained on (ENV_IDS)

    @classmethod
    def from_dict(cls, cfg: dict) -> TrainConfig:
        cfg = dict(cfg)
        cfg.pop("profile", None)  # the app-level profile name; env.profile carries it (interpolated)
        cfg.pop("output_dir", None)
        try:
            refuse_renamed_keys(cfg, "train")
        except ConfigError as err:
            raise TrainConfigError(str(err)) from None
        top = {"env", "agent", "eval", "logger", "seed", "total_timesteps", "n_envs", "resume", "checkpoint_freq", "progress_bar", "export_onnx", "draft_depth", "threads", "curriculum"}
        unknown = sorted(set(cfg) - top)
        if unknown:
            raise TrainConfigError(f"unknown train config key(s) {unknown}; known: {sorted(top)}")
        env_raw = dict(cfg.get("env", {}))
        env_id = env_raw.pop("id", "EdgeSchedule-v0")  # not an EnvConfig field: which environment the config is for
        if env_id not in ENV_IDS:
            raise TrainConfigError(f"env.id must be one of {list(ENV_IDS)}, got {env_id!r}")
        try:
            env = EnvConfig.from_kwargs(**env_raw)
        except ValueError as err:
            raise TrainConfigError(str(err)) from None
        agent = _dataclass(AgentConfig, cfg.get("agent", {}), "agent")
        if agent.algo not in ("maskable_ppo", "ppo", "dqn"):
            raise TrainConfigError(f"agent.algo must be one of ['dqn', 'maskable_ppo', 'ppo'], got {agent.algo!r}")
        if not all(isinstance(n, int) and n > 0 for n in agent.net_arch):
            raise TrainConfigError(f"agent.net_arch must be a list of positive layer widths, got {agent.net_arch!r}")
        from agents.set_policy import SetPolicyConfig

        try:
            SetPolicyConfig.from_dict(agent.features)
        except ValueError as err:
            raise TrainConfigError(str(err)) from None
        ev = _dataclass(EvalConfig, cfg.get("eval", {}), "eval")
        rest = {k: cfg[k] for k in top - {"env", "agent", "eval"} if k in cfg}
        out = cls(env=env, agent=agent, eval=ev, env_id=env_id, **{"logger": {}, **rest})
        out._check()
        return out

    def _check(self) -> None:
        def need(name: str, ok: bool, allowed: str, got: Any) -> None:
            if not ok:
                raise TrainConfigError(f"train config '{name}' must be {allowed}, got {got!r}")

        need("seed", isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0, "an integer >= 0", self.seed)
        need("total_timesteps", isinstance(self.total_timesteps, int) and self.total_timesteps >= 1, "an integer >= 1", self.total_timesteps)
        need("n_envs", isinstance(self.n_envs, int) and 1 <= self.n_envs <= 4096, "an integer in [1, 4096]", self.n_envs)
        need("checkpoint_freq", self.checkpoint_freq is None or (isinstance(self.checkpoint_freq, int) and self.checkpoint_freq >= 0), "null (every 10 % of the run) or an integer >= 0 (0 = none)", self.checkpoint_freq)
        need("threads", isinstance(self.threads, int) and not isinstance(self.threads, bool) and 1 <= self.threads <= 1024, "an integer in [1, 1024]", self.threads)
        need("seed", self.seed < 2**32, "an integer in [0, 2**32)", self.seed)
        need("eval.seed", isinstance(self.eval.seed, int) and 0 <= self.eval.seed < 2**32, "an integer in [0, 2**32)", self.eval.seed)
        try:
            self.draft_depth = resolve_draft_depth(self.draft_depth, self.env.max_gamma, "train")
        except ConfigError as err:
            raise TrainConfigError(str(err)) from None
        need("eval.rounds", isinstance(self.eval.rounds, int) and self.eval.rounds >= 1, "an integer >= 1", self.eval.rounds)
        need("eval.freq", isinstance(self.eval.freq, int) and self.eval.freq >= 0, "an integer >= 0 (0 = only at the end)", self.eval.freq)
        need("eval.final_rounds", isinstance(self.eval.final_rounds, int) and self.eval.final_rounds >= 0, "an integer >= 0", self.eval.final_rounds)
        # the final comparison's schedulers are known before training starts, not after it
        from agents.registry import SCHEDULERS

        finals = self.eval.final_schedulers
        need("eval.final_schedulers", isinstance(finals, list) and all(isinstance(n, str) and n in SCHEDULERS for n in finals),
             f"a list of scheduler names from {sorted(SCHEDULERS)}", finals)
        hp = self.agent.hyperparams or {}
        for name, ok, allowed in HYPERPARAM_RANGES:
            if name in hp:
                need(f"agent.hyperparams.{name}", ok(hp[name]), allowed, hp[name])
        need("curriculum", isinstance(self.curriculum, list) and all(isinstance(k, int) and 1 <= k <= self.env.num_users for k in self.curriculum), f"a list of round sizes in [1, env.num_users={self.env.num_users}]", self.curriculum)
        if self.curriculum and self.env.max_users is None:
            raise TrainConfigError("curriculum needs env.max_users set (a fixed look-ahead keeps the observation size the same across stages)")
        if self.resume is not None and self.resume != "auto":
            need("resume", Path(self.resume).is_file(), "null, 'auto' (the latest checkpoint in the run folder, if any) or an existing checkpoint .zip", self.resume)
        need("logger.stdout", (self.logger or {}).get("stdout", "table") in STDOUT_MODES, f"one of {list(STDOUT_MODES)}", (self.logger or {}).get("stdout"))
        wb = (self.logger or {}).get("wandb")
        if wb is not None:
            need("logger.wandb.mode", wb.get("mode") in WANDB_MODES, f"one of {list(WANDB_MODES)}", wb.get("mode"))


def _real(v: Any) -> bool:
    return is_number(v) and math.isfinite(v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


#: the SB3 hyperparameters a config may set, with their ranges (SB3 itself refuses some of them only
#: mid-training, and accepts a discount of 2): name, check, allowed
HYPERPARAM_RANGES = (
    ("learning_rate", lambda v: _real(v) and v > 0, "a finite number > 0"),
    ("gamma", lambda v: _real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    ("gae_lambda", lambda v: _real(v) and 0 <= v <= 1, "a number in [0, 1]"),
    ("clip_range", lambda v: _real(v) and v > 0, "a finite number > 0"),
    ("ent_coef", lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    ("vf_coef", lambda v: _real(v) and v >= 0, "a finite number >= 0"),
    ("max_grad_norm", lambda v: _real(v) and v > 0, "a finite number > 0"),
    ("n_steps", _count, "an integer >= 1"),
    ("batch_size", _count, "an integer >= 1"),
    ("n_epochs", _count, "an integer >= 1"),
    ("buffer_size", _count, "an integer >= 1"),
    ("learning_starts", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer >= 0"),
    ("exploration_fraction", lambda v: _real(v) and 0 <= v <= 1, "a number in [0, 1]"),
)


def _dataclass(cls, values: dict, where: str):
    known = set(cls.__dataclass_fields__)
    unknown = sorted(set(values or {}) - known)
    if unknown:
        raise TrainConfigError(f"unknown {where} config key(s) {unknown}; known: {sorted(known)}")
    return cls(**(values or {}))
