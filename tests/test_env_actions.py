"""Action range and episode boundaries on every env path: scalar env, ScalarPlan, PlanBuilder, vector env.

DESIGN.md §3: an action outside the mask -- or one that names no action at all (negative,
``>= 2 + G``, non-integral, NaN) -- is accepted, treated as reject and flagged in ``info``. It must
never be truncated or clipped onto a real action (1.5 -> AD, 99 -> SD@G).
"""

import math

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import envs
from envs import REJECT, SD, CostModel, EnvConfig, sample_round
from envs.edge_schedule import action_index, action_indices
from envs.edge_schedule_vector import EdgeScheduleVectorEnv
from envs.plan_builder import PlanBuilder, ScalarPlan

K = 6
G = 8
N_ACTIONS = 2 + G
# numbers that name no action of Discrete(10)
BAD_ACTIONS = [-1, -100, N_ACTIONS, N_ACTIONS + 1, 99, 2**40, 1.5, 2.5, 0.2, -0.5, 9.999, math.nan, math.inf, -math.inf, 1e30]


def scalar(**kw):
    return gym.make(envs.ENV_ID, **{"num_users": K, **kw}).unwrapped


def _state(env):
    p = env._plan
    return (list(p.b), list(p.s_max), list(p.n_max), list(p.sum_out), list(p.share), list(p.mem), p.gamma, p.j_max)


# ------------------------------------------------------------------ the conversion itself
@pytest.mark.parametrize("bad", BAD_ACTIONS)
def test_action_index_names_no_action(bad):
    assert action_index(bad, N_ACTIONS) == -1


@pytest.mark.parametrize(("good", "want"), [(0, 0), (1, 1), (9, 9), (np.int64(3), 3), (np.float32(1.0), 1), (2.0, 2), (np.array(4), 4), (np.array([5]), 5), (True, 1)])
def test_action_index_keeps_real_actions(good, want):
    assert action_index(good, N_ACTIONS) == want


def test_action_indices_shape_and_dtype():
    got = action_indices(np.array([[1], [2]]), 2, N_ACTIONS)  # a column of actions is fine
    assert got.shape == (2,) and got.dtype == np.int64 and got.tolist() == [1, 2]
    got = action_indices(np.array([1.0, 2.5, 9.0]), 3, N_ACTIONS)
    assert got.dtype == np.int64 and got.tolist() == [1, -1, 9]
    assert action_indices(np.array([True, False]), 2, N_ACTIONS).tolist() == [1, 0]
    got = action_indices(np.array(["1", None, 3, 2.0], dtype=object), 4, N_ACTIONS)
    assert got.dtype == np.int64 and got.tolist() == [-1, -1, 3, 2]


def test_action_index_rejects_several_actions_with_a_clear_error():
    with pytest.raises(ValueError, match="one integer"):
        action_index([1, 2], N_ACTIONS)
    with pytest.raises(ValueError, match="one action per sub-env"):
        action_indices([1, 2, 3], 2, N_ACTIONS)


