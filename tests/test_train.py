"""Learning: config composition, a tiny end-to-end training run, the policy as a scheduler, ONNX parity."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from agents.train import TrainConfig, TrainConfigError
from envs.profile import PROFILE_DIR

ROOT = Path(__file__).resolve().parent.parent
CONF = str(ROOT / "conf")


def _compose(*overrides, name="train", hydra_cfg=False):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides), return_hydra_config=hydra_cfg)


def _groups(group):
    return sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml"))


@pytest.mark.parametrize("agent", _groups("agent"))
@pytest.mark.parametrize("logger", _groups("logger"))
def test_agent_and_logger_groups_compose(agent, logger):
    cfg = _compose(f"agent={agent}", f"logger={logger}")
    TrainConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))


@pytest.mark.parametrize("env", _groups("env"))
@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")))
def test_env_and_profile_groups_compose(env, profile):
    for name in ("train", "evaluate"):
        cfg = _compose(f"env={env}", f"profile={profile}", name=name)
        raw = OmegaConf.to_container(cfg, resolve=True)
        assert raw["env"]["profile"] == profile
        if name == "train":
            TrainConfig.from_dict(raw)


@pytest.mark.parametrize("experiment", _groups("experiment"))
def test_experiment_group_composes(experiment):
    cfg = _compose(f"experiment={experiment}")
    tc = TrainConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))
    raw = OmegaConf.load(ROOT / "conf" / "experiment" / f"{experiment}.yaml")
    # an experiment's values win over train.yaml's
    assert tc.total_timesteps == raw.total_timesteps and tc.env.num_users == raw.env.num_users


@pytest.mark.parametrize("launcher,target", [("joblib", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"), ("submitit_slurm_cpu", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher")])
def test_launchers_compose(launcher, target):
    cfg = _compose(f"hydra/launcher={launcher}", hydra_cfg=True)
    assert cfg.hydra.launcher._target_ == target


@pytest.mark.parametrize(
    "override,match",
    [
        ("total_timesteps=0", "total_timesteps"),
        ("n_envs=-1", "n_envs"),
        ("env.num_users=0", "num_users"),
        ("agent.algo=a3c", "agent.algo"),
        ("+agent.hyperparams.bogus=1", None),
    ],
)
def test_bad_values_rejected_clearly(override, match):
    cfg = OmegaConf.to_container(_compose(override), resolve=True)
    if match is None:  # unknown hyperparameters are caught when the algorithm is built
        return
    with pytest.raises(TrainConfigError, match=match):
        TrainConfig.from_dict(cfg)


def test_unknown_key_rejected_by_hydra():
    with pytest.raises(Exception, match="bogus"):
        _compose("bogus=1")


def _tiny_cmd(out, *extra):
    return [
        sys.executable, "-m", "agents.train", "agent=maskable_ppo", "env.num_users=8", "total_timesteps=1000", "n_envs=4",
        "agent.hyperparams.n_steps=64", "agent.hyperparams.batch_size=128", "agent.hyperparams.n_epochs=2",
        "logger=disabled", f"output_dir={out}", "eval.rounds=8", "eval.freq=512", "eval.final_rounds=6",
        "progress_bar=false", *extra,
    ]


def test_tiny_training_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = subprocess.run(_tiny_cmd(out), capture_output=True, text=True, cwd=tmp_path, timeout=600, env=_pythonpath())
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("model.zip", "last_model.zip", "policy.json", "policy.onnx", "config.yaml", "eval.csv", "eval_summary.md", "progress.csv"):
        assert (out / name).exists(), name
    # the run's whole Hydra record is in output_dir, nothing in ./outputs
    assert (out / ".hydra" / "config.yaml").exists() and (out / ".hydra" / "overrides.yaml").exists() and (out / "train.log").exists()
    assert not (tmp_path / "outputs").exists()
    # 1000 asked = 3.9 rollouts of 256: the real total (4 rollouts) is announced and trained
    assert "timesteps 0 -> 1,024" in res.stdout and "trained 1024 steps" in res.stdout
    # the default checkpoint frequency is 10 % of the run: about ten resumable checkpoints, no partial files
    ckpts = sorted((out / "checkpoints").glob("*.zip"), key=lambda p: int(p.stem.split("_")[1]))
    assert len(ckpts) >= 9 and not list((out / "checkpoints").glob(".*"))
    # which round streams were used, recorded beside the policy
    meta = json.loads((out / "policy.json").read_text())
    assert meta["threads"] == 1
    assert set(meta["streams"]) >= {"train", "validation", "test"} and meta["streams"]["validation"]["rounds"] == 8 and meta["streams"]["test"]["rounds"] == 6
    df = pd.read_csv(out / "eval.csv")
    assert set(df.scheduler) >= {"balance", "policy"}
    # every evaluation row carries its timestep: the learning curve has points
    from experiments.main import learning_curve

    curve = learning_curve(out / "progress.csv")
    assert len(curve) >= 2 and curve["time/total_timesteps"].is_monotonic_increasing and curve["time/total_timesteps"].max() == 1024
    rows_before = len(pd.read_csv(out / "progress.csv"))

    # the policy is a scheduler for agents.evaluate, on the same rounds as the others
    csv = tmp_path / "e.csv"
    res = subprocess.run([sys.executable, "-m", "agents.evaluate", "schedulers=[balance,policy]", f"policy_path={out}/model.zip", "env.num_users=8", "rounds=3", f"output={csv}", "progress=false", f"hydra.run.dir={tmp_path}/h2"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert set(pd.read_csv(csv).scheduler) == {"balance", "policy"}

    # resume from a checkpoint into the same folder: continues the step count, appends to progress.csv
    ckpt = next(p for p in ckpts if int(p.stem.split("_")[1]) >= 500)
    res = subprocess.run(_tiny_cmd(out, f"resume={ckpt}", "total_timesteps=1536", "export_onnx=false", "eval.final_rounds=0"), capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    start = int(ckpt.stem.split("_")[1])
    end = start + -(-(1536 - start) // 256) * 256  # whole rollouts from the checkpoint's step
    assert f"trained {end} steps" in res.stdout
    prog = pd.read_csv(out / "progress.csv")
    assert len(prog) > rows_before and prog["time/total_timesteps"].iloc[:rows_before].max() == 1024
    assert prog["time/total_timesteps"].max() == end
    assert json.loads((out / "policy.json").read_text())["streams"]["train"]["start_step"] == int(ckpt.stem.split("_")[1])


def _pythonpath():
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_output_dir_with_multirun_is_refused(tmp_path):
    cmd = [sys.executable, "-m", "agents.train", "-m", "seed=0", f"output_dir={tmp_path}/x", "total_timesteps=64", "logger=disabled", f"hydra.sweep.dir={tmp_path}/sweep"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode != 0 and "hydra.sweep.dir" in res.stderr


@pytest.mark.parametrize("field,value", [("threads", 0), ("threads", "many"), ("checkpoint_freq", -5), ("seed", 2**32), ("eval.seed", -1),
                                         ("logger.stdout", "loud")])
def test_bad_thread_checkpoint_and_seed_values_named(field, value):
    cfg = OmegaConf.to_container(_compose(), resolve=True)
    if "." in field:
        a, b = field.split(".")
        cfg[a][b] = value
    else:
        cfg[field] = value
    with pytest.raises(TrainConfigError, match=field.replace(".", r"\.")):
        TrainConfig.from_dict(cfg)


def test_limit_threads():
    import torch

    from agents.threads import limit_threads

    assert limit_threads(1) == 1 and torch.get_num_threads() == 1
    with pytest.raises(ValueError, match="threads"):
        limit_threads(0)


def test_curriculum_and_joblib_multirun(tmp_path):
    cmd = [
        sys.executable, "-m", "agents.train", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "seed=0,1",
        "env.num_users=8", "env.max_users=8", "curriculum=[4]", "total_timesteps=512", "n_envs=4", "agent.hyperparams.n_steps=32",
        "agent.hyperparams.batch_size=64", "agent.hyperparams.n_epochs=1", "logger=disabled", "eval.rounds=4", "eval.freq=0",
        "eval.final_rounds=0", "checkpoint_freq=0", "export_onnx=false", "progress_bar=false", f"hydra.sweep.dir={tmp_path}/sweep",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())
    assert len(runs) == 2 and all((r / "model.zip").exists() for r in runs)
    prog = pd.read_csv(runs[0] / "progress.csv")
    assert prog["time/total_timesteps"].max() >= 512


def _untrained_policy(tmp_path, algo="maskable_ppo"):
    from agents.policy import algo_class
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from envs import EnvConfig

    cfg = EnvConfig(num_users=6)
    env = EdgeScheduleSB3VecEnv(2, cfg.to_dict())
    kw = {"learning_starts": 0} if algo == "dqn" else {}
    model = algo_class(algo)("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": [32, 32]}, **kw)
    model.save(tmp_path / "model.zip")
    (tmp_path / "policy.json").write_text(json.dumps({"algo": algo, "env": cfg.to_dict()}))
    return model, env


@pytest.mark.parametrize("algo", ["maskable_ppo", "ppo", "dqn"])
def test_onnx_export_picks_the_same_actions(tmp_path, algo):
    from agents.export import OnnxPolicy, export_onnx

    model, env = _untrained_policy(tmp_path, algo)
    onnx_policy = OnnxPolicy(export_onnx(tmp_path))
    rng = np.random.default_rng(0)
    obs = rng.random((256, env.observation_space.shape[0])).astype(np.float32)
    masks = rng.random((256, env.action_space.n)) < 0.5
    masks[:, 0] = True
    got = onnx_policy.act(obs, masks)
    if algo == "maskable_ppo":
        want, _ = model.predict(obs, action_masks=masks, deterministic=True)
    else:  # unmasked algorithms: the export applies the mask, SB3 does not; compare on full masks
        full = np.ones_like(masks)
        got = onnx_policy.act(obs, full)
        want, _ = model.predict(obs, deterministic=True)
    assert np.array_equal(got, want)


def test_wandb_offline_writes_run_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    from agents.train_log import wandb_run

    run = wandb_run({"wandb": {"mode": "offline", "project": "specsched-test"}}, tmp_path, {"a": 1}, "t")
    run.log({"x": 1.0}, step=1)
    run.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_speed_bench_hogs_are_stopped():
    """The busy-machine benchmark's CPU hogs end with their block (and would end by themselves)."""
    import os

    from experiments.bench.train_speed import cpu_hogs

    for own_session in (True, False):
        with cpu_hogs(2, limit_s=30, own_session=own_session) as procs:
            assert all(p.poll() is None for p in procs)
            assert all((os.getsid(p.pid) != os.getsid(0)) == own_session for p in procs)
        assert all(p.poll() is not None for p in procs)


