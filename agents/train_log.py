"""Where a training run's scalars go: ``progress.csv``, TensorBoard, Weights & Biases.

``progress.csv`` is written by :class:`ProgressCSV` rather than SB3's CSV writer: every row is
kept and the whole file is rewritten atomically at each dump (a run logs a few hundred rows at
most), so a kill never leaves a truncated line, new columns (an evaluation's) are filled in for
earlier rows, and a resumed run appends to the rows it finds instead of overwriting them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from stable_baselines3.common.logger import KVWriter

from agents.artefacts import write_csv_atomic

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
        self.rows.append(row)
        write_csv_atomic(pd.DataFrame(self.rows), self.path)

    def close(self) -> None:
        pass


def wandb_run(logger_cfg: dict, out: Path, config: dict, name: str):
    """A W&B run in ``out/wandb`` (offline unless configured), or None when W&B is off."""
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


def attach_writers(model, out: Path, logger_cfg: dict, run, append: bool = False) -> None:
    """Point ``model``'s SB3 logger at stdout, ``out/progress.csv``, ``out/tb/`` and ``run``."""
    from stable_baselines3.common.logger import HumanOutputFormat, Logger, TensorBoardOutputFormat

    formats: list[KVWriter] = [HumanOutputFormat(sys.stdout), ProgressCSV(out / "progress.csv", append=append)]
    if logger_cfg.get("tensorboard"):
        formats.append(TensorBoardOutputFormat(str(out / "tb")))
    if run is not None:

        class WandbWriter(KVWriter):
            """SB3 scalars to W&B, stepped by environment timesteps (not W&B's own counter)."""

            def write(self, key_values, key_excluded, step=0):
                run.log({k: v for k, v in key_values.items() if isinstance(v, int | float | np.floating | np.integer)}, step=int(step))

            def close(self):
                pass

        formats.append(WandbWriter())
    model.set_logger(Logger(str(out), formats))
