"""The v1 vector env's batched resets (envs.split_reset_batch) and final infos (envs.split_final_batch)
change no value: rounds, loaded arrays, observations, rewards, terminations, masks and infos equal the
one-round-at-a-time path (and the scalar env) bit for bit."""

from __future__ import annotations

from dataclasses import fields

import gymnasium as gym
import numpy as np
import pytest

import envs
from envs.config import EnvConfig
from envs.edge_schedule_v1 import final_info, make_models, round_features
from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv
from envs.plan import AD, ED, REJECT, SD, Plan
from envs.split_final_batch import KEYS, final_infos, outcome_latency
from envs.split_outcome import evaluate_split_plan
from envs.split_plan import ed_users
from envs.split_reset_batch import V1Rounds, load_rounds, sample_rounds
from envs.workload import Round, sample_round

SPLIT = "split_a100-40gb_llama2-7b_tinyllama-1.1b"


def _load_one(data: V1Rounds, i: int, rnd: Round, env) -> None:
    """The per-round load the batched one replaced (kept here as the reference)."""
    cfg = env.cfg
    order = rnd.order(cfg.user_order)
    r = rnd.subset(order)
    data.rounds[i] = rnd
    data.order[i] = order
    data.inp[i], data.out[i], data.alpha[i] = r.input_tokens, r.output_tokens, r.alpha
    data.up[i], data.slack[i], data.deadline[i] = r.uplink_s, r.slack_s, r.deadline_s
    data.feats[i, : len(order)] = round_features(rnd, order, cfg)
    if env.split is not None and rnd.has_edge is not None and rnd.has_edge.any():
        users = data.users[i] = ed_users(env.split, rnd, cfg.max_gamma)
        data.ed_j[i], data.ed_x[i], data.ed_ok[i], data.prefill[i] = users.iterations[order], users.edge_s[order], users.allowed[order], users.prefill_s[order]
    else:
        data.users[i] = None
        data.ed_j[i], data.ed_x[i], data.ed_ok[i], data.prefill[i] = 1, 0.0, False, 0.0


class _PerEnvVector(EdgeScheduleV1VectorEnv):
    """The vector env loading one round at a time, each drawn by ``sample_round`` (the old path)."""

    def _load_rounds(self, idx, rounds):
        for i in idx.tolist():
            _load_one(self._data, i, rounds[i] if rounds is not None else sample_round(self._rngs[i], self.cfg), self)


def _same_round(a: Round, b: Round) -> None:
    for f in fields(Round):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert (x is None) == (y is None), f.name
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), f.name


