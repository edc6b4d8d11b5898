"""EdgeSchedule-v1's trajectories are pinned: the speed work must not change a single decision.

``tests/data/env_v1_golden.json`` holds, per case, one SHA-256 (first 16 hex digits) per random
trajectory -- every observation's bytes, mask, reward, flags and the final ``info`` -- recorded with
the implementation before the step was optimised (the straightforward one of commit 06c541c).
300 trajectories over six configurations (K = 10..50, edge fractions 0..1, G = 4 and 8, proactive
off, interrupt immediate, padded KV, prediction error, a short look-ahead, ``episode_end`` rewards);
actions are mostly uniform among the allowed ones, some arbitrary (invalid or out of range) ints
and numpy ints.

The golden hashes also depend on the closed-form models the env calls (``envs.cost_model``,
``envs.split_cost``, the workload sampler). Each case stores a fingerprint of those models' outputs
on its rounds; if the models change (another issue's legitimate change), the hashes no longer
apply and the test is skipped with that reason -- regenerate with
``python -m tests.test_env_v1_golden`` *from an env implementation known to be right*.

The fingerprint rounds the models' float outputs to :data:`FINGERPRINT_DIGITS` significant digits
before hashing: numpy's vectorised ``exp``/``log`` give results a few ulps apart on hosts with and
without AVX-512 (up to 9e-16 relative here, with ``NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL"``),
which made an exact-bytes fingerprint skip every case on hosts without AVX-512 although the
trajectories themselves were bitwise equal there (every observation, mask, reward and ``info``,
checked on all 300; ``test_fingerprint_ignores_ulps_and_sees_real_changes``). The rounded
fingerprints were written into the golden file on a host where the exact ones and all 300 hashes
still matched; the hashes themselves are the ones first recorded.
:func:`test_scalar_env_matches_the_vector_twin_on_random_trajectories` is the independent check
that survives model changes (the numpy builder is a separate implementation of the same rules).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from envs.edge_schedule_v1 import EdgeScheduleV1Env
from envs.edge_schedule_v1_vector import EdgeScheduleV1VectorEnv
from envs.split_plan import ed_users

GOLDEN = Path(__file__).parent / "data" / "env_v1_golden.json"
#: case name -> (env kwargs, episodes)
CASES: dict[str, tuple[dict, int]] = {
    "k12_ef05": ({"num_users": 12, "edge_fraction": 0.5}, 100),
    "k50_ef05": ({"num_users": 50, "edge_fraction": 0.5}, 30),
    "k12_ef1_g4": ({"num_users": 12, "edge_fraction": 1.0, "max_gamma": 4}, 60),
    "k12_ef0": ({"num_users": 12, "edge_fraction": 0.0}, 30),
    "k10_mixed": ({"num_users": 10, "edge_fraction": 0.7, "max_users": 5, "proactive": False, "reward_timing": "episode_end", "output_cv": 0.3,
                   "alpha_cv": 0.2, "kv_memory": "padded", "rtt_ms": [5.0, 80.0]}, 40),
    "k10_immediate": ({"num_users": 10, "edge_fraction": 0.6, "interrupt": "immediate", "user_order": "deadline"}, 40),
}
FINAL_KEYS = ("served", "admitted_ad", "admitted_sd", "admitted_ed", "rejected", "late", "gamma", "z", "ed_share", "lam", "modes", "ed_depth")


def _feed(h, value) -> None:
    if isinstance(value, np.ndarray):
        h.update(str(value.dtype).encode() + str(value.shape).encode() + value.tobytes())
    else:
        h.update(repr(value).encode())
    h.update(b"|")


def trajectory_hash(env: EdgeScheduleV1Env, seed: int) -> str:
    """One episode seeded ``seed`` under a seeded random policy, hashed."""
    h = hashlib.sha256()
    rng = np.random.default_rng(10_000 + seed)
    n = env.action_space.n
    obs, _ = env.reset(seed=seed)
    _feed(h, obs)
    while True:
        masks = env.action_masks()
        _feed(h, masks)
        r = rng.random()
        allowed = np.flatnonzero(masks)
        if r < 0.7:
            action = int(allowed[rng.integers(len(allowed))])
        elif r < 0.9:
            action = int(rng.integers(-1, n + 1))  # may be masked out, or name no action
        else:
            action = np.int64(allowed[rng.integers(len(allowed))])
        obs, reward, terminated, truncated, info = env.step(action)
        for v in (action, obs, reward, terminated, truncated, info["invalid_action"]):
            _feed(h, v)
        if terminated:
            for key in FINAL_KEYS:
                _feed(h, info[key])
            return h.hexdigest()[:16]


#: significant digits the fingerprint keeps of each float (host-to-host noise is ~1e-15 relative)
FINGERPRINT_DIGITS = 9


def _feed_rounded(h, value) -> None:
    """``_feed`` of ``value`` with every float rounded to :data:`FINGERPRINT_DIGITS` significant digits."""
    arr = np.asarray(value)
    if arr.dtype.kind == "f":
        arr = np.array([float(f"{v:.{FINGERPRINT_DIGITS}g}") for v in arr.ravel().tolist()], dtype=np.float64).reshape(arr.shape)
    _feed(h, arr)


def model_fingerprint(env: EdgeScheduleV1Env, episodes: int) -> str:
    """The closed-form models' outputs on the case's rounds (not the env's decisions), rounded."""
    h = hashlib.sha256()
    g = env.cfg.max_gamma
    for seed in range(episodes):
        env.reset(seed=seed)
        rnd = env.round
        for arr in (rnd.input_tokens, rnd.output_tokens, rnd.alpha, rnd.uplink_s, rnd.slack_s, rnd.deadline_s, rnd.realized_output_tokens, rnd.realized_alpha):
            _feed_rounded(h, arr)
        if env.split is not None and rnd.has_edge is not None:
            u = ed_users(env.split, rnd, g)
            for arr in (u.tokens, u.iterations, u.edge_s, u.allowed, u.prefill_s):
                _feed_rounded(h, arr)
    c = env.cost
    for b in (1, 3, 7):
        for s, n in ((1, 1), (40, 90), (160, 160)):
            for v in (c.ad_time1(b, s, n), c.ad_memory1(b, s, n, b * n), c.memory_budget1(True), c.memory_budget1(False)):
                _feed_rounded(h, v)
            for gg in range(1, g + 1):
                _feed_rounded(h, c.sd_time1(b, s, n, 5, gg))
                _feed_rounded(h, c.sd_memory1(b, s, n, b * n, gg))
                _feed_rounded(h, c.tau_l.tau1(b, float(gg), float(s + gg)))
    return h.hexdigest()[:16]


def record_case(name: str) -> dict:
    kwargs, episodes = CASES[name]
    env = EdgeScheduleV1Env(**kwargs)
    hashes = [trajectory_hash(env, seed) for seed in range(episodes)]
    return {"fingerprint": model_fingerprint(EdgeScheduleV1Env(**kwargs), episodes), "hashes": hashes}


def _golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_trajectories_equal_the_recorded_ones(name):
    golden = _golden()[name]
    kwargs, episodes = CASES[name]
    if model_fingerprint(EdgeScheduleV1Env(**kwargs), episodes) != golden["fingerprint"]:
        pytest.skip(f"case {name}: the closed-form models changed since tests/data/env_v1_golden.json was recorded; "
                    "the vector-twin test still checks the env")
    env = EdgeScheduleV1Env(**kwargs)
    got = [trajectory_hash(env, seed) for seed in range(episodes)]
    bad = [i for i, (a, b) in enumerate(zip(got, golden["hashes"], strict=True)) if a != b]
    assert not bad, f"case {name}: trajectories {bad[:10]} differ from the recorded ones ({len(bad)} of {episodes})"


def test_fingerprint_ignores_ulps_and_sees_real_changes():
    """The rounding absorbs what differs between hosts (a few ulps) but not a change in a model's
    output in its 7th significant digit; ints are hashed exactly."""
    rng = np.random.default_rng(3)
    x = rng.lognormal(0.0, 3.0, size=2000)  # spans many decades, like the models' seconds and bytes

    def digest(value) -> str:
        h = hashlib.sha256()
        _feed_rounded(h, value)
        return h.hexdigest()

    # a few ulps, as numpy's exp/log give without AVX-512 (a value within ~1e-15 of a rounding edge
    # would still flip: ~1e-6 of them, and then the golden test skips, as it did for every host before)
    ulps = x * (1 + rng.integers(-4, 5, size=x.size) * np.finfo(float).eps)
    assert np.count_nonzero(ulps != x) > 1000 and digest(ulps) == digest(x)
    for i in (0, 999, 1999):
        changed = x.copy()
        changed[i] *= 1 + 1e-6
        assert digest(changed) != digest(x)
    assert digest(np.arange(5)) != digest(np.arange(5) + np.array([0, 0, 1, 0, 0]))
    assert digest(np.float64(1.0)) == digest(1.0) == digest(np.array(1.0))


@pytest.mark.parametrize("name", ["k12_ef05", "k12_ef1_g4", "k10_mixed"])
def test_scalar_env_matches_the_vector_twin_on_random_trajectories(name):
    """Sub-env ``i`` of the vector twin seeded ``s`` is the scalar env seeded ``s + i``: masks,
    rewards and final counts exactly equal, observations to float32 rounding."""
    kwargs, _ = CASES[name]
    n = 6
    venv = EdgeScheduleV1VectorEnv(num_envs=n, **kwargs)
    scal = [EdgeScheduleV1Env(**kwargs) for _ in range(n)]
    obs_v, _ = venv.reset(seed=50)
    obs_s = [e.reset(seed=50 + i)[0] for i, e in enumerate(scal)]
    assert np.allclose(obs_v, np.stack(obs_s), rtol=0, atol=1e-6)
    rng = np.random.default_rng(5)
    k = kwargs["num_users"]
    for _ in range(3 * k):  # three episodes each (in step: every round has K users)
        mv = venv.action_masks()
        assert np.array_equal(mv, np.stack([e.action_masks() for e in scal]))
        acts = np.array([int(rng.choice(np.flatnonzero(m))) for m in mv])
        obs_v, rew_v, term_v, _, info_v = venv.step(acts)
        for i, e in enumerate(scal):
            o, r, t, _, info = e.step(int(acts[i]))
            assert r == rew_v[i] and t == term_v[i]
            if t:
                assert info["served"] == info_v["served"][i] and info["admitted_ed"] == info_v["admitted_ed"][i]
            else:
                assert np.allclose(o, obs_v[i], rtol=0, atol=1e-6)
        if term_v.any():
            assert term_v.all()
            obs_v, _, _, _, _ = venv.step(np.zeros(n, dtype=np.int64))  # next-step autoreset
            obs_s = [e.reset()[0] for e in scal]
            assert np.allclose(obs_v, np.stack(obs_s), rtol=0, atol=1e-6)


def main() -> None:
    """Record the golden file (atomically). Only from an implementation known to be right."""
    data = {name: record_case(name) for name in CASES}
    fd, tmp = tempfile.mkstemp(dir=GOLDEN.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, GOLDEN)
    print(f"wrote {GOLDEN}: {sum(len(v['hashes']) for v in data.values())} trajectories")


if __name__ == "__main__":
    main()
