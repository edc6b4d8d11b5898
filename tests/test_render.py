"""EdgeSchedule-v0 rendering (Gymnasium's render modes) and SB3's ``make_vec_env``."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_util import make_vec_env

import envs
from envs.edge_schedule import EdgeScheduleEnv
from envs.edge_schedule_vector import EdgeScheduleVectorEnv
from envs.render import FRAME_SIZE_PX

K = 12


def make(**kw):
    return gym.make(envs.ENV_ID, **{"num_users": K, **kw})


def test_metadata_follows_gymnasium():
    for cls in (EdgeScheduleEnv, EdgeScheduleVectorEnv):
        assert cls.metadata["render_modes"] == ["ansi", "rgb_array"]
        assert cls.metadata["render_fps"] > 0
    assert make(render_mode="rgb_array").render_mode == "rgb_array"
    with pytest.raises(ValueError, match="render_mode"):
        EdgeScheduleEnv(render_mode="human", num_users=K)
    with pytest.raises(ValueError, match="render_mode"):
        EdgeScheduleVectorEnv(num_envs=2, render_mode="svg", num_users=K)


@pytest.mark.parametrize("mode", ["ansi", "rgb_array"])
def test_env_checker_with_render_mode(mode):
    # Gymnasium's checker also makes one env per declared render mode from the spec and renders it
    check_env(make(render_mode=mode).unwrapped)


def _play(env, seed, render_each_step):
    """Observations, rewards and final info of one episode under a fixed action sequence."""
    obs, _ = env.reset(seed=seed)
    trace, rewards = [obs], []
    frames = [env.render()] if render_each_step else []
    i = 0
    while True:
        mask = env.unwrapped.action_masks()
        allowed = np.flatnonzero(mask)
        obs, r, term, trunc, info = env.step(int(allowed[i % len(allowed)]))
        trace.append(obs)
        rewards.append(r)
        if render_each_step:
            frames.append(env.render())
        i += 1
        if term or trunc:
            return trace, rewards, info, frames


def test_rendering_leaves_the_dynamics_alone():
    plain = _play(make(alpha_cv=0.3, simulate_acceptance=True), 7, False)
    for mode in ("ansi", "rgb_array"):
        drawn = _play(make(alpha_cv=0.3, simulate_acceptance=True, render_mode=mode), 7, True)
        assert all(np.array_equal(a, b) for a, b in zip(plain[0], drawn[0], strict=True))
        assert plain[1] == drawn[1] and plain[2]["served"] == drawn[2]["served"]
        assert np.array_equal(plain[2]["modes"], drawn[2]["modes"])


def test_rgb_array_picture_shape_and_it_follows_the_plan():
    env = make(render_mode="rgb_array", deadline_s=[12.0, 13.0])
    assert env.unwrapped.render().shape == (*FRAME_SIZE_PX, 3)  # before reset: an empty chart, not an error
    env.reset(seed=0)
    first = env.render()
    assert first.shape == (*FRAME_SIZE_PX, 3) and first.dtype == np.uint8
    assert first.std() > 0  # something is drawn
    assert np.array_equal(first, env.render())  # rendering twice draws the same picture
    env.step(1)  # admit the first user to AD
    after_ad = env.render()
    assert after_ad.shape == first.shape and not np.array_equal(first, after_ad)
    # AD's blue compute bar appears once a user is admitted
    blue = np.all(np.abs(after_ad.astype(int) - (31, 119, 180)) <= 2, axis=-1).sum()
    assert blue > np.all(np.abs(first.astype(int) - (31, 119, 180)) <= 2, axis=-1).sum() + 100
    env.step(2)  # the next one to SD@1
    after_sd = env.render()
    orange = np.all(np.abs(after_sd.astype(int) - (255, 127, 14)) <= 2, axis=-1).sum()
    assert orange > 100 and not np.array_equal(after_ad, after_sd)


def test_ansi_lists_every_user_with_its_mode():
    env = make(render_mode="ansi", deadline_s=[12.0, 13.0])
    env.reset(seed=0)
    env.step(1)
    env.step(0)
    text = env.render()
    rows = text.splitlines()[5:]
    assert len(rows) == K
    assert rows[0].split()[-1] == "AD" and rows[1].split()[-1] == "reject" and rows[2].endswith("<- now")
    assert all(r.split()[-1] == "." for r in rows[3:])


@pytest.mark.parametrize("mode", ["ansi", "rgb_array"])
def test_vector_twin_renders_what_the_scalar_env_renders(mode):
    n, seed = 2, 3
    venv = gym.make_vec(envs.ENV_ID, num_envs=n, vectorization_mode="vector_entry_point", num_users=K, render_mode=mode)
    venv.reset(seed=seed)
    scalars = [make(render_mode=mode) for _ in range(n)]
    for i, env in enumerate(scalars):
        env.reset(seed=seed + i)
    for _ in range(3):
        actions = np.array([int(np.flatnonzero(m)[-1]) for m in venv.unwrapped.action_masks()])
        venv.step(actions)
        for i, env in enumerate(scalars):
            env.step(int(actions[i]))
    frames = venv.render()
    assert len(frames) == n
    for i, env in enumerate(scalars):
        expected = env.render()
        assert np.array_equal(frames[i], expected) if mode == "rgb_array" else frames[i] == expected
    assert gym.make_vec(envs.ENV_ID, num_envs=n, vectorization_mode="vector_entry_point", num_users=K).render() is None


def test_sb3_make_vec_env():
    # make_vec_env asks for render_mode="rgb_array" and wraps each env in Monitor + DummyVecEnv
    venv = make_vec_env(envs.ENV_ID, n_envs=2, seed=0, env_kwargs={"num_users": K})
    obs = venv.reset()
    assert obs.shape == (2, *make().observation_space.shape)
    masks = np.stack(venv.env_method("action_masks"))
    assert masks.shape == (2, 2 + make().unwrapped.cfg.max_gamma) and masks[:, 0].all()
    done_infos = []
    for _ in range(K):
        obs, rewards, dones, infos = venv.step(np.ones(2, dtype=np.int64))
        done_infos += [info for info, d in zip(infos, dones, strict=True) if d]
    assert len(done_infos) == 2 and all("episode" in info and "served" in info for info in done_infos)
    picture = venv.render(mode="rgb_array")
    assert picture.dtype == np.uint8 and picture.ndim == 3


def test_make_vec_env_works_for_v1_too():
    # SB3's make_vec_env asks for render_mode="rgb_array" and falls back only on a TypeError; v1 has
    # no rgb_array and refused it with a plain ValueError, so make_vec_env("EdgeSchedule-v1") failed
    venv = make_vec_env(envs.V1_ENV_ID, n_envs=2, seed=0, env_kwargs={"num_users": 4})
    assert venv.reset().shape[0] == 2
    with pytest.raises(ValueError, match="render_mode"):  # still a clear refusal for anyone else
        gym.make(envs.V1_ENV_ID, render_mode="rgb_array", num_users=4)


def test_v1_renders_before_its_first_reset():
    env = gym.make(envs.V1_ENV_ID, render_mode="ansi", num_users=4).unwrapped
    assert "reset" in env.render()  # was AttributeError: no attribute '_t'


@pytest.mark.parametrize("env_id", [envs.ENV_ID, envs.V1_ENV_ID])
def test_a_vector_envs_terminated_array_belongs_to_the_caller(env_id):
    # v0 kept the returned array as its own reset flags: the next step cleared the caller's copy (a
    # rollout buffer saw no episode end), and a caller editing it in place skipped the autoreset
    v = gym.make_vec(env_id, num_envs=2, vectorization_mode="vector_entry_point", num_users=3)
    v.reset(seed=0)
    kept = []
    for _ in range(8):
        _, _, term, _, _ = v.step(np.zeros(2, dtype=np.int64))
        kept.append(term)
    assert int(np.sum(kept)) == 4  # two episodes of three users in each of two sub-envs (as the sync mode counts)
    v.reset(seed=0)
    for _ in range(3):
        _, _, term, _, _ = v.step(np.zeros(2, dtype=np.int64))
    term[:] = False  # the caller's own array
    v.step(np.zeros(2, dtype=np.int64))  # autoresets as it should (was IndexError)
