"""agents.train in the ecosystem: W&B groups / job types / model artifacts, TensorBoard hparams,
the Slurm launcher's resources, and resuming a killed (preempted) run from its latest checkpoint."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from agents.train import latest_checkpoint, stage_plan

ROOT = Path(__file__).resolve().parent.parent


def _tiny(*extra, multirun=False):
    return [
        sys.executable, "-m", "agents.train", *(["-m"] if multirun else []), "agent=maskable_ppo", "env.num_users=8", "n_envs=4", "agent.hyperparams.n_steps=64",
        "agent.hyperparams.batch_size=128", "agent.hyperparams.n_epochs=1", "eval.rounds=4", "eval.final_rounds=0", "progress_bar=false",
        "export_onnx=false", *extra,
    ]


# ------------------------------------------------------------------------------------ stage plan
def test_stage_plan_fresh_and_resumed():
    # fresh: equal shares, the last takes the remainder, each rounded up to whole collections
    assert stage_plan([8], 1000, 0, 256) == [(0, 8, 1024)]
    assert stage_plan([4, 8, 12], 3000, 0, 100) == [(0, 4, 1000), (1, 8, 1000), (2, 12, 1000)]
    assert stage_plan([4, 8], 1001, 0, 1) == [(0, 4, 500), (1, 8, 501)]
    # resumed inside stage 1: finish it, then the later stages
    assert stage_plan([4, 8, 12], 3000, 1500, 100) == [(1, 8, 500), (2, 12, 1000)]
    assert stage_plan([4, 8, 12], 3000, 1450, 100) == [(1, 8, 600), (2, 12, 1000)]
    # resumed exactly at a stage boundary, and past the end (nothing left to train)
    assert stage_plan([4, 8], 2000, 1000, 100) == [(1, 8, 1000)]
    assert stage_plan([4, 8], 2000, 2400, 100) == [(1, 8, 0)]


def test_latest_checkpoint(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    ck = tmp_path / "checkpoints"
    ck.mkdir()
    for name in ("model_512_steps.zip", "model_1024_steps.zip", "model_96_steps.zip", ".model_2048_steps.zip.tmp", "model_x_steps.zip", "notes.txt"):
        (ck / name).write_bytes(b"")
    assert latest_checkpoint(tmp_path) == ck / "model_1024_steps.zip"


# ------------------------------------------------------------------------------------------ Slurm
def test_slurm_launcher_asks_for_the_jobs_cpus_and_the_configured_partition(monkeypatch):
    monkeypatch.delenv("SPECSCHED_SLURM_PARTITION", raising=False)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=submitit_slurm_cpu", "threads=3"], return_hydra_config=True)
        launcher = instantiate(cfg.hydra.launcher)
        assert launcher.params["cpus_per_task"] == 3 and launcher.params["partition"] is None
        assert launcher.params["max_num_timeout"] >= 1  # timeouts are requeued, not lost
        monkeypatch.setenv("SPECSCHED_SLURM_PARTITION", "cpu-long")
        cfg = compose("train", overrides=["hydra/launcher=submitit_slurm_cpu"], return_hydra_config=True)
        assert instantiate(cfg.hydra.launcher).params["partition"] == "cpu-long"
        cfg = compose("train", overrides=["hydra/launcher=submitit_slurm_cpu", "hydra.launcher.partition=gpu"], return_hydra_config=True)
        assert instantiate(cfg.hydra.launcher).params["partition"] == "gpu"


def test_killed_run_resumes_from_its_latest_checkpoint(tmp_path):
    """A job killed mid-run (as Slurm kills a preempted one) and started again in the same folder
    with resume=auto continues from the latest checkpoint: the step count goes on, progress.csv keeps its rows."""
    out = tmp_path / "run"
    first = subprocess.Popen(_tiny("total_timesteps=50000", "checkpoint_freq=256", "eval.freq=0", "logger=disabled", f"output_dir={out}", "resume=auto"),
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        # a checkpoint after the first logged collection (256 steps), so progress.csv has rows to keep
        while latest_checkpoint(out) is None or int(latest_checkpoint(out).stem.split("_")[1]) < 512 or not (out / "progress.csv").is_file():
            assert first.poll() is None, first.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    assert "no checkpoint" in first.stdout.read()
    ckpt = latest_checkpoint(out)
    start = int(ckpt.stem.split("_")[1])
    rows_before = len(pd.read_csv(out / "progress.csv"))
    total = start + 512
    res = subprocess.run(_tiny(f"total_timesteps={total}", "checkpoint_freq=256", "eval.freq=0", "logger=disabled", f"output_dir={out}", "resume=auto"),
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming from {ckpt}" in res.stdout and f"timesteps {start:,} -> {total:,}" in res.stdout
    prog = pd.read_csv(out / "progress.csv")
    assert len(prog) > rows_before and prog["time/total_timesteps"].max() == total
    assert (out / "model.zip").is_file() and latest_checkpoint(out) == out / "checkpoints" / f"model_{total}_steps.zip"


@pytest.mark.slow
def test_submitit_launcher_jobs_resume_by_default(tmp_path):
    """Under the submitit launcher (local executor here, Slurm on a cluster) a job started again
    with the same overrides -- what a requeue does -- lands in the same folder and resumes."""
    pytest.importorskip("submitit")
    sweep = tmp_path / "sweep"
    cmd = [*_tiny("total_timesteps=512", "checkpoint_freq=256", "eval.freq=0", "logger=disabled", "seed=0", multirun=True), "hydra/launcher=submitit_local",
           f"hydra.sweep.dir={sweep}", "hydra.launcher.timeout_min=10"]
    for expect in ("no checkpoint", "resuming from"):
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        logs = "".join(p.read_text() for p in sweep.glob(".submitit/*/*_log.out"))
        assert expect in logs, logs[-3000:]
    runs = [p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1 and (runs[0] / "model.zip").is_file()


# --------------------------------------------------------------------------- W&B and TensorBoard
def test_sweep_runs_share_a_wandb_group_and_log_the_best_model(tmp_path):
    sweep = tmp_path / "sweep"
    env = {**os.environ, "WANDB_MODE": "offline"}  # tests default to disabled (conftest); never online
    cmd = [*_tiny("total_timesteps=256", "checkpoint_freq=0", "eval.freq=0", "logger=wandb", "logger.wandb.job_type=tune", multirun=True), "seed=0,1",
           f"hydra.sweep.dir={sweep}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(runs) == 2
    ids = set()
    for run in runs:
        rid = (run / "wandb_run_id.txt").read_text().strip()
        ids.add(rid)
        [record] = run.glob(f"wandb/offline-run-*/run-{rid}.wandb")
        data = record.read_bytes()  # the offline run's records (protobuf); the strings are stored as is
        assert str(sweep).encode() in data, "the sweep folder is the run's group"
        assert b"tune" in data and f"policy-{rid}".encode() in data and b"model.zip" in data and b"policy.json" in data
        # TensorBoard: the hyperparameters beside the scalars
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.plugins.hparams import plugin_data_pb2

        acc = EventAccumulator(str(run / "tb"))
        acc.Reload()
        start = plugin_data_pb2.HParamsPluginData.FromString(acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]).session_start_info
        assert {"algo", "seed", "env/num_users", "agent/learning_rate", "agent/n_steps"} <= set(start.hparams)
        assert start.hparams["env/num_users"].number_value == 8 and start.hparams["algo"].string_value == "maskable_ppo"
        assert "eval/served_frac" in acc.Tags()["scalars"]
        # the hparams dump adds no empty row to progress.csv
        assert not pd.read_csv(run / "progress.csv").isna().all(axis=1).any()
    assert len(ids) == 2