def _same_data(a: V1Rounds, b: V1Rounds) -> None:
    for name in ("order", "inp", "out", "alpha", "up", "slack", "deadline", "prefill", "ed_j", "ed_x", "ed_ok", "feats"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for ra, rb in zip(a.rounds, b.rounds, strict=True):
        assert (ra is None) == (rb is None)
        if ra is not None:
            _same_round(ra, rb)
    for ua, ub in zip(a.users, b.users, strict=True):
        assert (ua is None) == (ub is None)
        if ua is not None:
            for f in fields(ua):
                assert np.array_equal(getattr(ua, f.name), getattr(ub, f.name)), f.name


@pytest.mark.parametrize("extra", [
    {},
    {"alpha_cv": 0.3, "output_cv": 0.4},
    {"output_cv": 0.5, "output_tail_nu": 4.0, "rtt_distribution": "loguniform", "rtt_ms": [2.0, 80.0]},
    {"edge_fraction": 0.0},
    {"edge_fraction": 1.0, "num_users": 1},
])
def test_sample_rounds_equal_sample_round_and_leave_the_generators_alike(extra):
    cfg = EnvConfig(**{"num_users": 7, "profile": SPLIT, "edge_fraction": 0.5, **extra})
    seeds = list(range(20, 33))
    mine = [np.random.default_rng(s) for s in seeds]
    theirs = [np.random.default_rng(s) for s in seeds]
    for _ in range(3):  # several rounds from each stream
        got, big = sample_rounds(mine, cfg)
        want = [sample_round(g, cfg) for g in theirs]
        for a, b in zip(got, want, strict=True):
            _same_round(a, b)
        assert big.num_users == len(seeds) * cfg.num_users
    assert all(a.bit_generator.state == b.bit_generator.state for a, b in zip(mine, theirs, strict=True))
    assert all(a.random() == b.random() for a, b in zip(mine, theirs, strict=True))  # and spawn counters: the same next child
    assert all(a.spawn(1)[0].random() == b.spawn(1)[0].random() for a, b in zip(mine, theirs, strict=True))


@pytest.mark.parametrize("user_order", ["arrival", "deadline", "slack_desc"])
@pytest.mark.parametrize("edge_fraction", [0.0, 0.5, 1.0])
def test_load_rounds_equals_the_per_round_load_on_any_subset(user_order, edge_fraction):
    k, n = 6, 9
    env = EdgeScheduleV1VectorEnv(num_envs=n, num_users=k, max_gamma=4, edge_fraction=edge_fraction, user_order=user_order)
    cfg = env.cfg
    ref = V1Rounds(n, k, cfg.max_gamma, cfg.k_max)
    got = V1Rounds(n, k, cfg.max_gamma, cfg.k_max)
    rng = np.random.default_rng(5)
    for step in range(6):
        idx = np.flatnonzero(rng.random(n) < 0.6)
        rounds = [sample_round(np.random.default_rng(100 * step + int(i)), cfg) for i in idx]
        if step % 2:  # given rounds, some without edge information (bare rounds: no ED, features 0)
            rounds[0] = Round.from_arrays(cfg, [5] * k, [7] * k, [3.0] * k, [0.8] * k, [50.0] * k)
            if len(rounds) > 1:
                rounds[1].rtt_s = None
        for j, i in enumerate(idx.tolist()):
            _load_one(ref, i, rounds[j], env)
        load_rounds(got, idx, rounds, cfg, env.split)
        _same_data(ref, got)


def _play(venvs, scalars, steps: int, rng: np.random.Generator) -> None:
    """Step every vector env (and the scalar envs, sub-env i = scalar i) with the same random actions
    (mostly allowed ones, some not) and require identical results."""
    head = venvs[0]
    n = head.num_envs
    ended = np.zeros(n, dtype=bool)
    returned = None
    for _ in range(steps):
        masks = head.unwrapped.action_masks()
        for v in venvs[1:]:
            assert np.array_equal(v.unwrapped.action_masks(), masks)
        acts = np.array([int(rng.choice(np.flatnonzero(m))) if rng.random() < 0.9 else int(rng.integers(masks.shape[1])) for m in masks])
        results = [v.step(acts) for v in venvs]
        if returned is not None:  # the last step's terminations, as handed out, are not cleared by this step's resets
            assert np.array_equal(*returned)
        obs, rew, term, trunc, info = results[0]
        for o, r, t, tr, inf in results[1:]:
            assert np.array_equal(o, obs) and np.array_equal(r, rew) and np.array_equal(t, term) and np.array_equal(tr, trunc)
            assert inf.keys() == info.keys() and all(np.array_equal(inf[key], info[key]) for key in info)
        for i, e in enumerate(scalars):
            if ended[i]:  # the vector env reset this sub-env on this step (next_step autoreset)
                o, _ = e.reset()
                assert rew[i] == 0.0 and not term[i]
            else:
                assert np.array_equal(e.unwrapped.action_masks(), masks[i])
                o, r, t, _, inf = e.step(int(acts[i]))
                assert r == rew[i] and t == term[i] and inf["invalid_action"] == info["invalid_action"][i]
                if t:
                    for key in ("served", "admitted_ad", "admitted_sd", "admitted_ed", "rejected", "late", "gamma", "z", "ed_share", "lam"):
                        assert inf[key] == info[key][i], key
            if not term[i]:
                assert np.array_equal(o, obs[i])
        ended = term.copy()
        returned = (term, term.copy())


@pytest.mark.parametrize("k, edge_fraction, seed", [
    (3, 0.0, 0), (3, 0.5, 1), (3, 1.0, 2), (8, 0.5, 3), (50, 0.0, 4), (50, 0.5, 5), (50, 1.0, 6),
])
def test_batched_vector_env_equals_the_per_env_path_and_the_scalar_env(k, edge_fraction, seed):
    n = 5
    kw = {"num_users": k, "edge_fraction": edge_fraction}
    batched = gym.make_vec(envs.V1_ENV_ID, num_envs=n, vectorization_mode="vector_entry_point", **kw)
    per_env = _PerEnvVector(num_envs=n, **kw)
    scalars = [gym.make(envs.V1_ENV_ID, **kw) for _ in range(n)]
    o1, _ = batched.reset(seed=seed)
    o2, _ = per_env.reset(seed=seed)
    assert np.array_equal(o1, o2)
    for i, e in enumerate(scalars):
        assert np.array_equal(e.reset(seed=seed + i)[0], o1[i])
    _play([batched, per_env], scalars, 3 * (k + 1) + 2, np.random.default_rng(seed))


@pytest.mark.parametrize("extra", [
    {"output_cv": 0.3, "alpha_cv": 0.2},  # ED rounds realising other values take final_info; the others the batch
    {"reward_timing": "episode_end", "user_order": "deadline"},
    {"completion": "own", "edge_fraction": 1.0},  # outcome models final_infos does not cover: final_info per round
    {"sharing": "work_conserving", "max_gamma": 3},
    {"profile": "rtx4090_llama2-7b_tinyllama-1.1b", "edge_fraction": 0.0},  # no split model at all
    {"num_users": 1, "edge_fraction": 1.0},
])
def test_batched_vector_env_equals_the_scalar_env_under_other_configs(extra):
    n, seed = 6, 21
    kw = {"num_users": 5, "edge_fraction": 0.5, **extra}
    batched = EdgeScheduleV1VectorEnv(num_envs=n, **kw)
    per_env = _PerEnvVector(num_envs=n, **kw)
    scalars = [gym.make(envs.V1_ENV_ID, **kw) for _ in range(n)]
    o1, _ = batched.reset(seed=seed)
    assert np.array_equal(per_env.reset(seed=seed)[0], o1)
    for i, e in enumerate(scalars):
        assert np.array_equal(e.reset(seed=seed + i)[0], o1[i])
    _play([batched, per_env], scalars, 5 * (kw["num_users"] + 1), np.random.default_rng(seed))


@pytest.mark.parametrize("extra", [{"user_order": "slack"}, {"alpha_cv": 0.2, "output_cv": 0.3, "simulate_acceptance": True}])
def test_batched_vector_env_equals_the_per_env_path_with_options(extra):
    n, k = 4, 6
    kw = {"num_users": k, "edge_fraction": 0.5, "max_gamma": 3, **extra}
    batched = EdgeScheduleV1VectorEnv(num_envs=n, **kw)
    per_env = _PerEnvVector(num_envs=n, **kw)
    cfg = make_models(kw)[0]
    rounds = [sample_round(np.random.default_rng(s), cfg) for s in range(n)]
    rounds[1] = Round.from_arrays(cfg, [5] * k, [7] * k, [3.0] * k, [0.8] * k, [50.0] * k)  # no edge information
    for v in (batched, per_env):
        v.reset(seed=[11, 12, 13, 14], options={"rounds": rounds})
    _play([batched, per_env], [], 4 * (k + 1), np.random.default_rng(9))


@pytest.mark.parametrize("edge_fraction, output_cv", [(0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.5, 0.4)])
def test_final_infos_equal_final_info_on_random_plans(edge_fraction, output_cv):
    k, g_max, t = 9, 8, 60
    cfg, cost, split, _ = make_models({"num_users": k, "max_gamma": g_max, "edge_fraction": edge_fraction, "output_cv": output_cv})
    rng = np.random.default_rng(3)
    rounds = [sample_round(np.random.default_rng(s), cfg) for s in range(t)]
    users = [ed_users(split, r, g_max) for r in rounds]
    modes = rng.integers(0, 4, size=(t, k)).astype(np.int8)
    edge = np.stack([r.has_edge for r in rounds])
    if output_cv:  # ED users' constants are priced on the predictions: final_infos takes only rounds without ED users then
        modes[modes == ED] = AD
    modes[(modes == ED) & ~edge] = REJECT
    modes[rng.random(t) < 0.15] = REJECT  # some rounds admit nobody
    depth = np.where(modes == ED, rng.integers(1, g_max + 1, size=(t, k)), 0)
    gamma = np.where((modes == SD).any(axis=1), rng.integers(1, g_max + 1, size=t), 0)
    raw = rng.random((t, 3))
    raw[rng.random(t) < 0.1, 0] = 0.0  # a zero share: its batch never ends
    shares = np.column_stack([raw[:, 0] / 2, raw[:, 1] / 2, raw[:, 2]])
    per_user = [np.stack([getattr(r, name) for r in rounds]) for name in ("input_tokens", "realized_output_tokens", "realized_alpha", "uplink_s", "realized_downlink_s")]
    per_user += [modes, depth, gamma, shares] + [np.stack([getattr(u, name) for u in users]) for name in ("iterations", "edge_s", "prefill_s")]
    got = final_infos(cost, *per_user[:5], np.stack([r.deadline_s for r in rounds]), *per_user[5:])
    latency = outcome_latency(cost, *per_user)
    served = 0
    for i, r in enumerate(rounds):
        want = final_info(cfg, cost, split, r, np.arange(k), modes[i], depth[i], int(gamma[i]), tuple(shares[i].tolist()), np.random.default_rng(0), users[i])
        for key in KEYS:
            assert got[key][i] == want[key], (i, key)
        n_ed = int((modes[i] == ED).sum())
        plan = Plan(modes[i], gamma=max(int(gamma[i]), 1), z=float(shares[i, 0]), lam=float(shares[i, 2]), ed_depth=depth[i] if n_ed else None,
                    ed_share=float(shares[i, 1]))
        assert np.array_equal(latency[i], evaluate_split_plan(cost, split, r, plan, users=users[i]).latency_s)  # bit for bit, not only the counts
        served += want["served"]
    assert served > 0


@pytest.mark.parametrize("cast", ["rtt_s", "uplink_s", "deadline_s", "downlink_s"])
@pytest.mark.parametrize("which", ["one", "all"])
def test_given_rounds_in_float32_observe_as_the_scalar_env(cast, which):
    """Given rounds whose arrays are float32 (in one round, or in all): the features are computed in
    each round's own dtype, as the scalar env does. (Concatenating float32 next to float64 rounds cast
    them, and rtt / 0.1 in float64 differs from float32's by a float32 step: a red-team's find.)"""
    from dataclasses import replace

    kw = {"profile": SPLIT, "num_users": 6, "edge_fraction": 1.0, "rtt_ms": [1.0, 80.0]}
    cfg = make_models(dict(kw))[0]
    for seed in range(8):
        rounds = [sample_round(np.random.default_rng(100 * seed + j), cfg) for j in range(3)]
        rounds = [replace(r, **{cast: getattr(r, cast).astype(np.float32)}) if which == "all" or j == 1 else r for j, r in enumerate(rounds)]
        venv = gym.make_vec(envs.V1_ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", **kw)
        obs, _ = venv.reset(seed=seed, options={"rounds": rounds})
        masks = venv.unwrapped.action_masks()
        for j, rnd in enumerate(rounds):
            env = gym.make(envs.V1_ENV_ID, **kw)
            o, _ = env.reset(seed=seed, options={"round": rnd})
            assert np.array_equal(obs[j], o), (cast, which, seed, j)
            assert np.array_equal(masks[j], env.unwrapped.action_masks()), (cast, which, seed, j)
