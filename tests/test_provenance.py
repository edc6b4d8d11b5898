"""Profiles know where they were measured; a quick calibration moves the simulator the right way."""

import copy
import time
import warnings

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from envs.calibration import ScaleCurve
from envs.cost_model import CostModel
from envs.profile import PROFILE_DIR, CalibratedLatency, Profile, ProfileError, load_profile
from runtime.fingerprint import (
    ProfileProvenanceWarning,
    fingerprint_key,
    machine_fingerprint,
    provenance_differences,
    warn_if_measured_elsewhere,
)


def _raw(name="cpu1_specsched-pair"):
    return yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())


ELSEWHERE = {"cpu_model": "Some Other CPU 9000", "cores": 128, "threads": 16, "torch": "1.0.0", "dtype": "bfloat16", "pair_recipe": "000000000000"}


# ---------------------------------------------------------------- fingerprint and warning
def test_mismatch_warns_with_every_difference():
    here = {**machine_fingerprint("cpu", "float32", threads=1), "pair_recipe": "abcdefabcdef"}
    prof = Profile.from_dict({**_raw(), "measured_on": ELSEWHERE})
    with pytest.warns(ProfileProvenanceWarning) as rec:
        diff = warn_if_measured_elsewhere(prof, here)
    msg = str(rec[0].message)
    assert set(diff) == {"cpu_model", "cores", "threads", "torch", "dtype", "pair_recipe"}
    for text in ("Some Other CPU 9000", "128", "bfloat16", "1.0.0", "000000000000", "abcdefabcdef", "runtime.profile --quick"):
        assert text in msg


def test_same_machine_is_silent():
    here = machine_fingerprint("cpu", "float32", threads=1)
    prof = Profile.from_dict({**_raw(), "measured_on": here})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_measured_elsewhere(prof, here) == {}


def test_one_field_differs_names_only_that_field():
    here = machine_fingerprint("cpu", "float32", threads=1)
    prof = Profile.from_dict({**_raw(), "measured_on": {**here, "threads": 2}})
    with pytest.warns(ProfileProvenanceWarning, match="threads: 2 in the profile, 1 here"):
        assert set(warn_if_measured_elsewhere(prof, here)) == {"threads"}


def test_fields_one_side_lacks_are_not_differences_but_a_gpu_is():
    assert provenance_differences({"cores": 2}, {"cores": 2, "pair_recipe": "x"}) == {}
    assert provenance_differences({"cores": 2, "gpu_name": "NVIDIA H200"}, {"cores": 2}) == {"gpu_name": ("NVIDIA H200", None)}


def test_fingerprint_key_is_stable_and_tells_machines_apart():
    here = machine_fingerprint("cpu", "float32", threads=1)
    assert fingerprint_key(here) == fingerprint_key(dict(here)) == fingerprint_key({**here, "torch": here["torch"].split("+")[0] + "+cu999"})
    assert len({fingerprint_key({**here, key: "other"}) for key in ("cpu_model", "cores", "threads", "dtype", "pair_recipe")} | {fingerprint_key(here)}) == 6


def test_analytic_profile_never_warns():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_measured_elsewhere(load_profile("rtx4090_llama2-7b_tinyllama-1.1b"), machine_fingerprint()) == {}


def test_table_without_provenance_warns():
    d = _raw()
    d.pop("measured_on", None)
    with pytest.warns(ProfileProvenanceWarning, match="does not record where"):
        warn_if_measured_elsewhere(Profile.from_dict(d), machine_fingerprint())


def test_calibration_made_here_overrides_the_tables_provenance():
    here = machine_fingerprint("cpu", "float32", threads=1)
    d = {**_raw(), "measured_on": ELSEWHERE, "calibration": {"measured_on": here, "llm": {"q": [1], "scale": [1.2]}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_measured_elsewhere(Profile.from_dict(d), here) == {}


def test_shipped_measured_profiles_record_provenance():
    for name in ("cpu_specsched-pair", "cpu1_specsched-pair"):
        on = load_profile(name).measured_on
        assert on["cores"] == 2 and on["dtype"] == "float32"
    # both were measured on the current (step-bounded) full recipe
    from runtime.pair import recipe_for

    for name in ("cpu_specsched-pair", "cpu1_specsched-pair"):
        assert load_profile(name).measured_on["pair_recipe"] == recipe_for("full").digest()
    assert load_profile("cpu1_specsched-pair").measured_on["threads"] == 1


@pytest.mark.parametrize("bad", [["a", "list"], {"cores": [1, 2]}, {"cpu": {"nested": 1}}])
def test_bad_measured_on_named(bad):
    with pytest.raises(ProfileError, match="measured_on"):
        Profile.from_dict({**_raw(), "measured_on": bad})


# ---------------------------------------------------------------- calibration section
@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"llm": {"q": [5, 1], "scale": [1.0, 1.0]}}, "calibration.llm.q"),
        ({"llm": {"q": [1, float("nan")], "scale": [1.0, 1.0]}}, "calibration.llm.q"),
        ({"slm": {"q": [1, 5], "scale": [1.0, float("inf")]}}, "calibration.slm.scale"),
        ({"slm": {"q": [1, 5], "scale": [1.0, 0.0]}}, "calibration.slm.scale"),
        ({"llm": {"q": [1, 5], "scale": [1.0]}}, "calibration.llm.scale"),
        ({"llm": {"q": "1,5", "scale": [1.0]}}, "calibration.llm"),
        ({"notes": "nothing"}, "calibration"),
        ([1.0], "calibration"),
    ],
)
def test_bad_calibration_named(section, match):
    with pytest.raises(ProfileError, match=match):
        Profile.from_dict({**_raw(), "calibration": section})