@given(st.lists(st.one_of(st.integers(-(2**62), 2**62), st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=8))
def test_action_indices_agree_with_action_index(values):
    """The vector conversion equals the scalar one element by element, for ints and floats alike."""
    for dtype in (np.int64, np.float64):
        if dtype is np.int64 and any(isinstance(v, float) for v in values):
            continue
        arr = np.array(values, dtype=dtype)
        got = action_indices(arr, len(values), N_ACTIONS)
        want = [action_index(v, N_ACTIONS) for v in arr]
        assert got.tolist() == want
        assert np.all((got == -1) | ((got >= 0) & (got < N_ACTIONS)))


# ------------------------------------------------------------------ scalar env
@pytest.mark.parametrize("bad", BAD_ACTIONS)
def test_scalar_env_bad_action_is_reject_and_flagged(bad):
    """Stepping a nameless action gives exactly what stepping reject gives, plus the flag."""
    env, ref = scalar(), scalar()
    o0, _ = env.reset(seed=4)
    ref.reset(seed=4)
    obs, r, term, trunc, info = env.step(bad)
    obs_ref, r_ref, _, _, info_ref = ref.step(0)
    assert info["invalid_action"] is True and info_ref["invalid_action"] is False
    assert r == r_ref == 0.0 and not term and not trunc
    assert env._modes[0] == REJECT
    assert np.array_equal(obs, obs_ref)
    assert _state(env) == _state(ref)


def test_scalar_env_masked_out_action_is_reject_and_flagged():
    # memory below the LLM's weights: every admission is masked out, only reject is allowed
    env = scalar(memory_bytes=1e9)
    env.reset(seed=0)
    for t in range(K):
        mask = env.action_masks()
        assert mask.tolist() == [True] + [False] * (N_ACTIONS - 1)
        _, r, term, _, info = env.step(1 + t % (N_ACTIONS - 1))  # AD, SD@1, SD@2, ...
        assert info["invalid_action"] is True and r == 0.0
        assert term == (t == K - 1)
    assert info["rejected"] == K and info["served"] == 0 and info["admitted_ad"] == info["admitted_sd"] == 0


def test_scalar_env_sd_depth_is_fixed_by_first_sd_admission():
    env = scalar(deadline_s=[12.0, 13.0], input_tokens=[1, 4], output_tokens=[1, 4])
    env.reset(seed=1)
    assert env.action_masks()[1 + 3]  # SD@3 allowed for an easy user
    _, r, _, _, info = env.step(1 + 3)
    assert r == 1.0 and not info["invalid_action"] and env._plan.gamma == 3
    mask = env.action_masks()
    assert mask[1] and np.flatnonzero(mask[2:]).tolist() == [2]  # AD, and among SD only SD@3
    before = _state(env)
    _, r, _, _, info = env.step(1 + 5)  # SD@5 after the depth was fixed at 3: masked out
    assert info["invalid_action"] is True and r == 0.0 and env._modes[1] == REJECT
    assert _state(env) == before


def test_scalar_env_integral_numpy_actions_are_those_actions():
    for a in (np.int64(1), np.int32(1), np.float32(1.0), np.array(1), 1.0):
        env = scalar(deadline_s=[12.0, 13.0])
        env.reset(seed=2)
        _, r, _, _, info = env.step(a)
        assert r == 1.0 and not info["invalid_action"] and env._plan.b == [1, 0], a


def test_scalar_env_episode_boundaries():
    env = scalar()
    for seed in (0, 1):
        env.reset(seed=seed)
        for t in range(K):
            _, _, term, trunc, info = env.step(0)
            assert not trunc
            assert term == (t == K - 1)
            assert ("served" in info) == (t == K - 1)
        with pytest.raises(RuntimeError, match=r"^step\(\) called after the episode ended; call reset\(\)$"):
            env.step(0)
    assert info["rejected"] == K and info["modes"].tolist() == [REJECT] * K
    assert env.action_masks().tolist() == [True] + [False] * (N_ACTIONS - 1)


def test_scalar_env_step_before_reset_raises():
    with pytest.raises(RuntimeError, match="reset"):
        scalar().step(0)


# ------------------------------------------------------------------ ScalarPlan and PlanBuilder directly
CFG = EnvConfig(num_users=K, deadline_s=[12.0, 13.0])
COST = CostModel.from_config(CFG)


def _user(rnd, k):
    return int(rnd.input_tokens[k]), int(rnd.output_tokens[k]), float(rnd.alpha[k]), float(rnd.uplink_s[k]), float(rnd.slack_s[k])


@pytest.mark.parametrize("bad", [-1, -5, N_ACTIONS, N_ACTIONS + 7])
def test_scalar_plan_out_of_range_is_refused(bad):
    rnd = sample_round(np.random.default_rng(0), CFG)
    p = ScalarPlan(COST, G)
    masks = p.prepare(*_user(rnd, 0))
    assert all(masks)  # an easy user: every action is allowed, so only the range can refuse
    assert p.apply(bad) is False
    assert p.b == [0, 0] and p.gamma == 0 and p.mem == [0.0, 0.0]
    with pytest.raises(RuntimeError, match="prepare"):
        p.apply(1)  # the prepared user was consumed by the refused action


def test_taken_builder_needs_its_own_prepare():
    b = PlanBuilder(COST, 2, G)
    with pytest.raises(RuntimeError, match="before prepare"):
        b.take([1, 0]).apply(np.zeros(2, dtype=np.int64))


def test_apply_before_prepare_raises():
    with pytest.raises(RuntimeError, match=r"^ScalarPlan.apply called before prepare\(\) for this user$"):
        ScalarPlan(COST, G).apply(0)
    with pytest.raises(RuntimeError, match=r"^PlanBuilder.apply called before prepare\(\) for this user$"):
        PlanBuilder(COST, 2, G).apply(np.zeros(2, dtype=np.int64))


@pytest.mark.parametrize("bad", [-1, -5, -100, N_ACTIONS, N_ACTIONS + 7, 2**40])
def test_plan_builder_out_of_range_is_refused(bad):
    rnd = sample_round(np.random.default_rng(0), CFG)
    b = PlanBuilder(COST, 3, G)
    users = [np.repeat(np.asarray(x[:1]), 3) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)]
    masks = b.prepare(*users)
    assert masks.all()
    valid = b.apply(np.array([bad, 1, 1 + G]))
    assert valid.tolist() == [False, True, True]
    assert b.b[:, 0].tolist() == [0, 0] and b.gamma[0] == 0 and b.mem[:, 0].tolist() == [0.0, 0.0]
    assert b.b[:, 1].tolist() == [1, 0] and b.b[:, 2].tolist() == [0, 1] and b.gamma[2] == G


