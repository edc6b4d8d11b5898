"""Users with an edge GPU and their own RTT (envs.workload / envs.config), drawn from a child stream."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from envs.config import ConfigError, EnvConfig
from envs.workload import Round, make_rounds, round_rng, sample_round

V0_FIELDS = [f.name for f in dataclasses.fields(Round) if f.name not in ("has_edge", "rtt_s")]


@pytest.mark.parametrize("seed", range(20))
def test_edge_fields_leave_the_v0_round_and_the_parent_stream_unchanged(seed):
    base = EnvConfig(num_users=30, alpha_cv=0.2, output_cv=0.3)
    rng_a, rng_b = round_rng(seed, 0), round_rng(seed, 0)
    a = sample_round(rng_a, base)
    b = sample_round(rng_b, base.replace(edge_fraction=0.7, rtt_ms=[5.0, 65.0]))
    for name in V0_FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    # the parent generator continues identically whatever the edge settings
    assert rng_a.random() == rng_b.random()
    # common random numbers: the same users get an edge as the fraction grows
    c = sample_round(round_rng(seed, 0), base.replace(edge_fraction=0.9, rtt_ms=[5.0, 65.0]))
    assert np.all(c.has_edge[b.has_edge])
    assert np.array_equal(b.rtt_s, c.rtt_s)


def test_default_config_has_no_edge_users_and_the_profile_like_rtt():
    rnd = make_rounds(EnvConfig(num_users=40), 3, seed=1)[0]
    assert rnd.has_edge.dtype == bool and not rnd.has_edge.any()
    assert np.allclose(rnd.rtt_s, 0.015)


def test_fraction_and_ranges():
    cfg = EnvConfig(num_users=4000, edge_fraction=0.3, rtt_ms=[5.0, 65.0])
    rnd = sample_round(np.random.default_rng(0), cfg)
    assert abs(rnd.has_edge.mean() - 0.3) < 0.03
    assert rnd.rtt_s.min() >= 0.005 and rnd.rtt_s.max() <= 0.065
    assert abs(rnd.rtt_s.mean() - 0.035) < 0.002
    log = sample_round(np.random.default_rng(0), cfg.replace(rtt_distribution="loguniform"))
    assert np.median(log.rtt_s) == pytest.approx(np.sqrt(0.005 * 0.065), rel=0.1)
    assert sample_round(np.random.default_rng(0), cfg.replace(edge_fraction=1.0)).has_edge.all()


def test_subset_keeps_edge_fields_and_tolerates_their_absence():
    rnd = sample_round(np.random.default_rng(2), EnvConfig(num_users=10, edge_fraction=0.5))
    sub = rnd.subset([3, 1])
    assert np.array_equal(sub.has_edge, rnd.has_edge[[3, 1]]) and np.array_equal(sub.rtt_s, rnd.rtt_s[[3, 1]])
    bare = Round.from_arrays(EnvConfig(num_users=2), [5, 6], [7, 8], [1.0, 2.0], [0.7, 0.8], [50.0, 60.0])
    assert bare.has_edge is None and bare.subset([1]).rtt_s is None


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"edge_fraction": 1.5}, "edge_fraction"),
        ({"edge_fraction": True}, "edge_fraction"),
        ({"rtt_ms": [20.0, 10.0]}, "rtt_ms"),
        ({"rtt_ms": [-1.0, 10.0]}, "rtt_ms"),
        ({"rtt_distribution": "normal"}, "rtt_distribution"),
        ({"rtt_distribution": "loguniform", "rtt_ms": [0.0, 10.0]}, "rtt_ms"),
    ],
)
def test_bad_edge_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        EnvConfig(**kwargs)
