"""agents.import_sb3: any SB3 model on EdgeSchedule-v0 becomes a policy folder agents.evaluate loads."""

import collections
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env

import envs
from agents.export import OnnxPolicy
from agents.import_sb3 import PolicyImportError, import_sb3, zoo_run_info
from agents.policy import PolicyScheduler
from envs import CostModel, EnvConfig, check_plan, sample_round

ROOT = Path(__file__).resolve().parents[1]
KWARGS = {"num_users": 6, "max_users": 8, "user_order": "slack_desc"}


@pytest.fixture(scope="module")
def ppo_zip(tmp_path_factory):
    """A tiny PPO trained with SB3's own make_vec_env, saved as any SB3 user would."""
    venv = make_vec_env(envs.ENV_ID, n_envs=2, seed=0, env_kwargs=KWARGS)
    model = PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu", policy_kwargs={"net_arch": [16]})
    model.learn(64)
    path = tmp_path_factory.mktemp("sb3") / "model.zip"
    model.save(path)
    return path


def test_import_writes_a_loadable_policy_folder(ppo_zip, tmp_path):
    out = import_sb3(ppo_zip, tmp_path / "pol", algo="ppo", env_kwargs=KWARGS)
    assert (out / "model.zip").read_bytes() == ppo_zip.read_bytes()
    meta = json.loads((out / "policy.json").read_text())
    assert meta["algo"] == "ppo" and meta["env"]["max_users"] == 8 and meta["source"]["env_kwargs_from"] == "--env-kwargs"
    cfg = EnvConfig.from_kwargs(**KWARGS)
    cost = CostModel.from_config(cfg)
    sched = PolicyScheduler(cost, cfg.max_gamma, path=out)
    rnd = sample_round(np.random.default_rng(0), cfg)
    plan = sched.plan(rnd)
    assert check_plan(cost, rnd, plan).feasible
    # the ONNX graph takes the same decisions as the torch policy, given the same (real) masks: an
    # unmasked algorithm ignores them in both (the graph applied them, the scheduler did not)
    onnx = OnnxPolicy(out / "policy.onnx")
    env = sched.env
    obs, _ = env.reset(options={"round": rnd})
    done = False
    while not done:
        mask = env.action_masks()
        action = sched.act(obs, mask)
        assert int(onnx.act(obs, mask)[0]) == action == int(onnx.act(obs, np.ones_like(mask))[0])
        obs, _, done, _, _ = env.step(action)


def test_mismatched_env_or_algo_fails_before_writing(ppo_zip, tmp_path):
    with pytest.raises(PolicyImportError, match="max_users"):
        import_sb3(ppo_zip, tmp_path / "a", algo="ppo", env_kwargs={"num_users": 6})
    with pytest.raises(PolicyImportError, match="does not load as a dqn model"):
        import_sb3(ppo_zip, tmp_path / "b", algo="dqn", env_kwargs=KWARGS)
    with pytest.raises(PolicyImportError, match="--algo"):
        import_sb3(ppo_zip, tmp_path / "c", algo="sac", env_kwargs=KWARGS)
    with pytest.raises(PolicyImportError, match="--algo is needed"):
        import_sb3(ppo_zip, tmp_path / "d", env_kwargs=KWARGS)
    with pytest.raises(PolicyImportError, match="num_users"):
        import_sb3(ppo_zip, tmp_path / "e", algo="ppo", env_kwargs={"num_users": -1})
    assert not any((tmp_path / d).exists() for d in "abcde")


def _fake_zoo_run(root: Path, model: Path) -> Path:
    """rl-zoo3's layout: logs/<algo>/<env>_<n>/best_model.zip and <env>/config.yml (an OrderedDict)."""
    run = root / "ppo" / f"{envs.ENV_ID}_1"
    (run / envs.ENV_ID).mkdir(parents=True)
    saved = collections.OrderedDict([("env_kwargs", dict(KWARGS)), ("n_envs", 2), ("policy", "MlpPolicy")])
    (run / envs.ENV_ID / "config.yml").write_text(yaml.dump(saved))  # the tag rl-zoo3 writes
    assert "python/object/apply:collections.OrderedDict" in (run / envs.ENV_ID / "config.yml").read_text()
    (run / "best_model.zip").write_bytes(model.read_bytes())
    return run / "best_model.zip"


def test_rl_zoo3_folder_gives_algo_and_env_kwargs(ppo_zip, tmp_path):
    model = _fake_zoo_run(tmp_path / "logs", ppo_zip)
    assert zoo_run_info(model) == ("ppo", KWARGS)
    out = import_sb3(model, tmp_path / "pol", onnx=False)
    meta = json.loads((out / "policy.json").read_text())
    assert meta["algo"] == "ppo" and meta["env"]["num_users"] == 6 and meta["source"]["env_kwargs_from"] == "rl-zoo3 config.yml"
    assert not (out / "policy.onnx").exists()


def test_a_model_trained_behind_vecnormalize_is_refused(ppo_zip, tmp_path):
    # the policy acts on normalised observations; the folder would have run it on raw ones, silently
    model = _fake_zoo_run(tmp_path / "logs", ppo_zip)
    config = model.parent / envs.ENV_ID / "config.yml"
    saved = yaml.load(config.read_text(), Loader=yaml.UnsafeLoader)
    saved["normalize"] = True
    config.write_text(yaml.dump(saved))
    with pytest.raises(PolicyImportError, match="normalize: True"):
        import_sb3(model, tmp_path / "a", onnx=False)
    (model.parent / envs.ENV_ID / "vecnormalize.pkl").write_bytes(b"stats")
    with pytest.raises(PolicyImportError, match="trained with VecNormalize"):
        import_sb3(model, tmp_path / "b", onnx=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_an_rl_zoo3_folder_of_another_algorithm_is_named(ppo_zip, tmp_path):
    # was: "--algo is needed: ... is not inside an rl-zoo3 log folder", for a model that is
    model = _fake_zoo_run(tmp_path / "logs", ppo_zip)
    a2c = model.parent.parent.parent / "a2c"
    model.parent.parent.rename(a2c)
    with pytest.raises(PolicyImportError, match="rl-zoo3 folder of algorithm 'a2c'"):
        import_sb3(a2c / f"{envs.ENV_ID}_1" / "best_model.zip", tmp_path / "c", onnx=False)


def test_cli_then_agents_evaluate(ppo_zip, tmp_path):
    """The documented commands, as subprocesses: import, then agents.evaluate policy_path=..."""
    out = tmp_path / "pol"
    run = subprocess.run([sys.executable, "-m", "agents.import_sb3", str(ppo_zip), "--algo", "ppo", "--env-kwargs", json.dumps(KWARGS), "--out", str(out), "--no-onnx"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert f"policy_path={out}" in run.stdout
    csv = tmp_path / "eval.csv"
    run = subprocess.run([sys.executable, "-m", "agents.evaluate", "schedulers=[greedy,policy]", f"policy_path={out}", "env.num_users=6", "rounds=3",
                          "progress=false", f"output={csv}", f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    import pandas as pd

    df = pd.read_csv(csv)
    assert sorted(df.scheduler.unique()) == ["greedy", "policy"] and len(df) == 6
    bad = subprocess.run([sys.executable, "-m", "agents.import_sb3", str(ppo_zip), "--algo", "ppo", "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "max_users" in bad.stderr and not (tmp_path / "x").exists()
