"""The profiles' optional ``edge`` / ``network`` sections and the shipped split profiles."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import yaml

from envs.profile import PROFILE_DIR, Profile, ProfileError, load_profile
from envs.split_profile import cpu_split_profile, shipped_split_profiles

SPLIT = sorted(shipped_split_profiles())


@pytest.mark.parametrize("name", SPLIT)
def test_shipped_split_profiles_load_and_match_their_generator(name):
    p = load_profile(name)
    assert p.edge is not None and p.network is not None
    with (PROFILE_DIR / f"{name}.yaml").open() as fh:
        assert yaml.safe_load(fh) == shipped_split_profiles()[name], "rerun `python -m envs.split_profile`"
    # the draft on the edge costs something and grows with the work
    t1, t8 = p.edge.tau_draft.tau1(1, 1, 256), p.edge.tau_draft.tau1(1, 8, 256)
    assert 0 < t1 <= t8


def test_profiles_without_the_sections_have_none():
    p = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
    assert p.edge is None and p.network is None


def test_cpu_split_edge_is_the_measured_draft_table():
    p = load_profile("split_cpu_specsched-pair")
    base = load_profile("cpu_specsched-pair")
    b, q, c = np.meshgrid([1, 2, 4], [1, 3, 9], [16, 300, 1000], indexing="ij")
    assert np.array_equal(p.edge.tau_draft.tau(b, q, c), base.tau_slm.tau(b, q, c))
    assert np.array_equal(p.tau_llm.tau(b, q, c), base.tau_llm.tau(b, q, c))
    assert p.network.rtt_s == pytest.approx(2e-4)


@pytest.mark.parametrize(
    "path, value, field",
    [
        (("network", "rtt_ms"), -1, "network.rtt_ms"),
        (("network", "bandwidth_bytes_per_s"), 0, "network.bandwidth_bytes_per_s"),
        (("network", "bytes_per_draft_token"), "x", "network.bytes_per_draft_token"),
        (("network", "request_overhead_bytes"), float("nan"), "network.request_overhead_bytes"),
        (("edge", "device", "memory_bytes"), 0, "edge.device.memory_bytes"),
        (("edge", "latency", "source"), "magic", "edge.latency.source"),
        (("edge", "latency", "slm", "tau_s"), [[[1.0]]], "edge.latency.slm.tau_s"),
    ],
)
def test_bad_split_sections_name_the_field(path, value, field):
    d = copy.deepcopy(cpu_split_profile("cpu_specsched-pair"))
    node = d
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ProfileError, match=field.replace(".", r"\.")):
        Profile.from_dict(d)


def test_missing_network_field_is_named():
    d = copy.deepcopy(cpu_split_profile("cpu_specsched-pair"))
    del d["network"]["rtt_ms"]
    with pytest.raises(ProfileError, match=r"network\.rtt_ms"):
        Profile.from_dict(d)


def test_timed_profile_reproduces_the_pass_times_it_is_fitted_to():
    from envs import split_profile as sp
    from envs.profile import DeviceSpec, ModelSpec, RooflineLatency

    p = load_profile("split_a100-40gb_qwen3-14b_qwen3-1.7b_timed")
    d = sp.timed_split_profile()
    c = sp.TIMED_FIT_CONTEXT
    # the edge's draft layer: 32 beams of Qwen3-1.7B on the RTX 4090
    assert p.edge.tau_draft.tau1(1, 32, c + 32) == pytest.approx(sp.DRAFT_LAYER_1_7B_RTX4090_S, rel=1e-6)
    # the verify engine's overhead, on the 32B at the A100 80GB's bandwidth, gives the published verify pass
    a80 = DeviceSpec.from_dict({**d["device"], "bandwidth_bytes_per_s": sp.A100_80GB_BANDWIDTH})
    verify = RooflineLatency(model=ModelSpec.from_dict(sp.QWEN3_32B, "m"), device=a80, flops_efficiency=0.6, bandwidth_efficiency=0.8,
                             layer_overhead_s=d["latency"]["llm_layer_overhead_s"])
    assert verify.tau1(1, 33, c + 33) == pytest.approx(sp.VERIFY_32B_A100_80GB_S, rel=1e-6)
    # server-only SD's draft runs the same draft engine: the edge's per-layer overhead, the A100's bandwidth
    assert d["latency"]["slm_layer_overhead_s"] == d["edge"]["latency"]["layer_overhead_s"] > 0
    assert 0 < p.tau_slm.tau1(1, 32, c + 32) < sp.DRAFT_LAYER_1_7B_RTX4090_S
    # the untimed roofline profile is unchanged and faster
    assert load_profile("split_a100-40gb_qwen3-14b_qwen3-1.7b").tau_llm.tau1(1, 33, c + 33) < p.tau_llm.tau1(1, 33, c + 33)
    with pytest.raises(ValueError, match="below its roofline"):
        sp.fitted_layer_overhead_s(sp.QWEN3_32B, {**d["device"]}, d["latency"], 33, 1e-4)
