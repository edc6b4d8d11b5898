"""Where a training run's scalars go: ``progress.csv``, TensorBoard, Weights & Biases.

``progress.csv`` is written by :class:`ProgressCSV` rather than SB3's CSV writer: every row is
kept and the whole file is rewritten atomically at each dump (a run logs a few hundred rows at
most), so a kill never leaves a truncated line, new columns (an evaluation's) are filled in for
earlier rows, and a resumed run appends to the rows it finds instead of overwriting them.

Weights & Biases (``logger.wandb``; offline unless configured, never started when ``disabled``):
runs of one sweep share ``group`` (``agents.train`` sets it to the sweep folder under ``-m`` when
the config leaves it null), every run carries ``job_type``, and :func:`log_policy_artifact` logs
the best policy folder (``model.zip`` chosen on the validation rounds, ``policy.json``,
``policy.onnx``) as a ``model`` artifact. A run requeued into the same folder (Slurm preemption)
continues the same W&B run: its id is kept in ``wandb_run_id.txt``.
TensorBoard gets the hyperparameters (HParams plugin) beside the scalars: :func:`hparams_of`.
"""

from __future__ import annotations

import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.logger import KVWriter

from agents.artefacts import write_csv_atomic, write_text_atomic

WANDB_MODES = ("offline", "online", "disabled")


class ProgressCSV(KVWriter):
    """SB3 scalars as rows of ``path``; ``append=True`` keeps the rows already there (resume)."""

    def __init__(self, path: str | Path, append: bool = False):
        self.path = Path(path)
        self.rows: list[dict[str, Any]] = []
        if append and self.path.is_file() and self.path.stat().st_size > 0:
            self.rows = pd.read_csv(self.path).to_dict("records")

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        row = {}
        for key, value in key_values.items():
            excluded = key_excluded.get(key) or ()
            if "csv" in excluded or not isinstance(value, int | float | str | np.integer | np.floating):
                continue
            row[key] = value
        if not row:  # e.g. a dump that only held the TensorBoard hyperparameters
            return
        self.rows.append(row)
        write_csv_atomic(pd.DataFrame(self.rows), self.path)

    def close(self) -> None:
        pass


#: ``logger.stdout``: SB3's table of every scalar at each dump, one line of progress, or nothing
STDOUT_MODES = ("table", "line", "off")


class ProgressLine(KVWriter):
    """One line per SB3 dump on ``stream``: timesteps, steps/s and the latest reward and validation
    score -- the progress of a long run without SB3's table of every scalar (``logger.stdout=line``)."""

    FIELDS = (("time/fps", "steps/s {:,.0f}"), ("rollout/ep_rew_mean", "reward {:.3g}"), ("eval/served_frac", "val served {:.4f}"),
              ("eval/ratio_to_balance", "val / BALANCE {:.4f}"))

    def __init__(self, stream):
        self.stream = stream

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]], step: int = 0) -> None:
        parts = [f"[train] step {int(key_values.get('time/total_timesteps', step)):,}"]
        parts += [fmt.format(float(key_values[key])) for key, fmt in self.FIELDS if isinstance(key_values.get(key), int | float | np.integer | np.floating)]
        self.stream.write(", ".join(parts) + "\n")
        self.stream.flush()

    def close(self) -> None:
        pass


def wandb_run(logger_cfg: dict, out: Path, config: dict, name: str) -> Any | None:
    """A W&B run in ``out/wandb`` (offline unless configured), or None when W&B is off.

    ``group`` and ``job_type`` come from ``logger.wandb``; a second call on the same ``out``
    (a requeued or resumed job) resumes the run whose id ``out/wandb_run_id.txt`` holds.
    """
    wb = logger_cfg.get("wandb")
    if wb is None:
        return None
    mode = os.environ.get("WANDB_MODE") or wb.get("mode", "offline")  # the variable wins
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    id_file = out / "wandb_run_id.txt"
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
    if not id_file.is_file():  # before init: a job killed during init still comes back as this run
        write_text_atomic(id_file, run_id + "\n")
    run = wandb.init(project=wb.get("project", "specsched"), entity=wb.get("entity"), tags=list(wb.get("tags") or []), name=name, mode=mode, dir=str(out),
                     config=config, group=wb.get("group"), job_type=wb.get("job_type") or "train", id=run_id, resume="allow")
    return run


