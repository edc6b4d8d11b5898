"""The speed paths of EdgeSchedule-v1 take the general path's decisions and observations.

* vector twin: the look-ahead is copied as one slice when the sub-envs are in step and gathered per
  sub-env otherwise; both equal the per-element gather with a presence mask (the original encoding);
* scalar env: a plain ``int`` action skips ``action_index``; ints, numpy ints, integral floats and
  invalid actions give the same trajectory as the same actions passed through ``action_index``;
* ``round_features`` (a reset's v0 features without ``np.stack``) equals ``user_features``;
* ``ed_users``' popcount count of the proactive prefix (G a multiple of 8) equals the plain sum.
* the scalar env's per-pattern mask arrays: private copies from ``action_masks()``, cache eviction
  changes no trajectory.
"""

import numpy as np
import pytest

from envs.actions import action_index
from envs.edge_schedule_v1 import HEAD, USER_FEATURES, EdgeScheduleV1Env
from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv


@pytest.mark.parametrize("max_users", [None, 5, 20])
def test_vector_lookahead_equals_masked_gather(max_users):
    v = EdgeScheduleV1VectorEnv(num_envs=9, num_users=12, edge_fraction=0.5, max_users=max_users)
    v.reset(seed=1)
    k, km, rows = v.cfg.num_users, v.cfg.k_max, np.arange(9)
    rng = np.random.default_rng(0)
    for trial in range(30):
        v._t = np.full(9, rng.integers(0, k + 1)) if trial % 3 == 0 else rng.integers(0, k + 1, size=9)  # in step, and not
        obs, t, feats = v._encode(), v._t, v._data.feats[:, :k]
        idx = t[:, None] + 1 + np.arange(km)[None, :]
        assert np.array_equal(obs[:, :USER_FEATURES], feats[rows, np.minimum(t, k - 1)] * (t < k)[:, None])
        assert np.array_equal(obs[:, HEAD + v._na :].reshape(9, km, USER_FEATURES), feats[rows[:, None], np.minimum(idx, k - 1)] * (idx < k)[:, :, None])


def test_scalar_int_fast_path_same_trajectory():
    a_env, b_env = (EdgeScheduleV1Env(num_users=10, edge_fraction=0.7) for _ in range(2))
    n = a_env.action_space.n
    rng = np.random.default_rng(3)
    for ep in range(6):
        oa, _ = a_env.reset(seed=ep)
        ob, _ = b_env.reset(seed=ep)
        done = False
        while not done:
            m = a_env.action_masks()
            raw = [int(rng.choice(np.flatnonzero(m))), int(rng.integers(-2, n + 2)), np.int64(1), 2.0, 2.5, True][int(rng.integers(0, 6))]
            idx = action_index(raw, n)  # the general rule, as an int or -1
            oa, ra, done, _, ia = a_env.step(raw)
            ob, rb, done_b, _, ib = b_env.step(idx if idx >= 0 else n + 7)  # an out-of-range int: invalid as well
            assert np.array_equal(oa, ob) and ra == rb and done == done_b and ia["invalid_action"] == ib["invalid_action"]
        assert ia["served"] == ib["served"] and np.array_equal(ia["modes"], ib["modes"]) and np.array_equal(ia["ed_depth"], ib["ed_depth"])


@pytest.mark.parametrize("user_order", ["arrival", "slack", "output"])
def test_round_features_equal_v0_user_features(user_order):
    """round_features writes v0's eight features without stacking: the same float32 values."""
    from envs.config import EnvConfig
    from envs.edge_schedule import user_features
    from envs.edge_schedule_v1 import round_features
    from envs.workload import sample_round

    cfg = EnvConfig.from_kwargs(num_users=30, user_order=user_order, alpha=(0.3, 1.0), deadline_s=(0.5, 20.0))
    rng = np.random.default_rng(5)
    for _ in range(20):
        rnd = sample_round(rng, cfg)
        order = rnd.order(cfg.user_order)
        f = round_features(rnd, order, cfg)
        assert f.dtype == np.float32 and f.shape == (30, USER_FEATURES)
        assert np.array_equal(f[:, :8], user_features(rnd, order, cfg))


def test_ed_users_popcount_path_equals_sum_path():
    """ed_users counts the proactive prefix by popcount when G is a multiple of 8 and by a sum
    otherwise; depth j's values do not depend on G, so G = 8, 16 (popcount) and 9 (sum) agree."""
    from envs.split_plan import ed_users
    from envs.workload import sample_round

    env = EdgeScheduleV1Env(num_users=40, edge_fraction=1.0)
    rng = np.random.default_rng(2)
    for _ in range(10):
        rnd = sample_round(rng, env.cfg)
        by_g = {g: ed_users(env.split, rnd, g) for g in (8, 9, 16)}
        for g in (9, 16):
            for name in ("edge_s", "iterations", "tokens", "allowed"):
                assert np.array_equal(getattr(by_g[g], name)[:, :8], getattr(by_g[8], name)), (g, name)


def test_cached_mask_arrays_are_private_copies_and_eviction_changes_nothing():
    """Masks are converted once per pattern (cached bool/float32 arrays): action_masks() hands out a
    writable copy the caller may change, the observation's mask columns are the mask, and an env
    whose cache holds one pattern (evicting every step) plays the same trajectory as the default."""
    a_env, b_env = EdgeScheduleV1Env(num_users=12, edge_fraction=0.6), EdgeScheduleV1Env(num_users=12, edge_fraction=0.6)
    b_env.MASK_CACHE_MAX = 1
    n = a_env.action_space.n
    rng = np.random.default_rng(11)
    for ep in range(8):
        oa, _ = a_env.reset(seed=ep)
        ob, _ = b_env.reset(seed=ep)
        done = False
        while not done:
            m = a_env.action_masks()
            assert m.dtype == bool and m.flags.writeable and np.array_equal(m, b_env.action_masks())
            assert np.array_equal(oa[HEAD : HEAD + n], m.astype(np.float32)) and np.array_equal(oa, ob)
            a = int(rng.choice(np.flatnonzero(m))) if ep % 2 == 0 else int(rng.integers(0, n))
            m[:] = ~m  # the caller's copy: the env must not see this
            assert not np.array_equal(m, a_env.action_masks())
            oa, ra, done, _, ia = a_env.step(a)
            ob, rb, done_b, _, ib = b_env.step(a)
            assert ra == rb and done == done_b and ia["invalid_action"] == ib["invalid_action"]
        assert np.array_equal(oa, ob) and ia["served"] == ib["served"] and np.array_equal(ia["modes"], ib["modes"])
        assert not a_env.action_masks()[1:].any()  # after the last user only reject is offered