def test_plan_builder_takes_a_column_of_actions():
    rnd = sample_round(np.random.default_rng(0), CFG)
    b = PlanBuilder(COST, 2, G)
    b.prepare(*[np.repeat(np.asarray(x[:1]), 2) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)])
    assert b.apply(np.array([[1], [3]])).tolist() == [True, True]
    assert b.b.tolist() == [[1, 0], [0, 1]] and b.gamma.tolist() == [0, 2]


def test_plan_builder_resets_only_the_chosen_rounds():
    rnd = sample_round(np.random.default_rng(0), CFG)
    b = PlanBuilder(COST, 2, G)
    b.prepare(*[np.repeat(np.asarray(x[:1]), 2) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)])
    b.apply(np.array([1 + G, 1 + G]))
    b.prepare(*[np.repeat(np.asarray(x[:1]), 2) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)])
    b.reset(np.array([True, False]))
    assert b.b[:, 0].tolist() == [0, 0] and b.b[:, 1].tolist() == [0, 1]
    assert b.gamma.tolist() == [0, G] and int(b.j_max[0]) == 0 and int(b.j_max[1]) >= 1
    assert np.isinf(b.slack_min[:, 0]).all() and b.mem[1, 1] > 0 and b.mem[1, 0] == 0.0
    with pytest.raises(RuntimeError, match="before prepare"):  # a reset drops the prepared user
        b.apply(np.zeros(2, dtype=np.int64))
    b.reset([False, True])  # a plain list works too
    assert b.b.sum() == 0 and b.gamma.tolist() == [0, 0]


def test_plan_builder_masked_out_is_refused():
    cost = CostModel(COST.profile.with_memory(1e9))  # below the weights: only reject fits
    rnd = sample_round(np.random.default_rng(0), CFG)
    b = PlanBuilder(cost, 2, G)
    users = [np.repeat(np.asarray(x[:1]), 2) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)]
    masks = b.prepare(*users)
    assert masks[:, 0].all() and not masks[:, 1:].any()
    assert b.apply(np.array([1, 2])).tolist() == [False, False]
    assert b.b.sum() == 0
    with pytest.raises(RuntimeError, match="prepare"):
        b.apply(np.array([0, 0]))


# ------------------------------------------------------------------ vector env
def vector(n=4, **kw):
    return EdgeScheduleVectorEnv(num_envs=n, **{"num_users": K, **kw})


def test_vector_env_bad_actions_are_reject_and_flagged_per_sub_env():
    v, ref = vector(), vector()
    v.reset(seed=7)
    ref.reset(seed=7)
    bad = [-1, N_ACTIONS, 1.5, math.nan]
    obs, r, term, _, info = v.step(np.array(bad, dtype=float))
    obs_ref, r_ref, _, _, info_ref = ref.step(np.zeros(4, dtype=np.int64))
    assert info["invalid_action"].tolist() == [True] * 4 and not info_ref["invalid_action"].any()
    assert info["_invalid_action"].all()
    assert r.tolist() == r_ref.tolist() == [0.0] * 4 and not term.any()
    assert np.array_equal(obs, obs_ref)
    assert np.array_equal(v._builder.b, ref._builder.b) and (v._modes[:, 0] == REJECT).all()


def test_vector_env_mixed_actions_only_flag_the_bad_ones():
    v = vector(deadline_s=[12.0, 13.0])
    v.reset(seed=3)
    assert v.action_masks().all()
    _, r, _, _, info = v.step(np.array([1, 99, 1 + G, -3]))
    assert info["invalid_action"].tolist() == [False, True, False, True]
    assert r.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert v._modes[:, 0].tolist() == [1, REJECT, SD, REJECT]
    assert v._builder.gamma.tolist() == [0, 0, G, 0]


def test_vector_env_masked_out_is_flagged():
    v = vector(memory_bytes=1e9)
    v.reset(seed=0)
    assert not v.action_masks()[:, 1:].any()
    _, r, _, _, info = v.step(np.array([1, 2, 5, 0]))
    assert info["invalid_action"].tolist() == [True, True, True, False] and r.sum() == 0.0


