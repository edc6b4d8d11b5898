"""The search's configuration (``conf/tune/search.yaml`` + overrides, checked before any trial
runs), its space of hyperparameters, and the training config a trial runs: ``agents.tune``'s
module docstring documents the space and the choices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
SEARCH_YAML = CONF / "tune" / "search.yaml"
#: agent.hyperparams keys the space may name (MaskablePPO's constructor); net_width is agent.net_arch
HYPERPARAMS = ("learning_rate", "n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "ent_coef", "clip_range", "vf_coef", "max_grad_norm")
SPACE_TYPES = ("float", "int", "categorical")
KEYS = ("study_name", "trials", "fresh", "sampler_seed", "startup_trials", "enqueue_default", "pruner", "work_dir", "output", "experiment_name", "experiment_dir", "setting", "train_seed", "trial_overrides", "space")


class TuneConfigError(ValueError):
    """A search config value is out of range; the message names the key and the allowed values."""


def load_search_config(overrides: list[str] | None = None, path: Path = SEARCH_YAML) -> dict[str, Any]:
    """``conf/tune/search.yaml`` with ``key=value`` overrides (OmegaConf dotlist), checked."""
    base = OmegaConf.load(path)
    try:
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides or [])))
    except Exception as err:  # OmegaConf's own errors: name the override that failed
        raise TuneConfigError(f"bad override in {overrides}: {err}") from None
    cfg = OmegaConf.to_container(merged, resolve=True)
    check_search_config(cfg)
    return cfg


def check_search_config(cfg: dict[str, Any]) -> None:
    """Raise :class:`TuneConfigError` naming the first key out of range (before any trial starts)."""
    def need(name: str, ok: bool, allowed: str, got: Any) -> None:
        if not ok:
            raise TuneConfigError(f"tune config '{name}' must be {allowed}, got {got!r}")

    unknown = sorted(set(cfg) - set(KEYS))
    if unknown:
        raise TuneConfigError(f"unknown tune config key(s) {unknown}; known: {list(KEYS)}")
    need("trials", isinstance(cfg["trials"], int) and cfg["trials"] >= 1, "an integer >= 1", cfg["trials"])
    need("startup_trials", isinstance(cfg["startup_trials"], int) and cfg["startup_trials"] >= 0, "an integer >= 0", cfg["startup_trials"])
    need("sampler_seed", isinstance(cfg["sampler_seed"], int) and cfg["sampler_seed"] >= 0, "an integer >= 0", cfg["sampler_seed"])
    for key in ("n_startup_trials", "n_warmup_steps", "interval_steps"):
        v = cfg["pruner"].get(key)
        need(f"pruner.{key}", isinstance(v, int) and v >= (1 if key == "interval_steps" else 0), "an integer >= 0 (interval_steps >= 1)", v)
    space = cfg["space"]
    need("space", isinstance(space, dict) and len(space) > 0, "a non-empty mapping of parameter -> distribution", space)
    for name, d in space.items():
        need(f"space.{name}", name in HYPERPARAMS or name == "net_width", f"one of {[*HYPERPARAMS, 'net_width']}", name)
        need(f"space.{name}.type", d.get("type") in SPACE_TYPES, f"one of {list(SPACE_TYPES)}", d.get("type"))
        if d["type"] == "categorical":
            need(f"space.{name}.choices", isinstance(d.get("choices"), list) and len(d["choices"]) > 0, "a non-empty list", d.get("choices"))
        else:
            lo, hi = d.get("low"), d.get("high")
            need(f"space.{name}.low/high", isinstance(lo, int | float) and isinstance(hi, int | float) and lo < hi and (lo > 0 or not d.get("log")), "numbers with low < high (low > 0 when log: true)", (lo, hi))
    n_envs = cfg["setting"].get("n_envs", 16)
    steps, batches = space_values(space.get("n_steps")), space_values(space.get("batch_size"))
    if steps and batches:
        need("space.batch_size", max(batches) <= min(steps) * n_envs, f"<= the smallest rollout min(n_steps) * n_envs = {min(steps) * n_envs}", max(batches))


def space_values(dist: dict | None) -> list[float]:
    if dist is None:
        return []
    return list(dist["choices"]) if dist["type"] == "categorical" else [dist["low"], dist["high"]]


def compose_train(overrides: list[str]) -> dict[str, Any]:
    """conf/train.yaml composed with Hydra ``overrides`` (as ``python -m agents.train`` would), a plain dict."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="train", overrides=overrides), resolve=True)


def merge_nested(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in, nested mappings merged key by key (``extra`` wins)."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge_nested(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def train_config(cfg: dict[str, Any], seed: int, experiment: str | None = None) -> dict[str, Any]:
    """What a trial trains (``experiment=None``: the default hyperparameters on ``setting``), or, with
    ``experiment``, ``python -m agents.train experiment=NAME`` with the same run-only overrides
    (a path to a ``.yaml`` instead of a name: that file merged at the top, as Hydra merges an
    ``@package _global_`` experiment)."""
    if experiment is None:
        return merge_nested(compose_train(list(cfg["trial_overrides"])), {**cfg["setting"], "seed": seed})
    if experiment.endswith(".yaml"):
        body = yaml.safe_load(Path(experiment).read_text())
        return {**merge_nested(compose_train(list(cfg["trial_overrides"])), body), "seed": seed}
    return {**compose_train([*cfg["trial_overrides"], f"experiment={experiment}"]), "seed": seed}


def apply_params(raw: dict, params: dict[str, Any]) -> dict:
    """The training config ``raw`` with one trial's parameters: net_width -> net_arch, the rest -> hyperparams."""
    hyper = {k: v for k, v in params.items() if k != "net_width"}
    agent = {"hyperparams": hyper}
    if "net_width" in params:
        agent["net_arch"] = [int(params["net_width"])] * 2
    return merge_nested(raw, {"agent": agent})


def default_params(space: dict[str, Any]) -> dict[str, Any]:
    """conf/agent/maskable_ppo.yaml's values of the searched parameters (trial 0's)."""
    agent = yaml.safe_load((CONF / "agent" / "maskable_ppo.yaml").read_text())
    known = {**agent["hyperparams"], "net_width": agent["net_arch"][0]}
    return {k: known[k] for k in space}


def in_space(params: dict[str, Any], space: dict[str, Any]) -> bool:
    """Whether every value of ``params`` lies in its distribution of ``space``."""
    for name, v in params.items():
        d = space[name]
        if d["type"] == "categorical":
            if v not in d["choices"]:
                return False
        elif not d["low"] <= v <= d["high"] or (d["type"] == "int" and int(v) != v):
            return False
    return True


def suggest(trial: optuna.Trial, space: dict[str, Any]) -> dict[str, Any]:
    """One trial's parameters drawn from ``space`` by optuna's sampler."""
    out = {}
    for name, d in space.items():
        if d["type"] == "categorical":
            out[name] = trial.suggest_categorical(name, d["choices"])
        elif d["type"] == "int":
            out[name] = trial.suggest_int(name, int(d["low"]), int(d["high"]), log=bool(d.get("log", False)))
        else:
            out[name] = trial.suggest_float(name, float(d["low"]), float(d["high"]), log=bool(d.get("log", False)))
    return out