def log_policy_artifact(run: Any, folder: Path, metadata: dict[str, Any], aliases: tuple[str, ...] = ("best",)) -> str:
    """Log the policy folder's ``model.zip``, ``policy.json`` and ``policy.onnx`` as a W&B ``model`` artifact; returns its name."""
    import wandb

    name = "policy-" + re.sub(r"[^A-Za-z0-9_.-]", "-", run.id)
    art = wandb.Artifact(name, type="model", metadata=metadata, description="the policy chosen on the validation rounds (agents.train)")
    for file in ("model.zip", "policy.json", "policy.onnx"):
        if (folder / file).is_file():
            art.add_file(str(folder / file), name=file)
    run.log_artifact(art, aliases=list(aliases))
    return name


def hparams_of(cfg: Any) -> dict[str, int | float | str | bool]:
    """The hyperparameters of a :class:`agents.train_config.TrainConfig`, flat, as TensorBoard's HParams plugin takes them."""
    hp: dict[str, Any] = {"algo": cfg.agent.algo, "policy": cfg.agent.policy, "net_arch": str(list(cfg.agent.net_arch)), "seed": cfg.seed,
                          "n_envs": cfg.n_envs, "total_timesteps": cfg.total_timesteps, "curriculum": str(list(cfg.curriculum)),
                          "env/num_users": cfg.env.num_users, "env/max_users": cfg.env.k_max, "env/user_order": cfg.env.user_order,
                          "env/profile": str(cfg.env.profile)}
    for key, value in cfg.agent.hyperparams.items():
        hp[f"agent/{key}"] = value if isinstance(value, bool | int | float | str) else str(value)
    extra = getattr(cfg.agent, "features", None)
    if extra:
        for key, value in extra.items():
            hp[f"features/{key}"] = value if isinstance(value, bool | int | float | str) else str(value)
    return hp


def attach_writers(model: BaseAlgorithm, out: Path, logger_cfg: dict, run: Any | None, append: bool = False, hparams: dict[str, Any] | None = None, step: int = 0) -> None:
    """Point ``model``'s SB3 logger at ``out/progress.csv``, stdout (``logger.stdout``: ``table``,
    ``line`` or ``off``), ``out/tb/`` and ``run``.

    ``hparams`` go to TensorBoard's HParams plugin (at ``step``), with the validation metrics as its metrics.
    """
    from stable_baselines3.common.logger import (
        HParam,
        HumanOutputFormat,
        Logger,
        TensorBoardOutputFormat,
    )

    shown = logger_cfg.get("stdout", "table")
    formats: list[KVWriter] = [ProgressCSV(out / "progress.csv", append=append)]
    if shown == "table":
        formats.append(HumanOutputFormat(sys.stdout))
    elif shown == "line":
        formats.append(ProgressLine(sys.stdout))
    if logger_cfg.get("tensorboard"):
        tb = TensorBoardOutputFormat(str(out / "tb"))
        formats.append(tb)
        if hparams:
            metrics = {"eval/served_frac": 0.0, "eval/ratio_to_balance": 0.0}  # filled in by the scalars of the same name
            tb.write({"hparams": HParam(hparams, metrics)}, {"hparams": ()}, step)
    if run is not None:

        class WandbWriter(KVWriter):
            """SB3 scalars to W&B, stepped by environment timesteps (not W&B's own counter)."""

            def write(self, key_values, key_excluded, step=0):
                run.log({k: v for k, v in key_values.items() if isinstance(v, int | float | np.floating | np.integer)}, step=int(step))

            def close(self):
                pass

        formats.append(WandbWriter())
    model.set_logger(Logger(str(out), formats))