curves = st.integers(1, 5).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0.5, 600, allow_nan=False), min_size=n, max_size=n, unique=True).map(sorted),
        st.lists(st.floats(0.05, 20, allow_nan=False), min_size=n, max_size=n),
    )
)


@settings(max_examples=200, deadline=None)
@given(curves, st.lists(st.floats(0.0, 1000.0, allow_nan=False), min_size=1, max_size=20))
def test_scale_curve_scalar_equals_array_and_stays_in_range(curve, qs):
    q, s = curve
    c = ScaleCurve(tuple(q), tuple(s))
    arr = c.at(np.array(qs))
    for x, v in zip(qs, arr, strict=True):
        assert c.at1(x) == float(v)  # bit for bit: the scalar env must match the vector env
        assert min(s) - 1e-12 <= v <= max(s) + 1e-12
    assert c.at1(q[0] - 0.25) == s[0] and np.isclose(c.at1(q[-1] + 100), s[-1])
    for qi, si in zip(q, s, strict=True):
        assert np.isclose(c.at1(qi), si)


def test_calibration_scales_tau_and_the_cost_model():
    d = _raw()
    base = CostModel(Profile.from_dict(d))
    cal = Profile.from_dict({**d, "calibration": {"llm": {"q": [1, 9], "scale": [2.0, 1.5]}, "slm": {"q": [1], "scale": [3.0]}}})
    assert isinstance(cal.tau_llm, CalibratedLatency)
    b, q, c = 3, 5, 200
    assert np.isclose(float(cal.tau_llm.tau(b, q, c)), float(base.tau_l.tau(b, q, c)) * 1.75)
    assert np.isclose(float(cal.tau_slm.tau(b, 40, c)), float(base.tau_s.tau(b, 40, c)) * 3.0)
    model = CostModel(cal)
    assert model.ad_time(4, 64, 32) > 1.4 * base.ad_time(4, 64, 32)
    assert model.sd_time(4, 64, 32, 10, 4) > 1.4 * base.sd_time(4, 64, 32, 10, 4)
    # the scalar fast path agrees with the arrays bit for bit, and memory sweeps keep the calibration
    for args in [(1, 10, 5), (3, 77, 64), (16, 128, 33)]:
        assert model.ad_time1(*args) == float(model.ad_time(*args))
        assert model.sd_time1(*args, 9, 4) == float(model.sd_time(*args, 9, 4))
    assert CostModel(cal.with_memory(1e10)).ad_time1(3, 77, 64) == model.ad_time1(3, 77, 64)


