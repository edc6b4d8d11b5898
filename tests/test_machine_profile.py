"""A profile measured on the running machine: cache hit / miss / stale, forcing, atomic writes,
and a real quick calibration on a tiny, artificially slowed pair that moves the predictions up."""

import copy
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from envs.profile import PROFILE_DIR, ProfileError, load_profile
from runtime.fingerprint import fingerprint_key, machine_fingerprint
from runtime.machine_profile import AUTO, cache_entry, default_base, resolve_profile

BASE = PROFILE_DIR / "cpu1_specsched-pair.yaml"


class FakeMeasure:
    """Stands in for the 2-minute quick calibration: a fixed scale, and a count of calls."""

    def __init__(self, scale=1.25):
        self.calls, self.scale = 0, scale

    def __call__(self, pair, base, fingerprint, progress):
        self.calls += 1
        return {"calibration": {"measured_on": dict(fingerprint), "llm": {"q": [1, 64], "scale": [self.scale, self.scale]}, "slm": {"q": [1], "scale": [self.scale]}, "notes": "fake"}}


def _resolve(tmp_path, measure, **kw):
    kw = {"pair": None, "threads": 1, "cache_dir": tmp_path / "cache", "measure": measure, "progress": False, **kw}
    return resolve_profile(AUTO, **kw)


def test_miss_measures_and_caches_then_hits(tmp_path):
    m = FakeMeasure()
    first = _resolve(tmp_path, m)
    assert first.source == "measured" and m.calls == 1 and first.path.is_file()
    assert first.path == cache_entry(tmp_path / "cache", machine_fingerprint("cpu", "float32", 1), BASE)
    assert fingerprint_key(machine_fingerprint("cpu", "float32", 1)) in first.path.name and first.base == BASE
    second = _resolve(tmp_path, m)
    assert second.source == "cached" and m.calls == 1 and second.path == first.path
    assert _resolve(tmp_path, m, refresh=True).source == "measured" and m.calls == 2  # asked to measure again
    # the entry is the base table with this machine's calibration applied
    prof, base = load_profile(second.path), load_profile(BASE)
    assert np.isclose(float(prof.tau_llm.tau(4, 1, 256)), 1.25 * float(base.tau_llm.tau(4, 1, 256)))
    second = _resolve(tmp_path, m)
    assert second.calibration_factors() == {"llm": {1: 1.25, 64: 1.25}, "slm": {1: 1.25}}
    text = second.describe()
    assert str(second.path) in text and "cached" in text and "x1.25 at q 1" in text
    assert not [p for p in (tmp_path / "cache").iterdir() if p.suffix != ".yaml"]  # no temporary files left


def test_other_thread_count_is_another_machine_entry(tmp_path):
    m = FakeMeasure()
    one, two = _resolve(tmp_path, m, threads=1), _resolve(tmp_path, m, threads=2)
    assert m.calls == 2 and one.path != two.path
    assert one.base.stem == default_base(1) == "cpu1_specsched-pair" and two.base.stem == default_base(2) == "cpu_specsched-pair"
    assert load_profile(two.path).calibration.measured_on["threads"] == 2


def test_changed_base_or_corrupt_entry_is_a_miss(tmp_path):
    base = tmp_path / "mybase.yaml"
    base.write_text(BASE.read_text())
    m = FakeMeasure()
    first = _resolve(tmp_path, m, base=base)
    assert _resolve(tmp_path, m, base=base).source == "cached" and m.calls == 1
    base.write_text(BASE.read_text() + "\n# re-measured\n")  # the base changed: the calibration was against the old one
    assert _resolve(tmp_path, m, base=base).source == "measured" and m.calls == 2
    data = yaml.safe_load(first.path.read_text())
    data["derived_from"]["method"] = "an older quick calibration's points"
    first.path.write_text(yaml.safe_dump(data))
    assert _resolve(tmp_path, m, base=base).source == "measured" and m.calls == 3
    first.path.write_text("latency: [not, a, profile")  # unreadable entry: measured again, overwritten
    again = _resolve(tmp_path, m, base=base)
    assert again.source == "measured" and m.calls == 4 and load_profile(again.path).calibration is not None


