"""agents.set_policy: the permutation-aware policy over all users of a round (one policy, any K)."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from sb3_contrib import MaskablePPO

import envs
from agents.set_policy import SetFeaturesExtractor, SetPolicyConfig, head_size, set_policy_kwargs
from agents.train import TrainConfig, TrainConfigError
from envs import CostModel, EnvConfig, check_plan, sample_round

ROOT = Path(__file__).resolve().parents[1]
G = 8


def _obs(num_users=12, max_users=20, steps=3, seed=0):
    env = gym.make(envs.ENV_ID, num_users=num_users, max_users=max_users)
    obs, _ = env.reset(seed=seed)
    for _ in range(steps):
        obs, *_ = env.step(int(np.flatnonzero(env.unwrapped.action_masks())[-1]))
    return env, obs


@pytest.mark.parametrize("pool", ["attention", "mean_max"])
def test_invariant_to_the_order_of_users_and_to_padding(pool):
    torch.manual_seed(0)
    env, obs = _obs()
    ex = SetFeaturesExtractor(env.observation_space, max_gamma=G, embed_dim=16, pool=pool, heads=2).eval()
    h, n = head_size(G), 12 - 3 - 1  # users still to come after the current one
    users = obs[h:].reshape(20, 8)
    assert users[:n, 7].all() and not users[n:].any()
    shuffled = obs.copy()
    shuffled[h:] = np.concatenate([users[np.random.default_rng(1).permutation(n)], users[n:]]).ravel()
    with torch.no_grad():
        a, b = ex(torch.as_tensor(np.stack([obs, shuffled])))
    assert torch.allclose(a, b, atol=1e-5)
    # the same round seen with more padding (a larger max_users) gives the same features
    env2, obs2 = _obs(max_users=40)
    ex2 = SetFeaturesExtractor(env2.observation_space, max_gamma=G, embed_dim=16, pool=pool, heads=2).eval()
    ex2.load_state_dict(ex.state_dict())
    with torch.no_grad():
        assert torch.allclose(ex2(torch.as_tensor(obs2[None]))[0], a, atol=1e-5)
        # and trimming the padding (training) equals keeping it (export)
        full = torch.jit.trace(ex2, torch.as_tensor(obs2[None]), check_trace=False)(torch.as_tensor(obs2[None]))[0]
    assert torch.allclose(full, a, atol=1e-5)
    # a different set of users gives different features: the users are seen
    changed = obs.copy()
    changed[h : h + 8] = users[n - 1]
    with torch.no_grad():
        assert not torch.allclose(ex(torch.as_tensor(changed[None]))[0], a, atol=1e-4)


def test_empty_set_and_bad_layouts():
    env, obs = _obs(num_users=4, max_users=8, steps=3)  # the last user: nobody left to come
    ex = SetFeaturesExtractor(env.observation_space, max_gamma=G, embed_dim=8, heads=2)
    assert torch.isfinite(ex(torch.as_tensor(obs[None]))).all()
    with pytest.raises(ValueError, match="max_gamma=4"):
        SetFeaturesExtractor(env.observation_space, max_gamma=4)
    for bad, match in [({"extractor": "gnn"}, "extractor"), ({"extractor": "set", "heads": 3}, "heads"), ({"extractor": "set", "pool": "sum"}, "pool"), ({"bogus": 1}, "bogus")]:
        with pytest.raises(ValueError, match=match):
            SetPolicyConfig.from_dict(bad)
    assert set_policy_kwargs({}, G) == {} and set_policy_kwargs({"extractor": "flat"}, G) == {}
    raw = {"env": {"num_users": 8}, "agent": {"algo": "maskable_ppo", "features": {"extractor": "set", "embed_dim": 2}}, "eval": {}, "logger": {}}
    with pytest.raises(TrainConfigError, match="embed_dim"):
        TrainConfig.from_dict(raw)


def _policy_folder(tmp_path, kw):
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv

    cfg = EnvConfig(**kw)
    env = EdgeScheduleSB3VecEnv(2, cfg.to_dict())
    model = MaskablePPO("MlpPolicy", env, seed=0, device="cpu", n_steps=16, batch_size=32, n_epochs=1,
                        policy_kwargs={"net_arch": [16], **set_policy_kwargs({"extractor": "set", "embed_dim": 16, "heads": 2}, cfg.max_gamma)})
    model.save(tmp_path / "model.zip")
    (tmp_path / "policy.json").write_text(json.dumps({"algo": "maskable_ppo", "env": cfg.to_dict()}))
    return model, env


def test_masks_respected_and_onnx_export_matches(tmp_path):
    from agents.export import OnnxPolicy, export_onnx

    model, env = _policy_folder(tmp_path, {"num_users": 10, "max_users": 24})
    rng = np.random.default_rng(0)
    # real observations of rounds of several sizes, so the sets are ragged
    obs, masks = [], []
    for k in (3, 10, 24):
        e = gym.make(envs.ENV_ID, num_users=k, max_users=24)
        o, _ = e.reset(seed=k)
        for _ in range(k):
            m = e.unwrapped.action_masks()
            obs.append(o)
            masks.append(m & (rng.random(m.shape) < 0.6) | (np.arange(len(m)) == 0))
            o, _, term, _, _ = e.step(int(rng.choice(np.flatnonzero(m))))
            if term:
                break
    obs, masks = np.array(obs, dtype=np.float32), np.array(masks)
    want, _ = model.predict(obs, action_masks=masks, deterministic=True)
    assert masks[np.arange(len(want)), want].all()  # never a masked action
    got = OnnxPolicy(export_onnx(tmp_path)).act(obs, masks)
    assert np.array_equal(got, want)


def test_one_policy_plans_rounds_of_any_size(tmp_path):
    from agents.policy import PolicyScheduler

    _policy_folder(tmp_path, {"num_users": 10, "max_users": 64})
    for k in (5, 20, 64):
        cfg = EnvConfig(num_users=k)
        cost = CostModel.from_config(cfg)
        rnd = sample_round(np.random.default_rng(k), cfg)
        plan = PolicyScheduler(cost, cfg.max_gamma, path=tmp_path).plan(rnd)
        assert len(plan.modes) == k and check_plan(cost, rnd, plan).feasible


def test_general_experiment_smoke_training(tmp_path):
    """experiment=general, shrunk: the curriculum over K with the set policy, then the policy on a larger K."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "agents.train", "experiment=general", "env.num_users=10", "env.max_users=24", "curriculum=[4,6]",
           "total_timesteps=768", "n_envs=4", "agent.hyperparams.n_steps=64", "agent.hyperparams.batch_size=128", "agent.hyperparams.n_epochs=1",
           "agent.features.embed_dim=16", "agent.net_arch=[32]", "eval.rounds=4", "eval.freq=0", "eval.final_rounds=4", "eval.final_schedulers=[greedy]",
           "logger=disabled", "progress_bar=false", f"output_dir={out}"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in ("model.zip", "policy.json", "policy.onnx", "eval.csv"):
        assert (out / name).is_file(), name
    import pandas as pd

    prog = pd.read_csv(out / "progress.csv")
    assert sorted(prog["curriculum/num_users"].dropna().unique()) == [4, 6, 10]
    csv = tmp_path / "e.csv"
    res = subprocess.run([sys.executable, "-m", "agents.evaluate", "schedulers=[policy]", f"policy_path={out}", "env.num_users=20", "rounds=2",
                          "progress=false", f"output={csv}", f"hydra.run.dir={tmp_path / 'h'}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (pd.read_csv(csv).num_users == 20).all()


def _round_decisions(k=30, max_users=40, seed=3, noise=0.5):
    """Every observation and mask of one round played with random allowed actions."""
    env = gym.make(envs.ENV_ID, num_users=k, max_users=max_users)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    out_obs, out_masks = [], []
    for _ in range(k):
        m = env.unwrapped.action_masks()
        out_obs.append(obs)
        out_masks.append(m)
        allowed = np.flatnonzero(m)
        obs, *_ = env.step(int(rng.choice(allowed) if rng.random() < noise else allowed[-1]))
    return env, np.array(out_obs, dtype=np.float32), np.array(out_masks)


@pytest.mark.parametrize("pool", ["attention", "mean_max"])
def test_forward_round_equals_the_observation_path(pool):
    """Behaviour cloning's batched round path is the same arithmetic as forward(obs)."""
    torch.manual_seed(1)
    k = 30
    env, obs, _ = _round_decisions(k=k)
    ex = SetFeaturesExtractor(env.observation_space, max_gamma=G, embed_dim=16, pool=pool, heads=2).eval()
    h = head_size(G)
    users = np.concatenate([obs[0, :8][None], obs[0, h : h + 8 * (k - 1)].reshape(k - 1, 8)])  # the round's users in order
    with torch.no_grad():
        want = ex(torch.as_tensor(obs))
        got = ex.forward_round(torch.as_tensor(np.stack([obs[:, :h]] * 2)), torch.as_tensor(np.stack([users] * 2)))
    assert got.shape == (2 * k, ex.features_dim)
    assert torch.allclose(got[:k], want, atol=1e-5) and torch.allclose(got[k:], want, atol=1e-5)


@pytest.mark.parametrize("pool", ["attention", "mean_max"])
def test_cached_actor_takes_the_same_actions_as_the_uncached_forward(tmp_path, pool):
    from agents.masked_policy import MaskedArgmax
    from agents.set_policy_fast import CachedSetActor, supports

    cfg = EnvConfig(num_users=10, max_users=40)
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv

    model = MaskablePPO("MlpPolicy", EdgeScheduleSB3VecEnv(1, cfg.to_dict()), seed=0, device="cpu",
                        policy_kwargs={"net_arch": [16], **set_policy_kwargs({"extractor": "set", "embed_dim": 16, "heads": 2, "pool": pool}, G)})
    # random weights give near-uniform logits (ties decide nothing): scale the action head up
    with torch.no_grad():
        model.policy.action_net.weight.mul_(50.0)
    assert supports(model)
    actor, net = CachedSetActor(model), MaskedArgmax(model).eval()
    feats_checked = 0
    for k, seed in ((30, 0), (30, 1), (41, 2), (5, 3)):  # 41 > max_users + 1: the look-ahead is full, the cache must not be trusted
        _, obs, masks = _round_decisions(k=k, seed=seed)
        actor.reset() if seed % 2 else None  # also without an explicit reset: a new round is detected
        with torch.no_grad():
            want = net(torch.as_tensor(obs), torch.as_tensor(masks, dtype=torch.float32)).numpy()
            want_feats = model.policy.pi_features_extractor(torch.as_tensor(obs)).numpy()
        for i, (o, m) in enumerate(zip(obs, masks, strict=True)):
            np.testing.assert_allclose(actor.features(o), want_feats[i], atol=1e-4)
            actor._n_prev += 1  # undo features()' bookkeeping: act() below sees the same decision again
            assert actor.act(o, m) == want[i]
            feats_checked += 1
    assert feats_checked == 30 + 30 + 41 + 5
    with pytest.raises(TypeError, match="set features extractor"):
        CachedSetActor(MaskablePPO("MlpPolicy", EdgeScheduleSB3VecEnv(1, cfg.to_dict()), device="cpu"))


@pytest.mark.parametrize("pool", ["attention", "mean_max"])
def test_cached_actor_skips_forced_decisions_and_stays_exact(pool):
    """A decision whose mask allows one action skips the network; the decisions after it (forced
    runs of any length, at the start, the middle and the end of a round, rounds back to back with
    no reset, a full look-ahead) still equal the uncached forward, and a round fitting the
    look-ahead is encoded once however many decisions were forced."""
    from agents.masked_policy import MaskedArgmax
    from agents.set_policy_fast import CachedSetActor

    cfg = EnvConfig(num_users=10, max_users=40)
    from agents.sb3_vec_env import EdgeScheduleSB3VecEnv

    model = MaskablePPO("MlpPolicy", EdgeScheduleSB3VecEnv(1, cfg.to_dict()), seed=0, device="cpu",
                        policy_kwargs={"net_arch": [16], **set_policy_kwargs({"extractor": "set", "embed_dim": 16, "heads": 2, "pool": pool}, G)})
    with torch.no_grad():
        model.policy.action_net.weight.mul_(50.0)
    actor, net = CachedSetActor(model), MaskedArgmax(model).eval()
    encodes = []
    real_encode = actor._encode
    actor._encode = lambda users: (encodes.append(len(users)), real_encode(users))
    rng = np.random.default_rng(7)
    forced = free = 0
    for k, seed in ((30, 0), (30, 1), (41, 2), (5, 3), (30, 4)):
        _, obs, masks = _round_decisions(k=k, seed=seed)
        masks = masks.copy()
        # force runs of decisions: the first ones, a stretch in the middle, the last ones
        for i in {0, 1, *range(k // 3, min(k, k // 3 + 5)), k - 2, k - 1, *rng.choice(k, size=k // 4).tolist()}:
            allowed = np.flatnonzero(masks[i])
            masks[i] = 0
            masks[i, rng.choice(allowed)] = 1
        with torch.no_grad():
            want = net(torch.as_tensor(obs), torch.as_tensor(masks, dtype=torch.float32)).numpy()
        n_before = len(encodes)
        for i, (o, m) in enumerate(zip(obs, masks, strict=True)):
            assert actor.act(o, m) == want[i], (k, seed, i)
            forced += int(m.sum() == 1)
            free += int(m.sum() > 1)
        if k <= 40:  # every user to come fits the look-ahead: one encoding for the round (none if all forced)
            assert len(encodes) - n_before == int((masks.sum(axis=1) > 1).any()), (k, seed, encodes[n_before:])
    assert forced > 30 and free > 30


def test_imitation_replays_balance_and_clones_it(tmp_path):
    """Expert data: BALANCE's plan replayed through the env serves what BALANCE serves; a tiny clone runs."""
    from agents.imitation import (
        ImitationConfig,
        collect,
        decisions,
        expert_modes,
        replay_round,
        train_bc,
    )
    from agents.policy import PolicyScheduler

    cfg = ImitationConfig(max_users=24, embed_dim=8, heads=2, net_arch=[16], epochs=2, val_ks=[6, 12], val_rounds=2, noise=0.0)
    env = gym.make(envs.ENV_ID, **cfg.env(12).to_dict()).unwrapped
    rnd = sample_round(np.random.default_rng(5), cfg.env(12))
    modes, balance_served = expert_modes(env, env.cost, rnd, cfg.expert_gamma)
    assert (modes != 0).sum() >= balance_served  # the expert is at least BALANCE
    d = replay_round(env, rnd, modes, cfg.expert_gamma, 0.0, np.random.default_rng(0))
    assert d["masks"][np.arange(12), d["labels"]].all()
    assert (d["labels"] > 0).sum() == (modes != 0).sum()  # a feasible plan replays in full
    assert set(np.unique(d["labels"])) <= {0, 1, 1 + cfg.expert_gamma}
    noisy = replay_round(env, rnd, modes, cfg.expert_gamma, 1.0, np.random.default_rng(0))  # every action flipped
    assert noisy["masks"][np.arange(12), noisy["labels"]].all() and not np.array_equal(noisy["heads"], d["heads"])
    collect(cfg, [6, 12], [6, 3], tmp_path / "data")
    data = decisions(cfg, tmp_path / "data", noise_seed=0)
    assert [x["k"] for x in data] == [6, 12] and data[1]["labels"].shape == (3, 12) and data[1]["users"].shape == (3, 12, 8)
    res = train_bc(cfg, tmp_path / "data", tmp_path / "pol", seed=0)
    assert len(res["epochs"]) == 2 and 0 <= res["best_val_served_frac"] <= 1
    for name in ("model.zip", "policy.json", "policy.onnx", "progress.csv"):
        assert (tmp_path / "pol" / name).is_file(), name
    sched = PolicyScheduler(CostModel.from_config(cfg.env(20)), G, path=tmp_path / "pol")
    assert sched.fast is not None
    r20 = sample_round(np.random.default_rng(9), cfg.env(20))
    assert check_plan(sched.cost, r20, sched.plan(r20)).feasible