# ---------------------------------------------------------------- quick calibration on a slowed engine
def _tiny_pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    from runtime.pair import ModelPair
    from runtime.tokenizer import ByteTokenizer

    def model(layers, hidden, seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=259, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        return LlamaForCausalLM(cfg).eval()

    return ModelPair(model(2, 32, 0), model(1, 16, 1), ByteTokenizer())


POINTS = dict(b=(1, 2), q=(1, 5), c=(16, 32), prefill=(32,))


@pytest.fixture(scope="module")
def measured():
    """A tiny pair and a table profile measured on it, here, now."""
    from runtime.pass_timing import device_spec, model_spec
    from runtime.profile import measure

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: no spinning against the other processes of a busy machine
    pair = _tiny_pair()
    prof = {"name": "tiny-here", "measured_on": machine_fingerprint(threads=1), "device": device_spec("cpu"), "llm": model_spec(pair.target, "target"), "slm": model_spec(pair.draft, "draft"),
            "latency": {"source": "table", **measure(pair, [1, 2], [1, 5, 32], [16, 32], repeats=3, progress=False)}}
    yield pair, prof
    torch.set_num_threads(threads)


def _slowed(pair, seconds):
    slow = copy.deepcopy(pair)
    for m in (slow.target, slow.draft):
        m.register_forward_pre_hook(lambda *_: time.sleep(seconds))
    return slow


def test_quick_profile_follows_an_artificially_slowed_engine(measured):
    from runtime.profile import quick_calibration

    pair, prof = measured
    section = quick_calibration(_slowed(pair, 0.02), prof, repeats=3, measured_on=machine_fingerprint(threads=1), progress=False, **POINTS)
    cal = Profile.from_dict({**prof, "calibration": section})  # the output loads
    assert all(s > 1.5 for key in ("llm", "slm") for s in section[key]["scale"]), section
    base, slow = CostModel(Profile.from_dict(prof)), CostModel(cal)
    assert slow.ad_time(2, 32, 16) > 1.5 * base.ad_time(2, 32, 16)
    assert slow.sd_time(2, 32, 16, 5, 4) > 1.5 * base.sd_time(2, 32, 16, 5, 4)


def test_quick_profile_corrects_a_pessimistic_table_downwards(measured):
    from runtime.profile import quick_calibration

    pair, prof = measured
    pessimistic = copy.deepcopy(prof)
    for key in ("llm", "slm"):
        pessimistic["latency"][key]["tau_s"] = (np.asarray(prof["latency"][key]["tau_s"]) * 100).tolist()
    # medians of 3 repeats over 4 points per q: robust to a busy machine's outliers
    section = quick_calibration(pair, pessimistic, repeats=3, progress=False, **POINTS)
    assert all(s < 1 for key in ("llm", "slm") for s in section[key]["scale"]), section
    cal = CostModel(Profile.from_dict({**pessimistic, "calibration": section}))
    assert cal.ad_time(2, 32, 16) < 0.5 * CostModel(Profile.from_dict(pessimistic)).ad_time(2, 32, 16)


def test_quick_profile_refuses_another_pairs_profile(measured):
    from runtime.profile import quick_calibration

    pair, _ = measured
    with pytest.raises(ValueError, match="not the profile's llm"):
        quick_calibration(pair, _raw(), repeats=1, progress=False, **POINTS)


def test_quick_profile_corrects_a_table_that_under_predicts_prefills(measured, monkeypatch):
    """A prefill is a pass with q = c; the quick profile times those points and scales them apart
    from the steps: a table whose q = 32 (prefill) entries are half the truth gets 2x there only.

    The passes are "timed" by the measured table itself (the truth), not by the clock: the ratio
    checked is exact, so a busy host cannot fail it (a clocked version flaked under load); the
    clocked path is the other quick-profile tests' (their margins are 1.5x to 100x)."""
    import runtime.profile as rp

    pair, prof = measured
    truth = {pair.target: Profile.from_dict(prof).tau_llm, pair.draft: Profile.from_dict(prof).tau_slm}
    timed: list[tuple] = []

    def fake_pass(model, b, q, c, repeats, how="pass"):
        timed.append((how, b, q, c))
        return float(truth[model].tau(b, q, c))

    monkeypatch.setattr(rp, "time_pass", fake_pass)
    monkeypatch.setattr(rp, "time_prefill", lambda model, b, s, repeats: fake_pass(model, b, s, s, repeats, "prefill"))
    low = copy.deepcopy(prof)
    for key in ("llm", "slm"):
        tau = np.asarray(prof["latency"][key]["tau_s"])
        tau[:, 2, :] *= 0.5  # q = 32
        low["latency"][key]["tau_s"] = tau.tolist()
    section = rp.quick_calibration(pair, low, repeats=3, progress=False, **POINTS)
    # prefills timed as the engines run them (padded, masked), steps as plain passes
    assert {t for t in timed if t[2] == 32} == {("prefill", 1, 32, 32), ("prefill", 2, 32, 32)} and ("pass", 2, 5, 16) in timed
    for key in ("llm", "slm"):
        assert section[key]["q"] == [1, 5, 32]
        assert section[key]["scale"] == pytest.approx([1.0, 1.0, 2.0], rel=1e-9), section  # only the prefill point corrected
    cal, raw = Profile.from_dict({**low, "calibration": section}).tau_llm, Profile.from_dict(low).tau_llm
    assert float(cal.tau(2, 32, 32) / cal.tau(2, 1, 32)) == pytest.approx(2 * float(raw.tau(2, 32, 32) / raw.tau(2, 1, 32)), rel=1e-9)