def test_entry_from_another_machine_is_a_miss(tmp_path):
    m = FakeMeasure()
    first = _resolve(tmp_path, m)
    data = yaml.safe_load(first.path.read_text())
    data["calibration"]["measured_on"]["cpu_model"] = "Some Other CPU 9000"  # e.g. copied over from another host
    first.path.write_text(yaml.safe_dump(data))
    assert _resolve(tmp_path, m).source == "measured" and m.calls == 2


def test_forced_and_disabled_never_measure(tmp_path):
    m = FakeMeasure()
    forced = resolve_profile("cpu_specsched-pair", pair=None, threads=1, cache_dir=tmp_path, measure=m)
    assert forced.source == "forced" and forced.path == PROFILE_DIR / "cpu_specsched-pair.yaml"
    by_path = resolve_profile(str(BASE), pair=None, threads=2, cache_dir=tmp_path, measure=m)
    assert by_path.source == "forced" and by_path.path == BASE
    off = _resolve(tmp_path, m, auto=False)
    assert off.source == "base" and off.path == BASE and off.profile.calibration is None
    assert m.calls == 0 and not (tmp_path / "cache").exists()
    assert "auto-measurement off" in off.describe()
    with pytest.raises(ProfileError, match="nosuch"):
        resolve_profile("nosuch", pair=None, measure=m)


def test_failed_measurement_leaves_no_entry(tmp_path):
    def broken(*_):
        raise KeyboardInterrupt  # e.g. Ctrl-C halfway through

    with pytest.raises(KeyboardInterrupt):
        _resolve(tmp_path, broken)
    assert list((tmp_path / "cache").iterdir()) == []


def test_measurement_runs_at_the_requested_thread_count(tmp_path):
    seen = []

    def spy(pair, base, fp, progress):
        seen.append(torch.get_num_threads())
        return FakeMeasure()(pair, base, fp, progress)

    before = torch.get_num_threads()
    _resolve(tmp_path, spy, threads=2)
    assert seen == [2] and torch.get_num_threads() == before


# ---------------------------------------------------------------- a real quick calibration, tiny pair
def _tiny_pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    from runtime.pair import ModelPair
    from runtime.tokenizer import ByteTokenizer

    def model(layers, hidden, seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=259, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
        return LlamaForCausalLM(cfg).eval()

    return ModelPair(model(2, 32, 0), model(1, 16, 1), ByteTokenizer())


def _slowed(pair, seconds):
    slow = copy.deepcopy(pair)
    for m in (slow.target, slow.draft):
        m.register_forward_pre_hook(lambda *_: time.sleep(seconds))
    return slow


def test_first_use_on_a_slowed_machine_plans_slower(tmp_path):
    """The auto profile, measured on an engine slowed by 20 ms a pass, predicts slower passes than
    the table it calibrates (which was measured on the same pair unslowed, here, now)."""
    from runtime.pass_timing import device_spec, model_spec
    from runtime.profile import measure, quick_calibration

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair = _tiny_pair()
        base = {"name": "tiny-here", "measured_on": machine_fingerprint(threads=1), "device": device_spec("cpu"), "llm": model_spec(pair.target, "target"),
                "slm": model_spec(pair.draft, "draft"), "latency": {"source": "table", **measure(pair, [1, 2], [1, 5], [16, 32], repeats=2, progress=False)}}
    finally:
        torch.set_num_threads(threads)
    path = tmp_path / "tiny-here.yaml"
    path.write_text(yaml.safe_dump(base))

    def quick(pair, data, fp, progress):  # the real measurement, at fewer points than the default
        return {"calibration": quick_calibration(pair, data, b=(1, 2), q=(1, 5), c=(16, 32), prefill=(16,), repeats=2, measured_on=fp, progress=progress)}

    planning = resolve_profile(AUTO, pair=_slowed(pair, 0.02), threads=1, base=path, cache_dir=tmp_path / "cache", measure=quick, progress=False)
    assert planning.source == "measured"
    slow, bare = load_profile(planning.path), load_profile(path)
    for b, q, c in ((1, 1, 16), (2, 5, 32)):
        assert float(slow.tau_llm.tau(b, q, c)) > 1.5 * float(bare.tau_llm.tau(b, q, c))
        assert float(slow.tau_slm.tau(b, q, c)) > 1.5 * float(bare.tau_slm.tau(b, q, c))
    assert resolve_profile(AUTO, pair=pair, threads=1, base=path, cache_dir=tmp_path / "cache", measure=quick, progress=False).source == "cached"


def test_a_base_of_another_pair_is_refused_before_measuring(tmp_path):
    from runtime.profile import quick_calibration

    def quick(pair, data, fp, progress):
        return {"calibration": quick_calibration(pair, data, b=(1,), q=(1,), c=(16,), repeats=1, measured_on=fp, progress=progress)}

    with pytest.raises(ValueError, match="not the profile's llm"):
        resolve_profile(AUTO, pair=_tiny_pair(), threads=1, cache_dir=tmp_path, measure=quick, progress=False)
    assert not [p for p in Path(tmp_path).iterdir() if p.is_file()]



def test_a_measure_without_a_calibration_section_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="'calibration'"):
        _resolve(tmp_path, lambda *_: {"engine": {}})
    assert not list((tmp_path / "cache").iterdir())


