"""The train, validation and test round streams never share a round (issue 10, section 2)."""

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sb3_vec_env import EdgeScheduleSB3VecEnv
from envs.config import EnvConfig
from envs.workload import (
    SPLITS,
    Round,
    make_rounds,
    round_rng,
    sample_round,
    split_rng,
    stream_seed_sequence,
    train_env_seeds,
)

CFG = EnvConfig(num_users=6)
seeds = st.integers(0, 2**32 - 1)
small = st.integers(0, 2**16)


def _key(rnd: Round) -> bytes:
    """A round's identity: its users (all drawn values)."""
    return hashlib.sha1(b"".join(np.ascontiguousarray(a).tobytes() for a in (rnd.input_tokens, rnd.output_tokens, rnd.deadline_s, rnd.alpha, rnd.distance_m))).digest()


def _pool(ss: np.random.SeedSequence) -> tuple:
    return tuple(ss.generate_state(8).tolist())


def _train_rounds(seed: int, num_envs: int, per_env: int, stage: int = 0, start_step: int = 0) -> list[Round]:
    """The rounds the training env's sub-envs draw, replayed from the seeds it hands the vector env."""
    from gymnasium.utils import seeding

    out = []
    for s in train_env_seeds(seed, num_envs, stage, start_step):
        rng = seeding.np_random(s)[0]  # exactly what EdgeScheduleVectorEnv.reset(seed=[...]) does
        out += [sample_round(rng, CFG) for _ in range(per_env)]
    return out


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(SPLITS), seeds, small, st.sampled_from(SPLITS), seeds, small)
def test_distinct_streams_have_distinct_generators(split_a, seed_a, idx_a, split_b, seed_b, idx_b):
    """By construction: a different split is a different spawn key, whatever the seeds and indices."""
    if (split_a, seed_a, idx_a) == (split_b, seed_b, idx_b):
        return
    a = stream_seed_sequence(split_a, seed_a, idx_a)
    b = stream_seed_sequence(split_b, seed_b, idx_b)
    assert _pool(a) != _pool(b)


@settings(max_examples=30, deadline=None)
@given(seeds, small, st.integers(0, 7), st.integers(0, 10**6))
def test_train_env_seeds_are_the_train_stream(seed, i, stage, start):
    """The integer seeds handed to the vector env are exactly the train stream's seed sequences."""
    s = train_env_seeds(seed, i + 1, stage, start)[i]
    assert _pool(np.random.SeedSequence(s)) == _pool(stream_seed_sequence("train", seed, i, stage, start))


@settings(max_examples=30, deadline=None)
@given(seeds, small, st.integers(0, 200))
def test_test_stream_is_the_historical_rounds(seed, r, listed):
    """Every table made before the split keeps its rounds: test round r is SeedSequence([seed, r, 0]).

    ``listed`` (not ``r``) indexes ``make_rounds``'s list: it draws every round before the one
    asked for, so an index up to 2**16 cost ~1 s per example for nothing the property needs."""
    assert _pool(stream_seed_sequence("test", seed, r)) == _pool(np.random.SeedSequence([seed, r, 0]))
    assert _key(make_rounds(CFG, listed + 1, seed)[listed]) == _key(sample_round(round_rng(seed, listed), CFG))


@pytest.mark.parametrize(
    "train_seed,eval_seed",
    [
        (0, 0),  # the same seed for every stream: the old scheme gave train sub-env 0 test round 0
        (5, 5),
        (0, 1000003),  # the shipped recipe's seeds
        (1000003, 1000003),
        (2**32 - 1, 0),
    ],
)
def test_no_round_in_two_streams(train_seed, eval_seed):
    """Empirically, on round contents: training rounds (several sub-envs, curriculum stage, resume) vs validation vs test."""
    train = _train_rounds(train_seed, 8, 25) + _train_rounds(train_seed, 4, 10, stage=1) + _train_rounds(train_seed, 4, 10, start_step=4096)
    val = make_rounds(CFG, 150, eval_seed, split="validation")
    test = make_rounds(CFG, 150, eval_seed, split="test")
    keys = {name: {_key(r) for r in rounds} for name, rounds in (("train", train), ("validation", val), ("test", test))}
    assert len(keys["validation"]) == 150 and len(keys["test"]) == 150 and len(keys["train"]) == len(train)
    assert not keys["train"] & keys["validation"]
    assert not keys["train"] & keys["test"]
    assert not keys["validation"] & keys["test"]


def test_the_old_scheme_shared_rounds():
    """The adversarial case the streams fix (so the disjointness test above can fail): seeding a
    sub-env with the integer ``seed + i`` drew test round 0 of seed ``seed + i``."""
    from gymnasium.utils import seeding

    old_train_first = sample_round(seeding.np_random(7)[0], CFG)
    assert _key(old_train_first) == _key(make_rounds(CFG, 1, 7)[0])
    new_train_first = _train_rounds(7, 1, 1)[0]
    assert _key(new_train_first) != _key(make_rounds(CFG, 1, 7)[0])


def test_sb3_env_trains_on_the_train_stream():
    """The SB3 adapter, seeded as SB3 seeds it, plays the train stream's first rounds."""
    from envs.edge_schedule_vector import EdgeScheduleVectorEnv

    env = EdgeScheduleSB3VecEnv(3, CFG.to_dict())
    env.seed(11)
    got = env.reset()
    want, _ = EdgeScheduleVectorEnv(num_envs=3, **CFG.to_dict()).reset(options={"rounds": _train_rounds(11, 3, 1)})
    assert np.array_equal(got, want)
    other = EdgeScheduleSB3VecEnv(3, CFG.to_dict())
    other.seed(12)
    assert not np.array_equal(other.reset(), want)


@pytest.mark.parametrize("bad", [dict(split="holdout", seed=0, index=0), dict(split="test", seed=-1, index=0), dict(split="test", seed=2**32, index=0), dict(split="validation", seed=0, index=1.5), dict(split="test", seed=0, index=0, stage=1)])
def test_bad_stream_arguments_named(bad):
    with pytest.raises(ValueError, match="split|seed|index|stage"):
        stream_seed_sequence(**bad)


def test_train_stream_is_not_a_round_list():
    with pytest.raises(ValueError, match="train"):
        make_rounds(CFG, 3, 0, split="train")
    with pytest.raises(ValueError, match="train"):
        split_rng("train", 0, 0)