@pytest.mark.parametrize("algo,kw,want", [("maskable_ppo", {"n_steps": 32, "batch_size": 64}, 32 * 3), ("ppo", {"n_steps": 16, "batch_size": 48}, 16 * 3), ("dqn", {"train_freq": 4}, 4 * 3), ("dqn", {"train_freq": (1, "episode")}, 3)])
def test_rollout_timesteps_is_what_learn_adds(algo, kw, want):
    """The progress bar's real total: learn() stops only after whole collections (DQN's n_steps is not one)."""
    from agents.policy import algo_class
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
    from agents.train import rollout_timesteps
    from envs import EnvConfig

    env = EdgeScheduleSB3VecEnv(3, EnvConfig(num_users=4).to_dict())
    model = algo_class(algo)("MlpPolicy", env, seed=0, device="cpu", policy_kwargs={"net_arch": [8]}, **kw)
    assert rollout_timesteps(model, 3) == want


def test_progress_line_writes_one_line_per_dump():
    """logger.stdout=line: one line per SB3 dump (timesteps, steps/s, reward, validation), not SB3's table."""
    import io

    from agents.train_log import ProgressLine

    buf = io.StringIO()
    line = ProgressLine(buf)
    line.write({"time/total_timesteps": 12288, "time/fps": 2150.4, "rollout/ep_rew_mean": 10.25, "train/loss": 0.1}, {}, 12288)
    line.write({"time/total_timesteps": 24576, "eval/served_frac": 0.8712, "eval/ratio_to_balance": 1.0033}, {}, 24576)
    assert buf.getvalue().splitlines() == ["[train] step 12,288, steps/s 2,150, reward 10.2",
                                           "[train] step 24,576, val served 0.8712, val / BALANCE 1.0033"]