def test_the_report_names_the_engine_section(tmp_path):
    m = FakeMeasure()
    engine = {"b": [1, 8], "ad_step_s": [0.001, 0.002], "sd_iteration_s": [0.003, 0.004], "sd_draft_step_s": [0.0, 0.0005]}

    def with_engine(*args):
        return {**m(*args), "engine": engine}

    planning = _resolve(tmp_path, with_engine)
    assert load_profile(planning.path).engine.ad(8) == pytest.approx(0.002)
    assert planning.summary()["engine overhead"] == "per AD step 1.00/2.00 ms, per SD iteration 3.00/4.00 ms + gamma x 0.00/0.50 ms at b 1/8"


def test_padded_prefill_rows_pad_to_the_longest():
    from runtime.pass_timing import padded_lengths

    assert padded_lengths(1, 37) == [37]
    rows = padded_lengths(8, 160)
    assert len(rows) == 8 and max(rows) == 160 and min(rows) == 40 and rows == sorted(rows, reverse=True)
    assert padded_lengths(4, 2) == [2, 2, 1, 1]


def test_engine_prefill_is_the_engines_first_pass():
    """The profiler's padded prefill (runtime.engines.prefill) gives the logits AD's first token comes from."""
    from runtime.engines import generate_ad, prefill

    pair = _tiny_pair()
    prompts = [[5, 6, 7, 8, 9], [10, 11]]
    first = prefill(pair.target, prompts)[:, -1].argmax(-1).tolist()
    assert first == [t[0] for t in generate_ad(pair.target, prompts, 1).tokens]


def test_quick_engine_sees_a_slowed_engine(monkeypatch):
    """The quick profile's engine section, measured on engines whose host work per step is slowed
    by 10 ms (the forward passes unchanged), predicts more overhead per AD step than unslowed."""
    import runtime.engines
    from runtime.pass_timing import device_spec, model_spec
    from runtime.profile import measure, measure_engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        pair = _tiny_pair()
        base = {"name": "tiny-here", "device": device_spec("cpu"), "llm": model_spec(pair.target, "target"), "slm": model_spec(pair.draft, "draft"),
                "latency": {"source": "table", **measure(pair, [1, 2], [1, 2, 3, 5], [4, 32], repeats=1, progress=False)}}

        def engine():
            return measure_engine(pair, base, (1, 2), repeats=1, trials=1, progress=False, prompt_tokens=(4, 12), output_tokens=(6, 10))

        bare = engine()
        pick = runtime.engines.RowSampler.pick

        def slow_pick(self, logits):
            time.sleep(0.01)
            return pick(self, logits)

        monkeypatch.setattr(runtime.engines.RowSampler, "pick", slow_pick)
        slowed = engine()
    finally:
        torch.set_num_threads(threads)
    assert all(s > b + 0.005 for s, b in zip(slowed["ad_step_s"], bare["ad_step_s"], strict=True))
    assert "prompts 4-12 tokens, outputs 6-10" in slowed["notes"]


