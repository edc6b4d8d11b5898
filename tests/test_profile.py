import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from envs import ConfigError, EnvConfig, ProfileError, available_profiles, load_profile
from envs.channel import link_rates_bps, path_loss_db
from envs.profile import PROFILE_DIR, Profile


def test_shipped_profiles_load():
    names = available_profiles()
    for want in ("rtx4090_llama2-7b_tinyllama-1.1b", "a100-40gb_llama2-13b_llama2-7b", "h100_llama2-13b_llama2-7b", "h200_llama2-13b_llama2-7b"):
        assert want in names
    for name in names:
        p = load_profile(name)
        assert p.llm.weight_bytes > p.slm.weight_bytes
        assert p.device.memory_bytes > p.llm.weight_bytes + p.slm.weight_bytes
        t1 = p.tau_llm.tau(1, 1, 100)
        assert 0 < t1 < 1


def test_model_sizes_match_reference():
    p = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
    assert p.llm.kv_bytes_per_token == 512 * 1024  # balance.md §1.5
    assert p.slm.kv_bytes_per_token == 22 * 1024
    # ~13.2 GFLOP per token at short context for Llama-2-7B
    assert 12.5e9 < float(p.llm.flops(1, 1, 1)) < 14e9


def test_tau_monotone():
    p = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
    for tau in (p.tau_llm, p.tau_slm):
        assert tau.tau(2, 1, 100) >= tau.tau(1, 1, 100)
        assert tau.tau(1, 8, 100) >= tau.tau(1, 1, 100)
        assert tau.tau(1, 1, 1000) >= tau.tau(1, 1, 100)


def test_decode_sum_matches_loop():
    p = load_profile("rtx4090_llama2-7b_tinyllama-1.1b")
    direct = sum(float(p.tau_llm.tau(3, 1, 200 + i)) for i in range(1, 51))
    assert np.isclose(float(p.tau_llm.decode_sum(3, 200, 50)), direct, rtol=1e-9)
    assert float(p.tau_llm.decode_sum(3, 200, 0)) == 0.0
    # growing the table for a larger batch/context keeps earlier answers
    big = float(p.tau_llm.decode_sum(300, 5000, 10))
    assert big > 0 and np.isclose(float(p.tau_llm.decode_sum(3, 200, 50)), direct, rtol=1e-9)


def _raw(name="rtx4090_llama2-7b_tinyllama-1.1b"):
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


def test_missing_field_named():
    d = _raw()
    del d["llm"]["layers"]
    with pytest.raises(ProfileError, match="llm.layers"):
        Profile.from_dict(d)


def test_negative_memory_named():
    d = _raw()
    d["device"]["memory_bytes"] = -1
    with pytest.raises(ProfileError, match="device.memory_bytes.*> 0"):
        Profile.from_dict(d)


def test_unknown_latency_source_named():
    d = _raw()
    d["latency"]["source"] = "magic"
    with pytest.raises(ProfileError, match="latency.source.*roofline"):
        Profile.from_dict(d)


def test_unknown_profile_lists_available():
    with pytest.raises(ProfileError, match="available"):
        load_profile("no-such-profile")


def test_table_profile_interpolates_grid(tmp_path):
    d = _raw()
    roof = Profile.from_dict(d)
    grid = {"b": [1, 4, 16, 64], "q": [1, 5, 64, 512], "c": [64, 256, 1024, 4096]}
    lat = {"source": "table"}
    for key, tau in (("llm", roof.tau_llm), ("slm", roof.tau_slm)):
        b, q, c = np.meshgrid(*(np.array(v, float) for v in grid.values()), indexing="ij")
        lat[key] = {**grid, "tau_s": tau.tau(b, q, c).tolist()}
    d["latency"] = lat
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump(d))
    table = load_profile(path)
    assert table.latency_source == "table"
    assert np.isclose(float(table.tau_llm.tau(4, 5, 256)), float(roof.tau_llm.tau(4, 5, 256)))
    mid = float(table.tau_llm.tau(8, 1, 500))
    assert float(table.tau_llm.tau(4, 1, 256)) <= mid <= float(table.tau_llm.tau(16, 1, 1024))
    # the environment runs on it
    import gymnasium as gym

    import envs  # noqa: F401

    env = gym.make("EdgeSchedule-v0", num_users=6, profile=str(path))
    env.reset(seed=0)
    env.step(1)


def test_table_shape_checked(tmp_path):
    d = _raw()
    d["latency"] = {"source": "table", "llm": {"b": [1, 2], "q": [1], "c": [10], "tau_s": [[[0.1]]]}, "slm": {"b": [1], "q": [1], "c": [1], "tau_s": [[[0.1]]]}}
    with pytest.raises(ProfileError, match="latency.llm.tau_s.*shape"):
        Profile.from_dict(d)


def test_linear_profile():
    d = _raw()
    d["latency"] = {"source": "linear", "llm": {"intercept_s": 0.004, "per_flop_s": 1e-14, "per_byte_s": 1.2e-12}, "slm": {"intercept_s": 0.002, "per_flop_s": 1e-14, "per_byte_s": 1.2e-12}}
    p = Profile.from_dict(d)
    assert float(p.tau_llm.tau(1, 1, 10)) > 0.004


def test_channel_reference_numbers():
    cfg = EnvConfig()
    assert abs(float(path_loss_db(250.0, cfg)) - 105.46) < 0.1
    up, down = link_rates_bps(np.array([250.0]), cfg)
    assert 5.5e6 < up[0] < 7e6  # ~6 Mbit/s uplink at the cell edge
    assert 24e6 < down[0] < 28e6  # ~26 Mbit/s downlink


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("num_users", 0, "num_users"),
        ("num_users", 10**6, "num_users"),
        ("alpha", [0.9, 0.5], "alpha"),
        ("kv_memory", "paged", "kv_memory"),
        ("memory_bytes", -5, "memory_bytes"),
        ("input_tokens", [0, 10], "input_tokens"),
        ("max_gamma", 0, "max_gamma"),
    ],
)
def test_config_errors_name_field(field, value, match):
    with pytest.raises(ConfigError, match=match):
        EnvConfig(**{field: value})


