"""EdgeSchedule-v1: checkers, exact masks, v0 equivalence without edges, the vector twin."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs
from envs.config import ConfigError
from envs.plan import ED, REJECT

K, G = 10, 4
SPLIT = "split_a100-40gb_llama2-7b_tinyllama-1.1b"


def make(**kw):
    return gym.make(envs.V1_ENV_ID, **{"num_users": K, "max_gamma": G, **kw})


def test_gymnasium_and_sb3_checkers():
    check_env(make().unwrapped, skip_render_check=False)
    from stable_baselines3.common.env_checker import check_env as sb3_check

    sb3_check(make().unwrapped, warn=True)


def test_action_space_and_observation():
    env = make()
    assert env.action_space.n == 2 + 2 * G
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    rng = np.random.default_rng(0)
    for _ in range(3 * K):
        m = env.unwrapped.action_masks()
        obs, r, term, _, info = env.step(int(rng.choice(np.flatnonzero(m))))
        assert env.observation_space.contains(obs) and not info["invalid_action"]
        if term:
            env.reset()


def test_masked_out_and_nameless_actions_are_rejects_and_flagged():
    env = make(edge_fraction=1.0, deadline_s=[0.3, 0.6])
    env.reset(seed=1)
    u = env.unwrapped
    seen_masked = 0
    for _ in range(K):
        m = u.action_masks()
        bad = np.flatnonzero(~m)
        if len(bad):
            _, r, term, _, info = env.step(int(bad[0]))
            seen_masked += 1
            assert info["invalid_action"] and r == 0.0
        else:
            _, _, term, _, info = env.step(2 + 2 * G + 5)  # names no action
            assert info["invalid_action"]
        if term:
            assert info["admitted_ad"] + info["admitted_sd"] + info["admitted_ed"] == 0
            break
    assert seen_masked > 0


@pytest.mark.parametrize("profile, extra", [(SPLIT, {}), ("rtx4090_llama2-7b_tinyllama-1.1b", {}),
                                            (SPLIT, {"alpha_cv": 0.3, "output_cv": 0.4, "simulate_acceptance": True})])
def test_without_edges_v1_serves_exactly_what_v0_serves(profile, extra):
    """>= 200 seeds, one random masked policy: the same masks, actions and served users."""
    seeds = range(210) if not extra and profile == SPLIT else range(40)
    kw = {"num_users": K, "max_gamma": G, "profile": profile, **extra}
    v0, v1 = gym.make(envs.ENV_ID, **kw), gym.make(envs.V1_ENV_ID, edge_fraction=0.0, **kw)
    served_total = 0
    for seed in seeds:
        v0.reset(seed=seed)
        v1.reset(seed=seed)
        rng = np.random.default_rng(seed)
        while True:
            m0, m1 = v0.unwrapped.action_masks(), v1.unwrapped.action_masks()
            assert np.array_equal(m1[: 2 + G], m0) and not m1[2 + G:].any()
            a = int(rng.choice(np.flatnonzero(m0)))
            _, r0, t0, _, i0 = v0.step(a)
            _, r1, t1, _, i1 = v1.step(a)
            assert r0 == r1 and t0 == t1
            if t0:
                for key in ("served", "admitted_ad", "admitted_sd", "rejected", "late", "gamma"):
                    assert i0[key] == i1[key], key
                assert np.array_equal(i0["modes"], i1["modes"]) and i1["admitted_ed"] == 0
                assert i0["z"] == pytest.approx(i1["z"], abs=1e-15) and i0["lam"] == pytest.approx(i1["lam"], abs=1e-15)
                served_total += i0["served"]
                break
    assert served_total > 0


def test_ed_users_are_admitted_and_served_when_realised_equals_predicted():
    env = make(num_users=16, edge_fraction=1.0)
    served = admitted_ed = 0
    for seed in range(10):
        env.reset(seed=seed)
        while True:
            m = env.unwrapped.action_masks()
            ed = np.flatnonzero(m[2 + G:])
            a = int(2 + G + ed[-1]) if len(ed) else int(np.flatnonzero(m)[-1])
            _, _, term, _, info = env.step(a)
            if term:
                break
        assert info["late"] == 0
        assert np.all((info["modes"] == ED) == (info["ed_depth"] > 0))
        served += info["served"]
        admitted_ed += info["admitted_ed"]
    assert admitted_ed > 0 and served > 0


def test_vector_twin_reproduces_the_scalar_env():
    n = 3
    venv = gym.make_vec(envs.V1_ENV_ID, num_envs=n, vectorization_mode="vector_entry_point", num_users=K, max_gamma=G)
    scal = [make() for _ in range(n)]
    obs_v, _ = venv.reset(seed=7)
    obs_s = [e.reset(seed=7 + i)[0] for i, e in enumerate(scal)]
    assert np.allclose(obs_v, np.stack(obs_s), atol=1e-6)
    rng = np.random.default_rng(1)
    for _ in range(2 * K + 1):
        mv = venv.unwrapped.action_masks()
        ms = np.stack([e.unwrapped.action_masks() for e in scal])
        assert np.array_equal(mv, ms)
        acts = np.array([int(rng.choice(np.flatnonzero(m))) for m in mv])
        obs_v, rew_v, term_v, _, info_v = venv.step(acts)
        for i, e in enumerate(scal):
            o, r, t, _, info = e.step(int(acts[i]))
            assert r == rew_v[i] and t == term_v[i]
            if t:
                assert info["served"] == info_v["served"][i] and info["admitted_ed"] == info_v["admitted_ed"][i]
                o, _ = e.reset()  # the vector env resets on its next step (next_step autoreset)
            else:
                assert np.allclose(o, obs_v[i], atol=1e-6)
        if term_v.any():
            # the vector env's next step resets the ended sub-envs: give them any action
            acts2 = np.zeros(n, dtype=np.int64)
            live = ~term_v
            for i in np.flatnonzero(live):
                acts2[i] = int(rng.choice(np.flatnonzero(venv.unwrapped.action_masks()[i])))
            obs_v, rew_v, term_v, _, info_v = venv.step(acts2)
            for i in np.flatnonzero(live):
                o, r, t, _, _ = scal[i].step(int(acts2[i]))
                assert r == rew_v[i]


@pytest.mark.parametrize("kwargs, field", [
    ({"profile": "rtx4090_llama2-7b_tinyllama-1.1b", "edge_fraction": 0.5}, "profile"),
    ({"bonus_match": 2.0}, "bonus_match"),
    ({"interrupt": "later"}, "interrupt"),
    ({"edge_fraction": -0.1}, "edge_fraction"),
    # a red-team's finds: "false" is truthy (it priced as proactive on), True is not a depth or a byte count
    ({"proactive": "false"}, "proactive"),
    ({"pipeline": None}, "pipeline"),
    ({"bonus_match": "0.5"}, "bonus_match"),
    ({"bonus_match": True}, "bonus_match"),
    ({"max_gamma": True}, "max_gamma"),
    ({"memory_bytes": True}, "memory_bytes"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        make(**kwargs)


@pytest.mark.parametrize("num_envs", [2.5, "3", True, 0])
def test_vector_env_refuses_a_number_of_envs_that_is_not_a_positive_integer(num_envs):
    for env_id in (envs.ENV_ID, envs.V1_ENV_ID):
        with pytest.raises(ValueError, match="num_envs"):
            gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", num_users=4)


@pytest.mark.parametrize("env_id", [envs.ENV_ID, envs.V1_ENV_ID])
def test_set_cost_model_mid_episode_takes_effect_at_the_next_reset(env_id):
    """The running episode ends on the model it started with (it used to break: 'apply called before
    prepare'); the next reset plans with the new one."""
    from envs.cost_model import CostModel

    env = gym.make(env_id, num_users=6).unwrapped
    env.reset(seed=0)
    small = CostModel.from_config(env.cfg.replace(memory_bytes=float(env.cost.memory_bytes) * 0.999))
    env.step(1)
    env.set_cost_model(small)
    assert env.cost is not small  # not yet: mid-episode
    done = False
    while not done:
        done = env.step(int(np.flatnonzero(env.action_masks())[-1]))[2]
    env.reset(seed=1)
    assert env.cost is small


def test_set_cost_model_keeps_the_split_switches_of_an_env_built_without_a_split_profile():
    """v1 built on a profile with no edge/network sections (edge_fraction 0) keeps its switches for a
    split profile installed later (they used to fall back to the defaults)."""
    from envs.cost_model import CostModel

    env = make(profile="rtx4090_llama2-7b_tinyllama-1.1b", edge_fraction=0.0, proactive=False, interrupt="immediate", bonus_match=0.2).unwrapped
    assert env.split is None
    env.set_cost_model(CostModel.from_config(make().unwrapped.cfg))
    opts = env.split.options
    assert (opts.proactive, opts.interrupt, opts.bonus_match) == (False, "immediate", 0.2)


def test_defaults_and_render():
    env = gym.make(envs.V1_ENV_ID, num_users=5, render_mode="ansi")
    assert env.unwrapped.cfg.profile == SPLIT and env.unwrapped.cfg.edge_fraction == 0.5
    env.reset(seed=0)
    assert "ED:" in env.render()
    env.step(0)
    assert env.unwrapped.action_masks()[REJECT]


def test_speed_benchmark_runs_end_to_end(tmp_path, monkeypatch, capsys):
    from experiments.bench import v1_speed

    out = tmp_path / "v1_speed.md"
    monkeypatch.setattr("sys.argv", ["v1_speed", "--users", "5", "--num-envs", "4", "--seconds", "0.03", "--out", str(out)])
    v1_speed.main()
    text = out.read_text()
    assert "EdgeSchedule-v1 steps" in text and "vector env user-decisions" in text and "Reproduce" in text
    monkeypatch.setattr("sys.argv", ["v1_speed", "--users", "5", "--num-envs", "4", "--seconds", "0.03", "--repeats", "2", "--out", str(out)])
    v1_speed.main()
    text = out.read_text()
    assert "Medians over 2 repeats" in text and "--repeats 2" in text
    csv = out.with_suffix(".csv").read_text().splitlines()
    assert csv[0] == "measurement,repeat,per_second,ratio_to_cartpole" and len(csv) == 1 + 2 * 5
    monkeypatch.setattr("sys.argv", ["v1_speed", "--users", "0"])
    with pytest.raises(SystemExit):
        v1_speed.main()


def test_given_rounds_play_the_same_in_the_scalar_and_vector_envs_and_bare_rounds_have_no_ed():
    from envs.config import EnvConfig
    from envs.workload import Round, sample_round

    cfg = EnvConfig(num_users=K, max_gamma=G, profile=SPLIT, edge_fraction=0.7)
    rounds = [sample_round(np.random.default_rng(s), cfg) for s in (11, 12)]
    venv = gym.make_vec(envs.V1_ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", num_users=K, max_gamma=G, edge_fraction=0.7)
    venv.reset(seed=0, options={"rounds": rounds})
    scal = [make(edge_fraction=0.7) for _ in rounds]
    for e, r in zip(scal, rounds, strict=True):
        e.reset(seed=0, options={"round": r})
    for _ in range(K):
        mv = venv.unwrapped.action_masks()
        assert np.array_equal(mv, np.stack([e.unwrapped.action_masks() for e in scal]))
        acts = mv.shape[1] - 1 - np.argmax(mv[:, ::-1], axis=1)  # the highest allowed action (ED first)
        _, rv, tv, _, iv = venv.step(acts)
        for i, e in enumerate(scal):
            _, r, t, _, info = e.step(int(acts[i]))
            assert r == rv[i]
            if t:
                assert info["served"] == iv["served"][i] and info["admitted_ed"] == iv["admitted_ed"][i]
    bare = Round.from_arrays(cfg, [5] * K, [7] * K, [3.0] * K, [0.8] * K, [50.0] * K)
    env = make(edge_fraction=0.7)
    env.reset(options={"round": bare})
    assert not env.unwrapped.action_masks()[2 + G:].any()