def test_vector_env_rejects_wrong_number_of_actions():
    v = vector()
    v.reset(seed=0)
    with pytest.raises(ValueError, match="one action per sub-env"):
        v.step(np.array([0, 0]))


def _scalar_twins(n, seed, **kw):
    twins = [scalar(**kw) for _ in range(n)]
    first = [e.reset(seed=seed + i)[0] for i, e in enumerate(twins)]
    return twins, np.stack(first)


def test_vector_env_next_step_autoreset_ignores_any_action():
    n = 3
    v = vector(n)
    obs, _ = v.reset(seed=20)
    twins, first = _scalar_twins(n, 20)
    assert np.array_equal(obs, first)
    for t in range(K):
        obs, r, term, _, info = v.step(np.zeros(n, dtype=np.int64))
        assert term.tolist() == [t == K - 1] * n
    assert term.all() and info["_served"].all() and info["rejected"].tolist() == [K] * n
    # the autoreset step: the action is ignored, even a nameless one, and nothing is flagged
    masks_at_end = v.action_masks()
    assert masks_at_end.tolist() == [[True] + [False] * (N_ACTIONS - 1)] * n
    obs, r, term, trunc, info = v.step(np.array([99, -1, 1]))
    assert r.tolist() == [0.0] * n and not term.any() and not trunc.any()
    assert not info["invalid_action"].any() and not info["_invalid_action"].any()
    assert "served" not in info
    second = np.stack([e.reset()[0] for e in twins])  # the twins continue their seed streams
    assert np.array_equal(obs, second)


TWIN_CONFIGS = [
    {"deadline_s": [1.0, 13.0]},
    {"reward_timing": "episode_end", "user_order": "deadline"},
    # prediction error: admitted users can be late (reward -late at the end), SD drawn token by token
    {"output_cv": 0.6, "alpha_cv": 0.4, "simulate_acceptance": True, "user_order": "slack", "deadline_s": [0.5, 4.0]},
]


@pytest.mark.parametrize("kw", TWIN_CONFIGS)
def test_vector_env_same_step_final_obs_and_info_match_scalar_twins(kw):
    n = 3
    v = vector(n, autoreset_mode="same_step", **kw)
    v.reset(seed=30)
    twins, _ = _scalar_twins(n, 30, **kw)
    rng = np.random.default_rng(0)
    late = 0
    for _ in range(2 * K):  # two episodes: the second starts from the same-step reset
        masks = v.action_masks()
        acts = np.array([int(rng.choice(np.flatnonzero(m))) for m in masks])
        obs, r, term, trunc, info = v.step(acts)
        assert trunc.dtype == bool and not trunc.any() and term.dtype == bool
        for i, e in enumerate(twins):
            o, ri, ti, _, inf_i = e.step(int(acts[i]))
            assert r[i] == ri and term[i] == ti
            if ti:
                assert np.array_equal(info["final_obs"][i], o)
                for key in ("served", "admitted_ad", "admitted_sd", "rejected", "late", "gamma", "z", "lam"):
                    assert info[key][i] == inf_i[key], key
                assert info["_final_obs"][i]
                late += inf_i["late"]
                o, _ = e.reset()
            else:
                assert "final_obs" not in info
            # same step: after an end the returned observation is already the next round's first
            assert np.array_equal(obs[i], o)
    assert v.action_masks()[:, 0].all()
    if kw.get("output_cv"):
        assert late > 0  # the reward's end-of-episode correction was exercised


def test_vector_env_bad_autoreset_mode_and_num_envs():
    with pytest.raises(ValueError, match="autoreset_mode"):
        vector(autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="num_envs"):
        vector(0)
    with pytest.raises(ValueError, match="seeds"):
        vector(2).reset(seed=[1, 2, 3])


@pytest.mark.parametrize("bad", [1.5, 2.9, 0.2, float("nan"), float("inf"), -0.5])
def test_plan_builder_refuses_non_integral_actions(bad):
    """Called directly (not through an env), the builder applies the env's action rule too: a
    non-integral action names no action and is refused, never truncated onto AD or SD@1."""
    rnd = sample_round(np.random.default_rng(0), CFG)
    b = PlanBuilder(COST, 3, G)
    b.prepare(*[np.repeat(np.asarray(x[:1]), 3) for x in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s)])
    valid = b.apply(np.array([bad, 1.0, 2.0]))
    assert valid.tolist() == [False, True, True]
    assert b.b[:, 0].tolist() == [0, 0] and b.gamma[0] == 0
    assert b.b[:, 1].tolist() == [1, 0] and b.b[:, 2].tolist() == [0, 1] and b.gamma[2] == 1