def test_unknown_config_field():
    with pytest.raises(ConfigError, match="unknown env config field"):
        EnvConfig.from_kwargs(num_userz=3)


ENGINE = {"b": [1, 4, 16], "ad_step_s": [0.001, 0.002, 0.004], "sd_iteration_s": [0.002, 0.003, 0.008], "sd_draft_step_s": [0.0, 0.0005, 0.001]}


def test_engine_overhead_is_added_per_step_and_iteration():
    from envs.cost_model import CostModel

    d = _raw("cpu_specsched-pair")
    d.pop("engine", None)
    bare = CostModel(Profile.from_dict(d))
    over = CostModel(Profile.from_dict({**d, "engine": ENGINE}))
    # AD: (N - 1) decode steps; b = 2 interpolates between b = 1 and b = 4
    assert np.isclose(over.ad_time(2, 50, 31) - bare.ad_time(2, 50, 31), 30 * (0.001 + (0.002 - 0.001) / 3))
    # SD: J iterations of (iteration + gamma x draft step); b beyond the grid holds the last value
    assert np.isclose(over.sd_time(32, 50, 40, 9, 4) - bare.sd_time(32, 50, 40, 9, 4), 9 * (0.008 + 4 * 0.001))
    # the scalar twins give the same numbers as the arrays
    for b, s, n, j, g in [(1, 10, 5, 2, 1), (3, 77, 64, 20, 4), (16, 128, 33, 9, 8), (40, 5, 1, 1, 2)]:
        assert over.ad_time1(b, s, n) == float(over.ad_time(b, s, n))
        assert over.sd_time1(b, s, n, j, g) == float(over.sd_time(b, s, n, j, g))


@pytest.mark.parametrize(("key", "value"), [("ad_step_s", [0.001, 0.002]), ("sd_iteration_s", [0.001, -0.002, 0.0]), ("b", [4, 1, 16])])
def test_engine_section_checked(key, value):
    d = {**_raw("cpu_specsched-pair"), "engine": {**ENGINE, key: value}}
    with pytest.raises(ProfileError, match=f"engine.{key}"):
        Profile.from_dict(d)


def test_measured_profiles_carry_engine_overhead():
    for name in ("cpu_specsched-pair", "cpu1_specsched-pair"):
        p = load_profile(name)
        assert p.engine is not None and p.latency_source == "table"


# ---------------------------------------------------------------- grid axes: NaN, inf, order
def _table_dict(axes=None):
    """A valid table profile on a 2 x 2 x 2 grid, with ``axes`` overriding latency.llm's axes."""
    d = _raw("cpu1_specsched-pair")
    grid = {"b": [1, 4], "q": [1, 8], "c": [64, 256]}
    d["latency"] = {"source": "table", **{key: {**grid, "tau_s": np.full((2, 2, 2), 0.01).tolist()} for key in ("llm", "slm")}}
    d["latency"]["llm"].update(axes or {})
    d.pop("engine", None)
    return d


@pytest.mark.parametrize("axis", ["b", "q", "c"])
@pytest.mark.parametrize("bad", [[float("nan"), 4], [1, float("nan")], [1, float("inf")], [float("-inf"), 4], [4, 1], [2, 2], [0, 4], [], ["x", 4], [[1, 2], [3, 4]]])
def test_bad_table_axis_refused_with_field_named(axis, bad):
    with pytest.raises(ProfileError, match=f"latency.llm.{axis}'.*strictly increasing"):
        Profile.from_dict(_table_dict({axis: bad}))


def test_nan_in_llm_b_from_yaml_is_refused(tmp_path):
    """The reported case: ``.nan`` in latency.llm.b was accepted and every user silently failed."""
    path = tmp_path / "nan.yaml"
    path.write_text(yaml.safe_dump(_table_dict({"b": [float("nan"), 4.0]})))
    assert ".nan" in path.read_text()
    with pytest.raises(ProfileError, match="latency.llm.b"):
        load_profile(path)


finite = st.floats(0.5, 5000, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(finite, min_size=1, max_size=6), st.sampled_from([None, float("nan"), float("inf"), float("-inf"), "dup", "swap"]), st.integers(0, 5))
def test_table_axis_property(values, poison, where):
    """Any strictly increasing positive finite axis loads; any poisoned one is refused."""
    axis = sorted(set(values))
    if poison is None:
        pass
    elif poison == "dup":
        axis = axis + [axis[-1]]
    elif poison == "swap":
        if len(axis) < 2:
            axis = axis + [axis[0] / 2]
        else:
            axis[0], axis[1] = axis[1], axis[0]
    else:
        axis = list(axis)
        axis[where % len(axis)] = poison
    d = _table_dict({"c": axis})
    d["latency"]["llm"]["tau_s"] = np.full((2, 2, len(axis)), 0.01).tolist()
    if poison is None:
        assert list(Profile.from_dict(d).tau_llm.c_grid) == axis
    else:
        with pytest.raises(ProfileError, match="latency.llm.c"):
            Profile.from_dict(d)


@pytest.mark.parametrize("bad", [[float("nan"), 4, 16], [1, 4, float("inf")]])
def test_engine_axis_nan_refused(bad):
    d = {**_raw("cpu_specsched-pair"), "engine": {**ENGINE, "b": bad}}
    with pytest.raises(ProfileError, match="engine.b"):
        Profile.from_dict(d)
