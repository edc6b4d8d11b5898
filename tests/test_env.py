"""EdgeSchedule-v0: API conformance, masks, determinism, vector twin."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import envs
from envs import AD, SD, ConfigError, check_plans
from envs.edge_schedule_vector import EdgeScheduleVectorEnv


def make(**kw):
    return gym.make(envs.ENV_ID, **{"num_users": 12, **kw})


@pytest.mark.parametrize("kw", [{}, {"profile": "a100-40gb_llama2-13b_llama2-7b"}, {"alpha_cv": 0.3, "output_cv": 0.3, "simulate_acceptance": True}, {"kv_memory": "padded", "user_order": "deadline", "reward_timing": "episode_end"}])
def test_gymnasium_and_sb3_check_env(kw):
    check_env(make(**kw).unwrapped)
    sb3_check_env(make(**kw))


def test_bad_kwargs():
    with pytest.raises(ConfigError, match="num_users"):
        make(num_users=0)
    with pytest.raises(ConfigError, match="unknown"):
        make(bogus=1)


def _run(env, seed, policy_seed):
    rng = np.random.default_rng(policy_seed)
    obs, _ = env.reset(seed=seed)
    trace, total = [obs], 0.0
    while True:
        m = env.unwrapped.action_masks()
        a = int(rng.choice(np.flatnonzero(m)))
        obs, r, term, trunc, info = env.step(a)
        trace.append(obs)
        total += r
        if term or trunc:
            return np.array(trace), total, info


def test_masks_exact_along_episodes():
    env = make()
    for seed in range(5):
        rng = np.random.default_rng(seed)
        env.reset(seed=seed)
        u = env.unwrapped
        rnd, order = u.round, u._data.order[0]
        for t in range(12):
            mask = u.action_masks()
            modes = np.zeros(12, dtype=np.int8)
            modes[order[:t]] = u._modes[:t]
            gamma = int(u._plan.gamma)
            for a in range(1, mask.size):
                trial = modes.copy()
                trial[order[t]] = AD if a == 1 else SD
                g = a - 1 if a >= 2 else max(gamma, 1)
                expect = bool(check_plans(u.cost, rnd, trial, g).feasible) and not (a >= 2 and gamma and g != gamma)
                assert mask[a] == expect
            env.step(int(rng.choice(np.flatnonzero(mask))))


def test_episode_returns_served_and_info_keys():
    env = make()
    traj, total, info = _run(env, 3, 0)
    assert total == info["served"] == info["admitted_ad"] + info["admitted_sd"]
    assert info["admitted_ad"] + info["admitted_sd"] + info["rejected"] == 12 and info["late"] == 0
    modes = info["modes"]
    assert np.count_nonzero(modes == AD) == info["admitted_ad"] and np.count_nonzero(modes == SD) == info["admitted_sd"]
    assert (info["gamma"] > 0) == (info["admitted_sd"] > 0)
    assert 0.0 <= info["z"] <= 1.0 and 0.0 <= info["lam"] <= 1.0
    assert info["admitted_sd"] > 0 or info["z"] == 1.0
    assert len(traj) == 13
    assert all(env.observation_space.contains(o) for o in traj)
    # the final plan passes the exact check with the shares the env reports
    from envs import Plan
    from envs.feasibility import shares_respected

    plan = Plan(modes, gamma=max(info["gamma"], 1), z=info["z"], lam=info["lam"])
    assert bool(check_plans(env.unwrapped.cost, env.unwrapped.round, modes, plan.gamma).feasible)
    assert shares_respected(env.unwrapped.cost, env.unwrapped.round, plan)


def test_episode_end_reward_timing_pays_once():
    env = make(reward_timing="episode_end")
    rewards = []
    env.reset(seed=5)
    for _ in range(12):
        _, r, term, _, info = env.step(int(np.flatnonzero(env.unwrapped.action_masks())[-1]))
        rewards.append(r)
    assert term and rewards[:-1] == [0.0] * 11 and rewards[-1] == info["served"] > 0


def test_invalid_action_is_reject_and_flagged():
    env = make(num_users=40, deadline_s=[0.5, 0.6])  # almost nothing fits
    env.reset(seed=0)
    u = env.unwrapped
    flagged = 0
    for t in range(40):
        mask = u.action_masks()
        bad = np.flatnonzero(~mask)
        _, r, _, _, info = env.step(int(bad[0]) if bad.size else 0)
        assert info["invalid_action"] == bool(bad.size) and r == 0.0
        assert u._modes[t] == 0
        flagged += bool(bad.size)
    assert flagged >= 30  # the config really makes most actions infeasible
    assert info["served"] == 0 and info["rejected"] == 40


@pytest.mark.parametrize("bad", [-1, 10, 99, 1.5])
def test_out_of_range_action_is_reject(bad):
    env = make()
    env.reset(seed=0)
    _, r, _, _, info = env.step(bad)
    assert info["invalid_action"] and r == 0.0 and env.unwrapped._modes[0] == 0


def test_seeded_runs_repeat():
    a = _run(make(alpha_cv=0.2, output_cv=0.2, simulate_acceptance=True), 11, 1)
    b = _run(make(alpha_cv=0.2, output_cv=0.2, simulate_acceptance=True), 11, 1)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]


@pytest.mark.parametrize("k,extra", [(12, {}), (30, {"max_users": 8}), (9, {"max_users": 40, "max_gamma": 5})])
def test_vector_env_equals_scalar_env(k, extra):
    """The vector env builds every observation from scratch; the scalar env caches its rows and
    batch features (EdgeScheduleEnv._encode): both must agree bit for bit, look-ahead cut or padded."""
    n = 4
    venv = gym.make_vec(envs.ENV_ID, num_envs=n, vectorization_mode="vector_entry_point", num_users=k, **extra)
    assert isinstance(venv.unwrapped, EdgeScheduleVectorEnv)
    scalars = [make(num_users=k, **extra) for _ in range(n)]
    vobs, _ = venv.reset(seed=100)
    sobs = [e.reset(seed=100 + i)[0] for i, e in enumerate(scalars)]
    assert np.array_equal(vobs, np.stack(sobs))
    rng = np.random.default_rng(0)
    for step in range(2 * k + 1):  # two episodes plus the autoreset step
        vmask = venv.unwrapped.action_masks()
        actions = []
        for i in range(n):
            m = vmask[i]
            actions.append(int(rng.choice(np.flatnonzero(m))) if rng.random() < 0.9 else int(rng.integers(0, m.size)))
        vobs, vr, vterm, _, vinfo = venv.step(np.array(actions))
        for i, e in enumerate(scalars):
            if step == k:  # NEXT_STEP autoreset: the scalar twin resets (continuing its stream)
                o, _ = e.reset()
                r, term = 0.0, False
            else:
                assert np.array_equal(vmask[i], e.unwrapped.action_masks())
                o, r, term, _, info = e.step(actions[i])
                if term:
                    assert vinfo["served"][i] == info["served"]
            assert np.array_equal(vobs[i], o), (step, i)
            assert vr[i] == r and vterm[i] == term


def test_reset_with_given_round():
    env = make()
    env.reset(seed=0)
    rnd = env.unwrapped.round
    env2 = make()
    obs2, _ = env2.reset(seed=123, options={"round": rnd})
    assert env2.unwrapped.round is rnd
    obs1, _ = make().reset(seed=0)
    assert np.array_equal(obs1, obs2)  # same round, same first observation whatever the seed
    with pytest.raises(ValueError, match="num_users=5"):
        make(num_users=5).reset(options={"round": rnd})


def test_render_ansi():
    env = make(render_mode="ansi", deadline_s=[12.0, 13.0])
    env.reset(seed=0)
    assert "AD: 0 users" in env.render() and "user 0/12" in env.render()
    env.step(1)
    text = env.render()
    assert "AD: 1 users" in text and "SD: 0 users" in text and "user 1/12" in text
    assert make().unwrapped.render() is None  # no render mode: nothing to render
    with pytest.raises(ValueError, match="render_mode"):
        make(render_mode="svg")  # "human" is Gymnasium's HumanRendering over rgb_array (pygame)