SPLIT_BASE = PROFILE_DIR / "split_cpu1_specsched-pair.yaml"


def test_edge_here_calibrates_the_edge_with_the_drafts_curve_and_has_its_own_entry(tmp_path):
    """One box standing in for the testbed: the split base's edge section gets this machine's draft
    curve as its own calibration; without edge_here the edge is left as measured (another device)."""
    m = FakeMeasure(scale=1.3)
    here = _resolve(tmp_path, m, base=SPLIT_BASE, edge_here=True)
    plain = _resolve(tmp_path, m, base=SPLIT_BASE)
    assert here.source == plain.source == "measured" and m.calls == 2 and here.path != plain.path and here.path.name.endswith("-edge-here.yaml")
    base, prof, left = load_profile(SPLIT_BASE), load_profile(here.path), load_profile(plain.path)
    for b, q, c in ((1, 1, 64), (4, 1, 512), (2, 9, 256)):
        assert np.isclose(float(prof.edge.tau_draft.tau1(b, q, c)), 1.3 * float(base.edge.tau_draft.tau1(b, q, c)))
        assert float(left.edge.tau_draft.tau1(b, q, c)) == float(base.edge.tau_draft.tau1(b, q, c))
        assert np.isclose(float(prof.tau_llm.tau1(b, q, c)), 1.3 * float(base.tau_llm.tau1(b, q, c)))  # the server side as without edge_here
    assert prof.edge.calibration.measured_on == here.fingerprint and left.edge.calibration is None
    assert "&id" not in here.path.read_text()  # no YAML anchors: the edge's curve is a copy
    assert _resolve(tmp_path, m, base=SPLIT_BASE, edge_here=True).source == "cached" and m.calls == 2


def test_edge_here_needs_a_split_base_whose_edge_table_is_its_draft_table(tmp_path):
    with pytest.raises(ValueError, match="edge section"):
        _resolve(tmp_path, FakeMeasure(), base=BASE, edge_here=True)
    # the draft's curve is measured against latency.slm: an edge measured apart (another table) is refused, before measuring
    data = yaml.safe_load(SPLIT_BASE.read_text())
    data["edge"]["latency"]["slm"]["tau_s"][0][0][0] *= 2
    other = tmp_path / "split_other_edge.yaml"
    other.write_text(yaml.safe_dump(data))
    m = FakeMeasure()
    with pytest.raises(ValueError, match="edge.latency.slm table is its latency.slm table"):
        _resolve(tmp_path, m, base=other, edge_here=True)
    assert m.calls == 0


@pytest.mark.parametrize("section, match", [({"llm": {"q": [1], "scale": [1.2]}, "slm": {"q": [1], "scale": [1.2]}}, "slm' scale curve only"),
                                            ({"llm": {"q": [1], "scale": [1.2]}}, "slm' scale curve only"),
                                            ({"slm": {"q": [1], "scale": [0]}}, "edge.calibration.slm.scale"),
                                            ("fast", "edge.calibration")])
def test_a_bad_edge_calibration_names_the_field(section, match):
    from envs.profile import Profile

    data = yaml.safe_load(SPLIT_BASE.read_text())
    data["edge"]["calibration"] = section
    with pytest.raises(ProfileError, match=match):
        Profile.from_dict(data)
