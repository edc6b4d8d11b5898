"""A learned scheduler on EdgeSchedule-v1: tiny training end to end, the policy as a v1 scheduler, ONNX parity."""

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

ROOT = Path(__file__).resolve().parent.parent
K = 6


def _raw(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name="train", overrides=["experiment=split_k20", *overrides]), resolve=True)


def test_experiment_selects_v1_and_split_profile():
    cfg = TrainConfig.from_dict(_raw())
    assert cfg.env_id == "EdgeSchedule-v1" and cfg.env.edge_fraction == 0.5 and cfg.env.profile.startswith("split_")
    assert TrainConfig.from_dict(_raw("experiment=quick")).env_id == "EdgeSchedule-v0"  # v0 stays the default


def test_bad_env_id_named():
    with pytest.raises(TrainConfigError, match="env.id"):
        TrainConfig.from_dict(_raw("env.id=EdgeSchedule-v9"))


def test_sb3_adapter_plays_v1_rounds_with_same_step_reset():
    from agents.sb3_vec_env_v1 import EdgeScheduleV1SB3VecEnv

    cfg = TrainConfig.from_dict(_raw(f"env.num_users={K}")).env
    env = EdgeScheduleV1SB3VecEnv(3, cfg.to_dict())
    env.seed(7)
    obs = env.reset()
    assert obs.shape == (3, env.observation_space.shape[0])
    rng = np.random.default_rng(0)
    ended = 0
    for t in range(2 * K):
        masks = env.action_masks()
        acts = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        obs, rew, dones, infos = env.step(acts)
        assert not any(i["invalid_action"] for i in infos)  # masked actions are always valid
        assert dones.all() == ((t + 1) % K == 0) and (dones.all() or not dones.any())
        if dones.all():
            ended += 1
            # admission rewards minus late users = served, as v0's adapter reports it
            assert all(i["episode"]["r"] == i["served"] and i["episode"]["l"] == K for i in infos)
            assert all("terminal_observation" in i for i in infos)
            assert env.action_masks()[:, 0].all() and env.action_masks()[:, 1:].any()  # a fresh round, not the ended one
    assert ended == 2


def test_tiny_v1_training_and_policy_as_scheduler(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agents.train", "experiment=split_k20", f"env.num_users={K}", "total_timesteps=256", "n_envs=4",
           "agent.hyperparams.n_steps=32", "agent.hyperparams.batch_size=64", "agent.hyperparams.n_epochs=1", "eval.rounds=3", "eval.freq=128",
           "eval.final_rounds=3", "logger=disabled", "progress_bar=false", f"output_dir={out}"]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    meta = json.loads((out / "policy.json").read_text())
    assert meta["env_id"] == "EdgeSchedule-v1"
    df = pd.read_csv(out / "eval.csv")
    assert set(df.scheduler) == {"balance", "balance_ed", "edge_first", "policy"} and "admitted_ed" in df
    assert pd.read_csv(out / "progress.csv")["eval/ratio_to_balance"].notna().any()  # validated against BALANCE-ED

    # the v1 policy as a scheduler: feasible plans (split exact check inside), ED users carry their depth
    from agents.evaluate_v1 import evaluate_schedulers_v1
    from agents.policy import PolicyScheduler
    from agents.policy_v1 import PolicyV1Scheduler
    from envs.config import EnvConfig
    from envs.cost_model import CostModel
    from envs.plan import ED
    from envs.workload import make_rounds

    cfg = EnvConfig.from_kwargs(**meta["env"])
    rows = evaluate_schedulers_v1(cfg, ["policy", "balance_ed"], rounds=4, seed=5, policy_path=str(out))
    assert len(rows) == 8 and (rows.served <= rows.num_users).all()
    cost = CostModel.from_config(cfg)
    sched = PolicyV1Scheduler(cost, cfg.max_gamma, path=out)
    for rnd in make_rounds(cfg, 4, 5, split="test"):
        plan = sched.plan(rnd)
        ed = plan.modes == ED
        assert plan.ed_depth is None if not ed.any() else (plan.ed_depth[ed] >= 1).all()
        assert not ed.any() or rnd.has_edge[ed].all()  # ED only for users with an edge
    with pytest.raises(ValueError, match="EdgeSchedule-v1"):  # the v0 scheduler refuses a v1 observation
        PolicyScheduler(cost, cfg.max_gamma, path=out)

    # the exported graph takes the same actions as the torch module on v1 observations
    from agents.export import OnnxPolicy
    from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv

    venv = EdgeScheduleV1VectorEnv(num_envs=5, **cfg.to_dict())
    obs, _ = venv.reset(seed=3)
    masks = venv.action_masks()
    onnx_actions = OnnxPolicy(out / "policy.onnx").act(obs, masks)
    assert list(onnx_actions) == [sched.act(o, m) for o, m in zip(obs, masks, strict=True)]

    # agents.evaluate runs it on v1 rounds (env.id selects the split evaluation)
    csv = tmp_path / "e.csv"
    res = subprocess.run([sys.executable, "-m", "agents.evaluate", "env=split_k20", "profile=split_a100-40gb_llama2-7b_tinyllama-1.1b", f"env.num_users={K}",
                          "schedulers=[balance_ed,policy]", f"policy_path={out}", "rounds=2", f"output={csv}", "progress=false", f"hydra.run.dir={tmp_path}/h"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert set(pd.read_csv(csv).scheduler) == {"balance_ed", "policy"}

    # the results script: seeds vs the best heuristic with paired CIs, and the best-on-validation policy shipped
    from experiments.learned_v1 import main as learned_v1

    seeds = learned_v1(["--runs", str(out), "--rounds", "3", "--opt-rounds", "2", "--opt-k", "4", "--out", str(tmp_path / "res"), "--ship", str(tmp_path / "ship"), "--quiet"])
    assert list(seeds.policy) == ["policy s0", "mean of 1 seeds"] and seeds.reference.iloc[0] in ("balance_ed", "edge_first")
    for name in ("learned_v1.md", "learned_v1.png", "learned_v1_rounds.csv", "learned_v1_seeds.csv", "learned_v1_optimum.csv"):
        assert (tmp_path / "res" / name).is_file(), name
    assert sorted(p.name for p in (tmp_path / "ship").iterdir()) == ["config.yaml", "model.zip", "policy.json", "policy.onnx", "progress.csv"]
    opt = pd.read_csv(tmp_path / "res" / "learned_v1_optimum.csv").groupby("scheduler").served.sum()
    assert (opt <= opt["optimal_v1"]).all()  # nothing beats the exact optimum
